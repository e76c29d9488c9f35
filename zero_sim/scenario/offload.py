"""Which offloading a scenario asks for, whether the simulator models it, and what it assumes.

``--offload-optimizer`` and ``--offload-params`` name where model states live (``none`` or
``cpu``; ``nvme`` is refused: no source at hand gives the NVMe read and write rates per node
that ZeRO-Infinity's timeline needs).  What each strategy can offload follows its library:

* ``zero1`` / ``zero2`` / ``zero3``: DeepSpeed's ``offload_optimizer`` (ZeRO-Offload), updated
  by DeepSpeed's CPU Adam; ``offload_param`` only under stage 3, and (as ZeRO-Infinity's
  examples run it) together with the optimizer;
* ``fsdp``: FSDP2's ``CPUOffloadPolicy`` moves parameters, gradients and optimizer state
  together (``--offload-params cpu``), updated by ``torch.optim.AdamW`` on CPU tensors;
* ``ddp`` replicates every state on every GPU and has nothing to offload.

A combination outside these is refused with one sentence, never silently ignored.  The host's
figures (:mod:`zero_sim.system.host_side`) come from the topology preset or the ``--host-*``
flags; the node's RAM is checked after the program is built (:func:`host_memory`).
"""

from __future__ import annotations

from zero_sim.settings import ScenarioError
from zero_sim.strategies.offload import Offload
from zero_sim.system.host_side import (
    CPU_ADAM_RATE,
    TORCH_CPU_ADAM_RATE,
    Host,
    cpu_adam_seconds,
    host_for,
    with_host_links,
)
from zero_sim.system.topology import Topology
from zero_sim.system.zeropp import ZeroPP

DEEPSPEED_STRATEGIES = ("zero1", "zero2", "zero3")


def offload_plan(s, strategy: str, knobs, topo: Topology, gpu_name: str) -> tuple[Offload | None, Topology]:
    """The offload the settings ``s`` ask for under ``strategy`` (None: none), and the topology with
    its host links; the first setting the simulator cannot honour raises :class:`ScenarioError`."""
    optimizer, params = s.offload_optimizer != "none", s.offload_params != "none"
    if not optimizer and not params:
        for flag in ("host_memory_gb", "host_cores", "host_link_gbps", "cpu_adam_rate"):
            if getattr(s, flag) is not None:
                raise ScenarioError(f"--{flag.replace('_', '-')} describes where offloaded states go, but "
                                    "nothing is offloaded; add --offload-optimizer cpu or leave it out")
        return None, topo
    if "nvme" in (s.offload_optimizer, s.offload_params):
        raise ScenarioError("offloading to NVMe (ZeRO-Infinity) is not modelled: the simulator has no source "
                            "for a node's NVMe read and write rates; offload to cpu instead")
    if gpu_name == "CPU":
        raise ScenarioError("CPU ranks already keep their states in host memory, so there is nothing to "
                            "offload; drop --offload-optimizer/--offload-params or simulate GPUs")
    if strategy == "ddp":
        raise ScenarioError("DDP replicates every model state on every GPU and cannot offload them; use "
                            "--strategy zero2 --offload-optimizer cpu (ZeRO-Offload), or zero3 / fsdp")
    if strategy in ("zero1", "zero2") and params:
        raise ScenarioError(f"{strategy} holds whole weights on every GPU, so they cannot be offloaded; use "
                            "--strategy zero3 (DeepSpeed offload_param) or fsdp (CPUOffloadPolicy)")
    if strategy == "zero3" and params and not optimizer:
        raise ScenarioError("offloading the weights alone is not modelled; offload the optimizer with them "
                            "(--offload-optimizer cpu), as ZeRO-Infinity's examples do")
    if strategy == "fsdp" and not params:
        raise ScenarioError("FSDP2's CPUOffloadPolicy offloads parameters, gradients and optimizer state "
                            "together; give --offload-params cpu")
    if ZeroPP.from_knobs(knobs).on:
        raise ScenarioError("ZeRO++ with states offloaded to the host is not modelled; drop the ZeRO++ "
                            "switches or the offload")
    if s.fp8_all_gather:
        raise ScenarioError("the float8 all-gather with weights offloaded to the host is not modelled; drop "
                            "--fp8-all-gather or the offload")
    if strategy not in (*DEEPSPEED_STRATEGIES, "fsdp"):
        raise ScenarioError(f"offloading is not modelled for --strategy {strategy}; use zero1, zero2, zero3 "
                            "or fsdp")
    host = host_for(topo.name, topo.ranks_per_node, s.host_memory_gb, s.host_cores, s.host_link_gbps)
    if host is None:
        raise ScenarioError(f"topology {topo.name!r} states no host side to offload to; give "
                            "--host-memory-gb, --host-cores and --host-link-gbps (a PCIe Gen4 x16 link "
                            "moves about 25 GB/s)")
    fsdp2 = strategy == "fsdp"
    rate = s.cpu_adam_rate or (TORCH_CPU_ADAM_RATE if fsdp2 else CPU_ADAM_RATE)
    name = "torch.optim.AdamW on CPU tensors" if fsdp2 else "DeepSpeed's CPU Adam"
    cores = host.cores / topo.ranks_per_node
    offload = Offload(params=params, cpu_seconds_per_param=cpu_adam_seconds(1, cores, rate),
                      optimizer_name=f"{name}, {rate:.1f} M params/s per core x {cores:g} cores per rank",
                      fsdp2=fsdp2)
    return offload, with_host_links(topo, host)


def host_memory(host_resident: dict[str, int], host: Host | None, ranks_per_node: int) -> dict:
    """Offloaded states against the node's RAM: every rank of a node holds its own."""
    per_rank = sum(host_resident.values())
    if host is None or per_rank == 0:
        return {}
    per_node = per_rank * ranks_per_node
    capacity = int(host.memory_gb * 1e9)
    return {"host_bytes_per_rank": per_rank, "host_bytes_per_node": per_node, "host_capacity_bytes": capacity,
            "host_fits": per_node <= capacity, "host_shortfall_bytes": max(0, per_node - capacity),
            "host_source": host.source}


def describe(offload: Offload | None, topo: Topology) -> str | None:
    """The offload as simulated, in one line for the summary (None when nothing is offloaded)."""
    if offload is None:
        return None
    host = topo.host
    what = "optimizer state and weights" if offload.params else "optimizer state"
    return (f"{what} in host memory, updated by {offload.optimizer_name}; host link "
            f"{host.d2h_gbps:g} GB/s down / {host.h2d_gbps:g} up per {host.gpus_per_link} GPU(s) "
            f"(docs/offload.md)")
