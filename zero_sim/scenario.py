"""One entry point: ``simulate(**settings) -> SimResult``; the CLI's flags are its keywords.

This module turns user-facing settings into the pieces the engine needs (workload,
topology, compute and collective models, the strategy's program), checks every setting
with a one-sentence error, runs the engine and gathers the metrics.

Settings common to every strategy are :data:`COMMON`; each strategy adds its own knobs
(``zero_sim.strategies``).  A knob given to a strategy that does not take it is refused
with a sentence naming the strategies it belongs to.
"""

from __future__ import annotations

from dataclasses import replace

from zero_sim.calibration import Calibration, CalibrationError
from zero_sim.engine.engine import Engine, EngineConfig, Straggler
from zero_sim.results import DEFAULT_ALLOCATOR_RESERVE, SimResult, compute_metrics, context_gb
from zero_sim.strategies import PRECISIONS, Context, all_knobs, get_strategy
from zero_sim.strategies.base import Knob, StrategyError
from zero_sim.system.collectives import ALGORITHMS, BACKENDS, CollectiveModel
from zero_sim.system.hardware import GPUS, ComputeModel
from zero_sim.system.model_presets import PRESETS, human_params, parse_count, preset, synthesize_shape
from zero_sim.system.topology import PRESETS as TOPOLOGIES
from zero_sim.system.topology import build_topology
from zero_sim.system.workload import (
    ATTENTION_IMPLS,
    DEFAULT_ATTENTION,
    RECOMPUTE_MODES,
    Workload,
    WorkloadError,
    gpt_workload,
)


class ScenarioError(ValueError):
    """Settings that cannot be simulated; the message is one sentence saying how to fix them."""


# A common setting has the same shape as a strategy's knob: a flag, a keyword, a default.
Setting = Knob


COMMON: tuple[Setting, ...] = (
    Setting("model", "gpt2-124m", "model preset (see `zero-sim presets`); with shape flags, the preset "
            "their missing values come from", str),
    Setting("params", None, "synthesize a GPT of about this many parameters instead of a preset "
            "(7.5e9, 7.5B, 350M, 1.3b)", str),
    Setting("layers", None, "custom shape: transformer blocks (default: the preset's)", int),
    Setting("hidden", None, "custom shape: hidden size d_model (default: the preset's)", int),
    Setting("heads", None, "custom shape: attention (query) heads (default: the preset's)", int),
    Setting("kv_heads", None, "custom shape: key/value heads, fewer than heads for grouped-query "
            "attention (default: the preset's)", int),
    Setting("ffn_hidden", None, "custom shape: MLP width (default: the preset's)", int),
    Setting("vocab", None, "custom shape: vocabulary size (default: the preset's)", int),
    Setting("seq_len", None, "sequence length (default: the preset's)", int),
    Setting("micro_batch", 8, "sequences per rank per micro-step", int),
    Setting("grad_accum", 1, "micro-steps per optimizer step (no gradient sync until the last)", int),
    Setting("strategy", "ddp", "ddp, zero1, zero2, zero3 or fsdp", str),
    Setting("gpus", 8, "number of ranks N", int),
    Setting("gpus_per_node", None, "ranks per node (default: the topology's node size)", int),
    Setting("topology", "dgx-a100", "topology preset (see `zero-sim presets`), or 'calibrated' for the "
            "calibration file's imported topology", str),
    Setting("gpu", None, "GPU model (default: the topology's)", str, tuple(GPUS)),
    Setting("bandwidth_gbps", None, "override the bottleneck link's bandwidth, in Gbit/s", float),
    Setting("backend", "nccl", "collective library", str, tuple(BACKENDS)),
    Setting("algorithm", "auto", "collective algorithm", str, ALGORITHMS),
    Setting("precision", "mixed", "mixed (bf16 + fp32 Adam, K=12) or fp32 (K=8)", str, tuple(PRECISIONS)),
    Setting("optimizer_k", None, "bytes of optimizer state per parameter (overrides the precision's K)", int),
    Setting("recompute", "none", "activation checkpointing: none, selective (Korthikanti et al.: attention's "
            "core recomputed), full (only each block's input kept) or op (torchtitan's op-level policy: "
            "every other matmul output and the attention output kept)", str, RECOMPUTE_MODES),
    Setting("attention", DEFAULT_ATTENTION, "attention kernel: flash (FlashAttention / SDPA: no s x s "
            "scores kept) or eager (softmax over materialized scores)", str, ATTENTION_IMPLS),
    Setting("efficiency", None, "a flat fraction of peak FLOP/s for all compute (default: the GPU's per-op "
            "model)", float),
    Setting("cuda_context_gb", None, "GB per GPU outside the tensors: CUDA context, cuBLAS and NCCL buffers "
            "(default: by GPU, 1.1 on A100, 1.5 on H100/H200, 0 for CPU ranks)", float),
    Setting("allocator_reserve", DEFAULT_ALLOCATOR_RESERVE, "fraction of the tensors' peak the caching "
            "allocator holds reserved but unused (fragmentation)", float),
    Setting("host_overhead_us", 10.0, "host time to issue one op, microseconds", float),
    Setting("overlap_slowdown", 0.0, "compute slows by this fraction while a collective runs", float),
    Setting("straggler_prob", 0.0, "chance that a rank stalls before a collective", float),
    Setting("straggler_ms", 0.0, "length of such a stall, milliseconds", float),
    Setting("seed", 0, "seed for straggler draws", int),
    Setting("steps", 2, "steps to simulate (the last is reported)", int),
    Setting("explicit_ranks", None, "simulate every rank (default: when N <= 8)", bool),
    Setting("calibration", None,
            "calibration file (`zero-sim calibrate`): measured collective fits and layer times", str),
)
# Custom-shape settings and the GPTShape fields they set.
SHAPE_SETTINGS = {"layers": "n_layer", "hidden": "d_model", "heads": "n_head", "kv_heads": "kv_heads",
                  "ffn_hidden": "ffn_hidden", "vocab": "vocab"}
COMMON_NAMES = {s.name for s in COMMON}


def _resolve_workload(s: dict):
    """The workload the settings name: a synthesized size, a custom shape, or a preset."""
    shape_given = {k: s[k] for k in SHAPE_SETTINGS if s[k] is not None}
    try:
        if s["params"] is not None:
            if set(shape_given) - {"vocab"}:
                flags = ", ".join("--" + k.replace("_", "-") for k in shape_given)
                raise ScenarioError(f"--params synthesizes its own shape, so it cannot be combined with "
                                    f"{flags}; give either a size or a shape")
            shape = synthesize_shape(s["params"], s["seq_len"] or 1024, s["vocab"] or 50257)
            return gpt_workload(shape, s["micro_batch"], None, s["recompute"],
                                name=f"gpt-{shape.params() / 1e6:.0f}m", attention=s["attention"])
        if shape_given:
            if s["model"] not in PRESETS:
                raise ScenarioError(f"unknown model preset {s['model']!r} to take the missing shape values "
                                    f"from; choose one of {', '.join(sorted(PRESETS))}")
            shape = replace(PRESETS[s["model"]], **{SHAPE_SETTINGS[k]: v for k, v in shape_given.items()})
            workload = gpt_workload(shape, s["micro_batch"], s["seq_len"], s["recompute"], "custom",
                                    s["attention"])
            return replace(workload, name=f"custom-{human_params(workload.params)}")
        return preset(s["model"], s["micro_batch"], s["seq_len"], s["recompute"], s["attention"])
    except WorkloadError as exc:
        raise ScenarioError(str(exc)) from None


def _check(s: dict) -> None:
    for name in ("micro_batch", "grad_accum", "gpus", "steps"):
        v = s[name]
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ScenarioError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
    for name in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len"):
        v = s[name]
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
            raise ScenarioError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
    if s["params"] is not None:
        try:
            s["params"] = parse_count(s["params"])
        except WorkloadError as exc:
            raise ScenarioError(str(exc)) from None
    for name in ("efficiency", "cuda_context_gb", "allocator_reserve"):
        if s[name] is not None and (isinstance(s[name], bool) or not isinstance(s[name], int | float)):
            raise ScenarioError(f"--{name.replace('_', '-')} must be a number, got {s[name]!r}")
    if s["efficiency"] is not None and not 0 < s["efficiency"] <= 1:
        raise ScenarioError(f"--efficiency must be in (0, 1], got {s['efficiency']}")
    if s["cuda_context_gb"] is not None and not 0 <= s["cuda_context_gb"] < 1e4:
        raise ScenarioError(f"--cuda-context-gb must be a non-negative number of GB, "
                            f"got {s['cuda_context_gb']}")
    if not 0 <= s["allocator_reserve"] <= 1:
        raise ScenarioError(f"--allocator-reserve must be between 0 and 1 (a fraction of the peak), "
                            f"got {s['allocator_reserve']}")
    for name in ("host_overhead_us", "overlap_slowdown", "straggler_ms"):
        if s[name] < 0:
            raise ScenarioError(f"--{name.replace('_', '-')} must not be negative, got {s[name]}")
    if not 0 <= s["straggler_prob"] <= 1:
        raise ScenarioError(f"--straggler-prob must be between 0 and 1, got {s['straggler_prob']}")
    if s["bandwidth_gbps"] is not None and s["bandwidth_gbps"] <= 0:
        raise ScenarioError(f"--bandwidth-gbps must be positive, got {s['bandwidth_gbps']}")
    if s["optimizer_k"] is not None and s["optimizer_k"] < 0:
        raise ScenarioError(f"--optimizer-k must not be negative, got {s['optimizer_k']}")
    for setting in COMMON:
        if setting.choices and s[setting.name] is not None and s[setting.name] not in setting.choices:
            raise ScenarioError(f"{setting.flag} {s[setting.name]!r} is not one of "
                                f"{', '.join(setting.choices)}")
    if s["topology"] not in TOPOLOGIES and s["topology"] != "calibrated":
        raise ScenarioError(f"unknown topology preset {s['topology']!r}; "
                            f"choose one of {', '.join(sorted(TOPOLOGIES))}")


def _load_calibration(value):
    if value is None or isinstance(value, Calibration):
        return value
    try:
        return Calibration.load(value)
    except CalibrationError as exc:
        raise ScenarioError(str(exc)) from None


def resolve(**kwargs) -> dict:
    """Fill defaults, split common settings from strategy knobs, and check both."""
    strategy_name = kwargs.get("strategy") or "ddp"
    try:
        strategy = get_strategy(strategy_name)
    except StrategyError as exc:
        raise ScenarioError(str(exc)) from None
    owners = all_knobs()
    own = {k.name: k for k in strategy.knobs}
    settings = {s.name: s.default for s in COMMON}
    knobs = {k.name: k.default for k in strategy.knobs}
    for key, value in kwargs.items():
        if key in COMMON_NAMES:
            if value is not None:
                settings[key] = value
        elif key in own:
            if value is not None:
                knobs[key] = value
        elif key in owners:
            if value is None:
                continue
            belongs = ", ".join(sorted({name for name, _ in owners[key]}))
            raise ScenarioError(f"--{key.replace('_', '-')} applies to {belongs}, not to {strategy.name}; "
                                f"drop it or use --strategy {belongs.split(', ')[0]}")
        else:
            raise ScenarioError(f"unknown setting {key!r}; see `zero-sim simulate --help`")
    _check(settings)
    return {"settings": settings, "knobs": knobs, "strategy": strategy}


def simulate(workload: Workload | None = None, **kwargs) -> SimResult:
    """Simulate one training configuration; keywords are the CLI flags with underscores.

    ``workload`` (Python only) replaces the model preset with a workload built elsewhere,
    e.g. :func:`sim2real.module_workload.workload_from_module` on a real model.  ``calibration``
    is a file path or a :class:`zero_sim.calibration.Calibration`."""
    calibration = kwargs.pop("calibration", None)
    r = resolve(**kwargs)
    s, knobs, strategy = r["settings"], r["knobs"], r["strategy"]
    calibration = _load_calibration(calibration)
    if workload is None:
        workload = _resolve_workload(s)
    elif workload.micro_batch != s["micro_batch"]:
        raise ScenarioError(f"the workload was built for micro-batch {workload.micro_batch} "
                            f"but --micro-batch is {s['micro_batch']}; pass the same value to both")
    spec = s["topology"]
    if spec == "calibrated":
        if calibration is None or calibration.topology is None:
            raise ScenarioError("--topology calibrated needs --calibration with an imported topology; "
                                "make one with "
                                "`zero-sim calibrate --nccl-tests FILE --nvidia-smi-topo FILE --out FILE`")
        spec = calibration.topology
    try:
        topo = build_topology(spec, s["gpus"], s["gpus_per_node"])
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    if s["bandwidth_gbps"] is not None:
        topo = topo.with_bandwidth(s["bandwidth_gbps"])
    gpu = GPUS[s["gpu"] or topo.spec.gpu]
    # efficiency None is the GPU's per-op model; a float, the flat roofline at that fraction of peak.
    compute = ComputeModel(gpu, efficiency=s["efficiency"])
    coll_backend, coll_algorithm = s["backend"], s["algorithm"]
    if calibration is not None:
        if calibration.backend and calibration.backend != coll_backend:
            raise ScenarioError(f"the calibration was measured with {calibration.backend} but --backend is "
                                f"{coll_backend}; use --backend {calibration.backend} or another calibration")
        if calibration.compute is not None:
            c = calibration.compute
            compute = ComputeModel(gpu, efficiency=s["efficiency"], layer_seconds=c.layer_seconds,
                                   calibrated_tokens=c.tokens,
                                   optimizer_seconds_per_param=c.optimizer_seconds_per_param,
                                   slowest_rank_factor=c.slowest_rank_factor)
    precision = PRECISIONS[s["precision"]]
    if s["optimizer_k"] is not None:
        precision = replace(precision, optimizer_bytes=int(s["optimizer_k"]))
    ctx = Context(workload, s["gpus"], topo.ranks_per_node, compute, precision, s["grad_accum"],
                  s["host_overhead_us"] * 1e-6, knobs)
    try:
        strategy.validate(ctx)
        program = strategy.build(ctx)
    except StrategyError as exc:
        raise ScenarioError(str(exc)) from None
    straggler = None
    if s["straggler_prob"] > 0 and s["straggler_ms"] > 0:
        straggler = Straggler(s["straggler_prob"], s["straggler_ms"] * 1e-3, s["seed"])
    explicit = s["explicit_ranks"] if s["explicit_ranks"] is not None else s["gpus"] <= 8
    overlap_slowdown, collective_cpu_s, comm_rate = s["overlap_slowdown"], 0.0, 1.0
    cpu = calibration.cpu if calibration is not None else None
    if cpu is not None and cpu.ranks == s["gpus"]:
        # Measured for this many ranks on this machine; an explicit --overlap-slowdown still wins.
        collective_cpu_s, comm_rate = cpu.collective_cpu_s, cpu.comm_rate_while_computing
        if kwargs.get("overlap_slowdown") is None:
            overlap_slowdown = cpu.overlap_slowdown
    config = EngineConfig(steps=s["steps"], host_overhead_s=s["host_overhead_us"] * 1e-6,
                          overlap_slowdown=overlap_slowdown, collective_cpu_s=collective_cpu_s,
                          comm_rate_while_computing=comm_rate,
                          explicit_ranks=explicit, straggler=straggler, host_runs_compute=gpu.name == "CPU")
    engine = Engine(program, topo, CollectiveModel(topo, coll_backend, coll_algorithm, calibration), config)
    run = engine.run()

    context = context_gb(gpu.name, s["cuda_context_gb"])
    scenario = dict(s) | knobs | {
        "cuda_context_gb": context, "attention": workload.attention,
        "calibration": calibration.describe() if calibration is not None else None,
        "overlap_slowdown": overlap_slowdown, "collective_cpu_us": collective_cpu_s * 1e6,
        "comm_rate_while_computing": comm_rate,
        "strategy": strategy.name, "model": workload.name, "params": workload.params,
        "topology": topo.name, "gpu": gpu.name, "gpus_per_node": topo.ranks_per_node,
        "topology_description": topo.describe(), "workload_description": workload.describe(),
    }
    tokens = s["gpus"] * workload.tokens_per_micro_batch * s["grad_accum"]
    metrics = compute_metrics(run, program, scenario, s["gpus"], tokens, gpu.hbm_bytes,
                              context_bytes=int(round(context * 1e9)),
                              allocator_reserve=s["allocator_reserve"])
    ops = [
        {"rank": r.rank, "stream": r.stream, "name": r.name, "start_s": r.start_s, "end_s": r.end_s,
         "bytes": r.bytes, "layer": r.layer, "phase": r.phase, "step": r.step, "kind": r.kind,
         "algorithm": r.algorithm}
        for r in run.records
    ]
    memory = [{"rank": rank, "t_s": t, "category": cat, "bytes": b}
              for rank, events in run.memory.items() for t, cat, b in events]
    ends = run.step_ends[run.simulated_ranks[0]]
    window = (ends[-2] if len(ends) > 1 else 0.0, ends[-1])
    return SimResult(metrics, ops, memory, scenario, window, s["gpus"], run.simulated_ranks,
                     list(program.notes), run.events)
