"""The dtypes of a scenario's model states: the precision mode, and the two settings that change one.

A precision mode (:data:`~zero_sim.strategies.base.PRECISIONS`) gives the bytes of weights,
gradients and optimizer state, and for ``amp`` the dtype autocast computes in.  Trainers change
two of them apart from the mode, and so do these settings, for every strategy:

* ``--reduce-dtype``: what gradients travel in when reduced.  DeepSpeed's
  ``communication_data_type``, FSDP's ``MixedPrecision(reduce_dtype=...)``, torchtitan's
  ``mixed_precision_reduce``; by default what they are held in (FSDP: its ``param_dtype``).
* ``--grad-accum-dtype``: what gradients are held and accumulated in across micro-steps.
  Megatron-LM accumulates and all-reduces in fp32 whenever weights are bf16
  (``accumulate_allreduce_grads_in_fp32``, its ``main_grad`` buffers), nanotron with
  ``accumulate_grad_in_fp32``, DeepSpeed with ``data_types.grad_accum_dtype`` (its
  ``BF16_Optimizer``).  Gradients then travel in fp32 too unless ``--reduce-dtype`` says otherwise,
  as Megatron's do.

Beside fp32 gradients a framework may keep the two-byte ``.grad`` backward writes.  DeepSpeed's
``BF16_Optimizer`` does: it adds each bf16 gradient into its fp32 buffer and zeroes it rather than
freeing it, so a strategy of the DeepSpeed library that holds gradients whole holds both.  Megatron's
and nanotron's accumulation hooks add into the fp32 buffer and drop the ``.grad`` (Megatron's fused
accumulation writes straight into it), so under a PyTorch-library strategy, or a stack whose trainer
accumulates in such a hook (``megatron``, whose distributed optimizer ``zero1`` stands for), the copy
is a transient.
"""

from __future__ import annotations

from dataclasses import replace

from zero_sim.scenario.settings import CommonSettings
from zero_sim.settings import ScenarioError
from zero_sim.strategies import PRECISIONS
from zero_sim.strategies.base import DTYPE_BYTES, Precision, Strategy
from zero_sim.strategies.capabilities import DEEPSPEED
from zero_sim.system.optimizer_kernels import optimizer_kernels
from zero_sim.system.stacks import get_stack


def precision_of(s: CommonSettings, strategy: Strategy) -> Precision:
    """The precision mode's dtypes with ``--reduce-dtype``, ``--grad-accum-dtype`` and
    ``--optimizer-k`` applied; a gradient dtype narrower than the weights is refused."""
    precision = PRECISIONS[s.precision]
    if s.reduce_dtype is not None:
        precision = replace(precision, reduce_bytes=DTYPE_BYTES[s.reduce_dtype])
    if s.grad_accum_dtype is not None:
        held = DTYPE_BYTES[s.grad_accum_dtype]
        if held < precision.param_bytes:
            raise ScenarioError(f"--grad-accum-dtype {s.grad_accum_dtype} is narrower than the fp32 "
                                f"weights of --precision {s.precision}, whose gradients are fp32; use fp32 "
                                "or drop it")
        kept = (held > precision.param_bytes and strategy.can.library == DEEPSPEED
                and not get_stack(s.stack).hook_accumulates)
        precision = replace(precision, grad_bytes=held, grad_copy_bytes=precision.param_bytes if kept else 0)
    if s.optimizer_k is not None:
        precision = replace(precision, optimizer_bytes=int(s.optimizer_k))
    return precision


def _dtype(nbytes: int) -> str:
    return "fp32" if nbytes == 4 else "bf16"


def precision_note(s: CommonSettings, p: Precision) -> str | None:
    """The dtypes assumed, in one line, under ``amp`` or when a setting moves one off its mode's
    (the other modes' dtypes are their names'), and Adam run as a per-parameter loop."""
    dtypes, loop = _dtypes_note(s, p), optimizer_kernels(s.optimizer_impl)
    if not loop.kernels_per_tensor:  # a multi-tensor pass: the default, nothing to say
        return dtypes
    before = dtypes or f"precision {s.precision}"
    return (f"{before}; Adam as a per-parameter loop ({loop.kernels_per_tensor} kernels a tensor, "
            f"{loop.bytes_per_param:g} B of traffic a parameter)")


def _dtypes_note(s: CommonSettings, p: Precision) -> str | None:
    if p.compute_bytes is None and s.reduce_dtype is None and s.grad_accum_dtype is None:
        return None
    if p.compute_bytes is not None:
        weights = (f"{_dtype(p.param_bytes)} weights cast to {_dtype(p.compute_bytes)} by autocast before "
                   "each forward (one cast per weight, the copies freed after the layer)")
    else:
        weights = f"{_dtype(p.param_bytes)} weights"
    grads = f"gradients held in {_dtype(p.grad_bytes)}"
    if p.grad_copy_bytes:
        grads += (f" beside the {_dtype(p.grad_copy_bytes)} .grad backward writes (DeepSpeed's "
                  "BF16_Optimizer keeps both)")
    master = "fp32 master copy and Adam's moments" if p.param_bytes < 4 else "Adam's moments, no master copy"
    return (f"precision {s.precision}: {weights}; {grads}, reduced in {_dtype(p.travel_bytes)}; "
            f"{master} ({p.optimizer_bytes} B a parameter)")
