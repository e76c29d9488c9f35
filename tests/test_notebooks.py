"""Every notebook runs top to bottom, headless, in under a minute, and leaves no widget broken.

Each notebook is executed from a scratch copy of ``notebooks/`` (so traces and sweeps it
writes land outside the source tree) by a fresh ``python3`` kernel of the running
interpreter, exactly as a reader's "Run All" would.  A notebook passes when:

* no cell raises, and no cell prints a traceback to stderr;
* the whole notebook finishes within 60 s (the budget on a 2-core CI machine);
* every widget view in the outputs points at a widget model whose state was saved, so a
  reader opening the executed notebook sees live panels, not "model not found";
* every figure its prose quotes (a number with a unit in a Markdown cell) is one a cell's code
  or output shows (``tests/notebook_prose.py``), so a change to the model cannot leave the
  text quoting numbers the cells no longer print.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.notebook_prose import unshown_figures

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(p.name for p in NOTEBOOKS_DIR.glob("*.ipynb"))


def _executed(name: str):
    """A notebook to execute; one that starts real multi-process runs is marked slow, as those runs are,
    and so is one that parses a recorded profiler trace and replays its run (torch on the meta device):
    seconds alone, over the budget beside the parallel suite on two cores."""
    code = "\n".join(c.source for c in nbformat.read(NOTEBOOKS_DIR / name, as_version=4).cells
                     if c.cell_type == "code")
    heavy = any(call in code for call in ("launch(", "launch_in_cluster(", "calibration_from_traces("))
    return pytest.param(name, marks=pytest.mark.slow) if heavy else name
BUDGET_S = 60.0
MAX_UNSHOWN = 3  # prose figures no cell shows, per notebook: a published figure quoted (none from the model)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def test_the_suite_has_its_notebooks():
    for stem in ("00_quickstart", "01_memory_for_engineers", "02_timeline_explorer",
                 "03_ddp_buckets_and_interconnects", "04_zero2_backward_hooks", "05_zero3_on_slow_networks",
                 "06_real_runs_overlay", "07_planner", "08_reading_a_real_trace",
                 "09_play_a_step_and_check_yourself", "10_bring_your_own_trace"):
        assert f"{stem}.ipynb" in NOTEBOOKS, f"notebooks/{stem}.ipynb is missing"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{name}: cells {dirty} carry outputs; strip them before committing"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_opens_with_what_you_learn_and_ends_with_what_to_try_and_the_course_s_next_step(name):
    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    first, tries, last = nb.cells[0], nb.cells[-2], nb.cells[-1]
    assert first.cell_type == "markdown" and "what you will learn" in first.source.lower()
    assert tries.cell_type == "markdown" and "what to try next" in tries.source.lower()
    # The next notebook comes from the course's one list, never from a hand-typed one.
    assert last.cell_type == "code" and f'next_in_course("{Path(name).stem}")' in last.source


@pytest.fixture
def scratch(tmp_path):
    work = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOKS_DIR, work, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "out"))
    return work


@pytest.mark.parametrize("name", [_executed(n) for n in NOTEBOOKS])
def test_notebook_runs_headless_within_budget(name, scratch):
    nb = nbformat.read(scratch / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=int(BUDGET_S), kernel_name="python3",
                                     resources={"metadata": {"path": str(scratch)}}, store_widget_state=True)
    with client.setup_kernel():
        # The budget is the notebook's own work, timed once its kernel is up: a kernel slow to start
        # (a port to retry, a cold import cache) is the machine's, not the notebook's.
        start = time.perf_counter()
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)  # raises CellExecutionError, naming the cell, if it fails
        elapsed = time.perf_counter() - start
        client.set_widgets_metadata()
    print(f"{name}: executed in {elapsed:.1f} s")
    assert elapsed < BUDGET_S, f"{name} took {elapsed:.1f} s, over the {BUDGET_S:.0f} s budget"

    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            assert out.output_type != "error", f"{name} cell {i}: {out.get('ename')}: {out.get('evalue')}"
            if out.output_type == "stream" and out.name == "stderr":
                assert "Traceback" not in out.text, f"{name} cell {i} printed a traceback:\n{out.text}"

    widget_state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    saved = widget_state.get("state", {})
    views = [out.data[WIDGET_VIEW]["model_id"] for cell in nb.cells for out in cell.get("outputs", [])
             if out.output_type == "display_data" and WIDGET_VIEW in out.get("data", {})]
    missing = [v for v in views if v not in saved]
    assert not missing, (f"{name}: widget views without a saved model (broken in the reader's browser): "
                         f"{missing}")

    # One execution serves every check: the prose's figures against what the cells show.
    unshown = unshown_figures(nb)
    assert len(unshown) <= MAX_UNSHOWN, (
        f"{name}: the prose quotes figures no cell shows (print them, or build the sentence from the "
        f"result): " + "; ".join(f"cell {i}: {figure!r}" for i, figure in unshown))
