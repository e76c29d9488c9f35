"""The look every figure shares: its width, its colours, and where its legend goes.

One palette, used by every figure (simulated and measured alike), so a reader learns it once:

* op kinds: forward blue, backward orange, recompute yellow, optimizer green, all_reduce
  red, reduce_scatter purple, all_gather brown, broadcast pink, fetch decisions cyan, waits
  and stalls grey, copies to and from host memory teal (d2h) and olive (h2d), the CPU's
  update green (:data:`COLORS`); everything on a rank's *host* lane (the CPU thread that
  launches the GPU's work: Python, autograd, the launches themselves) light grey
  (:data:`HOST_COLOR`), named in every timeline's legend;
* memory categories (:data:`MEMORY_COLORS`);
* strategies (:data:`STRATEGY_COLORS`, :func:`strategy_color`): a fixed colour per name, so
  a strategy keeps its colour from one chart (or one re-plan) to the next whatever else is
  drawn beside it; a strategy registered later gets one derived from its name alone.

Every figure fits a notebook: JupyterLab's content area is about 1100 px wide on a 1280-px
screen, and ipympl draws at 100 dpi, so a figure is at most :data:`FIGURE_WIDTH` inches wide
*including* its legend, which sits outside the data (:func:`legend_beside`,
:func:`legend_below`), never on it.  :mod:`zero_sim.ui.plots` re-exports all of it.
"""

from __future__ import annotations

import zlib

from zero_sim.strategies import STRATEGIES
from zero_sim.vocabulary import parse_op_name

# Inches: about 950 px at ipympl's 100 dpi, inside JupyterLab's ~1100 px content area at 1280 px.
FIGURE_WIDTH = 9.4

COLORS = {
    "fwd": "#4C72B0", "bwd": "#DD8452", "recompute": "#E8C547", "opt": "#55A868",
    "all_reduce": "#C44E52", "reduce_scatter": "#8172B3", "all_gather": "#937860",
    "broadcast": "#DA8BC3", "fetch": "#64B5CD", "wait": "#8C8C8C",
    "copy_out": "#A6C8E0", "copy_in": "#F2B98C", "fp8_cast": "#B8D98A", "amp_cast": "#D9C98A",
    "d2h": "#17BECF", "h2d": "#BCBD22", "cpu_adam": "#2CA02C",
    "all_to_all": "#B07AA1", "dequantize": "#9DB469", "secondary": "#C9B79C",
}
OP_COLORS = COLORS
HOST_COLOR = "#CFCFCF"
HOST_LABEL = "host (the CPU)"  # short: the legend sits beside the chart, inside the figure's width
MEMORY_COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868",
                 "activations": "#C44E52", "buffers": "#8172B3"}
# Okabe-Ito colours (distinguishable with the common colour-vision deficiencies), one per strategy.
STRATEGY_COLORS = dict(zip(STRATEGIES, ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7"), strict=True))
_MORE_STRATEGY_COLORS = ("#56B4E9", "#000000", "#999933", "#882255", "#44AA99", "#F0E442")


def strategy_color(name: str) -> str:
    """The colour of a strategy in every chart: its own, or one chosen by a stable hash of its name
    (crc32, not ``hash()``, which changes between Python sessions)."""
    if name in STRATEGY_COLORS:
        return STRATEGY_COLORS[name]
    return _MORE_STRATEGY_COLORS[zlib.crc32(name.encode()) % len(_MORE_STRATEGY_COLORS)]


def op_color(name: str, stream: str | None = None) -> str:
    """An op's colour: its kind's, or the host lane's for anything the CPU thread does."""
    if stream == "host":
        return HOST_COLOR
    try:
        return COLORS.get(parse_op_name(name).kind, "#8C8C8C")
    except ValueError:
        return "#8C8C8C"


def legend_beside(ax, handles=None, **kw):
    """The axis's legend outside its data, to the right, one entry per row (the figure leaves room)."""
    kw = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0, "fontsize": 8,
          "frameon": False} | kw
    return ax.legend(handles=handles, **kw) if handles is not None else ax.legend(**kw)


def legend_below(ax, handles=None, gap_pt: float = 30, **kw):
    """The axis's legend outside its data, under the tick labels and the x label (``gap_pt`` below
    the axis, in points, so the distance holds whatever the figure's height)."""
    from matplotlib.transforms import offset_copy

    below = offset_copy(ax.transAxes, fig=ax.figure, y=-gap_pt, units="points")
    kw = {"loc": "upper center", "bbox_to_anchor": (0.5, 0.0), "bbox_transform": below, "fontsize": 8,
          "frameon": False, "ncol": 4} | kw
    return ax.legend(handles=handles, **kw) if handles is not None else ax.legend(**kw)


__all__ = ["COLORS", "FIGURE_WIDTH", "HOST_COLOR", "HOST_LABEL", "MEMORY_COLORS", "OP_COLORS",
           "STRATEGY_COLORS", "legend_below", "legend_beside", "op_color", "strategy_color"]
