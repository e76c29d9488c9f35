"""A DeepSpeed JSON configuration read as ``simulate()`` settings.

Names, units and defaults are DeepSpeed's (``deepspeed/runtime/config.py`` and
``deepspeed/runtime/zero/config.py``):

* ``zero_optimization.stage`` 1, 2, 3 is ``zero1``, ``zero2``, ``zero3``.  Stage 0 (DeepSpeed's
  own data parallelism, which all-reduces after backward rather than during it) is refused:
  torch DDP is ``--strategy ddp``.
* Sizes are in *elements*.  ``reduce_bucket_size`` (default 5e8) becomes ``--bucket-mb`` for
  stages 1 and 2 at the gradient's bytes per element (2 in bf16/fp16, 4 in fp32), and stays
  in elements for stage 3, as do the ``stage3_*`` sizes.
* ``overlap_comm`` defaults to off for stages 1 and 2 and on for stage 3, as DeepSpeed sets it.
* ``bf16.enabled`` or ``fp16.enabled`` is mixed precision (2 + 2 + 12 bytes per parameter);
  neither, with ``amp.enabled`` or ``torch_autocast.enabled``, is ``amp`` (fp32 weights under
  autocast, 4 + 4 + 8); none of them is fp32.  ``communication_data_type`` is ``--reduce-dtype`` and
  ``data_types.grad_accum_dtype`` ``--grad-accum-dtype``.
* ``train_batch_size`` must equal micro-batch x accumulation x ranks, as DeepSpeed requires;
  it is checked once the rank count is known (:func:`check_batch`).

``offload_optimizer`` and ``offload_param`` (``device`` cpu) are ``--offload-optimizer`` and
``--offload-params`` (``docs/offload.md``); a partial ``ratio`` (ZeRO-Offload++) is refused.
ZeRO++ quantization and hierarchical partitioning change where a step's time and memory go in
ways the simulator does not model, so a configuration that turns them on is refused.
Keys that do not change a step's time or memory (logging, schedules, learning rates) are
noted as ignored.  The value ``"auto"`` (filled in by the Hugging Face Trainer at
launch) is refused: the simulator needs the number.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from zero_sim.configs import ConfigError, ConfigReading, check_spelling, load_mapping, validated
from zero_sim.strategies import declaring
from zero_sim.strategies.capabilities import DEEPSPEED
from zero_sim.vocabulary import GRADS, PARAMS
from zero_sim.vocabulary.model_states import sharded

# DeepSpeed key -> simulate() keyword, for stage 3 (both in elements).
STAGE3_SIZES = {
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_max_live_parameters": "max_live_params",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "reduce_bucket_size": "reduce_bucket_size",
}
DEFAULT_REDUCE_BUCKET_ELEMENTS = 500_000_000
# ZeRO++'s switches (docs/zeropp.md): the same names as simulate() keywords, ZeRO-3's knobs.
ZEROPP_KEYS = ("zero_quantized_weights", "zero_hpz_partition_size", "zero_quantized_gradients")

# Keys that change neither a step's time nor its memory, and why they can be left aside.
NO_EFFECT = {
    "scheduler": "a learning-rate schedule changes no step's time or memory",
    "steps_per_print": "logging",
    "wall_clock_breakdown": "logging",
    "tensorboard": "logging",
    "wandb": "logging",
    "csv_monitor": "logging",
    "comms_logger": "logging",
    "flops_profiler": "profiling",
    "dump_state": "logging",
    "zero_allow_untested_optimizer": "permission, not behaviour",
    "zero_force_ds_cpu_optimizer": "permission, not behaviour",
    "gradient_clipping": "one norm over the local gradients per step is not modelled",
    "prescale_gradients": "scales gradients before the reduction; the bytes sent are the same",
    "gradient_predivide_factor": "scales gradients before the reduction; the bytes sent are the same",
    "seed": "randomness changes no step's time",
    "activation_checkpointing": "only for models that call deepspeed.checkpointing; choose --recompute",
}
ZERO_NO_EFFECT = {
    "contiguous_gradients": "avoids fragmentation, which the memory model counts only as --allocator-reserve",
    "allgather_partitions": "the updated weights are gathered with all-gather, as by default",
    "allgather_bucket_size": "updated weights are gathered in the reduce buckets' units",
    "round_robin_gradients": "changes which rank owns a gradient, not the bytes moved",
    "sub_group_size": "bounds the optimizer step's working memory; the simulator updates layer by layer",
    "stage3_gather_16bit_weights_on_model_save": "applies when saving a checkpoint only",
    "gather_16bit_weights_on_model_save": "applies when saving a checkpoint only",
    "memory_efficient_linear": "saves activation copies inside a linear layer; not modelled",
    "load_from_fp32_weights": "applies when loading a checkpoint only",
    "elastic_checkpoint": "applies when loading a checkpoint only",
    "ignore_unused_parameters": "every parameter of the simulated model is used",
    "legacy_stage1": "an old code path with the same traffic",
}
# Switches that would change time or memory in ways not modelled: refused when turned on.
NOT_MODELLED = {
    "zero_quantized_nontrainable_weights": "ZeRO++ frozen weights stored in int8",
    "mics_shard_size": "MiCS sharding",
}
# Top-level keys read here (NO_EFFECT's are known too): a key close to one of them is a misspelling.
KNOWN_TOP = {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "optimizer",
             "zero_optimization", "bf16", "fp16", "bfloat16", "communication_data_type", "gradient_clipping",
             "amp", "torch_autocast", "data_types",
             "scheduler", "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer"}
ADAM_FAMILY = {"adam", "adamw", "fusedadam", "deepspeedcpuadam", "cpuadam", "lamb", "fusedlamb"}


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")  # keys beside the ones read are noted, not refused


class _Switch(_Loose):
    enabled: bool = False


class _Offload(_Loose):
    device: Literal["none", "cpu", "nvme"] = "none"
    pin_memory: bool = False
    ratio: float = 1.0  # offload_optimizer only: the share of the update run on the CPU (ZeRO-Offload++)


class _DataTypes(_Loose):
    grad_accum_dtype: str | None = None


class _Optimizer(_Loose):
    type: str = ""


Elements = Annotated[int, Field(ge=0)]


class _Zero(_Loose):
    stage: Literal[0, 1, 2, 3] = 0
    overlap_comm: bool | None = None
    reduce_scatter: bool = True
    reduce_bucket_size: Elements = DEFAULT_REDUCE_BUCKET_ELEMENTS
    stage3_prefetch_bucket_size: Elements | None = None
    stage3_max_live_parameters: Elements | None = None
    stage3_max_reuse_distance: Elements | None = None
    stage3_param_persistence_threshold: Elements | None = None
    offload_optimizer: _Offload | None = None
    offload_param: _Offload | None = None
    zero_quantized_weights: bool | None = None
    zero_quantized_gradients: bool | None = None
    zero_quantized_nontrainable_weights: bool | None = None
    zero_hpz_partition_size: int | None = None
    mics_shard_size: int | None = None
    cpu_offload: bool | None = None


class _DeepSpeed(_Loose):
    train_batch_size: Annotated[int, Field(gt=0)] | None = None
    bf16: _Switch | None = None
    bfloat16: _Switch | None = None
    fp16: _Switch | None = None
    amp: _Switch | None = None  # apex AMP over fp32 weights
    torch_autocast: _Switch | None = None  # torch.autocast over fp32 weights
    communication_data_type: str | None = None
    data_types: _DataTypes | None = None
    optimizer: _Optimizer | None = None
    zero_optimization: _Zero = _Zero()


def read_deepspeed(config) -> ConfigReading:
    """Read a DeepSpeed configuration (a dict, or the path of its JSON file)."""
    data, source = load_mapping(config, "DeepSpeed configuration")
    _refuse_auto(data, source, "")
    check_spelling(data, KNOWN_TOP | set(NO_EFFECT), source)
    if isinstance(data.get("zero_optimization"), dict):
        check_spelling(data["zero_optimization"], set(_Zero.model_fields) | set(ZERO_NO_EFFECT),
                       source, "zero_optimization.")
    ds = validated(_DeepSpeed, data, source)
    reading = ConfigReading(source)
    precision = _precision(ds, reading)
    for key, name in (("train_micro_batch_size_per_gpu", "micro_batch"),
                      ("gradient_accumulation_steps", "grad_accum")):
        if key in data:  # checked by simulate()'s own schema, which names this key if it refuses
            reading.set(name, data[key], key)
    if ds.train_batch_size is not None:
        total = ds.train_batch_size
        reading.read("train_batch_size", f"= {total} (checked against the ranks)")
        reading.finish.append(lambda settings: check_batch(total, settings, source))
    _optimizer(ds.optimizer, source, reading)
    _zero(ds.zero_optimization, data.get("zero_optimization", {}), source, precision, reading)
    handled = {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
               "optimizer", "zero_optimization", "bf16", "fp16", "bfloat16", "communication_data_type",
               "amp", "torch_autocast", "data_types"}
    for key in data:
        if key in NO_EFFECT:
            reading.ignore(key, NO_EFFECT[key])
        elif key not in handled:
            reading.ignore(key, "not a DeepSpeed setting this reader knows")
    reading.account(data)
    return reading


def check_batch(total: int, settings: dict[str, Any], source: str) -> None:
    """DeepSpeed's rule: train_batch_size = micro-batch x gradient accumulation x ranks."""
    micro, accum, gpus = settings["micro_batch"], settings["grad_accum"], settings["gpus"]
    if total != micro * accum * gpus:
        raise ConfigError(f"train_batch_size {total} in {source} is not micro-batch {micro} x gradient "
                          f"accumulation {accum} x {gpus} ranks = {micro * accum * gpus}, as DeepSpeed "
                          f"requires; fix one of them (--gpus sets the ranks)")


def _refuse_auto(value: Any, source: str, where: str) -> None:
    if value == "auto":
        raise ConfigError(f"{where or 'a value'} in {source} is 'auto', which the Hugging Face Trainer fills "
                          f"in at launch; write the number it would use")
    if isinstance(value, dict):
        for key, inner in value.items():
            _refuse_auto(inner, source, f"{where}.{key}" if where else str(key))


def _turned_on(key: str, value: Any) -> bool:
    """A switch that is true, or a partition size above 1 (1 and DeepSpeed's -1 mean off)."""
    if key.endswith("_size"):
        return value is not None and value > 1
    return bool(value)


def _precision(ds: _DeepSpeed, reading: ConfigReading) -> str:
    """Mixed when bf16 or fp16 is enabled (fp16's loss scaling costs no modelled time); else amp when
    ``amp`` (apex) or ``torch_autocast`` is, over fp32 weights; else fp32.  ``communication_data_type``
    is what gradients travel in and ``data_types.grad_accum_dtype`` what they are accumulated in
    (DeepSpeed's defaults for both: the model's dtype under ZeRO, ``engine.get_data_types``)."""
    half = any(section is not None and section.enabled for section in (ds.bf16, ds.bfloat16, ds.fp16))
    autocast = any(section is not None and section.enabled for section in (ds.amp, ds.torch_autocast))
    precision = "mixed" if half else "amp" if autocast else "fp32"
    sections = ("bf16", "bfloat16", "fp16", "amp", "torch_autocast")
    switches = [f"{name}.enabled" for name in sections if getattr(ds, name) is not None]
    key = "bf16/fp16.enabled" if half or not autocast else "amp/torch_autocast.enabled"
    reading.set("precision", precision, key, keys=switches or (key,))
    for name in ("bf16", "bfloat16", "fp16"):
        for extra in sorted(getattr(getattr(ds, name), "model_extra", None) or {}):
            reading.ignore(f"{name}.{extra}", "loss scaling and its tuning cost no modelled time")
    for name in ("amp", "torch_autocast"):
        for extra in sorted(getattr(getattr(ds, name), "model_extra", None) or {}):
            reading.ignore(f"{name}.{extra}", "autocast's op lists and apex's opt level are not modelled; "
                           "the weights are fp32, the matmuls in half precision")
    if ds.communication_data_type is not None:
        comm = _dtype_name(ds.communication_data_type, "communication_data_type", reading.source)
        reading.set("reduce_dtype", comm, "communication_data_type", ds.communication_data_type)
    accum = ds.data_types.grad_accum_dtype if ds.data_types is not None else None
    if accum is not None:
        name = _dtype_name(accum, "data_types.grad_accum_dtype", reading.source)
        if name == "fp32" or precision != "mixed":  # a half dtype under half weights is the default
            reading.set("grad_accum_dtype", "bf16" if name == "fp16" else name, "data_types.grad_accum_dtype",
                        accum)
        else:
            reading.ignore("data_types.grad_accum_dtype", "the weights' own dtype, DeepSpeed's default")
    return precision


def _dtype_name(value: str, key: str, source: str) -> str:
    """DeepSpeed's spellings of a dtype (``fp32``, ``float32``, ``bfp16``, ...) as the simulator's."""
    names = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "bf16": "bf16", "bfloat16": "bf16",
             "bfp16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16"}
    if value.lower() not in names:
        raise ConfigError(f"{key} {value!r} in {source} is not a dtype DeepSpeed accepts (fp32, bf16 or "
                          "fp16)")
    return names[value.lower()]


def _optimizer(section: _Optimizer | None, source: str, reading: ConfigReading) -> None:
    if section is None:
        return
    if section.type.lower() not in ADAM_FAMILY:
        raise ConfigError(f"optimizer.type {section.type!r} in {source} is not an Adam-family optimizer, "
                          f"whose 12 bytes per parameter the simulator counts; use --optimizer-k for another")
    reading.read("optimizer.type", f"= {section.type!r} (Adam family: 12 bytes of state per parameter)")
    reading.ignore("optimizer.params", "learning rate and betas change no step's time or memory")


def _offload(zero: _Zero, source: str, reading: ConfigReading) -> None:
    """``offload_optimizer`` / ``offload_param`` (and the older ``cpu_offload: true``) become
    ``--offload-optimizer`` / ``--offload-params``; the scenario refuses what it does not model
    (NVMe, weights without the optimizer, a stage that cannot)."""
    if zero.cpu_offload:
        reading.set("offload_optimizer", "cpu", "zero_optimization.cpu_offload", True)
    for key, name in (("offload_optimizer", "offload_optimizer"), ("offload_param", "offload_params")):
        offload = getattr(zero, key)
        if offload is not None and offload.device == "none":
            reading.ignore(f"zero_optimization.{key}", "device none: nothing is offloaded")
        if offload is None or offload.device == "none":
            continue
        if offload.ratio != 1.0:
            raise ConfigError(f"zero_optimization.{key}.ratio {offload.ratio:g} in {source} updates part "
                              f"of the model on the GPU (ZeRO-Offload++ twin flow), which the simulator does "
                              f"not model; remove it to offload everything")
        reading.set(name, offload.device, f"zero_optimization.{key}.device")
        if not offload.pin_memory:
            reading.ignore(f"zero_optimization.{key}.pin_memory", "copies are simulated at the pinned "
                           "rate; pageable host memory copies slower")
        else:
            reading.read(f"zero_optimization.{key}.pin_memory", "= true (copies at the pinned rate)")
        for extra in sorted(set(offload.model_extra or {}) - {"nvme_path"}):
            reading.ignore(f"zero_optimization.{key}.{extra}", "NVMe and buffer tuning are not modelled")


def _zeropp(zero: _Zero, written: dict, stage: int, reading: ConfigReading) -> None:
    """ZeRO++'s keys become ZeRO-3's knobs of the same names; one turned on beside another stage is
    passed on too, so that the simulator refuses it naming the key (ZeRO++ extends stage 3 only)."""
    for key in ZEROPP_KEYS:
        value = getattr(zero, key)
        # A key written as null is a key left out: DeepSpeed's default (off) holds.
        if value is not None and key in written and (sharded(stage, PARAMS) or _turned_on(key, value)):
            # DeepSpeed reads a partition size of -1 or 0 as off, as 1 is.
            reading.set(key, max(value, 1) if key.endswith("_size") else value, f"zero_optimization.{key}")


def _zero(zero: _Zero, written: dict, source: str, precision: str, reading: ConfigReading) -> None:
    """``zero`` is the validated section, ``written`` the keys as the file has them."""
    # The registered strategy that declares DeepSpeed's stage (strategies/capabilities.py).
    strategy = declaring(DEEPSPEED, stage=zero.stage)
    if strategy is None:
        raise ConfigError(f"zero_optimization.stage {zero.stage} in {source} is not simulated: stages 1, 2 "
                          f"and 3 are (stage 0, DeepSpeed's own data parallelism, all-reduces after "
                          f"backward; use --strategy ddp for torch DDP)")
    stage = zero.stage
    reading.set("strategy", strategy.name, "zero_optimization.stage", stage)
    # A stage that shards the weights has no all-reduce to choose: it always reduce-scatters.
    if sharded(stage, PARAMS) and "reduce_scatter" in written:
        reading.ignore("zero_optimization.reduce_scatter", "stage 3 always reduce-scatters its gradients")
    _offload(zero, source, reading)
    for key, what in NOT_MODELLED.items():
        if _turned_on(key, getattr(zero, key)):
            raise ConfigError(f"zero_optimization.{key} in {source} turns on {what}, which the simulator "
                              f"does not model; remove it to simulate")
    _zeropp(zero, written, stage, reading)
    # DeepSpeed's default: on for stage 3 (the one that shards the weights), off for stages 1 and 2.
    overlap = zero.overlap_comm if zero.overlap_comm is not None else sharded(stage, PARAMS)
    reading.set("overlap_comm", overlap, "zero_optimization.overlap_comm")
    grad_bytes = 2 if precision == "mixed" else 4  # amp's gradients are fp32, as its weights
    if sharded(stage, PARAMS):
        for key, name in STAGE3_SIZES.items():
            if key in written:
                reading.set(name, getattr(zero, key), f"zero_optimization.{key}")
    else:
        elements = zero.reduce_bucket_size
        reading.set("bucket_mb", elements * grad_bytes / 2**20, "zero_optimization.reduce_bucket_size",
                    elements)
        if not sharded(stage, GRADS):  # stage 1
            reading.set("zero1_reduce", "reduce_scatter" if zero.reduce_scatter else "all_reduce",
                        "zero_optimization.reduce_scatter")
        elif not zero.reduce_scatter:
            raise ConfigError(f"zero_optimization.reduce_scatter false in {source} all-reduces stage 2's "
                              f"gradients, which the simulator does not model; remove it to simulate")
        else:
            reading.set("zero2_launch", "hook", "zero_optimization (reductions from backward hooks)")
        for key in STAGE3_SIZES:
            if key.startswith("stage3_") and key in written:
                reading.ignore(f"zero_optimization.{key}", f"applies to stage 3, not stage {stage}")
    known = set(_Zero.model_fields)
    for key in written:
        if key in ZERO_NO_EFFECT:
            reading.ignore(f"zero_optimization.{key}", ZERO_NO_EFFECT[key])
        elif key not in known:
            raise ConfigError(f"zero_optimization.{key} in {source} is not a DeepSpeed ZeRO setting "
                              f"(DeepSpeed refuses it too); check its spelling")
