"""torch's own DistributedDataParallel, as the yardstick for ``ddp``.

Communication phases are DDP's (see ``ddp.py``): bucketed all-reduce launched from
autograd hooks during backward, in reverse parameter order, waited for before the
optimizer runs.  Two settings keep the comparison honest:

- ``gradient_as_bucket_view=True``: gradients live in DDP's buckets, as in ``ddp``, so
  neither implementation pays for copying gradients in and out of buckets;
- a communication hook that launches the same averaged all-reduce torch would, through
  :meth:`Strategy.all_reduce`, so each bucket shows up in the record as
  ``all_reduce B<k>`` with torch's own bucket index.

The optimizer is ``torch.optim.AdamW`` over all parameters.
Per-rank model states (fp32): 16Ψ.
"""

from __future__ import annotations

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
        self.opt = self.hp.torch_optimizer(self.model.parameters())

    def _comm_hook(self, _state, bucket):  # DDP insists on no return annotation or an exact one
        pending = self.all_reduce(bucket.buffer(), bucket_collective(ALL_REDUCE, bucket.index()))
        return pending.work.get_future().then(lambda fut: fut.value()[0])

    def forward(self, x, y):
        return self.ddp(x, y)

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=False)  # keep the gradients inside DDP's buckets

    def step(self) -> None:
        with self.rec.span(opt("all")):
            self.opt.step()

    def full_optimizer_state(self):
        return {self.names[p]: (s["exp_avg"].clone(), s["exp_avg_sq"].clone())
                for p, s in self.opt.state.items()}

    def model_state_bytes(self) -> dict[str, int]:
        params = list(self.model.parameters())
        return model_state_bytes(
            params=sum(p.nbytes for p in params),
            grads=sum(p.grad.nbytes for p in params if p.grad is not None),
            optimizer=optimizer_moment_bytes(self.opt),
        )
