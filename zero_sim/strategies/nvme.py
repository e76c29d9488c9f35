"""NVMe offload (DeepSpeed ZeRO-Infinity), a plug-in of the states layer: ZeRO-Offload's placement
one level further down, with the states named ``nvme`` kept on the node's NVMe drives and swapped
through host memory around their use.

What DeepSpeed's stage 3 does with ``offload_optimizer`` / ``offload_param`` ``device: nvme``
(``deepspeed/runtime/zero/stage3.py``, ``deepspeed/runtime/swap_tensor/``), as modelled here:

* **optimizer state on NVMe**: the fp32 master weights and Adam's moments of the rank's slice (K
  bytes a parameter) live in swap files, with the fp32 gradient slice (4 bytes).  ``step()``
  swaps each sub-group's state and gradients in (``_optimizer_states_and_gradient_swap_in``), runs
  CPU Adam, and swaps the state out (``_optimizer_states_and_gradient_swap_out``), waiting on each
  swap (``pipeline_read`` / ``pipeline_write`` are off by default, ``offload_config.py``).  Charged:
  K + 4 bytes read and K written per parameter of the slice, on the host thread, before and after
  the CPU update.  The gradients' writes during backward overlap it and are not charged.
* **weights on NVMe**: the fp16 partition lives in swap files; each gather first swaps the rank's
  slice in (``partitioned_param_swapper.py``, a blocking read on the host) and copies it up, and
  after the update the new slice is swapped out (``_partitioned_params_swap_out``): the slice's
  bytes read per gather and written once per step.
* the node's drives serve its ranks together: each rank reads and writes at the node's rate
  divided by the ranks on it, as every rank swaps at the same moments of the step.

The node's read and write rates are measured figures (:data:`NVME`, docs/offload.md): DeepSpeed's
DeepNVMe ``ds_io`` benchmark, 4 PCIe Gen4 SSDs in RAID-0 read 10 GB/s and write 5 GB/s (Azure
NC96ads_A100_v4, DeepSpeed ``blogs/deepnvme/08-2024``); 8 PCIe Gen5 SSDs read 48 GB/s and write
26 GB/s (Azure ND-H200-v5, ``blogs/deepnvme/06-2025``).  A topology of A100 nodes is assumed to have
the first, of H100/H200/B200 nodes the second.  The drives' capacity is not checked.  What DeepSpeed
runs only in stage 3, the capabilities say (``PlacementRule.nvme``); anything else is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zero_sim.engine.program import Program, ProgramBuilder
from zero_sim.engine.run_types import RunOutput
from zero_sim.settings import ScenarioError
from zero_sim.strategies.capabilities import Capabilities
from zero_sim.strategies.offload import FP32, HostOffload, Offload, cpu_offload
from zero_sim.strategies.states import ModelStates
from zero_sim.system.host_side import Host
from zero_sim.system.topology import Topology
from zero_sim.vocabulary import CPU_ADAM, GRADS, OPTIMIZER, OPTIMIZER_STATE, PARAMS, wait

NVME_READ, NVME_WRITE = "nvme_read", "nvme_write"  # the host's blocking swaps, as op names


@dataclass(frozen=True)
class Nvme:
    """A node's NVMe drives: what its ranks together read and write, GB/s."""

    read_gbps: float
    write_gbps: float
    source: str


_GEN4_X4 = Nvme(10.0, 5.0, "DeepNVMe ds_io, 4 PCIe Gen4 SSDs in RAID-0 (Azure NC96ads_A100_v4; DeepSpeed "
                           "blogs/deepnvme/08-2024)")
_GEN5_X8 = Nvme(48.0, 26.0, "DeepNVMe ds_io, 8 PCIe Gen5 SSDs in RAID-0 (Azure ND-H200-v5; DeepSpeed "
                            "blogs/deepnvme/06-2025)")
_A100_NODES = ("dgx-a100", "p4d-efa", "p4de-efa", "azure-nd-a100-v4", "pcie", "pcie-host-bridge")
_H100_NODES = ("dgx-h100", "dgx-h200", "dgx-b200", "p5-efa", "p5e-efa", "gcp-a3", "gcp-a3-mega",
               "azure-nd-h100-v5", "ib-h100", "roce-100", "roce-200", "roce-400", "ib-400", "ib-800",
               "ib-1600", "ib-3200")
NVME: dict[str, Nvme] = (
    {name: replace(_GEN4_X4, source="assumed as " + _GEN4_X4.source) for name in _A100_NODES}
    | {name: replace(_GEN5_X8, source="assumed as " + _GEN5_X8.source) for name in _H100_NODES})


@dataclass(frozen=True)
class NvmeOffload(Offload):
    """ZeRO-Offload's placement with the optimizer state, the weights or both on NVMe."""

    optimizer_on_nvme: bool = False
    params_on_nvme: bool = False
    nvme: Nvme = _GEN5_X8
    ranks_per_node: int = 1
    optimizer_bytes: int = 12  # K: the optimizer state's bytes a parameter
    param_bytes: int = 2

    def read_s(self, nbytes: float) -> float:
        return nbytes * self.ranks_per_node / (self.nvme.read_gbps * 1e9)

    def write_s(self, nbytes: float) -> float:
        return nbytes * self.ranks_per_node / (self.nvme.write_gbps * 1e9)

    def place(self, states: ModelStates) -> ModelStates:
        """ZeRO-Offload's split, then what is named ``nvme`` moves from host memory to the drives."""
        states = super().place(states)
        host, nvme = dict(states.host), {}
        moved = ((OPTIMIZER_STATE, GRADS) if self.optimizer_on_nvme else ()) + (
            (PARAMS,) if self.params_on_nvme else ())
        for category in moved:
            nvme[category], host[category] = host[category], 0
        return replace(states, host=host, nvme=nvme)

    def moves(self, b: ProgramBuilder) -> NvmeMoves:
        return NvmeMoves(b, self)

    def placed(self) -> str:
        states = (("optimizer state", self.optimizer_on_nvme), ("weights", self.params_on_nvme))
        states = states[:2 if self.params else 1]
        nvme = " and ".join(what for what, there in states if there)
        host = " and ".join(what for what, there in states if not there)
        rates = (f"{self.nvme.read_gbps:g} GB/s read / {self.nvme.write_gbps:g} write per node shared by "
                 f"{self.ranks_per_node} rank(s)")
        return f"{nvme} on NVMe ({rates})" + (f", {host} in host memory" if host else "")

    def results(self, metrics: dict, program: Program, topo: Topology, run: RunOutput) -> None:
        """ZeRO-Offload's fields, then the bytes on each node's drives and the swaps' time in the
        last step of the first simulated rank."""
        super().results(metrics, program, topo, run)
        per_rank = sum(program.nvme_resident.values())
        metrics["memory"] |= {"nvme_bytes_per_rank": per_rank, "nvme_source": self.nvme.source,
                              "nvme_bytes_per_node": per_rank * topo.ranks_per_node}
        rank = run.simulated_ranks[0]
        metrics["nvme_swap_s"] = sum(r.end_s - r.start_s for r in run.records
                                     if r.name.startswith((NVME_READ, NVME_WRITE)) and r.rank == rank
                                     and r.step == len(run.step_ends[rank]) - 1)


class NvmeMoves(HostOffload):
    """ZeRO-Offload's copies and update, with the swaps of what lives on NVMe around them."""

    offload: NvmeOffload

    def params_up(self, target: str | int, elements: int, param_bytes: int, phase: str,
                  layer: int | None = None, deps: tuple[int, ...] = ()) -> int:
        """Weights on NVMe are swapped into host memory first (a blocking read), then copied up."""
        if self.offload.params_on_nvme:
            seconds = self.offload.read_s(elements * param_bytes)
            self.b.host(f"{NVME_READ} {target}", phase, seconds, layer=layer)
        return super().params_up(target, elements, param_bytes, phase, layer, deps)

    def update_on_cpu(self, params: int) -> None:
        """Wait for the gradients, swap the state and gradients in, update, swap the state (and the
        updated weights) out."""
        o = self.offload
        if self.down:
            self.b.sync(wait("gradients on host"), OPTIMIZER, tuple(self.down))
        if o.optimizer_on_nvme:
            self.b.host(f"{NVME_READ} optimizer", OPTIMIZER, o.read_s(params * (o.optimizer_bytes + FP32)))
        self.b.host(CPU_ADAM, OPTIMIZER, params * o.cpu_seconds_per_param)
        if o.optimizer_on_nvme:
            self.b.host(f"{NVME_WRITE} optimizer", OPTIMIZER, o.write_s(params * o.optimizer_bytes))
        if o.params_on_nvme:
            self.b.host(f"{NVME_WRITE} params", OPTIMIZER, o.write_s(params * o.param_bytes))


def nvme_offload(s, name: str, can: Capabilities, host: Host, topo: Topology, param_bytes: int,
                 optimizer_bytes: int) -> NvmeOffload:
    """The NVMe offload the settings ``s`` ask of strategy ``name``, or its refusal in one sentence."""
    if can.placement is None or not can.placement.nvme:
        raise ScenarioError(f"offloading to NVMe is DeepSpeed ZeRO-Infinity's, which swaps states only in "
                            f"stage 3; {name} cannot, so use --strategy zero3 or offload to cpu")
    nvme = NVME.get(topo.name)
    if nvme is None:
        raise ScenarioError(f"topology {topo.name!r} states no NVMe read and write rates; offload to cpu "
                            f"instead (docs/offload.md lists the topologies that have them)")
    cpu = cpu_offload(s, can, host, topo.ranks_per_node)
    return NvmeOffload(params=cpu.params, cpu_seconds_per_param=cpu.cpu_seconds_per_param,
                       optimizer_name=cpu.optimizer_name, optimizer_on_nvme=s.offload_optimizer == "nvme",
                       params_on_nvme=s.offload_params == "nvme", nvme=nvme,
                       ranks_per_node=topo.ranks_per_node, optimizer_bytes=optimizer_bytes,
                       param_bytes=param_bytes)
