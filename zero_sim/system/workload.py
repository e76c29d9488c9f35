"""What is being trained: a model as an ordered list of layers, each with its tensors,
its FLOPs and the activation bytes it saves for backward.

Why layers, not modules or kernels: every strategy communicates at layer granularity
(a DDP bucket fills as layers finish backward; ZeRO-3 and FSDP gather one layer's
parameters at a time), and a layer is the unit a person can recognise on a timeline.

Model (assumptions, all in one place):

* A GPT is ``embedding`` (token + position tables), ``n_layer`` transformer ``block`` s,
  and a ``head`` (final layernorm + vocabulary projection).  GPT-2 presets tie the
  projection to the embedding's token table, as GPT-2 does: the table belongs to the
  embedding layer (its gradient is complete only after the embedding's backward) and the
  head records that it reads it (``reads_layer``), so ZeRO-3 gathers it there too.
* Forward FLOPs of a block on ``T = b*s`` tokens: ``2*T*12h^2`` for the matmuls plus
  ``4*b*s^2*h`` for attention scores and the weighted sum.  Head: ``2*T*h*V``.  The
  embedding lookup is counted as zero FLOPs.  Backward costs twice the forward.
* Saved activations of a block, bf16, no tensor parallelism (Korthikanti et al. 2022):
  ``s*b*h*(34 + 5*a*s/h)`` bytes.  Selective recompute drops the ``5as/h`` term; full
  recompute keeps only the block input, ``2*s*b*h`` bytes.  The head keeps its input
  (``2sbh``) and fp32 logits for the loss (``4*s*b*V``); the embedding keeps its output.

A workload can also be read off any ``torch.nn.Module`` on the meta device
(``sim2real.module_workload``): parameter sizes per child module, FLOPs from torch's
flop counter, saved-activation bytes from autograd's saved-tensor hooks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

RECOMPUTE_MODES = ("none", "selective", "full")


class WorkloadError(ValueError):
    """A model description that cannot be simulated; the message says how to fix it."""


@dataclass(frozen=True)
class Tensor:
    name: str
    numel: int


@dataclass(frozen=True)
class Layer:
    """One layer: its tensors, forward FLOPs and saved-activation bytes per micro-batch."""

    index: int
    kind: str  # "embedding" | "block" | "head" | "module"
    tensors: tuple[Tensor, ...]
    fwd_flops: float
    activation_bytes: int  # saved for backward with no recompute
    checkpointed_activation_bytes: int  # saved under the workload's recompute mode
    reads_layer: int | None = None  # another layer whose weights this one also uses (tied embeddings)

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def bwd_flops(self) -> float:
        return 2.0 * self.fwd_flops


@dataclass(frozen=True)
class GPTShape:
    n_layer: int
    d_model: int
    n_head: int
    vocab: int = 50257
    seq_len: int = 1024
    tied: bool = False  # head reuses the embedding's token table (GPT-2 does)

    def params(self) -> int:
        return sum(layer.numel for layer in _gpt_layers(self, micro_batch=1, recompute="none"))


@dataclass(frozen=True)
class Workload:
    """A model at a given sequence length and micro-batch (sequences per rank per micro-step)."""

    name: str
    layers: tuple[Layer, ...]
    seq_len: int
    micro_batch: int
    recompute: str = "none"
    shape: GPTShape | None = field(default=None, compare=False)

    @property
    def params(self) -> int:
        return sum(layer.numel for layer in self.layers)

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.seq_len * self.micro_batch

    @property
    def fwd_flops(self) -> float:
        return sum(layer.fwd_flops for layer in self.layers)

    def model_flops(self) -> float:
        """FLOPs of one forward+backward per micro-batch, recompute not counted (as MFU does)."""
        return 3.0 * self.fwd_flops

    def saved_activation_bytes(self) -> int:
        return sum(layer.checkpointed_activation_bytes for layer in self.layers)

    def describe(self) -> str:
        s = self.shape
        shape = f", {s.n_layer} layers, d_model {s.d_model}, {s.n_head} heads, vocab {s.vocab}" if s else ""
        return (f"{self.name}: {self.params:,} parameters{shape}, seq {self.seq_len}, "
                f"micro-batch {self.micro_batch}")


# Preset shapes.  GPT-2 sizes are the published ones.  gpt-7.5b follows the ZeRO paper's
# 7.5B model size with a GPT-3-like aspect ratio; the RoBERTa sizes of seed 004 are
# encoders whose shapes the article does not give: we assume GPT-like blocks (same
# FLOPs and bytes as an encoder block) at RoBERTa's sequence length of 512.
PRESETS: dict[str, GPTShape] = {
    "gpt2-124m": GPTShape(12, 768, 12, 50257, 1024, tied=True),
    "gpt2-350m": GPTShape(24, 1024, 16, 50257, 1024, tied=True),
    "gpt2-1.5b": GPTShape(48, 1600, 25, 50257, 1024, tied=True),
    "gpt-7.5b": GPTShape(36, 4096, 32, 50257, 2048, tied=True),
    "gpt3-175b": GPTShape(96, 12288, 96, 50257, 2048),
    "roberta-10b": GPTShape(50, 4096, 32, 50265, 512),
    "roberta-50b": GPTShape(62, 8192, 64, 50265, 512),
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


def block_activation_bytes(s: int, b: int, h: int, a: int, recompute: str) -> int:
    """Korthikanti et al. 2022, bf16, no tensor parallelism."""
    if recompute == "full":
        return 2 * s * b * h
    per_token = 34 * h + (0 if recompute == "selective" else 5 * a * s)
    return s * b * per_token


def _gpt_layers(shape: GPTShape, micro_batch: int, recompute: str) -> list[Layer]:
    s, b, h, a, v = shape.seq_len, micro_batch, shape.d_model, shape.n_head, shape.vocab
    tokens = s * b
    layers = [
        Layer(
            0, "embedding",
            (Tensor("wte", v * h), Tensor("wpe", s * h)),
            fwd_flops=0.0,
            activation_bytes=2 * s * b * h,
            checkpointed_activation_bytes=2 * s * b * h,
        )
    ]
    block_tensors = (
        Tensor("ln_1.weight", h), Tensor("ln_1.bias", h),
        Tensor("attn.qkv.weight", 3 * h * h), Tensor("attn.qkv.bias", 3 * h),
        Tensor("attn.proj.weight", h * h), Tensor("attn.proj.bias", h),
        Tensor("ln_2.weight", h), Tensor("ln_2.bias", h),
        Tensor("mlp.fc.weight", 4 * h * h), Tensor("mlp.fc.bias", 4 * h),
        Tensor("mlp.proj.weight", 4 * h * h), Tensor("mlp.proj.bias", h),
    )
    block_flops = 2.0 * tokens * 12 * h * h + 4.0 * b * s * s * h
    for i in range(1, shape.n_layer + 1):
        layers.append(
            Layer(
                i, "block", block_tensors, block_flops,
                activation_bytes=block_activation_bytes(s, b, h, a, "none"),
                checkpointed_activation_bytes=block_activation_bytes(s, b, h, a, recompute),
            )
        )
    head_act = 2 * s * b * h + 4 * s * b * v
    head_tensors = (Tensor("ln_f.weight", h), Tensor("ln_f.bias", h))
    if not shape.tied:
        head_tensors += (Tensor("lm_head.weight", v * h),)
    layers.append(
        Layer(
            shape.n_layer + 1, "head", head_tensors,
            fwd_flops=2.0 * tokens * h * v,
            activation_bytes=head_act,
            checkpointed_activation_bytes=head_act,
            reads_layer=0 if shape.tied else None,
        )
    )
    return layers


def gpt_workload(shape: GPTShape, micro_batch: int = 1, seq_len: int | None = None,
                 recompute: str = "none", name: str = "gpt") -> Workload:
    if seq_len is not None:
        shape = replace(shape, seq_len=seq_len)
    _check_positive(micro_batch=micro_batch, seq_len=shape.seq_len, n_layer=shape.n_layer,
                    d_model=shape.d_model, n_head=shape.n_head, vocab=shape.vocab)
    if recompute not in RECOMPUTE_MODES:
        raise WorkloadError(f"unknown recompute mode {recompute!r}; use one of {', '.join(RECOMPUTE_MODES)}")
    return Workload(name, tuple(_gpt_layers(shape, micro_batch, recompute)), shape.seq_len,
                    micro_batch, recompute, shape)


def preset(name: str, micro_batch: int = 1, seq_len: int | None = None, recompute: str = "none") -> Workload:
    if name not in PRESETS:
        raise WorkloadError(f"unknown model preset {name!r}; choose one of {', '.join(preset_names())} "
                            "or give --params N")
    return gpt_workload(PRESETS[name], micro_batch, seq_len, recompute, name)


def synthesize_shape(target_params: int, seq_len: int = 1024, vocab: int = 50257) -> GPTShape:
    """The GPT shape closest to ``target_params`` with a GPT-3-like depth/width ratio.

    Width is a multiple of 64 with 64-wide heads and depth is about width/100 (GPT-3's
    family runs from 1/64 to 1/128); among those we take the closest parameter count.
    """
    _check_positive(params=target_params)
    best: tuple[float, GPTShape] | None = None
    for h in range(64, 32768 + 1, 64):
        per_block = 12 * h * h + 13 * h
        fixed = vocab * h * 2 + seq_len * h + 2 * h
        for n_layer in {max(1, round(h / d)) for d in (64, 80, 100, 128)}:
            shape = GPTShape(n_layer, h, max(1, h // 64), vocab, seq_len)
            err = abs(fixed + n_layer * per_block - target_params)
            if best is None or err < best[0]:
                best = (err, shape)
        if fixed > 2 * target_params:
            break
    assert best is not None
    return best[1]


def _check_positive(**values: int) -> None:
    for key, value in values.items():
        if not isinstance(value, int) or value <= 0:
            raise WorkloadError(f"{key.replace('_', '-')} must be a positive integer, got {value!r}")


def human_params(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    return f"{n:,}"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = [
    "GPTShape", "Layer", "PRESETS", "Tensor", "Workload", "WorkloadError", "block_activation_bytes",
    "gpt_workload", "preset", "preset_names", "synthesize_shape", "human_params",
    "ceil_div",
]
