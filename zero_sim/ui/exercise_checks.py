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

Every check returns a :class:`Verdict`: right or not, why, and the answer. A wrong try gets a
hint that points at the idea (what limits the step, which memory grows) and never the answer,
which waits behind "show the answer"; a right one says why in a sentence with the numbers
that decide it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from zero_sim.published.ranking import MIN_DIFFERENCE
from zero_sim.scenario import simulate
from zero_sim.strategies import STRATEGIES, declaring
from zero_sim.strategies.capabilities import DEEPSPEED, PYTORCH

FIT_SCENARIO = {"model": "gpt-7.5b", "gpus": 8, "topology": "dgx-a100", "gpu": "A100-40GB"}
FIT_STRATEGIES = tuple(STRATEGIES)
# The recompute modes notebook 09 explains before the exercise; "op" (per-op checkpointing) is left
# out because the notebook never introduces it, and an unexplained choice teaches nothing.
FIT_RECOMPUTE = ("none", "selective", "full")
FIT_MICRO_BATCHES = (1, 2, 4, 8)
# Buckets are DDP's (PyTorch's, stage 0); the slowdown is ZeRO-3's (DeepSpeed's, stage 3).
BUCKET_SCENARIO = {"model": "gpt2-124m", "strategy": declaring(PYTORCH, stage=0).name, "gpus": 8,
                   "topology": "pcie", "micro_batch": 8}
BUCKET_SIZES_MB = (1, 2, 5, 10, 25, 50, 100, 200, 500)
SLOWDOWN_SCENARIO = {"model": "gpt2-1.5b", "strategy": declaring(DEEPSPEED, stage=3).name, "gpus": 16,
                     "topology": "p4d-efa", "micro_batch": 4}
FAST_NODE_GBPS, SLOW_NODE_GBPS = 1600, 100
SLOWDOWN_TOLERANCE = 0.25


@dataclass(frozen=True)
class Verdict:
    right: bool
    why: str  # right: why, with the numbers that decide it; wrong: a hint, never the answer
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
                for s in FIT_STRATEGIES for r in FIT_RECOMPUTE for mb in FIT_MICRO_BATCHES}
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
                              f"{_gb(capacity)}. Which memory is too big here: the model states every "
                              f"rank keeps (a higher ZeRO stage shards them) or the activations that grow "
                              f"with the micro-batch (recompute or a smaller micro-batch)?", answer)
    if speed >= best_speed * (1 - MIN_DIFFERENCE):
        return Verdict(True, f"It fits ({where}) and runs {speed:,.0f} tokens/s per GPU, within 5% of the "
                             f"fastest choice that fits: it shards just enough and recomputes no more than "
                             f"it must.", answer)
    return Verdict(False, f"It fits ({where}), but it is {best_speed / speed - 1:.0%} slower than the "
                          f"fastest choice that fits. What limits the step here: recompute costs compute, "
                          f"a small micro-batch leaves the GPU idle. Does a lighter choice also fit?", answer)


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
        return Verdict(True, f"With {bucket_mb:g} MiB buckets only {exposed:.1f} ms of all-reduce is left "
                             f"after the backward pass ({per_size[min(BUCKET_SIZES_MB)]:.1f} ms at "
                             f"{min(BUCKET_SIZES_MB):g} MiB, {per_size[max(BUCKET_SIZES_MB)]:.1f} ms at "
                             f"{max(BUCKET_SIZES_MB):g} MiB): big enough that few latencies queue on the "
                             f"shared bus, small enough to start early.", answer)
    why = ("each small bucket pays a start-up latency, and on a shared PCIe bus they queue one behind "
           "another" if bucket_mb < best else
           "a large bucket starts only when all its gradients are ready, so the last one runs after the "
           "backward pass has ended")
    return Verdict(False, f"{exposed:.1f} ms of all-reduce is still exposed: {why}. Which way should the "
                          f"bucket size move?", answer)


@cache
def _slowdown_steps() -> tuple[dict, dict]:
    """The ZeRO-3 step's metrics at 1,600 and at 100 Gbit/s per node."""
    fast, slow = (simulate(**SLOWDOWN_SCENARIO, node_bandwidth_gbps=bw).metrics
                  for bw in (FAST_NODE_GBPS, SLOW_NODE_GBPS))
    return fast, slow


def simulated_slowdown() -> float:
    """How many times longer a ZeRO-3 step takes at 100 than at 1,600 Gbit/s per node."""
    fast, slow = _slowdown_steps()
    return slow["step_time_s"] / fast["step_time_s"]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms"


def check_slowdown(predicted: float) -> Verdict:
    actual = simulated_slowdown()
    fast, slow = _slowdown_steps()
    answer = (f"The simulator says {actual:.2f}x: {_ms(fast['step_time_s'])} a step at "
              f"{FAST_NODE_GBPS:,} Gbit/s, {_ms(slow['step_time_s'])} at {SLOW_NODE_GBPS} Gbit/s. Each rank "
              f"moves about 3 x 2 bytes per parameter per step (two all-gathers of the weights and a "
              f"reduce-scatter of the gradients); the part of that time compute cannot hide is what grows "
              f"as the network slows.")
    if predicted <= 0:
        return Verdict(False, "A step cannot take zero or negative time: predict a factor such as 1.5.",
                       answer)
    if abs(predicted / actual - 1) <= SLOWDOWN_TOLERANCE:
        return Verdict(True, f"You said {predicted:.2f}x and the step goes from {_ms(fast['step_time_s'])} "
                             f"to {_ms(slow['step_time_s'])} ({actual:.2f}x): compute stays about "
                             f"{_ms(fast['compute_time_s'])}, and only the communication it cannot hide "
                             f"grows, from {_ms(fast['exposed_comm_s'])} to {_ms(slow['exposed_comm_s'])}.",
                       answer)
    if predicted > actual:
        hint = ("Less than that. The network is 16 times slower, but is the step all network? Part of the "
                "communication runs while the GPU computes, and compute does not slow down.")
    else:
        hint = ("More than that. What limits the step at 100 Gbit/s: the GPU's compute, or the weights and "
                "gradients every layer must send and receive (3 x 2 bytes per parameter per step)?")
    return Verdict(False, hint, answer)


__all__ = ["BUCKET_SIZES_MB", "FIT_MICRO_BATCHES", "FIT_RECOMPUTE", "FIT_SCENARIO", "FIT_STRATEGIES",
           "Verdict",
           "fastest_fits", "check_bucket", "check_fit", "check_slowdown", "simulated_slowdown"]
