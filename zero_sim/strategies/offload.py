"""Offloading, a plug-in of the states layer: a placement that keeps model states in host memory,
the copies between the GPU and the host, the update run on the CPU, and what the result says.

Two libraries, one shape (``docs/offload.md``):

* **ZeRO-Offload** (DeepSpeed ``offload_optimizer``, stages 1-3; Ren et al. 2021, "ZeRO-Offload:
  Democratizing Billion-Scale Model Training"): the fp32 master weights and Adam's moments live in
  host memory, with an fp32 copy of the rank's gradient slice (``stage_1_and_2.py`` and ``stage3.py``
  keep the partition's gradients in fp32 CPU buffers).  Each reduced gradient slice is copied down
  as soon as its reduction lands, so the copies overlap the rest of backward; ``step()`` waits for
  them, runs DeepSpeed's CPU Adam over the slice, and copies the updated fp16/bf16 slice up (stages
  1-2 then all-gather it as before; stage 3's next forward gathers it).  The paper's traffic: 2
  bytes down and 2 up per parameter of the slice.  With ``offload_param`` (stage 3) the weight
  partition lives on the host too: each all-gather first copies the rank's slice up, and the CPU
  update writes the weights in place, so nothing is copied up after the step.
* **FSDP2's** ``CPUOffloadPolicy`` (``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``): the
  sharded parameters (fp32, the master copy), their gradients and the optimizer state live on the
  host; each all-gather copies the unit's fp32 shard up first, each reduce-scatter's output is
  copied down, and ``optimizer.step()`` is ``torch.optim.AdamW`` on CPU tensors.

What a strategy may offload is its capability (``Strategy.can.placement``, capabilities.py); a
combination outside it is refused with one sentence, never silently ignored.  A copy is an op on a
copy stream (``d2h``, ``h2d``) whose bytes cross the GPU's host link (:mod:`zero_sim.system.host_side`);
the CPU's update is host work, during which the rank's host thread issues nothing and its GPU idles.
Transient pinned staging buffers are not counted.  The node's RAM is checked after the program is
built (:meth:`Offload.results`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zero_sim.engine.program import Program, ProgramBuilder
from zero_sim.engine.run_types import RunOutput
from zero_sim.settings import ScenarioError
from zero_sim.strategies.base import Context
from zero_sim.strategies.capabilities import PYTORCH, Capabilities
from zero_sim.strategies.states import HOST, HostMoves, ModelStates, shard
from zero_sim.strategies.transfers import Bucket, Key, Update, WeightTransfers
from zero_sim.system.host_side import CPU_ADAM_RATE, TORCH_CPU_ADAM_RATE, Host, cpu_adam_seconds, host_for
from zero_sim.system.topology import Topology
from zero_sim.vocabulary import (
    BACKWARD,
    CPU_ADAM,
    D2H,
    GRADS,
    H2D,
    OPTIMIZER,
    OPTIMIZER_STATE,
    PARAMS,
    host_copy,
    wait,
)

FP32 = 4  # bytes: the host's gradient buffers, and FSDP2's sharded parameters and gradients
HOST_FLAGS = ("host_memory_gb", "host_cores", "host_link_gbps", "cpu_adam_rate")


@dataclass(frozen=True)
class Offload:
    """What a strategy keeps in host memory, and how fast the host updates it."""

    params: bool  # the weight partition too (ZeRO-3 offload_param, FSDP2 CPUOffloadPolicy)
    cpu_seconds_per_param: float  # the CPU optimizer on this rank's share of the node's cores
    optimizer_name: str  # what runs on the CPU, in words
    fsdp2: bool = False  # FSDP2's policy: fp32 shards copied both ways, no fp16 copy of the weights

    def place(self, states: ModelStates) -> ModelStates:
        """Model states per rank as (on the GPU, in host memory).  The optimizer state moves to the
        host with an fp32 buffer of the rank's gradient slice; a stage that shards gradients keeps no
        gradient slice on the GPU.  Offloaded weights leave only the persistent (never sharded) tensors
        on the GPU; DeepSpeed keeps an fp16 copy of the partition on the host, FSDP2's fp32 shards are
        the master weights already counted in the optimizer state."""
        opt, grads, weights = states.optimizer, states.grads, states.weights
        slice_elements = opt.elements if opt.dtype_bytes else 0
        host = {PARAMS: 0, GRADS: FP32 * slice_elements, OPTIMIZER_STATE: opt.nbytes}
        grads = replace(grads, device=HOST) if grads.is_sharded else grads
        if self.params:
            host[PARAMS] = 0 if self.fsdp2 else weights.dtype_bytes * weights.sharded_elements
            weights = replace(weights, device=HOST)
        return replace(states, weights=weights, grads=grads, optimizer=replace(opt, device=HOST), host=host)

    def moves(self, b: ProgramBuilder) -> HostOffload:
        """The copies and the CPU update of one build."""
        return HostOffload(b, self)

    def placed(self) -> str:
        """Which states live where, in words."""
        return ("optimizer state and weights" if self.params else "optimizer state") + " in host memory"

    def describe(self, topo: Topology) -> str:
        """The offload as simulated, in one line for the summary."""
        host = topo.host
        return (f"{self.placed()}, updated by {self.optimizer_name}; host link "
                f"{host.d2h_gbps:g} GB/s down / {host.h2d_gbps:g} up per {host.gpus_per_link} GPU(s) "
                f"(docs/offload.md)")

    def results(self, metrics: dict, program: Program, topo: Topology, run: RunOutput) -> None:
        """The result's offload fields: where the states live, what updates them, whether the nodes'
        RAM holds them, and the CPU update's time in the last step."""
        metrics["offload"] = self.describe(topo)
        host = host_memory(program.host_resident, topo.host, topo.ranks_per_node)
        metrics["memory"] |= host
        metrics["memory"]["fits"] = metrics["memory"]["fits"] and host.get("host_fits", True)
        metrics["cpu_update_s"] = sum(r.end_s - r.start_s for r in run.records
                                      if r.name == CPU_ADAM and r.rank == run.simulated_ranks[0]
                                      and r.step == len(run.step_ends[r.rank]) - 1)


class HostOffload:
    """One step's copies and CPU update; built by a strategy whose context offloads."""

    def __init__(self, b: ProgramBuilder, offload: Offload):
        self.b, self.offload = b, offload
        self.down: list[int] = []  # every gradient copy to the host so far: what the update waits for

    @property
    def params(self) -> bool:
        return self.offload.params

    def grads_down(self, target: str | int, elements: int, grad_bytes: int, deps: tuple[int, ...],
                   phase: str, layer: int | None = None) -> int:
        """Copy a reduced gradient slice of ``elements`` to the host once ``deps`` (its reduction) land."""
        size = elements * (FP32 if self.offload.fsdp2 else grad_bytes)
        op = self.b.copy(host_copy(D2H, target), phase, size, D2H, layer=layer, deps=deps)
        self.down.append(op)
        return op

    def params_up(self, target: str | int, elements: int, param_bytes: int, phase: str,
                  layer: int | None = None, deps: tuple[int, ...] = ()) -> int:
        """Copy a weight slice of ``elements`` from the host (fp32 shards under FSDP2)."""
        size = elements * (FP32 if self.offload.fsdp2 else param_bytes)
        return self.b.copy(host_copy(H2D, target), phase, size, H2D, layer=layer, deps=deps)

    def update_on_cpu(self, params: int) -> None:
        """``step()`` on the host: wait for every gradient copy, then the CPU optimizer over ``params``."""
        if self.down:
            self.b.sync(wait("gradients on host"), OPTIMIZER, tuple(self.down))
        self.b.host(CPU_ADAM, OPTIMIZER, params * self.offload.cpu_seconds_per_param)


class OffloadedTransfers(WeightTransfers):
    """ZeRO-3 with ZeRO-Offload: each reduced gradient slice is copied down as it lands, each gather
    of weights that live on the host (``offload_param``) copies the rank's slice up first, and the
    CPU updates the slice; the updated weights are copied up unless they live on the host."""

    @classmethod
    def applies(cls, ctx: Context) -> bool:
        return ctx.offload is not None

    @property
    def host(self) -> HostMoves:
        assert self.s.host is not None, "built only for a context that offloads"
        return self.s.host

    def before_gather(self, keys: list[Key], phase: str) -> tuple[int, ...]:
        if not self.host.params:
            return ()
        elements = sum(shard(self.s.size[key], self.s.n) for key in keys)
        return (self.host.params_up(keys[0][0], elements, self.s.p.param_bytes, phase, layer=keys[0][0],
                                    deps=self.s.room),)

    def reduce(self, bucket: Bucket, index: int, layer: int, sizes: list[int],
               after_compute: bool) -> list[int]:
        ops = super().reduce(bucket, index, layer, sizes, after_compute)
        return [self.host.grads_down(f"B{index}", shard(size, self.s.n), self.s.p.grad_bytes, (op,),
                                     BACKWARD, layer) for op, size in zip(ops, sizes, strict=True)]

    def optimizer(self, reduces: tuple[int, ...], update: Update) -> None:
        s = self.s
        self.host.update_on_cpu(shard(s.w.trainable_params, s.n))
        if not self.host.params:
            sliced = shard(s.w.params - s.persistent, s.n)
            up = self.host.params_up("params", sliced, s.p.param_bytes, OPTIMIZER)
            s.b.sync(wait(s.b.program.ops[up].name), OPTIMIZER, (up,))


def refuse(s, name: str, can: Capabilities, zeropp_on: bool) -> None:
    """The first offload the settings ``s`` ask of strategy ``name`` that its capabilities ``can``
    do not hold, as one sentence."""
    optimizer, params = s.offload_optimizer != "none", s.offload_params != "none"
    rule = can.placement
    if rule is None:
        raise ScenarioError(can.cannot_place)
    if rule.params == "never" and params:
        raise ScenarioError(f"{name} holds whole weights on every GPU, so they cannot be offloaded; "
                            "use --strategy zero3 (DeepSpeed offload_param) or fsdp (CPUOffloadPolicy)")
    if rule.params == "with_optimizer" and params and not optimizer:
        raise ScenarioError("offloading the weights alone is not modelled; offload the optimizer with them "
                            "(--offload-optimizer cpu), as ZeRO-Infinity's examples do")
    if rule.params == "required" and not params:
        raise ScenarioError("FSDP2's CPUOffloadPolicy offloads parameters, gradients and optimizer state "
                            "together; give --offload-params cpu")
    if zeropp_on:
        raise ScenarioError("ZeRO++ with states offloaded to the host is not modelled; drop the ZeRO++ "
                            "switches or the offload")
    if s.fp8_all_gather:
        raise ScenarioError("the float8 all-gather with weights offloaded to the host is not modelled; drop "
                            "--fp8-all-gather or the offload")


def host_side(s, topo: Topology) -> Host:
    """The node's host side from the topology preset or the ``--host-*`` flags."""
    host = host_for(topo.name, topo.ranks_per_node, s.host_memory_gb, s.host_cores, s.host_link_gbps)
    if host is None:
        raise ScenarioError(f"topology {topo.name!r} states no host side to offload to; give "
                            "--host-memory-gb, --host-cores and --host-link-gbps (a PCIe Gen4 x16 link "
                            "moves about 25 GB/s)")
    return host


def cpu_offload(s, can: Capabilities, host: Host, ranks_per_node: int) -> Offload:
    """The offload to host memory the strategy's library runs, its CPU optimizer on the rank's cores."""
    fsdp2 = can.library == PYTORCH
    rate = s.cpu_adam_rate or (TORCH_CPU_ADAM_RATE if fsdp2 else CPU_ADAM_RATE)
    name = "torch.optim.AdamW on CPU tensors" if fsdp2 else "DeepSpeed's CPU Adam"
    cores = host.cores / ranks_per_node
    return Offload(params=s.offload_params != "none", cpu_seconds_per_param=cpu_adam_seconds(1, cores, rate),
                   optimizer_name=f"{name}, {rate:.1f} M params/s per core x {cores:g} cores per rank",
                   fsdp2=fsdp2)


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
