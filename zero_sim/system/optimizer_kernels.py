"""How Adam's update runs on the GPU: one multi-tensor pass, or a Python loop per parameter tensor.

The update's time is its HBM traffic at the stream-copy fraction of bandwidth
(:meth:`zero_sim.system.hardware.ComputeModel.optimizer_time`), and the host's to launch its
kernels.  How many bytes and launches depends on how the optimizer is written:

* ``"fused"`` (the default): a fused or multi-tensor (``foreach``) Adam, what DeepSpeed's
  FusedAdam, apex's and torch's ``AdamW`` run (``foreach`` is torch's default since 2.0).  Each
  state is read and written once: the bf16 gradient and the fp32 master, momentum and variance
  read, the last three and the bf16 weights written, ``2 + 12 + 12 + 2 = 28`` bytes a parameter
  (the same under AMP: an fp32 gradient read, no bf16 copy written); its few launches for the
  whole step are not counted.
* ``"per-param"``: a Python loop over the parameters, each tensor's update as separate
  kernels, as transformers' own ``AdamW`` (the Trainer's default optimizer, ``adamw_hf``, in
  2020-22) and ``torch.optim`` before ``foreach`` ran it.  Per element, fp32 (transformers
  v4.12's ``AdamW.step``): ``exp_avg.mul_(beta1)`` (read 4, write 4), ``.add_(grad)`` (4 + 4 + 4),
  ``exp_avg_sq.mul_(beta2)`` (4 + 4), ``.addcmul_(grad, grad)`` (4 + 4 + 4 + 4, the gradient read
  twice), ``denom = exp_avg_sq.sqrt()`` (4 + 4), ``.add_(eps)`` (4 + 4), ``p.addcdiv_(exp_avg,
  denom)`` (4 + 4 + 4 + 4): ``76`` bytes and ``7`` launches a tensor (weight decay, the Trainer's
  default 0, adds none).

Outside both, as for every stack: gradient clipping, zeroing the gradients and the AMP
scaler's unscale (each a pass over the gradients), and the loss scale's checks.
"""

from __future__ import annotations

from dataclasses import dataclass

OPTIMIZER_IMPLS = ("fused", "per-param")
DEFAULT_OPTIMIZER_IMPL = "fused"


@dataclass(frozen=True)
class OptimizerKernels:
    """One way of running Adam: its HBM bytes per updated parameter and launches per tensor."""

    bytes_per_param: float
    kernels_per_tensor: int  # 0: a multi-tensor pass, whose few launches are not counted


OPTIMIZER_KERNELS = {
    "fused": OptimizerKernels(28, 0),
    # mul_ 8, add_ 12, mul_ 8, addcmul_ 16, sqrt 8, add_ 8, addcdiv_ 16 (module docstring)
    "per-param": OptimizerKernels(8 + 12 + 8 + 16 + 8 + 8 + 16, 7),
}


def optimizer_kernels(impl: str | None) -> OptimizerKernels:
    """The kernels of ``impl`` (None: the default, fused)."""
    return OPTIMIZER_KERNELS[impl or DEFAULT_OPTIMIZER_IMPL]
