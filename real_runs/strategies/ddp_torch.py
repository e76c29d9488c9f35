"""torch's own DistributedDataParallel, as the yardstick for ``ddp``.

Communication phases are DDP's (see ``ddp.py``): bucketed all-reduce launched from
autograd hooks during backward, in reverse parameter order, waited for before the
optimizer runs.  Two settings keep the comparison honest:

- ``gradient_as_bucket_view=True``: gradients live in DDP's buckets, as in ``ddp``, so
  neither implementation pays for copying gradients in and out of buckets;
- a communication hook that launches the same averaged all-reduce torch would, through
  :meth:`Strategy.all_reduce`, so each bucket shows up in the record as
  ``all_reduce B<k>`` with torch's own bucket index.

The optimizer is ``torch.optim.AdamW`` over all parameters.  In bf16 it runs on fp32
master copies of the weights: each step reads the bf16 gradients into them, updates, and
rounds the masters back into the bf16 weights DDP computes with.
Per-rank model states: fp32 16Ψ; bf16 2Ψ + 2Ψ + 12Ψ (master 4Ψ and Adam 8Ψ).
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from zero_sim.vocabulary import ALL_REDUCE, bucket_collective, opt

from .base import Strategy, model_state_bytes, optimizer_moment_bytes


class DDPTorch(Strategy):
    name = "ddp-torch"
    stage = 0

    def setup(self) -> None:
        device = next(self.model.parameters()).device
        self.ddp = DistributedDataParallel(
            self.model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=self.bucket_bytes / 2**20,
            gradient_as_bucket_view=True,
        )
        self.ddp.register_comm_hook(None, self._comm_hook)
        params = self.trainable  # torch's DDP reduces, and Adam updates, what trains (LoRA: the adapters)
        # bf16: Adam updates fp32 masters (module docstring); fp32: the parameters themselves.
        self.masters = [p.detach().float().requires_grad_() for p in params] \
            if params[0].dtype != torch.float32 else None
        self.opt = self.hp.torch_optimizer(self.masters or params)
        if self.masters:
            self.names.update({m: self.names[p] for m, p in zip(self.masters, params, strict=True)})

    def _comm_hook(self, _state, bucket):  # DDP insists on no return annotation or an exact one
        pending = self.all_reduce(bucket.buffer(), bucket_collective(ALL_REDUCE, bucket.index()))
        return pending.work.get_future().then(lambda fut: fut.value()[0])

    def forward(self, x, y):
        return self.ddp(x, y)

    def zero_grad(self) -> None:
        # Zeroed in place, to keep the gradients inside DDP's buckets.  Not through the
        # optimizer: in bf16 it holds the fp32 masters, whose gradients are not these.
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.zero_()

    def step(self) -> None:
        with self.rec.span(opt("all")):
            if self.masters is None:
                self.opt.step()
                return
            params = self.trainable
            for m, p in zip(self.masters, params, strict=True):
                m.grad = p.grad.float()
            self.opt.step()
            with torch.no_grad():
                for m, p in zip(self.masters, params, strict=True):
                    p.copy_(m)
                    m.grad = None

    def full_optimizer_state(self):
        return {self.names[p]: (s["exp_avg"].clone(), s["exp_avg_sq"].clone())
                for p, s in self.opt.state.items()}

    def model_state_bytes(self) -> dict[str, int]:
        params = list(self.model.parameters())
        return model_state_bytes(
            params=sum(p.nbytes for p in params),
            grads=sum(p.grad.nbytes for p in params if p.grad is not None),
            optimizer=optimizer_moment_bytes(self.opt) + sum(m.nbytes for m in self.masters or ()),
        )
