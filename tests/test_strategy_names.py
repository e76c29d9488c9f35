"""Nothing outside the strategies names a strategy: the rest of the project asks the registry
(``zero_sim.strategies.STRATEGIES``) and what each strategy declares (``Strategy.can``), so a new
strategy is one new file and one registry line, not a hunt for every list that names the others.

The check reads the source (the AST) of ``zero_sim``, ``real_runs`` and ``sim2real`` and counts the
statements holding a string equal to a registered strategy name, simulated or real (``ddp``,
``fsdp-torch``...).  Left out: the strategies' own packages (each declares its name there), the
shared vocabulary (``zero_sim/vocabulary``, where the real runs' names and what each replays as are
declared once), docstrings, and the schema's one default (``--strategy`` when none is given).  A few
places that remain are data written out on purpose (the validation's grids, a panel's default run),
at most :data:`ALLOWED`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from zero_sim.strategies import STRATEGIES
from zero_sim.vocabulary import REAL_STRATEGIES

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("zero_sim", "real_runs", "sim2real")
NAMES = set(STRATEGIES) | set(REAL_STRATEGIES)
ALLOWED = 4
# Where names are declared, not compared: the strategies themselves and the shared vocabulary.
DECLARED_IN = ("zero_sim/strategies/", "real_runs/strategies/", "zero_sim/vocabulary/")
SCHEMA = "zero_sim/scenario/settings.py"


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of every docstring's constant in ``tree``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _is_schema_default(path: str, parent: ast.AST) -> bool:
    """``Setting("strategy", <default>, ...)`` in the schema: the one place a default is named."""
    return (path == SCHEMA and isinstance(parent, ast.Call) and bool(parent.args)
            and isinstance(parent.args[0], ast.Constant) and parent.args[0].value == "strategy")


def _statements_naming(path: str, tree: ast.AST) -> dict[int, set[str]]:
    """Each smallest statement of ``tree`` that holds a strategy name, by its first line, with the names."""
    skip = _docstrings(tree)
    sites: dict[int, set[str]] = {}

    def visit(node: ast.AST, statement: ast.stmt | None, parent: ast.AST | None) -> None:
        if (isinstance(node, ast.Constant) and node.value in NAMES and id(node) not in skip
                and statement is not None and not _is_schema_default(path, parent)):
            sites.setdefault(statement.lineno, set()).add(node.value)
        for child in ast.iter_child_nodes(node):
            visit(child, child if isinstance(child, ast.stmt) else statement, node)

    visit(tree, None, None)
    return sites


def strategy_names_outside() -> dict[str, set[str]]:
    """``path:line`` -> the strategy names that statement holds, outside the strategies and the
    vocabulary."""
    found = {}
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            path = file.relative_to(ROOT).as_posix()
            if path.startswith(DECLARED_IN):
                continue
            for line, names in _statements_naming(path, ast.parse(file.read_text(), path)).items():
                found[f"{path}:{line}"] = names
    return found


def test_at_most_four_places_outside_the_strategies_name_a_strategy():
    found = strategy_names_outside()
    assert len(found) <= ALLOWED, (
        f"{len(found)} places name strategies outside zero_sim/strategies and zero_sim/vocabulary "
        f"(at most {ALLOWED}): " + "; ".join(f"{where} {sorted(names)}" for where, names in found.items())
        + ". Ask the registry or Strategy.can instead, or declare the names in zero_sim/vocabulary")


def test_the_count_sees_a_name_compared_and_passes_over_a_docstring():
    """The check can fail: a comparison with a registered name is found; a docstring is not."""
    source = '"""Mentions zero3 and ddp in prose."""\nif strategy == "zero3":\n    pass\n'
    sites = _statements_naming("zero_sim/example.py", ast.parse(source))
    assert sites == {2: {"zero3"}}


def test_the_schema_default_is_the_one_default_left_out():
    tree = ast.parse('Setting("strategy", "ddp", "help")\nSetting("other", "ddp", "help")\n')
    assert _statements_naming(SCHEMA, tree) == {2: {"ddp"}}
    assert _statements_naming("zero_sim/cli.py", tree) == {1: {"ddp"}, 2: {"ddp"}}
