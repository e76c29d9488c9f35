"""Names users type for presets (models, topologies, GPUs, strategies, stacks): matched without
regard to case, and a near miss answered with the name it was probably meant to be.

``llama3-70B`` is ``llama3-70b``; ``dgx-a10`` is refused with "did you mean 'dgx-a100'?".
Near misses are judged by :func:`difflib.get_close_matches` (a ratio of matching characters
of at least 0.6), on lower-cased names.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class NameError_(ValueError):
    """A name that matches nothing; the message names the closest and every choice."""


def canonical(value: str, names: Iterable[str], what: str, hint: str = "") -> str:
    """The known name ``value`` stands for (case-insensitive), or :class:`NameError_` with one
    sentence: the near miss if there is one, then the choices (and ``hint``, e.g. another way)."""
    names = list(names)
    if value in names:
        return value
    lowered = {n.lower(): n for n in names}
    key = str(value).strip().lower()
    if key in lowered:
        return lowered[key]
    near = difflib.get_close_matches(key, list(lowered), n=1)
    guess = f"did you mean {lowered[near[0]]!r}? " if near else ""
    raise NameError_(f"unknown {what} {value!r}; {guess}choose one of {', '.join(sorted(names))}{hint}")
