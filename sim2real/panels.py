"""A notebook panel that lays a real run over its prediction: load a run directory, or make one here.

``OverlayPanel(run_dir="out/z2h")`` shows, for the run in that directory, the measured
step drawn over the simulator's prediction of the same scenario
(:func:`zero_sim.ui.plots.plot_overlay`), the phase, op-category and memory tables of
:func:`sim2real.overlay.compare`, and a headline with the step-time error.  Two ways to
get a run in front of it:

* type a directory (one written by ``real_runs.train``: on this CPU, or copied from a
  GPU box) and press **load**;
* pick a strategy, a number of ranks, a model and a number of steps and press **run on
  this CPU**: the panel starts ``real_runs.train`` under ``torchrun`` with gloo
  (:func:`real_runs.launch.launch`), streams its lines into the log below the buttons,
  moves the progress bar with each finished step, and loads the result when it is done.

The panel has the shape of those in :mod:`zero_sim.ui.panels`: ``controls`` (name ->
widget), ``result`` (the :class:`~sim2real.overlay.Comparison` shown now, or None),
``error`` (one sentence when the directory, the run or the settings cannot be used;
printed in red where the figure was, never a traceback) and ``widget`` to display.
Loading does not happen when the directory box changes, only on **load**:
a half-typed path is not an error worth showing.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import ipywidgets as W
from IPython.display import display

import real_runs.launch
from sim2real.overlay import Comparison, OverlayError, compare, load_run
from sim2real.replay import ReplayError, predict_run
from zero_sim.calibration import CalibrationError
from zero_sim.scenario import ScenarioError
from zero_sim.ui.figure import FIGURE_WIDTH, Figure
from zero_sim.ui.plots import plot_overlay
from zero_sim.vocabulary import REAL_STRATEGIES

_STYLE = {"description_width": "9em"}
RANK_CHOICES = [1, 2, 3, 4]  # CPU ranks a run on this machine may use
_STEP_LINE = re.compile(r"^step (\d+)/(\d+)\b")
RUN_MODELS = ("nano", "tiny", "small", "medium")


def error_sentence_html(sentence: str) -> str:
    """One red sentence, styled as the other panels' refusals."""
    return (f"<div style='color:#b71c1c;background:#fdecea;padding:4px 8px;border-radius:4px'>"
            f"{html.escape(sentence)}</div>")


def headline_html(comp: Comparison) -> str:
    s = comp.summary
    ph = comp.phases

    def cell(row: str) -> str:
        p, m, e = ph.loc[row, "predicted_s"], ph.loc[row, "measured_s"], ph.loc[row, "error"]
        err = "n/a" if e != e else f"{e * 100:+.0f}%"
        return (f"<span style='margin-right:1.4em'><b>{row}</b> predicted {p * 1e3:.1f} ms · "
                f"measured {m * 1e3:.1f} ms <span class='zs-overlay-error'>({err})</span></span>")

    mapping = f": {s['mapping_note']}" if s["mapping_note"] else ""
    notes = [f"simulated as {s['simulated_strategy']}{mapping}", s["measured_step"], *s["notes"]]
    return (f"<div style='line-height:1.6'>{cell('step time')}{cell('compute')}{cell('exposed comm')}</div>"
            f"<small>{' · '.join(html.escape(n) for n in notes)}</small>")


class OverlayPanel:
    """Measured over predicted for one run directory, with a launcher for real gloo runs on this CPU."""

    def __init__(self, run_dir: str | Path | None = None, calibration=None,
                 out_dir: str | Path = "out/overlay",
                 strategy: str = "zero2-hook", nproc: int = 2, model: str = "tiny", steps: int = 3,
                 global_batch: int = 8, max_ranks: int = 2, figsize=(FIGURE_WIDTH, 4.8), auto: bool = True):
        self.out_dir = Path(out_dir)
        self.max_ranks = max_ranks
        self.calibration_object = None if isinstance(calibration, str | Path | type(None)) else calibration
        self.result: Comparison | None = None
        self.error: str | None = None
        self.lines: list[str] = []
        self.controls = {
            "run_dir": W.Text(value="" if run_dir is None else str(run_dir), description="run directory",
                              placeholder="a directory written by real_runs.train", style=_STYLE,
                              layout=W.Layout(width="36em")),
            "calibration": W.Text(value=str(calibration) if isinstance(calibration, str | Path) else "",
                                  description="calibration",
                                  placeholder="none (or a zero-sim calibrate file)",
                                  style=_STYLE, layout=W.Layout(width="36em"),
                                  disabled=self.calibration_object is not None),
            "strategy": W.Dropdown(options=list(REAL_STRATEGIES), value=strategy, description="strategy",
                                   style=_STYLE),
            "nproc": W.Dropdown(options=RANK_CHOICES, value=nproc, description="ranks (N)", style=_STYLE),
            "model": W.Dropdown(options=list(RUN_MODELS), value=model, description="model", style=_STYLE),
            "steps": W.BoundedIntText(value=steps, min=1, max=50, description="steps", style=_STYLE),
            "global_batch": W.BoundedIntText(value=global_batch, min=1, max=256, description="global batch",
                                             style=_STYLE),
        }
        if self.calibration_object is not None:
            self.controls["calibration"].placeholder = "(a Calibration object was given)"
        self.load_button = W.Button(description="load", icon="folder-open",
                                    tooltip="overlay the run in this directory")
        self.run_button = W.Button(description="run on this CPU", icon="play",
                                   tooltip="train with gloo on this machine, then overlay the run")
        self.progress = W.IntProgress(value=0, min=0, max=steps, description="steps done", style=_STYLE)
        self.log = W.Output(layout=W.Layout(max_height="8em", overflow="auto"))
        self.headline = W.HTML()
        self.headline.add_class("zs-metrics")
        self.errors = W.HTML()
        self.errors.add_class("zs-error")
        self.tables = W.HTML()
        self.figure = Figure(figsize)
        self.figure.fig.subplots_adjust(left=0.14, right=0.98, top=0.91, bottom=0.26)
        # The runs refuse a global batch that N does not split, so N offers only its divisors.
        self.controls["global_batch"].observe(self._ranks_follow_batch, names="value")
        self._ranks_follow_batch()
        self.load_button.on_click(lambda _: self.load())
        self.run_button.on_click(lambda _: self.run())
        launcher = W.HBox([W.VBox([self.controls["strategy"], self.controls["nproc"]]),
                           W.VBox([self.controls["model"], self.controls["steps"]]),
                           W.VBox([self.controls["global_batch"], self.run_button])])
        self.widget = W.VBox([
            W.HBox([self.controls["run_dir"], self.load_button]), self.controls["calibration"],
            launcher, self.progress, self.log, self.errors, self.headline, self.figure.widget, self.tables,
        ])
        self.widget.add_class("zs-overlay-panel")
        if auto and run_dir is not None:
            self.load()

    # ------------------------------------------------------------------ callbacks

    def calibration(self):
        if self.calibration_object is not None:
            return self.calibration_object
        text = self.controls["calibration"].value.strip()
        return text or None

    def load(self, run_dir: str | Path | None = None) -> Comparison | None:
        """Overlay the run in ``run_dir`` (default: the directory box); sets ``result`` or ``error``."""
        if run_dir is not None:
            self.controls["run_dir"].value = str(run_dir)
        text = self.controls["run_dir"].value.strip()
        try:
            if not text:
                raise OverlayError("Type the directory of a finished run (one written by real_runs.train) "
                                   "first.")
            run = load_run(Path(text).expanduser())
            sim = predict_run(run.run, self.calibration())
            self.result, self.error = compare(run, sim), None
        except (OverlayError, ReplayError, ScenarioError, CalibrationError) as exc:
            self.result, self.error = None, _sentence(exc)
        self.render()
        return self.result

    def run(self) -> Comparison | None:
        """Train the chosen strategy on this CPU (gloo), streaming its lines, then load what it wrote."""
        c = self.controls
        strategy, nproc, steps = c["strategy"].value, int(c["nproc"].value), int(c["steps"].value)
        out = self.out_dir / f"{strategy}-N{nproc}-{c['model'].value}"
        self.lines = []
        self.log.clear_output()
        self.progress.max, self.progress.value = steps, 0
        self.progress.bar_style = ""
        self.run_button.disabled = True
        try:
            real_runs.launch.launch(strategy, nproc=nproc, out=out, on_line=self._line,
                                    model=c["model"].value, steps=steps,
                                    global_batch=int(c["global_batch"].value), timeout_s=600)
        except (real_runs.launch.RunFailed, ValueError) as exc:
            self.progress.bar_style = "danger"
            self.result, self.error = None, _sentence(exc)
            self.render()
            return None
        finally:
            self.run_button.disabled = False
        self.progress.bar_style = "success"
        return self.load(out)

    def _ranks_follow_batch(self, _change=None) -> None:
        """Offer the rank counts (1-4) that split the global batch; keep N if it still does."""
        box, batch = self.controls["nproc"], int(self.controls["global_batch"].value)
        offered = [n for n in RANK_CHOICES if batch % n == 0]
        current = box.value if box.value in offered else max(n for n in offered if n <= box.value)
        if list(box.options) != offered:
            box.options = offered
        box.value = current

    def _line(self, line: str) -> None:
        self.lines.append(line)
        m = _STEP_LINE.match(line)
        if m:
            self.progress.max = int(m[2])
            self.progress.value = int(m[1])
        with self.log:
            print(line)

    # ------------------------------------------------------------------ drawing

    def render(self) -> None:
        fig = self.figure
        if self.error:
            self.errors.value = error_sentence_html(self.error)
            self.headline.value = ""
            self.tables.value = ""
            fig.blank()  # the sentence is shown once, above, in red
            return
        self.errors.value = ""
        comp = self.result
        self.headline.value = headline_html(comp)
        fig.clear()
        fig.restore_axes()
        ranks = range(min(comp.run.world_size, self.max_ranks))
        plot_overlay(comp, ax=fig.axes[0], ranks=ranks)
        fig.axes[0].tick_params(labelsize=8)
        fig.axes[0].title.set_fontsize(9)
        fig.show()
        boxes = []
        for title, table in (("phases", "phases"), (f"op categories, rank {comp.rank}", "categories"),
                             (f"memory, rank {comp.rank}", "memory")):
            frame = comp.pretty(table)
            boxes.append(f"<div style='margin-right:1.5em'><b>{html.escape(title)}</b>"
                         f"{frame.to_html(classes='zs-overlay-table', border=0)}</div>")
        style = "display:flex;flex-wrap:wrap;font-size:0.9em"
        self.tables.value = f"<div style='{style}'>{''.join(boxes)}</div>"

    def _ipython_display_(self):
        display(self.widget)


def _sentence(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "?", "!")) else text + "."


__all__ = ["OverlayPanel", "error_sentence_html", "headline_html"]
