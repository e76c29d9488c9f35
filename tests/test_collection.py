"""Which test files need what the simulator alone does not install: the rule reads a file's own imports.

``conftest.py`` reads each test file's top-level imports and skips, with the reason, a file that
needs torch or the widgets where they cannot be imported; that the whole suite then collects,
with them absent or broken, is a house rule (``test_house_rules.py``).
"""

from __future__ import annotations

from conftest import installed, missing_requirement, top_level_imports


def test_the_rule_reads_a_files_own_imports(tmp_path):
    test = tmp_path / "test_example.py"
    test.write_text("import json\nfrom real_runs.record import Recorder\n\n"
                    "def test_x():\n    import ipywidgets\n")
    assert top_level_imports(test) == {"json", "real_runs.record"}  # not the one inside the test
    assert missing_requirement(test) == (None if installed("torch") else "torch")
    plain = tmp_path / "test_plain.py"
    plain.write_text("import math\n")
    assert missing_requirement(plain) is None
