"""Several variants of one scenario, their timelines stacked on one shared time axis.

A comparison answers "what does this one change do to the step?": each variant lays its
own settings over the shared ones, all are simulated on every control change, and their
Gantt charts share one time axis so the longer step is visibly longer.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

import ipywidgets as W
import pandas as pd

from zero_sim.scenario import ScenarioError, simulate
from zero_sim.strategies import all_knobs
from zero_sim.sweep import summary_row
from zero_sim.ui.controls import error_html, kind_of, metrics_text, read_control, strategy_knob_names
from zero_sim.ui.figure import Figure, tidy_timeline
from zero_sim.ui.panel import ScenarioPanel, control_grid


class ComparePanel(ScenarioPanel):
    """Several variants of one scenario, their timelines stacked on one time axis.

    ``ComparePanel({"step": {"zero2_launch": "step"}, "hook": {"zero2_launch": "hook"}},
    strategy="zero2", settings=("gpus", "bandwidth_gbps"))``: each variant's settings are
    laid over the shared ones (a variant may change the strategy); ``result`` is a dict
    label -> SimResult, and ``errors`` label -> sentence for variants that were refused.
    """

    def __init__(self, variants: Mapping[str, Mapping[str, Any]],
                 settings: Iterable[str] = ("gpus", "bandwidth_gbps"), knobs: Iterable[str] = (),
                 max_ranks: int = 1, figsize=None, auto: bool = True, **values):
        values.setdefault("strategy", "ddp")
        super().__init__(settings, values, knobs)
        self._show_all_knobs()
        self.variants = {label: dict(v) for label, v in variants.items()}
        self.max_ranks = max_ranks
        self.errors: dict[str, str] = {}
        self.table = W.HTML()
        self.table.add_class("zs-metrics")
        self.error_box = W.HTML()
        self.error_box.add_class("zs-error")
        n = len(self.variants)
        lanes = max_ranks * 3
        self.figure = Figure(figsize or (9, 1.0 + n * (0.45 * lanes + 0.9)), nrows=n, sharex=True)
        self.figure.fig.subplots_adjust(left=0.16, right=0.98, top=0.95, bottom=0.1 + 0.1 / n, hspace=0.75)
        self.widget = W.VBox([control_grid(self, list(settings) + self.knob_names), self.table,
                              self.error_box, self.figure.widget])
        self.watch()
        if auto:
            self.update()

    def _show_all_knobs(self):
        # Knob controls here apply to whichever variants accept them, so all stay visible and enabled.
        for name in self.knob_names:
            self.controls[name].disabled = False
            self.controls[name].layout.display = None

    def on_control(self, name, change):
        super().on_control(name, change)
        self._show_all_knobs()

    def variant_settings(self, label: str) -> dict:
        """The ``simulate()`` keywords of one variant: the shared settings with the variant's laid over."""
        base = self.settings()
        # Knob controls were filtered by the shared strategy; re-add those this variant takes.
        v = self.variants[label]
        strategy = v.get("strategy", base["strategy"])
        own = set(strategy_knob_names(strategy))
        owners = all_knobs()
        out = {k: val for k, val in base.items() if k not in owners or k in own}
        for name in self.knob_names:
            if name in own:
                out[name] = read_control(self.controls[name], kind_of(name))
        for k, val in self.fixed.items():
            if k in owners and k in own:
                out[k] = val
        out.update(v)
        return {k: val for k, val in out.items() if val is not None}

    def update(self, *_):
        results, errors = {}, {}
        for label in self.variants:
            try:
                results[label] = simulate(**self.variant_settings(label))
            except (ScenarioError, ValueError) as exc:
                errors[label] = str(exc)
        self.result, self.errors = results, errors
        self.error = "; ".join(f"{k}: {v}" for k, v in errors.items()) or None
        self.render()
        return self.result

    def frame(self) -> pd.DataFrame:
        """One row of headline metrics per variant that could be simulated."""
        return pd.DataFrame({label: summary_row(r) for label, r in self.result.items()}).T.infer_objects()

    def render(self):
        rows = "".join(
            f"<tr><td><b>{html.escape(label)}</b></td><td>{html.escape(metrics_text(r.metrics))}</td></tr>"
            for label, r in self.result.items())
        self.table.value = f"<table>{rows}</table>"
        self.error_box.value = "".join(error_html(f"{k}: {v}") for k, v in self.errors.items())
        fig = self.figure
        fig.clear()
        fig.restore_axes()
        longest = max((r.metrics["step_time_s"] for r in self.result.values()), default=0) * 1e3
        for ax, label in zip(fig.axes, self.variants, strict=True):
            r = self.result.get(label)
            if r is None:
                ax.set_axis_off()
                ax.text(0.5, 0.5, f"{label}: {self.errors[label]}", ha="center", va="center", wrap=True,
                        color="#b71c1c", transform=ax.transAxes)
                continue
            m = r.metrics
            r.plot_timeline(ax=ax, max_ranks=self.max_ranks, legend=ax is fig.axes[-1],
                            title=f"{label}: step {m['step_time_s'] * 1e3:.2f} ms, exposed comm "
                                  f"{m['exposed_comm_s'] * 1e3:.2f} ms, optimizer phase "
                                  f"{m['phases']['optimizer_s'] * 1e3:.2f} ms")
            tidy_timeline(ax)
        # One legend for the whole figure, under the last axis's label.
        fig.fig.legends.clear()
        legend = next((ax.get_legend() for ax in reversed(fig.axes) if ax.get_legend()), None)
        if legend is not None:
            handles, labels = legend.legend_handles, [t.get_text() for t in legend.get_texts()]
            legend.remove()
            fig.fig.legend(handles, labels, loc="lower center", ncol=8, fontsize=8, frameon=False)
        fig.axes[-1].set_xlabel("time in step (ms)")
        for ax in fig.axes:
            if longest:
                ax.set_xlim(0, longest * 1.02)
            ax.xaxis.set_tick_params(labelbottom=True)
        fig.show()


__all__ = ["ComparePanel"]
