"""LoRA on the real GPT: frozen weights, and small trainable adapters beside chosen projections.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") freezes every
pretrained weight ``W`` and adds beside a projection ``y = x W^T + b`` a low-rank path::

    y = x W^T + b  +  (alpha / r) * (x A^T) B^T        A: r x d_in,  B: d_out x r

written as Hugging Face peft writes it (``lora_A``, ``lora_B``; peft's ``Linear`` layer):

* ``A`` starts Kaiming-uniform with ``a = sqrt(5)`` (what ``nn.Linear`` does to its weight, and
  peft to ``lora_A``), ``B`` starts at zero, so the adapted model starts as the base model;
* the scale is ``alpha / r`` (``--lora-alpha``, peft's default 8);
* every base weight is frozen (``requires_grad=False``), embeddings, norms, biases and the head
  included (peft's ``bias="none"``, no ``modules_to_save``): only the adapters have gradients,
  optimizer state and updates.

The real block fuses q, k and v into one ``qkv`` projection; each of them targeted gets an
adapter of its own on its third of the output (:mod:`real_runs.lora_targets`).  Adapters are
drawn from a generator seeded by the run's seed, so every rank and the single-process
reference start from the same ones.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .lora_targets import MODULE_PARTS, PROJECTIONS


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` (``base``) whose output parts named in ``adapted`` each get a rank-``r``
    adapter: ``lora_A[part]`` (r x d_in) and ``lora_B[part]`` (part's width x r)."""

    def __init__(self, base: nn.Linear, parts: tuple[str, ...], adapted: tuple[str, ...], rank: int,
                 alpha: float, generator: torch.Generator):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.parts = parts
        self.width = base.out_features // len(parts)
        self.scaling = alpha / rank
        self.lora_A = nn.ParameterDict()
        self.lora_B = nn.ParameterDict()
        for part in adapted:
            a = torch.empty(rank, base.in_features)  # drawn on the CPU, where the generator lives
            # nn.Linear's (and peft's) init: bound 1/sqrt(d_in), the Kaiming-uniform bound at a = sqrt(5).
            nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
            a = a.to(base.weight.device, base.weight.dtype)
            self.lora_A[part] = nn.Parameter(a)
            self.lora_B[part] = nn.Parameter(torch.zeros(self.width, rank, dtype=a.dtype, device=a.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pieces = list(self.base(x).split(self.width, dim=-1))
        for k, part in enumerate(self.parts):
            if part in self.lora_A:
                low = F.linear(x, self.lora_A[part])  # r wide
                pieces[k] = pieces[k] + self.scaling * F.linear(low, self.lora_B[part])
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)


def add_lora(model: nn.Module, rank: int, targets: tuple[str, ...], alpha: float, seed: int) -> nn.Module:
    """Freeze ``model`` and put adapters on ``targets`` (short names) in every block, in place."""
    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + 7)
    for block in model.layers[1:-1]:
        for module, parts in MODULE_PARTS.items():
            adapted = tuple(p for p in parts if p in targets and PROJECTIONS[p][0] == module)
            if adapted:
                base = getattr(block, module)
                setattr(block, module, LoRALinear(base, parts, adapted, rank, alpha, generator))
    return model


def count_trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
