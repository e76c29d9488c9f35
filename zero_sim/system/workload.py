"""What is being trained: a model as an ordered list of layers, each with its tensors,
its FLOPs, the kinds of work it does and the activation bytes it saves for backward.

Why layers, not modules or kernels: every strategy communicates at layer granularity
(a DDP bucket fills as layers finish backward; ZeRO-3 and FSDP gather one layer's
parameters at a time), and a layer is the unit a person can recognise on a timeline.

The model of a GPT-style transformer (its shape, tensors, FLOPs, memory-bound bytes and
activations: every assumption in one place) is :mod:`zero_sim.system.gpt_layers`, which builds
its workload.

A workload can also be read off any ``torch.nn.Module`` on the meta device
(``sim2real.module_workload``): parameter sizes per child module, FLOPs from torch's
flop counter, saved-activation bytes from autograd's saved-tensor hooks; its layers have
no :class:`Work` breakdown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zero_sim.system.activations import RECOMPUTE_MODES, block_activation_bytes
from zero_sim.system.elementwise import DEFAULT_ELEMENTWISE, ELEMENTWISE_BYTES, ELEMENTWISE_IMPLS

# flash: FlashAttention-2 or later / torch SDPA's flash backend; flash1: FlashAttention v1 or its Triton
# port (2022-23 code, e.g. llm-foundry's attn_impl "triton"), the same memory, about 0.41 of FA2's rate;
# cudnn: cuDNN's fused attention, what Transformer Engine runs (the same memory as flash, faster on
# Hopper: zero_sim.system.hardware); eager: softmax(QK^T)V in torch ops.
ATTENTION_IMPLS = ("flash", "flash1", "cudnn", "eager")
# FlashAttention (Dao et al. 2022) is what torch's scaled_dot_product_attention runs for bf16 on
# Ampere and newer GPUs, the setting of every preset here: it is the default.
DEFAULT_ATTENTION = "flash"
MLP_KINDS = ("gelu", "gelu_tanh", "relu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rotary", "alibi", "relative")
RELATIVE_BUCKETS = 32  # T5's relative position buckets, one bias per bucket per head per stack


class WorkloadError(ValueError):
    """A model description that cannot be simulated; the message says how to fix it."""


@dataclass(frozen=True)
class Tensor:
    name: str
    numel: int
    # False for a frozen weight (fine-tuning with adapters, zero_sim.system.lora): it is read and
    # gathered like any other, but has no gradient, no optimizer state and no update.
    trainable: bool = True
    # Bits a stored element takes when the weight is kept quantized (QLoRA's 4-bit base, 4.127 with
    # its block constants); 0: the precision's bytes per weight.
    bits: float = 0.0

    def stored_bytes(self, param_bytes: int) -> float:
        return self.numel * self.bits / 8 if self.bits else self.numel * param_bytes


@dataclass(frozen=True)
class Work:
    """Forward work of one layer on one micro-batch, split by the kind of kernel that does it."""

    matmul_flops: float = 0.0  # dense GEMMs (QKV/O projections, MLP, LM head)
    attention_flops: float = 0.0  # attention core: QK^T and scores·V (causal masking not halved)
    memory_bytes: float = 0.0  # HBM traffic of memory-bound ops (norms, activations, residuals, rotary,
    #                            embedding lookup, loss; with eager attention also softmax over s*s scores)
    tokens: int = 0  # tokens per micro-batch = M of the layer's GEMMs
    width: int = 0  # hidden size d_model (K of most GEMMs)
    seq_len: int = 0
    heads: int = 0
    head_dim: int = 0
    attention: str = DEFAULT_ATTENTION  # "flash" (FA2 / SDPA), "flash1" (FA1), "cudnn" (TE) or "eager"
    # GEMM FLOPs op-level checkpointing re-runs in backward: the projections whose outputs it drops.
    unsaved_matmul_flops: float = 0.0
    causal: bool = True  # a causal mask: flash attention computes only the unmasked half
    # GEMM FLOPs whose weights are frozen: their backward computes the input's gradient only (one
    # GEMM, not two), as autograd skips a weight gradient nobody asked for.
    frozen_matmul_flops: float = 0.0
    # HBM traffic of dequantizing quantized weights to bf16 before their GEMMs (QLoRA): paid once in
    # forward and once in backward (the input gradient's GEMM needs the weight again).
    dequantize_bytes: float = 0.0
    # HBM traffic of memory-bound kernels counted op by op in each direction, outside the backward-
    # over-forward rule (Hugging Face's separate attention-score kernels and gelu_new chain:
    # zero_sim.system.elementwise.HF_EXTRA_BYTES).
    listed_bytes_fwd: float = 0.0
    listed_bytes_bwd: float = 0.0


@dataclass(frozen=True)
class Layer:
    """One layer: its tensors, forward FLOPs and saved-activation bytes per micro-batch."""

    index: int
    kind: str  # "embedding" | "block" | "head" | "module"
    tensors: tuple[Tensor, ...]
    fwd_flops: float  # model FLOPs: matmul + attention
    activation_bytes: int  # saved for backward with no recompute
    checkpointed_activation_bytes: int  # saved under the workload's recompute mode
    reads_layer: int | None = None  # another layer whose weights this one also uses (tied embeddings)
    work: Work | None = None  # the forward's split by kernel kind (None for layers read off a module)

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def trainable_numel(self) -> int:
        return sum(t.numel for t in self.tensors if t.trainable)

    @property
    def bwd_flops(self) -> float:
        """Input and weight gradients: twice the forward, less the weight gradients of frozen GEMMs."""
        return 2.0 * self.fwd_flops - (self.work.frozen_matmul_flops if self.work is not None else 0.0)


@dataclass(frozen=True)
class Workload:
    """A model at a given sequence length and micro-batch (sequences per rank per micro-step)."""

    name: str
    layers: tuple[Layer, ...]
    seq_len: int
    micro_batch: int
    recompute: str = "none"
    shape: Any = field(default=None, compare=False)  # the GPTShape it was built from (gpt_layers), or None
    attention: str | None = field(default=None, compare=False)  # None for a workload read off a module
    elementwise: str | None = field(default=None, compare=False)  # None for a workload read off a module

    @property
    def params(self) -> int:
        return sum(layer.numel for layer in self.layers)

    @property
    def trainable_params(self) -> int:
        return sum(layer.trainable_numel for layer in self.layers)

    def weight_bytes(self, param_bytes: int, trainable: bool | None = None) -> float:
        """Bytes of the stored weights at ``param_bytes`` each, quantized ones at their own bits; only
        the trainable (or only the frozen) ones when ``trainable`` says which."""
        return sum(t.stored_bytes(param_bytes) for layer in self.layers for t in layer.tensors
                   if trainable is None or t.trainable == trainable)

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.seq_len * self.micro_batch

    @property
    def fwd_flops(self) -> float:
        return sum(layer.fwd_flops for layer in self.layers)

    def model_flops(self) -> float:
        """FLOPs of one forward+backward per micro-batch, recompute not counted (as MFU does);
        a frozen weight's GEMM has no weight gradient in backward."""
        frozen = sum(layer.work.frozen_matmul_flops for layer in self.layers if layer.work is not None)
        return 3.0 * self.fwd_flops - frozen

    def needed_flops(self) -> float:
        """:meth:`model_flops` less the attention scores a causal mask leaves unneeded (half of
        them, forward and backward): the FLOPs MFU counts.  The published convention (Narayanan et
        al. 2021) counts attention in full, as :meth:`model_flops` and TFLOP/s do to compare with
        published runs; a FlashAttention kernel skips the masked half, so counting it would put
        MFU above what the kernels reach (docs/compute.md)."""
        masked = sum(0.5 * layer.work.attention_flops for layer in self.layers
                     if layer.work is not None and layer.work.causal)
        return self.model_flops() - 3.0 * masked

    def saved_activation_bytes(self) -> int:
        return sum(layer.checkpointed_activation_bytes for layer in self.layers)

    def describe(self) -> str:
        s = self.shape
        shape = f", {s.describe()}" if s else ""
        attention = f", {self.attention} attention" if self.attention else ""
        eager = self.elementwise is not None and self.elementwise != DEFAULT_ELEMENTWISE
        chains = f", {self.elementwise} element-wise chains" if eager else ""
        return (f"{self.name}: {self.params:,} parameters{shape}, seq {self.seq_len}, "
                f"micro-batch {self.micro_batch}{attention}{chains}")


def check_positive(**values: int) -> None:
    for key, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise WorkloadError(f"{key.replace('_', '-')} must be a positive integer, got {value!r}")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = [
    "ATTENTION_IMPLS", "DEFAULT_ATTENTION", "DEFAULT_ELEMENTWISE", "ELEMENTWISE_BYTES", "ELEMENTWISE_IMPLS",
    "Layer", "MLP_KINDS", "NORMS", "POSITIONS",
    "RECOMPUTE_MODES", "Tensor", "Work", "Workload", "WorkloadError", "block_activation_bytes",
    "check_positive", "ceil_div",
]
