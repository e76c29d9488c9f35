"""Paste nccl-tests output, press fit: the link's fixed latency and bus bandwidth, and how well they fit.

nccl-tests prints, per message size, the time of one collective and its bus bandwidth.
A straight line ``time = latency + size / bandwidth`` fits such a table
(:func:`zero_sim.system.nccl_tests.fit_nccl_tests`); the panel shows the two numbers,
the worst relative error of the fit, and the measured bus bandwidth against the fitted
curve, where small messages never reach the link's bandwidth.
"""

from __future__ import annotations

from collections.abc import Mapping

import ipywidgets as W
import numpy as np
import pandas as pd

from zero_sim.system.collectives import CollectiveError
from zero_sim.system.nccl_tests import fit_nccl_tests, parse_nccl_tests
from zero_sim.ui.controls import STYLE, error_html
from zero_sim.ui.figure import FIGURE_WIDTH, Figure
from zero_sim.ui.panel import Panel
from zero_sim.ui.plots import COLORS, legend_below

MIB = 2**20


class NcclFitPanel(Panel):
    """Paste nccl-tests output, press fit: latency + bus bandwidth, and the fit against each row."""

    def __init__(self, tables: Mapping[str, str], collective: str = "all_reduce", figsize=(FIGURE_WIDTH, 3.4),
                 auto: bool = True):
        super().__init__()
        self.examples = dict(tables)
        first = next(iter(self.examples.values()), "")
        self.controls = {
            "example": W.Dropdown(options=list(self.examples) + ["(my own)"], description="table",
                                  style=STYLE),
            "text": W.Textarea(value=first, layout=W.Layout(width="95%", height="12em"),
                               placeholder="paste all_reduce_perf output here"),
            "collective": W.Dropdown(options=["all_reduce", "reduce_scatter", "all_gather"], value=collective,
                                     description="collective", style=STYLE),
        }
        self.button = W.Button(description="fit", icon="line-chart", button_style="primary")
        self.button.on_click(lambda _: self.update())
        self.summary = W.HTML()
        self.summary.add_class("zs-metrics")
        self.figure = Figure(figsize)
        self.figure.fig.subplots_adjust(left=0.08, right=0.98, top=0.88, bottom=0.3)  # the legend below
        self.widget = W.VBox([W.HBox([self.controls["example"], self.controls["collective"], self.button]),
                              self.controls["text"], self.summary, self.figure.widget])
        self.controls["example"].observe(self._pick, names="value")
        self.controls["collective"].observe(lambda _: self.update(), names="value")
        if auto:
            self.update()

    def _pick(self, change):
        if change["new"] in self.examples:
            self.controls["text"].value = self.examples[change["new"]]
            self.update()

    def update(self, *_):
        try:
            table = parse_nccl_tests(self.controls["text"].value, self.controls["collective"].value)
            fit = fit_nccl_tests(table)
            self.result, self.error = {"table": table, "fit": fit}, None
        except (CollectiveError, ValueError) as exc:
            self.result, self.error = None, str(exc)
        self.render()
        return self.result

    def frame(self) -> pd.DataFrame:
        """Each pasted row beside the fit's time for its size, and the fit's relative error."""
        table, fit = self.result["table"], self.result["fit"]
        return pd.DataFrame([{"size_MB": r.size_bytes / MIB, "measured_us": r.time_us,
                              "fitted_us": fit.time(r.size_bytes) * 1e6, "busbw_GBps": r.busbw_gbps,
                              "error": fit.time(r.size_bytes) * 1e6 / r.time_us - 1} for r in table.rows])

    def render(self):
        fig = self.figure
        if self.error:
            self.summary.value = error_html(self.error)
            fig.blank()  # the sentence is in the red line above: once is enough
            return
        table, fit = self.result["table"], self.result["fit"]
        self.summary.value = (f"{table.n_ranks} ranks · latency <b>{fit.latency_s * 1e6:.1f} us</b> · "
                              f"bus bandwidth <b>{fit.busbw / 1e9:.2f} GB/s</b> "
                              f"(= {fit.busbw * 8 / 1e9:.0f} Gbit/s) · worst error {fit.max_rel_error:.1%}")
        fig.clear()
        fig.restore_axes()
        ax = fig.axes[0]
        sizes = [r.size_bytes for r in table.rows]
        ax.plot([s / MIB for s in sizes], [r.busbw_gbps for r in table.rows], "o", color=COLORS["all_reduce"],
                label="measured busbw")
        grid = np.geomspace(min(sizes), max(sizes), 60)
        fitted = [fit.factor * s / fit.time(s) / 1e9 for s in grid]
        ax.plot(grid / MIB, fitted, "-", color="black",
                label=f"fit: {fit.latency_s * 1e6:.0f} us + size / {fit.busbw / 1e9:.1f} GB/s")
        ax.set_xscale("log")
        ax.set_xlabel("message size (MiB)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_ylim(0, max(r.busbw_gbps for r in table.rows) * 1.2)
        ax.set_title("small messages never reach the link's bandwidth: the fixed latency dominates",
                     fontsize=10)
        legend_below(ax, ncol=2)
        fig.show()


__all__ = ["NcclFitPanel"]
