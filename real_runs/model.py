"""A small GPT and the synthetic token streams it trains on.

The model is laid out the way the simulator's workload counts layers, so measured
ops line up with predicted ones:

- layer 0: token embedding + position embedding,
- layers 1..n_layer: transformer blocks (pre-norm attention + 4x GELU MLP, as nanoGPT),
- layer n_layer+1: final layernorm, lm head and the cross-entropy loss.

The lm head is *untied* from the token embedding.  Tying would make layer 0 and the
last layer share one tensor, and every per-layer sharding scheme (ZeRO-3, FSDP) would
need a special case for it.  The price is ``vocab * d_model`` extra parameters, so the
``gpt2-124m`` preset holds about 163M parameters rather than GPT-2's tied 124M.

Data is generated, never downloaded: each sequence walks the vocabulary with a fixed
per-sequence stride plus occasional random jumps, so there is something to learn and
the loss falls.  A batch depends only on ``(seed, step)``; every rank generates the same
global batch and keeps its own contiguous rows.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .presets import PRESETS, GPTConfig

__all__ = ["GPT", "GPTConfig", "PRESETS", "build_model", "count_params", "global_batch", "rank_shard"]


class Embedding(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_seq, cfg.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(pos)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.ln1 = nn.LayerNorm(cfg.d_model)
        # No qkv bias: the key bias's true gradient is zero (softmax ignores a constant
        # added to every score in a row), so it receives pure rounding noise, which Adam
        # scales up to full-size steps.  Runs on different rank counts would then differ
        # by the learning rate in those entries rather than by fp32 rounding.
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.out = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Head(nn.Module):
    """Final layernorm, lm head and the loss: the loss belongs here so that the last
    layer's backward starts the moment ``loss.backward()`` is called."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.ln(x))
        # The loss in fp32 whatever the weights' dtype, as autocast runs it: bf16 logits
        # would round the log-probabilities of a large vocabulary.
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList([Embedding(cfg), *(Block(cfg) for _ in range(cfg.n_layer)), Head(cfg)])
        self.apply(self._init)
        # GPT-2's scaled init of the projections that write into the residual stream.
        for block in self.layers[1:-1]:
            for lin in (block.proj, block.out):
                nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = idx
        for layer in self.layers[:-1]:
            h = layer(h)
        return self.layers[-1](h, targets)


def build_model(cfg: GPTConfig, seed: int, device: torch.device | str = "cpu") -> GPT:
    """Same seed, same weights, on every rank and in the single-process reference."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = GPT(cfg)
    torch.random.set_rng_state(gen_state)
    return model.to(device)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def global_batch(cfg: GPTConfig, seed: int, step: int, batch: int,
                 seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets, ``(batch, seq_len)`` each, for one training step."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(cfg.vocab, (batch, 1), generator=g)
    stride = torch.randint(1, 8, (batch, 1), generator=g)
    walk = start + stride * torch.arange(seq_len + 1)
    jump = torch.rand(batch, seq_len + 1, generator=g) < 0.1
    noise = torch.randint(cfg.vocab, (batch, seq_len + 1), generator=g)
    tokens = torch.where(jump, noise, walk) % cfg.vocab
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def rank_shard(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's contiguous, disjoint rows of the global batch."""
    rows = x.shape[0] // world
    return x[rank * rows:(rank + 1) * rows]
