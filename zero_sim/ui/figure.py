"""One matplotlib figure per panel, created once and redrawn in place on every change.

A panel recomputes on every slider release, so its figure must not be rebuilt each time.
Under the ``ipympl`` backend (``%matplotlib widget``) the figure's canvas *is* the
widget, and a redraw costs milliseconds; with any other backend (tests, static renders,
an executed notebook) the same figure is shown through an ``Output`` widget, cleared and
filled again after each redraw.

Every panel's figure is at most :data:`~zero_sim.ui.plots.FIGURE_WIDTH` inches wide (legends
included), so it fits JupyterLab's content area on a 1280-px screen at ipympl's 100 dpi.
"""

from __future__ import annotations

import ipywidgets as W
import matplotlib
import matplotlib.figure
import matplotlib.pyplot as plt
from IPython import get_ipython
from IPython.display import display

from zero_sim.ui.plots import FIGURE_WIDTH


def in_kernel() -> bool:
    """Whether this runs inside a Jupyter kernel (where displaying a widget or a figure shows it)."""
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def interactive_backend() -> bool:
    """Whether matplotlib draws on live ``ipympl`` canvases (``%matplotlib widget``)."""
    return "ipympl" in matplotlib.get_backend() or "widget" in matplotlib.get_backend()


def toolbar_above(fig) -> None:
    """A notebook's own chart: ipympl's toolbar above it rather than over its left axis (where it
    hides the tick labels), and no "Figure 1" header. Nothing to do outside ipympl."""
    canvas = fig.canvas
    if hasattr(canvas, "toolbar_position"):
        canvas.toolbar_position = "top"
        canvas.header_visible = False


class Figure:
    """One matplotlib figure reused for every redraw: a live canvas under ipympl, else an Output."""

    def __init__(self, figsize, nrows=1, height_ratios=None, sharex=False):
        # A notebook author's wider figure would spill past the content area: narrowed to fit.
        figsize = (min(figsize[0], FIGURE_WIDTH), figsize[1])
        kw = {"gridspec_kw": {"height_ratios": height_ratios}} if height_ratios else {}
        if interactive_backend():
            with plt.ioff():
                self.fig = plt.figure(figsize=figsize)
            self.fig.canvas.header_visible = False
            self.fig.canvas.footer_visible = False
            self.fig.canvas.toolbar_position = "right"
            self.fig.canvas.resizable = False
            self.widget = self.fig.canvas
            self.live = True
        else:
            self.fig = matplotlib.figure.Figure(figsize=figsize)
            self.widget = W.Output()
            self.live = False
        axes = self.fig.subplots(nrows, 1, sharex=sharex, **kw)
        self.axes = list(axes) if nrows > 1 else [axes]

    def clear(self):
        for ax in self.axes:
            ax.clear()

    def show(self):
        if self.live:
            self.fig.canvas.draw_idle()
        elif in_kernel():
            self.widget.clear_output(wait=True)
            with self.widget:
                display(self.fig)

    def blank(self):
        """Clear and hide the axes (settings refused: the panel says why once, above the figure)."""
        self.clear()
        for ax in self.axes:
            ax.set_axis_off()
        self.show()

    def message(self, text: str):
        """Blank the axes and write ``text`` on the first one (for a panel with nowhere else to say it)."""
        self.clear()
        for ax in self.axes:
            ax.set_axis_off()
        self.axes[0].text(0.5, 0.5, text, ha="center", va="center", wrap=True, color="#b71c1c",
                          transform=self.axes[0].transAxes)
        self.show()

    def restore_axes(self):
        for ax in self.axes:
            ax.set_axis_on()


def tidy_timeline(ax):
    """Smaller type for a panel's axis (its title, ticks and their unit); the legend stays right of it."""
    ax.title.set_fontsize(9)
    ax.tick_params(labelsize=8)
    ax.xaxis.label.set_fontsize(8)
    ax.yaxis.label.set_fontsize(8)


__all__ = ["FIGURE_WIDTH", "Figure", "in_kernel", "interactive_backend", "tidy_timeline", "toolbar_above"]
