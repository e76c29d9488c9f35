"""What a simulation returns: every op, memory over time, and the headline metrics.

All metrics describe rank 0's *last* simulated step (the steady state), measured over
the window from the end of the step before to the end of its own last op:

* ``step_time_s``: the window's length;
* ``compute_time_s``: time the compute stream is busy in the window;
* ``exposed_comm_s``: time some comm stream is busy while the compute stream is idle:
  communication nobody hid;
* ``comm_overlap_fraction``: share of communication time that ran under compute
  (``None`` when there is no communication);
* ``comm_volume_bytes``: bytes this rank sends per step under ring algorithms
  (nccl-tests' bus factors; gloo's reduce-scatter counts as an all-reduce);
* ``phases``: ``forward_s`` from step start to the first backward op, ``backward_s`` to
  the end of the last backward op, ``optimizer_s`` from there to the end of the step;
* ``memory``: resident model states, peaks of activations and buffers, the peak total,
  the GPU's capacity and whether the peak fits (``shortfall_bytes`` when it does not);
* ``tflops_per_gpu``: model FLOPs (forward + backward, recompute not counted) per second;
  ``hardware_tflops_per_gpu`` counts recompute too;
* ``tokens_per_s``: tokens of the global batch per second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zero_sim.breakdown import step_breakdown
from zero_sim.trace import to_chrome_trace
from zero_sim.vocabulary import (
    ACTIVATIONS,
    BACKWARD,
    BUFFERS,
    COMPUTE,
    GRADS,
    MEMORY_CATEGORIES,
    OPTIMIZER_STATE,
    PARAMS,
)


@dataclass
class SimResult:
    """One simulation: ``metrics`` (the JSON contract), ``ops``, ``memory``, and how it was set up."""

    metrics: dict[str, Any]
    ops: list[dict[str, Any]]
    memory: list[dict[str, Any]]  # {rank, t_s, category, bytes}: the category's total after each change
    scenario: dict[str, Any]
    window: tuple[float, float]
    world_size: int
    simulated_ranks: list[int]
    notes: list[str] = field(default_factory=list)
    events: int = 0

    def ops_frame(self):
        import pandas as pd

        return pd.DataFrame(self.ops)

    def memory_frame(self):
        import pandas as pd

        return pd.DataFrame(self.memory)

    def step_ops(self, rank: int = 0) -> list[dict[str, Any]]:
        """Ops of the reported step on ``rank``, times relative to the step's start."""
        lo, hi = self.window
        step = self.metrics["reported_step"]
        out = []
        for op in self.ops:
            if op["rank"] == rank and op["step"] == step:
                out.append(op | {"start_s": op["start_s"] - lo, "end_s": op["end_s"] - lo})
        return out

    def rank_of_lane(self, rank: int) -> int:
        """The simulated rank whose timeline ``rank`` shares (all of them, when ranks were collapsed)."""
        return rank if rank in self.simulated_ranks else self.simulated_ranks[0]

    def to_chrome_trace(self, path=None):
        return to_chrome_trace(self, path)

    # Drawing loads matplotlib, which a simulation never needs: it is imported when a plot is asked for.
    def plot_timeline(self, **kw):
        from zero_sim.ui.plots import plot_timeline

        return plot_timeline(self, **kw)

    def plot_memory(self, **kw):
        from zero_sim.ui.plots import plot_memory

        return plot_memory(self, **kw)


def compute_metrics(run, program, scenario, world_size: int, tokens_per_step: int,
                    capacity_bytes: int) -> dict:
    rank = run.simulated_ranks[0]
    ends = run.step_ends[rank]
    step = len(ends) - 1
    lo = ends[-2] if len(ends) > 1 else 0.0
    hi = ends[-1]
    step_time = hi - lo
    ops = [r for r in run.records if r.rank == rank and r.step == step]

    # Ops of this step that ran before the window (the host's run-ahead) are clipped to it.
    parts = step_breakdown([(r.start_s, r.end_s) for r in ops if r.stream == COMPUTE],
                           [(r.start_s, r.end_s) for r in ops if r.kind == "collective"],
                           [(r.start_s, r.end_s) for r in ops if r.phase == BACKWARD and r.stream == COMPUTE],
                           lo, hi)
    compute_s, comm_s, exposed = parts["compute_time_s"], parts["comm_time_s"], parts["exposed_comm_s"]
    volume = sum(run.plans[op.index].sent_bytes for op in program.ops if op.kind == "collective")
    hw_flops = sum(op.flops for op in program.ops)

    memory = memory_metrics(run, rank, capacity_bytes)
    return {
        "params": scenario["params"],
        "strategy": scenario["strategy"],
        "gpus": world_size,
        "model": scenario["model"],
        "topology": scenario["topology"],
        "gpu": scenario["gpu"],
        "backend": scenario["backend"],
        "step_time_s": step_time,
        "compute_time_s": compute_s,
        "comm_time_s": comm_s,
        "exposed_comm_s": exposed,
        "comm_overlap_fraction": (1.0 - exposed / comm_s) if comm_s > 0 else None,
        "comm_volume_bytes": volume,
        "collectives_per_step": sum(1 for op in program.ops if op.kind == "collective"),
        "phases": {k: parts[k] for k in ("forward_s", "backward_s", "optimizer_s")},
        "memory": memory,
        "tflops_per_gpu": program.model_flops / step_time / 1e12 if step_time > 0 else 0.0,
        "hardware_tflops_per_gpu": hw_flops / step_time / 1e12 if step_time > 0 else 0.0,
        "tokens_per_s": tokens_per_step / step_time if step_time > 0 else 0.0,
        "reported_step": step,
        "simulated_ranks": len(run.simulated_ranks),
    }


def memory_metrics(run, rank: int, capacity_bytes: int) -> dict:
    resident = run.resident
    peaks = {c: resident.get(c, 0) for c in MEMORY_CATEGORIES}
    current = {c: resident.get(c, 0) for c in MEMORY_CATEGORIES}
    peak_total = sum(current.values())
    for _t_s, cat, total in sorted(run.memory[rank], key=lambda x: x[0]):
        current[cat] = total
        peaks[cat] = max(peaks[cat], total)
        peak_total = max(peak_total, sum(current.values()))
    model_states = resident.get(PARAMS, 0) + resident.get(GRADS, 0) + resident.get(OPTIMIZER_STATE, 0)
    fits = peak_total <= capacity_bytes
    return {
        "params_bytes": resident.get(PARAMS, 0),
        "grads_bytes": resident.get(GRADS, 0),
        "optimizer_bytes": resident.get(OPTIMIZER_STATE, 0),
        "model_states_bytes": model_states,
        "activations_bytes": peaks[ACTIVATIONS],
        "buffers_bytes": peaks[BUFFERS],
        "peak_bytes": peak_total,
        "capacity_bytes": capacity_bytes,
        "fits": fits,
        "shortfall_bytes": 0 if fits else peak_total - capacity_bytes,
    }
