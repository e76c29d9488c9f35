"""Which projections of the real GPT's blocks get LoRA adapters: names in, short names out.

Plain data, importable without torch, so that the command line refuses a bad target with one
sentence before any rank starts.  The names are the simulator's (``zero_sim.system.lora``):
peft's ``target_modules`` (``q_proj``, ``v_proj``, ``c_attn`` ...), the short names ``q``, ``k``,
``v``, ``o``, ``fc``, ``down``, and ``all-linear``, plus the real block's own module names
(``qkv``, ``proj``, ``fc``, ``out``: :mod:`real_runs.model`).  A run resolves them to short
names, which ``run.json`` records and the simulator reads back unchanged, so a replay puts
its adapters where the run did.  ``real_runs`` may not import the simulator's parser (it
knows only ``zero_sim.vocabulary``), so both read names by the one rule of
:mod:`zero_sim.vocabulary.lora_targets`; a test holds the two to the same answers.

The real block is GPT-2's layout: a fused ``qkv`` projection (d -> 3d), ``proj`` (attention's
output, d -> d), ``fc`` (d -> 4d) and ``out`` (the MLP's down projection, 4d -> d).  Each of
q, k and v gets an adapter of its own on its third of ``qkv``'s output, as peft gives a
Llama's separate ``q_proj``, ``k_proj`` and ``v_proj`` one each, and as the simulator counts
them (``d_in x r`` plus ``r x d_out`` per short name).
"""

from __future__ import annotations

from zero_sim.vocabulary.lora_targets import (
    ALL_LINEAR,
    DEFAULT_TARGETS,
    MAX_RANK,
    PEFT_ALIASES,
    resolve_targets,
)

DEFAULT_ALPHA = 8.0  # peft's LoraConfig default lora_alpha; the adapters' output is scaled by alpha / r

# Short name -> (the block's module it sits on, its slice of that module's output, in thirds or whole).
PROJECTIONS: dict[str, tuple[str, int]] = {
    "q": ("qkv", 0), "k": ("qkv", 1), "v": ("qkv", 2), "o": ("proj", 0), "fc": ("fc", 0), "down": ("out", 0),
}
# The parts each module's output splits into, in order.
MODULE_PARTS: dict[str, tuple[str, ...]] = {"qkv": ("q", "k", "v"), "proj": ("o",), "fc": ("fc",),
                                            "out": ("down",)}
# peft's names and the real block's own module names, and what they stand for.
ALIASES: dict[str, tuple[str, ...]] = PEFT_ALIASES | {"qkv": ("q", "k", "v"), "proj": ("o",),
                                                      "out": ("down",)}


class BadTarget(ValueError):
    """A target the real GPT's blocks do not have; the message is one sentence."""


def parse_targets(text: str) -> tuple[str, ...]:
    """The short names ``text`` (comma-separated) targets, in block order (q, k, v, o, fc, down)."""
    return resolve_targets(text, PROJECTIONS, BadTarget,
                           "the real GPT's blocks (also named qkv, proj, fc, out)", ALIASES)


def adapter_params(n_layer: int, d_model: int, rank: int, targets: tuple[str, ...]) -> int:
    """Trainable parameters of rank-``rank`` adapters on ``targets`` in every block: ``r * (d_in + d_out)``
    each (the MLP is 4x as wide as the model)."""
    width = {"q": (1, 1), "k": (1, 1), "v": (1, 1), "o": (1, 1), "fc": (1, 4), "down": (4, 1)}
    return n_layer * sum(rank * d_model * sum(width[t]) for t in targets)


__all__ = ["ALIASES", "ALL_LINEAR", "DEFAULT_ALPHA", "DEFAULT_TARGETS", "MAX_RANK", "MODULE_PARTS",
           "PROJECTIONS", "BadTarget", "adapter_params", "parse_targets"]
