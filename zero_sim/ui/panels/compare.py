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

from zero_sim.plan.sweep import summary_row
from zero_sim.scenario import ScenarioError, simulate
from zero_sim.strategies import all_knobs
from zero_sim.ui.controls import (
    DEFAULT_STRATEGY,
    error_html,
    kind_of,
    knob_default,
    metrics_text,
    optimizer_text,
    read_value,
    set_control,
    strategy_knob_names,
)
from zero_sim.ui.figure import FIGURE_WIDTH, Figure, tidy_timeline
from zero_sim.ui.panel import ScenarioPanel, control_grid
from zero_sim.ui.plots import ranks_shown


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
        values.setdefault("strategy", DEFAULT_STRATEGY)
        # Before the controls: what each control offers is asked of every variant.
        self.variants = {label: dict(v) for label, v in variants.items()}
        self.max_ranks = max_ranks
        super().__init__(settings, values, knobs)
        self.errors: dict[str, str] = {}
        self.table = W.HTML()
        self.table.add_class("zs-metrics")
        self.error_box = W.HTML()
        self.error_box.add_class("zs-error")
        n = len(self.variants)
        lanes = max_ranks * 3
        self.figure = Figure(figsize or (FIGURE_WIDTH, 1.0 + n * (0.45 * lanes + 0.9)), nrows=n, sharex=True)
        self.figure.fig.subplots_adjust(left=0.16, right=0.98, top=0.95, bottom=0.1 + 0.1 / n, hspace=0.6)
        self.widget = W.VBox([control_grid(self, list(settings) + self.knob_names), self.table,
                              self.error_box, self.figure.widget])
        self.watch()
        if auto:
            self.update()

    def _sync_knobs(self, reset: bool):
        # Knob controls here apply to whichever variants accept them, so all stay visible and enabled.
        strategy = self._strategy_value()
        for name in self.knob_names:
            self.controls[name].disabled = False
            self.controls[name].layout.display = None
            if reset and name in strategy_knob_names(strategy):
                set_control(self.controls[name], knob_default(strategy, name))

    def active(self, name: str) -> bool:
        return True  # every knob control applies to the variants that take it

    def scenarios(self, override: Mapping[str, Any] | None = None) -> list[dict]:
        return [self.variant_settings(label, override) for label in self.variants]

    def variant_settings(self, label: str, override: Mapping[str, Any] | None = None) -> dict:
        """The ``simulate()`` keywords of one variant: the shared settings with the variant's laid over
        (``override`` as in :meth:`settings`)."""
        override = dict(override or {})
        base = self.settings(override)
        # Knob controls were filtered by the shared strategy; re-add those this variant takes.
        v = self.variants[label]
        strategy = v.get("strategy", base["strategy"])
        own = set(strategy_knob_names(strategy))
        owners = all_knobs()
        out = {k: val for k, val in base.items() if k not in owners or k in own}
        for name in self.knob_names:
            if name in own:
                w = self.controls[name]
                out[name] = read_value(w, override.get(name, w.value), kind_of(name))
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
            # The label never wraps ("ZeRO-" / "2"); the metrics wrap at spaces beside it.
            f"<tr><td style='white-space:nowrap;vertical-align:top;padding-right:1em'><b>{html.escape(label)}"
            f"</b></td><td>{html.escape(metrics_text(r.metrics))}</td></tr>"
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
                # The reason is in the red line above the figure; saying it twice is noise.
                ax.set_axis_off()
                ax.text(0.5, 0.5, f"{label}: not simulated (the reason is above)", ha="center", va="center",
                        color="#b71c1c", transform=ax.transAxes)
                continue
            m = r.metrics
            r.plot_timeline(ax=ax, max_ranks=self.max_ranks, legend=ax is fig.axes[-1], say_ranks=False,
                            title=f"{label}: step {m['step_time_s'] * 1e3:.1f} ms, exposed comm "
                                  f"{m['exposed_comm_s'] * 1e3:.1f} ms, {optimizer_text(m['phases'], 1)}")
            tidy_timeline(ax)
        # One legend for the whole figure, under the last axis's label.
        fig.fig.legends.clear()
        legend = next((ax.get_legend() for ax in reversed(fig.axes) if ax.get_legend()), None)
        if legend is not None:
            handles, labels = legend.legend_handles, [t.get_text() for t in legend.get_texts()]
            legend.remove()
            fig.fig.legend(handles, labels, loc="lower center", ncol=8, fontsize=8, frameon=False)
        # Which ranks the lanes are, once for every chart, as the last axis's caption.
        world = max((r.world_size for r in self.result.values()), default=0)
        shown = ranks_shown(min(world, self.max_ranks), world)
        fig.axes[-1].set_xlabel("time in step (ms)" + (f"; {shown}" if shown else ""))
        for ax in fig.axes:
            if longest:
                ax.set_xlim(0, longest * 1.02)
            ax.xaxis.set_tick_params(labelbottom=True)
        fig.show()


__all__ = ["ComparePanel"]
