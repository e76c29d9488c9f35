"""FSDP's wrap units: which layers share one flat parameter, gathered and reduced together.

One unit per wrapped layer (by default every transformer block), after the *root*: one unit
holding every layer no wrap names (torch's FSDP flattens them into one parameter, index 0), or
with ``root="per_layer"`` one root unit per such layer, each its own flat buffer (``real_runs``'
fsdp).  A unit knows how many of its elements train (LoRA freezes the rest).
"""

from __future__ import annotations

from dataclasses import dataclass

from zero_sim.strategies.base import Context, StrategyError


@dataclass
class Unit:
    index: int
    layers: tuple[int, ...]  # layer indices, forward order
    numel: int
    is_root: bool
    trainable: int = -1  # elements that train (-1: all of them)

    @property
    def trained(self) -> int:
        return self.numel if self.trainable < 0 else self.trainable

    @property
    def label(self) -> int:
        """Collectives are named after the unit's first layer (a root of one unit: layer 0)."""
        return self.layers[0]


def wrap_units(ctx: Context, wrap: str, root: str) -> list[Unit]:
    """One unit per wrapped layer, after the root: one unit (index 0) holding every other layer,
    or with ``root="per_layer"`` one root unit per such layer, each its own flat buffer."""
    layers = ctx.workload.layers
    if wrap == "blocks":
        wrapped = [layer.index for layer in layers if layer.kind == "block"]
    elif wrap == "none":
        wrapped = []
    else:
        try:
            wrapped = sorted({int(x) for x in wrap.split(",") if x.strip()})
        except ValueError:
            raise StrategyError("--wrap must be 'blocks', 'none' or comma-separated layer indices, "
                                f"got {wrap!r}") from None
        bad = [i for i in wrapped if not 0 <= i < len(layers)]
        if bad:
            raise StrategyError(f"--wrap names layer {bad[0]}, which does not exist: the model has layers "
                                f"0..{len(layers) - 1}")
    root_layers = tuple(layer.index for layer in layers if layer.index not in wrapped)
    units = []
    def unit(index: int, held: tuple[int, ...], is_root: bool) -> Unit:
        return Unit(index, held, sum(layers[i].numel for i in held), is_root,
                    sum(layers[i].trainable_numel for i in held))

    if root_layers and root == "one":
        units.append(unit(0, root_layers, True))
    elif root_layers:
        units.extend(unit(k, (i,), True) for k, i in enumerate(root_layers))
    for i in wrapped:
        units.append(unit(len(units), (i,), False))
    return units
