"""Figures a notebook's prose quotes that none of its cells shows.

A notebook's Markdown is typed by hand; its outputs come from the simulator. When the model
changes, a typed figure ("the same dozen milliseconds", "about 2.6 GB") silently goes stale.
The rule the notebooks follow: a figure the simulator produces is printed by a cell, or the
sentence quoting it is built from the result (a Markdown cell rendered by code). This module
finds the figures that break it: a number followed by a unit (ms, s, GB, %, x, TFLOP/s,
tokens/s) in a Markdown cell whose number appears in no output and no code of the notebook.
Hand-typed facts that come from outside the simulator (a GPU's memory, a published figure)
pass too when a cell's code or output names them.
"""

from __future__ import annotations

import json
import re

# A number (1,600 / 19.66 / .5) not glued to a word before it ("A100-40GB" is a name, not a
# figure), a range's second half ("13-36%") included, then a unit. "x" counts only glued to its
# number ("1.46x"), as "8 x A100" is a product, not a ratio.
_NUMBER = r"(?<![\w.\-/])(\d[\d,]*(?:\.\d+)?|\.\d+)"
FIGURE = re.compile(_NUMBER + r"(?:\s*[-–]\s*(\d[\d,]*(?:\.\d+)?))?"
                    r"(?:\s*(ms|s|GB|%|TFLOP/s|tokens/s)(?![\w/])|(x)(?!\w))")
_SHOWN_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?|\.\d+")
# A share or a ratio is shown only as one ("+25%", "1.46x"): a bare 25 elsewhere is another figure.
_SHOWN_RATIO = re.compile(r"(\d[\d,]*(?:\.\d+)?|\.\d+)\s?(%|x)(?!\w)")


def _normal(number: str) -> float:
    """"1,600", "1600" and "1600.0" are the same figure; so are "0.5" and ".5"."""
    return float(number.replace(",", ""))


def prose_figures(markdown: str) -> list[str]:
    """Every figure with a unit in a Markdown text, as written ("19.66 ms", "13-36%")."""
    text = re.sub(r"\]\([^)]*\)", "]", markdown)  # a link's address is not prose
    return [m.group(0).strip() for m in FIGURE.finditer(text)]


def _figure_numbers(figure: str) -> list[tuple[float, str]]:
    """The figure's numbers, each with the unit that must be shown with it ("" for any)."""
    unit = figure[-1] if figure[-1] in "%x" else ""
    return [(_normal(n), unit) for n in _SHOWN_NUMBER.findall(figure)]


def _output_text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    data = output.get("data", {})
    return "\n".join(str(v) if not isinstance(v, (dict, list)) else json.dumps(v)
                     for key, v in data.items() if key.startswith("text/") or "json" in key)


def shown_numbers(nb) -> set[tuple[float, str]]:
    """Every number a cell's code or output shows, the saved widget state (panels' words) included:
    (value, "") for any number, (value, "%") or (value, "x") for a share or a ratio shown as one."""
    texts = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            texts.append(cell.source)
            texts += [_output_text(out) for out in cell.get("outputs", [])]
    # A panel's words are its widgets' values and descriptions (not their layout numbers).
    models = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    for model in models.get("state", {}).values():
        state = model.get("state", {})
        texts += [str(state.get(key, "")) for key in ("value", "description", "options", "_options_labels")]
    shown = {(_normal(n), "") for text in texts for n in _SHOWN_NUMBER.findall(text)}
    return shown | {(_normal(n), unit) for text in texts for n, unit in _SHOWN_RATIO.findall(text)}


def unshown_figures(nb) -> list[tuple[int, str]]:
    """(cell index, figure) for every prose figure whose numbers no cell shows."""
    shown = shown_numbers(nb)
    return [(i, figure) for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown"
            for figure in prose_figures(cell.source)
            if not all(n in shown for n in _figure_numbers(figure))]
