"""A GPT-style transformer: its shape (:class:`GPTShape`) and the workload it makes (:func:`gpt_workload`).

Model (assumptions, all in one place)
-------------------------------------

A transformer is ``embedding`` (token table, plus a learned position table when
``positions == "learned"``), ``n_layer`` transformer ``block`` s and a ``head`` (final norm
and vocabulary projection).  :class:`GPTShape` names its shape:

* ``d_model`` = h, ``n_head`` = a query heads of ``head_dim`` (default h/a), ``kv_heads``
  key/value heads (grouped-query attention; default a), ``ffn_hidden`` = f (default 4h);
* ``mlp``: ``"gelu"`` (two matrices h×f, f×h; GPT, BERT, MPT), ``"gelu_tanh"`` (the same, with
  GPT-2's tanh approximation, which Hugging Face's code runs as a chain of kernels), ``"relu"``
  (the same two matrices; T5) or ``"swiglu"`` (three: gate and up h×f, down f×h; Llama, Mistral);
* ``norm``: ``"layernorm"`` (a weight, and a bias when ``bias`` is on) or ``"rmsnorm"`` (a
  weight only); ``bias``: biases on every linear layer (GPT-2/3, BERT) or none (Llama, MPT,
  T5); ``positions``: ``"learned"`` (a seq_len×h table), ``"rotary"`` (no parameters),
  ``"alibi"`` (no parameters), ``"relative"`` (T5's 32 buckets per head per stack);
* ``tied``: the head reuses the embedding's token table (GPT-2 does): the table belongs to
  the embedding layer (its gradient is complete only after the embedding's backward) and
  the head records that it reads it (``reads_layer``), so ZeRO-3 gathers it there too;
* ``dropout``: whether training applies dropout (GPT-2/3, BERT, T5 do; Llama, Mistral, MPT
  train with dropout 0): it decides which masks are saved;
* ``cross_attention``: the last this-many blocks also attend to the encoder's output (a
  T5 decoder, see below); ``window``: sliding-window attention over that many keys (Mistral).

Forward FLOPs (``Work``).  A dense layer of m×n weights costs ``2*T*m*n`` on ``T = b*s``
tokens; a block's matmuls are QKV ``h*(a*d + 2*kv*d)``, output ``a*d*h`` and the MLP's two or
three ``h*f`` matrices (``2*T*12h^2`` for GPT-2's shape).  The attention core (``Q K^T`` and
the weighted sum of ``V``) costs ``4*b*s*s_k*a*d`` with ``s_k = min(s, window)`` keys per
query, causal masking not halved (``4*b*s^2*h`` for GPT-2's shape), as Narayanan et al. 2021
count it.  Head: ``2*T*h*V``.  The embedding lookup is zero FLOPs.  Backward costs twice the
forward.  ``Layer.fwd_flops`` is matmul + attention: the model FLOPs MFU is reported from.

Memory-bound work (``Work.memory_bytes``, forward, bf16, per micro-batch).  Each kernel reads
its inputs and writes its output once; biases are fused into their GEMM, so they cost nothing
here.  Bytes per element of each op are in
:data:`zero_sim.system.elementwise.ELEMENTWISE_BYTES`, by the ``elementwise`` setting:

* a norm reads and writes the hidden state: ``4*T*h``; a residual add reads two and writes
  one: ``6*T*h``; a dropout reads, writes and writes a 1-byte mask: ``5*T*h``;
* rotary embeddings read and write Q and K: ``4*T*(a*d + kv*d)``;
* the MLP's activation: GeLU (either form) or ReLU ``4*T*f``; SwiGLU a SiLU (``4*T*f``) and a product
  (reads two, writes one: ``6*T*f``);
* eager attention also runs a softmax over the score matrix (scale and mask fused into it):
  ``4*b*a*s*s_k`` bytes (separate kernels: ``"eager-hf"``), plus its dropout
  (``5*b*a*s*s_k``), plus, with fewer KV heads than query heads, copying K and V out to every
  query head (``4*T*(kv*d + a*d)``).  Flash attention keeps all of that on chip: its traffic
  is part of the attention kernel;
* embedding: the gather (``4*T*h``), the learned position add (``6*T*h``), dropout;
  head: the final norm, and the loss: logits cast to fp32 (reads 2, writes 4 bytes per
  logit) and log-softmax (reads and writes 4): ``14*T*V``.

Element-wise chains (the ``elementwise`` setting: one fused round trip per norm and rotary
embedding, or the chain of eager ATen kernels) are counted in :mod:`zero_sim.system.elementwise`.

Saved activations per block (Korthikanti et al. 2022's accounting, and what flash attention,
grouped-query attention, SwiGLU and each recompute mode change in it) are counted in
:mod:`zero_sim.system.activations`.

Encoder-decoder models (T5) are approximated as one stack of blocks with the same
parameters, FLOPs and activations: the encoder's blocks, then the decoder's, each of which
also has a cross-attention (its own norm, Q, K, V and output projections) over an encoder
output as long as its own input.  What this leaves out: the decoder's input may be shorter
than the encoder's (we use one sequence length), the encoder output every decoder block
reads is saved once (not counted per block), and backward from the decoder reaches the
encoder only through that output.  Encoder-only models (BERT) are blocks with the same
FLOPs and bytes as a decoder's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zero_sim.system.activations import block_activation_bytes, projection_outputs
from zero_sim.system.elementwise import (
    DEFAULT_ELEMENTWISE,
    ELEMENTWISE_BYTES,
    ELEMENTWISE_IMPLS,
    listed_bytes,
)
from zero_sim.system.workload import (
    ATTENTION_IMPLS,
    DEFAULT_ATTENTION,
    MLP_KINDS,
    NORMS,
    POSITIONS,
    RECOMPUTE_MODES,
    RELATIVE_BUCKETS,
    Layer,
    Tensor,
    Work,
    Workload,
    WorkloadError,
    check_positive,
)


@dataclass(frozen=True)
class GPTShape:
    """A transformer's shape; the defaults are GPT-2's (see the module docstring for each field)."""

    n_layer: int
    d_model: int
    n_head: int
    vocab: int = 50257
    seq_len: int = 1024
    tied: bool = False  # head reuses the embedding's token table (GPT-2 does)
    kv_heads: int | None = None  # key/value heads (grouped-query attention); None: n_head
    ffn_hidden: int | None = None  # MLP width f; None: 4 * d_model
    mlp: str = "gelu"  # "gelu" | "gelu_tanh" | "relu" (2 matrices) | "swiglu" (3 matrices)
    norm: str = "layernorm"  # "layernorm" (weight, + bias when `bias`) | "rmsnorm" (weight)
    bias: bool = True  # biases on the linear layers (and on LayerNorm)
    positions: str = "learned"  # "learned" | "rotary" | "alibi" | "relative"
    head_dim: int | None = None  # None: d_model // n_head
    dropout: bool = True  # training applies dropout (masks saved for backward)
    cross_attention: int = 0  # the last this-many blocks also attend to an encoder output (T5)
    window: int | None = None  # sliding-window attention: keys per query (Mistral)
    # Decoders mask attention to earlier tokens; encoders (BERT, RoBERTa, T5's encoder) attend to
    # every token, so a flash kernel cannot skip the masked half.  T5's decoder blocks stay causal.
    causal: bool = True

    @property
    def n_kv_head(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.n_head

    @property
    def d_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_head

    @property
    def d_ffn(self) -> int:
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.d_model

    def params(self) -> int:
        return sum(layer.numel for layer in _gpt_layers(self, micro_batch=1, recompute="none"))

    def describe(self) -> str:
        """The shape in words, naming only what differs from GPT-2's defaults."""
        parts = [f"{self.n_layer} layers", f"d_model {self.d_model}", f"{self.n_head} heads"]
        if self.head_dim is not None and self.head_dim * self.n_head != self.d_model:
            parts.append(f"head dim {self.head_dim}")
        if self.n_kv_head != self.n_head:
            parts.append(f"{self.n_kv_head} KV heads")
        if self.ffn_hidden is not None and self.ffn_hidden != 4 * self.d_model:
            parts.append(f"FFN {self.ffn_hidden}")
        if self.mlp != "gelu":
            parts.append({"swiglu": "SwiGLU", "relu": "ReLU", "gelu_tanh": "tanh GeLU"}[self.mlp])
        if self.norm != "layernorm":
            parts.append("RMSNorm")
        if not self.bias:
            parts.append("no biases")
        if self.positions != "learned":
            parts.append(f"{self.positions} positions")
        if self.cross_attention:
            parts.append(f"cross-attention in the last {self.cross_attention} blocks")
        if self.window is not None:
            parts.append(f"window {self.window}")
        parts.append(f"vocab {self.vocab}")
        return ", ".join(parts)


def _norm_tensors(prefix: str, shape: GPTShape) -> tuple[Tensor, ...]:
    h = shape.d_model
    if shape.norm == "layernorm" and shape.bias:
        return (Tensor(f"{prefix}.weight", h), Tensor(f"{prefix}.bias", h))
    return (Tensor(f"{prefix}.weight", h),)


def _linear(name: str, n_in: int, n_out: int, bias: bool) -> tuple[Tensor, ...]:
    weight = (Tensor(f"{name}.weight", n_in * n_out),)
    return weight + ((Tensor(f"{name}.bias", n_out),) if bias else ())


def _block_tensors(shape: GPTShape, cross: bool) -> tuple[Tensor, ...]:
    h, f, bias = shape.d_model, shape.d_ffn, shape.bias
    q, k = shape.n_head * shape.d_head, shape.n_kv_head * shape.d_head
    tensors = _norm_tensors("ln_1", shape)
    tensors += _linear("attn.qkv", h, q + 2 * k, bias)
    tensors += _linear("attn.proj", q, h, bias)
    if cross:
        tensors += _norm_tensors("ln_x", shape)
        tensors += _linear("xattn.q", h, q, bias)
        tensors += _linear("xattn.kv", h, 2 * k, bias)
        tensors += _linear("xattn.proj", q, h, bias)
    tensors += _norm_tensors("ln_2", shape)
    if shape.mlp == "swiglu":
        tensors += _linear("mlp.gate", h, f, bias) + _linear("mlp.up", h, f, bias)
    else:
        tensors += _linear("mlp.fc", h, f, bias)
    tensors += _linear("mlp.proj", f, h, bias)
    return tensors


def _block_work(shape: GPTShape, b: int, attention: str, cross: bool,
                elementwise: str = DEFAULT_ELEMENTWISE) -> Work:
    s, h, f, a, dh = shape.seq_len, shape.d_model, shape.d_ffn, shape.n_head, shape.d_head
    t = s * b
    q, k = a * dh, shape.n_kv_head * dh
    sk = min(s, shape.window) if shape.window is not None else s
    n_attn = 2 if cross else 1
    mlp_mats = 3 if shape.mlp == "swiglu" else 2
    matmul = 2 * t * (h * (q + 2 * k) + q * h) * n_attn + 2 * t * mlp_mats * h * f
    core = 4 * b * s * sk * q * n_attn
    ops = ELEMENTWISE_BYTES[elementwise]
    drop = ops["dropout"] if shape.dropout else 0
    # Each sublayer (attention, cross-attention, MLP) has a norm, a residual add and a residual dropout.
    memory = (ops[shape.norm] + ops["residual_add"] + drop) * t * h * (2 + (1 if cross else 0))
    activation = ops["silu"] + ops["product"] if shape.mlp == "swiglu" else ops[shape.mlp]
    memory += activation * t * f
    if shape.positions == "rotary":
        memory += ops["rotary"] * t * (q + k)
    # Kernels the setting runs beyond fused ones, counted op by op: elements each key applies to.
    listed = {"gelu_tanh": t * f if shape.mlp == "gelu_tanh" else 0}
    if attention == "eager":
        scores = b * a * s * sk
        memory += (ops["scores"] + drop) * scores * n_attn
        listed |= {"scores": scores * n_attn, "causal_mask": scores if shape.causal else 0}
        if k < q:
            memory += 4 * t * (k + q) * n_attn
    # Each projection's FLOPs are its output width times its input width; op-level checkpointing
    # re-runs the ones whose outputs it drops (every other one, from the second).
    inputs = ([h, h, h, q] * n_attn) + ([h, h, f] if shape.mlp == "swiglu" else [h, f])
    outputs = projection_outputs(q, k, h, f, shape.mlp, cross)
    unsaved = sum(2 * t * i * o for i, o in list(zip(inputs, outputs, strict=True))[1::2])
    extra = listed_bytes(elementwise)
    fwd = sum(extra[k][0] * n for k, n in listed.items() if k in extra)
    bwd = sum(extra[k][1] * n for k, n in listed.items() if k in extra)
    return Work(float(matmul), float(core), float(memory), t, h, s, a, dh, attention, float(unsaved),
                shape.causal or cross, listed_bytes_fwd=float(fwd), listed_bytes_bwd=float(bwd))


def _gpt_layers(shape: GPTShape, micro_batch: int, recompute: str, attention: str = DEFAULT_ATTENTION,
                elementwise: str = DEFAULT_ELEMENTWISE) -> list[Layer]:
    s, b, h, a, v = shape.seq_len, micro_batch, shape.d_model, shape.n_head, shape.vocab
    tokens = s * b
    dh = shape.d_head

    emb_tensors = (Tensor("wte", v * h),)
    if shape.positions == "learned":
        emb_tensors += (Tensor("wpe", s * h),)
    elif shape.positions == "relative":
        stacks = 2 if shape.cross_attention else 1
        emb_tensors += (Tensor("relative_attention_bias", RELATIVE_BUCKETS * a * stacks),)
    ops = ELEMENTWISE_BYTES[elementwise]
    position_add = ops["residual_add"] if shape.positions == "learned" else 0
    emb_memory = (ops["gather"] + position_add) * tokens * h
    emb_memory += ops["dropout"] * tokens * h if shape.dropout else 0
    layers = [
        Layer(
            0, "embedding", emb_tensors,
            fwd_flops=0.0,
            activation_bytes=2 * s * b * h,
            checkpointed_activation_bytes=2 * s * b * h,
            work=Work(0.0, 0.0, float(emb_memory), tokens, h, s, a, dh, attention),
        )
    ]
    first_cross = shape.n_layer - shape.cross_attention + 1
    kinds = {}
    for i in range(1, shape.n_layer + 1):
        cross = i >= first_cross
        if cross not in kinds:
            work = _block_work(shape, b, attention, cross, elementwise)
            act = dict(kv_heads=shape.n_kv_head, head_dim=dh, ffn_hidden=shape.d_ffn, mlp=shape.mlp,
                       attention=attention, dropout=shape.dropout, keys=shape.window, cross=cross)
            kinds[cross] = (
                _block_tensors(shape, cross), work, float(work.matmul_flops + work.attention_flops),
                block_activation_bytes(s, b, h, a, "none", **act),
                block_activation_bytes(s, b, h, a, recompute, **act),
            )
        tensors, work, flops, act_none, act_ckpt = kinds[cross]
        layers.append(Layer(i, "block", tensors, flops, act_none, act_ckpt, work=work))

    head_act = 2 * s * b * h + 4 * s * b * v
    head_tensors = _norm_tensors("ln_f", shape)
    if shape.cross_attention:  # the encoder's final norm (T5), counted here with the decoder's
        head_tensors += _norm_tensors("encoder.ln_f", shape)
    if not shape.tied:
        head_tensors += (Tensor("lm_head.weight", v * h),)
    head_matmul = 2 * tokens * h * v
    layers.append(
        Layer(
            shape.n_layer + 1, "head", head_tensors,
            fwd_flops=float(head_matmul),
            activation_bytes=head_act,
            checkpointed_activation_bytes=head_act,
            reads_layer=0 if shape.tied else None,
            work=Work(float(head_matmul), 0.0, float(ops[shape.norm] * tokens * h + ops["loss"] * tokens * v),
                      tokens, h, s, a, dh, attention),
        )
    )
    return layers


def check_shape(shape: GPTShape) -> None:
    """Refuse a shape that cannot be built, with one sentence naming the flag to change."""
    check_positive(seq_len=shape.seq_len, layers=shape.n_layer, hidden=shape.d_model, heads=shape.n_head,
                   vocab=shape.vocab)
    if shape.kv_heads is not None:
        check_positive(kv_heads=shape.kv_heads)
        if shape.n_head % shape.kv_heads:
            raise WorkloadError(f"--heads {shape.n_head} is not a multiple of --kv-heads {shape.kv_heads}; "
                                "each key/value head serves a whole group of query heads")
    if shape.ffn_hidden is not None:
        check_positive(ffn_hidden=shape.ffn_hidden)
    if shape.head_dim is not None:
        check_positive(head_dim=shape.head_dim)
    elif shape.d_model % shape.n_head:
        raise WorkloadError(f"--hidden {shape.d_model} is not divisible by --heads {shape.n_head}; "
                            "choose heads that divide the hidden size")
    if shape.window is not None:
        check_positive(window=shape.window)
    for value, name, allowed in ((shape.mlp, "mlp", MLP_KINDS), (shape.norm, "norm", NORMS),
                                 (shape.positions, "positions", POSITIONS)):
        if value not in allowed:
            raise WorkloadError(f"unknown {name} {value!r}; use one of {', '.join(allowed)}")
    if not 0 <= shape.cross_attention <= shape.n_layer:
        raise WorkloadError(f"cross_attention must be between 0 and the {shape.n_layer} layers, "
                            f"got {shape.cross_attention}")


def gpt_workload(shape: GPTShape, micro_batch: int = 1, seq_len: int | None = None,
                 recompute: str = "none", name: str = "gpt", attention: str = DEFAULT_ATTENTION,
                 elementwise: str = DEFAULT_ELEMENTWISE) -> Workload:
    if seq_len is not None:
        shape = replace(shape, seq_len=seq_len)
    check_positive(micro_batch=micro_batch)
    check_shape(shape)
    if recompute not in RECOMPUTE_MODES:
        raise WorkloadError(f"unknown recompute mode {recompute!r}; use one of {', '.join(RECOMPUTE_MODES)}")
    if attention not in ATTENTION_IMPLS:
        raise WorkloadError(f"unknown attention {attention!r}; use one of {', '.join(ATTENTION_IMPLS)}")
    if elementwise not in ELEMENTWISE_IMPLS:
        raise WorkloadError(f"unknown elementwise {elementwise!r}; use one of {', '.join(ELEMENTWISE_IMPLS)}")
    layers = _gpt_layers(shape, micro_batch, recompute, attention, elementwise)
    return Workload(name, tuple(layers), shape.seq_len, micro_batch, recompute, shape, attention, elementwise)
