"""LoRA targets by name: which projections of a block get adapters, as the simulator and the real
runs both read them.

One rule for both halves, so that a replay puts its adapters where the run did: names are
peft's ``target_modules`` (``q_proj`` ... ``down_proj``, GPT-2's fused ``c_attn`` standing for q, k
and v, ``c_fc``), the short names (``q``, ``k``, ``v``, ``o``, ``gate``, ``up``, ``down``, ``fc``) or
``all-linear`` (every projection of the block, peft's shorthand); a caller adds its own names
(the real block's module names) and says which short names its blocks have.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

ALL_LINEAR = "all-linear"
DEFAULT_TARGETS = "q,v"  # peft's default for Llama-style models
MAX_RANK = 4096
# peft's module names (Llama, GPT-2, BERT-style) and the short names they stand for.
PEFT_ALIASES: dict[str, tuple[str, ...]] = {
    "q_proj": ("q",), "k_proj": ("k",), "v_proj": ("v",), "o_proj": ("o",), "gate_proj": ("gate",),
    "up_proj": ("up",), "down_proj": ("down",), "c_attn": ("q", "k", "v"), "c_fc": ("fc",),
    "out_proj": ("o",), "dense": ("o",),
}


def resolve_targets(text: str, have: Iterable[str], error: type[ValueError], where: str,
                    aliases: Mapping[str, tuple[str, ...]] = PEFT_ALIASES) -> tuple[str, ...]:
    """The short names ``text`` (comma-separated) targets among ``have`` (a block's projections, in
    block order), in that order; a name the block does not have raises ``error`` with one sentence
    naming ``where`` and what it has."""
    have = tuple(have)
    wanted: list[str] = []
    for name in (t.strip() for t in text.split(",") if t.strip()):
        if name == ALL_LINEAR:
            wanted += list(have)
            continue
        for short in aliases.get(name, (name,)):
            if short not in have:
                raise error(f"LoRA target {name!r} is not a projection of {where}; it has "
                            f"{', '.join(have)} (or {ALL_LINEAR})")
            wanted.append(short)
    if not wanted:
        raise error(f"--lora-targets names no projection; give some of {', '.join(have)} or {ALL_LINEAR}")
    return tuple(t for t in have if t in wanted)
