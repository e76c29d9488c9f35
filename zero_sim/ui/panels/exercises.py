"""Exercises in the notebook: the learner sets controls, **check** says right or wrong and why,
and the answer waits behind a button.

The judging is :mod:`zero_sim.ui.exercise_checks` (the simulator, against the best of every
choice the exercise offers); this module is only the widgets.  Each exercise is an
:class:`Exercise` whose ``check()`` returns the :class:`~zero_sim.ui.exercise_checks.Verdict`
it shows, so a notebook (or a test) can also drive it from code.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

import ipywidgets as W
from IPython.display import display

from zero_sim.ui.controls import STYLE
from zero_sim.ui.exercise_checks import (
    BUCKET_SIZES_MB,
    FIT_MICRO_BATCHES,
    FIT_RECOMPUTE,
    FIT_STRATEGIES,
    Verdict,
    check_bucket,
    check_fit,
    check_slowdown,
)

RIGHT, WRONG = "#2e7d32", "#c62828"


class Exercise:
    """A prompt, the learner's controls, a **check** button and a **show the answer** button."""

    def __init__(self, prompt: str, controls: dict[str, W.ValueWidget], judge: Callable[..., Verdict]):
        self.controls, self.judge = controls, judge
        self.verdict: Verdict | None = None
        self.feedback = W.HTML()
        self.answer = W.HTML()
        check = W.Button(description="check", button_style="primary")
        reveal = W.Button(description="show the answer")
        check.on_click(lambda _b: self.check())
        reveal.on_click(lambda _b: self.reveal())
        self.widget = W.VBox([W.HTML(prompt), *controls.values(), W.HBox([check, reveal]), self.feedback,
                              self.answer])

    def check(self) -> Verdict:
        """Judge the controls' values now; say right or wrong, and why, under the buttons."""
        self.verdict = self.judge(**{name: c.value for name, c in self.controls.items()})
        color, word = (RIGHT, "Right.") if self.verdict.right else (WRONG, "Not yet.")
        self.feedback.value = f"<div style='color:{color}'><b>{word}</b> {escape(self.verdict.why)}</div>"
        return self.verdict

    def reveal(self) -> str:
        """Show the answer (the judge is asked with the controls as they are, for its answer text)."""
        verdict = self.verdict or self.judge(**{name: c.value for name, c in self.controls.items()})
        self.answer.value = f"<div style='color:#555555'><b>Answer.</b> {escape(verdict.answer)}</div>"
        return verdict.answer

    def _ipython_display_(self):
        display(self.widget)


def fit_exercise() -> Exercise:
    """Make GPT 7.5B fit on 8 x A100-40GB with the least slowdown."""
    return Exercise(
        "<b>Exercise 1.</b> A 7.5-billion-parameter model must train on one node of 8 A100-40GB GPUs. "
        "Choose a strategy, an activation recompute mode and a micro-batch so that it <b>fits</b>, "
        "and as fast as possible (within 5% of the fastest choice that fits counts as right).",
        {"strategy": W.Dropdown(options=FIT_STRATEGIES, value=FIT_STRATEGIES[0], description="strategy",
                                style=STYLE),
         "recompute": W.Dropdown(options=FIT_RECOMPUTE, value="none", description="recompute", style=STYLE),
         "micro_batch": W.Dropdown(options=FIT_MICRO_BATCHES, value=1, description="micro-batch",
                                   style=STYLE)},
        check_fit)


def bucket_exercise() -> Exercise:
    """Pick the DDP bucket size that leaves the least all-reduce exposed on PCIe."""
    return Exercise(
        "<b>Exercise 2.</b> GPT-2 124M under DDP on 8 GPUs sharing one PCIe switch, micro-batch 8 "
        "(notebook 00's step). Pick the gradient <b>bucket size</b> that hides the most all-reduce "
        "behind the backward pass.",
        {"bucket_mb": W.SelectionSlider(options=BUCKET_SIZES_MB, value=1, description="bucket (MiB)",
                                        style=STYLE)},
        check_bucket)


def slowdown_exercise() -> Exercise:
    """Predict how much slower a ZeRO-3 step gets when the network drops from 1,600 to 100 Gbit/s."""
    return Exercise(
        "<b>Exercise 3.</b> GPT-2 1.5B under ZeRO-3 on two p4d nodes (16 A100s), micro-batch 4. Each "
        "node's network drops from 1,600 to 100 Gbit/s. <b>Predict</b> how many times longer a step "
        "takes (1 = no change), then check (within 25% counts as right).",
        {"predicted": W.FloatText(value=1.0, description="times longer", style=STYLE)},
        check_slowdown)


__all__ = ["Exercise", "bucket_exercise", "fit_exercise", "slowdown_exercise"]
