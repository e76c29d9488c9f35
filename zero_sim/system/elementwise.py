"""Element-wise chains: how many bytes of HBM traffic each memory-bound op of a transformer
moves per element, fused into one kernel or run as eager PyTorch runs it.

The ``elementwise`` setting of a workload (:mod:`zero_sim.system.workload` charges these
bytes to ``Work.memory_bytes``; its docstring lists every op's fused bytes).  ``"fused"``
(the default) takes every norm and rotary embedding as one HBM round trip, as a fused or
compiled kernel runs it.  ``"eager"`` charges the chain of separate ATen kernels that the common eager
PyTorch code runs, each a round trip of its own (per element; per-row statistics and
broadcast tables such as the norm weight or the rotary frequencies are below this
resolution):

* RMSNorm as Meta's Llama reference, torchtitan and fms write it, ``x.float()`` (read 2,
  write 4), ``pow(2)`` (4 + 4), ``mean(-1)`` (reads 4, writes one value a row), ``x * rsqrt``
  (4 + 4), ``type_as(x)`` (4 + 2), ``* weight`` (2 + 2): ``36*T*h`` per norm, 9 times the
  fused ``4*T*h``;
* rotary as a complex multiply (Meta's reference and torchtitan): ``xq.float()`` (2 + 4),
  the complex product with ``freqs_cis`` (4 + 4), ``type_as`` (4 + 2): ``20*T*(a*d + kv*d)``.
  Hugging Face's ``rotate_half`` chain (negate half 2, concatenate 4, two products 4 + 4 and
  a sum 6, all bf16) also moves 20;
* ``"fused-norm"``: norms fused, rotary eager: torchtitan runs that ask for its Triton
  ``fused_rmsnorm`` without compiling, so the complex-multiply rotary still runs as its three
  kernels (20 bytes an element);
* ``"eager-fms"``: as ``"eager"``, with rotary as foundation-model-stack's real 2 x 2
  rotation: ``q.float()`` (2 + 4), a product with the rotation matrices that writes fp32
  twice q's size (reads 4, writes 8), ``sum`` over the pair (8 + 4), ``type_as`` (4 + 2):
  ``36*T*(a*d + kv*d)``;
* ``"eager-hf"``: as ``"eager"``, plus what Hugging Face's modelling code runs beyond one fused
  kernel (transformers' ``GPT2Attention._attn``, ``BertSelfAttention`` and
  ``NewGELUActivation``), listed in :data:`HF_EXTRA_BYTES` with each direction counted kernel by
  kernel: eager attention's scores go through a separate scale (2 + 2; backward scales the
  gradient, 2 + 2), the decoder's causal ``torch.where`` (2 + 2; backward another ``where``,
  2 + 2) and the padding mask the Trainer's batches carry (2 + 2; backward passes the gradient
  through), before the softmax a fused kernel would run alone; GPT-2's ``gelu_new`` (the
  ``gelu_tanh`` MLP) is eight kernels, ``pow`` 2 + 2, a scalar product 2 + 2, ``x + ...``
  2 + 2 + 2, a scalar product 2 + 2, ``tanh`` 2 + 2, ``1 + ...`` 2 + 2, ``0.5 * x`` 2 + 2 and the
  product 2 + 2 + 2 (36 bytes an element where one kernel moves 4), and autograd runs each one's
  backward: the product's two (6 + 6), ``tanh``'s (6), two scalar products (4 + 4), ``pow``'s
  ``3 * x**2 * grad`` (4 + 4 + 6), ``0.5 *`` (4) and two adds gathering x's three gradients
  (6 + 6): 56 where one ``gelu_backward`` moves 6.  These small kernels' backward is not the
  2.6x of norm chains (which save fp32 intermediates), hence the separate count;
* unchanged, because eager PyTorch already runs them as the kernels counted above:
  LayerNorm (one ``native_layer_norm`` kernel), GeLU and ReLU (one kernel each), SwiGLU
  (``silu`` then the product: two kernels, ``10*T*f``), residual adds, dropout, the
  embedding gather and the loss (already counted as eager: a cast and a log-softmax);
* not counted in any setting: Llama's ``repeat_kv`` copy of K and V out to every query
  head before a flash kernel, which compiled runs make as well; and the larger tensors an
  eager RMSNorm saves for backward (its input's fp32 copy and its bf16 output, 6 bytes an
  element against the input's 2), so saved activations are the same in every setting.

Eager backward chains are taken at the same ratio: backward moves 2.6 times the forward's bytes
in every setting (:mod:`zero_sim.system.hardware`), except the kernels ``"eager-hf"`` lists and
autocast's fp32 softmax over eager attention's scores (:data:`AUTOCAST_SCORE_BYTES`), each
counted kernel by kernel in both directions.
"""

from __future__ import annotations

# fused: one HBM round trip per norm and rotary embedding (fused or compiled kernels), the default;
# fused-norm: fused norms beside the eager rotary chain (torchtitan's fused_rmsnorm, uncompiled);
# eager: the chains of ATen kernels eager PyTorch code runs (see the module docstring); eager-fms:
# the same, with foundation-model-stack's real-rotation rotary in place of the complex multiply.
# eager-hf: eager's chains plus Hugging Face modelling code's separate attention-score kernels and GPT-2's
# Python gelu_new.
ELEMENTWISE_IMPLS = ("fused", "fused-norm", "eager", "eager-fms", "eager-hf")
DEFAULT_ELEMENTWISE = "fused"
# Forward HBM bytes per element of each memory-bound op of a block, head or embedding, bf16
# activations.  The rule: every kernel reads each input once and writes its output once, so a
# chain of eager kernels pays each intermediate tensor's write and read again.
_FUSED_BYTES = {
    "layernorm": 4,  # read x (2), write y (2)
    "rmsnorm": 4,  # read x (2), write y (2)
    "rotary": 4,  # per element of Q and K: read 2, write 2
    "residual_add": 6,  # read two bf16 inputs (2 + 2), write 2
    "dropout": 5,  # read 2, write 2 and a 1-byte mask
    "gelu": 4,  # per element of the MLP width: read 2, write 2
    "gelu_tanh": 4,  # GPT-2's tanh approximation as one kernel (F.gelu(approximate="tanh"), fused bias-GeLU)
    "relu": 4,  # read 2, write 2
    "silu": 4,  # SwiGLU's gate: read 2, write 2
    "product": 6,  # SwiGLU's gate times up: read 2 + 2, write 2
    "gather": 4,  # the embedding lookup: read a row (2), write it (2)
    # Per element of eager attention's s x s scores, between its two batched GEMMs: one kernel that
    # scales, masks and softmaxes (read 2, write 2).  Dropout over the scores is the "dropout" entry.
    "scores": 4,
    "loss": 14,  # per logit, as eager code runs it: cast to fp32 (read 2, write 4), log-softmax (4 + 4)
}
ELEMENTWISE_BYTES = {
    "fused": _FUSED_BYTES,
    "eager": _FUSED_BYTES | {
        # x.float() 2+4, pow(2) 4+4, mean 4 (one value a row written), x * rsqrt 4+4, type_as 4+2,
        # * weight 2+2: every step of the chain is its own kernel.
        "rmsnorm": 36,
        # xq.float() 2+4, complex multiply by freqs_cis 4+4 (complex64: 4 bytes a real element),
        # type_as 4+2: torchtitan's apply_rotary_emb, three kernels.
        "rotary": 20,
    },
}
# q.float() 2+4; freqs.mul(q_) reads fp32 q (4) and writes a 2 x 2 product per pair, fp32 twice
# q's size (8); sum(5) reads that (8), writes 4; type_as 4+2: fms's RotaryEmbedding.adjusted_qk.
ELEMENTWISE_BYTES["eager-fms"] = ELEMENTWISE_BYTES["eager"] | {"rotary": 36}
ELEMENTWISE_BYTES["fused-norm"] = _FUSED_BYTES | {"rotary": ELEMENTWISE_BYTES["eager"]["rotary"]}
ELEMENTWISE_BYTES["eager-hf"] = ELEMENTWISE_BYTES["eager"]
# What "eager-hf" runs beyond the fused kernel of the same key, per element: (forward, backward)
# HBM bytes, each counted kernel by kernel (module docstring).  "scores": the separate scale and
# padding-mask add over eager attention's scores; "causal_mask": the decoder's torch.where;
# "gelu_tanh": gelu_new's chain less one GeLU kernel (36 - 4 forward, 56 - 6 backward).
HF_EXTRA_BYTES = {"scores": (8, 4), "causal_mask": (4, 4), "gelu_tanh": (32, 50)}


# Under AMP (torch.autocast), eager attention's softmax is on autocast's fp32 list, so its scores
# are cast up, softmaxed and dropped out in fp32 and cast back for the second matmul (GPT-2's
# ``attn_weights.type(value.dtype)``, or autocast's own cast of the matmul's input).  Per score
# element, beyond the fp16 softmax and dropout: forward the cast in (read 2, write 4), the softmax
# in fp32 (4 + 4 against 2 + 2), the dropout in fp32 (4 + 4 + 1 against 2 + 2 + 1) and the cast out
# (4 + 2): 6 + 4 + 4 + 6 = 20; backward the cast out's (2 + 4), the dropout's in fp32 (4 + 1 + 4
# against 2 + 1 + 2), the softmax's in fp32 (4 + 4 + 4 against 2 + 2 + 2) and the cast in's
# (4 + 2): 6 + 4 + 6 + 6 = 22.  Flash attention runs the whole core in half precision.
AUTOCAST_SCORE_BYTES = (20, 22)


def listed_bytes(elementwise: str) -> dict[str, tuple[int, int]]:
    """The chains the setting runs beyond fused kernels, counted op by op in both directions."""
    return HF_EXTRA_BYTES if elementwise == "eager-hf" else {}
