"""Training configurations users already have, read into ``simulate()`` settings.

Each reader turns one file format into a :class:`ConfigReading`: the settings it sets and one
note per key it did not turn into a setting, saying why (``ignored: <key>: <why>``).  Every key
of a file lands on a ``read:`` or an ``ignored:`` line: the reading records which keys its notes
named, and :meth:`ConfigReading.account` notes each leaf key no line named (nor a table holding
it) as ignored, so a key no reader knows is still shown, never silently dropped.  A key
whose effect the simulator cannot model, and that would change a step's time or memory, is
refused with one sentence instead, so a reading never silently simulates something else.

:func:`merge` combines a reading with the settings given beside it (flags or keywords): a
setting given explicitly wins over the file's value, and the note says so.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from zero_sim.settings import ScenarioError


class ConfigError(ScenarioError):
    """A configuration file that cannot be read as given; the message says how to fix it."""


@dataclass
class ConfigReading:
    """What a configuration file sets (``simulate()`` keywords) and what it left aside, and why."""

    source: str
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    origins: dict[str, str] = field(default_factory=dict)  # setting -> the key it was read from
    # Run on the resolved settings: checks that need the rank count, and settings derived from it.
    finish: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)
    accounted: set[str] = field(default_factory=set)  # the file's keys (and tables) a note named

    def blame(self, message: str) -> str:
        """A refusal that names a setting this file set (and the user did not type), saying which
        key of which file set it: an error about a flag nobody typed must say where it came from."""
        named = [f"{flag} was read from {key}" for name, key in self.origins.items()
                 if re.search(rf"{(flag := '--' + name.replace('_', '-'))}(?![\w-])", message)]
        return f"{message} ({'; '.join(named)} in {self.source})" if named else message

    def set(self, name: str, value: Any, key: str, written: Any = None, keys: Iterable[str] = ()) -> None:
        """``key`` (as ``written`` in the file, when that differs from ``value``) sets ``--name value``;
        ``keys``: the file's keys it was read from, where ``key`` names several in words."""
        self.settings[name] = value
        self.origins[name] = key
        self.accounted.update(keys or (key,))
        shown = f" = {written!r}" if written is not None else ""
        value_shown = f"{value:.6g}" if isinstance(value, float) else value
        self.notes.append(f"read: {key}{shown} as --{name.replace('_', '-')} {value_shown}")

    def read(self, key: str, meaning: str) -> None:
        """``key`` was read and checked, and sets nothing of its own: ``meaning`` says what it said."""
        self.accounted.add(key)
        self.notes.append(f"read: {key} {meaning}")

    def ignore(self, key: str, why: str) -> None:
        self.accounted.add(key)
        self.notes.append(f"ignored: {key}: {why}")

    def account(self, data: dict, name: Callable[[tuple[str, ...]], str] = None,
                table: Callable[[tuple[str, ...]], str] = None) -> None:
        """Every leaf key of ``data`` that no note named, nor a table holding it, noted as ignored;
        ``name`` and ``table`` spell a key's and a table's path as this reader's notes do (dotted)."""
        name = name or dotted
        table = table or name
        for path in _leaves(data):
            tables = {table(path[:i]) for i in range(1, len(path))}
            if name(path) not in self.accounted and not tables & self.accounted:
                self.ignore(name(path), NOT_READ)


NOT_READ = "not read by this reader"


def _leaves(data: dict, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The paths of a nested mapping's leaves (a list or an empty table is a leaf)."""
    for key, value in data.items():
        here = (*path, str(key))
        if isinstance(value, dict) and value:
            yield from _leaves(value, here)
        else:
            yield here


def dotted(path: tuple[str, ...]) -> str:
    """A key's path as JSON and YAML readers name it: ``zero_optimization.stage``."""
    return ".".join(path)


def load_mapping(config, what: str) -> tuple[dict, str]:
    """A configuration given as a mapping, or as the path of a JSON file holding one."""
    if isinstance(config, dict):
        return config, f"the {what}"
    if not isinstance(config, str | os.PathLike):
        raise ConfigError(f"the {what} must be a path or a dict, got {type(config).__name__}")
    path = Path(config)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not readable as text"
        raise ConfigError(f"cannot read the {what} {str(path)!r}: {reason.lower()}; pass the path of a "
                          f"JSON file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); fix the file") \
            from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a JSON {type(data).__name__}, not an object of settings")
    return data, str(path)


def validated(model: type[BaseModel], data: dict, source: str):
    """``data`` read as ``model``; the first field that does not fit is one sentence naming its key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "the configuration"
        what = error["msg"].removeprefix("Input ").removeprefix("Value error, ")
        if error["type"] in ("model_type", "model_attributes_type", "dict_type"):
            what = "should be an object of settings ({...} in JSON)"  # not the name of a class inside
        raise ConfigError(f"{where} in {source} {what[0].lower() + what[1:]}, got {error['input']!r}; "
                          f"fix the file") from None


def check_spelling(keys, known, source: str, where: str = "", what: str = "key", close: str = "") -> None:
    """A key that is not one the reader knows but is close to one (``zero_optimisation``,
    ``stgae``) is a misspelling: one sentence naming it and what it was probably meant to be, rather
    than a silent default for the key the user meant to set."""
    known = set(known)
    for key in keys:
        if key in known:
            continue
        near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.75)
        if near:
            raise ConfigError(f"{where}{key}{close} in {source} is not a {what} this reader knows; did you "
                              f"mean {where}{near[0]}{close}? fix the file")


def merge(reading: ConfigReading, given: dict[str, Any]) -> dict[str, Any]:
    """The reading's settings overlaid with those given explicitly (None means not given)."""
    explicit = {k: v for k, v in given.items() if v is not None}
    for name in explicit:  # what the user typed is theirs, not the file's, when a refusal names it
        reading.origins.pop(name, None)
    for name, value in explicit.items():
        if name in reading.settings and reading.settings[name] != value:
            if name == "strategy":
                raise ConfigError(f"{reading.source} describes {reading.settings[name]} but --strategy is "
                                  f"{value}; drop --strategy or use another configuration")
            reading.notes.append(f"overridden: --{name.replace('_', '-')} {value!r} replaces "
                                 f"{reading.settings[name]!r} from {reading.source}")
    return reading.settings | explicit
