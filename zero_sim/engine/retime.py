"""One simulated step re-timed with every op's time scaled, for many samples at once.

An interval propagated through the simulator needs the step time under many draws of its
inputs (:mod:`zero_sim.intervals.sampling`).  Re-running the discrete-event engine per draw is too
slow, so the engine runs once and records what each op took in the last step
(``RunOutput.op_seconds``); :func:`retime` then replays the program with each op's time
multiplied by its sampled factor, every sample at once as a numpy array, under the engine's
rules (docs/engine.md):

* the host thread issues ops in program order, paying each op's issue cost, and blocks at a
  ``sync`` op (until its dependencies end) and during ``host`` work;
* each stream is FIFO: an op starts once issued, once its stream is free and once the ops it
  waits on have ended; a collective issued with the compute stream current also waits for
  the compute op issued before it (``Op.after_compute``);
* the program runs ``steps`` times back to back and the last step is measured, from the end
  of the step before to the end of its own last op.

What the replay keeps from the simulation rather than redoing: how links were shared and how
much compute slowed beside NCCL (each op's recorded time carries them, then scaled), straggler
stalls (left out), waiting for other ranks at a collective (every rank is taken to run as the
first simulated one, as the symmetric engine does), and gloo's two calls in flight per stream
(replayed one at a time; :mod:`zero_sim.intervals.sampling` scales the replay to the simulated step).
With every factor 1 it gives the simulated step back; tests/test_confidence_propagated.py
checks that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zero_sim.engine.program import Op


@dataclass(frozen=True)
class Timeline:
    """What a replay needs: the program's ops, each op's recorded seconds, and the engine's settings."""

    ops: list[Op]
    seconds: np.ndarray  # by op index: what the op took in the last simulated step
    steps: int
    host_overhead_s: float  # the issue cost of an op without its own ``host_s``
    always_after_compute: bool = False  # gloo: every collective waits for the compute before it


def timeline_of(program, op_seconds: dict[int, float], steps: int, host_overhead_s: float,
                always_after_compute: bool = False) -> Timeline:
    seconds = np.array([op_seconds.get(op.index, 0.0) for op in program.ops])
    return Timeline(list(program.ops), seconds, steps, host_overhead_s, always_after_compute)


def retime(timeline: Timeline, factors: np.ndarray, row_of_op: np.ndarray,
           host_factor: np.ndarray) -> np.ndarray:
    """The last step's time per sample.  Op ``i``'s recorded time is scaled by
    ``factors[row_of_op[i]]`` (a table of rows x samples: ops scaled alike share a row, so a
    program of a million ops needs no million-row table), every issue cost by ``host_factor``."""
    zero = np.zeros(host_factor.shape[0])
    needed = {d for op in timeline.ops for d in op.deps}  # only ends someone waits on are kept
    host, free, last_compute = zero, {}, None
    before = last = zero
    for _ in range(timeline.steps):
        ends: dict[int, np.ndarray] = {}
        step_end = zero
        for op in timeline.ops:
            issue = timeline.host_overhead_s if op.host_s is None else op.host_s
            if issue > 0:
                host = host + issue * host_factor
            duration = timeline.seconds[op.index] * factors[row_of_op[op.index]]
            end = _op_end(op, timeline, host, free, last_compute, ends, duration)
            if op.kind in ("sync", "host"):
                host = end  # the host thread waited for it or did it
            elif op.kind == "compute":
                last_compute = end
            if op.index in needed:
                ends[op.index] = end
            step_end = np.maximum(step_end, end)
        before, last = last, step_end
    return last - before


def _op_end(op: Op, timeline: Timeline, host, free: dict, last_compute, ends: dict, duration):
    """When ``op`` ends, per sample, given the host's clock and its streams' and dependencies' ends."""
    if op.kind == "sync":
        start = host
        for dep in op.deps:
            start = np.maximum(start, ends[dep])
        return start
    if op.kind == "host":
        return host + duration
    start = np.maximum(host, free[op.stream]) if op.stream in free else host
    waits = op.kind == "collective" and (op.after_compute or timeline.always_after_compute)
    if waits and last_compute is not None:
        start = np.maximum(start, last_compute)
    for dep in op.deps:
        start = np.maximum(start, ends[dep])
    end = free[op.stream] = start + duration
    return end
