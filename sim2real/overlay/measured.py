"""The measured step: which step is compared, and its timing and memory read by the same
definitions the simulator's metrics use (:mod:`zero_sim.breakdown`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import pandas as pd

from sim2real.overlay.base import OverlayError, op_kind
from sim2real.overlay.runs import MeasuredRun
from zero_sim.breakdown import step_breakdown
from zero_sim.vocabulary import (
    ACTIVATIONS,
    BACKWARD,
    BUFFERS,
    COLLECTIVES,
    COMPUTE,
    FORWARD,
    GRADS,
    MEMORY_CATEGORIES,
    OPTIMIZER_STATE,
    PARAMS,
)


@dataclass
class MeasuredStep:
    """One measured step, every rank's times from that rank's own step start (t = 0).

    ``step_time_s`` maps rank -> its duration of the step (``Recorder`` clock);
    ``wall_s`` is ``run.json``'s figure for the step: the slowest rank's."""

    step: int
    ops: pd.DataFrame
    step_time_s: dict[int, float]
    wall_s: float
    chosen: str


def measured_step(run: MeasuredRun, step: int | None = None) -> MeasuredStep:
    """The step to compare: ``step`` if given, else the one of median duration among steps >= 1.

    With an even number of candidates the shorter of the two middle steps is taken
    (``statistics.median_low``), so the choice is always a step that really happened."""
    walls = list(run.run.get("step_times_s") or [])
    n = len(walls) or max((len(v) for v in run.step_times_s.values()), default=0)
    if n == 0:
        raise OverlayError(f"{run.path} recorded no steps, so there is nothing to compare.")
    if step is None:
        candidates = list(range(1, n)) or [0]
        if walls:
            median = statistics.median_low([walls[s] for s in candidates])
            step = next(s for s in candidates if walls[s] == median)
            chosen = f"step {step}: median duration of steps {candidates[0]}-{candidates[-1]}"
        else:
            step, chosen = candidates[-1], f"step {candidates[-1]}: the last"
    else:
        if not isinstance(step, int) or not 0 <= step < n:
            raise OverlayError(f"Step {step} is out of range: the run recorded steps 0 to {n - 1}.")
        chosen = f"step {step}: as asked"
    ops = run.ops[run.ops["step"] == step].copy()
    for rank in range(run.world_size):
        mine = ops[(ops["rank"] == rank) & (ops["stream"] == COMPUTE)]
        if not mine["name"].astype(str).str.startswith("fwd L").any():
            raise OverlayError(f"rank{rank}.json has no 'fwd L<i>' compute ops in step {step}, so its record "
                               f"is empty or was not written by real_runs.train.")
    times = {r: (t[step] if step < len(t) else float(ops[ops["rank"] == r]["end_s"].max()))
             for r, t in run.step_times_s.items()}
    wall = walls[step] if walls else max(times.values())
    return MeasuredStep(step=step, ops=ops.sort_values(["rank", "start_s"]).reset_index(drop=True),
                        step_time_s=times, wall_s=wall, chosen=chosen)



def step_timing(ops, step_time_s: float) -> dict[str, float]:
    """Step metrics of one rank's ops (times from the step start) by
    :func:`zero_sim.results.compute_metrics`'s rules.

    ``compute_s``: union of compute-stream spans clipped to the step; ``exposed_comm_s``:
    collective time not under compute; phases split at each forward and backward compute
    op (:mod:`zero_sim.breakdown`).  Applied to a SimResult's own step ops it gives back its metrics."""
    ops = list(ops)
    return step_breakdown([(o["start_s"], o["end_s"]) for o in ops if o["stream"] == COMPUTE],
                          [(o["start_s"], o["end_s"]) for o in ops if op_kind(o["name"]) in COLLECTIVES],
                          [(o["start_s"], o["end_s"]) for o in ops
                           if o["stream"] == COMPUTE and _is_backward(o)],
                          0.0, step_time_s,
                          [(o["start_s"], o["end_s"]) for o in ops
                           if o["stream"] == COMPUTE and _phase_of(o) == FORWARD])


def timing_per_step(run: MeasuredRun, first_step: int = 1) -> dict[int, dict[str, float]]:
    """Step -> :func:`step_timing` of that step, the mean over its ranks, for every step from
    ``first_step`` (step 0 pays one-off costs)."""
    per_step = {}
    for step in sorted(s for s in set(run.ops["step"]) if s >= first_step):
        ops = run.ops[run.ops["step"] == step]
        ranks = [step_timing(records(ops[ops["rank"] == r]), run.step_times_s[r][step])
                 for r in range(run.world_size) if step < len(run.step_times_s.get(r, ()))]
        if ranks:
            per_step[step] = {k: statistics.fmean(t[k] for t in ranks) for k in ranks[0]}
    if not per_step:
        raise OverlayError(f"{run.path} recorded no steps from step {first_step} on, "
                           f"so there is nothing to compare; run more steps.")
    return per_step


def median_timing(per_step) -> dict[str, float]:
    """The median over steps of each figure of :func:`timing_per_step`'s values."""
    per_step = list(per_step)
    return {k: statistics.median(t[k] for t in per_step) for k in per_step[0]}


def steady_timing(run: MeasuredRun, first_step: int = 1) -> dict[str, float]:
    """:func:`step_timing` of a whole run: per step the mean over ranks, then the median over
    steps from ``first_step`` (step 0 pays one-off costs).

    One step on one rank is a noisy measurement: exposed communication in particular is a
    difference of two longer spans, so it moves from step to step on a shared CPU.  The
    simulator runs its ranks alike, so the ranks' mean is what it predicts, and the median
    over steps is how validation reads step time too."""
    return median_timing(timing_per_step(run, first_step).values())


def _is_backward(op) -> bool:
    return _phase_of(op) == BACKWARD


def _phase_of(op) -> str | None:
    # The simulator tags ops with their phase; the recorder tags compute ops too, but a
    # trace-derived op has none, so fall back to the name (``fwd L3``; ``bwd L3``, ``recompute L3``).
    phase = op.get("phase")
    if phase is not None and not (isinstance(phase, float) and math.isnan(phase)):
        return phase
    kind = op_kind(op["name"])
    return BACKWARD if kind in ("bwd", "recompute") else FORWARD if kind == "fwd" else None


def records(frame: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in frame.to_dict("records")]


def measured_timing(ms: MeasuredStep, rank: int = 0) -> dict[str, float]:
    """:func:`step_timing` of one rank of a measured step."""
    return step_timing(records(ms.ops[ms.ops["rank"] == rank]), ms.step_time_s[rank])


def measured_memory(run: MeasuredRun, step: int, rank: int = 0) -> dict[str, int]:
    """Resident model states and this step's peaks of activations, buffers and the total, on ``rank``.

    The timeline is replayed from the run's start, so the state at the step's start is
    known; the peak total is the largest sum of all categories at any sample of the step."""
    current = dict.fromkeys(MEMORY_CATEGORIES, 0)
    peaks = dict.fromkeys(MEMORY_CATEGORIES, 0)
    peak_total = 0
    samples = run.memory[run.memory["rank"] == rank]
    started = False
    for s, cat, nbytes in zip(samples["step"], samples["category"], samples["bytes"], strict=True):
        if s > step:
            break
        if s == step and not started:
            started = True
            peaks = dict(current)
            peak_total = sum(current.values())
        current[cat] = int(nbytes)
        if s == step:
            peaks[cat] = max(peaks[cat], int(nbytes))
            peak_total = max(peak_total, sum(current.values()))
    held = run.peaks.get(rank, {})
    out = {c: int(held.get(c, current[c])) for c in (PARAMS, GRADS, OPTIMIZER_STATE)}
    out["model states"] = sum(out.values())
    out[ACTIVATIONS] = peaks[ACTIVATIONS] if started else int(held.get(ACTIVATIONS, 0))
    out[BUFFERS] = peaks[BUFFERS] if started else int(held.get(BUFFERS, 0))
    out["peak total"] = peak_total if started else sum(out[c] for c in (PARAMS, GRADS, OPTIMIZER_STATE,
                                                                         ACTIVATIONS, BUFFERS))
    return out
