"""A Hugging Face peft LoRA configuration (``adapter_config.json``) read as ``simulate()`` settings.

peft writes the adapter's configuration beside its weights (``save_pretrained``), the same keys
``LoraConfig`` takes.  What is read:

* ``r``: the adapters' rank, ``--lora-rank``;
* ``target_modules``: a list of module names (``q_proj``, ``v_proj``, ...; GPT-2's ``c_attn``) or
  ``"all-linear"``, ``--lora-targets`` (:mod:`zero_sim.system.lora`); a regular expression (peft
  takes a string as one) is refused: list the names;
* ``lora_alpha``, ``use_rslora``, ``lora_dropout``, ``task_type``, ``base_model_name_or_path``,
  ``inference_mode``, ``fan_in_fan_out``, ``init_lora_weights``, ``revision``: no effect on a
  step's time or memory, noted as ignored (dropout on the adapters' input is a small element-wise
  op, not modelled).

Refused, as they change what trains and the simulator does not model them: another ``peft_type``
than LORA, ``bias`` other than ``"none"`` (trainable biases), ``modules_to_save`` (whole modules
trained beside the adapters), ``use_dora``, ``layers_to_transform`` and ``rank_pattern``
(adapters on some layers only, or of other ranks).
Unlike the DeepSpeed, FSDP and torchtitan files it describes only what trains, so it goes beside
one of them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from zero_sim.configs import ConfigError, ConfigReading, load_mapping, validated
from zero_sim.system.lora import ALL_LINEAR, MAX_RANK

IGNORED = {"lora_alpha": "scales the adapters' output, no cost",
           "lora_dropout": "dropout on the adapters' input, a small element-wise op not modelled",
           "task_type": "names the task, no cost", "base_model_name_or_path": "names the model; give --model",
           "inference_mode": "false while training", "fan_in_fan_out": "the weights' layout, no cost",
           "init_lora_weights": "how adapters start, no cost", "revision": "the model's version",
           "use_rslora": "a scale on the adapters' output, no cost", "auto_mapping": "peft's bookkeeping",
           "peft_version": "peft's bookkeeping"}


class _LoraConfig(BaseModel):
    model_config = ConfigDict(extra="allow")  # peft adds keys over versions; unknown ones are noted
    peft_type: str = "LORA"
    r: Annotated[int, Field(gt=0, le=MAX_RANK)]
    target_modules: list[str] | str | None = None
    bias: str = "none"
    modules_to_save: list[str] | None = None
    use_dora: bool = False
    layers_to_transform: Any = None
    rank_pattern: dict | None = None


def read_peft(config) -> ConfigReading:
    """``config`` (a path or a mapping) as settings; refusals are one sentence naming the key."""
    data, source = load_mapping(config, "peft configuration")
    c = validated(_LoraConfig, data, source)
    refuse = [(c.peft_type.upper() != "LORA", "peft_type", f"is {c.peft_type!r}; only LORA adapters are "
               "modelled"),
              (c.bias != "none", "bias", f"is {c.bias!r}: trainable biases are not modelled; use \"none\""),
              (bool(c.modules_to_save), "modules_to_save", "trains whole modules beside the adapters, which "
               "is not modelled"),
              (c.use_dora, "use_dora", "is true: DoRA's magnitude vectors and their cost are not modelled"),
              (c.layers_to_transform is not None, "layers_to_transform", "puts adapters on some layers "
               "only, which is not modelled"),
              (bool(c.rank_pattern), "rank_pattern", "gives some modules other ranks, which is not modelled")]
    for bad, key, why in refuse:
        if bad:
            raise ConfigError(f"{key} in {source} {why}")
    if c.target_modules is None:
        raise ConfigError(f"{source} names no target_modules; list the projections the adapters sit "
                          f"beside (q_proj, v_proj, ...) or \"{ALL_LINEAR}\"")
    if isinstance(c.target_modules, str) and c.target_modules != ALL_LINEAR:
        raise ConfigError(f"target_modules in {source} is a regular expression ({c.target_modules!r}), "
                          f"which is not read; list the module names instead")
    targets = ALL_LINEAR if isinstance(c.target_modules, str) else ",".join(c.target_modules)
    reading = ConfigReading(source)
    reading.set("lora_rank", c.r, "r")
    reading.set("lora_targets", targets, "target_modules")
    for key in ("peft_type", "bias", "modules_to_save", "use_dora", "layers_to_transform", "rank_pattern"):
        if key in data:  # checked above: what is written here is what is modelled
            reading.read(key, f"= {data[key]!r} (as modelled)")
    for key in data:
        if key in IGNORED:
            reading.ignore(key, IGNORED[key])
        elif key not in _LoraConfig.model_fields:
            reading.ignore(key, "not a setting this reader knows; it is not modelled")
    reading.account(data)
    return reading


__all__ = ["read_peft"]
