"""Which offloading a scenario asks for: the flags read, the plug-in chosen, the host's links added.

``--offload-optimizer`` and ``--offload-params`` name where model states live (``none``, ``cpu``
or ``nvme``).  What each strategy can offload is its capability, and the placement, its copies,
its CPU update, its refusals and its result fields are the offload plug-ins'
(:mod:`zero_sim.strategies.offload`, and :mod:`zero_sim.strategies.nvme` for NVMe drives).  The host's figures
(:mod:`zero_sim.system.host_side`) come from the topology preset or the ``--host-*`` flags.
"""

from __future__ import annotations

from zero_sim.settings import ScenarioError
from zero_sim.strategies.base import Precision, Strategy
from zero_sim.strategies.nvme import nvme_offload
from zero_sim.strategies.offload import HOST_FLAGS, Offload, cpu_offload, host_side, refuse
from zero_sim.system.host_side import with_host_links
from zero_sim.system.topology import Topology
from zero_sim.system.zeropp import ZeroPP


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
