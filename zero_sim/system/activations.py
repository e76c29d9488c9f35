"""Saved activations of one transformer block: the bytes its forward keeps for backward.

Why a module of its own: memory is where strategies differ most visibly, and activations are
the part of it that depends on the model's code (attention kernel, MLP, dropout, recompute
mode) rather than on the strategy; :mod:`zero_sim.system.workload` builds layers and asks
here what each block saves.

Saved activations (bytes per micro-batch, bf16, no tensor parallelism), following
Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
Sec. 4.1): every op saves what its backward reads, each tensor counted once.  For a GPT-2
block with eager attention and dropout this is their ``s*b*h*(34 + 5*a*s/h)``.  Per block,
with ``T = s*b``, query width ``q = a*d``, key/value width ``k = kv*d`` and ``D`` = 1 with
dropout, 0 without:

* two norms save their inputs: ``4*T*h`` (RMSNorm and LayerNorm alike; the per-token
  fp32 statistics, 4 or 8 bytes a token, are below this accounting's resolution);
* attention: the QKV input ``2*T*h``; Q ``2*T*q``; K and V ``4*T*k`` (flash, which reads
  the grouped heads directly) or ``4*T*q`` (eager, which saves K and V repeated out to every
  query head, as Hugging Face's ``repeat_kv`` does); the output projection's input ``2*T*q``;
  the residual dropout mask ``D*T*h``;
* the attention core, eager: the softmax output ``2*b*a*s*s_k``, and with dropout its mask
  (``b*a*s*s_k``) and output (``2*b*a*s*s_k``): Korthikanti's ``5*a*s^2*b``.  Flash
  (FlashAttention, Dao et al. 2022; the kernel torch's scaled_dot_product_attention picks
  for bf16 on Ampere and newer) saves no s×s tensor: the output (already counted as the
  projection's input), and the softmax's log-sum-exp, fp32 per head per token: ``4*T*a``;
  its dropout mask is regenerated from the RNG state (``flash1``, FlashAttention v1 and its
  Triton port, saves the same);
* MLP: its input ``2*T*h``; GeLU its input and output ``4*T*f``; ReLU its output only (its
  backward and the down projection share it) ``2*T*f``; SwiGLU the gate and up outputs, the
  SiLU output and their product ``8*T*f`` (unfused, as written in PyTorch; a fused SwiGLU
  kernel saves ``6*T*f``); the residual dropout mask ``D*T*h``.

For GPT-2's shape (a = h/d, kv = a, f = 4h, D = 1, eager) this is exactly ``34*T*h +
5*b*a*s^2``.  Selective recompute drops the attention core's saved tensors (eager: the s×s
terms; flash: the log-sum-exp); full recompute keeps only the block input, ``2*T*h``.  The
head keeps its input (``2*T*h``) and fp32 logits for the loss (``4*T*V``); the embedding keeps
its output (``2*T*h``).
"""

from __future__ import annotations

# "op" is torchtitan's op-level selective checkpointing (``_save_list`` in its activation
# checkpointing module): a block keeps the attention kernel's output and every other matmul
# output, counted in forward order from the first; everything else is recomputed.
RECOMPUTE_MODES = ("none", "selective", "full", "op")


def block_activation_bytes(s: int, b: int, h: int, a: int, recompute: str, *, kv_heads: int | None = None,
                           head_dim: int | None = None, ffn_hidden: int | None = None, mlp: str = "gelu",
                           attention: str = "eager", dropout: bool = True, keys: int | None = None,
                           cross: bool = False) -> int:
    """Saved activations of one block (see the module docstring), bf16, no tensor parallelism.

    With only ``(s, b, h, a, recompute)`` this is Korthikanti et al. 2022's GPT block:
    ``s*b*h*(34 + 5*a*s/h)`` with no recompute, ``34*s*b*h`` selective, ``2*s*b*h`` full."""
    t = s * b
    if recompute == "full":
        return 2 * t * h
    d = head_dim if head_dim is not None else h // a
    q = a * d
    k = (kv_heads if kv_heads is not None else a) * d
    f = ffn_hidden if ffn_hidden is not None else 4 * h
    if recompute == "op":
        outputs = projection_outputs(q, k, h, f, mlp, cross)
        kept = sum(outputs[0::2])  # every other matmul output, from the first
        attention_out = (q + (4 * a // 2 if attention != "eager" else 0)) * (2 if cross else 1)
        return 2 * t * h + 2 * t * kept + 2 * t * attention_out
    drop = 1 if dropout else 0
    sk = min(s, keys) if keys is not None else s
    kv_saved = k if attention != "eager" else q  # eager saves K and V repeated out to every query head
    core = (4 * t * a) if attention != "eager" else b * a * s * sk * (2 + 3 * drop)
    if recompute == "selective":
        core = 0
    attn = 2 * t * h + 2 * t * q + 4 * t * kv_saved + 2 * t * q + drop * t * h
    norms = 4 * t * h
    if cross:  # its own norm and attention over the encoder's output; that output itself is saved once
        norms += 2 * t * h
        attn += 2 * t * h + 2 * t * q + 4 * t * kv_saved + 2 * t * q + drop * t * h
        core *= 2
    saved_f = {"gelu": 4 * t * f, "gelu_tanh": 4 * t * f, "relu": 2 * t * f, "swiglu": 8 * t * f}[mlp]
    mlp_bytes = 2 * t * h + saved_f + drop * t * h
    return norms + attn + core + mlp_bytes


def projection_outputs(q: int, k: int, h: int, f: int, mlp: str, cross: bool) -> list[int]:
    """Widths of a block's matmul outputs in forward order, projections unfused as torchtitan
    writes them: q, k, v, o (again for cross-attention), then gate, up, down (SwiGLU) or fc, proj."""
    attention = [q, k, k, h] * (2 if cross else 1)
    return attention + ([f, f, h] if mlp == "swiglu" else [f, h])
