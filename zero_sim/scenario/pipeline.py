"""One entry point: ``simulate(**settings) -> SimResult``; the CLI's flags are its keywords.

    result = simulate(model="llama3-8b", strategy="fsdp", gpus=64, topology="dgx-h100")
    result.metrics["step_time_s"], result.scenario.cluster.gpu, result.scenario.knobs.wrap

The steps, each a function below: :func:`resolve` checks the keywords against the schema (common
settings in :mod:`zero_sim.scenario.settings`, each strategy's knobs beside it) into frozen
:class:`~zero_sim.scenario.settings.CommonSettings`; :func:`prepare` builds the workload, the
machine (:mod:`zero_sim.scenario.machine`: topology, compute model, host costs, precision), what
is offloaded (:func:`zero_sim.strategies.features.offload_plan`) and the strategy's context,
refusing what cannot be simulated in one sentence; then the strategy's program runs on the
engine, and :mod:`zero_sim.scenario.reporting` turns the run into the result, which carries the
typed :class:`~zero_sim.scenario.types.Scenario` it was simulated with (a knob given to a
strategy that does not take it is refused naming its owners).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from zero_sim.calibration import Calibration, CalibrationError
from zero_sim.configs import ConfigError
from zero_sim.configs.read import read_config
from zero_sim.engine.cpu_device import CpuDevice
from zero_sim.engine.engine import Engine, cyclic_gc_paused
from zero_sim.engine.gpu_device import GpuDevice
from zero_sim.engine.program import Program
from zero_sim.engine.run_types import EngineConfig, Straggler
from zero_sim.engine.shared_cores import SharedCores
from zero_sim.intervals.speed import later_interval
from zero_sim.results import SimResult, allocator_reserve, context_gb
from zero_sim.scenario.inputs import canonical_names, with_stack
from zero_sim.scenario.machine import (
    compute_model,
    fp8_for,
    gpu_spread,
    host_pricing,
    is_modelled_gpu,
    measured_figure,
    step_host_s,
    topology_for,
)
from zero_sim.scenario.precision import precision_of
from zero_sim.scenario.prepared import Prepared
from zero_sim.scenario.reporting import interval_inputs, result_of
from zero_sim.scenario.settings import (
    COMMON,
    COMMON_NAMES,
    MAX_GPUS,
    MAX_OP_INSTANCES,
    SHAPE_SETTINGS,
    CommonSettings,
)
from zero_sim.scenario.symmetry import explicit_ranks, ranks_alike
from zero_sim.scenario.types import Scenario
from zero_sim.settings import ScenarioError, check_settings
from zero_sim.strategies import Context, all_knobs, get_strategy
from zero_sim.strategies.base import Strategy, StrategyError
from zero_sim.strategies.features import offload_plan
from zero_sim.system.collectives import CollectiveModel
from zero_sim.system.gpt_layers import gpt_workload
from zero_sim.system.gpus import GPUS
from zero_sim.system.hardware import default_overlap_slowdown
from zero_sim.system.lora import DEFAULT_TARGETS, with_lora
from zero_sim.system.model_presets import PRESETS, human_params, preset, synthesize_shape
from zero_sim.system.topology import PRESETS as TOPOLOGIES
from zero_sim.system.workload import Workload, WorkloadError
from zero_sim.vocabulary import PARAMS


def _resolve_workload(s: CommonSettings) -> Workload:
    """The workload the settings name: a synthesized size, a custom shape, or a preset."""
    shape_given = {k: getattr(s, k) for k in SHAPE_SETTINGS if getattr(s, k) is not None}
    try:
        if s.params is not None:
            if set(shape_given) - {"vocab"}:
                flags = ", ".join("--" + k.replace("_", "-") for k in shape_given)
                raise ScenarioError(f"--params synthesizes its own shape, so it cannot be combined with "
                                    f"{flags}; give either a size or a shape")
            shape = synthesize_shape(s.params, s.seq_len or 1024, s.vocab or 50257)
            return gpt_workload(shape, s.micro_batch, None, s.recompute,
                                name=f"gpt-{shape.params() / 1e6:.0f}m", attention=s.attention,
                                elementwise=s.elementwise)
        if shape_given:
            if s.model not in PRESETS:
                raise ScenarioError(f"unknown model preset {s.model!r} to take the missing shape values "
                                    f"from; choose one of {', '.join(sorted(PRESETS))}")
            shape = replace(PRESETS[s.model], **{SHAPE_SETTINGS[k]: v for k, v in shape_given.items()})
            workload = gpt_workload(shape, s.micro_batch, s.seq_len, s.recompute, "custom",
                                    s.attention, s.elementwise)
            return replace(workload, name=f"custom-{human_params(workload.params)}")
        return preset(s.model, s.micro_batch, s.seq_len, s.recompute, s.attention, s.elementwise)
    except WorkloadError as exc:
        raise ScenarioError(str(exc)) from None


def _check_names(s: CommonSettings) -> None:
    """What the schema cannot know alone: names looked up in tables, and sizes taken together."""
    if s.topology not in TOPOLOGIES and s.topology != "calibrated":
        raise ScenarioError(f"unknown topology preset {s.topology!r}; "
                            f"choose one of {', '.join(sorted(TOPOLOGIES))}")
    if s.gpus > MAX_GPUS and not s.allow_huge:
        raise ScenarioError(f"--gpus {s.gpus:,} is beyond the size budget of {MAX_GPUS:,} ranks (planning "
                            f"each collective takes time per rank); add --allow-huge to run it anyway")


def check_size(s: CommonSettings, layers: int, ops_per_step: int | None = None, alike: bool = False) -> None:
    """Refuse a simulation beyond :data:`MAX_OP_INSTANCES` unless ``allow_huge``.  Before the program
    is built its ops are unknown and the forward and backward of every layer and micro-step are
    counted (an absurd ``grad_accum`` is refused unbuilt); after, the program's own."""
    if s.allow_huge:
        return
    per_step = ops_per_step if ops_per_step is not None else 2 * layers * s.grad_accum
    instances = per_step * s.steps * (s.gpus if explicit_ranks(s, alike) else 1)
    if instances > MAX_OP_INSTANCES:
        raise ScenarioError(f"this simulation has about {instances:,} op instances (ops per step x --steps x "
                            f"ranks simulated), beyond the budget of {MAX_OP_INSTANCES:,}; lower --steps, "
                            f"--grad-accum or --gpus, drop --explicit-ranks, or add --allow-huge")


def _load_calibration(value):
    if value is None or isinstance(value, Calibration):
        return value
    try:
        return Calibration.load(value)
    except CalibrationError as exc:
        raise ScenarioError(str(exc)) from None


@dataclass(frozen=True)
class Resolved:
    """Keywords checked against the schema: the common settings, the strategy and its knobs."""

    settings: CommonSettings
    knobs: Any  # the strategy's typed knobs (Strategy.Knobs)
    strategy: Strategy
    stack_notes: tuple[str, ...] = ()  # the stack assumed, and each setting given that overrides it
    stack_given: bool = False  # named by the caller or a config file, not the default


def resolve(**kwargs) -> Resolved:
    """Fill the stack's settings and the defaults, split common settings from strategy knobs,
    and check both against the schema (:mod:`zero_sim.settings`); None means "not given"."""
    kwargs = canonical_names(kwargs)
    stack_given = kwargs.get("stack") is not None
    kwargs, stack_notes = with_stack(kwargs)
    common = check_settings(COMMON, {k: v for k, v in kwargs.items() if k in COMMON_NAMES})
    values = {s.name: s.default for s in COMMON} | {k: v for k, v in common.items() if v is not None}
    try:
        strategy = get_strategy(values["strategy"])
    except StrategyError as exc:
        raise ScenarioError(str(exc)) from None
    owners = all_knobs()
    own = {k.name for k in strategy.knobs}
    for key, value in kwargs.items():
        if key in COMMON_NAMES or key in own or value is None:
            continue
        if key in owners:
            belongs = ", ".join(sorted({name for name, _ in owners[key]}))
            raise ScenarioError(f"--{key.replace('_', '-')} applies to {belongs}, not to {strategy.name}; "
                                f"drop it or use --strategy {belongs.split(', ')[0]}")
        raise ScenarioError(f"unknown setting {key!r}; see `zero-sim simulate --help`")
    given = check_settings(strategy.knobs, {k: v for k, v in kwargs.items() if k in own}, strategy.name)
    knobs = strategy.knob_values({k: v for k, v in given.items() if v is not None})
    settings = CommonSettings(**values)
    _check_names(settings)
    return Resolved(settings, knobs, strategy, stack_notes, stack_given)


def _resolve_with_config(kwargs: dict, reading) -> Resolved:
    """:func:`resolve`, with a config file's own rules (DeepSpeed's batch arithmetic, ...) run on
    the result."""
    r = resolve(**kwargs)
    if reading is None or not reading.finish:
        return r
    values = {f.name: getattr(r.settings, f.name) for f in fields(r.settings)}
    for finish in reading.finish:
        finish(values)
    return replace(r, settings=CommonSettings(**values))


def prepare(workload: Workload | None = None, **kwargs) -> Prepared:
    """Every check ``simulate()`` makes before it builds the program, in its order; the first
    failure is a :class:`ScenarioError` of one sentence.  Panels ask it which values to offer.

    A refusal that names a setting a configuration file set says which key of which file set it
    (:meth:`~zero_sim.configs.ConfigReading.blame`), wherever the check that refused it runs."""
    reading, kwargs = read_config(kwargs)
    try:
        return _prepare(reading, workload, kwargs)
    except ConfigError:
        raise  # a file's own refusal names the file already
    except ScenarioError as exc:
        if reading is not None:
            exc.args = (reading.blame(str(exc)),)
        raise


def _prepare(reading, workload: Workload | None, kwargs: dict) -> Prepared:
    # A Calibration object is taken as it is; a path is a setting like any other.
    calibration = kwargs.pop("calibration") if isinstance(kwargs.get("calibration"), Calibration) else None
    r = _resolve_with_config(kwargs, reading)
    s, knobs, strategy = r.settings, r.knobs, r.strategy
    calibration = _load_calibration(calibration or s.calibration)
    if workload is None:
        workload = _resolve_workload(s)
    if (s.lora_targets is not None or s.lora_base is not None) and s.lora_rank is None:
        raise ScenarioError("--lora-targets and --lora-base describe LoRA adapters, but no --lora-rank says "
                            "their size; give --lora-rank (16 is common) or leave them out")
    if s.lora_base == "nf4" and strategy.can.shards(PARAMS):
        raise ScenarioError(f"a 4-bit QLoRA base sharded by {strategy.name} (FSDP-QLoRA) is not modelled; "
                            "use --strategy ddp, zero1 or zero2, or --lora-base bf16")
    if s.lora_rank is not None:
        try:
            workload = with_lora(workload, s.lora_rank, s.lora_targets or DEFAULT_TARGETS,
                                 s.lora_base or "bf16")
        except WorkloadError as exc:
            raise ScenarioError(str(exc)) from None
    elif workload.micro_batch != s.micro_batch:
        raise ScenarioError(f"the workload was built for micro-batch {workload.micro_batch} "
                            f"but --micro-batch is {s.micro_batch}; pass the same value to both")
    topo = topology_for(s, calibration)
    gpu = GPUS[s.gpu or topo.spec.gpu]
    s = replace(s, gpu_spread=gpu_spread(s, gpu, calibration))
    compute = compute_model(s, gpu, calibration)
    compute.fp8 = fp8_for(s, gpu, workload, calibration, strategy)
    modelled_gpu = is_modelled_gpu(gpu, calibration)
    offload, topo = offload_plan(s, strategy, knobs, topo, gpu.name, precision_of(s, strategy))
    ctx = Context(workload, s.gpus, topo.ranks_per_node, compute, precision_of(s, strategy), s.grad_accum,
                  s.host_overhead_us * 1e-6, knobs,
                  host=host_pricing(workload, s, calibration, modelled_gpu),
                  step_host_s=step_host_s(s, calibration, modelled_gpu),
                  optimizer_host_s_per_param=measured_figure(calibration, "optimizer_host_seconds_per_param"),
                  offload=offload)
    try:
        strategy.validate(ctx)
    except StrategyError as exc:
        raise ScenarioError(str(exc)) from None
    check_size(s, len(workload.layers))
    return Prepared(reading, s, knobs, strategy, calibration, workload, topo, gpu, compute, ctx,
                    r.stack_notes, r.stack_given)


@dataclass(frozen=True)
class RankFigures:
    """How a rank's compute and communication share it: the overlap slowdown, and where a CPU
    calibration measured this many ranks, its per-collective CPU cost and the paces of
    communication while compute runs."""

    overlap_slowdown: float
    collective_cpu_s: float = 0.0
    comm_rate_while_computing: float = 1.0
    comm_bytes_rate_while_computing: float = 1.0

    @property
    def shared_cores(self) -> tuple[float, float, float] | None:
        """The calibration's shared-core figures (zero_sim.engine.shared_cores), None if it measured none."""
        shared = (self.collective_cpu_s, self.comm_rate_while_computing, self.comm_bytes_rate_while_computing)
        return None if shared == (0.0, 1.0, 1.0) else shared


def rank_figures(p: Prepared) -> RankFigures:
    """The calibration's CPU figures when it measured this many ranks; an explicit
    ``--overlap-slowdown`` still wins, then a trace's measured GPU slowdown, else the GPU's default."""
    s, calibration = p.settings, p.calibration
    cpu = calibration.cpu if calibration is not None else None
    if cpu is not None and cpu.ranks == s.gpus:
        slowdown = s.overlap_slowdown if s.overlap_slowdown is not None else cpu.overlap_slowdown
        return RankFigures(slowdown, cpu.collective_cpu_s, cpu.comm_rate_while_computing, cpu.bytes_pace)
    slowdown = s.overlap_slowdown
    if slowdown is None and calibration is not None and p.gpu.name != "CPU":
        slowdown = calibration.overlap_slowdown  # measured beside NCCL kernels in a trace
    return RankFigures(slowdown if slowdown is not None else default_overlap_slowdown(p.gpu.name))


def _program(p: Prepared) -> Program:
    try:
        program = p.strategy.build(p.ctx)
    except StrategyError as exc:
        raise ScenarioError(str(exc)) from None
    check_size(p.settings, len(p.workload.layers), len(program.ops), ranks_alike_in(p))
    return program


def ranks_alike_in(p: Prepared) -> bool:
    """Whether rank 0 alone gives every rank's figures (zero_sim.scenario.symmetry)."""
    return ranks_alike(p.settings, p.topology, p.gpu.name, rank_figures(p).shared_cores is not None)


def _engine(p: Prepared, program: Program, figures: RankFigures) -> Engine:
    s = p.settings
    straggler = None
    if s.straggler_prob > 0 and s.straggler_ms > 0:
        straggler = Straggler(s.straggler_prob, s.straggler_ms * 1e-3, s.seed)
    device = (CpuDevice if p.gpu.name == "CPU" else GpuDevice)(figures.overlap_slowdown)
    if figures.shared_cores is not None:
        # The calibration's CPU figures apply to whatever device the scenario names.
        device = SharedCores(device, *figures.shared_cores)
    alike = ranks_alike(s, p.topology, p.gpu.name, figures.shared_cores is not None)
    config = EngineConfig(steps=s.steps, host_overhead_s=s.host_overhead_us * 1e-6,
                          explicit_ranks=explicit_ranks(s, alike), straggler=straggler, device=device)
    collectives = CollectiveModel(p.topology, s.backend, s.algorithm, p.calibration)
    return Engine(program, p.topology, collectives, config)


def _scenario(p: Prepared, figures: RankFigures) -> Scenario:
    """The settings as simulated: what was left to the simulator filled in with what it chose."""
    s, workload, topo, calibration, reading = p.settings, p.workload, p.topology, p.calibration, p.reading
    given = {f.name: getattr(s, f.name) for f in fields(s)}
    return Scenario.from_values(given | {
        "cuda_context_gb": context_gb(p.gpu.name, s.cuda_context_gb),
        "allocator_reserve": allocator_reserve(workload.recompute, s.allocator_reserve),
        "attention": workload.attention,
        "calibration": calibration.describe() if calibration is not None else None,
        "config_file": reading.source if reading is not None else None,
        "overlap_slowdown": figures.overlap_slowdown, "collective_cpu_us": figures.collective_cpu_s * 1e6,
        "slowest_rank_factor": p.compute.slowest_rank_factor, "run_overhead": p.compute.run_overhead,
        "comm_rate_while_computing": figures.comm_rate_while_computing,
        "comm_bytes_rate_while_computing": figures.comm_bytes_rate_while_computing,
        "stack_given": p.stack_given, "strategy": p.strategy.name, "model": workload.name,
        "params": workload.params,
        "topology": topo.name, "gpu": p.gpu.name, "gpus_per_node": topo.ranks_per_node,
        "topology_description": topo.describe(), "workload_description": workload.describe(),
    }, p.knobs)


def simulate(workload: Workload | None = None, *, interval: bool | str = True, **kwargs) -> SimResult:
    """Simulate one training configuration; keywords are the CLI flags with underscores.

    ``workload`` (Python only) replaces the model preset with a workload built elsewhere, e.g.
    :func:`sim2real.module_workload.workload_from_module` on a real model.  ``calibration`` is a file
    path or a :class:`zero_sim.calibration.Calibration`.  ``interval=False`` leaves the 80% intervals
    out (None); ``interval="later"`` too, keeping in ``result.later_interval`` what computes it later
    (zero_sim.intervals.speed.later_columns): a search computes only the rows it shows."""
    p = prepare(workload, **kwargs)
    program, figures = _program(p), rank_figures(p)
    with cyclic_gc_paused():  # the run allocates much and frees little: no cyclic collections meanwhile
        engine = _engine(p, program, figures)
        run = engine.run()
        inputs = interval_inputs(p, program, run, engine) if interval else None
        result = result_of(p, program, run, _scenario(p, figures), inputs if interval is True else None)
        if interval == "later":
            modelled = is_modelled_gpu(p.gpu, p.calibration)
            result.later_interval = later_interval(result.metrics, result.scenario, modelled, *inputs)
        return result
