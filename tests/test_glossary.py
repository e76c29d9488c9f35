"""The suite as a teacher: no notebook uses a word its reader has not been given.

The glossary lives in one module, :mod:`zero_sim.vocabulary.glossary`, and
``docs/glossary.md`` is generated from it.  A notebook may use a glossary term only once
it has given the reader its meaning, in one of three ways:

* a link to the term's row, ``[buckets](../docs/glossary.md#bucket)``;
* a code cell that shows the entry in place, ``glossary("bucket", "all-reduce")``;
* a definition in the text: the term in bold, followed by what it means
  (``**bucket**: a flat buffer ...``, ``a **bucket** (a flat buffer ...)``,
  ``**buckets**, flat buffers ...``, ``**bucket** is ...``).

Walking each notebook's cells in order, the first use of every term in markdown must come
at or after one of those.  A use is the term or one of its aliases as a whole word, case
ignored (plurals included); code between backticks, fenced code, link targets, HTML tags
and headings are not text (a heading names what the text under it explains).  Where two
terms overlap, the longer wins: "host bridge" is not a use of "host".

The sources the project was built from are cited by title everywhere a user reads, never
by the project's internal file numbers ("seed 002").
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from zero_sim.vocabulary import glossary as g

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
DOCS = sorted((ROOT / "docs").glob("*.md"))


def cells(path: Path) -> list[dict]:
    """A notebook's cells, each with its ``source`` as one string."""
    found = json.loads(path.read_text())["cells"]
    return [c | {"source": "".join(c["source"]) if isinstance(c["source"], list) else c["source"]}
            for c in found]

# ---------------------------------------------------------------------------------- the checker

FENCED = re.compile(r"```.*?```", re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^ {0,3}#{1,6} .*$", re.M)
GLOSSARY_LINK = re.compile(r"\[[^\]]*\]\(\s*(?:[^)\s#]*/)?glossary\.md#([\w-]+)\s*\)")
LINK = re.compile(r"(\[[^\]]*\])(\([^)]*\))")
TAG = re.compile(r"<[^>\n]+>")
BOLD_DEFINITION = re.compile(r"\*\*([^*\n]+?)\*\*(?=\s*(?:[:(,=—–]|is\b|are\b|means\b))")


def _blank(text: str, pattern: re.Pattern, group: int = 0) -> str:
    """``text`` with each match of ``pattern`` (or of one group of it) overwritten by spaces.

    Positions stay where they were, so definitions and uses found afterwards keep their order.
    """
    def repl(m):
        start, end = m.span(group)
        whole = m.group(0)
        lo, hi = start - m.start(), end - m.start()
        return whole[:lo] + " " * (hi - lo) + whole[hi:]
    return pattern.sub(repl, text)


def _resolve(name: str) -> g.Entry | None:
    try:
        return g.entry(name)
    except KeyError:
        return None


def uses(text: str) -> list[tuple[int, g.Entry, str]]:
    """(position, entry, words) of every glossary term in ``text``, the longest match winning."""
    found = [(m.start(), m.end(), e) for e in g.ENTRIES for m in e.pattern().finditer(text)]
    taken: list[tuple[int, int, g.Entry]] = []
    for start, end, e in sorted(found, key=lambda f: (f[0] - f[1], f[0])):
        if all(end <= s or start >= t for s, t, _ in taken):
            taken.append((start, end, e))
    return [(start, e, text[start:end]) for start, end, e in sorted(taken, key=lambda t: t[0])]


def markdown_events(source: str) -> list[tuple[int, str, g.Entry | str, str]]:
    """A markdown cell as ``(position, "define" | "use", entry or unknown anchor, words)``, in order."""
    text = _blank(source, FENCED)
    text = _blank(text, INLINE_CODE)
    text = _blank(text, HEADING)
    events: list[tuple[int, str, g.Entry | str, str]] = []
    for m in GLOSSARY_LINK.finditer(text):
        anchor = m.group(1)
        target = next((e for e in g.ENTRIES if e.anchor == anchor), None)
        events.append((m.start(), "define", target or anchor, m.group(0)))
    text = _blank(text, LINK, 2)  # keep a link's words, drop its target
    text = _blank(text, TAG)
    for m in BOLD_DEFINITION.finditer(text):
        words = m.group(1).strip()
        defined = [e for e in g.ENTRIES if e.pattern().fullmatch(words)]
        events += [(m.start(), "define", e, m.group(0)) for e in defined]
    events += [(pos, "use", e, words) for pos, e, words in uses(text)]
    return sorted(events, key=lambda ev: (ev[0], ev[1] != "define"))


def glossary_calls(source: str) -> list[str]:
    """The names given to ``glossary(...)`` in a code cell (IPython's % and ! lines skipped)."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    names = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if called == "glossary":
                names += [a.value for a in node.args
                          if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return names


def undefined_uses(cells) -> list[str]:
    """Each term's first use before its definition, as "cell i: ..." sentences, in cell order."""
    defined: set[str] = set()
    reported: set[str] = set()
    problems = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code":
            for name in glossary_calls(cell["source"]):
                e = _resolve(name)
                if e is None:
                    problems.append(f"cell {i}: glossary({name!r}) names no entry of {g.PAGE}")
                else:
                    defined.add(e.anchor)
            continue
        if cell["cell_type"] != "markdown":
            continue
        for _, kind, e, words in markdown_events(cell["source"]):
            if isinstance(e, str):
                problems.append(f"cell {i}: a link to {g.PAGE}#{e}, which has no such entry")
            elif kind == "define":
                defined.add(e.anchor)
            elif e.anchor not in defined and e.anchor not in reported:
                reported.add(e.anchor)
                problems.append(
                    f"cell {i}: {words!r} (glossary term {e.term!r}) is used before it is defined: "
                    f"link it, [{words}]({g.NOTEBOOK_LINK}#{e.anchor}), define it in bold "
                    f"(**{words}**: ...), or show it earlier with glossary({e.anchor!r})")
    return problems


def _notebook(*given: tuple[str, str]) -> list[dict]:
    return [{"cell_type": kind, "source": source} for kind, source in given]


# ------------------------------------------------------------------ the checker, on small cases


def test_a_term_used_before_anything_defines_it_is_reported_with_its_cell():
    cells = _notebook(("markdown", "# Title\n\nWhat you will learn: how DDP fills buckets."),
                   ("markdown", "A [bucket](../docs/glossary.md#bucket) is a flat buffer."))
    problems = undefined_uses(cells)
    assert any(p.startswith("cell 0: 'buckets'") and "'bucket'" in p for p in problems), problems
    assert any(p.startswith("cell 0: 'DDP'") for p in problems), problems


def test_a_link_a_bold_definition_or_a_glossary_cell_each_define_a_term():
    cells = _notebook(("code", "%matplotlib widget\nfrom zero_sim.vocabulary.glossary import glossary\n"
                            "glossary('all-reduce', 'gradients')"),
                   ("markdown", "Gradients go into [buckets](../docs/glossary.md#bucket); more buckets, "
                                "more all-reduces."),
                   ("markdown", "Each **shard**: one slice per worker. Shards are small; all-reduce them."))
    assert undefined_uses(cells) == [], undefined_uses(cells)


def test_bold_alone_is_emphasis_not_a_definition():
    cells = _notebook(("markdown", "The **bucket** matters."))
    assert undefined_uses(cells), "a bold word with no meaning after it must not count as a definition"


def test_code_headings_link_targets_and_the_longer_term_are_not_uses():
    cells = _notebook(("markdown", "## Buckets\n\nSet `bucket_mb` or run\n```\nbucket = 1\n```\n"
                                "See [the page](../docs/presets.md#bucket). Two GPUs across a "
                                "[host bridge](../docs/glossary.md#host-bridge)."))
    assert undefined_uses(cells) == [], undefined_uses(cells)


def test_a_link_to_an_anchor_the_glossary_lacks_is_reported():
    problems = undefined_uses(_notebook(("markdown", "[x](../docs/glossary.md#no-such-term)")))
    assert problems == [f"cell 0: a link to {g.PAGE}#no-such-term, which has no such entry"]


def test_plurals_and_glued_symbols_count_as_uses_but_longer_words_do_not():
    words = lambda text: [e.anchor for _, e, _ in uses(text)]  # noqa: E731
    assert words("ranks send 2Ψ over ZeRO-3") == ["rank", "psi", "zero"]
    assert words("reshard, not shard") == ["reshard", "shard"]
    assert words("ranked by zero regrets") == []  # "zero" is not "ZeRO"; "ranked" is not "rank"


# --------------------------------------------------------------------------- the notebooks


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_defines_each_term_before_using_it(path):
    problems = undefined_uses(cells(path))
    assert not problems, f"notebooks/{path.name}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_glossary_call_in_a_notebook_imports_the_glossary(path):
    """A cell that shows entries must run: ``glossary`` comes from the one module."""
    code = "\n".join(c["source"] for c in cells(path) if c["cell_type"] == "code")
    if re.search(r"(?<![\w.])glossary\(", code):
        assert "from zero_sim.vocabulary.glossary import" in code, f"{path.name} calls glossary() unimported"


# ------------------------------------------------------------------------------ the glossary


def test_the_page_is_generated_from_the_module():
    page = ROOT / g.PAGE
    assert page.read_text() == g.render(), (
        f"{g.PAGE} is out of date: run `python -m zero_sim.vocabulary.glossary > {g.PAGE}`")


def test_each_anchor_and_each_name_belongs_to_one_entry():
    anchors = [e.anchor for e in g.ENTRIES]
    assert len(anchors) == len(set(anchors)), "two entries share an anchor"
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", a) for a in anchors)
    owner: dict[str, str] = {}
    for e in g.ENTRIES:
        for name in e.names:
            key = name if e.case_sensitive else name.lower()
            assert owner.setdefault(key, e.anchor) == e.anchor, f"{name!r} names {owner[key]} and {e.anchor}"
            assert g.entry(name) is e


def test_a_newcomer_finds_every_word_the_notebooks_lean_on():
    for name in ("RoBERTa", "GPT-2", "p4d", "EFA", "InfiniBand", "NVSwitch", "NVLink", "PCIe", "host bridge",
                 "token", "sequence length", "TFLOP/s", "activations", "activation checkpointing",
                 "recompute", "buffers", "capacity", "host", "Ψ", "Psi", "prefetch", "reshard", "bucket",
                 "step", "phase",
                 "rank", "all-reduce", "reduce-scatter", "all-gather", "busbw", "exposed communication",
                 "straggler", "calibration", "model states", "ZeRO-3", "FSDP", "DDP"):
        assert g.entry(name).meaning, name


def test_psi_is_an_element_count_and_the_optimizer_phase_is_split():
    assert "elements, never of bytes" in g.entry("psi").meaning
    phase = g.entry("phase").meaning
    assert "optimizer_wait" in phase and "optimizer_update" in phase


def test_a_notebook_shows_entries_in_place_linked_to_the_page():
    shown = g.glossary("buckets", "All-Reduce")
    md = shown._repr_markdown_()
    assert md.splitlines()[0] == "| term | meaning |"
    assert f"[bucket]({g.NOTEBOOK_LINK}#bucket)" in md and f"({g.NOTEBOOK_LINK}#all-reduce)" in md
    assert "](#" not in md, "links between entries must point at the page, not into the notebook"
    with pytest.raises(KeyError, match="not in the glossary"):
        g.glossary("flux capacitor")


def test_every_link_to_the_glossary_names_an_entry():
    anchors = {e.anchor for e in g.ENTRIES} | {g.slug(title) for title, _, _ in g.SECTIONS}
    texts = {p.name: p.read_text() for p in [*DOCS, ROOT / "README.md"]}
    texts |= {p.name: "\n".join(c["source"] for c in cells(p)) for p in NOTEBOOKS}
    texts[g.PAGE] = g.render()
    for name, text in texts.items():
        for anchor in re.findall(r"glossary\.md#([\w-]+)", text):
            assert anchor in anchors, f"{name} links {g.PAGE}#{anchor}, which has no entry"
    for anchor in re.findall(r"\]\(#([\w-]+)\)", g.render()):
        assert anchor in anchors, f"an entry links #{anchor}, which has no entry"


# ------------------------------------------------------------------ sources cited by their titles

SEED_NUMBER = re.compile(r"\bseeds?[ _-]?0\d\d", re.I)


def _known_names() -> set[str]:
    """Names that may keep a seed number: the test data's file names."""
    return {p.name for p in (ROOT / "tests" / "data").iterdir()}


def _seed_numbers(text: str, known: set[str]) -> list[str]:
    for name in sorted(known, key=len, reverse=True):
        text = text.replace(name, "")
    return [text[max(0, m.start() - 40):m.end() + 40].replace("\n", " ") for m in SEED_NUMBER.finditer(text)]


def _cli_texts(capsys) -> dict[str, str]:
    from sim2real import cli

    texts = {}
    for argv in (["--help"], *([name, "--help"] for name in cli.COMMANDS), ["presets"]):
        try:
            cli.main(argv)
        except SystemExit:
            pass
        texts["zero-sim " + " ".join(argv)] = capsys.readouterr().out
    return texts


def test_no_user_facing_text_cites_a_source_by_its_seed_number(capsys):
    from dataclasses import astuple

    from zero_sim.published import load_points
    from zero_sim.system.model_presets import PRESET_SOURCES
    from zero_sim.system.topology_presets import PRESETS as TOPOLOGIES

    known = _known_names()
    texts = {f"docs/{p.name}": p.read_text() for p in DOCS} | {"README.md": (ROOT / "README.md").read_text()}
    texts |= {f"notebooks/{p.name}": "\n".join(c["source"] for c in cells(p)) for p in NOTEBOOKS}
    texts |= {f"model preset {k}": " ".join(str(v) for v in astuple(s)) for k, s in PRESET_SOURCES.items()}
    texts |= {f"topology preset {k}": f"{t.description} {t.source}" for k, t in TOPOLOGIES.items()}
    texts |= {f"published point {p['id']}": f"{p['id']} {p['source']} {p.get('unstated', '')}"
              for p in load_points()}
    texts |= _cli_texts(capsys)
    assert "zero-sim presets" in texts and "roberta-10b" in texts["zero-sim presets"]
    found = {where: hits for where, text in texts.items() if (hits := _seed_numbers(text, known))}
    assert not found, ("cite the source by its title (e.g. 'GPT Adventures, Part 4: Distribute It', a "
                       "blog post), not by its seed number:\n"
                       + "\n".join(f"  {w}: {h}" for w, h in found.items()))
