"""Shared fixtures.  ``figures`` prints reproduction figures even when pytest captures output."""

from __future__ import annotations

import ast
import functools
import importlib
import signal
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"

# The simulator's tests run where only the simulator is installed (`pip install .`): the
# real runs and the bridge need torch (`.[real]`), the panels and notebooks JupyterLab and
# widgets (`.[lab]`).  A test file whose top-level imports need what cannot be imported here is
# skipped, with the reason, instead of failing at collection; the rule reads each file's
# imports, so a new test file cannot slip past it.
NEEDS = {"torch": "torch", "real_runs": "torch", "sim2real": "torch", "real_runs_helpers": "torch",
         "ipywidgets": "ipywidgets", "ipympl": "ipywidgets", "zero_sim.ui": "ipywidgets",
         "nbclient": "nbclient", "playwright": "playwright", "hta": "hta"}


@functools.cache
def why_not_importable(module: str) -> str | None:
    """None when ``module`` imports here; else why not, in words.  Importing is the only test:
    a package can be installed and still fail to import (a CUDA library missing, a version
    mismatch), raising OSError, ImportError or anything else rather than ModuleNotFoundError."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a broken install may raise anything; it means "not usable"
        return f"{type(exc).__name__}: {exc}"
    return None


def installed(module: str) -> bool:
    return why_not_importable(module) is None


def top_level_imports(path: Path) -> set[str]:
    """The modules a test file imports in its body (not inside functions), as written."""
    found = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def missing_requirement(path: Path) -> str | None:
    """What ``path`` needs and cannot import here, or None."""
    for module in sorted(top_level_imports(path)):
        for prefix, requirement in NEEDS.items():
            if (module == prefix or module.startswith(prefix + ".")) and not installed(requirement):
                return requirement
    return None


class NeedsWhatIsMissing(pytest.File):
    """A test file that needs what cannot be imported here: collected as skipped, with the reason,
    and never imported."""

    requirement: str = ""

    def collect(self):
        why = why_not_importable(self.requirement)
        raise pytest.skip.Exception(f"{self.path.name} needs {self.requirement}, which does not import "
                                    f"here ({why})", allow_module_level=True)


def pytest_pycollect_makemodule(module_path: Path, parent):
    requirement = missing_requirement(module_path) if module_path.name.startswith("test_") else None
    if requirement is None:
        return None
    skipped = NeedsWhatIsMissing.from_parent(parent, path=module_path)
    skipped.requirement = requirement
    return skipped


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
