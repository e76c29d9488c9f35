"""The plug-ins of the states layer a strategy accepts, and the one a build of it uses.

A feature is one module carrying its settings, its refusals, its placement or its ways of moving
bytes, and its result fields: offloading (:mod:`zero_sim.strategies.offload`, a placement of
states in host memory, and :mod:`zero_sim.strategies.nvme` beyond it) and ZeRO++
(:mod:`zero_sim.strategies.zeropp`, ways weights and gradients travel).  A strategy lists the
features it accepts in its capabilities (``Strategy.can.features``); its knobs and checks then
come from here, so the strategy's own module names none of them.
"""

from __future__ import annotations

from zero_sim.strategies.base import Context, Knob
from zero_sim.strategies.capabilities import ZEROPP, Capabilities
from zero_sim.strategies.offload import OffloadedTransfers
from zero_sim.strategies.transfers import ShardedWeights, WeightTransfers
from zero_sim.strategies.zeropp import ZEROPP_KNOBS, ZeroPlusPlus, refuse_zeropp

# Each feature's settings, and its refusal of a context it cannot serve.
KNOBS = {ZEROPP: ZEROPP_KNOBS}
REFUSALS = {ZEROPP: refuse_zeropp}
# The ways of moving a sharded step's bytes, the first that applies chosen (offload and ZeRO++
# together are refused before a build).
TRANSFERS: tuple[type[WeightTransfers], ...] = (OffloadedTransfers, ZeroPlusPlus)


def feature_knobs(can: Capabilities) -> tuple[Knob, ...]:
    """The knobs of every feature a strategy accepts, in the order it lists them."""
    return tuple(knob for feature in sorted(can.features) for knob in KNOBS.get(feature, ()))


def refuse_features(ctx: Context, can: Capabilities) -> None:
    """Each accepted feature's refusal of what it does not model, as one sentence."""
    for feature in sorted(can.features):
        if feature in REFUSALS:
            REFUSALS[feature](ctx)


def transfers(s: ShardedWeights) -> WeightTransfers:
    """How this build's bytes travel: the first feature that applies, else the plain ways."""
    chosen = next((t for t in TRANSFERS if t.applies(s.ctx)), WeightTransfers)
    return chosen(s)
