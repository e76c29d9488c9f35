"""Collectives read back from a torch.profiler Chrome trace, for runs whose rank files hold
compute ops only (torch's own FSDP2 runs its collectives inside torch).

The rules (gloo worker spans paired with their launches, FSDP annotations for layers, one
clock anchor per step) are set out in :mod:`sim2real.overlay`'s docstring.

Where a rank's trace is (:func:`trace_file`): ``traces/rank<r>.pt.trace.json`` in the run
directory, or ``trace_rank<r>.json`` beside ``run.json`` in runs written before the traces
had a folder of their own.  A trace with ``ProfilerStep#<n>`` spans (``train.py --trace``
records on a schedule) holds those steps only, and only they are anchored and read.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from sim2real.overlay.base import OverlayError, op_kind
from zero_sim.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    BROADCAST,
    COMM,
    COMPUTE,
    REDUCE_SCATTER,
)

# torch.distributed launch ops on the training thread -> the collective they start.
_LAUNCH_KINDS = {
    "c10d::_allgather_base_": ALL_GATHER, "c10d::allgather_": ALL_GATHER,
    "c10d::allgather_into_tensor_coalesced_": ALL_GATHER,
    "c10d::_reduce_scatter_base_": REDUCE_SCATTER, "c10d::reduce_scatter_": REDUCE_SCATTER,
    "c10d::reduce_scatter_tensor_coalesced_": REDUCE_SCATTER,
    "c10d::allreduce_": ALL_REDUCE, "c10d::allreduce_coalesced_": ALL_REDUCE,
    "c10d::broadcast_": BROADCAST,
}
# gloo worker-thread spans -> the launch kinds they can carry out (gloo reduce-scatters by all-reducing).
_GLOO_SPANS = {
    "gloo:all_gather": {ALL_GATHER}, "gloo:allgather": {ALL_GATHER},
    "gloo:all_reduce": {ALL_REDUCE, REDUCE_SCATTER}, "gloo:allreduce": {ALL_REDUCE, REDUCE_SCATTER},
    "gloo:reduce_scatter": {REDUCE_SCATTER}, "gloo:broadcast": {BROADCAST},
}
_FSDP_ANNOTATION = re.compile(r"^FSDP::(all_gather|post_backward_reduce)(?: \(layers\.(\d+)\))?$")
# train.py calls profiler.step() once at the end of every training step from step 0 on,
# so ProfilerStep#<n> spans training step n.
_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
# Where train.py --trace has put a rank's trace, newest layout first.
TRACE_NAMES = ("traces/rank{rank}.pt.trace.json", "trace_rank{rank}.json")


def trace_file(run_dir, rank: int) -> Path | None:
    """Rank ``rank``'s profiler trace in a run directory, at its place now or in older runs; None if none."""
    for pattern in TRACE_NAMES:
        path = Path(run_dir) / pattern.format(rank=rank)
        if path.is_file():
            return path
    return None


def collectives_from_trace(trace_path, rank: int, rank_ops: list[dict],
                           step_times: list[float]) -> list[dict]:
    """The collectives of a gloo torch.profiler trace as comm-stream ops in step-relative seconds.

    See the module docstring for the pairing and clock rules; anything that does not hold
    raises OverlayError rather than producing a guess."""
    trace_path = Path(trace_path)
    try:
        events = json.loads(trace_path.read_text()).get("traceEvents", [])
    except (ValueError, AttributeError):
        raise OverlayError(f"{trace_path.name} is not a Chrome trace written by torch.profiler.") from None
    spans = [e for e in events if e.get("ph") == "X" and "ts" in e and "dur" in e]
    if any(e.get("cat") in ("kernel", "gpu_memcpy") for e in spans):
        raise OverlayError(f"{trace_path.name} is a CUDA trace; only gloo (CPU) traces can be read for "
                           f"collectives so far.")
    launches = sorted((e for e in spans if e.get("name") in _LAUNCH_KINDS), key=lambda e: e["ts"])
    workers = sorted((e for e in spans if e.get("name") in _GLOO_SPANS), key=lambda e: e["ts"])
    if len(launches) != len(workers):
        raise OverlayError(f"{trace_path.name} launched {len(launches)} collectives "
                           f"but gloo ran {len(workers)}, "
                           f"so they cannot be paired reliably and are not guessed.")
    annotations = [e for e in spans if _FSDP_ANNOTATION.match(e.get("name", ""))]
    offsets = _clock_offsets(trace_path, spans, rank, rank_ops)

    ops = []
    for launch, work in zip(launches, workers, strict=True):
        kind = _LAUNCH_KINDS[launch["name"]]
        if kind not in _GLOO_SPANS[work["name"]] or work["ts"] + 1e3 < launch["ts"]:
            raise OverlayError(f"{trace_path.name}: a {kind} launch pairs with a {work['name']} span, so the "
                               f"collectives cannot be paired reliably and are not guessed.")
        start = work["ts"] / 1e6
        step = _step_of(start, offsets, step_times)
        if step is None:
            continue  # outside every recorded step (setup or teardown)
        layer = _layer_of(launch, annotations)
        t0 = offsets[step]
        name = f"{kind} L{layer}" if layer is not None else kind
        ops.append({"rank": rank, "stream": COMM, "name": name, "start_s": start - t0,
                    "end_s": start + work["dur"] / 1e6 - t0, "bytes": None, "layer": layer,
                    "phase": None, "step": step, "source": "trace"})
    return ops


def _clock_offsets(trace_path: Path, spans: list[dict], rank: int, rank_ops: list[dict]) -> dict[int, float]:
    """Trace seconds at t = 0 of every step the trace holds, one anchor per step: the first
    ``opt ...`` op the record holds for the step and the same call's span in the trace."""
    recorded = {}
    for op in rank_ops:
        if op["stream"] == COMPUTE and op_kind(op["name"]) == "opt":
            recorded.setdefault(op["step"], op)
    windows = {int(m[1]): e for e in spans if (m := _PROFILER_STEP.match(str(e.get("name", ""))))}
    if windows:
        pairs = _anchors_by_step(trace_path, spans, rank, recorded, windows)
    else:
        pairs = _anchors_in_order(trace_path, spans, rank, recorded)
    offsets = {}
    for step, anchor in pairs:
        op = recorded[step]
        rec_dur, trace_dur = op["end_s"] - op["start_s"], anchor["dur"] / 1e6
        if abs(rec_dur - trace_dur) > 2e-3 + 0.1 * rec_dur:
            raise OverlayError(f"{trace_path.name}'s optimizer step {step} lasted "
                               f"{trace_dur * 1e3:.1f} ms but the "
                               f"record says {rec_dur * 1e3:.1f} ms, "
                               f"so the two clocks cannot be tied together.")
        offsets[step] = anchor["ts"] / 1e6 - op["start_s"]  # trace seconds at the step's t = 0
    return offsets


def _anchors_by_step(trace_path: Path, spans: list[dict], rank: int, recorded: dict[int, dict],
                     windows: dict[int, dict]) -> list[tuple[int, dict]]:
    """A scheduled trace: each ``ProfilerStep#n`` holds step n's anchor, the recorder's own
    ``opt ...`` label (or, in traces without labels, torch's ``Optimizer.step#`` span)."""
    unrecorded = sorted(set(windows) - set(recorded))
    if unrecorded:
        raise OverlayError(f"{trace_path.name} profiled step {unrecorded[0]} but rank{rank}.json recorded "
                           f"no optimizer step there, so the trace's clock cannot be tied to the record's.")
    labels = {op["name"] for op in recorded.values()}
    candidates = sorted((e for e in spans if e.get("name") in labels
                         or str(e.get("name", "")).startswith("Optimizer.step#")), key=lambda e: e["ts"])
    pairs = []
    for step in sorted(windows):
        w = windows[step]
        inside = [e for e in candidates if w["ts"] <= e["ts"] <= w["ts"] + w["dur"]]
        label = recorded[step]["name"]
        anchor = next((e for e in inside if e.get("name") == label), None) or next(
            (e for e in inside if str(e.get("name", "")).startswith("Optimizer.step#")), None)
        if anchor is None:
            raise OverlayError(f"{trace_path.name}'s ProfilerStep#{step} holds no {label!r} or "
                               f"Optimizer.step span, so the trace's clock cannot be tied to the record's.")
        pairs.append((step, anchor))
    return pairs


def _anchors_in_order(trace_path: Path, spans: list[dict], rank: int,
                      recorded: dict[int, dict]) -> list[tuple[int, dict]]:
    """An unscheduled trace (older runs) holds every step: the k-th ``Optimizer.step#`` span is step k's."""
    anchors = sorted((e for e in spans if str(e.get("name", "")).startswith("Optimizer.step#")),
                     key=lambda e: e["ts"])
    steps = sorted(recorded)
    if len(anchors) != len(steps) or not steps:
        raise OverlayError(f"{trace_path.name} has {len(anchors)} optimizer steps "
                           f"but rank{rank}.json recorded "
                           f"{len(steps)}, so the trace's clock cannot be tied to the record's.")
    return list(zip(steps, anchors, strict=True))


def _step_of(t: float, offsets: dict[int, float], step_times: list[float]) -> int | None:
    for step, t0 in offsets.items():
        length = step_times[step] if step < len(step_times) else math.inf
        if t0 - 1e-4 <= t <= t0 + length:
            return step
    return None


def _layer_of(launch: dict, annotations: list[dict]) -> int | None:
    inside = [a for a in annotations if a.get("tid") == launch.get("tid")
              and a["ts"] <= launch["ts"] <= a["ts"] + a["dur"]]
    if not inside:
        return None
    m = _FSDP_ANNOTATION.match(max(inside, key=lambda a: a["ts"])["name"])
    return int(m[2]) if m[2] is not None else 0  # the root unit: named after layer 0, as the simulator does
