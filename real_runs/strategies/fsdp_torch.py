"""torch's FSDP2 (``fully_shard``), as the yardstick for ``fsdp``.

Each transformer block is its own FSDP unit and the root unit holds the rest (the
embeddings and the head).  A unit is what FSDP gathers and reduces in one collective.

Communication phases, all run by FSDP inside torch:

1. **forward**: before each unit computes, all-gather its parameters (the next unit's
   gather is prefetched), and free them after (``reshard_after_forward``).  The root's
   parameters stay gathered until backward: its backward starts first.
2. **backward**: all-gather each block again before its backward, prefetching the one
   before it; when a block's gradients are done, reduce-scatter them (average) into
   this rank's gradient shard and free the full parameters.
3. **optimizer**: ``torch.optim.AdamW`` on the local shards (DTensors).

On CPU the unit gets an explicit CPU device mesh so FSDP runs on gloo.  FSDP's
collectives are internal to torch, so the record holds compute ops only; the
``--trace`` profiler trace shows the collectives.

In bf16, FSDP2's own mixed precision (``MixedPrecisionPolicy``, bf16 parameters and
bf16 reduce-scatters): the sharded parameters stay fp32 and are Adam's master weights;
each unit is gathered and computes in bf16, and its reduced gradient lands in an fp32
shard.  Per-rank model states: fp32 16Ψ/N; bf16 the same 16Ψ/N, split as params 4Ψ/N
(the fp32 masters), grads 4Ψ/N and Adam 8Ψ/N, where the formula's split is 2 + 2 + 12.
"""

from __future__ import annotations

import torch

from zero_sim.vocabulary import opt

from .base import Strategy, model_state_bytes, optimizer_moment_bytes


class FSDPTorch(Strategy):
    name = "fsdp-torch"
    stage = 3
    casts_model = False  # FSDP2 applies bf16 itself and keeps fp32 shards

    def setup(self) -> None:
        # Imported here, not at the top: torch's FSDP brings DTensor with it, seconds of
        # imports on a small machine that every rank of every other strategy would pay.
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        device = next(self.model.parameters()).device
        mesh = init_device_mesh(device.type, (self.world,))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) \
            if self.precision == "bf16" else MixedPrecisionPolicy()
        for block in self.layers[1:-1]:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(self.model, mesh=mesh, mp_policy=policy)
        # FSDP2 shards per parameter: frozen ones (LoRA) are gathered, never reduced; Adam holds what trains.
        self.opt = self.hp.torch_optimizer([p for p in self.model.parameters() if p.requires_grad])
        # fully_shard swapped in DTensor parameters; index them afresh.
        self.names = {p: n for n, p in self.model.named_parameters()}
        self.layer_of = {p: i for i, layer in enumerate(self.layers) for p in layer.parameters()}

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)

    def step(self) -> None:
        with self.rec.span(opt("all")):
            self.opt.step()

    def full_params(self):
        return {n: p.detach().full_tensor() for n, p in self.model.named_parameters()}

    def full_optimizer_state(self):
        return {self.names[p]: (s["exp_avg"].full_tensor(), s["exp_avg_sq"].full_tensor())
                for p, s in self.opt.state.items()}

    def model_state_bytes(self) -> dict[str, int]:
        params = list(self.model.parameters())
        return model_state_bytes(
            params=sum(p.to_local().nbytes for p in params),
            grads=sum(p.grad.to_local().nbytes for p in params if p.grad is not None),
            optimizer=optimizer_moment_bytes(self.opt),
        )
