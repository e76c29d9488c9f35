"""A torchtitan job configuration (TOML) read as ``simulate()`` settings.

torchtitan trains with FSDP2 over a mesh of ``data_parallel_replicate_degree`` x
``data_parallel_shard_degree`` ranks (``[parallelism]``); a shard degree of -1 takes every rank
the other degrees leave.  What is read:

* ``[model] name`` and ``flavor`` pick a model preset (``llama3`` ``8B`` is ``llama3-8b``).
* ``[training] local_batch_size`` (``batch_size`` in older releases) is the micro-batch,
  ``seq_len`` the sequence length, ``mixed_precision_param`` / ``mixed_precision_reduce`` the
  FSDP dtypes.
* ``[parallelism] fsdp_reshard_after_forward``: ``default`` and ``always`` reshard, ``never``
  keeps gathered weights until backward.  Tensor, pipeline, context and expert parallel
  degrees above 1 are refused: the simulator models data parallelism only.
* ``[activation_checkpoint] mode``: ``none``, ``full``, or ``selective`` with
  ``selective_ac_option = "op"`` (torchtitan's op-level policy, ``--recompute op``); a layer
  interval (``selective_ac_option = "2"``) is refused.
* float8 (``[float8]``, ``[quantize.linear.float8]``, turned on by ``[model] converters``) is
  ``--precision fp8`` and, with precomputed scales, ``--fp8-all-gather``
  (:mod:`zero_sim.configs.torchtitan_float8`, which refuses the recipes not modelled);
  ``[compile] enable`` (``[training] compile`` in the releases before ``[compile]``) fuses the
  element-wise chains (and the float8 casts); sections that change no step (job, metrics,
  checkpoint, schedules) and keys such as ``[training] max_norm``, ``steps`` and ``dataset`` are
  ignored, each with its reason, and any other key with :data:`~zero_sim.configs.NOT_READ`.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from zero_sim.configs import ConfigError, ConfigReading, check_spelling
from zero_sim.configs.fsdp import DTYPES, FULLY_SHARD
from zero_sim.configs.torchtitan_float8 import read_float8
from zero_sim.system.stacks import STACKS

# (model name, flavor) -> preset; flavors are torchtitan's names.
MODELS = {("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b", ("llama2", "7B"): "llama2-7b",
          ("llama2", "13B"): "llama2-13b", ("llama2", "70B"): "llama2-70b"}
NO_EFFECT_SECTIONS = {"job", "profiling", "metrics", "checkpoint", "optimizer", "lr_scheduler", "comm",
                      "experimental", "validation", "fault_tolerance", "memory_estimation"}
# Sections read here (NO_EFFECT_SECTIONS' are known too): a name close to one of them is a misspelling.
KNOWN_SECTIONS = {"model", "training", "parallelism", "activation_checkpoint", "float8", "compile",
                  "quantize"}
UNMODELLED_DEGREES = ("tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
                      "expert_parallel_degree")
RESHARD = {"default": True, "always": True, "never": False}
# Keys of the tables read here that change no step's time or memory, and why.
MODEL_FILES = {"hf_assets_path": "where the tokenizer and checkpoint files are; no step changes",
               "tokenizer_path": "where the tokenizer is; no step changes"}
TRAINING_NO_EFFECT = {
    "max_norm": "gradient clipping: one norm over the local gradients per step is not modelled",
    "steps": "how many steps run; each step's time and memory are the same",
    "warmup_steps": "a learning-rate schedule changes no step's time or memory",
    "dataset": "the data read changes no step's time (the sequence length does)",
    "dataset_path": "where the data is; no step changes",
    "seed": "randomness changes no step's time",
    "deterministic": "deterministic kernels are not modelled (they are slower)",
    "gc_freq": "Python's garbage collection between steps is not modelled",
    "global_batch_size": "the simulator takes accumulation as --grad-accum (global / (local x ranks))",
    "enable_cpu_offload": "CPU offload of FSDP2 is --offload-params cpu; give it beside the file",
}


def load_toml(config) -> tuple[dict, str]:
    if isinstance(config, dict):
        return config, "the torchtitan configuration"
    if not isinstance(config, str | os.PathLike):
        raise ConfigError(f"the torchtitan configuration must be a path or a dict, "
                          f"got {type(config).__name__}")
    path = Path(config)
    try:
        return tomllib.loads(path.read_text()), str(path)
    except OSError as exc:
        reason = (exc.strerror or "unreadable").lower()
        raise ConfigError(f"cannot read the torchtitan configuration {str(path)!r}: {reason}; pass the "
                          f"path of its TOML file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML ({str(exc).splitlines()[0]}); fix the file") from None


def read_torchtitan(config) -> ConfigReading:
    """Read a torchtitan job configuration (a dict, or the path of its TOML file)."""
    data, source = load_toml(config)
    reading = ConfigReading(source)
    reading.set("strategy", FULLY_SHARD, "torchtitan (FSDP2)")
    reading.set("stack", "torchtitan", "torchtitan (its defaults: zero_sim.system.stacks)")
    reading.set("copies", "fsdp2", "torchtitan (FSDP2's per-parameter copies)")
    check_spelling(data, KNOWN_SECTIONS | NO_EFFECT_SECTIONS, source, "[", "section", "]")
    sections = {name: _section(data, name, source) for name in data}
    _model(sections.get("model", {}), source, reading)
    fp8 = read_float8(data, source, reading)
    if "converters" in sections.get("model", {}) and "[model] converters" not in reading.accounted:
        reading.ignore("[model] converters", "no converter the simulator models is listed (float8 is)")
    _training(sections.get("training", {}), source, reading, fp8)
    _parallelism(sections.get("parallelism", {}), source, reading)
    _checkpointing(sections.get("activation_checkpoint", {}), source, reading)
    _compile(sections.get("compile"), sections.get("training", {}), reading)
    for name in data:
        if name in NO_EFFECT_SECTIONS:
            reading.ignore(f"[{name}]", "changes no step's time or memory")
        elif name not in KNOWN_SECTIONS:
            reading.ignore(f"[{name}]", "not a section this reader knows")
    reading.account(data, _key, _table)
    return reading


def _key(path: tuple[str, ...]) -> str:
    """A key as torchtitan's TOML writes it: ``[training] seq_len``."""
    return f"[{'.'.join(path[:-1])}] {path[-1]}" if len(path) > 1 else f"[{path[0]}]"


def _table(path: tuple[str, ...]) -> str:
    return f"[{'.'.join(path)}]"


def _compile(section: dict | None, training: dict, reading: ConfigReading) -> None:
    """``[compile] enable`` (``[training] compile`` before torchtitan moved it into its own table):
    each block compiled, its element-wise chains fused by Inductor and launched through its wrapper
    (the torch-compile stack's figures)."""
    key = "[training] compile" if "compile" in training else "[compile] enable"
    enabled = training.get("compile") if "compile" in training else (section or {}).get("enable")
    if section is not None and "compile" in training:
        reading.ignore("[compile]", "[training] compile decides, as in the releases that had it")
    if not enabled:
        if section is not None or "compile" in training:
            reading.ignore(key if "compile" in training else "[compile]",
                           "compile is off, as the torchtitan stack assumes")
        return
    compiled = STACKS["torch-compile"]
    reading.set("elementwise", compiled.elementwise, key)
    reading.set("kernel_host_us", compiled.kernel_host_us, key)
    for other in sorted(set(section or {}) - {"enable"}):
        reading.ignore(f"[compile] {other}", "what is compiled beyond the blocks is not modelled")


def _section(data: dict, name: str, source: str) -> dict:
    section = data[name]
    if not isinstance(section, dict):
        raise ConfigError(f"{name} in {source} must be a [{name}] table, got {section!r}")
    return section


def _model(model: dict, source: str, reading: ConfigReading) -> None:
    if not model:
        return
    key = (str(model.get("name", "")), str(model.get("flavor", "")))
    if key not in MODELS:
        known = ", ".join(f"{n} {f}" for n, f in MODELS)
        raise ConfigError(f"[model] {key[0]} {key[1]} in {source} has no preset here ({known}); drop "
                          f"[model] and give --model or a shape")
    reading.set("model", MODELS[key], "[model] name and flavor", f"{key[0]} {key[1]}",
                keys=("[model] name", "[model] flavor"))
    for other in sorted(set(model) & set(MODEL_FILES)):
        reading.ignore(f"[model] {other}", MODEL_FILES[other])


def _training(training: dict, source: str, reading: ConfigReading, fp8: bool = False) -> None:
    batch_key = "local_batch_size" if "local_batch_size" in training else "batch_size"
    if batch_key in training:
        reading.set("micro_batch", training[batch_key], f"[training] {batch_key}")
    if "seq_len" in training:
        reading.set("seq_len", training["seq_len"], "[training] seq_len")
    for key, name in (("mixed_precision_param", "param_dtype"), ("mixed_precision_reduce", "reduce_dtype")):
        if key in training:
            dtype = DTYPES.get(str(training[key]).removeprefix("torch."))
            if dtype is None:
                raise ConfigError(f"[training] {key} {training[key]!r} in {source} is not a dtype the "
                                  f"simulator knows; use bfloat16 or float32")
            reading.set(name, dtype, f"[training] {key}", training[key])
    mixed = DTYPES.get(str(training.get("mixed_precision_param", "bfloat16"))) in ("bf16", "fp16")
    if fp8 and not mixed:
        raise ConfigError(f"[training] mixed_precision_param {training['mixed_precision_param']!r} in "
                          f"{source} with float8 is not modelled (fp8 is modelled beside bf16 mixed "
                          f"precision); use bfloat16")
    if not fp8:  # float8 set --precision fp8: bf16 mixed precision with float8 linear GEMMs
        reading.set("precision", "mixed" if mixed else "fp32", "[training] mixed_precision_param")
    for key in sorted(set(training) & set(TRAINING_NO_EFFECT)):
        reading.ignore(f"[training] {key}", TRAINING_NO_EFFECT[key])


def _degree(parallelism: dict, key: str, default: int, source: str) -> int:
    value = parallelism.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value == 0 or value < -1:
        raise ConfigError(f"[parallelism] {key} in {source} must be a positive whole number (or -1 for the "
                          f"rest), got {value!r}")
    return value


def _parallelism(parallelism: dict, source: str, reading: ConfigReading) -> None:
    for key in UNMODELLED_DEGREES:
        if _degree(parallelism, key, 1, source) > 1:
            raise ConfigError(f"[parallelism] {key} in {source} is above 1; the simulator models data "
                              f"parallelism only (FSDP/HSDP), so set it to 1 to simulate")
        if key in parallelism:
            reading.read(f"[parallelism] {key}", f"= {parallelism[key]} (data parallelism only, as modelled)")
    replicate = _degree(parallelism, "data_parallel_replicate_degree", 1, source)
    shard = _degree(parallelism, "data_parallel_shard_degree", -1, source)
    if replicate == -1:
        raise ConfigError(f"[parallelism] data_parallel_replicate_degree -1 in {source} is not allowed by "
                          f"torchtitan either; give the number of replicas")
    degrees = ("[parallelism] data_parallel_replicate_degree", "[parallelism] data_parallel_shard_degree")
    if shard > 0:
        reading.set("gpus", shard * replicate, "[parallelism] degrees", f"{replicate} x {shard}",
                    keys=degrees)
    else:
        reading.read(degrees[1], "= -1 (every rank the replicas leave)")
        if replicate == 1 and "data_parallel_replicate_degree" in parallelism:
            reading.read(degrees[0], "= 1 (no replicas)")
    if replicate > 1:
        reading.set("hybrid", True, "[parallelism] data_parallel_replicate_degree", replicate)
        if shard > 0:
            reading.set("gpus_per_node", shard, "[parallelism] data_parallel_shard_degree", shard)
        else:
            reading.finish.append(lambda settings: _shard_the_rest(settings, replicate, source))
    mode = parallelism.get("fsdp_reshard_after_forward", "default")
    if not isinstance(mode, str) or mode not in RESHARD:
        raise ConfigError(f"[parallelism] fsdp_reshard_after_forward {mode!r} in {source} is not one of "
                          f"default, always, never")
    reading.set("reshard_after_forward", RESHARD[mode], "[parallelism] fsdp_reshard_after_forward", mode)
    reading.set("wrap", "blocks", "torchtitan (fully_shard on each block)")


def _shard_the_rest(settings: dict[str, Any], replicate: int, source: str) -> None:
    """A shard degree of -1 is every rank the replicas leave: --gpus / replicate, one node each."""
    if settings["gpus"] % replicate:
        raise ConfigError(f"{settings['gpus']} ranks do not split into data_parallel_replicate_degree "
                          f"{replicate} in {source}; give --gpus a multiple of {replicate}")
    if settings["gpus_per_node"] is None:
        settings["gpus_per_node"] = settings["gpus"] // replicate


def _checkpointing(ac: dict[str, Any], source: str, reading: ConfigReading) -> None:
    mode = ac.get("mode", "none")
    if mode in ("none", "full"):
        reading.set("recompute", mode, "[activation_checkpoint] mode")
        if "selective_ac_option" in ac:
            reading.ignore("[activation_checkpoint] selective_ac_option",
                           f"applies to mode selective, not {mode}")
    elif mode == "selective" and str(ac.get("selective_ac_option", "2")) == "op":
        reading.set("recompute", "op", "[activation_checkpoint] selective_ac_option", "op",
                    keys=("[activation_checkpoint] mode", "[activation_checkpoint] selective_ac_option"))
    elif mode == "selective":
        raise ConfigError(f"[activation_checkpoint] selective_ac_option {ac.get('selective_ac_option')!r} in "
                          f"{source} checkpoints every n-th block, which the simulator does not model; use "
                          f"'op' or mode 'full'")
    else:
        raise ConfigError(f"[activation_checkpoint] mode {mode!r} in {source} is not one of none, selective, "
                          f"full")
