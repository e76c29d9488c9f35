"""Fine-tuning with frozen weights and low-rank adapters (LoRA): what trains, and what only runs.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") freezes every
pretrained weight and puts beside each targeted projection ``W`` (``d_in`` x ``d_out``) two small
trainable matrices, ``A`` (``d_in`` x ``r``) and ``B`` (``r`` x ``d_out``), whose product adds to
``W``'s output.  Gradients, optimizer state and the optimizer's update then exist for the adapters
alone, and data parallelism reduces only their gradients; the frozen weights are still held (or,
under ZeRO-3 and FSDP, sharded and gathered) and still run.  :func:`with_lora` rewrites a workload
so, by these rules:

* **tensors**: every tensor of the model is frozen (``Tensor.trainable`` False), embeddings, norms,
  biases and the head included, as Hugging Face peft does by default (``bias="none"``, no
  ``modules_to_save``); each targeted projection of each transformer block gains ``lora_A``
  (``d_in * r``) and ``lora_B`` (``r * d_out``), trainable.  Cross-attention projections (T5) get
  none.
* **compute**: each adapter adds two GEMMs, ``2*T*r*(d_in + d_out)`` FLOPs forward, with input
  and weight gradients in backward like any trainable GEMM; a frozen GEMM's backward computes the
  input's gradient only (``Work.frozen_matmul_flops``: autograd skips the weight gradient of a
  tensor that does not require one), so a frozen model's backward GEMMs take about its forward's
  time, not twice it.
* **memory**: a linear layer saves its input only to compute its weight's gradient, so a frozen
  projection without an adapter saves nothing of its own (autograd's rule: ``dx = dy W^T`` needs
  ``W``, not ``x``).  Of a block's saved activations (:mod:`zero_sim.system.activations`) these go:
  the QKV input when none of q, k, v is targeted (the norm keeps its own input), the MLP's input
  when none of its first matrices is, the GeLU output or SwiGLU product (the down projection's
  input) when ``down`` is not, and with eager attention the output projection's input when ``o``
  is not (flash keeps its output for its own backward).  Cross-attention blocks (T5) and
  torchtitan's op-level recompute are left as full fine-tuning's.  The adapters' own ``r``-wide
  intermediates are small and not counted.

**QLoRA** (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs"), ``base="nf4"``:
the frozen base model's block projections are stored as 4-bit NormalFloat with double quantization,
``4 + 8/64 + 32/(64*256)`` = 4.127 bits a weight (the paper's figures: a 64-weight block's 8-bit
constant, itself quantized in blocks of 256 with fp32 constants), and dequantized to bf16 before
each GEMM that reads them: once in forward, once in backward for the input gradient, each reading the
packed weight and writing its bf16 copy (``Work.dequantize_bytes``).  Embeddings, norms, biases and
the head stay bf16, as bitsandbytes quantizes ``nn.Linear`` layers and Hugging Face keeps ``lm_head``
out; the adapters train in bf16.

Targets use peft's names (``target_modules``) or short ones: ``q``, ``k``, ``v``, ``o`` (attention;
``q_proj``..``o_proj``, GPT-2's fused ``c_attn`` is q, k and v), ``gate``, ``up``, ``down`` (a
SwiGLU MLP; ``gate_proj``..``down_proj``), ``fc`` and ``down`` (a GELU MLP's two matrices;
``c_fc``), and ``all-linear`` (every block projection, peft's shorthand).  peft's default for
Llama-style models is q and v.
"""

from __future__ import annotations

from dataclasses import replace

from zero_sim.system.workload import Layer, Tensor, Workload, WorkloadError
from zero_sim.vocabulary.lora_targets import (
    ALL_LINEAR,
    DEFAULT_TARGETS,
    MAX_RANK,
    PEFT_ALIASES,
    resolve_targets,
)

# Names, aliases and the bound on the rank are shared with the real runs (zero_sim.vocabulary.lora_targets).
ALIASES = PEFT_ALIASES


def projections(shape) -> dict[str, tuple[str, int, int]]:
    """Each targetable projection of a block of ``shape``: short name -> (the tensor it sits
    beside, d_in, d_out)."""
    h, f = shape.d_model, shape.d_ffn
    q, k = shape.n_head * shape.d_head, shape.n_kv_head * shape.d_head
    found = {"q": ("attn.qkv", h, q), "k": ("attn.qkv", h, k), "v": ("attn.qkv", h, k),
             "o": ("attn.proj", q, h)}
    if shape.mlp == "swiglu":
        found |= {"gate": ("mlp.gate", h, f), "up": ("mlp.up", h, f)}
    else:
        found["fc"] = ("mlp.fc", h, f)
    found["down"] = ("mlp.proj", f, h)
    return found


def parse_targets(text: str, shape) -> tuple[str, ...]:
    """The short names ``text`` (comma-separated) targets in a block of ``shape``, in block order;
    a name the model does not have is one sentence naming those it has."""
    return resolve_targets(text, projections(shape), WorkloadError, "this model's blocks")


# QLoRA's NF4 with double quantization: 4 bits, an 8-bit constant per 64 weights, and an fp32 constant
# per 256 of those (Dettmers et al. 2023, section 3): 4.127 bits a weight.
NF4_BITS = 4 + 8 / 64 + 32 / (64 * 256)
BASES = ("bf16", "nf4")


def with_lora(workload: Workload, rank: int, targets: str = DEFAULT_TARGETS, base: str = "bf16") -> Workload:
    """``workload`` fine-tuned with rank-``rank`` adapters on ``targets``, the frozen base's block
    projections stored as ``base`` (module docstring)."""
    if workload.shape is None:
        raise WorkloadError("LoRA needs a model built from its shape (a preset, --params or shape flags); "
                            "a model read off a module has no named projections to put adapters beside")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= MAX_RANK:
        raise WorkloadError(f"--lora-rank must be an integer from 1 to {MAX_RANK}, got {rank!r}")
    chosen = parse_targets(targets, workload.shape)
    table = projections(workload.shape)
    adapted = (_adapted(layer, rank, chosen, table, workload) for layer in workload.layers)
    layers = tuple(_unsaved(layer, chosen, workload) for layer in adapted)
    if base == "nf4":
        layers = tuple(_quantized(layer) for layer in layers)
    return replace(workload, layers=layers)


def _quantized(layer: Layer) -> Layer:
    """A block whose frozen projection weights are stored in NF4 and dequantized before each use."""
    if layer.kind != "block":
        return layer
    tensors = tuple(replace(t, bits=NF4_BITS) if _projection_weight(t) else t for t in layer.tensors)
    packed = sum(t.numel for t in tensors if t.bits)
    work = layer.work
    if work is not None:  # read the packed weight, write its bf16 copy, for every GEMM pass
        work = replace(work, dequantize_bytes=packed * (NF4_BITS / 8 + 2))
    return replace(layer, tensors=tensors, work=work)


def _projection_weight(tensor: Tensor) -> bool:
    """A frozen block projection's weight (not a norm, a bias or an adapter)."""
    return (not tensor.trainable and tensor.name.endswith(".weight")
            and tensor.name.split(".")[0] in ("attn", "xattn", "mlp"))


def _unsaved(layer: Layer, chosen: tuple[str, ...], workload: Workload) -> Layer:
    """A block's saved activations less what its frozen, unadapted projections no longer save."""
    shape = workload.shape
    first_cross = shape.n_layer - shape.cross_attention + 1
    if layer.kind != "block" or layer.index >= first_cross or workload.recompute == "op":
        return layer
    t, h, f = workload.tokens_per_micro_batch, shape.d_model, shape.d_ffn
    targeted = set(chosen)
    freed = 0
    if not targeted & {"q", "k", "v"}:
        freed += 2 * t * h  # the QKV input
    if "o" not in targeted and workload.attention == "eager":
        freed += 2 * t * shape.n_head * shape.d_head  # the output projection's input
    if not targeted & ({"gate", "up"} if shape.mlp == "swiglu" else {"fc"}):
        freed += 2 * t * h  # the MLP's input
    if "down" not in targeted and shape.mlp != "relu":
        freed += 2 * t * f  # the down projection's input (ReLU's output is kept for ReLU's backward)
    kept = layer.checkpointed_activation_bytes
    if workload.recompute in ("none", "selective"):
        kept -= freed
    return replace(layer, activation_bytes=layer.activation_bytes - freed, checkpointed_activation_bytes=kept)


def _adapted(layer: Layer, rank: int, chosen: tuple[str, ...], table: dict, workload: Workload) -> Layer:
    frozen = tuple(replace(t, trainable=False) for t in layer.tensors)
    work = layer.work
    if layer.kind != "block":
        return replace(layer, tensors=frozen,
                       work=None if work is None else replace(work, frozen_matmul_flops=work.matmul_flops))
    adapters = tuple(Tensor(f"{table[t][0]}.lora_{t}.{part}", numel)
                     for t in chosen
                     for part, numel in (("A", table[t][1] * rank), ("B", rank * table[t][2])))
    tokens = workload.tokens_per_micro_batch
    extra = sum(2.0 * tokens * rank * (table[t][1] + table[t][2]) for t in chosen)
    if work is not None:
        work = replace(work, matmul_flops=work.matmul_flops + extra, frozen_matmul_flops=work.matmul_flops)
    return replace(layer, tensors=frozen + adapters, fwd_flops=layer.fwd_flops + extra, work=work)


__all__ = ["ALL_LINEAR", "BASES", "DEFAULT_TARGETS", "NF4_BITS", "parse_targets", "projections", "with_lora"]
