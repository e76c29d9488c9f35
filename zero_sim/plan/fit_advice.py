"""When a scenario does not fit: settings that do, each simulated, fastest first.

A suggestion is a dict of ``simulate()`` keywords (the CLI flag is the same name in kebab-case;
``True``/``False`` is ``--flag``/``--no-flag``; ``None`` unsets a knob the new strategy does not
take, i.e. leaves its flag out) that, applied to the scenario as it was given,
was simulated and fits (``memory.fits``), with what it holds and how fast it runs:
``{"settings": {...}, "reserved_gb", "spare_gb", "tokens_per_s_per_gpu"}``.

The changes tried (:func:`changes`), alone and combined where they help each other: activation
recompute (``full``), smaller micro-batches (halved down to 1, the accumulation grown to keep
the global batch), every other sharded strategy (ZeRO-1/2/3, FSDP), offloading the optimizer
state and then the weights to host memory (ZeRO-3; docs/offload.md), and more GPUs of the same
kind (doubling, up to 16 times as many).

The changes on the GPUs the scenario has and those that add GPUs are searched apart (more
hardware is a different answer, and a user with a fixed cluster needs the first), each kept
fast as the planner keeps it (:mod:`zero_sim.plan.search`): every change is first bounded
(:mod:`zero_sim.plan.bounds`, milliseconds); a refused one or one whose reserved memory cannot
fit is dropped.  The rest are simulated best throughput bound first, at most :data:`SIMULATED`
of them, stopping once :data:`KEEP` fit and no other could beat the slowest of those.  If none
of those fits, the leanest by the memory bound are simulated too (:data:`LEANEST` of them), so
that a scenario the planner can fit on its GPUs gets advice.
"""

from __future__ import annotations

from collections.abc import Iterator

from zero_sim.plan.bounds import MARGIN, Bounds, bounds
from zero_sim.scenario import ScenarioError, simulate
from zero_sim.scenario.settings import COMMON, MAX_GPUS
from zero_sim.strategies import STRATEGIES, all_knobs, get_strategy
from zero_sim.strategies.capabilities import PYTORCH
from zero_sim.vocabulary import OPTIMIZER_STATE, PARAMS

# The strategies that shard some state (each is tried), and those that shard the weights (tried on
# more GPUs), PyTorch's first (it needs nothing beyond torch).
SHARDED = tuple(sorted((name for name, st in STRATEGIES.items() if st.can.shards(OPTIMIZER_STATE)),
                       key=lambda name: STRATEGIES[name].can.library != PYTORCH))
LEAN = tuple(name for name in SHARDED if STRATEGIES[name].can.shards(PARAMS))
# The one that offloads the optimizer state alone, then the weights with it (DeepSpeed's ZeRO-3).
OFFLOADS = next(name for name, st in STRATEGIES.items()
                if st.can.shards(PARAMS) and st.can.placement and st.can.placement.params == "with_optimizer")
DEFAULT_STRATEGY = next(setting.default for setting in COMMON if setting.name == "strategy")
MORE_GPUS = (2, 4, 8, 16)
KEEP, KEEP_MORE_GPUS = 3, 2  # suggestions returned on the same GPUs, and on more of them
SIMULATED, SIMULATED_MORE_GPUS = 6, 3  # most simulations spent on the fastest-bound changes of each
LEANEST = 3  # then, if none of those fit, the changes leanest in memory


def changes(s: dict) -> Iterator[dict]:
    """Settings to apply to ``s``, each a dict of ``simulate()`` keywords (may repeat)."""
    strategy = s.get("strategy", DEFAULT_STRATEGY)
    micro, accum = s.get("micro_batch", 8), s.get("grad_accum", 1)
    smaller = []
    while micro > 1:
        micro //= 2
        smaller.append({"micro_batch": micro, "grad_accum": accum * s.get("micro_batch", 8) // micro})
    shapes = [{}, *smaller]
    recompute = [{}] if s.get("recompute") == "full" else [{}, {"recompute": "full"}]
    for other in [strategy, *(x for x in SHARDED if x != strategy)]:
        switch = {} if other == strategy else {"strategy": other}
        for shape in shapes:
            for r in recompute:
                yield switch | shape | r
    if s.get("offload_params", "none") == "none":
        offload = {"strategy": OFFLOADS, "offload_optimizer": "cpu", "recompute": "full"}
        for shape in (shapes[0], shapes[-1]):
            yield offload | shape
            yield offload | shape | {"offload_params": "cpu"}
    gpus = s.get("gpus", 8)
    for factor in MORE_GPUS:
        if gpus * factor <= MAX_GPUS:
            for other in dict.fromkeys([strategy, *LEAN]):
                yield {"gpus": gpus * factor, "recompute": "full"} | ({} if other == strategy else
                                                                     {"strategy": other})


def _switched(scenario: dict, settings: dict) -> dict:
    """Under another strategy, the old one's knobs that the new one does not take are unset (None)."""
    if "strategy" not in settings:
        return settings
    own = {k.name for k in get_strategy(settings["strategy"]).knobs}
    return settings | {k: None for k in scenario if k in all_knobs() and k not in own}


def _bounded(scenario: dict) -> list[tuple[Bounds, dict]]:
    """Every distinct change that is not refused and not ruled out by the memory bound."""
    out, seen = [], set()
    for settings in changes(scenario):
        settings = _switched(scenario, {k: v for k, v in settings.items() if scenario.get(k) != v})
        key = tuple(sorted(settings.items()))
        if not settings or key in seen:
            continue
        seen.add(key)
        try:
            b = bounds(**(scenario | settings))
        except (ScenarioError, ValueError):
            continue
        if not b.cannot_fit:
            out.append((b, settings))
    return out


def _suggestion(scenario: dict, settings: dict) -> dict | None:
    """``settings`` applied and simulated as the user will run it (no interval: a suggestion shows
    none): the suggestion, or None if it does not fit."""
    try:
        m = simulate(**(scenario | settings), interval=False).metrics
    except (ScenarioError, ValueError):
        return None
    mem = m["memory"]
    if not mem["fits"]:
        return None
    return {"settings": settings, "reserved_gb": mem["reserved_peak_bytes"] / 1e9,
            "spare_gb": (mem["capacity_bytes"] - mem["reserved_peak_bytes"]) / 1e9,
            "tokens_per_s_per_gpu": m["tokens_per_s"] / m["gpus"]}


def _fastest(scenario: dict, open_: list[tuple[Bounds, dict]], keep: int, budget: int) -> list[dict]:
    """Up to ``keep`` of ``open_`` that fit, simulating best throughput bound first (at most ``budget``);
    if none of those fits, the :data:`LEANEST` leanest by the memory bound are simulated too."""
    open_ = sorted(open_, key=lambda pair: -pair[0].tokens_per_s_per_gpu_high)
    found: list[dict] = []
    for b, settings in open_[:budget]:
        speeds = sorted((f["tokens_per_s_per_gpu"] for f in found), reverse=True)
        if len(speeds) >= keep and b.tokens_per_s_per_gpu_high * (1.0 + MARGIN) < speeds[keep - 1]:
            break  # sorted by bound: no later change can enter the top ``keep``
        if (s := _suggestion(scenario, settings)) is not None:
            found.append(s)
    if not found:
        for _, settings in sorted(open_[budget:], key=lambda pair: pair[0].reserved_low_bytes)[:LEANEST]:
            if (s := _suggestion(scenario, settings)) is not None:
                found.append(s)
    return sorted(found, key=lambda f: -f["tokens_per_s_per_gpu"])[:keep]


def fit_advice(scenario: dict, keep: int = KEEP) -> list[dict]:
    """Suggestions under which ``scenario`` fits, fastest (tokens/s per GPU) first: up to ``keep`` on
    the GPUs it has, and up to :data:`KEEP_MORE_GPUS` on more of them; empty when nothing tried fits."""
    scenario = dict(scenario)
    try:
        bounds(**scenario)
    except (ScenarioError, ValueError):
        return []
    open_ = _bounded(scenario)
    same = [pair for pair in open_ if "gpus" not in pair[1]]
    more = [pair for pair in open_ if "gpus" in pair[1]]
    found = _fastest(scenario, same, keep, SIMULATED) + _fastest(scenario, more, KEEP_MORE_GPUS,
                                                                 SIMULATED_MORE_GPUS)
    return sorted(found, key=lambda f: -f["tokens_per_s_per_gpu"])


def as_flags(settings: dict) -> list[str]:
    """``simulate()`` keywords as the CLI flags that set them (``--flag``/``--no-flag`` for booleans)."""
    flags = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif value is not None:
            flags += [flag, str(value)]
    return flags


__all__ = ["as_flags", "changes", "fit_advice"]
