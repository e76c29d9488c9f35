"""The suite collects where only the simulator is installed: files needing torch or widgets step aside.

``conftest.py`` reads each test file's imports; this test hides torch and ipywidgets from a
fresh pytest (a plugin sets them to None in ``sys.modules`` before anything is collected) and
checks that collection still succeeds, that the simulator's tests are collected, and that
every file importing the real runs, the bridge or the panels is left out rather than erroring.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import installed, missing_requirement, top_level_imports

TESTS = Path(__file__).parent

HIDE = "import sys\nfor name in ('torch', 'ipywidgets'):\n    sys.modules[name] = None\n"


def test_without_torch_and_widgets_the_suite_collects_and_skips_what_needs_them(tmp_path):
    (tmp_path / "hide_heavy_modules.py").write_text(HIDE)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "hide_heavy_modules",
         "-p", "no:cacheprovider", str(TESTS)],
        capture_output=True, text=True, timeout=300, cwd=TESTS.parent,
        env={"PYTHONPATH": f"{tmp_path}:{TESTS}", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    collected = {line.split("::")[0].rsplit("/", 1)[-1] for line in done.stdout.splitlines() if "::" in line}
    assert "test_sim_engine.py" in collected and "test_settings.py" in collected
    for needs_torch in ("test_recorder.py", "test_real_run_traces.py", "test_gpu_grid.py", "test_replay.py"):
        assert needs_torch not in collected
    for needs_widgets in ("test_panel_controls.py", "test_ui_panels.py"):
        assert needs_widgets not in collected


def test_the_rule_reads_a_files_own_imports(tmp_path):
    test = tmp_path / "test_example.py"
    test.write_text("import json\nfrom real_runs.record import Recorder\n\n"
                    "def test_x():\n    import ipywidgets\n")
    assert top_level_imports(test) == {"json", "real_runs.record"}  # not the one inside the test
    assert missing_requirement(test) == (None if installed("torch") else "torch")
    plain = tmp_path / "test_plain.py"
    plain.write_text("import math\n")
    assert missing_requirement(plain) is None
