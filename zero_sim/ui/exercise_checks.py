"""Exercises with a target, and the checks that say whether an answer meets it and why.

Each check simulates what the learner chose and judges it against the best answer the
simulator finds among every choice the exercise offers, so "right" means what the notebook
says it means and nothing is hard-coded:

* :func:`check_fit`: make a 7.5B model fit on 8 x A100-40GB with the least slowdown (strategy,
  activation recompute, micro-batch). Right: it fits (reserved memory within capacity) and its
  throughput is within 5% of the fastest choice that fits, the planner's "too close to call"
  (:data:`~zero_sim.published.ranking.MIN_DIFFERENCE`);
* :func:`check_bucket`: the DDP bucket size that hides the most all-reduce behind the backward
  pass on PCIe. Right: its exposed communication is within 5% (or 0.1 ms) of the least any
  offered bucket size reaches;
* :func:`check_slowdown`: predict how many times slower a ZeRO-3 step gets when each node's
  network drops from 1,600 to 100 Gbit/s. Right: within 25% of the simulated ratio (a
  back-of-the-envelope answer, not a measurement).

Every check returns a :class:`Verdict`: right or not, one sentence why, and the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from zero_sim.published.ranking import MIN_DIFFERENCE
from zero_sim.scenario import simulate
from zero_sim.strategies import STRATEGIES
from zero_sim.system.workload import RECOMPUTE_MODES

FIT_SCENARIO = {"model": "gpt-7.5b", "gpus": 8, "topology": "dgx-a100", "gpu": "A100-40GB"}
FIT_STRATEGIES = tuple(STRATEGIES)
FIT_MICRO_BATCHES = (1, 2, 4, 8)
BUCKET_SCENARIO = {"model": "gpt2-124m", "strategy": "ddp", "gpus": 8, "topology": "pcie", "micro_batch": 8}
BUCKET_SIZES_MB = (1, 2, 5, 10, 25, 50, 100, 200, 500)
SLOWDOWN_SCENARIO = {"model": "gpt2-1.5b", "strategy": "zero3", "gpus": 16, "topology": "p4d-efa",
                     "micro_batch": 4}
FAST_NODE_GBPS, SLOW_NODE_GBPS = 1600, 100
SLOWDOWN_TOLERANCE = 0.25


@dataclass(frozen=True)
class Verdict:
    right: bool
    why: str  # one or two sentences, with the numbers that decided it
    answer: str  # the best choice, for the "show the answer" button


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


@cache
def _fit_outcome(strategy: str, recompute: str, micro_batch: int) -> tuple[bool, float, float, float]:
    """(fits, tokens/s per GPU, reserved bytes, capacity bytes) of one choice."""
    m = simulate(**FIT_SCENARIO, strategy=strategy, recompute=recompute, micro_batch=micro_batch).metrics
    mem = m["memory"]
    return bool(mem["fits"]), m["tokens_per_s_per_gpu"], mem["reserved_peak_bytes"], mem["capacity_bytes"]


@cache
def fastest_fits(count: int = 3) -> tuple[tuple[tuple[str, str, int], float], ...]:
    """The ``count`` fastest choices that fit, each with its tokens/s per GPU, fastest first."""
    outcomes = {(s, r, mb): _fit_outcome(s, r, mb)
                for s in FIT_STRATEGIES for r in RECOMPUTE_MODES for mb in FIT_MICRO_BATCHES}
    fitting = sorted(((choice, o[1]) for choice, o in outcomes.items() if o[0]), key=lambda c: -c[1])
    return tuple(fitting[:count])


def check_fit(strategy: str, recompute: str, micro_batch: int) -> Verdict:
    fits, speed, reserved, capacity = _fit_outcome(strategy, recompute, micro_batch)
    podium = fastest_fits()
    best_speed = podium[0][1]
    answer = "The fastest choices that fit: " + "; ".join(
        f"{i}. {s}, recompute {r}, micro-batch {mb}: {tps:,.0f} tokens/s per GPU"
        for i, ((s, r, mb), tps) in enumerate(podium, 1)) + "."
    where = f"{_gb(reserved)} of {_gb(capacity)}"
    if not fits:
        return Verdict(False, f"It does not fit: it needs {_gb(reserved)} reserved of the GPU's "
                              f"{_gb(capacity)}. Shard more (a higher ZeRO stage), recompute activations, "
                              f"or take a smaller micro-batch.", answer)
    if speed >= best_speed * (1 - MIN_DIFFERENCE):
        return Verdict(True, f"Right: it fits ({where}) and runs {speed:,.0f} tokens/s per GPU, within 5% "
                             f"of the fastest choice that fits.", answer)
    return Verdict(False, f"It fits ({where}), but at {speed:,.0f} tokens/s per GPU it is "
                          f"{best_speed / speed - 1:.0%} slower than the fastest choice that fits. Recompute "
                          f"costs compute; does a lighter one, or another strategy, also fit?", answer)


@cache
def _exposed_ms(bucket_mb: float) -> float:
    return simulate(**BUCKET_SCENARIO, bucket_mb=bucket_mb).metrics["exposed_comm_s"] * 1e3


def check_bucket(bucket_mb: float) -> Verdict:
    exposed = _exposed_ms(bucket_mb)
    per_size = {size: _exposed_ms(size) for size in BUCKET_SIZES_MB}
    best = min(per_size, key=per_size.get)
    answer = (f"{best:g} MiB: {per_size[best]:.1f} ms exposed. Small buckets pay a latency each and the "
              f"shared PCIe bus serialises them; large ones start late, so the last all-reduce runs after "
              f"the backward pass has ended. " +
              ", ".join(f"{size:g} MiB {ms:.1f} ms" for size, ms in per_size.items()))
    if exposed <= max(per_size[best] * (1 + MIN_DIFFERENCE), per_size[best] + 0.1):
        return Verdict(True, f"Right: {exposed:.1f} ms of all-reduce left exposed, as little as any "
                             f"bucket size offered reaches.", answer)
    direction = "smaller" if bucket_mb > best else "larger"
    return Verdict(False, f"{exposed:.1f} ms of all-reduce is still exposed; some {direction} bucket leaves "
                          f"{per_size[best]:.1f} ms.", answer)


@cache
def simulated_slowdown() -> float:
    """How many times longer a ZeRO-3 step takes at 100 than at 1,600 Gbit/s per node."""
    fast, slow = (simulate(**SLOWDOWN_SCENARIO, node_bandwidth_gbps=bw).metrics["step_time_s"]
                  for bw in (FAST_NODE_GBPS, SLOW_NODE_GBPS))
    return slow / fast


def check_slowdown(predicted: float) -> Verdict:
    actual = simulated_slowdown()
    answer = (f"The simulator says {actual:.2f}x. Each rank moves about 3 x 2 bytes per parameter per step "
              f"(two all-gathers of the weights and a reduce-scatter of the gradients); the part of that "
              f"time compute cannot hide is what grows as the network slows.")
    if predicted <= 0:
        return Verdict(False, "A step cannot take zero or negative time: predict a factor such as 1.5.",
                       answer)
    if abs(predicted / actual - 1) <= SLOWDOWN_TOLERANCE:
        return Verdict(True, f"Right: you said {predicted:.2f}x, the simulator says {actual:.2f}x.", answer)
    side = "more" if predicted > actual else "less"
    return Verdict(False, f"You said {predicted:.2f}x; the simulator says {actual:.2f}x, so the step slows "
                          f"{'less' if side == 'more' else 'more'} than you expected. How much of the "
                          f"communication hides behind compute?", answer)


__all__ = ["BUCKET_SIZES_MB", "FIT_MICRO_BATCHES", "FIT_SCENARIO", "FIT_STRATEGIES", "Verdict",
           "fastest_fits", "check_bucket", "check_fit", "check_slowdown", "simulated_slowdown"]
