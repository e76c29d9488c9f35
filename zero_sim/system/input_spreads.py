"""How far each uncertain input of a prediction may be from the value the simulator uses.

A prediction's interval is propagated from these (:mod:`zero_sim.intervals.sampling`): each input is a
factor on the time of the ops it governs, log-normal and **centred on the simulator's own
value** (its median is 1), so the simulated step stays the middle of what the inputs allow.
Each spread is stated as the half-range ``h`` of an 80% range: the factor lies within
``1/(1+h)`` and ``1+h`` in 80% of cases, i.e. ``sigma = ln(1+h) / 1.2816`` in log space.

The spreads come from microbenchmarks and the models' own fits, never from whole runs
(docs/uncertainty.md has the table with the reasoning):

* **compute efficiency** (every compute op): the kernel models' accuracy against their
  microbenchmarks, per GPU generation: ±10% where the GEMM and attention curves were
  measured (Ampere, Hopper: attention rates within 5% rms in log, the GEMM curve 8-21% fast
  at small shapes, docs/compute.md), ±15% elsewhere (one figure carried over). A prediction
  at the default stack adds ±15%: the eager and compiled stacks' element-wise, attention and
  launch figures differ by about that much on a transformer layer (docs/stacks.md).
* **whole-run overhead** (every compute op): the one fitted factor; ±6% on a generation it
  was fitted for (its leave-one-source-out refits move it by a few percent), ±12% on one
  that takes the pooled figure (the fitted generations differ by 9%).
* **host cost per kernel** (issue costs and host work): ×/÷1.5, the walkthroughs' 5-25 us
  of CPU per eager op around the modelled figure (:mod:`zero_sim.system.host_costs`).
* **collective efficiency**, by message size and scale: inside a node ±10% from 64 KB up
  (the fitted nccl-tests curves follow every published point within 10%, docs/network.md)
  and ±25% below (fixed costs differ between NCCL versions); across nodes ±15% at two nodes
  (fitted on two-node curves only; EFA v2's efficiency was carried over, not identified), and
  10 points wider for each doubling beyond two nodes (no curve beyond two nodes was fitted:
  assumed), +10 points below 64 KB.
* **host-link copies** (offloading) ±15%, assumed; the **CPU optimizer's rate** within 2x
  either way on another CPU (assumed, as before, :mod:`zero_sim.system.host_side`).

Features judged but never fitted (FP8, ZeRO++, offloading, QLoRA): no whole run with them
entered the overhead fit, and a feature changes more than its own kernels (what overlaps
what, the allocator's traffic, the host's work), so beside the overhead's doubled spread the
whole step takes one more factor, ±50% (:data:`UNFITTED_STEP`, assumed).  The published runs
with these features, judged and never fitted, sat +23% to +64% (ZeRO++ on 384 V100s) and +2%
to +20% (FP8, as configured) from the model (docs/published.md): a check that the figure is
not too wide, not a fit.  The
allocator's reserve is an input of memory, not of speed: its interval is the memory model's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zero_sim.system.gpus import GENERATIONS

Z80 = 1.2815515655446004  # the standard normal's 90th percentile: an 80% range is +-1.28 sigma
SMALL_MESSAGE = 64 * 1024  # below this a collective is latency-bound (docs/network.md)

COMPUTE_MEASURED, COMPUTE_CARRIED = 0.10, 0.15
MEASURED_GENERATIONS = frozenset({"ampere", "hopper"})  # GEMM and attention curves measured
DEFAULT_STACK = 0.15  # the stack unknown: eager vs compiled figures on a layer
OVERHEAD_FITTED, OVERHEAD_POOLED = 0.06, 0.12
HOST_PER_KERNEL = 0.5
INTRA_NODE, INTRA_NODE_SMALL = 0.10, 0.25
INTER_NODE_TWO, PER_DOUBLING, SMALL_EXTRA = 0.15, 0.10, 0.10
HOST_LINK = 0.15
CPU_UPDATE = 1.0  # within 2x either way
UNFITTED_OVERHEAD = 2.0  # the overhead's spread is doubled for a feature no fit has seen
UNFITTED_STEP = 0.50  # and the whole step takes a factor of its own (assumed; see above)


def sigma(half_range: float) -> float:
    """The log-space standard deviation of an input whose 80% range is x/÷ (1 + half_range)."""
    return math.log1p(half_range) / Z80


@dataclass(frozen=True)
class Feature:
    """A feature judged but never fitted, and why its step is less sure."""

    name: str
    why: str


FEATURES = {
    "fp8": Feature("FP8", "float8 GEMMs and their casts are modelled from kernel benchmarks; "
                   "no whole run in float8 was fitted"),
    "zeropp": Feature("ZeRO++", "quantized collectives, their kernels and hpZ's secondary copy are "
                      "modelled, never fitted to a run or an all-to-all curve"),
    "offload": Feature("offloading", "host copies and the CPU update beside the GPU's step are modelled "
                       "from published rates; no offloaded run was fitted"),
    "qlora": Feature("QLoRA", "the 4-bit base's dequantization kernels are modelled; no QLoRA run "
                     "was fitted"),
}


def unfitted_features(training, knobs) -> list[Feature]:
    """The features a scenario uses that no fit has seen (its training settings and strategy knobs)."""
    found = []
    if training.precision == "fp8" or training.fp8_all_gather:
        found.append(FEATURES["fp8"])
    if getattr(knobs, "zero_quantized_weights", False) or getattr(knobs, "zero_quantized_gradients", False) \
            or (getattr(knobs, "zero_hpz_partition_size", 1) or 1) > 1:
        found.append(FEATURES["zeropp"])
    if training.offload_optimizer != "none" or training.offload_params != "none":
        found.append(FEATURES["offload"])
    if training.lora_base == "nf4":
        found.append(FEATURES["qlora"])
    return found


def compute_spread(gpu: str, stack_given: bool) -> float:
    """Half-range of the compute efficiency: the kernel model's, plus the stack's when not named."""
    own = COMPUTE_MEASURED if GENERATIONS.get(gpu) in MEASURED_GENERATIONS else COMPUTE_CARRIED
    if stack_given:
        return own
    return math.expm1(math.hypot(math.log1p(own), math.log1p(DEFAULT_STACK)))


def overhead_spread(gpu: str, fitted_generations, unfitted: bool) -> float:
    """Half-range of the whole-run overhead: fitted for this generation or pooled, doubled if unfitted."""
    base = OVERHEAD_FITTED if GENERATIONS.get(gpu) in fitted_generations else OVERHEAD_POOLED
    return math.expm1(math.log1p(base) * (UNFITTED_OVERHEAD if unfitted else 1.0))


def collective_spread(nbytes: float, nodes: int) -> float:
    """Half-range of a collective's time: by its message size and how many nodes it spans."""
    small = nbytes < SMALL_MESSAGE
    if nodes <= 1:
        return INTRA_NODE_SMALL if small else INTRA_NODE
    doublings = max(0.0, math.log2(nodes / 2))
    return INTER_NODE_TWO + PER_DOUBLING * doublings + (SMALL_EXTRA if small else 0.0)
