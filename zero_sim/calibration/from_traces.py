"""A calibration from the user's own PyTorch profiler (Kineto) traces: what their GPUs measured.

``calibration_from_traces(paths)`` reads one or more per-rank traces (``.json`` or
``.json.gz``, files or a folder of them, the files ``torch.profiler`` writes and TensorBoard,
Perfetto and Holistic Trace Analysis open) and returns a :class:`TraceFindings`: a
:class:`~zero_sim.calibration.format.Calibration` the simulator reads (``--calibration``) and a
report of what was found and what could not be.

What it reads, and the rule for each:

* **the device**: ``deviceProperties`` (name and memory) chooses the GPU preset
  (:func:`zero_sim.system.device_names.preset_for_device`; an A100 whose name gives no memory
  size is told apart by its memory, 40 or 80 GB);
* **collectives**: every NCCL kernel, with the message size and group size PyTorch records in
  the kernel's arguments (``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``Group
  size``, ``dtype``) or, in older traces, on c10d's ``record_param_comms`` op around its launch.
  Sizes follow nccl-tests' convention (the whole buffer: an all-gather's output, a
  reduce-scatter's input). A kernel's duration also holds the time it waited for the slowest
  peer, so the fastest call of each size and group stands for the collective's own time;
  latency and bus bandwidth are then fitted per collective as for a microbenchmark sweep
  (:func:`zero_sim.calibration.fit.fit_sweep`), for the group size seen most;
* **phases**: each kernel is traced back to its launch and the annotated region around it
  (:mod:`zero_sim.calibration.trace_index`); kernel time is summed per phase and per profiler
  step (``ProfilerStep#N``), and the step of median length reported;
* **the kernel mix**: kernel time by kind, from the kernel's name (GEMM and convolution,
  attention, normalisation, element-wise, optimizer, copies, communication);
* **idle compute**: per step, the time no compute kernel ran on any stream, the upper bound of
  what launch overhead and waiting for communication cost;
* **per-layer times**: spans labelled ``fwd L<i>`` / ``bwd L<i>`` (what ``real_runs.train --trace``
  writes; a user's own ``record_function`` labels work the same). On a GPU two figures per layer:
  the kernels launched inside the span from its thread (GPU time, which grows with the tokens)
  and the span itself (the host's time to issue them, which does not); the simulator's host
  lane then issues each layer at the measured pace, so a host-bound step stays host-bound.  On
  a CPU the span is the compute.  Layer 0 is the embedding, the last the head, the rest blocks;
  each layer's median over its spans, each kind's mean over its layers.  With the tokens per
  rank the run computed (``tokens=``, or a real run's ``run.json``) they become the
  calibration's compute block;
* **the update and the loop**: the optimizer's kernels and its regions' host time per
  parameter updated (from a real run's ``run.json``), and the loop's own host work per step
  (before the first layer, after the last kernel), which ends in a sync;
* **the profiler's own cost**: recording every CPU op slows the host; given the step time the
  run shows untraced (``untraced_step_ms``) the host times shrink by the difference
  (:func:`without_profiler`).  A CPU trace's ranks share the run's cores (``cores`` from its
  ``run.json``), which the simulator scales by (:func:`zero_sim.scenario.machine.cores_shared`).

* **compute beside communication**: the same kernels (name, grid, block) alone and while an NCCL
  kernel runs (:func:`zero_sim.calibration.trace_index.slowdown_beside_nccl`), the file's
  ``overlap_slowdown``.

* **layers without labels**: where no span is labelled, the module annotations a trace taken with
  ``with_stack=True, with_modules=True`` holds (``nn.Module: Block_3``): the outermost repeated
  module class are the blocks (:func:`zero_sim.calibration.trace_index.module_layers`), forward
  only, each layer's backward taken as the backward phase's share of the forward's, said so.

Not found yet, and said so in the report: communication's CPU cost on cores the ranks share (a
CPU calibration's sweep measures it).  Files are read as a stream, keeping only the events used
(:mod:`zero_sim.calibration.trace_reading`).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from zero_sim.calibration.fit import fit_sweep
from zero_sim.calibration.format import Calibration, CalibrationError, ComputeCalibration
from zero_sim.calibration.run_facts import RunFacts, run_facts, tokens_of_run
from zero_sim.calibration.trace_findings import TraceFindings
from zero_sim.calibration.trace_index import (
    KERNEL_KINDS,
    TraceIndex,
    layer_seconds,
    per_step,
    slowdown_beside_nccl,
    step_parts,
)
from zero_sim.calibration.trace_reading import Progress, read_trace, trace_files
from zero_sim.system.device_names import preset_for_device
from zero_sim.vocabulary import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from zero_sim.vocabulary.collectives import bus_factor

A100_80GB_ABOVE_BYTES = 50e9  # an A100 reporting more memory than this is the 80 GB part
# NCCL's own names for the collectives it records, and the simulator's.
NCCL_NAMES = {"allreduce": ALL_REDUCE, "allgather": ALL_GATHER, "_allgather_base": ALL_GATHER,
              "allgather_into_tensor_coalesced": ALL_GATHER, "reduce_scatter": REDUCE_SCATTER,
              "_reduce_scatter_base": REDUCE_SCATTER, "reduce_scatter_tensor_coalesced": REDUCE_SCATTER}
DTYPE_BYTES = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "long": 8,
               "int": 4, "int64": 8, "int32": 4, "byte": 1, "char": 1, "bool": 1, "float8_e4m3fn": 1}


def _device(data: dict) -> str | None:
    props = (data.get("deviceProperties") or [{}])[0]
    name = str(props.get("name", ""))
    preset = preset_for_device(name) if name else None
    if preset is None and "A100" in name.upper() and "PCIE" not in name.upper():
        preset = "A100-80GB" if props.get("totalGlobalMem", 0) > A100_80GB_ABOVE_BYTES else "A100-40GB"
    return preset


def _nccl_rows(kernels: list[dict]) -> tuple[dict[int, list[dict]], dict[str, dict]]:
    """nccl-tests-style rows (fastest call per collective, size and group) by group size, and a summary."""
    fastest: dict[tuple[str, int, int], float] = {}
    seen: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for k in kernels:
        args = k.get("args", {})
        kind = NCCL_NAMES.get(str(args.get("Collective name", "")).lower())
        group = args.get("Group size")
        if kind is None or not isinstance(group, int) or group < 2:
            continue
        elem = DTYPE_BYTES.get(str(args.get("dtype", "")).lower())
        nelems = args.get("Out msg nelems" if kind == ALL_GATHER else "In msg nelems")
        if elem is None or not isinstance(nelems, int) or nelems <= 0 or not k.get("dur"):
            continue
        size = nelems * elem
        key = (kind, size, group)
        fastest[key] = min(fastest.get(key, float("inf")), float(k["dur"]))
        seen[kind].append((size, group))
    by_group: dict[int, list[dict]] = defaultdict(list)
    for (kind, size, group), us in fastest.items():
        algbw = size / (us * 1e-6) / 1e9
        by_group[group].append({"collective": kind, "size_bytes": size, "time_us": us, "algbw_gbps": algbw,
                                "busbw_gbps": algbw * bus_factor(kind, group)})
    summary = {kind: {"calls": len(v), "group_size": Counter(g for _, g in v).most_common(1)[0][0],
                      "sizes": len({s for s, _ in v}), "min_bytes": min(s for s, _ in v),
                      "max_bytes": max(s for s, _ in v)} for kind, v in seen.items()}
    return by_group, summary


def _by_kind(per_layer: dict[tuple[str, int], list[float]]) -> dict[str, dict[str, float]] | None:
    """Layer times by kind (the lowest index the embedding, the highest the head, the rest blocks),
    each layer's median over its spans, a kind's mean over its layers; None below three layers."""
    indices = sorted({i for _, i in per_layer})
    if len(indices) < 3:
        return None
    kinds = {indices[0]: "embedding", indices[-1]: "head"}
    out: dict[str, dict[str, float]] = {}
    for kind in ("embedding", "block", "head"):
        mine = [i for i in indices if kinds.get(i, "block") == kind]
        out[kind] = {d: statistics.fmean(statistics.median(per_layer[(d, i)]) for i in mine
                                         if per_layer.get((d, i))) for d in ("fwd", "bwd")}
    return out


def _with_backward(layers: dict, ratio: float) -> dict:
    """Forward-only layer times with each backward at ``ratio`` times its forward."""
    out = dict(layers)
    for (direction, layer), seconds in layers.items():
        if direction == "fwd" and ("bwd", layer) not in layers:
            out[("bwd", layer)] = [t * ratio for t in seconds]
    return out


def _merged(per_rank: Iterable[dict]) -> dict[tuple[str, int], list[float]]:
    merged: dict[tuple[str, int], list[float]] = defaultdict(list)
    for layers in per_rank:
        for key, seconds in layers.items():
            merged[key] += seconds
    return merged


def _largest_first(ms: dict[str, float]) -> dict[str, float]:
    return dict(sorted(ms.items(), key=lambda kv: -kv[1]))


def without_profiler(host_s: float, traced_step_s: float, untraced_step_s: float) -> float:
    """The factor on a trace's host times that takes the profiler's own cost out of them.

    Recording every CPU op costs the host a few microseconds per op (on one H100 this project
    measured a host-bound gpt2-124m step at 88 ms traced, 57 ms untraced), and that cost falls on
    the host's work only.  Where the step is host-bound the difference between the traced step
    and the step the user's logs show untraced is the profiler's, so the host's times (``host_s``
    per step: every layer's spans, the update's, the loop's) shrink by that difference over their
    sum; a GPU-bound step shows no difference and keeps them (1.0)."""
    if host_s <= 0 or untraced_step_s >= traced_step_s:
        return 1.0
    return max(0.05, 1.0 - (traced_step_s - untraced_step_s) / host_s)


def calibration_from_traces(paths: Iterable[str | Path], tokens: int | None = None,
                            on_progress: Progress = None,
                            untraced_step_ms: float | None = None) -> TraceFindings:
    """Read the traces at ``paths`` (files or folders) and fit what they measured (module docstring).

    ``tokens``: tokens per rank per step the traced run computed (micro-batch x sequence length),
    which the layer times need to be used at other sizes; read from the real run's ``run.json``
    when the traces are a real run's, else the calibration keeps no compute block.
    ``untraced_step_ms``: the step time the same run shows without the profiler (its logs); the
    host's times are then cleared of the profiler's cost (:func:`without_profiler`).
    ``on_progress(bytes_read, total)`` hears how far each file's read has come.

    The steps, each its own function: read and index the traces; fit the collectives; take the
    step of median length; complete forward-only layers with a backward; the update's times;
    the compute block (the profiler's cost taken out); compute's slowdown beside NCCL kernels."""
    paths = [Path(p) for p in paths]
    traces = _read(paths, on_progress)
    not_found: list[str] = []  # what could not be found, in the order the steps look for it
    fits, summary = _collective_fits(traces, not_found)
    steps, typical = _typical_step(traces)
    per_rank, layers_note = _layers_with_backward(traces, typical)
    facts = run_facts(paths[0])
    update = _update(traces, facts, not_found)
    by_kind = _by_kind(_merged(layers for layers, _ in per_rank))
    host_by_kind = _by_kind(_merged(host for _, host in per_rank)) if traces.kernels else None
    tokens = tokens if tokens is not None else facts.tokens
    compute, host_by_kind, profiler_note = _compute(traces, per_rank, by_kind, host_by_kind, typical, facts,
                                                    tokens, update, untraced_step_ms, not_found)
    beside = _beside_nccl(traces, not_found)
    measured_on = {"source": "PyTorch profiler traces", "traces": [p.name for p in traces.files],
                   "ranks": traces.ranks, "gpu": sorted(traces.gpus)[0] if traces.gpus else None}
    calibration = Calibration(fits, compute, "nccl" if traces.kernels else None, measured_on,
                              overlap_slowdown=None if beside is None else round(beside[0], 4))
    layer_ms = {k: {d: t * 1e3 for d, t in v.items()} for k, v in (by_kind or {}).items()}
    host_layer_ms = {k: {d: t * 1e3 for d, t in v.items()} for k, v in (host_by_kind or {}).items()}
    gpu = sorted(traces.gpus)[0] if len(traces.gpus) == 1 else None
    return TraceFindings(calibration, gpu, traces.ranks, steps,
                         layer_ms, _largest_first(typical["phases"]), _largest_first(typical["kinds"]),
                         typical["idle"], typical["length"], summary, not_found,
                         "not recognised (the simulator keeps the GPU you give it)" if traces.kernels
                         else "CPU (no GPU kernels in the traces)", host_layer_ms, update.optimizer_ms,
                         profiler_note, beside[1] if beside else 0, layers_note)


@dataclass
class _Traces:
    """The traces read and indexed, and what the later steps take from all of them."""

    files: list[Path]
    data: list[dict]  # each file's JSON, as read
    indexes: list[TraceIndex]
    kernels: list[dict]  # every GPU kernel (none in a CPU trace)
    nccl: list[dict]  # the NCCL kernels among them
    per_rank: list[tuple[dict, dict]]  # each trace's layer times: its kernels', its host's

    @property
    def ranks(self) -> list[int]:
        return sorted({(d.get("distributedInfo") or {}).get("rank", i) for i, d in enumerate(self.data)})

    @property
    def gpus(self) -> set[str]:
        return {g for g in (_device(d) for d in self.data) if g}


def _read(paths: list[Path], on_progress: Progress) -> _Traces:
    """Every trace file under ``paths``, read and indexed; a trace with neither GPU kernels nor
    labelled layers is refused, as nothing can be fitted from it."""
    files = trace_files(paths)
    data = [read_trace(p, on_progress) for p in files]
    indexes = [TraceIndex(d) for d in data]
    kernels = [k for i in indexes for k in i.kernels if k.get("cat") == "kernel"]
    per_rank = [layer_seconds(i) for i in indexes]
    if not kernels and not any(compute for compute, _ in per_rank):
        raise CalibrationError(f"{', '.join(p.name for p in files)} hold no GPU kernels and no labelled "
                               f"layers; profile with ProfilerActivity.CUDA on a GPU run, or label layers "
                               f"'fwd L<i>' / 'bwd L<i>' with record_function")
    return _Traces(files, data, indexes, kernels, [k for i in indexes for k in i.nccl_kernels()], per_rank)


def _collective_fits(traces: _Traces, not_found: list[str]) -> tuple[dict, dict]:
    """Latency and bus bandwidth per collective, fitted for the group size seen most, and a summary
    of the NCCL kernels seen; where there are none to fit, why, in ``not_found``."""
    by_group, summary = _nccl_rows(traces.nccl)
    fits: dict = {}
    if by_group:
        group = max(by_group, key=lambda g: len(by_group[g]))
        try:
            fits = fit_sweep(by_group[group], group)
        except CalibrationError as exc:
            not_found.append(f"a collective fit: {exc}")
    elif traces.nccl:
        not_found.append("NCCL message sizes: neither the kernels nor c10d's record_param_comms ops carry "
                         "'In msg nelems' / 'Group size' for groups of two ranks or more (PyTorch records "
                         "them from 2.1); no collective fit")
    elif traces.kernels:
        not_found.append("collectives: no NCCL kernel ran (a one-GPU run communicates nothing); trace a run "
                         "of two GPUs or more, or import nccl-tests output, for the network")
    else:
        not_found.append("collectives: a CPU trace's gloo calls run on gloo's own threads with no kernel to "
                         "time; measure the network with `zero-sim calibrate` (a collective sweep)")
    return fits, summary


def _typical_step(traces: _Traces) -> tuple[int, dict]:
    """How many profiler steps were timed, and the one of median length, which stands for all:
    its phases and kinds add up, as medians per key would not."""
    rows = [r for i in traces.indexes for r in per_step(i)]
    timed = sorted((r for r in rows if r["length"]), key=lambda r: r["length"])
    return len(timed), timed[(len(timed) - 1) // 2] if timed else rows[0]


def _layers_with_backward(traces: _Traces, typical: dict) -> tuple[list[tuple[dict, dict]], str | None]:
    """Each trace's layer times (kernels', host's) and where the layers were found other than by
    their labels.  Module annotations (and forward-only labels) show no backward: each layer's
    backward is taken as the backward phase's kernels over the forward's, or 2x (its FLOPs)
    without phases; the host's backward as long as its forward."""
    modules = sorted({i.block_class for i in traces.indexes if i.block_class})
    note = f"from module annotations ({', '.join(modules)} as the blocks)" if modules else None
    if not any(d == "fwd" and ("bwd", i) not in layers for layers, _ in traces.per_rank for d, i in layers):
        return traces.per_rank, note
    phases = typical["phases"]
    ratio = phases["backward"] / phases["forward"] if phases.get("forward") and phases.get("backward") \
        else 2.0
    per_rank = [(_with_backward(layers, ratio), _with_backward(host, 1.0))
                for layers, host in traces.per_rank]
    note = ((note + "; " if note else "") + f"forward only, each layer's backward taken as {ratio:.2f}x its "
            f"forward{', the backward phase over the forward' if ratio != 2.0 else ', its FLOPs'}")
    return per_rank, note


@dataclass(frozen=True)
class _Update:
    """The optimizer's update per step (its wall time) and per parameter updated (its kernels',
    its host's), and the loop's own host work per step; None where the traces do not tell."""

    optimizer_ms: float | None = None
    per_param: float | None = None
    host_per_param: float | None = None
    loop_host_s: float | None = None


def _update(traces: _Traces, facts: RunFacts, not_found: list[str]) -> _Update:
    """The update's times, per parameter where the real run's ``run.json`` says how many each
    rank updates: on a GPU its kernels and the host's issuing apart, on a CPU the host computes
    the update (its regions, not the waits between)."""
    parts = [p for i in traces.indexes for p in step_parts(i)]
    optimizer_ms = statistics.median(p.optimizer_wall for p in parts) * 1e3 if parts else None
    updated = facts.params_updated
    if optimizer_ms and not updated:
        not_found.append("the parameters each rank's optimizer updates (the traces are not a real run's "
                         "with its run.json); the optimizer's time is reported but the GPU model's is used")
    if not (parts and updated):
        return _Update(optimizer_ms)
    if not traces.kernels:
        return _Update(optimizer_ms, statistics.median(p.optimizer_host for p in parts) / updated)
    return _Update(optimizer_ms, statistics.median(p.optimizer_gpu for p in parts) / updated,
                   statistics.median(p.optimizer_host for p in parts) / updated,
                   statistics.median(p.loop_host for p in parts))


def _compute(traces: _Traces, per_rank: list[tuple[dict, dict]], by_kind: dict | None,
             host_by_kind: dict | None, typical: dict, facts: RunFacts, tokens: int | None,
             update: _Update, untraced_step_ms: float | None,
             not_found: list[str]) -> tuple[ComputeCalibration | None, dict | None, str | None]:
    """The calibration's compute block, the host's layer times it holds and how they were taken;
    no block without per-layer times or the tokens they computed (said in ``not_found``)."""
    if by_kind is None:
        not_found.append("per-layer times: no spans labelled 'fwd L<i>' / 'bwd L<i>' and no module "
                         "annotations (label each layer with record_function, as real_runs --trace does, "
                         "or profile with with_stack=True, with_modules=True); the simulator's compute "
                         "model stays")
        return None, host_by_kind, None
    if tokens is None:
        not_found.append("the tokens per rank the layers computed (give --tokens: micro-batch x sequence "
                         "length); the layer times are reported but not used")
        return None, host_by_kind, None
    profiler_note = None
    if untraced_step_ms and host_by_kind and typical["length"]:
        host_by_kind, update, profiler_note = _profiler_taken_out(
            per_rank, host_by_kind, update, facts.params_updated, typical["length"], untraced_step_ms)
    elif host_by_kind:
        profiler_note = ("host times as traced, the profiler's own cost included (give the untraced step "
                         "time, --untraced-step-ms, to take it out)")
    # A CPU trace's layers ran at the traced run's share of its cores; say how many to scale by.
    cores = None if traces.kernels else facts.cores
    traced_ranks = facts.world_size or max(len(traces.data), len(traces.ranks))
    compute = ComputeCalibration(by_kind, tokens, update.per_param, traced_ranks, cores,
                                 host_seconds=host_by_kind,
                                 optimizer_host_seconds_per_param=update.host_per_param,
                                 step_host_s=update.loop_host_s)
    return compute, host_by_kind, profiler_note


def _profiler_taken_out(per_rank: list[tuple[dict, dict]], host_by_kind: dict, update: _Update,
                        updated: int | None, traced_ms: float,
                        untraced_ms: float) -> tuple[dict, _Update, str]:
    """The host's times (layers, update per parameter, loop) scaled by :func:`without_profiler`
    for a step traced at ``traced_ms`` that runs in ``untraced_ms`` without the profiler."""
    layers_host_s = sum(statistics.median(v) for v in _merged(host for _, host in per_rank).values())
    host_s = layers_host_s + (update.host_per_param or 0.0) * (updated or 0) + (update.loop_host_s or 0.0)
    kept = without_profiler(host_s, traced_ms * 1e-3, untraced_ms * 1e-3)
    scaled = replace(update,
                     host_per_param=None if update.host_per_param is None else update.host_per_param * kept,
                     loop_host_s=None if update.loop_host_s is None else update.loop_host_s * kept)
    note = (f"host times scaled by {kept:.2f}: the profiler's own cost taken out "
            f"(traced step {traced_ms:.1f} ms, untraced {untraced_ms:.1f} ms)")
    return {k: {d: t * kept for d, t in v.items()} for k, v in host_by_kind.items()}, scaled, note


def _beside_nccl(traces: _Traces, not_found: list[str]) -> tuple[float, int] | None:
    """Compute's slowdown beside NCCL kernels and the launch configurations compared, or None."""
    beside = slowdown_beside_nccl([k for i in traces.indexes for k in i.kernels]) if traces.nccl else None
    if traces.nccl and beside is None:
        not_found.append("compute slowed beside NCCL kernels: too few kernels ran both alone and beside a "
                         "collective to compare; the GPU's default stays")
    return beside


__all__ = ["KERNEL_KINDS", "RunFacts", "TraceFindings", "calibration_from_traces", "run_facts",
           "tokens_of_run"]
