"""Where a step's time goes: compute, communication, exposed communication and phases.

One definition for predicted and measured steps alike, so that an error between them is
a difference of timelines and never of bookkeeping:

* ``compute_time_s``: time the compute stream is busy (the union of its spans);
* ``comm_time_s``: time some collective is in flight;
* ``exposed_comm_s``: time a collective is in flight while compute is idle, the
  communication that nothing hid;
* phases: up to the end of the last backward compute op, time is ``forward_s`` from the start
  of a forward compute op to the start of the next backward one, and ``backward_s`` from the
  start of a backward op to the start of the next forward one (an idle gap belongs to the phase
  of the op before it; ops of neither phase, such as a per-unit update, to the phase they run
  in); ``optimizer_s`` is the rest, to the end of the step.  So ``step = forward + backward +
  optimizer`` exactly.  With one micro-step this splits at the first backward op; under
  gradient accumulation each micro-step's forward is forward time, wherever it runs (splitting
  only at the first backward op counted every later micro-step's forward as backward).

The optimizer phase holds two different things, split so that a reader never mistakes a
network wait for a slow optimizer:

* ``optimizer_update_s``: the time the compute stream is busy in that phase, the update
  itself (Adam's arithmetic, and any copy of gathered weights);
* ``optimizer_wait_s``: the rest of the phase, where compute idles: waiting for the last
  gradient reductions (DDP's final all-reduces, ZeRO's reduce-scatters) or for the
  updated shards' all-gathers.  ``optimizer_s = optimizer_wait_s + optimizer_update_s``.

Spans are clipped to the step's window ``[lo, hi]``.
"""

from __future__ import annotations

Span = tuple[float, float]

# The phase keys a step's ``phases`` holds, in the order they happen.
PHASE_KEYS = ("forward_s", "backward_s", "optimizer_s", "optimizer_wait_s", "optimizer_update_s")


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intervals merged where they overlap, sorted; empty ones dropped."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def length(intervals) -> float:
    """Total length of disjoint intervals."""
    return sum(end - start for start, end in intervals)


def clip(intervals, lo: float, hi: float) -> list[tuple[float, float]]:
    """The parts of the intervals inside ``[lo, hi]``."""
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def uncovered(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of ``a`` not covered by ``b`` (both already unions, sorted)."""
    total, j = 0.0, 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                total += b[k][0] - cur
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            total += e - cur
    return total


def forward_time(forward: list[Span], backward: list[Span], lo: float, end: float) -> float:
    """Time in ``[lo, end]`` that is forward: from each forward op's start to the next backward
    op's start; the window opens in forward (a step starts with one)."""
    starts = sorted([(max(s, lo), True) for s, _ in forward] + [(max(s, lo), False) for s, _ in backward])
    total, since, in_forward = 0.0, lo, True
    for start, is_forward in starts:
        if start >= end:
            break
        if in_forward and not is_forward:
            total += start - since
        elif is_forward and not in_forward:
            since = start
        in_forward = is_forward
    return total + (max(0.0, end - since) if in_forward else 0.0)


def step_breakdown(compute: list[Span], comm: list[Span], backward: list[Span], lo: float, hi: float,
                   forward: list[Span] = ()) -> dict[str, float]:
    """The step's time divided as the module docstring says; ``backward`` and ``forward`` list
    the spans of backward compute ops (recompute included) and forward ones, which split the
    phases (without ``forward``, the window splits at the first backward op)."""
    busy = union(clip(compute, lo, hi))
    talking = union(clip(comm, lo, hi))
    last_bwd = max((e for _, e in backward), default=hi)
    end = min(last_bwd, hi)
    forward_s = forward_time(list(forward), backward, lo, end) if backward else max(0.0, hi - lo)
    optimizer_s = max(0.0, hi - max(last_bwd, lo))
    update_s = length(clip(busy, max(last_bwd, lo), hi))
    return {
        "step_time_s": hi - lo,
        "compute_time_s": length(busy),
        "comm_time_s": length(talking),
        "exposed_comm_s": uncovered(talking, busy),
        "forward_s": forward_s,
        "backward_s": max(0.0, end - lo - forward_s),
        "optimizer_s": optimizer_s,
        "optimizer_wait_s": max(0.0, optimizer_s - update_s),
        "optimizer_update_s": update_s,
        "backward_end_s": min(last_bwd, hi),
    }
