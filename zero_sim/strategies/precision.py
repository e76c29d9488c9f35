"""The dtype of each model state under a precision mode, written once for every strategy.

A strategy never asks which mode runs: it reads the bytes of an element of each state from
:class:`Precision` (weights, gradients as held, what gradients travel in, the dtype autocast computes
in) and the layer of states (:mod:`zero_sim.strategies.states`) holds them at those widths.

=======  ========  ==============  ================  ======================================
mode     weights   gradients       optimizer (K)     what runs
=======  ========  ==============  ================  ======================================
mixed    bf16 (2)  bf16 (2)        12: fp32 master,  bf16 weights; the ZeRO paper's setting
                                   Adam m, v
fp32     fp32 (4)  fp32 (4)        8: Adam m, v      everything in fp32 (the CPU runs)
fp8      bf16 (2)  bf16 (2)        12                mixed, the blocks' GEMMs in float8
amp      fp32 (4)  fp32 (4)        8: Adam m, v      torch.autocast: fp32 weights cast to bf16
                                                     by each op that uses them, every forward
=======  ========  ==============  ================  ======================================

Under ``amp`` the weights *are* the fp32 copy Adam updates, so there is no master copy, and the
gradients of fp32 leaves are fp32: DDP reduces twice the bytes of ``mixed``
(torch.amp's autocast docs: ops on the lower-precision list cast their fp32 inputs, parameters
included, and the autograd graph's leaves keep their dtype).
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}  # bytes an element of each dtype a setting may name


@dataclass(frozen=True)
class Precision:
    """The dtype of each model state, set once here and read by every strategy.

    ``grad_bytes`` is the gradients as a rank holds and accumulates them across micro-steps;
    ``reduce_bytes`` what they travel in when reduced (None: as held); ``compute_bytes`` the dtype
    autocast casts the weights to for each forward (None: weights compute as held, no casts);
    ``grad_copy_bytes`` a copy of the gradients in the weights' dtype that the framework keeps
    beside gradients accumulated in fp32 (DeepSpeed's bf16 optimizer keeps the bf16 ``.grad``)."""

    name: str
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int  # K: bytes of optimizer state per parameter (fp32 master + Adam m, v)
    reduce_bytes: int | None = None
    compute_bytes: int | None = None
    grad_copy_bytes: int = 0

    @property
    def travel_bytes(self) -> int:
        """Bytes a gradient element is reduced in: ``--reduce-dtype``, else the gradients' own."""
        return self.grad_bytes if self.reduce_bytes is None else self.reduce_bytes


PRECISIONS = {
    "mixed": Precision("mixed", 2, 2, 12),  # bf16 weights and grads, fp32 master/m/v (ZeRO paper)
    "fp32": Precision("fp32", 4, 4, 8),  # fp32 everything, Adam m and v (what CPU runs use)
    # bf16 mixed precision with the blocks' linear GEMMs in float8 (zero_sim.system.fp8): the weights,
    # gradients and optimizer state are mixed precision's (torchao keeps bf16/fp32 parameters and
    # casts to float8 per GEMM).
    "fp8": Precision("fp8", 2, 2, 12),
    # torch.autocast (torch.amp): fp32 weights cast to bf16 by the op that uses them, every forward;
    # gradients of fp32 leaves are fp32 and DDP reduces them as they are (twice mixed's bytes); Adam
    # updates the fp32 weights in place, so no master copy: K = 8 (m, v).
    "amp": Precision("amp", 4, 4, 8, compute_bytes=2),
}
