"""Did the simulator predict it?  A grid of real runs, each predicted before it is measured.

``zero-sim validate`` answers with numbers.  For a grid of cases (strategy x ranks N x
emulated link bandwidth x bucket size) on this machine it:

1. **calibrates the network**, once per (N, bandwidth): builds the emulated cluster
   (``real_runs.cluster``: namespaces, veth links shaped by tc) and sweeps all_reduce,
   reduce_scatter and all_gather over sizes in it, then fits latency and bus bandwidth
   and reads what the calls' CPU time takes from compute;
2. **calibrates compute just before every case**: ``real_runs.microbench layers`` with
   all N ranks computing at once (they share this machine's cores exactly as in
   training).  Once per group the same is measured on one rank alone, only to report
   how much of the time is that sharing.  Per case, because on a shared machine the
   speed of compute drifts within minutes;
3. **predicts the case** from that calibration and the case's configuration alone
   (:func:`sim2real.replay.predict_run` on the run's *planned* ``run.json`` fields), and
   writes the prediction down;
4. only then **runs** the case in the same cluster (``real_runs.train``) and reads its
   measured step time (median over the steps after the first, slowest rank per step),
   exposed communication and compute (medians over the same steps of the ranks' mean).

No case's measurement feeds any prediction: the inputs are the two microbenchmarks,
which know nothing of strategies or buckets.  ``error = (predicted - measured) /
measured``.  With ``--report DIR`` a markdown report with the calibration, the table
and an overlay figure per case is written there (:mod:`sim2real.validate_report`).

Which cases: the fixed grids (:data:`sim2real.sampling.FULL_GRID`, ``QUICK_GRID``) stay for regression;
the judge is a random sample of the whole space this machine supports
(:mod:`sim2real.sampling`, ``--sample K --seed S``): every recorded strategy, N in 2-4,
every cluster shape, bandwidths, bucket sizes and three model sizes.  Each case also
measures its own **noise band**, how far its figures moved between the first and the
second half of its steps, and the headline puts the median error beside the median band.

The runs' files (run directories, calibrations, sweeps) go to a temporary folder, removed
when validation ends, by success, failure, Ctrl-C, SIGTERM or SIGHUP alike, so no run leaves
its files behind.  ``--keep`` keeps them, and the output and the report say where.

Where emulation is not possible (no root, no tc), the cases run on plain loopback and
the output says so (``emulated: false``); the bandwidth column is then empty.

On GPUs (``Options.device == "cuda"``, ``zero-sim validate --device cuda``) the same steps
run on this box's GPUs, one per rank, over NCCL, in bf16 (:mod:`sim2real.gpu_grid`): the
network is calibrated once per N by an NCCL sweep, compute by layer timings on the GPUs,
each prediction is written down, then the case trains with ``--device cuda``.  Nothing is
emulated, and the planned ``run.json`` carries this box's GPU stamp, so the prediction
runs on the GPU preset it names.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tqdm import tqdm

from real_runs import cluster as emu
from real_runs.cluster.shapes import check_shape
from real_runs.gpu_stamp import gpu_stamp
from real_runs.options import train_argv
from real_runs.presets import PRESETS
from sim2real.measure import Loopback, lines_above, machine_facts, measure_compute, measure_network
from sim2real.overlay import load_run, median_timing, timing_per_step
from sim2real.replay import REAL_TO_SIM, predict_run
from sim2real.sampling import Case
from sim2real.validate_report import STEP_PARTS, error_summary, noise_band, overlay_png, write_report
from zero_sim.calibration import Calibration
from zero_sim.vocabulary.buckets import DEFAULT_BUCKET_MB


class ValidationError(ValueError):
    """Bad validation input; one sentence saying how to fix it."""


@dataclass(frozen=True)
class Options:
    model: str = "small"
    global_batch: int = 8
    # Ranks that share cores make one step differ from the next: the median of the steps
    # after the first.
    steps: int = 12
    shape: str = "uniform"
    sweep_max_bytes: str = "32M"
    sweep_budget_s: float = 0.15
    timeout_s: float = 300.0
    device: str = "cpu"  # or "cuda": one GPU per rank, NCCL (module docstring)
    precision: str = "fp32"


def resolved(case: Case, opts: Options) -> Case:
    """The case with what it leaves open (model, shape, global batch) taken from ``opts``."""
    return replace(case, model=case.model or opts.model, shape=case.shape or opts.shape,
                   global_batch=case.global_batch or opts.global_batch)


def planned_run(case: Case, opts: Options, cluster: dict | None) -> dict:
    """The fields of the ``run.json`` the case will write, known before it runs."""
    case = resolved(case, opts)
    cfg = PRESETS[case.model]
    run = {"strategy": case.strategy, "world_size": case.gpus, "global_batch": case.global_batch,
           "seq_len": cfg.max_seq, "model": case.model, "model_config": cfg.to_dict(), "device": opts.device,
           "precision": opts.precision,
           "bucket_mb": case.bucket_mb if case.bucket_mb is not None else DEFAULT_BUCKET_MB}
    if cluster is not None:
        run["cluster"] = cluster
    if opts.device == "cuda":
        run["gpu"] = gpu_stamp()  # the GPUs the case will run on, known before it runs
    return run


def _train_argv(case: Case, opts: Options, out: Path) -> list[str]:
    case = resolved(case, opts)
    return train_argv(case.strategy, case.gpus, out, {
        "model": case.model, "global_batch": case.global_batch, "steps": opts.steps,
        "timeout_s": min(opts.timeout_s, 120.0), "bucket_mb": case.bucket_mb,
        "device": opts.device, "precision": opts.precision})


def run_timeout_s(predicted_step_s: float, opts: Options) -> float:
    """How long a case's training run may take before it counts as hung: the fixed timeout,
    plus twice the steps' predicted time.  A case predicted to train longer than the timeout
    (a large model over a slow link) is not a hang, and the prediction is written down before
    the run starts, so it can set the run's limit."""
    return opts.timeout_s + 2.0 * opts.steps * predicted_step_s


def measured_step_s(run: dict) -> float:
    """Median step time after the first (warm-up) step; each step is its slowest rank's."""
    times = run["step_times_s"]
    return statistics.median(times[1:] if len(times) > 1 else times)


def halves(steps: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The steps after the first, cut in two halves (first and last step of each, included)."""
    middle = 1 + (steps - 1) // 2
    return (1, middle - 1), (middle, steps - 1)


def step_noise_band(run: dict) -> float:
    """How far the median step time of the run's first half of steps is from its second half's."""
    times = run["step_times_s"]
    (a0, a1), (b0, b1) = halves(len(times))
    return noise_band(statistics.median(times[a0:a1 + 1]), statistics.median(times[b0:b1 + 1]))


def check_grid(cases, opts: Options) -> None:
    if opts.steps < 5:
        raise ValidationError("--steps must be at least 5: the first step is warm-up, and the noise band "
                              "compares two halves of the rest")
    if opts.device == "cuda":
        have = cuda_devices()
        most = max((c.gpus for c in cases), default=0)
        if have < most:
            raise ValidationError(f"--device cuda needs {most} GPU(s) for this grid; this machine has {have}")
    for c in cases:
        c = resolved(c, opts)
        if c.model not in PRESETS:
            raise ValidationError(f"unknown model {c.model!r}; choose one of {', '.join(PRESETS)}")
        if c.strategy not in REAL_TO_SIM:
            raise ValidationError(f"unknown strategy {c.strategy!r}; choose from {', '.join(REAL_TO_SIM)}")
        if c.global_batch % c.gpus:
            raise ValidationError(f"--global-batch {c.global_batch} does not split across {c.gpus} ranks")
        if c.bandwidth_gbps is not None and c.bandwidth_gbps <= 0:
            raise ValidationError(f"bandwidth must be positive, got {c.bandwidth_gbps}")
        if c.bandwidth_gbps is not None:
            try:
                check_shape(c.gpus, emu.ClusterShape(c.shape, c.bandwidth_gbps, c.latency_ms))
            except ValueError as exc:
                raise ValidationError(str(exc).rstrip(".")) from None


def cuda_devices() -> int:
    """GPUs torch sees on this machine (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_validation(cases, opts: Options = Options(), workdir: str | os.PathLike | None = None,
                   report_dir: str | os.PathLike | None = None,
                   on_line: Callable[[str], None] | None = print, keep: bool = False,
                   sample: dict | None = None) -> dict:
    """Calibrate, predict, then run every case; returns the JSON-able result.

    The runs' files go to ``workdir``, which stays; without one, to a temporary folder that
    is removed when validation ends, however it ends, unless ``keep``.  ``files`` in the
    result says where they are (None once removed, and then every case's ``run_dir`` is too).
    ``sample`` (``k``, ``seed``, ``latency``) says how the cases were drawn, for the report."""
    say = on_line or (lambda _line: None)
    cases = list(cases)
    check_grid(cases, opts)
    # SIGTERM and SIGHUP unwind like Ctrl-C, so the clusters and the folder go either way.
    with emu.stopping_on_signals(), run_files(workdir, keep, say) as files:
        summary = _run_grid(cases, opts, files, report_dir, say)
    summary["sample"] = sample
    kept = keep or workdir is not None
    summary["files"] = str(files) if kept else None
    if not kept:
        for row in summary["cases"]:
            row["run_dir"] = None
    if report_dir is not None:
        write_report(summary, Path(report_dir))
    return summary


@contextlib.contextmanager
def run_files(workdir: str | os.PathLike | None, keep: bool, say: Callable[[str], None]) -> Iterator[Path]:
    """The folder the runs write into: ``workdir`` (the caller's, so it stays), or a temporary
    one removed when the with-block ends, by success, failure or interrupt, unless ``keep``."""
    if workdir is not None:
        path = Path(workdir)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix="zero-sim-validate-"))
    say(f"runs' files: {path} " + ("(kept: --keep)" if keep else "(removed at the end; --keep keeps them)"))
    try:
        yield path
    finally:
        if not keep:
            # A second Ctrl-C while removing would leave half the folder: it waits until done.
            with emu.signals_held():
                shutil.rmtree(path, ignore_errors=True)


# What a validation measures to predict its cases, as its report states it.
CALIBRATED_INPUTS = (
    "compute: per-layer forward/backward and optimizer times of the real model, measured with all N "
    "ranks computing at once on this machine (real_runs.microbench layers), just before each case "
    "(each case's row has its own under 'compute'), with how much later than the mean rank the "
    "slowest ends a pass started together (slowest_rank_factor, which stretches forward and "
    "backward); network: latency and bus bandwidth of all_reduce, reduce_scatter, all_gather fitted "
    "to a size sweep in the same emulated cluster (real_runs.microbench collectives); cpu: compute "
    "time lost per collective and compute slowdown while collectives stream and how fast collectives "
    "progress while the ranks compute, from the CPU time the same sweep's calls used and a queue of "
    "its collectives timed idle and while every rank computed. "
    "Nothing else was fitted; no case's measurement was used.")


def _cases_to_run(cases: list[Case], opts: Options, say: Callable[[str], None]):
    """The cases as they will run: on the emulated cluster where it can be made, else on plain
    loopback with their link settings dropped (and duplicates with them).  Returns (cases, the
    reason there is no emulation or None)."""
    reason = (emu.unavailable_reason() if opts.device == "cpu"
              else "GPUs are not emulated: their own links run")
    cases = [resolved(c, opts) for c in cases]
    if reason is not None and opts.device == "cpu":
        say(f"emulated cluster unavailable ({reason}); running every case on plain loopback")
    if reason is not None:
        cases = list(dict.fromkeys(replace(c, bandwidth_gbps=None, shape=None, latency_ms=0.0)
                                   for c in cases))
    return cases, reason


def _network_calibration(cluster, n: int, key: str, workdir: Path, opts: Options,
                         emulated: bool) -> Calibration:
    """Collective fits and CPU figures measured on the cluster the cases will run on."""
    where = cluster.describe()
    fits, cpu, _ = (measure_network(cluster, n, workdir, opts.sweep_max_bytes, opts.sweep_budget_s,
                                    opts.timeout_s, label=key, device=opts.device)
                    if n > 1 or opts.device == "cpu" else ({}, None, {}))
    return Calibration(fits, None, "nccl" if opts.device == "cuda" else "gloo",
                       machine_facts(ranks=n, network=where, emulated=emulated, device=opts.device), cpu=cpu)


def _run_grid(cases: list[Case], opts: Options, workdir: Path, report_dir: str | os.PathLike | None,
              say: Callable[[str], None]) -> dict:
    cases, reason = _cases_to_run(cases, opts, say)
    emulated = reason is None
    t_start = time.monotonic()
    # A bar over the cases on a terminal (none in logs: disable=None means "only on a TTY"); each
    # line said meanwhile is written above it.
    bar = tqdm(total=len(cases), desc="validation cases", unit="case", file=sys.stderr, disable=None)
    say = lines_above(bar, say)
    results, calibrations = [], {}
    # One rank alone, once per (model, micro-batch): only to report how much of each case's
    # compute time is ranks sharing cores.
    alone: dict[tuple[str, int], object] = {}
    # Cases that run on the same cluster (N, shape, bandwidth, latency) share one network calibration.
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        groups.setdefault((c.gpus, c.shape, c.bandwidth_gbps, c.latency_ms), []).append(c)
    for (n, shape_kind, bw, latency), group in groups.items():
        shape = emu.ClusterShape(shape_kind, bw, latency) if bw is not None else None
        ctx = emu.EmulatedCluster(n, shape, on_line=say) if shape is not None else Loopback(n)
        key = f"n{n}_{shape_kind}_bw{bw}" + (f"_lat{latency}" if latency else "")
        with ctx as cluster:
            say(f"calibrating the network: {cluster.describe()}")
            network = _network_calibration(cluster, n, key, workdir, opts, emulated)
            calibrations[key] = network.to_dict() | {"summary": network.describe()}
            record = cluster.cluster_record() if shape is not None else None
            for c in group:
                results.append(_run_case(c, opts, cluster, network, record, key, alone, workdir,
                                         report_dir, say))
                bar.update(1)
    bar.close()
    return {
        "cases": results,
        **error_summary(results),
        "emulated": emulated, "emulation_note": reason, "model": opts.model,
        "global_batch": opts.global_batch,
        "steps": opts.steps, "shape": opts.shape if emulated else None,
        "calibrations": calibrations, "machine": machine_facts(), "wall_s": time.monotonic() - t_start,
        "calibrated_inputs": CALIBRATED_INPUTS,
    }


def _run_case(c: Case, opts: Options, cluster, network: Calibration, record: dict | None, key: str,
              alone: dict, workdir: Path, report_dir, say: Callable[[str], None]) -> dict:
    """Calibrate compute, predict, write the prediction down, then run the case; its result row."""
    n, micro = c.gpus, c.global_batch // c.gpus
    seq_len = PRESETS[c.model].max_seq
    tag = f"{c.strategy}_n{n}_{c.model}_mb{micro}_{c.shape}_bw{c.bandwidth_gbps}_b{c.bucket_mb}"
    if c.latency_ms:
        tag += f"_lat{c.latency_ms}"
    if (c.model, micro) not in alone:
        alone[c.model, micro] = measure_compute(1, c.model, micro, seq_len, workdir, opts.timeout_s,
                                                label=f"{tag}_alone", device=opts.device,
                                                precision=opts.precision)
    # Compute is measured again just before every case: on a shared machine how fast N ranks
    # compute together drifts within minutes, and a measurement taken just before a case
    # matches it better than one taken at the start of its group.
    compute = measure_compute(n, c.model, micro, seq_len, workdir, opts.timeout_s, label=tag,
                              alone=alone[c.model, micro], device=opts.device, precision=opts.precision)
    cal = replace(network, compute=compute)
    cal.save(workdir / f"calibration_{tag}.json")
    sim = predict_run(planned_run(c, opts, record), cal)
    say(f"calibrated compute: block fwd {compute.layer_seconds['block']['fwd'] * 1e3:.2f} ms, "
        f"{compute.sharing_factor or 1:.2f}x one rank alone; "
        f"slowest rank {compute.slowest_rank_factor:.3f}x the mean")
    say(f"predicted {c.label()}: {sim.metrics['step_time_s']:.4f} s")
    out = workdir / tag
    cluster.run_module("real_runs.train", _train_argv(c, opts, out),
                       timeout_s=run_timeout_s(sim.metrics["step_time_s"], opts))
    # Stamped with the cluster, the run directory replays on its own links (overlay, notebook 06).
    if record is not None:
        run = emu.stamp_run_json(out, cluster)
    else:
        run = json.loads((out / "run.json").read_text())
    if run["params"] != sim.scenario.workload.params:
        raise ValidationError(f"the run trained {run['params']} parameters "
                              f"but the prediction assumed {sim.scenario.workload.params}; "
                              f"the replay's model does not match real_runs")
    measured = measured_step_s(run)
    predicted = sim.metrics["step_time_s"]
    row = asdict(c) | {
        "predicted_step_s": predicted, "measured_step_s": measured,
        "error": (predicted - measured) / measured, "noise_band": step_noise_band(run),
        "run_dir": str(out),
        "model_states_exact": _model_states_exact(run, sim),
        "calibration": key, "compute": cal.to_dict()["compute"],
    }
    row.update(_measured_split(out, sim, len(run["step_times_s"])))
    say(f"measured  {c.label()}: {measured:.4f} s (error {row['error']:+.1%}, "
        f"noise band {row['noise_band']:.1%})")
    if report_dir is not None:
        overlay_png(out, sim, Path(report_dir), row)
    return row


def _model_states_exact(run: dict, sim) -> bool:
    """Rank 0's resident params + grads + optimizer state: measured bytes == predicted bytes."""
    measured = run["model_states_formula"]["measured"]["0"]
    return int(measured) == int(sim.metrics["memory"]["model_states_bytes"])


def _measured_split(run_dir: Path, sim, steps: int) -> dict:
    """Exposed communication and compute, measured vs predicted, by the overlay's definitions
    (results.py's): with the step time's error, they say which side of the step the model got
    wrong.

    Measured over the same steps as step time (after the first), the ranks' mean per step and
    the median over steps (as :func:`sim2real.overlay.steady_timing` reads it): one rank's exposed
    communication in one step is the difference of two longer spans, too noisy to compare alone.
    Each figure's noise band compares it over the two halves of those steps."""
    per_step = timing_per_step(load_run(run_dir))
    whole = median_timing(per_step.values())
    first, second = (median_timing(t for step, t in per_step.items() if lo <= step <= hi)
                     for lo, hi in halves(steps))
    row = {}
    for figure, key in STEP_PARTS.items():
        predicted, measured = sim.metrics[key], whole[key]
        row |= {f"predicted_{figure}_s": predicted, f"measured_{figure}_s": measured,
                f"{figure}_error": (predicted - measured) / measured if measured > 0 else None,
                f"{figure}_noise_band": noise_band(first[key], second[key])}
    return row
