"""Collectives read back from a torch.profiler Chrome trace, for runs whose rank files hold
compute ops only (torch's own FSDP2 runs its collectives inside torch).

The rules (gloo worker spans paired with their launches, FSDP annotations for layers, one
clock anchor per step) are set out in :mod:`sim2real.overlay`'s docstring.
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

    # One clock anchor per step: the optimizer's span in the trace and ``opt ...`` in the record.
    anchors = sorted((e for e in spans if str(e.get("name", "")).startswith("Optimizer.step#")),
                     key=lambda e: e["ts"])
    recorded = {}
    for op in rank_ops:
        if op["stream"] == COMPUTE and op_kind(op["name"]) == "opt":
            recorded.setdefault(op["step"], op)
    steps = sorted(recorded)
    if len(anchors) != len(steps) or not steps:
        raise OverlayError(f"{trace_path.name} has {len(anchors)} optimizer steps "
                           f"but rank{rank}.json recorded "
                           f"{len(steps)}, so the trace's clock cannot be tied to the record's.")
    offsets = {}
    for step, anchor in zip(steps, anchors, strict=True):
        op = recorded[step]
        rec_dur, trace_dur = op["end_s"] - op["start_s"], anchor["dur"] / 1e6
        if abs(rec_dur - trace_dur) > 2e-3 + 0.1 * rec_dur:
            raise OverlayError(f"{trace_path.name}'s optimizer step {step} lasted "
                               f"{trace_dur * 1e3:.1f} ms but the "
                               f"record says {rec_dur * 1e3:.1f} ms, "
                               f"so the two clocks cannot be tied together.")
        offsets[step] = anchor["ts"] / 1e6 - op["start_s"]  # trace seconds at the step's t = 0

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
