"""A prediction's interval, propagated from its inputs' spreads through the simulated step.

Each uncertain input (:mod:`zero_sim.system.input_spreads`: compute efficiency, the whole-run
overhead, host cost per kernel, collective efficiency inside and across nodes, host-link
copies, the CPU optimizer's rate, and a feature no fit has seen) is one standard normal draw
per sample.  An op's time is scaled by ``exp(sum of sigma_k x z_k)`` over the inputs that
govern it, ``sigma_k`` its spread for that op (a collective's by its message size and the
nodes it spans): one draw per input is shared by all of its ops, because an input's error is
systematic within a run (a slower fabric slows every collective crossing it).  The recorded
step is then re-timed with those factors (:func:`zero_sim.engine.retime.retime`), so what an
input's spread does to the step depends on where the step spends its time: a collective hidden
behind compute moves it little, an exposed one moves it fully.

:data:`SAMPLES` draws (half of them the others negated, so the draws are symmetric), seeded,
so a prediction's interval is the same every time.  The interval is the 10th to 90th
percentile of the re-timed step, scaled so that the simulated step is its median: every input
is centred on the simulator's value, and the fitted overhead was fitted as the median of the
*deterministic* predictions against published runs, so the deterministic step is the one
calibrated centre; the sampled median sits a little above it (a step is a sum and a max of
the inputs' factors), and that shift is reported (``median_shift``) rather than moved into
every prediction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zero_sim.engine.program import Op
from zero_sim.engine.retime import Timeline, replayed_ops, retime_replayed
from zero_sim.system import input_spreads as spreads
from zero_sim.system.run_overheads import fitted
from zero_sim.vocabulary import CPU_ADAM

SAMPLES = 256
SEED = 20261128
LOW_Q, HIGH_Q = 0.10, 0.90
INPUTS = ("compute", "run overhead", "host per kernel", "collectives inside a node",
          "collectives across nodes", "host-link copies", "CPU update", "unfitted feature")
COMPUTE, OVERHEAD, HOST, INTRA, INTER, COPY, CPU, FEATURE = range(len(INPUTS))


@dataclass(frozen=True)
class Setting:
    """What the spreads depend on besides the ops: the GPU, the stack, the shape of the cluster."""

    gpu: str
    stack_given: bool
    gpus: int
    gpus_per_node: int
    features: list = field(default_factory=list)  # input_spreads.Feature of unfitted features


@dataclass(frozen=True)
class StepInterval:
    low_s: float
    high_s: float
    median_shift: float  # sampled median over the simulated step, minus one
    inputs: dict[str, float]  # each input's largest half-range on an op of this step (0: none)
    shares: dict[str, float]  # how far each input alone moves the step (half-range of its 80% range)
    samples: int


def _nodes(op: Op, s: Setting) -> int:
    """How many nodes a collective's group spans: ``intra`` groups one, ``world`` and ``inter`` all."""
    if op.group.startswith("intra"):
        return 1
    return max(1, -(-s.gpus // max(s.gpus_per_node, 1)))


def op_sigmas(ops: list[Op], s: Setting) -> np.ndarray:
    """ops x inputs: each op's log-space spread per input (zero where the input does not govern it)."""
    out = np.zeros((len(ops), len(INPUTS)))
    unfitted = bool(s.features)
    compute = spreads.sigma(spreads.compute_spread(s.gpu, s.stack_given))
    overhead = spreads.sigma(spreads.overhead_spread(s.gpu, fitted()["overheads"], unfitted))
    extra = spreads.sigma(spreads.UNFITTED_STEP) if unfitted else 0.0
    for op in ops:
        row = out[op.index]
        if op.kind == "compute":
            row[COMPUTE], row[OVERHEAD] = compute, overhead
        elif op.kind == "collective":
            nodes = _nodes(op, s)
            row[INTER if nodes > 1 else INTRA] = spreads.sigma(spreads.collective_spread(op.nbytes, nodes))
        elif op.kind == "copy":
            row[COPY] = spreads.sigma(spreads.HOST_LINK)
        elif op.kind == "host":
            row[CPU if op.name == CPU_ADAM else HOST] = spreads.sigma(
                spreads.CPU_UPDATE if op.name == CPU_ADAM else spreads.HOST_PER_KERNEL)
        if op.kind != "sync":  # an unfitted feature's factor: on everything the step is made of
            row[FEATURE] = extra
    return out


def draws(samples: int = SAMPLES, seed: int = SEED) -> np.ndarray:
    """inputs x samples standard normal draws, half of them the others negated (seeded)."""
    half = np.random.default_rng(seed).standard_normal((len(INPUTS), samples // 2))
    return np.concatenate([half, -half], axis=1)


@dataclass(frozen=True)
class Replay:
    """A simulated step as its interval re-times it: each op in the replay's form
    (:func:`zero_sim.engine.retime.replayed_ops`), the distinct rows of spreads its ops take, and each
    input's largest spread.  Plain tuples and arrays, cheap to send between processes: a search keeps
    the replay of each row it simulates and re-times only the rows it shows."""

    ops: list[tuple]
    steps: int
    sigma_rows: np.ndarray  # distinct rows x inputs
    widest: np.ndarray  # by input: its largest log-space spread on an op of this step


def replay_of(timeline: Timeline, s: Setting) -> Replay:
    sig = op_sigmas(timeline.ops, s)
    rows, row_of_op = np.unique(sig, axis=0, return_inverse=True)  # ops scaled alike share a row
    return Replay(replayed_ops(timeline, row_of_op.reshape(-1)), timeline.steps, rows, sig.max(axis=0))


def step_interval(timeline: Timeline, s: Setting, simulated_s: float) -> StepInterval:
    """The step's 80% interval: the re-timed step's 10th and 90th percentiles, median at ``simulated_s``."""
    return replay_interval(replay_of(timeline, s), simulated_s)


def replay_interval(replay: Replay, simulated_s: float) -> StepInterval:
    """:func:`step_interval` of a step kept as its :class:`Replay`."""
    z = draws()
    host = np.exp(spreads.sigma(spreads.HOST_PER_KERNEL) * z[HOST])
    # One replay for every sample and, as a last column, the step with every factor 1 (the replay's own
    # step, which median_shift is measured from): each column's arithmetic is its own.
    ones = np.ones((len(replay.sigma_rows), 1))
    replayed = retime_replayed(replay.ops, replay.steps, np.hstack([np.exp(replay.sigma_rows @ z), ones]),
                               np.append(host, 1.0))
    times, unit = replayed[:-1], replayed[-1]
    low, median, high = np.quantile(times, [LOW_Q, 0.5, HIGH_Q])
    scale = simulated_s / median
    half_ranges = np.expm1(replay.widest * spreads.Z80)
    half_ranges[HOST] = spreads.HOST_PER_KERNEL  # every op's issue cost is scaled by it
    return StepInterval(float(low * scale), float(high * scale), float(median / unit - 1.0),
                        _named(half_ranges), _named(_shares(z, times, half_ranges > 0)), z.shape[1])


def _named(values) -> dict[str, float]:
    return {name: round(float(v), 4) for name, v in zip(INPUTS, values, strict=True)}


def _shares(z: np.ndarray, times: np.ndarray, used: np.ndarray) -> np.ndarray:
    """Each input's part in this step's spread: the least-squares slope of the log step time on its
    draws (the draws are independent), as the half-range its 80% range alone gives the step; an
    input no op of the step uses has none (its slope would be noise)."""
    centred = np.log(times) - np.log(times).mean()
    slopes = z @ centred / np.maximum((z * z).sum(axis=1), 1e-12)
    return np.where(used, np.expm1(np.abs(slopes) * spreads.Z80), 0.0)
