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
    return retime_replayed(replayed_ops(timeline, row_of_op), timeline.steps, factors, host_factor)


def retime_replayed(ops: list[tuple], steps: int, factors: np.ndarray, host_factor: np.ndarray) -> np.ndarray:
    """:func:`retime` of ops already in the replay's form (:func:`replayed_ops`)."""
    zero = np.zeros(host_factor.shape[0])
    host, free, last_compute = zero, {}, None
    issued: dict[float, np.ndarray] = {}  # each issue cost times host_factor, computed once
    before = last = zero
    for _ in range(steps):
        ends: dict[int, np.ndarray] = {}
        host_end = None  # the end of the step's last sync or host op
        for index, kind, stream, deps, issue, seconds, row, waits, needed in ops:
            if issue > 0:
                step = issued.get(issue)
                if step is None:
                    step = issued[issue] = issue * host_factor
                host = host + step
            if kind == "sync":
                end = host
                for dep in deps:
                    end = np.maximum(end, ends[dep])
                host = host_end = end  # the host thread waited for it
            elif kind == "host":
                end = host = host_end = host + seconds * factors[row]  # the host thread did it
            else:
                start = np.maximum(host, free[stream]) if stream in free else host
                if waits and last_compute is not None:
                    start = np.maximum(start, last_compute)
                for dep in deps:
                    start = np.maximum(start, ends[dep])
                end = free[stream] = start + seconds * factors[row] if seconds else start
                if kind == "compute":
                    last_compute = end
            if needed:
                ends[index] = end
        # A stream runs its ops one after another and the host's clock never goes back, so the step's
        # last end is the last on some stream or the host's: no other op can end later.
        step_end = zero
        for end in (*free.values(), *(() if host_end is None else (host_end,))):
            step_end = np.maximum(step_end, end)
        before, last = last, step_end
    return last - before


def replayed_ops(timeline: Timeline, row_of_op: np.ndarray) -> list[tuple]:
    """Each op as the replay reads it: index, kind, stream, what it waits on, its issue cost, its
    recorded seconds, its factors' row, whether it follows the compute before it, and whether any op
    waits on it."""
    needed = {d for op in timeline.ops for d in op.deps}  # only ends someone waits on are kept
    seconds, rows = timeline.seconds.tolist(), row_of_op.tolist()
    return [(op.index, op.kind, op.stream, op.deps,
             timeline.host_overhead_s if op.host_s is None else op.host_s, seconds[op.index], rows[op.index],
             op.kind == "collective" and (op.after_compute or timeline.always_after_compute),
             op.index in needed) for op in timeline.ops]
