"""The timeline explorer: one scenario, live, as a Gantt per rank x stream and memory over time.

Every control is a ``simulate()`` setting or a knob of the chosen strategy; each change
re-simulates the step and redraws both axes, with the headline numbers above them and a
button that writes the step as a Chrome/Perfetto trace for a closer look.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from pathlib import Path

import ipywidgets as W

from zero_sim.scenario import ScenarioError, simulate
from zero_sim.ui.controls import DEFAULT_STRATEGY, error_html, metrics_html
from zero_sim.ui.figure import FIGURE_WIDTH, Figure, tidy_timeline
from zero_sim.ui.panel import ScenarioPanel, control_grid


class TimelineExplorer(ScenarioPanel):
    """One scenario, live: Gantt per rank x stream, memory over time, headline metrics, trace export.

    ``TimelineExplorer(strategy="ddp", topology="pcie", gpus=8)``: keywords are
    ``simulate()`` settings; those with a control start there, the rest are fixed.
    """

    SETTINGS = ("strategy", "model", "gpus", "topology", "bandwidth_gbps", "micro_batch", "recompute",
                "offload_optimizer")

    def __init__(self, settings: Iterable[str] = SETTINGS, knobs: Iterable[str] | str = "all",
                 max_ranks: int = 4, trace_dir: str | Path = "out", figsize=(FIGURE_WIDTH, 6.2),
                 auto: bool = True, **values):
        values.setdefault("strategy", DEFAULT_STRATEGY)
        values.setdefault("topology", "pcie")
        values.setdefault("gpus", 8)
        super().__init__(settings, values, knobs)
        self.max_ranks = max_ranks
        self.trace_dir = Path(trace_dir)
        self.metrics = W.HTML(layout=W.Layout(min_height="2.2em"))
        self.metrics.add_class("zs-metrics")
        self.errors = W.HTML()
        self.errors.add_class("zs-error")
        self.notes = W.HTML()
        self.trace_button = W.Button(description="save Perfetto trace", icon="download",
                                     tooltip="write this step as a Chrome/Perfetto trace JSON",
                                     layout=W.Layout(width="14em"))  # wide enough for the whole label
        self.trace_status = W.HTML()
        self.trace_status.add_class("zs-trace-status")
        self.trace_button.on_click(lambda _: self.save_trace())
        self.figure = Figure(figsize, nrows=2, height_ratios=[3, 2])
        # Left: the lane names; right: the legends of op kinds and memory, beside the data.
        self.figure.fig.subplots_adjust(left=0.15, right=0.85, top=0.95, bottom=0.08, hspace=0.35)
        self.widget = W.VBox([
            control_grid(self, list(settings) + self.knob_names),
            self.metrics, self.errors, self.figure.widget, self.notes,
            W.HBox([self.trace_button, self.trace_status]),
        ])
        self.widget.add_class("zs-timeline-explorer")
        self.watch()
        if auto:
            self.update()

    def update(self, *_):
        try:
            self.result = simulate(**self.settings())
            self.error = None
        except (ScenarioError, ValueError) as exc:
            self.result, self.error = None, str(exc)
        self.render()
        return self.result

    def render(self):
        fig = self.figure
        self.trace_status.value = ""  # a path written for the step shown before would name another step
        if self.error:
            self.metrics.value = ""
            self.errors.value = error_html(self.error)
            self.notes.value = ""
            fig.blank()  # the sentence is in the red line above: once is enough
            return
        self.errors.value = ""
        self.metrics.value = metrics_html(self.result.metrics)
        notes = list(self.result.notes)
        if len(self.result.simulated_ranks) < self.result.world_size:
            notes.append(f"all {self.result.world_size} ranks behave alike here, so one was simulated "
                         f"and its lanes are repeated")
        self.notes.value = "<small>" + " · ".join(html.escape(n) for n in notes) + "</small>" if notes else ""
        fig.clear()
        fig.restore_axes()
        ax_t, ax_m = fig.axes
        self.result.plot_timeline(ax=ax_t, max_ranks=self.max_ranks)
        self.result.plot_memory(ax=ax_m)
        tidy_timeline(ax_t)
        tidy_timeline(ax_m)
        ax_m.set_xlim(ax_t.get_xlim())
        fig.show()

    def save_trace(self, path: str | Path | None = None) -> Path | None:
        """Write the shown step as a Chrome/Perfetto trace; returns the path (None when nothing to save)."""
        if self.result is None:
            self.trace_status.value = "nothing to save: the settings above cannot be simulated"
            return None
        m = self.result.metrics
        if path is None:
            path = self.trace_dir / f"{m['strategy']}_{m['model']}_N{m['gpus']}_{m['topology']}.json"
        path = Path(path)
        trace = self.result.to_chrome_trace(path)
        self.trace_status.value = (f"wrote <code>{html.escape(str(path))}</code> "
                                   f"({len(trace['traceEvents']):,} events): open it at "
                                   f"<a href='https://ui.perfetto.dev' target='_blank'>ui.perfetto.dev</a>")
        return path


__all__ = ["TimelineExplorer"]
