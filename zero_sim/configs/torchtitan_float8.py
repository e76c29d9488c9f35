"""torchtitan's float8 settings read as ``--precision fp8`` and ``--fp8-all-gather``.

torchtitan turns on torchao's float8 training with a model converter and configures it in one
table, whose name moved over its releases (pytorch/torchtitan ``torchtitan/config_manager.py`` and
later ``torchtitan/config/job_config.py``):

* ``[training] enable_float8_linear`` with ``enable_fsdp_float8_all_gather``,
  ``precompute_float8_dynamic_scale_for_fsdp`` and ``float8_scaling_type_*`` (mid 2024);
* ``[float8]``: ``enable_float8_linear`` (to January 2025), then ``[model] converters = ["float8"]``
  (from February 2025) with ``enable_fsdp_float8_all_gather``,
  ``precompute_float8_dynamic_scale_for_fsdp``, ``force_recompute_fp8_weight_in_bwd`` (February to
  July 2025), ``recipe_name`` and ``filter_fqns``;
* ``[quantize.linear.float8]`` (``[quantize.dense.float8]`` for a few days) with the same keys, turned
  on by ``converters = ["quantize.linear.float8"]`` (or ``"float8"``), from September 2025.

What is modelled (zero_sim.system.fp8): the tensorwise recipe (``recipe_name`` unset or
``"tensorwise"``; torchtitan's default in these releases) with dynamic scaling, every block linear in
float8 and the LM head in bf16 (``filter_fqns`` holding ``"output"``, as torchtitan's train configs
write it), and FSDP2's float8 all-gather with precomputed scales.  Refused, one sentence each: the
rowwise recipes, delayed scaling, ``emulate``, ``filter_fqns`` without ``"output"`` (the head would
run in float8) or with other modules or the auto filter (some block linears left in bf16), the
float8 all-gather without precomputed scales (a per-weight amax all-reduce before each gather), and
saving the unsharded float8 weights for backward (``force_recompute_fp8_weight_in_bwd = false``).
A float8 table that no converter turns on changes nothing and is noted as ignored.
"""

from __future__ import annotations

from typing import Any

from zero_sim.configs import ConfigError, ConfigReading

CONVERTERS = ("float8", "quantize.linear.float8", "quantize.dense.float8")
HEAD = "output"  # torchtitan's name of the LM head
KEYS = ("enable_float8_linear", "enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
        "force_recompute_fp8_weight_in_bwd", "recipe_name", "filter_fqns", "emulate", "scaling_type_input",
        "scaling_type_weight", "scaling_type_grad_output")
# Keys checked against what is modelled (refused otherwise), and what their accepted values mean.
CHECKED = {"recipe_name": "tensorwise scaling", "filter_fqns": "the LM head in bf16, every block linear in "
           "float8", "emulate": "FP8 tensor cores", "scaling_type_input": "dynamic scaling",
           "scaling_type_weight": "dynamic scaling", "scaling_type_grad_output": "dynamic scaling"}
TRAINING_KEYS = {"enable_float8_linear": "enable_float8_linear",
                 "enable_fsdp_float8_all_gather": "enable_fsdp_float8_all_gather",
                 "precompute_float8_dynamic_scale_for_fsdp": "precompute_float8_dynamic_scale_for_fsdp",
                 "float8_scaling_type_input": "scaling_type_input",
                 "float8_scaling_type_weight": "scaling_type_weight",
                 "float8_scaling_type_grad_output": "scaling_type_grad_output"}


def float8_table(data: dict) -> tuple[str, dict[str, Any]] | None:
    """The float8 table of a torchtitan configuration and its name, whichever release wrote it."""
    quantize = data.get("quantize", {})
    for kind in ("linear", "dense"):
        table = quantize.get(kind, {}).get("float8") if isinstance(quantize.get(kind), dict) else None
        if isinstance(table, dict):
            return f"[quantize.{kind}.float8]", table
    if isinstance(data.get("float8"), dict):
        return "[float8]", data["float8"]
    training = data.get("training", {})
    found = {new: training[old] for old, new in TRAINING_KEYS.items() if old in training}
    return ("[training]", found) if found else None


def read_float8(data: dict, source: str, reading: ConfigReading) -> bool:
    """Set ``precision`` fp8 (and ``fp8_all_gather``) when the configuration turns float8 on; whether
    it does."""
    found = float8_table(data)
    converters = data.get("model", {}).get("converters", [])
    converters = [c.strip() for c in converters.split(",")] if isinstance(converters, str) else converters
    converter = next((c for c in converters if c in CONVERTERS), None)
    if found is None and converter is None:
        return False
    name, table = found or ("[float8]", {})
    if not (converter or table.get("enable_float8_linear")):
        reading.ignore(name, "no converter turns float8 on ([model] converters does not list \"float8\")")
        return False
    _refuse_unmodelled(name, table, source)
    if converter:
        reading.set("precision", "fp8", "[model] converters", converter)
    else:
        reading.set("precision", "fp8", f"{name} enable_float8_linear", True)
    gather = bool(table.get("enable_fsdp_float8_all_gather"))
    precompute = bool(table.get("precompute_float8_dynamic_scale_for_fsdp"))
    if gather and not precompute:
        raise ConfigError(f"{name} enable_fsdp_float8_all_gather without precompute_float8_dynamic_scale_for_"
                          f"fsdp in {source} all-reduces each weight's amax before its gather, which is not "
                          f"modelled; set both true")
    if gather:
        reading.set("fp8_all_gather", True, f"{name} enable_fsdp_float8_all_gather and "
                    "precompute_float8_dynamic_scale_for_fsdp",
                    keys=(f"{name} enable_fsdp_float8_all_gather",
                          f"{name} precompute_float8_dynamic_scale_for_fsdp"))
    elif "enable_fsdp_float8_all_gather" in table:
        reading.read(f"{name} enable_fsdp_float8_all_gather", "= false (weights gathered in bf16)")
    elif precompute:
        reading.ignore(f"{name} precompute_float8_dynamic_scale_for_fsdp",
                       "torchtitan applies it only with enable_fsdp_float8_all_gather")
    if table.get("force_recompute_fp8_weight_in_bwd"):
        reading.ignore(f"{name} force_recompute_fp8_weight_in_bwd",
                       "the model recasts the weights in backward, as this asks")
    for key, meaning in CHECKED.items():
        if key in table:
            reading.read(f"{name} {key}", f"= {table[key]!r} ({meaning})")
    for key in table:
        if key not in KEYS:
            reading.ignore(f"{name} {key}", "not a float8 key this reader knows; it is not modelled")
    return True


def _refuse_unmodelled(name: str, table: dict, source: str) -> None:
    """One sentence for the first float8 option the simulator does not model."""
    recipe = table.get("recipe_name")
    if recipe not in (None, "tensorwise"):
        raise ConfigError(f"{name} recipe_name {recipe!r} in {source} is not modelled: only tensorwise "
                          f"dynamic scaling is (docs/fp8.md); remove recipe_name to simulate tensorwise")
    if recipe is not None and table.get("enable_fsdp_float8_all_gather"):
        raise ConfigError(f"{name} recipe_name with enable_fsdp_float8_all_gather in {source} is refused by "
                          f"torchtitan itself; remove recipe_name (tensorwise is the default)")
    for key in ("scaling_type_input", "scaling_type_weight", "scaling_type_grad_output"):
        if table.get(key, "dynamic") != "dynamic":
            raise ConfigError(f"{name} {key} {table[key]!r} in {source} is delayed scaling, which is not "
                              f"modelled; use dynamic")
    if table.get("emulate"):
        raise ConfigError(f"{name} emulate in {source} runs float8 GEMMs emulated in high precision, not on "
                          f"FP8 tensor cores; remove it to simulate FP8 hardware")
    if table.get("force_recompute_fp8_weight_in_bwd") is False:
        raise ConfigError(f"{name} force_recompute_fp8_weight_in_bwd = false in {source} saves the unsharded "
                          f"float8 weights for backward, which is not modelled; set it true")
    fqns = table.get("filter_fqns", [])
    fqns = [f.strip() for f in fqns.split(",") if f.strip()] if isinstance(fqns, str) else list(fqns)
    if HEAD not in fqns:
        raise ConfigError(f"{name} filter_fqns in {source} does not list \"{HEAD}\", so the LM head would "
                          f"run in float8 too, which is not modelled; add \"{HEAD}\" as torchtitan's train "
                          f"configs do")
    others = [f for f in fqns if f != HEAD]
    if others:
        raise ConfigError(f"{name} filter_fqns in {source} also keeps {', '.join(others)} out of float8; "
                          f"only the LM head in bf16 is modelled, so filter \"{HEAD}\" alone")


__all__ = ["CONVERTERS", "float8_table", "read_float8"]
