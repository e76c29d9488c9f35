"""How sure a prediction is, and how it compares with the GPU's peak: the figures beside the headline.

* ``mfu``: model FLOPs utilisation, the FLOPs the model needs per step (forward and backward,
  recompute not counted, a causal mask's masked half of attention not counted) over the step
  time and the GPU's dense bf16 peak (``zero_sim.system.gpus``).  It stays below the highest of
  ``kernel_ceilings``, what the compute model lets each kernel family reach (docs/compute.md).
* ``prediction_interval``: the range published runs like this one came in, from how far the
  simulator was from the published table's runs when each was predicted without its own source
  (:mod:`zero_sim.system.run_overheads`, refitted by ``zero-sim validate --published --refit``).
  Two groups: runs predicted knowing their stack, and runs left at the default stack (wider:
  the software a run used is the largest unknown).  An 80% interval: with a prediction of
  5,700 tokens/s and errors between -9% and +26%, such runs came in at 4,520-6,280.
* the intervals of ``step_time_s``, ``tokens_per_s``, ``tokens_per_s_per_gpu``,
  ``tflops_per_gpu`` and ``mfu``, each ``[low, high]``.

An offloaded update on the CPU is outside every published run: its time is one published rate
(:mod:`zero_sim.system.host_side`), taken as right within a factor of :data:`CPU_RATE_SPREAD` either
way on other CPUs (assumed), and added to the GPU part's interval.

There is no interval where the published runs say nothing: CPU ranks (the emulated cluster is
judged against its own runs), a measured layer table, or a flat ``--efficiency``.
"""

from __future__ import annotations

from zero_sim.system.run_overheads import (
    DEFAULT_STACK_GROUP,
    KNOWN_STACK,
    prediction_interval,
    throughput_interval,
    time_interval,
)

LEVEL = 0.8
CPU_RATE_SPREAD = 2.0  # the CPU optimizer's rate on another CPU: within 2x of the published one (assumed)
THROUGHPUTS = ("tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu")


def interval_group(scenario, modelled_gpu: bool) -> str | None:
    """Which published residuals apply: None where none do (see the module docstring)."""
    if not modelled_gpu or scenario.hardware.efficiency is not None:
        return None
    return KNOWN_STACK if scenario.training.stack_given else DEFAULT_STACK_GROUP


def confidence_fields(metrics: dict, scenario, peak_flops: float, modelled_gpu: bool,
                      needed_flops: float | None = None) -> dict:
    """``stack``, ``tokens_per_s_per_gpu``, ``mfu`` and, where published runs apply, each headline
    figure's interval and how it was obtained.  ``needed_flops``: a rank's FLOPs per step that MFU
    counts (:meth:`~zero_sim.system.workload.Workload.needed_flops`; default: TFLOP/s's)."""
    step = metrics["step_time_s"]
    needed = metrics["tflops_per_gpu"] * 1e12 * step if needed_flops is None else needed_flops
    out = {"stack": scenario.training.stack,
           "tokens_per_s_per_gpu": metrics["tokens_per_s"] / max(metrics["gpus"], 1),
           "mfu": needed / step / peak_flops if modelled_gpu and peak_flops > 0 and step > 0 else None}
    group = interval_group(scenario, modelled_gpu)
    band = prediction_interval(group) if group else None
    out["prediction_interval"] = None if band is None else {
        "level": LEVEL, "group": group, "low_error": band[0], "high_error": band[1],
        "basis": "published runs predicted without their own source (docs/validation.md)"}
    values = metrics | out
    step, cpu = metrics["step_time_s"], metrics.get("cpu_update_s", 0.0)
    if band and cpu > 0:  # the GPU part's interval, plus the CPU update's assumed spread
        gpu_low, gpu_high = time_interval(step - cpu, group)
        low, high = gpu_low + cpu / CPU_RATE_SPREAD, gpu_high + cpu * CPU_RATE_SPREAD
        out["step_time_s_interval"] = [low, high]
        out["prediction_interval"]["cpu_update"] = f"CPU update within {CPU_RATE_SPREAD:g}x (assumed)"
        for name in THROUGHPUTS:
            value = values[name]
            out[f"{name}_interval"] = [value * step / high, value * step / low] if value else None
        return out
    for name in THROUGHPUTS:
        value = values[name]
        out[f"{name}_interval"] = list(throughput_interval(value, group)) if band and value else None
    out["step_time_s_interval"] = list(time_interval(step, group)) if band else None
    return out


def interval_line(metrics: dict) -> str | None:
    """One line for people: the per-GPU throughput range and what it rests on."""
    band = metrics.get("prediction_interval")
    low_high = metrics.get("tokens_per_s_per_gpu_interval")
    if not band or not low_high:
        return None
    low, high = low_high
    # published = predicted / (1 + error): the extremes as shares of the prediction.
    slower, faster = 1.0 - 1.0 / (1.0 + band["high_error"]), 1.0 / (1.0 + band["low_error"]) - 1.0
    told = "with their stack named" if band["group"] == KNOWN_STACK else "at the default stack"
    cpu = f"; the offloaded CPU update taken as within {CPU_RATE_SPREAD:g}x" if band.get("cpu_update") else ""
    return (f"{low:,.0f}-{high:,.0f} tokens/s per GPU ({band['level']:.0%} interval): published runs "
            f"predicted {told} came in from {slower:.0%} slower to {faster:.0%} faster than the model{cpu}")
