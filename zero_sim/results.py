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
* ``phases``: ``forward_s`` and ``backward_s`` up to the end of the last backward op, each
  micro-step's forward counted as forward, ``optimizer_s`` from there to the end of the step, split
  into ``optimizer_wait_s`` (compute idle, waiting for communication) and
  ``optimizer_update_s`` (the update's own compute), see :mod:`zero_sim.breakdown`;
* ``memory``: resident model states, peaks of activations and buffers, the tensors' peak
  total (``peak_bytes``: what ``torch.cuda.max_memory_allocated`` reports), the reserved peak
  (``reserved_peak_bytes``: what the GPU must hold, see below), the GPU's capacity and whether
  the reserved peak fits (``shortfall_bytes`` when it does not);
* ``gpu_waiting_for_host_s``: time the host is busy (launching kernels, the loop's own work)
  while neither compute nor a collective runs: the part of the step that is host-bound;
* ``tflops_per_gpu``: model FLOPs (forward + backward, recompute not counted) per second;
  ``hardware_tflops_per_gpu`` counts recompute too;
* ``tokens_per_s``: tokens of the global batch per second.

Memory beyond the tensors.  A GPU holds more than the tensors' peak: the caching allocator
keeps freed blocks reserved, and split blocks fragment (``allocator_reserve``, a fraction of
the peak), and every process has a CUDA context with its kernels, cuBLAS workspaces and NCCL's
communication buffers (``cuda_context_gb``).  ``reserved_peak_bytes = peak_bytes * (1 +
allocator_reserve) + context`` is what ``torch.cuda.max_memory_reserved`` plus the context
reaches (what ``nvidia-smi`` shows), and it is what must fit.  Defaults and their sources:

* context, by GPU (:data:`CONTEXT_GB`): the CUDA context is about 0.3-0.4 GB since CUDA 11.7
  loads kernels lazily (over 1 GB before; PyTorch maintainers in pytorch/pytorch#107667 and
  #109888); one NCCL communicator holds 0.54-0.69 GB on 4 x A100 over NVLink
  (NVIDIA/nccl#964) and about 1.06 GB on 8 x H100 (NVIDIA/nccl#1685).  Sum: 1.1 GB on A100
  (and older GPUs), 1.5 GB on H100, H200 and newer; nothing for CPU ranks (gloo).
* allocator reserve (:func:`allocator_reserve`): GMLake (Guo et al., ASPLOS 2024, "GMLake:
  Efficient and Transparent GPU Memory Defragmentation for Large-scale DNN Training with
  Virtual Memory Stitching"; its README repeats the evaluation) measures fragmentation,
  ``1 - peak active / peak reserved``, of PyTorch's caching allocator when LLMs train with
  ZeRO-3 and recompute (with LoRA or offload in some runs) on A100-80GB: up to 30%, and on
  average 15 points above its own allocator, which keeps about 10%.  Recompute is what those
  runs share and what the paper names first among the techniques that fragment ("complicated
  strategies lead to fragmentation"), so a run that recomputes takes 10% + 15% = 25%
  fragmentation: reserved = peak / 0.75, a reserve of one third of the peak.  A run without
  recompute repeats the same allocations every step and takes 0.10, the low end of the range,
  a judgement within the sourced range rather than a fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from zero_sim.breakdown import PHASE_KEYS, clip, step_breakdown, uncovered, union
from zero_sim.trace import to_chrome_trace
from zero_sim.vocabulary import (
    ACTIVATIONS,
    BACKWARD,
    BUFFERS,
    COMPUTE,
    FORWARD,
    GRADS,
    MEMORY_CATEGORIES,
    OPTIMIZER_STATE,
    PARAMS,
)

if TYPE_CHECKING:  # the result carries a scenario; the scenario package builds results
    from zero_sim.scenario.types import Scenario
    from zero_sim.vocabulary.records import OpRecord

# GB per GPU outside the tensors (CUDA context with its kernels and cuBLAS workspaces, plus one
# NCCL communicator's buffers); sources in the module docstring.  Unknown GPUs: the newest figure.
CONTEXT_GB = {"V100": 1.1, "A100-40GB": 1.1, "A100-80GB": 1.1, "H100": 1.5, "H200": 1.5, "CPU": 0.0}
DEFAULT_CONTEXT_GB = 1.5
# Fraction of the tensors' peak the caching allocator holds reserved but unused (module docstring):
# without recompute, the low end of GMLake's range; with it, GMLake's 25% fragmentation.
ALLOCATOR_RESERVE_PLAIN = 0.10
FRAGMENTATION_WITH_RECOMPUTE = 0.25
ALLOCATOR_RESERVE_RECOMPUTE = 1.0 / (1.0 - FRAGMENTATION_WITH_RECOMPUTE) - 1.0


def context_gb(gpu_name: str, given: float | None = None) -> float:
    """GB outside the tensors on one ``gpu_name`` rank: ``given`` when set, else the sourced default."""
    if given is not None:
        return float(given)
    return CONTEXT_GB.get(gpu_name, DEFAULT_CONTEXT_GB)


def allocator_reserve(recompute: str, given: float | None = None) -> float:
    """The reserved-but-unused share of the tensors' peak: ``given`` when set, else by recompute mode."""
    if given is not None:
        return float(given)
    return ALLOCATOR_RESERVE_PLAIN if recompute == "none" else ALLOCATOR_RESERVE_RECOMPUTE


@dataclass
class SimResult:
    """One simulation: ``metrics`` (the JSON contract), ``ops``, ``memory``, and how it was set up.

    ``ops`` and ``memory`` are built from the engine's records the first time they are read: a
    search that reads only ``metrics`` never pays for hundreds of thousands of dicts."""

    metrics: dict[str, Any]
    records: list[OpRecord] = field(repr=False)
    # rank -> (t, category, the category's total after the change)
    memory_samples: dict[int, list[tuple[float, str, int]]] = field(repr=False)
    scenario: Scenario  # every setting, resolved (zero_sim.scenario.types); .to_dict() for JSON
    window: tuple[float, float]
    world_size: int
    simulated_ranks: list[int]
    notes: list[str] = field(default_factory=list)
    events: int = 0
    # simulate(interval="later"): what computes the 80% interval later (zero_sim.intervals.speed)
    later_interval: Any = field(default=None, repr=False)

    @cached_property
    def ops(self) -> list[dict[str, Any]]:
        """Every op of every simulated rank, as :meth:`OpRecord.to_dict` writes it."""
        return [r.to_dict() for r in self.records]

    @cached_property
    def memory(self) -> list[dict[str, Any]]:
        """{rank, t_s, category, bytes}: each category's total after each change, every simulated rank."""
        return [{"rank": rank, "t_s": t, "category": cat, "bytes": b}
                for rank, samples in self.memory_samples.items() for t, cat, b in samples]

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

    def plot_timeline(self, **kw):
        """The reported step's Gantt chart, one lane per rank x stream (the ui's ``plot_timeline``)."""
        return _drawing("timeline")(self, **kw)

    def plot_memory(self, **kw):
        """Memory by category over the reported step (the ui's ``plot_memory``)."""
        return _drawing("memory")(self, **kw)


# Drawing belongs to the ui (zero_sim.ui.plots), which sits above this module and reads results:
# for results to import it would point an arrow back up.  The package's root, above both and
# imported before any result exists, hands the ui's functions over with draw_with().
_DRAWINGS: dict[str, Callable[..., Any]] = {}


def draw_with(**drawings: Callable[..., Any]) -> None:
    """Register what draws a result: ``timeline=`` and ``memory=``, each called as
    ``drawing(result, **options)`` by :meth:`SimResult.plot_timeline` and :meth:`SimResult.plot_memory`."""
    _DRAWINGS.update(drawings)


def _drawing(kind: str) -> Callable[..., Any]:
    if kind not in _DRAWINGS:
        raise RuntimeError(f"nothing draws a result's {kind}: zero_sim registers the ui's plots with "
                           f"zero_sim.results.draw_with() when it is imported")
    return _DRAWINGS[kind]


def compute_metrics(run, program, scenario: Scenario, world_size: int, tokens_per_step: int,
                    capacity_bytes: int, context_bytes: int = 0, allocator_reserve: float = 0.0) -> dict:
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
                           lo, hi,
                           [(r.start_s, r.end_s) for r in ops if r.phase == FORWARD and r.stream == COMPUTE])
    compute_s, comm_s, exposed = parts["compute_time_s"], parts["comm_time_s"], parts["exposed_comm_s"]
    volume = sum(run.plans[op.index].sent_bytes for op in program.ops if op.kind == "collective")
    hw_flops = sum(op.flops for op in program.ops)

    memory = memory_metrics(run, rank, capacity_bytes, context_bytes, allocator_reserve)
    # The GPU waits for its host where the host is busy (launching, the loop's own work) and neither
    # compute nor a collective runs: the step is host-bound that long.
    host_busy = union(clip([(r.start_s, r.end_s) for r in ops if r.kind == "host"], lo, hi))
    gpu_busy = union(clip([(r.start_s, r.end_s) for r in ops
                           if r.stream == COMPUTE or r.kind == "collective"], lo, hi))
    return {
        "params": scenario.workload.params,
        "strategy": scenario.training.strategy,
        "gpus": world_size,
        "model": scenario.workload.model,
        "topology": scenario.cluster.topology,
        "cluster": scenario.cluster.topology_description,  # every link class as simulated
        "gpu": scenario.cluster.gpu,
        "backend": scenario.cluster.backend,
        "step_time_s": step_time,
        "compute_time_s": compute_s,
        "comm_time_s": comm_s,
        "exposed_comm_s": exposed,
        "comm_overlap_fraction": (1.0 - exposed / comm_s) if comm_s > 0 else None,
        "comm_volume_bytes": volume,
        "collectives_per_step": sum(1 for op in program.ops if op.kind == "collective"),
        "phases": {k: parts[k] for k in PHASE_KEYS},
        "gpu_waiting_for_host_s": uncovered(host_busy, gpu_busy),
        "memory": memory,
        "tflops_per_gpu": program.model_flops / step_time / 1e12 if step_time > 0 else 0.0,
        "hardware_tflops_per_gpu": hw_flops / step_time / 1e12 if step_time > 0 else 0.0,
        "tokens_per_s": tokens_per_step / step_time if step_time > 0 else 0.0,
        "reported_step": step,
        "simulated_ranks": len(run.simulated_ranks),
    }


def memory_metrics(run, rank: int, capacity_bytes: int, context_bytes: int = 0,
                   allocator_reserve: float = 0.0) -> dict:
    """Rank ``rank``'s memory: the tensors' peak, the reserved peak (plus allocator reserve and
    context) and whether the reserved peak fits in ``capacity_bytes``."""
    resident = run.resident
    peaks = {c: resident.get(c, 0) for c in MEMORY_CATEGORIES}
    current = {c: resident.get(c, 0) for c in MEMORY_CATEGORIES}
    peak_total = sum(current.values())
    for _t_s, cat, total in sorted(run.memory[rank], key=lambda x: x[0]):
        current[cat] = total
        peaks[cat] = max(peaks[cat], total)
        peak_total = max(peak_total, sum(current.values()))
    model_states = resident.get(PARAMS, 0) + resident.get(GRADS, 0) + resident.get(OPTIMIZER_STATE, 0)
    reserved = int(round(peak_total * (1.0 + allocator_reserve))) + int(context_bytes)
    fits = reserved <= capacity_bytes
    return {
        "params_bytes": resident.get(PARAMS, 0),
        "grads_bytes": resident.get(GRADS, 0),
        "optimizer_bytes": resident.get(OPTIMIZER_STATE, 0),
        "model_states_bytes": model_states,
        "activations_bytes": peaks[ACTIVATIONS],
        "buffers_bytes": peaks[BUFFERS],
        "peak_bytes": peak_total,
        "context_bytes": int(context_bytes),
        "reserved_peak_bytes": reserved,
        "capacity_bytes": capacity_bytes,
        "fits": fits,
        "shortfall_bytes": 0 if fits else reserved - capacity_bytes,
    }
