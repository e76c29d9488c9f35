"""The overlay panel, driven as a reader drives it: type a directory, press load, press run.

The runs are the shared cached ones of ``tests/real_runs_helpers.py``.  Pressing **run
on this CPU** for real costs a torchrun; the callback's wiring (progress, log, loading
what was written, refusals) is checked here with ``launch`` swapped for a stand-in that
prints what torchrun would print and copies a cached run; notebook 06 and the real-run
tests launch for real.
"""

from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import matplotlib
import pytest

matplotlib.use("Agg")

from real_runs_helpers import real_run  # noqa: E402

import real_runs.launch  # noqa: E402
from sim2real.overlay import Comparison  # noqa: E402
from sim2real.panels import OverlayPanel  # noqa: E402


@pytest.fixture(scope="module")
def runs():
    with ThreadPoolExecutor(max_workers=2) as pool:
        outs = pool.map(lambda s: real_run(s, 2)[1], ("zero2-step", "zero2-hook"))
        return dict(zip(("zero2-step", "zero2-hook"), outs, strict=True))


def text(widget) -> str:
    return re.sub(r"<[^>]+>", "", widget.value)


def test_changing_the_directory_and_pressing_load_shows_the_other_run(runs):
    panel = OverlayPanel(run_dir=runs["zero2-step"])
    first = panel.result
    assert isinstance(first, Comparison) and panel.error is None
    assert first.summary["strategy"] == "zero2-step"
    assert "step time" in text(panel.headline) and "model states" in text(panel.tables)

    panel.controls["run_dir"].value = runs["zero2-hook"]
    assert panel.result is first  # typing alone loads nothing
    panel.load_button.click()
    assert panel.result is not first
    assert panel.result.summary["strategy"] == "zero2-hook"
    assert panel.error is None and panel.errors.value == ""
    step_ms = panel.result.summary["predicted_step_s"] * 1e3
    assert f"predicted {step_ms:.1f} ms" in text(panel.headline)
    ax = panel.figure.axes[0]
    assert "zero2-hook" in ax.get_title() and ax.collections


def test_a_directory_that_is_not_a_run_is_one_red_sentence(runs, tmp_path):
    panel = OverlayPanel(run_dir=runs["zero2-hook"])
    panel.controls["run_dir"].value = str(tmp_path)
    panel.load_button.click()
    assert panel.result is None
    assert panel.error == (f"{tmp_path} has no run.json: the run did not finish, "
                           f"or this is not a run directory.")
    assert "#b71c1c" in panel.errors.value and "Traceback" not in panel.errors.value
    assert panel.headline.value == "" and panel.tables.value == ""

    panel.controls["run_dir"].value = ""
    panel.load_button.click()
    assert panel.error.startswith("Type the directory")


def test_an_unreadable_calibration_file_is_one_red_sentence(runs, tmp_path):
    panel = OverlayPanel(run_dir=runs["zero2-hook"], calibration=tmp_path / "missing.json")
    assert panel.result is None and panel.error.endswith(".") and "\n" not in panel.error
    panel.controls["calibration"].value = ""
    panel.load_button.click()
    assert panel.error is None and panel.result.summary["calibration"] is None


def test_run_streams_progress_and_loads_what_it_wrote(runs, tmp_path, monkeypatch):
    calls = []

    def fake_launch(strategy, nproc, out, on_line, **flags):
        calls.append((strategy, nproc, flags))
        for k in range(1, flags["steps"] + 1):
            on_line(f"step {k}/{flags['steps']} loss 6.0 time 0.1s")
        shutil.copytree(runs["zero2-hook"], out)
        return {}

    monkeypatch.setattr(real_runs.launch, "launch", fake_launch)
    panel = OverlayPanel(out_dir=tmp_path, strategy="zero2-hook", steps=2, model="nano")
    assert panel.result is None and panel.error is None  # nothing to show before a run
    panel.run_button.click()
    assert calls == [("zero2-hook", 2, {"model": "nano", "steps": 2, "global_batch": 8, "timeout_s": 600})]
    assert panel.progress.value == panel.progress.max == 2 and panel.progress.bar_style == "success"
    assert panel.lines[-1].startswith("step 2/2")
    assert panel.controls["run_dir"].value == str(tmp_path / "zero2-hook-N2-nano")
    assert panel.result.summary["strategy"] == "zero2-hook" and not panel.run_button.disabled


def test_the_rank_choices_are_the_ones_that_split_the_global_batch():
    panel = OverlayPanel(nproc=3, global_batch=12)
    ranks = panel.controls["nproc"]
    assert list(ranks.options) == [1, 2, 3, 4] and ranks.value == 3
    panel.controls["global_batch"].value = 8  # 3 no longer splits it: the largest N below that does
    assert list(ranks.options) == [1, 2, 4] and ranks.value == 2
    panel.controls["global_batch"].value = 7
    assert list(ranks.options) == [1] and ranks.value == 1


def test_a_failed_run_is_one_red_sentence(tmp_path, monkeypatch):
    panel = OverlayPanel(out_dir=tmp_path)

    def failing(*_a, **_k):
        raise real_runs.launch.RunFailed("The run failed: rank 1 raised RuntimeError: "
                                         "injected fault at step 0.")

    monkeypatch.setattr(real_runs.launch, "launch", failing)
    panel.controls["global_batch"].value = 8
    panel.run_button.click()
    assert panel.error == "The run failed: rank 1 raised RuntimeError: injected fault at step 0."
    assert panel.progress.bar_style == "danger" and "#b71c1c" in panel.errors.value
    assert panel.result is None and not panel.run_button.disabled
