"""What each knob in a planner table means, in one line, for a reader who has not met it.

A planner row names its settings as ``name=value`` pairs ("reshard_after_forward=False").
The meaning of each knob is written once, where the strategy declares it (its
:class:`~zero_sim.strategies.base.Knob` help); this module gathers the knobs a table shows,
pairs each with that line and, where the glossary explains the idea behind it, a link to
the glossary's row, so a notebook never shows a knob it has not explained.
"""

from __future__ import annotations

from collections.abc import Iterable

from IPython.display import Markdown

from zero_sim.strategies import all_knobs
from zero_sim.vocabulary.glossary import NOTEBOOK_LINK, entry

# Knob -> the glossary term that explains the idea behind it.
GLOSSARY_TERM = {
    "hybrid": "hybrid sharding", "reshard_after_forward": "reshard", "limit_all_gathers": "limit_all_gathers",
    "copies": "copy-in and copy-out", "update": "per-unit update", "root": "root unit",
    "backward_prefetch": "prefetch", "forward_prefetch": "prefetch", "prefetch": "prefetch",
    "prefetch_bucket_size": "prefetch", "bucket_mb": "bucket", "reduce_bucket_size": "bucket",
    "zero_quantized_weights": "qwZ", "zero_hpz_partition_size": "hpZ", "zero_quantized_gradients": "qgZ",
}


def knob_names(labels: Iterable[str]) -> list[str]:
    """The knob names in planner labels ("a=1, b=2", "defaults"), in order of first appearance."""
    owners = all_knobs()
    names: list[str] = []
    for label in labels:
        for part in str(label).split(","):
            name = part.split("=")[0].strip()
            if name in owners and name not in names:
                names.append(name)
    return names


def knob_line(name: str) -> str:
    """One Markdown line: the knob, its meaning as the strategy declares it, and its glossary link."""
    strategy, knob = all_knobs()[name][0]
    term = GLOSSARY_TERM.get(name)
    link = f" ([{term}]({NOTEBOOK_LINK}#{entry(term).anchor}))" if term else ""
    return f"* `{name}` ({strategy}, default `{knob.default}`): {knob.help}{link}"


def knob_meanings(labels: Iterable[str]) -> Markdown:
    """What every knob in these planner labels means; ``defaults`` is each strategy as it ships."""
    lines = [knob_line(n) for n in knob_names(labels)]
    head = "`defaults`: the strategy as it ships, no knob changed. The knobs these rows change:"
    if not lines:
        return Markdown("`defaults`: every row is a strategy as it ships.")
    return Markdown("\n".join([head, *lines]))


__all__ = ["GLOSSARY_TERM", "knob_line", "knob_meanings", "knob_names"]
