"""Offloading: model states kept in host memory, the update run on the CPU, and the copies between.

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

A copy is an op on a copy stream (``d2h``, ``h2d``) whose bytes cross the GPU's host link
(:mod:`zero_sim.system.host_side`); the CPU's update is host work, during which the rank's host
thread issues nothing and its GPU idles.  Transient pinned staging buffers are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from zero_sim.engine.program import ProgramBuilder
from zero_sim.vocabulary import (
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


@dataclass(frozen=True)
class Offload:
    """What a strategy keeps in host memory, and how fast the host updates it."""

    params: bool  # the weight partition too (ZeRO-3 offload_param, FSDP2 CPUOffloadPolicy)
    cpu_seconds_per_param: float  # the CPU optimizer on this rank's share of the node's cores
    optimizer_name: str  # what runs on the CPU, in words
    fsdp2: bool = False  # FSDP2's policy: fp32 shards copied both ways, no fp16 copy of the weights


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


def split_states(states: dict[str, int], offload: Offload, stage: int, optimizer_bytes: int,
                 persistent_param_bytes: int = 0) -> tuple[dict[str, int], dict[str, int]]:
    """Model states per rank as (on the GPU, in host memory).  The optimizer state moves to the host
    with an fp32 buffer of the rank's gradient slice; from stage 2 the GPU keeps no gradient slice.
    Offloaded weights leave only the persistent (never sharded) tensors on the GPU; DeepSpeed keeps an
    fp16 copy of the partition on the host, FSDP2's fp32 shards are the master weights already
    counted in the optimizer state."""
    gpu, host = dict(states), {PARAMS: 0, GRADS: 0, OPTIMIZER_STATE: 0}
    trainable_slice = states.get(OPTIMIZER_STATE, 0) // optimizer_bytes if optimizer_bytes else 0
    host[OPTIMIZER_STATE] = gpu.get(OPTIMIZER_STATE, 0)
    host[GRADS] = FP32 * trainable_slice
    gpu[OPTIMIZER_STATE] = 0
    if stage >= 2:
        gpu[GRADS] = 0
    if offload.params:
        sharded = gpu.get(PARAMS, 0) - persistent_param_bytes
        host[PARAMS] = 0 if offload.fsdp2 else sharded
        gpu[PARAMS] = persistent_param_bytes
    return gpu, host
