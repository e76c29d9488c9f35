"""One file per strategy; this module maps the names on the command line to them."""

from zero_sim.vocabulary import REAL_STRATEGIES

from .base import AdamW, Strategy
from .ddp import DDP
from .ddp_torch import DDPTorch
from .fsdp import FSDP
from .fsdp_qwz import FSDPQwZ
from .fsdp_torch import FSDPTorch
from .zero1 import ZeRO1
from .zero2 import ZeRO2, ZeRO2Hook, ZeRO2Step

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (DDPTorch, DDP, ZeRO1, ZeRO2, ZeRO2Step, ZeRO2Hook, FSDP, FSDPTorch, FSDPQwZ)
}
assert set(STRATEGIES) == set(REAL_STRATEGIES), "strategy names must match zero_sim.vocabulary"

__all__ = ["STRATEGIES", "AdamW", "Strategy"]
