"""From a simulated run to what a user reads: the metrics and what each one assumed.

:func:`result_of` turns an engine's :class:`~zero_sim.engine.run_types.RunOutput` into a
:class:`~zero_sim.results.SimResult`: the step's figures (:func:`zero_sim.results.compute_metrics`),
the memory verdict and its interval, the speed interval propagated from the recorded step
(:func:`interval_inputs` gives what the sampling re-times), and one line for each thing assumed
(the stack, the precision, FP8, ZeRO++, LoRA, offloading, a calibration or configuration file).
"""

from __future__ import annotations

from zero_sim.engine.engine import Engine
from zero_sim.engine.program import Program
from zero_sim.engine.retime import Timeline, timeline_of
from zero_sim.engine.run_types import RunOutput
from zero_sim.intervals.memory import with_interval
from zero_sim.intervals.sampling import Setting
from zero_sim.intervals.speed import confidence_fields
from zero_sim.results import SimResult, compute_metrics
from zero_sim.scenario.machine import is_modelled_gpu
from zero_sim.scenario.precision import precision_note
from zero_sim.scenario.prepared import Prepared
from zero_sim.scenario.types import Scenario
from zero_sim.system.input_spreads import unfitted_features
from zero_sim.system.lora import DEFAULT_TARGETS
from zero_sim.system.zeropp import ZeroPP


def interval_inputs(p: Prepared, program: Program, run: RunOutput,
                    engine: Engine) -> tuple[Timeline, Setting]:
    """The recorded step to re-time and what the inputs' spreads depend on (zero_sim.intervals.sampling)."""
    s = p.settings
    timeline = timeline_of(program, run.op_seconds, s.steps, s.host_overhead_us * 1e-6,
                           engine.backend.always_after_compute)
    return timeline, Setting(p.gpu.name, p.stack_given, s.gpus, p.topology.ranks_per_node,
                             unfitted_features(s, p.knobs))


def result_of(p: Prepared, program: Program, run: RunOutput, scenario: Scenario,
              interval: tuple[Timeline, Setting] | None = None) -> SimResult:
    """The run's metrics, each with what it assumed, and the step's ops, memory and events."""
    s, reading = p.settings, p.reading
    tokens = s.gpus * p.workload.tokens_per_micro_batch * s.grad_accum
    metrics = compute_metrics(run, program, scenario, s.gpus, tokens, p.gpu.hbm_bytes,
                              context_bytes=int(round(scenario.hardware.cuda_context_gb * 1e9)),
                              allocator_reserve=scenario.hardware.allocator_reserve)
    # Offloaded states: where they live, what updates them, and whether the nodes' RAM holds them.
    if p.ctx.offload is not None:
        p.ctx.offload.results(metrics, program, p.topology, run)
    # How sure "it fits" is: reserved memory's 80% interval and the verdict (zero_sim.intervals.memory).
    metrics["memory"] = with_interval(metrics["memory"])
    modelled = is_modelled_gpu(p.gpu, p.calibration)
    metrics |= confidence_fields(metrics, scenario, p.gpu.peak_flops, modelled, *(interval or (None, None)),
                                 needed_flops=p.workload.needed_flops() * s.grad_accum)
    # The most each kernel family reaches, which MFU stays below (zero_sim.system.hardware).
    metrics["kernel_ceilings"] = (p.compute.kernel_ceilings(p.workload.attention or "flash")
                                  if modelled else None)
    # What a configuration file set, ignored (and why) or had overridden, beside the figures it produced.
    metrics["config_notes"] = reading.notes if reading is not None else []
    # The stack assumed in one line, then each setting given that overrides it.
    metrics["stack_notes"] = list(p.stack_notes)
    # With frozen weights (LoRA), what trains: gradients, optimizer state and reductions are for these.
    metrics["trainable_params"] = p.workload.trainable_params
    if s.lora_rank is not None:
        base = ", base in 4-bit NF4 (QLoRA)" if s.lora_base == "nf4" else ""
        metrics["lora"] = f"r={s.lora_rank} on {s.lora_targets or DEFAULT_TARGETS}{base}"
    # Under --precision fp8, what ran in float8 and the sources of its rates (zero_sim.system.fp8).
    metrics["fp8"] = p.compute.fp8.record() if p.compute.fp8 is not None else None
    # The dtypes a precision mode or --reduce-dtype / --grad-accum-dtype set, in one line; None by default.
    metrics["precision"] = precision_note(s, p.ctx.precision)
    # ZeRO++'s parts assumed (zero3 only), in one line; None when off.
    metrics["zeropp"] = ZeroPP.from_knobs(p.knobs).describe(
        p.topology.nodes, p.workload.params, p.ctx.precision.param_bytes) or None
    # A calibration replaces presets: say which figures came from it (as the scenario already states).
    metrics["calibration"] = scenario.inputs.calibration
    ends = run.step_ends[run.simulated_ranks[0]]
    window = (ends[-2] if len(ends) > 1 else 0.0, ends[-1])
    notes = list(p.stack_notes) + list(program.notes) + (reading.notes if reading is not None else [])
    return SimResult(metrics, run.records, run.memory, scenario, window, s.gpus, run.simulated_ranks, notes,
                     run.events)
