"""One matplotlib figure per panel, created once and redrawn in place on every change.

A panel recomputes on every slider release, so its figure must not be rebuilt each time.
Under the ``ipympl`` backend (``%matplotlib widget``) the figure's canvas *is* the
widget, and a redraw costs milliseconds; with any other backend (tests, static renders,
an executed notebook) the same figure is shown through an ``Output`` widget, cleared and
filled again after each redraw.
"""

from __future__ import annotations

import ipywidgets as W
import matplotlib
import matplotlib.figure
import matplotlib.pyplot as plt
from IPython import get_ipython
from IPython.display import display


def in_kernel() -> bool:
    """Whether this runs inside a Jupyter kernel (where displaying a widget or a figure shows it)."""
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def interactive_backend() -> bool:
    """Whether matplotlib draws on live ``ipympl`` canvases (``%matplotlib widget``)."""
    return "ipympl" in matplotlib.get_backend() or "widget" in matplotlib.get_backend()


class Figure:
    """One matplotlib figure reused for every redraw: a live canvas under ipympl, else an Output."""

    def __init__(self, figsize, nrows=1, height_ratios=None, sharex=False):
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

    def message(self, text: str):
        """Blank the axes and write ``text`` on the first one (shown when settings are refused)."""
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
    """Smaller type, and the legend under the ticks where the x label was (the axis below repeats it)."""
    ax.title.set_fontsize(9)
    ax.tick_params(labelsize=8)
    ax.set_xlabel("")
    legend = ax.get_legend()
    if legend is not None:
        legend.set_bbox_to_anchor((0.5, -0.06))
        legend.set_loc("upper center")


__all__ = ["Figure", "in_kernel", "interactive_backend", "tidy_timeline"]
