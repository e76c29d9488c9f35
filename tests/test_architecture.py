"""The shape of the code: one direction of imports, no cycles, a simulator that stands alone.

``zero_sim`` is the simulator and never imports torch, ``real_runs`` or ``sim2real``;
``real_runs`` knows only the shared vocabulary of ``zero_sim``; ``sim2real`` is the one
package that joins them.  These tests read every module's imports (at any depth, in
functions too) from the source, so a new import that breaks the rule fails here.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("zero_sim", "real_runs", "sim2real")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, relative imports resolved, at any depth of the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            # ``from pkg import sub`` imports the submodule ``pkg.sub`` when there is one.
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    return {name: {m for m in imports_of(path) if m in modules and m != name}
            for name, path in modules.items()}


def external(prefixes: tuple[str, ...]) -> dict[str, set[str]]:
    modules = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    return {name: {m for m in imports_of(path) if m.split(".")[0] in prefixes}
            for name, path in modules.items()}


def in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_simulator_imports_neither_torch_nor_the_real_runs_nor_the_bridge():
    for module, targets in external(("torch", "real_runs", "sim2real")).items():
        if in_package(module, "zero_sim"):
            assert not targets, f"{module} imports {sorted(targets)}; the simulator must stand alone"


def test_the_real_runs_know_only_the_shared_vocabulary():
    for module, targets in external(("zero_sim", "sim2real")).items():
        if in_package(module, "real_runs"):
            foreign = {t for t in targets if not in_package(t, "zero_sim.vocabulary") and t != "zero_sim"}
            assert not foreign, (f"{module} imports {sorted(foreign)}; "
                                 f"real_runs may import only zero_sim.vocabulary")


def test_there_are_no_import_cycles():
    edges = graph()
    seen, on_path, cycles = set(), [], []

    def visit(node):
        if node in on_path:
            cycles.append(on_path[on_path.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        on_path.append(node)
        for nxt in sorted(edges[node]):
            visit(nxt)
        on_path.pop()

    for node in sorted(edges):
        visit(node)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_cycle_when_there_is_one(tmp_path, monkeypatch):
    """The walk above must be able to fail: two modules importing each other are reported."""
    pkg = tmp_path / "zero_sim"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from zero_sim import b\n")
    (pkg / "b.py").write_text("def f():\n    from zero_sim.a import g\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", ("zero_sim",))
    with pytest.raises(AssertionError, match="zero_sim.a -> zero_sim.b -> zero_sim.a"):
        test_there_are_no_import_cycles()


BLOCK_TORCH = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'real_runs', 'sim2real'):
            raise ImportError(f'{name} is not installed here')
sys.meta_path.insert(0, Refuse())
"""


def test_the_simulator_runs_where_torch_is_not_installed():
    """Every simulator module imports, and a scenario simulates, with torch, real_runs and
    sim2real made unimportable (as in an environment that installed only the simulator).
    The notebook panels need the lab's widgets; where those are not installed they are left out."""
    script = BLOCK_TORCH + """
import importlib.util, pkgutil, zero_sim
lab = importlib.util.find_spec('ipywidgets') is not None
for info in pkgutil.walk_packages(zero_sim.__path__, 'zero_sim.'):
    widgets = info.name.startswith('zero_sim.ui.') and info.name != 'zero_sim.ui.plots'
    if info.name != 'zero_sim.__main__' and (lab or not widgets):
        __import__(info.name)
print(round(zero_sim.simulate(model='gpt2-124m', strategy='zero3', gpus=8).metrics['step_time_s'], 6))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) > 0


def test_results_import_nothing_from_the_ui_above_them():
    """What a simulation returns sits below the ui that draws it: results.py imports no ui
    module, at any depth of the file, and the ui's plots import results, not the other way."""
    results = imports_of(ROOT / "zero_sim" / "results.py")
    assert not {m for m in results if in_package(m, "zero_sim.ui")}, sorted(results)
    assert "zero_sim.results" in imports_of(ROOT / "zero_sim" / "__init__.py")


def test_a_result_still_draws_its_timeline_and_memory_with_the_uis_plots():
    """The notebooks call result.plot_timeline() and result.plot_memory(): the package's root
    hands results the ui's drawing functions, so both draw as before."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from zero_sim import simulate

    result = simulate(model="gpt2-124m", strategy="ddp", gpus=2, topology="pcie", micro_batch=1)
    fig, (timeline, memory) = plt.subplots(2)
    result.plot_timeline(ax=timeline, max_ranks=2)
    result.plot_memory(ax=memory)
    assert timeline.collections and memory.collections  # bars of ops, areas of memory
    assert "ms" in timeline.get_xlabel() and "GB" in memory.get_ylabel()
    plt.close(fig)


# What the lab extra (the notebook panels) and the dask extra bring; anything else the simulator
# imports must come with `pip install .`.
EXTRAS = {"zero_sim.ui": "lab", "zero_sim.plan.executors": "dask"}


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _installed_with(names: set[str]) -> set[str]:
    """``names`` and every distribution they require, as installed here."""
    from importlib import metadata

    todo, seen = list(names), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            todo += [_requirement_name(r) for r in metadata.requires(name) or () if "extra ==" not in r]
        except metadata.PackageNotFoundError:
            pass
    return seen


def test_everything_the_simulator_imports_is_installed_with_it():
    from importlib import metadata

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _installed_with({_requirement_name(r) for r in project["dependencies"]})
    provided = {module: {d.lower().replace("_", "-") for d in dists}
                for module, dists in metadata.packages_distributions().items()}
    missing = set()
    for path in (ROOT / "zero_sim").rglob("*.py"):
        name = module_name(path)
        if any(in_package(name, package) for package in EXTRAS):
            continue
        for module in imports_of(path):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top == "zero_sim":
                continue
            if not provided.get(top, {top}) & core:
                missing.add(f"{top} (imported by {name})")
    assert not missing, f"imported but not a dependency in pyproject.toml: {sorted(missing)}"
