"""The space of validation cases this machine can run, and random draws from it.

A fixed grid invites constants that fit it; the error that matters is the one on a case
nobody looked at.  ``zero-sim validate --sample K --seed S`` therefore draws K cases at
random from everything the project runs on this machine, and the report lists what was
drawn, so a sample is reproduced exactly by its seed.

Strategies are dealt, not drawn: in rounds that hold every strategy once, each round in a
shuffled order, so K cases give every strategy K/7 cases, rounded down or up.  The report
prints each strategy's median error, and a median over one or two cases is just those
cases; at K = 30 every strategy gets four or five.  The strategies sampled are every real
strategy whose collectives the run records (``fsdp-torch`` is left out: FSDP2 runs its
collectives inside torch, so its rank files hold compute only).

What one draw then picks for its strategy, each independently:

* **model**: ``tiny``, ``small`` or ``medium`` (0.9M, 5.8M and 34M parameters);
* **shape** of the emulated cluster: ``uniform`` (a link per rank), ``two-nodes`` (two
  halves joined by one link) or ``shared-bus`` (one queue for all);
* **N**: 2, 3 or 4 ranks (3 only where the shape allows it: two nodes need an even N);
* **micro-batch**: 1-4 sequences per rank (1-2 for ``medium``, whose steps are longest);
  the global batch is N times it, so it always splits;
* **bandwidth**: log-uniform in 0.3-5 Gbit/s, rounded to two significant figures;
* **bucket size**: log-uniform in 1-50 MB, rounded, for the strategies that have buckets
  (``ddp``, ``ddp-torch``, ``zero1``, ``zero2``); per-tensor variants and FSDP have none;
* **latency**: none, or with probability 1/3 log-uniform 0.1-2 ms one way, only where the
  kernel can add it (netem); otherwise none, and the caller says why.

The draws use :class:`random.Random` seeded with ``seed`` alone, so the same seed gives
the same cases on any machine and Python version.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from zero_sim.vocabulary.real_strategies import BUCKETED_REAL, SAMPLED_STRATEGIES

SAMPLED_MODELS = ("tiny", "small", "medium")
SAMPLED_SHAPES = ("uniform", "two-nodes", "shared-bus")
SAMPLED_RANKS = (2, 3, 4)
BANDWIDTH_GBPS = (0.3, 5.0)
BUCKET_MB = (1.0, 50.0)
LATENCY_MS = (0.1, 2.0)
LATENCY_CHANCE = 1 / 3
# The largest model's steps are the longest: fewer sequences keep a case within minutes.
MICRO_BATCHES = {"tiny": (1, 2, 3, 4), "small": (1, 2, 3, 4), "medium": (1, 2)}


@dataclass(frozen=True)
class Case:
    """One validation case.  ``None`` fields take the grid's defaults (``validate.Options``)."""

    strategy: str
    gpus: int
    bandwidth_gbps: float | None
    bucket_mb: float | None = None  # None: the strategy's default (25 MB), or no buckets
    model: str | None = None
    shape: str | None = None
    global_batch: int | None = None
    latency_ms: float = 0.0

    def label(self) -> str:
        """The case in one line, as the log and the report name it."""
        parts = [self.strategy, f"N={self.gpus}", f"bw={self.bandwidth_gbps}", f"bucket={self.bucket_mb}"]
        parts += [f"{k}={v}" for k, v in (("model", self.model), ("shape", self.shape),
                                          ("batch", self.global_batch)) if v is not None]
        if self.latency_ms:
            parts.append(f"latency={self.latency_ms}ms")
        return " ".join(parts)


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _two_figures(x: float) -> float:
    """``x`` rounded to two significant figures: readable in a table, and still spread out."""
    return float(f"{x:.2g}")


def draw_case(rng: random.Random, strategy: str, with_latency: bool, models=SAMPLED_MODELS) -> Case:
    """One case of ``strategy`` from the space the module docstring describes."""
    model = rng.choice(models)
    shape = rng.choice(SAMPLED_SHAPES)
    ranks = [n for n in SAMPLED_RANKS if shape != "two-nodes" or n % 2 == 0]
    gpus = rng.choice(ranks)
    micro = rng.choice(MICRO_BATCHES[model])
    bandwidth = _two_figures(_log_uniform(rng, *BANDWIDTH_GBPS))
    bucket = round(_log_uniform(rng, *BUCKET_MB), 1) if strategy in BUCKETED_REAL else None
    latency = 0.0
    if with_latency and rng.random() < LATENCY_CHANCE:
        latency = _two_figures(_log_uniform(rng, *LATENCY_MS))
    return Case(strategy, gpus, bandwidth, bucket, model=model, shape=shape,
                global_batch=gpus * micro, latency_ms=latency)


def sample_cases(k: int, seed: int, with_latency: bool = False, models=SAMPLED_MODELS) -> tuple[Case, ...]:
    """``k`` distinct cases drawn with ``seed``; ``with_latency`` where latency can be emulated."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"--sample must be a positive number of cases, got {k!r}")
    if k > 500:
        raise ValueError(f"--sample {k} would run for days; draw at most 500 cases")
    rng = random.Random(seed)
    drawn: dict[Case, None] = {}
    for strategy in _dealt_strategies(rng, k):
        for _ in range(100):  # a repeat is drawn again, for the same strategy
            case = draw_case(rng, strategy, with_latency, models)
            if case not in drawn:
                drawn[case] = None
                break
    return tuple(drawn)


def _dealt_strategies(rng: random.Random, k: int) -> list[str]:
    """``k`` strategies dealt in rounds of every strategy once, each round in a shuffled order."""
    dealt: list[str] = []
    while len(dealt) < k:
        round_ = list(SAMPLED_STRATEGIES)
        rng.shuffle(round_)
        dealt += round_
    return dealt[:k]


# The judged grid: every strategy that records its collectives, two rank counts, two
# bandwidths at which the small model's gradient all-reduce takes about as long as a CPU
# step's compute or longer (so communication is exposed), and two bucket sizes where
# buckets exist.
FULL_GRID = tuple(
    Case(s, n, bw, b)
    for n in (2, 4) for bw in (0.5, 2.0)
    for s, buckets in (("ddp", (25.0, 4.0)), ("zero1", (25.0,)), ("zero2", (25.0, 4.0)),
                       ("zero2-step", (None,)), ("zero2-hook", (None,)), ("fsdp", (None,)))
    for b in buckets
)
# Small enough for CI: three cases once drawn from the sampled space, from the two smaller
# models so that they run in minutes, and chosen for breadth: three strategies (two of them
# sharded) on three cluster shapes, one with more ranks than a 2-core machine has cores.
# That one runs 3 ranks, not 4: four ranks' collective sweep is the slowest piece of CI.
# They are written out so that the regression grid stays put when the sampler changes.
QUICK_GRID = (
    Case("ddp", 2, 2.8, 11.6, model="small", shape="uniform", global_batch=6),
    Case("fsdp", 2, 1.6, None, model="tiny", shape="two-nodes", global_batch=6),
    Case("zero1", 3, 1.8, 3.8, model="small", shape="shared-bus", global_batch=6),
)
