"""An FSDP2 ``fully_shard`` call, written as a small JSON or YAML file, read as ``simulate()`` settings.

The file holds the arguments users pass to ``torch.distributed.fsdp.fully_shard`` and the
device mesh they build, plus which modules were wrapped::

    {"mesh": {"replicate": 2, "shard": 8},
     "reshard_after_forward": true,
     "mp_policy": {"param_dtype": "bfloat16", "reduce_dtype": "float32"},
     "wrap": "blocks"}

* ``mesh``: ranks = replicate x shard.  A replicate degree above 1 is HSDP (``--hybrid``):
  the simulator shards within a node and all-reduces across nodes, so the shard degree is
  the ranks per node (``--gpus-per-node``).
* ``reshard_after_forward``: true or false as in FSDP2.  An integer reshards to that many
  ranks after forward; equal to the shard degree it is ``true``, any other value (a smaller
  group for backward's gathers) is not modelled and is refused.
* ``mp_policy``: ``param_dtype`` is the width of gathered weights, ``reduce_dtype`` that of
  reduced gradients; a ``param_dtype`` below fp32 is mixed precision.  ``output_dtype`` and
  ``cast_forward_inputs`` cast activations only and are noted as ignored.
* ``offload_policy``: ``"CPUOffloadPolicy"`` (or ``{"type": "CPUOffloadPolicy", "pin_memory":
  true}``) keeps parameters, gradients and optimizer state in host memory: ``--offload-params
  cpu`` (``docs/offload.md``); ``"OffloadPolicy"`` or none offloads nothing.  ``wrap``, ``forward_prefetch``,
  ``backward_prefetch`` and ``limit_all_gathers`` are the simulator's FSDP knobs by name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from zero_sim.configs import ConfigError, ConfigReading, load_mapping, validated
from zero_sim.strategies import declaring
from zero_sim.strategies.capabilities import PYTORCH
from zero_sim.vocabulary import PARAMS

# The registered strategy that ``fully_shard`` is: PyTorch's, sharding the weights (its capabilities).
FULLY_SHARD = declaring(PYTORCH, shards=PARAMS).name

# torch's dtype names (with or without "torch.") -> the simulator's.
DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "half": "fp16", "fp16": "fp16",
          "float32": "fp32", "float": "fp32", "fp32": "fp32"}
Degree = Annotated[int, Field(gt=0)]


class _Mesh(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shard: Degree
    replicate: Degree = 1


class _MixedPrecision(BaseModel):
    model_config = ConfigDict(extra="forbid")
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    output_dtype: str | None = None
    cast_forward_inputs: bool = True


class _FullyShard(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt argument would fail in torch too
    mesh: _Mesh | None = None
    reshard_after_forward: bool | Degree = True
    mp_policy: _MixedPrecision | None = None
    offload_policy: Any = None
    wrap: str | list[Annotated[int, Field(ge=0)]] = "blocks"
    forward_prefetch: bool | None = None
    backward_prefetch: Literal["pre", "post", "none"] | None = None
    limit_all_gathers: bool | None = None



def _offload_policy(policy: Any, source: str, reading: ConfigReading) -> None:
    """FSDP2's ``offload_policy``, by its class name (alone, or as ``type`` with its arguments)."""
    if policy in ({}, "none", "OffloadPolicy"):
        reading.ignore("offload_policy", "offloads nothing")
    if policy in (None, {}, "none", "OffloadPolicy"):
        return
    name = policy.get("type", "CPUOffloadPolicy") if isinstance(policy, dict) else policy
    if name not in ("CPUOffloadPolicy", "cpu"):
        raise ConfigError(f"offload_policy {policy!r} in {source} is not FSDP2's CPUOffloadPolicy or "
                          f"OffloadPolicy; write \"CPUOffloadPolicy\" to offload to the host")
    reading.set("offload_params", "cpu", "offload_policy", name)
    if isinstance(policy, dict) and policy.get("pin_memory") is False:
        reading.ignore("offload_policy.pin_memory", "copies are simulated at the pinned rate; pageable host "
                       "memory copies slower")
    elif isinstance(policy, dict) and "pin_memory" in policy:
        reading.read("offload_policy.pin_memory", "= true (copies at the pinned rate)")

def load_fsdp_file(config) -> tuple[dict, str]:
    """A mapping, or a JSON or YAML file (by its suffix) holding one."""
    if isinstance(config, str | os.PathLike) and Path(config).suffix.lower() in (".yaml", ".yml"):
        return _load_yaml(Path(config))
    return load_mapping(config, "FSDP configuration")


def _load_yaml(path: Path) -> tuple[dict, str]:
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"reading {path} needs PyYAML (pip install pyyaml); or write it as JSON") from None
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the FSDP configuration {str(path)!r}: {exc.strerror.lower()}; "
                          f"pass the path of a YAML or JSON file") from None
    except (yaml.YAMLError, UnicodeDecodeError):
        raise ConfigError(f"{path} is not valid YAML; fix the file") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a YAML {type(data).__name__}, not a mapping of settings")
    return data, str(path)


def read_fsdp(config) -> ConfigReading:
    """Read an FSDP2 configuration (a dict, or the path of its JSON or YAML file)."""
    data, source = load_fsdp_file(config)
    fs = validated(_FullyShard, data, source)
    reading = ConfigReading(source)
    reading.set("strategy", FULLY_SHARD, "fully_shard")
    reading.set("copies", "fsdp2", "fully_shard (per-parameter sharding copies gathers and gradients)")
    if fs.mesh is not None:
        _mesh(fs.mesh, reading)
    shard = fs.mesh.shard if fs.mesh is not None else None
    _reshard(fs.reshard_after_forward, shard, source, reading)
    if fs.mp_policy is not None:
        _mixed_precision(fs.mp_policy, source, reading)
    else:
        reading.set("precision", "fp32", "mp_policy (absent: fp32 throughout)")
    _offload_policy(fs.offload_policy, source, reading)
    wrap = fs.wrap if isinstance(fs.wrap, str) else ",".join(str(i) for i in fs.wrap)
    reading.set("wrap", wrap, "wrap")
    for name in ("forward_prefetch", "backward_prefetch", "limit_all_gathers"):
        if getattr(fs, name) is not None:
            reading.set(name, getattr(fs, name), name)
    reading.account(data)
    return reading


def _mesh(mesh: _Mesh, reading: ConfigReading) -> None:
    reading.set("gpus", mesh.shard * mesh.replicate, "mesh", f"{mesh.replicate} x {mesh.shard}",
                keys=("mesh.shard", "mesh.replicate"))
    if mesh.replicate > 1:
        reading.set("hybrid", True, "mesh.replicate", mesh.replicate)
        reading.set("gpus_per_node", mesh.shard, "mesh.shard (HSDP shards within a node)", mesh.shard)


def _reshard(value: bool | int, shard: int | None, source: str, reading: ConfigReading) -> None:
    if isinstance(value, bool):
        reading.set("reshard_after_forward", value, "reshard_after_forward")
    elif shard is not None and value == shard:
        reading.set("reshard_after_forward", True, "reshard_after_forward", value)
    else:
        raise ConfigError(f"reshard_after_forward {value} in {source} reshards to a group of {value} ranks "
                          f"after forward, which the simulator does not model; use true or false")


def _dtype(name: str | None, key: str, source: str) -> str | None:
    if name is None:
        return None
    short = DTYPES.get(name.removeprefix("torch."))
    if short is None:
        raise ConfigError(f"{key} {name!r} in {source} is not a dtype the simulator knows; use bfloat16, "
                          f"float16 or float32")
    return short


def _mixed_precision(mp: _MixedPrecision, source: str, reading: ConfigReading) -> None:
    param = _dtype(mp.param_dtype, "mp_policy.param_dtype", source)
    reduce = _dtype(mp.reduce_dtype, "mp_policy.reduce_dtype", source)
    _dtype(mp.output_dtype, "mp_policy.output_dtype", source)
    reading.set("precision", "mixed" if param in ("bf16", "fp16") else "fp32", "mp_policy.param_dtype")
    if param is not None:
        reading.set("param_dtype", param, "mp_policy.param_dtype", mp.param_dtype)
    if reduce is not None:
        reading.set("reduce_dtype", reduce, "mp_policy.reduce_dtype", mp.reduce_dtype)
    if mp.output_dtype is not None:
        reading.ignore("mp_policy.output_dtype", "casts the module's outputs; no communication changes")
    reading.ignore("mp_policy.cast_forward_inputs", "casts activations; no communication changes")
