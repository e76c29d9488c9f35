"""The plug-ins of the states layer a strategy accepts, and the one a build of it uses.

A feature is one module carrying its settings, its refusals, its placement or its ways of moving
bytes, and its result fields: offloading (:mod:`zero_sim.strategies.offload`, a placement of
states in host memory, and :mod:`zero_sim.strategies.nvme` beyond it) and ZeRO++
(:mod:`zero_sim.strategies.zeropp`, ways weights and gradients travel).  A strategy lists the
features it accepts in its capabilities (``Strategy.can.features``); its knobs and checks then
come from here, so the strategy's own module names none of them.

Offloading is asked for by ``--offload-optimizer`` and ``--offload-params`` (``none``, ``cpu`` or
``nvme``): :func:`offload_plan` reads them and hands the build the plug-in that places the states
(host memory, or NVMe drives beyond it), with the host's figures (:mod:`zero_sim.system.host_side`,
from the topology preset or the ``--host-*`` flags) and its links added to the topology.
"""

from __future__ import annotations

from zero_sim.settings import ScenarioError
from zero_sim.strategies.base import Context, Knob, Precision, Strategy
from zero_sim.strategies.capabilities import ZEROPP, Capabilities
from zero_sim.strategies.nvme import nvme_offload
from zero_sim.strategies.offload import (
    HOST_FLAGS,
    Offload,
    OffloadedTransfers,
    cpu_offload,
    host_side,
    refuse,
)
from zero_sim.strategies.transfers import ShardedWeights, WeightTransfers
from zero_sim.strategies.zeropp import ZEROPP_KNOBS, ZeroPlusPlus, refuse_zeropp
from zero_sim.system.host_side import with_host_links
from zero_sim.system.topology import Topology
from zero_sim.system.zeropp import ZeroPP

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


def offload_plan(s, strategy: Strategy, knobs, topo: Topology, gpu_name: str,
                 precision: Precision) -> tuple[Offload | None, Topology]:
    """The offload the settings ``s`` ask for under ``strategy`` (None: none), and the topology with
    its host links; the first setting the simulator cannot honour raises :class:`ScenarioError`."""
    if s.offload_optimizer == "none" and s.offload_params == "none":
        for flag in HOST_FLAGS:
            if getattr(s, flag) is not None:
                raise ScenarioError(f"--{flag.replace('_', '-')} describes where offloaded states go, but "
                                    "nothing is offloaded; add --offload-optimizer cpu or leave it out")
        return None, topo
    if gpu_name == "CPU":
        raise ScenarioError("CPU ranks already keep their states in host memory, so there is nothing to "
                            "offload; drop --offload-optimizer/--offload-params or simulate GPUs")
    refuse(s, strategy.name, strategy.can, ZeroPP.from_knobs(knobs).on)
    host = host_side(s, topo)
    if "nvme" in (s.offload_optimizer, s.offload_params):  # ZeRO-Infinity: on to the node's drives
        offload = nvme_offload(s, strategy.name, strategy.can, host, topo, precision.param_bytes,
                               precision.optimizer_bytes)
    else:
        offload = cpu_offload(s, strategy.can, host, topo.ranks_per_node)
    return offload, with_host_links(topo, host)
