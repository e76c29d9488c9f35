"""The planner panel: pick a model, GPUs and a topology, press plan, read which setup to use.

The search itself is :func:`zero_sim.plan.planner.plan`; this panel adds the controls, a
progress bar over the candidates, a one-paragraph verdict (the fastest candidate that
fits, or how far the leanest one is from fitting), the ranked table, and a chart of every
candidate's reserved memory (what must fit, one definition for table, chart and text) against
its step time.  Planning simulates dozens of scenarios,
so it runs when the reader presses **plan**, not on every control change.

The controls offer only what every strategy can run (:mod:`zero_sim.ui.offers`): the GPU
counts the topology's node size allows, for instance.  Candidates the simulator still
refuses on this cluster (hybrid sharding on one node) are counted apart from those that do
not fit in memory, with the reason (:func:`zero_sim.plan.planner.tally`).
"""

from __future__ import annotations

import html
from collections.abc import Iterable

import ipywidgets as W
from IPython.display import display

from zero_sim.plan.planner import candidates, plan, tally
from zero_sim.strategies import STRATEGIES
from zero_sim.system.workload import RECOMPUTE_MODES
from zero_sim.ui.controls import error_html, kind_of, read_value, setting_control
from zero_sim.ui.figure import FIGURE_WIDTH, Figure, in_kernel
from zero_sim.ui.offers import Offers
from zero_sim.ui.panel import Panel
from zero_sim.ui.plots import legend_beside, strategy_color
from zero_sim.ui.tables import readable
from zero_sim.ui.text import without_flags


def _bar(total: int):
    """A tqdm bar over the candidates, kept out of view until the panel places its widget."""
    from tqdm.notebook import tqdm

    return tqdm(total=total, desc="candidates", display=False)

# The columns the panel's table shows, few enough to fit JupyterLab's width (the whole ranking
# stays in ``result``), named in words by zero_sim.ui.tables.readable.
TABLE_COLUMNS = ["strategy", "knobs", "recompute", "outcome", "step_ms", "tokens_per_s", "tokens_per_s_low",
                 "tokens_per_s_high", "reserved_GB"]


class Planner(Panel):
    """Pick a model, GPUs and a topology; press plan: a ranked table and a chart of the candidates."""

    def __init__(self, model: str = "gpt2-1.5b", gpus: int = 8, topology: str = "dgx-a100",
                 micro_batch: int = 4, recompute: Iterable[str] = RECOMPUTE_MODES,
                 figsize=(FIGURE_WIDTH, 4), auto: bool = True, top: int = 12):
        super().__init__()
        self.recompute = tuple(recompute)
        self.top = top
        self.controls = {name: setting_control(name, value) for name, value in
                         (("model", model), ("gpus", gpus), ("topology", topology),
                          ("gpu", None), ("micro_batch", micro_batch))}
        # Offered: what every strategy at its defaults can run; the GPU count follows the topology.
        self.offers = Offers(self.controls, self.scenarios, leaders=("model", "topology"))
        with self.hold():
            self.offers.refresh()
        for name, w in self.controls.items():
            w.observe(lambda change, name=name: self._offer(name), names="value")
        self.button = W.Button(description="plan", icon="search", button_style="primary")
        self.button.on_click(lambda _: self.update())
        self.progress = _bar(1)
        self.summary = W.HTML()
        self.summary.add_class("zs-metrics")
        self.table = W.Output()
        self.figure = Figure(figsize)
        self.figure.fig.subplots_adjust(left=0.09, right=0.8, top=0.9, bottom=0.13)  # legend at the right
        c = self.controls
        self.widget = W.VBox([
            W.HBox([W.VBox([c["model"], c["topology"], c["gpu"]]), W.VBox([c["gpus"], c["micro_batch"]])]),
            W.HBox([self.button, self.progress.container]), self.summary, self.figure.widget, self.table])
        if auto:
            self.update()

    def settings(self, override: dict | None = None) -> dict:
        """The settings every candidate shares; ``override`` (name -> a value a control could hold)
        stands in for controls' own values."""
        override = override or {}
        return {name: read_value(w, override.get(name, w.value), kind_of(name))
                for name, w in self.controls.items()}

    def scenarios(self, override: dict | None = None) -> list[dict]:
        """The shared settings under each strategy at its defaults: what the controls must allow."""
        s = {k: v for k, v in self.settings(override).items() if v is not None}
        return [s | {"strategy": name} for name in STRATEGIES]

    def _offer(self, name: str) -> None:
        """A control moved: keep the others to what can run (planning waits for the button)."""
        if self._holding:
            return
        with self.hold():
            if name in self.offers.leaders:
                self.offers.conform()
            self.offers.refresh()
        self._stale()

    def _stale(self) -> None:
        """The controls no longer say what the table and chart show: say so at once, in both."""
        if getattr(self, "result", None) is None:
            return
        s = self.settings()
        self.summary.value = (f"<b>Settings changed</b> to {html.escape(str(s['model']))} on {s['gpus']} "
                              f"GPUs ({html.escape(str(s['topology']))}): press <b>plan</b> to search them. "
                              f"The chart and table below are still the previous plan's.")
        ax = self.figure.axes[0]
        ax.set_title(ax.get_title().split(" (previous plan")[0] + " (previous plan: press plan)", fontsize=10)
        self.figure.fig.canvas.draw_idle()

    def update(self, *_):
        s = self.settings()
        self.progress = _bar(len(candidates(None, self.recompute)))
        self.widget.children[1].children = (self.button, self.progress.container)
        self.result = plan(**s, recompute=self.recompute, progress=self.progress, top=self.top)
        self.progress.close()
        errors = self.result["error"]
        self.error = None if errors.isna().any() else f"no candidate could be simulated: {errors.iloc[0]}"
        self.render()
        return self.result

    def best(self):
        """The first candidate that fits in the plan's order, as a row (None when nothing fits): the
        fastest, or among those within 5% of it the one with the most room to spare."""
        df = self.result
        fitting = df[df["fits"]]
        return None if fitting.empty else fitting.iloc[0]

    def render(self):
        df = self.result
        best = self.best()
        self.summary.value = self._verdict(best)
        shown = readable(df.head(self.top), TABLE_COLUMNS)
        if in_kernel():
            self.table.clear_output(wait=True)
            with self.table:
                display(shown)
        self._chart(best)

    def _verdict(self, best) -> str:
        df = self.result
        if self.error:
            return error_html(self.error)
        counts = without_flags(tally(df))
        if best is None:
            least = df.dropna(subset=["reserved_GB"]).sort_values("reserved_GB").iloc[0]
            return (f"<b>nothing fits</b> ({html.escape(counts)}): the leanest candidate "
                    f"({least['strategy']}, {least['knobs']}, recompute {least['recompute']}) still needs "
                    f"{least['reserved_GB']:.1f} GB reserved of {least['capacity_GB']:.1f} GB. "
                    f"Try more GPUs, a smaller micro-batch, or a bigger GPU.")
        close = int(df["too_close_to_call"].sum()) - 1 if "too_close_to_call" in df else 0
        rivals = (f"; {close} other{'s' if close != 1 else ''} within 5% of it, too close to call"
                  if close > 0 else "")
        low, high = best.get("tokens_per_s_low"), best.get("tokens_per_s_high")
        known = low is not None and high is not None and low == low  # NaN where no interval applies
        likely = f" (likely {low:,.0f}-{high:,.0f})" if known else ""
        return (f"{html.escape(counts)}. First that fits (within 5% of the fastest, the most room): "
                f"<b>{best['strategy']}</b> ({best['knobs']}, recompute {best['recompute']}): "
                f"step {best['step_ms']:.1f} ms, {best['tokens_per_s']:,.0f} tokens/s{likely}, "
                f"{best['reserved_GB']:.1f} GB reserved of {best['capacity_GB']:.1f} GB{rivals}. "
                f"Stack: {best['stack']}.")

    def _chart(self, best):
        from matplotlib.lines import Line2D

        df, s = self.result, self.settings()
        fig = self.figure
        fig.clear()
        ax = fig.axes[0]
        ok = df.dropna(subset=["step_ms"])
        handles = []
        # Strategies in their registered order, each in its own colour: re-planning never recolours one.
        names = [n for n in STRATEGIES if n in set(ok["strategy"])]
        names += sorted(set(ok["strategy"]) - set(names))
        for name in names:
            group, color = ok[ok["strategy"] == name], strategy_color(name)
            fit, nofit = group[group["fits"]], group[~group["fits"]]
            _interval_bars(ax, fit, color)
            ax.scatter(fit["reserved_GB"], fit["step_ms"], color=color, s=30)
            ax.scatter(nofit["reserved_GB"], nofit["step_ms"], facecolors="none", edgecolors=color, s=30)
            handles.append(Line2D([], [], marker="o", linestyle="", color=color, label=name))
        grey = "#555555"
        handles += [Line2D([], [], marker="o", linestyle="", color=grey, label="filled: fits"),
                    Line2D([], [], marker="o", linestyle="", markerfacecolor="none", markeredgecolor=grey,
                           label="hollow: does not fit"),
                    Line2D([], [], marker="|", linestyle="", color=grey, alpha=0.5, markersize=10,
                           label="bar: likely (80%)")]
        if len(ok):
            ax.axvline(ok["capacity_GB"].iloc[0], color="black", linestyle="--", linewidth=1)
            handles.append(Line2D([], [], color="black", linestyle="--", linewidth=1, label="GPU memory"))
        if best is not None:
            # Above the dots, on a white box, so the words never sit on a candidate.
            ax.annotate("first that fits", (best["reserved_GB"], best["step_ms"]), xytext=(0, 36),
                        textcoords="offset points", fontsize=9, ha="center", arrowprops={"arrowstyle": "->"},
                        bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none"})
        # The chart plots what "fits" compares: the reserved figure against the GPU's memory.
        ax.set_xlabel("reserved memory per GPU (GB): tensors' peak + allocator reserve + context")
        ax.set_ylabel("step time (ms)")
        ax.set_title(f"{s['model']} on {s['gpus']} GPUs, {s['topology']}: every candidate that runs",
                     fontsize=10)
        legend_beside(ax, handles)
        fig.show()


def _interval_bars(ax, rows, color) -> None:
    """Each fitting candidate's likely step time (the 80% interval, zero_sim.intervals.speed) as a bar."""
    if "step_ms_low" not in rows or rows["step_ms_low"].isna().all():
        return
    below = (rows["step_ms"] - rows["step_ms_low"]).clip(lower=0)
    above = (rows["step_ms_high"] - rows["step_ms"]).clip(lower=0)
    ax.errorbar(rows["reserved_GB"], rows["step_ms"], yerr=[below, above], fmt="none", ecolor=color,
                alpha=0.35, linewidth=1)


__all__ = ["Planner"]
