"""What a strategy can do, declared on its class: the questions the rest of the project asks
instead of comparing strategy names.

* ``stage``: the ZeRO stage whose sharding its model states follow (the rule itself is
  :mod:`zero_sim.vocabulary.model_states`); :meth:`Capabilities.shards` answers per state;
* ``library``: whose implementation it models (DeepSpeed or PyTorch), which decides how a
  feature behaves under it (offload: DeepSpeed's CPU Adam or FSDP2's ``CPUOffloadPolicy``);
* ``placement``: which model states may live off the GPU (:class:`PlacementRule`), None for a
  strategy that has nothing to move there, with the sentence that says so;
* ``features``: the plug-ins it accepts (:data:`ZEROPP`, :data:`FP8_ALL_GATHER`).
"""

from __future__ import annotations

from dataclasses import dataclass

from zero_sim.vocabulary.model_states import sharded

DEEPSPEED, PYTORCH = "DeepSpeed", "PyTorch"
ZEROPP = "ZeRO++"  # DeepSpeed's quantized and hierarchical weight gathers and gradient reductions
FP8_ALL_GATHER = "float8 all-gather"  # FSDP2's float8 weights gathered at one byte an element


@dataclass(frozen=True)
class PlacementRule:
    """Which states a strategy's library may keep off the GPU (the optimizer state always may)."""

    params: str  # the weights: "never" (held whole), "with_optimizer" (DeepSpeed), "required" (FSDP2)
    nvme: bool = False  # states may go on to NVMe drives (DeepSpeed ZeRO-Infinity, stage 3 only)


@dataclass(frozen=True)
class Capabilities:
    stage: int
    library: str
    placement: PlacementRule | None = None
    cannot_place: str = ""  # why not, in one sentence, when ``placement`` is None
    features: frozenset[str] = frozenset()

    def shards(self, category: str) -> bool:
        """Whether the strategy shards the model state ``category`` over the ranks."""
        return sharded(self.stage, category)

    def accepts(self, feature: str) -> bool:
        return feature in self.features
