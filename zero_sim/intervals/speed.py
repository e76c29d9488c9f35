"""How sure a prediction is, and how it compares with the GPU's peak: the figures beside the headline.

* ``mfu``: model FLOPs utilisation, the FLOPs the model needs per step (forward and backward,
  recompute not counted, a causal mask's masked half of attention not counted) over the step
  time and the GPU's dense bf16 peak (``zero_sim.system.gpus``).  It stays below the highest of
  ``kernel_ceilings``, what the compute model lets each kernel family reach (docs/compute.md).
* ``prediction_interval``: how the 80% interval was obtained.  It is propagated through the
  simulator (:mod:`zero_sim.intervals.sampling`): the inputs' spreads, from microbenchmarks and the
  models' fits (:mod:`zero_sim.system.input_spreads`), re-time the simulated step many times,
  and the interval is the 10th to 90th percentile, the simulated step its median.  So a step
  whose collectives are exposed gets a wider interval than one hidden behind compute, and a
  feature no fit has seen (FP8, ZeRO++, offloading, QLoRA) a wider one, saying why.
  ``low_error`` and ``high_error`` keep their meaning: the relative speed errors (predicted /
  actual - 1) at the interval's ends.
* the intervals of ``step_time_s``, ``tokens_per_s``, ``tokens_per_s_per_gpu``,
  ``tflops_per_gpu`` and ``mfu``, each ``[low, high]``.

There is no interval (None) where nothing supports one: CPU ranks (the emulated cluster is
judged against its own runs), a measured layer table or a flat ``--efficiency``; a run that
does not fit in memory or makes no progress (it has no speed to be unsure of); and where the
caller asked for none (``simulate(..., interval=False)``: a planning search, which computes
intervals only for the rows it shows).
"""

from __future__ import annotations

from dataclasses import dataclass

from zero_sim.engine.retime import Timeline
from zero_sim.intervals.sampling import (
    Replay,
    Setting,
    StepInterval,
    replay_interval,
    replay_of,
    step_interval,
)
from zero_sim.system.run_overheads import DEFAULT_STACK_GROUP, KNOWN_STACK

LEVEL = 0.8
THROUGHPUTS = ("tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu")
BASIS = "the inputs' spreads propagated through the simulated step (docs/uncertainty.md)"


def interval_group(scenario, modelled_gpu: bool) -> str | None:
    """Whether an interval applies (None where nothing supports one), and the stack's group."""
    if not modelled_gpu or scenario.hardware.efficiency is not None:
        return None
    return KNOWN_STACK if scenario.training.stack_given else DEFAULT_STACK_GROUP


def makes_progress(metrics: dict) -> bool:
    """Whether the run fits in memory and trains: only then has its speed an interval."""
    return bool(metrics["memory"]["fits"]) and metrics["tokens_per_s"] > 0 and metrics["step_time_s"] > 0


def confidence_fields(metrics: dict, scenario, peak_flops: float, modelled_gpu: bool,
                      timeline: Timeline | None = None, setting: Setting | None = None,
                      needed_flops: float | None = None) -> dict:
    """``stack``, ``tokens_per_s_per_gpu``, ``mfu`` and, where one applies and ``timeline`` is given,
    each headline figure's interval and how it was obtained.  ``needed_flops``: a rank's FLOPs per
    step that MFU counts (:meth:`~zero_sim.system.workload.Workload.needed_flops`; default:
    TFLOP/s's)."""
    step = metrics["step_time_s"]
    needed = metrics["tflops_per_gpu"] * 1e12 * step if needed_flops is None else needed_flops
    out = {"stack": scenario.training.stack,
           "tokens_per_s_per_gpu": metrics["tokens_per_s"] / max(metrics["gpus"], 1),
           "mfu": needed / step / peak_flops if modelled_gpu and peak_flops > 0 and step > 0 else None}
    group = interval_group(scenario, modelled_gpu)
    if group is None or timeline is None or setting is None or not makes_progress(metrics):
        out["prediction_interval"] = None
        out["step_time_s_interval"] = None
        out |= {f"{name}_interval": None for name in THROUGHPUTS}
        return out
    step = metrics["step_time_s"]
    band = step_interval(timeline, setting, step)
    out["prediction_interval"] = {
        "level": LEVEL, "group": group, "low_error": band.low_s / step - 1.0,
        "high_error": band.high_s / step - 1.0, "basis": BASIS, "method": "propagated",
        "samples": band.samples, "median_shift": band.median_shift, "inputs": band.inputs,
        "shares": band.shares,
        "unfitted": [{"feature": f.name, "why": f.why} for f in setting.features]}
    out["step_time_s_interval"] = [band.low_s, band.high_s]
    values = metrics | out
    for name in THROUGHPUTS:
        out[f"{name}_interval"] = throughput_interval(values[name], step, band)
    return out


def throughput_interval(value: float, step_s: float, band: StepInterval) -> list[float] | None:
    """A throughput's 80% interval from its step's: the throughput scales as one over the step."""
    return [value * step_s / band.high_s, value * step_s / band.low_s] if value else None


@dataclass(frozen=True)
class LaterInterval:
    """What a row's 80% interval is computed from later (:func:`later_interval`)."""

    replay: Replay
    step_s: float
    tokens_per_s: float


def later_interval(metrics: dict, scenario, modelled_gpu: bool, timeline: Timeline | None,
                   setting: Setting | None) -> LaterInterval | None:
    """The interval of a run, left to compute later where one applies: a search keeps it for every
    row it simulates and computes only the rows it shows (:func:`later_columns`), the same figures
    as simulating them with their interval."""
    if interval_group(scenario, modelled_gpu) is None or timeline is None or not makes_progress(metrics):
        return None
    return LaterInterval(replay_of(timeline, setting), metrics["step_time_s"], metrics["tokens_per_s"])


def later_columns(later: LaterInterval) -> dict[str, float | None]:
    """The 80% interval's columns of a table row (``zero_sim.plan.sweep.summary_row``'s), computed now."""
    band = replay_interval(later.replay, later.step_s)
    low, high = throughput_interval(later.tokens_per_s, later.step_s, band) or (None, None)
    return {"step_ms_low": band.low_s * 1e3, "step_ms_high": band.high_s * 1e3,
            "tokens_per_s_low": low, "tokens_per_s_high": high}


def widest_inputs(band: dict, n: int = 2) -> str:
    """The inputs that widen this step's interval most, with how far each alone moves it."""
    widest = sorted(((h, name) for name, h in band.get("shares", {}).items() if h >= 0.005), reverse=True)[:n]
    return ", ".join(f"{name} ±{h:.0%}" for h, name in widest)


def interval_line(metrics: dict) -> str | None:
    """One line for people: the per-GPU throughput range and what widens it."""
    band = metrics.get("prediction_interval")
    low_high = metrics.get("tokens_per_s_per_gpu_interval")
    if not band or not low_high:
        return None
    low, high = low_high
    told = "its stack named" if band["group"] == KNOWN_STACK else "the default stack"
    why = "; ".join(f"{u['feature']} is judged, never fitted ({u['why']})" for u in band.get("unfitted", []))
    line = (f"{low:,.0f}-{high:,.0f} tokens/s per GPU ({band['level']:.0%} interval): the inputs' spreads "
            f"through this step at {told}, most from {widest_inputs(band)}")
    return line + (f"; wider: {why}" if why else "")
