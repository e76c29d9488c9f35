"""What a caller typed, made into settings before the schema checks them: preset names matched
without regard to case (a near miss answered with the name it was probably meant to be,
:mod:`zero_sim.system.names`), and the software stack's settings filled in where none was given
(:mod:`zero_sim.system.stacks`), with a note for each given setting that overrides the stack.
"""

from __future__ import annotations

from zero_sim.scenario.settings import COMMON
from zero_sim.settings import ScenarioError
from zero_sim.strategies import STRATEGIES, StrategyError, get_strategy
from zero_sim.system.gpus import GPUS
from zero_sim.system.model_presets import PRESETS
from zero_sim.system.names import NameError_, canonical
from zero_sim.system.stacks import CPU_STACK, STACKS, StackError, apply_stack, get_stack
from zero_sim.system.topology import PRESETS as TOPOLOGIES

COMMON_DEFAULTS = {s.name: s.default for s in COMMON}


def _cpu_ranks(kwargs: dict) -> bool:
    """Whether the ranks are CPU processes (the emulated cluster), as --gpu or the topology says."""
    gpu = kwargs.get("gpu")
    if gpu is None:
        spec = TOPOLOGIES.get(str(kwargs.get("topology") or COMMON_DEFAULTS["topology"]))
        gpu = spec.gpu if spec is not None else None
    return gpu == "CPU"


def with_stack(kwargs: dict) -> tuple[dict, tuple[str, ...]]:
    """The keywords with the software stack's settings filled in where none was given
    (:mod:`zero_sim.system.stacks`), and the notes saying which stack and what overrode it."""
    named = kwargs.get("stack")
    try:
        stack = get_stack(named) if named is not None else (
            STACKS[CPU_STACK] if _cpu_ranks(kwargs) else get_stack(COMMON_DEFAULTS["stack"]))
        strategy = get_strategy(kwargs.get("strategy") or COMMON_DEFAULTS["strategy"])
    except (StackError, StrategyError, TypeError):
        return kwargs, ()  # resolve() refuses the value in its own words
    filled, overridden = apply_stack(stack, kwargs, {k.name for k in strategy.knobs}, strategy.can.library)
    filled["stack"] = stack.name
    return filled, (f"stack: {stack.name} ({stack.summary})", *overridden)


def canonical_names(kwargs: dict) -> dict:
    """Preset names as typed, matched without regard to case; a near miss refused with the name
    it was probably meant to be (:mod:`zero_sim.system.names`)."""
    tables = {"strategy": (STRATEGIES, "strategy", ""), "gpu": (GPUS, "GPU", ""),
              "stack": (STACKS, "stack", ""),
              "topology": ([*TOPOLOGIES, "calibrated"], "topology preset", "")}
    if kwargs.get("params") is None:
        tables["model"] = (PRESETS, "model preset", " or give --params N")
    out = dict(kwargs)
    for key, (names, what, hint) in tables.items():
        value = out.get(key)
        if isinstance(value, str):
            try:
                out[key] = canonical(value, names, what, hint)
            except NameError_ as exc:
                raise ScenarioError(str(exc)) from None
    return out


__all__ = ["canonical_names", "with_stack"]
