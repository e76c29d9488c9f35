"""What a candidate cannot beat, known before it is simulated: the planner's pre-filter.

Building a candidate's program takes a few milliseconds; running it on the engine takes ten
times that or more.  Two bounds read off the program let a search skip most of the engine runs
without changing its answer:

* **memory, from below.** No strategy frees an activation before backward, so when the last
  layer's backward begins every saved activation is allocated (and, under recompute, that layer's
  recomputed ones) on top of the model states that stay across steps: the tensors' peak is at
  least ``resident + those activations``, and
  the reserved peak (what must fit) at least that with the allocator's reserve and the context
  added (the same rule :mod:`zero_sim.results` applies).  A candidate whose bound exceeds the
  GPU's memory cannot fit, and is not simulated.
* **time, from below.** A stream runs one op at a time, so a steady step takes at least the sum
  of its compute ops, at least the sum of each comm stream's collectives, each taking no
  less than it would alone on the links (every sibling group running with it, as they do),
  at least the sum of each copy stream's copies at the host link's whole rate (offloading),
  and at least the host thread's own time: every op's issue cost and the host ops' work (an
  optimizer on the CPU) one after another; throughput per GPU is at most the step's tokens
  over the longest of these.
  A candidate whose best possible throughput (all its GPUs together), with :data:`MARGIN` to
  spare (a step's window may clip compute that ran ahead into the step before), is below the
  K-th fastest found so far cannot enter the top K, and is not simulated.

Under gradient accumulation the micro-steps between the first and the last issue the same ops
(what differs is the first's allocations and the last's gradient sync), so a program of
:data:`BUILT_MICRO_STEPS` micro-steps is built and its middle one counted for all of them:
the sums are those of the whole program at a fraction of the building
(``tests/test_plan_search.py`` compares them with a program built in full for every strategy).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zero_sim.engine.groups import process_groups
from zero_sim.engine.program import Program
from zero_sim.results import allocator_reserve, context_gb
from zero_sim.scenario.pipeline import _program, check_size, prepare, rank_figures, ranks_alike_in
from zero_sim.scenario.symmetry import explicit_ranks
from zero_sim.settings import ScenarioError
from zero_sim.strategies.base import StrategyError
from zero_sim.system.collectives import CollectiveModel
from zero_sim.system.host_side import copy_loads

# Slack on the time bound: a candidate is pruned only when even this much faster than its bound
# it would not reach the top K.  Simulated throughput stays below its bound (docs/planning.md
# gives the largest ratio seen over a varied sample; tests/test_plan_search.py checks one).
MARGIN = 0.02
# Micro-steps built to bound a step of more: the first, one in the middle, the last.
BUILT_MICRO_STEPS = 3


@dataclass(frozen=True)
class Bounds:
    """A candidate's bounds: reserved memory from below, throughput per GPU from above."""

    reserved_low_bytes: float
    capacity_bytes: float
    tokens_per_s_per_gpu_high: float
    gpus: int

    @property
    def tokens_per_s_high(self) -> float:
        return self.tokens_per_s_per_gpu_high * self.gpus

    @property
    def cannot_fit(self) -> bool:
        return self.reserved_low_bytes > self.capacity_bytes

    def cannot_reach(self, kth_best_tokens_per_s: float) -> bool:
        return self.tokens_per_s_high * (1.0 + MARGIN) < kth_best_tokens_per_s


@dataclass(frozen=True)
class _Counted:
    """A program and how many times each of its ops occurs in the step it stands for."""

    program: Program
    times: list[int]

    def items(self, kind: str):
        return ((op, n) for op, n in zip(self.program.ops, self.times, strict=True) if op.kind == kind)


def _counted(p) -> _Counted:
    """The candidate's program, with a long gradient accumulation built as three micro-steps whose
    middle one stands for every middle micro-step; refused in the sentence :func:`simulate` gives."""
    k = p.settings.grad_accum
    if k <= BUILT_MICRO_STEPS:
        program = _program(p)
        return _Counted(program, [1] * len(program.ops))
    try:
        program = p.strategy.build(replace(p.ctx, grad_accum=BUILT_MICRO_STEPS))
    except StrategyError as exc:
        raise ScenarioError(str(exc)) from None
    first, middle_end = program.micro_starts[1], program.micro_starts[2]
    middle = k - BUILT_MICRO_STEPS + 1
    check_size(p.settings, len(p.workload.layers), len(program.ops) + (middle - 1) * (middle_end - first))
    return _Counted(program, [middle if first <= i < middle_end else 1 for i in range(len(program.ops))])


def _comm_seconds(p, counted: _Counted) -> dict[str, float]:
    """Each comm stream's collectives, each at its time alone on the links (every group of it at once)."""
    model = CollectiveModel(p.topology, p.settings.backend, p.settings.algorithm, p.calibration)
    busy: dict[str, float] = {}
    alone: dict[tuple, float] = {}  # a program repeats each collective per layer and micro-step
    for op, n in counted.items("collective"):
        key = (op.collective, op.nbytes, op.group)
        seconds = alone.get(key)
        if seconds is None:
            plan = model.plan(op.collective, op.nbytes, process_groups(p.topology, op.group))
            seconds = alone[key] = plan.isolated_time(p.topology)
        # The collective's own kernels (ZeRO++'s quantization) hold its stream after the transfer.
        busy[op.stream] = busy.get(op.stream, 0.0) + n * (seconds + op.seconds)
    return busy


def _copy_seconds(p, counted: _Counted) -> dict[str, float]:
    """Each copy stream's copies, each at the host link's whole rate (shared with the GPUs behind the
    same uplink when one rank stands for them, as the engine shares it)."""
    collapsed = not explicit_ranks(p.settings, ranks_alike_in(p))
    capacity = {name: link.capacity for name, link in p.topology.links.items()}
    busy: dict[str, float] = {}
    for op, n in counted.items("copy"):
        if op.nbytes > 0:
            loads = copy_loads(p.topology, 0, op.stream, collapsed)
            rate = min(capacity[name] / load for name, load in loads)
            busy[op.stream] = busy.get(op.stream, 0.0) + n * op.nbytes / rate
    return busy


def _host_seconds(p, counted: _Counted) -> float:
    """The host thread's own time: every op's issue cost, and the work of host ops (an optimizer on
    the CPU), one after another."""
    default = p.settings.host_overhead_us * 1e-6
    return sum(n * (max(0.0, default if op.host_s is None else op.host_s)
                    + (op.seconds if op.kind == "host" else 0.0))
               for op, n in zip(counted.program.ops, counted.times, strict=True))


def _slowdown(p) -> float:
    """How much a GPU's compute slows while communication is in flight on its rank (the engine's
    plain GPU device); 0 where a CPU calibration's shared cores time the rank instead."""
    figures = rank_figures(p)
    plain_gpu = p.gpu.name != "CPU" and figures.shared_cores is None
    return figures.overlap_slowdown if plain_gpu else 0.0


def step_low_seconds(p, counted: _Counted) -> float:
    """A steady step's time from below: the longest of the rank's queues.  Compute that runs while a
    collective is in flight goes at ``1 / (1 + slowdown)`` of its pace, and some collective is in
    flight for at least the busiest comm stream's time, so the compute stream needs its work plus
    ``slowdown / (1 + slowdown)`` of that time."""
    compute = sum(n * op.seconds for op, n in counted.items("compute"))
    comm = max(_comm_seconds(p, counted).values(), default=0.0)
    slowdown = _slowdown(p)
    queues = [compute + comm * slowdown / (1.0 + slowdown), comm, *_copy_seconds(p, counted).values(),
              _host_seconds(p, counted)]
    return max(queues)


def _resident_bytes(p) -> int:
    """What the GPU holds across steps: the model states the step's builder starts its program from,
    known before any op is built."""
    try:
        return sum(p.strategy.step(p.ctx).resident().values())
    except StrategyError as exc:
        raise ScenarioError(str(exc)) from None


def _activations_low(workload) -> int:
    """Activation bytes held together at some moment of every micro-step: when the last layer's
    backward begins, every layer's saved activations are still allocated, and under recompute the
    last layer's recomputed ones on top of them (Step.backward allocates them before any is freed)."""
    saved = sum(layer.checkpointed_activation_bytes for layer in workload.layers)
    last = workload.layers[-1]
    recomputed = last.activation_bytes - last.checkpointed_activation_bytes
    return saved + (recomputed if workload.recompute != "none" and recomputed > 0 else 0)


def bounds(**scenario) -> Bounds:
    """The bounds of one ``simulate()`` scenario; refusals raise as :func:`zero_sim.simulate` does.
    The memory bound comes first, from the model states alone: a candidate that cannot fit has no
    program built (its throughput bound is left infinite, never used)."""
    p = prepare(**scenario)
    s, workload = p.settings, p.workload
    peak_low = _resident_bytes(p) + _activations_low(workload)
    reserve = allocator_reserve(workload.recompute, s.allocator_reserve)
    reserved_low = peak_low * (1.0 + reserve) + context_gb(p.gpu.name, s.cuda_context_gb) * 1e9
    if reserved_low > p.gpu.hbm_bytes:
        return Bounds(reserved_low, float(p.gpu.hbm_bytes), float("inf"), s.gpus)
    counted = _counted(p)
    step_low = step_low_seconds(p, counted)
    tokens = workload.tokens_per_micro_batch * s.grad_accum  # per GPU per step
    high = tokens / step_low if step_low > 0 else float("inf")
    return Bounds(reserved_low, float(p.gpu.hbm_bytes), high, s.gpus)


__all__ = ["BUILT_MICRO_STEPS", "MARGIN", "Bounds", "bounds"]
