"""One schema for every setting of a simulation: its type, range and choices, checked in one place.

A setting is declared once, as a :class:`Setting` (keyword, default, help, type, choices and
bounds).  The CLI builds its flags from the same declarations, and :func:`check_settings`
validates whatever reaches :func:`zero_sim.simulate` (flags parsed by argparse, keywords from a
notebook, values read from a config file) with pydantic, so both faces refuse the same values
with the same sentence.

The rules, each because the alternative gives a silently wrong answer:

* Numbers must be finite: NaN passes every ``<`` / ``>`` range check, and a NaN bandwidth
  becomes a NaN step time that is not even valid JSON.
* Booleans are not numbers: ``gpus=True`` is not one GPU.  Integers are whole: ``2.0`` is 2,
  ``2.5`` is refused rather than rounded.
* Text that spells a number or a yes/no is read as one (``"25"``, ``"no"``): that is what a
  config file or a widget hands over.  A whole number may be written in e-notation (``"1e9"``),
  as the help texts write defaults; ``"1.5e0"`` is not whole and is refused.  Anything else
  (``"hok"`` for a choice, ``2`` for a yes/no) is refused, never mapped to a default.
* Bounds state what is physical (a bandwidth is positive, a fraction at most 1) and what keeps
  one simulation small enough to answer in seconds (``le``).  The size of the simulation as a
  whole is judged separately (:func:`zero_sim.scenario.check_size`).
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, make_dataclass
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, ValidationError, create_model
from pydantic_core import PydanticCustomError


class ScenarioError(ValueError):
    """Settings that cannot be simulated; the message is one sentence saying how to fix them."""


@dataclass(frozen=True)
class Setting:
    """A setting: a CLI flag ``--name-with-dashes`` and a ``simulate()`` keyword ``name``.

    ``kind`` is int, float, str or bool; ``choices`` the only values a str may take; ``gt``,
    ``ge`` and ``le`` bound a number (greater than, at least, at most); ``parse``, when given,
    turns what the user wrote into ``kind`` first (``"7.5B"`` parameters), raising ValueError
    with one sentence.  A default of None means "decided from the other settings" and is never
    validated.  ``section`` names the part of the typed scenario (:mod:`zero_sim.scenario.types`)
    that holds a common setting's resolved value; a strategy's knobs have none."""

    name: str
    default: Any
    help: str
    kind: type = float
    choices: tuple | None = None
    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    parse: Callable[[Any], Any] | None = None
    section: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


# Settings whose values are preset names, matched without regard to case by simulate()
# (zero_sim.system.names): their flags take any text and name the choices in their help.
CASE_FREE = ("gpu",)


def add_flag(parser: argparse.ArgumentParser, setting: Setting, help_text: str | None = None,
             default: Any = None) -> None:
    """``setting``'s flag on a command's ``parser``, typed and limited to its choices as declared.

    Not given, the flag is ``default``: None leaves the value to :func:`zero_sim.simulate`, and
    the help names the default that then applies.  A yes/no setting takes ``--name`` and
    ``--no-name``.  A setting with its own parser (``--params 7.5B``) reaches the schema as the
    text typed, and so does a preset name (:data:`CASE_FREE`)."""
    text = setting.help if help_text is None else help_text
    kind, choices = (str if setting.parse else setting.kind), setting.choices
    # An integer is read by the schema's rule (e-notation such as 1e9 is whole); text that is not
    # whole stays text, for the schema to refuse in the same sentence as simulate() does.
    kind = whole_number if kind is int else kind
    if setting.name in CASE_FREE:
        text, choices = f"{text}: one of {', '.join(setting.choices)}", None
    shown = f"{text} (default: {setting.default if default is None else default})"
    if kind is bool:
        parser.add_argument(setting.flag, dest=setting.name, action=argparse.BooleanOptionalAction,
                            default=default, help=shown)
    else:
        parser.add_argument(setting.flag, dest=setting.name, type=kind, default=default, choices=choices,
                            help=shown)


def _plain_number(value):
    """Refuse a bool (a subclass of int in Python; as a count or a size it is always a mistake)
    and NaN or infinity, before any range check that NaN would slip through."""
    if isinstance(value, bool):
        raise PydanticCustomError("bool_not_number", "a number, not true/false")
    try:
        number = float(value) if isinstance(value, int | float | str) else None
    except (ValueError, OverflowError):
        return value  # not a number at all: the type check says so
    if number is not None and isinstance(value, float | str) and not math.isfinite(number):
        raise PydanticCustomError("finite_number", "a finite number")
    return value


def whole_number(value):
    """Text that spells a whole number, in decimal or e-notation (``"8"``, ``"1e9"``,
    ``"1_000"``), as that int; anything else is returned as given, for the type check to refuse
    (``"1.5e0"`` is not whole and is never rounded).  Decimal reads the text exactly, where a
    float would round counts above 2**53."""
    if not isinstance(value, str):
        return value
    try:
        number = Decimal(value.strip().replace("_", ""))
    except InvalidOperation:
        return value
    if not number.is_finite() or number != number.to_integral_value():
        return value
    return int(number)


def integer_flag(text: str) -> int:
    """argparse's type for an integer flag outside the schema, by :func:`whole_number`'s rule."""
    number = whole_number(text)
    if not isinstance(number, int):
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}")
    return number


def _annotation(setting: Setting):
    """The pydantic type of one setting's value."""
    if setting.choices:
        base: Any = Literal[tuple(setting.choices)]
    elif setting.kind in (int, float):
        bounds = {k: getattr(setting, k) for k in ("gt", "ge", "le") if getattr(setting, k) is not None}
        # Validators run last-listed first: e-notation text becomes an int before the number checks.
        whole = (BeforeValidator(whole_number),) if setting.kind is int else ()
        base = Annotated[setting.kind, BeforeValidator(_plain_number), *whole,
                         Field(allow_inf_nan=False, **bounds)]
    else:
        base = setting.kind
    if setting.parse is not None:
        base = Annotated[base, BeforeValidator(setting.parse)]
    return base | None


@functools.cache
def _model(settings: tuple[Setting, ...]):
    fields = {s.name: (_annotation(s), None) for s in settings}
    # Lax mode reads "25" as 25 and "no" as False; strict types would refuse what config files hold.
    return create_model("Settings", __config__=ConfigDict(extra="forbid"), **fields)


def _phrase(error: dict, setting: Setting) -> str:
    """What the value must be, in words, from pydantic's error type and context."""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "value_error" and setting.parse is not None:  # the parse function's own sentence
        return str(ctx.get("error", error["msg"]))
    if kind == "literal_error":
        return "one of " + ", ".join(str(c) for c in setting.choices)
    if kind in ("greater_than", "greater_than_equal", "less_than_equal"):
        return _range(setting, upper=kind == "less_than_equal")
    if kind == "finite_number":
        return "a finite number"
    if setting.kind is bool:
        return "true or false"
    if setting.kind is int:
        return "a whole number"
    if setting.kind is float:
        return "a number"
    return "text"


def _number(x) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) >= 1e4 else f"{x:g}"


def _range(setting: Setting, upper: bool) -> str:
    """The allowed range in words: a fraction's whole interval, otherwise the side that was crossed."""
    noun = "integer" if setting.kind is int else "number"
    lo = setting.ge if setting.ge is not None else setting.gt
    if setting.kind is float and lo is not None and setting.le is not None and setting.le <= 1:
        opening = "between " if setting.ge is not None else "in ("
        closing = "" if setting.ge is not None else "]"
        joint = " and " if setting.ge is not None else ", "
        return f"{opening}{_number(lo)}{joint}{_number(setting.le)}{closing}"
    if upper:
        return f"at most {_number(setting.le)}"
    if lo == 0:
        return f"a positive {noun}" if setting.gt is not None else f"a non-negative {noun}"
    return f"greater than {_number(lo)}" if setting.gt is not None else f"at least {_number(lo)}"


def check_settings(settings: tuple[Setting, ...], values: dict[str, Any], owner: str = "") -> dict[str, Any]:
    """``values`` validated and converted to each setting's type (None stays None, meaning
    "not given"); the first bad value raises :class:`ScenarioError` with one sentence, which
    names ``owner`` (a strategy) when the settings are its knobs."""
    given = {k: v for k, v in values.items() if v is not None}
    try:
        checked = _model(settings).model_validate(given)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else "?"
        setting = next((s for s in settings if s.name == name), None)
        if setting is None:
            raise ScenarioError(f"unknown setting {name!r}; see `zero-sim simulate --help`") from None
        if error["type"] == "value_error" and setting.parse is not None:
            raise ScenarioError(_phrase(error, setting)) from None
        where = f" for {owner}" if owner else ""
        raise ScenarioError(f"{setting.flag} must be {_phrase(error, setting)}{where}, "
                            f"got {_shown(error.get('input'))}") from None
    return {k: getattr(checked, k) for k in given} | {k: None for k, v in values.items() if v is None}


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_finite_number(value) -> bool:
    """True for an int or float that is neither NaN nor infinite (and not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def settings_record(name: str, settings: Iterable[Setting], extra: Iterable[tuple[str, Any]] = (),
                    module: str = __name__) -> type:
    """A frozen dataclass holding resolved values: one field per setting, in order, typed as the
    schema says (``| None`` where the default leaves it to the simulator), then ``extra``
    (name, type) fields for values no setting names.  Read by attribute; built once per schema."""
    fields = [(s.name, s.kind | None if s.default is None else s.kind) for s in settings]
    record = make_dataclass(name, fields + list(extra), frozen=True, slots=True)
    record.__module__ = module
    return record
