"""The house rules that keep the project readable, each kept by a test.

The README is a user guide (what it is, the two commands, the questions users bring and the
commands that answer them), at most 180 lines: detail goes to a page under docs/.  A module
holds one idea, at most 420 lines, unless it is a data table (listed below by name, with why);
a function reads as a few named steps, at most 60 lines.  The suite collects wherever only the
simulator is installed, or where torch or the widgets are installed but fail to import: the
files that need them are skipped, with the reason.  Sizes are read from the source (the AST),
so a rule broken anywhere in ``zero_sim``, ``real_runs`` or ``sim2real`` fails here, naming the
file or function and the limit.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("zero_sim", "real_runs", "sim2real")
README_LINES = 180
MODULE_LINES = 420
FUNCTION_LINES = 60
# Modules long because they list facts, one entry after another, not because they hold more than
# one idea; each with the reason it is one table.
DATA_TABLES = {
    "zero_sim/vocabulary/glossary.py": "the glossary: one entry per term the project uses, with its source",
}


def modules(root: Path = ROOT) -> list[Path]:
    return sorted(p for package in PACKAGES for p in (root / package).rglob("*.py"))


def long_modules(root: Path = ROOT) -> dict[str, int]:
    """Each module over :data:`MODULE_LINES` lines, by its path from ``root``."""
    sizes = {p.relative_to(root).as_posix(): len(p.read_text().splitlines()) for p in modules(root)}
    return {path: n for path, n in sizes.items() if n > MODULE_LINES}


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """Every function in ``tree``, methods and nested functions too, by its dotted name."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + child.name, child
            yield from functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from functions(child, f"{prefix}{child.name}.")
        else:
            yield from functions(child, prefix)


def long_functions(root: Path = ROOT) -> dict[str, int]:
    """Each function over :data:`FUNCTION_LINES` lines, from its ``def`` to its last line, as
    ``path:Class.function``."""
    found = {}
    for path in modules(root):
        for name, node in functions(ast.parse(path.read_text(), str(path))):
            found[f"{path.relative_to(root).as_posix()}:{name}"] = node.end_lineno - node.lineno + 1
    return {name: n for name, n in found.items() if n > FUNCTION_LINES}


def test_the_readme_is_a_user_guide_of_at_most_180_lines():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_LINES, (f"README.md has {lines} lines, over the limit of {README_LINES}: "
                                   f"move detail to a page under docs/ and link it")


def test_no_module_is_over_420_lines_but_the_data_tables():
    over = {path: n for path, n in long_modules().items() if path not in DATA_TABLES}
    assert not over, "modules over the limit of {} lines: {}; split each into modules of one idea".format(
        MODULE_LINES, ", ".join(f"{path} ({n} lines)" for path, n in over.items()))


def test_each_data_table_exception_is_still_needed():
    """The exception list stays short: a listed module that no longer passes the limit leaves it."""
    long = long_modules()
    for path, why in DATA_TABLES.items():
        assert why and path in long, (f"{path} is listed as a data table but is within {MODULE_LINES} "
                                      f"lines (or gone): take it off DATA_TABLES")


def test_no_function_is_over_60_lines():
    over = long_functions()
    assert not over, "functions over the limit of {} lines: {}; split each into named steps".format(
        FUNCTION_LINES, ", ".join(f"{name} ({n} lines)" for name, n in over.items()))


def test_the_size_rules_find_what_breaks_them(tmp_path, monkeypatch):
    """The readers above must be able to fail: a long module and a long function, a method and a
    nested function among them, are each reported by name."""
    package = tmp_path / "zero_sim"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    deeper = body.replace("    ", "        ")
    (package / "big.py").write_text(
        f"def long():\n{body}\n\n\nclass Kind:\n    def method(self):\n{deeper}\n\n\n"
        f"def outer():\n    def inner():\n{deeper}\n    return inner\n" + "\n" * MODULE_LINES)
    (package / "small.py").write_text("def short():\n    return 1\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", ("zero_sim",))
    assert long_modules(tmp_path) == {"zero_sim/big.py": len((package / "big.py").read_text().splitlines())}
    assert set(long_functions(tmp_path)) == {"zero_sim/big.py:long", "zero_sim/big.py:Kind.method",
                                             "zero_sim/big.py:outer", "zero_sim/big.py:outer.inner"}


# Two ways the heavy optional packages go missing.  Absent: nothing to import (ModuleNotFoundError).
# Broken: installed, found by the import system, but raising when imported, as a torch whose CUDA
# library is missing raises OSError.  Each runs as a plugin in a fresh pytest, before collection.
ABSENT = "import sys\nfor name in ('torch', 'ipywidgets'):\n    sys.modules[name] = None\n"
BROKEN = """
import importlib.abc, importlib.machinery, sys

class Broken(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'ipywidgets'):
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        if module.__name__.startswith('torch'):
            raise OSError('libtorch_cuda.so: cannot open shared object file')
        raise ImportError('ipywidgets was built for another version of traitlets')

for name in [m for m in sys.modules if m.split('.')[0] in ('torch', 'ipywidgets')]:
    del sys.modules[name]
sys.meta_path.insert(0, Broken())
"""


@pytest.mark.parametrize("how, plugin", [("absent", ABSENT), ("broken", BROKEN)])
def test_the_suite_collects_where_torch_and_the_widgets_are_absent_or_broken(tmp_path, how, plugin):
    (tmp_path / "heavy_modules_unusable.py").write_text(plugin)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-rs", "-p", "heavy_modules_unusable",
         "-p", "no:cacheprovider", str(ROOT / "tests")],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT / 'tests'}:{ROOT}", "PATH": "/usr/bin:/bin"})
    out = done.stdout + done.stderr
    assert done.returncode == 0 and " error" not in out.splitlines()[-1], out[-3000:]
    collected = {line.split("::")[0].rsplit("/", 1)[-1] for line in done.stdout.splitlines() if "::" in line}
    assert {"test_sim_engine.py", "test_settings.py", "test_house_rules.py"} <= collected
    for needs_torch in ("test_recorder.py", "test_real_run_traces.py", "test_gpu_grid.py", "test_replay.py"):
        assert needs_torch not in collected
        assert f"{needs_torch} needs torch, which does not import here" in out, needs_torch
    for needs_widgets in ("test_panel_controls.py", "test_ui_panels.py"):
        assert needs_widgets not in collected and f"{needs_widgets} needs ipywidgets" in out
