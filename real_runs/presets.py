"""The real model's shapes, by name: plain data, importable without torch.

Sizes range from a model that trains in a blink on one core (``nano``) to GPT-2 medium's
and XL's shapes (``gpt2-350m``, ``gpt2-1.5b``, the simulator's presets of the same names),
so a step can be made long enough to time on any machine, a GPU included.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    d_model: int
    n_head: int
    vocab: int
    max_seq: int

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, GPTConfig] = {
    "nano": GPTConfig(n_layer=2, d_model=64, n_head=4, vocab=256, max_seq=64),        # ~0.13M
    "tiny": GPTConfig(n_layer=4, d_model=128, n_head=4, vocab=512, max_seq=64),       # ~0.9M
    "small": GPTConfig(n_layer=6, d_model=256, n_head=8, vocab=2048, max_seq=128),    # ~5.8M
    "medium": GPTConfig(n_layer=8, d_model=512, n_head=8, vocab=8192, max_seq=256),   # ~34M
    "gpt2-124m": GPTConfig(n_layer=12, d_model=768, n_head=12, vocab=50257, max_seq=1024),
    "gpt2-350m": GPTConfig(n_layer=24, d_model=1024, n_head=16, vocab=50257, max_seq=1024),
    "gpt2-1.5b": GPTConfig(n_layer=48, d_model=1600, n_head=25, vocab=50257, max_seq=1024),
}
