"""Shared fixtures.  ``figures`` prints reproduction figures even when pytest captures output."""

from __future__ import annotations

import importlib.util
import signal
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"

# The simulator's tests run where only the simulator is installed (`pip install .`): the
# real runs and the bridge need torch (`.[real]`), the panels and notebooks JupyterLab and
# widgets (`.[lab]`), and without them those files are not collected.
NEEDS = {
    "torch": ["test_real_runs_*.py", "test_replay.py", "test_overlay*.py", "test_validate.py"],
    "ipywidgets": ["test_ui_*.py", "test_overlay_panel.py", "test_notebooks.py", "test_browser.py"],
}
collect_ignore_glob = [glob for module, globs in NEEDS.items() if not importlib.util.find_spec(module)
                       for glob in globs]


# Tests send SIGHUP to the processes they start and expect its default action (to end them);
# a suite started under nohup would hand its "ignore SIGHUP" down to every child instead.
if hasattr(signal, "SIGHUP"):
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.fixture
def figures(capsys):
    def show(*lines: str) -> None:
        with capsys.disabled():
            print()
            for line in lines:
                print("    " + line)

    return show


@pytest.fixture
def data_dir() -> Path:
    return DATA


# Module fixtures that launch real multi-process runs: a test that needs one is as slow as they are.
REAL_RUN_FIXTURES = {"runs", "comparisons"}


def pytest_collection_modifyitems(items):
    # Every property-based test is also a fuzz test: `make fuzz` runs them alone with
    # ZERO_SIM_FUZZ_EXAMPLES=10000 where the test reads it (the suite's default is a few hundred).
    for item in items:
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.fuzz)
        if REAL_RUN_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
