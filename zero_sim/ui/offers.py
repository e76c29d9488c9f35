"""Which values a panel's controls offer: only those the simulator accepts beside the other settings.

A reader moving a slider should never meet "cannot simulate this".  So every slider,
dropdown and checkbox that stands for a setting keeps a list of *candidates* (a slider's
stops, a dropdown's choices, a checkbox's two states, plus any value a notebook gave it)
and shows only those it may take now.  The rules, each for a reason:

* A candidate is offered when :func:`zero_sim.ui.refusals.refusal` accepts the panel's
  scenarios with it in place and every other control as it is.  That one check carries the
  current strategy's :class:`~zero_sim.settings.Setting` for each knob (so the bucket slider
  offers 0, "one reduce-scatter per tensor", to ZeRO-2 and not to DDP, which refuses it)
  and every rule across settings (GPUs a multiple of the topology's node size, at most one
  host's GPUs on a single-host preset, hybrid sharding only across two nodes).  Moving one
  control therefore always lands on a scenario the simulator runs.
* *Leaders* (strategy, model, topology) offer every value the other controls can follow
  them to: hiding a topology because of the GPU slider would hide why.  After a leader
  moves, each other control left refused moves to its nearest offered value (GPUs down to a
  single host's size); if none has one, the knobs go back to their defaults first (hybrid
  unticked) and the move is tried again.  A leader's value that no such move rescues (a
  model deeper than a fixed layer count allows) is not offered.
* When the scenario is already refused (a value a notebook or a text box gave), a
  candidate is still offered if it adds no new refusal, so the reader can move away from it.
* A checkbox with one allowed state, or a list with one option, is disabled, and its
  tooltip says why the other is refused.  Number boxes hold only numbers in their setting's
  range (:func:`zero_sim.ui.controls.make_control`).  Text boxes are typed input: what they
  hold is checked when simulated, and a refusal is shown once, above the figure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import ipywidgets as W

from zero_sim.ui.refusals import refusal

Option = tuple[str, Any]  # (label shown, value)
SELECTIONS = (W.SelectionSlider, W.Dropdown, W.ToggleButtons)


def offering(widget: W.Widget) -> bool:
    """Whether a control chooses among values (and so can be kept to the accepted ones)."""
    return isinstance(widget, SELECTIONS + (W.Checkbox,))


def options_of(widget: W.Widget) -> list[Option]:
    """(label, value) for each option of a selection control; both states of a checkbox."""
    if isinstance(widget, W.Checkbox):
        return [("off", False), ("on", True)]
    return [o if isinstance(o, tuple) else (str(o), o) for o in widget.options]


def nearest(allowed: list, current, order: list):
    """The allowed value nearest ``current`` by position among all candidates (``order``),
    the smaller on a tie: 128 GPUs on a 64-GPU host become 64."""
    if current in allowed:
        return current
    if current not in order:
        return allowed[0]
    here = order.index(current)
    return min(allowed, key=lambda v: (abs(order.index(v) - here), order.index(v)))


def show_options(widget: W.Widget, options: list[Option]) -> None:
    """Give a selection control these options, keeping its value (setting ``options`` alone would
    move it to the first); a no-op when they are already its options."""
    if isinstance(widget, W.Checkbox) or options == options_of(widget):
        return
    value = widget.value
    widget.options = options
    if any(v == value for _, v in options):
        widget.value = value


class Offers:
    """The values each selection control of a panel offers, kept in step with the other controls.

    ``scenarios(override)`` returns the ``simulate()`` keywords the panel would run with the
    controls named in ``override`` (name -> widget value) in place of their own values.
    ``active(name)`` says whether a control matters now (a hidden knob of another strategy
    does not); ``knob_defaults(override)`` gives the widget values of the knobs' defaults
    under the strategy ``override`` names (or the current one), and ``reset_knobs()`` puts
    them there.  The panel calls :meth:`refresh` after every change, inside its ``hold()``
    so that moving options does not re-simulate, and :meth:`conform` first when a leader moved."""

    def __init__(self, controls: Mapping[str, W.Widget], scenarios: Callable[[dict], list[dict]],
                 leaders: Iterable[str] = (), active: Callable[[str], bool] = lambda name: True,
                 knob_defaults: Callable[[dict], dict] = lambda override: {},
                 reset_knobs: Callable[[], None] = lambda: None):
        self.controls = controls
        self.scenarios = scenarios
        self.leaders = set(leaders)
        self.active = active
        self.knob_defaults = knob_defaults
        self.reset_knobs = reset_knobs
        self.candidates: dict[str, list[Option]] = {
            name: options_of(w) for name, w in controls.items() if offering(w)}
        self.help = {name: getattr(controls[name], "tooltip", None) for name in self.candidates}
        # name -> {value: the sentence the simulator refuses it with}, for what is not offered now
        self.refused: dict[str, dict[Any, str]] = {}

    def followers(self) -> list[str]:
        return [n for n in self.candidates if n not in self.leaders and self.active(n)]

    def refusals(self, override: Mapping[str, Any] | None = None) -> list[str | None]:
        """The simulator's sentence (or None) for each scenario of the panel, with ``override``."""
        return [refusal(s) for s in self.scenarios(dict(override or {}))]

    def learn(self) -> None:
        """Keep a value the control was given (by a notebook, or ``set_control``) among its candidates."""
        for name, cands in self.candidates.items():
            for label, value in options_of(self.controls[name]):
                if not any(v == value for _, v in cands):
                    cands.append((label, value))
                    if all(isinstance(v, int | float) and not isinstance(v, bool) for _, v in cands):
                        cands.sort(key=lambda o: o[1])

    def replace(self, name: str, options: list[Option]) -> None:
        """New candidates for one control (the bandwidth slider's stop for a new topology)."""
        self.candidates[name] = list(options)
        show_options(self.controls[name], options)

    def _new_refusal(self, override: dict, now: list[str | None] | None) -> str | None:
        """The first refusal ``override`` brings that the scenarios do not have ``now`` (with no ``now``,
        any refusal at all)."""
        found = self.refusals(override)
        base = now if now is not None else [None] * len(found)
        return next((r for r, b in zip(found, base, strict=True) if r is not None and r != b), None)

    def _reachable(self, name: str, value, now: list[str | None] | None) -> str | None:
        """For a leader: None when ``value`` can be taken, as the others are or once :meth:`conform` has
        moved them (its knobs at their defaults, then one other control to another of its values);
        else the refusal met as the others are."""
        first = self._new_refusal({name: value}, now)
        if first is None:
            return None
        others = [n for n in self.candidates if n not in self.leaders and n != name]
        for trial in ({name: value}, {name: value} | self.knob_defaults({name: value})):
            if self._new_refusal(trial, now) is None:
                return None
            for other in others:
                for _, v in self.candidates[other]:
                    if self._new_refusal(trial | {other: v}, now) is None:
                        return None
        return first

    def allowed(self, name: str, now: list[str | None] | None = None) -> tuple[list[Option], dict[Any, str]]:
        """The candidates of ``name`` to offer, and the refusal of each left out.

        With ``now`` (the refusals of the scenarios as they are), a candidate that leaves every
        scenario as accepted or as refused as it is now is offered; without, only those that
        the simulator accepts outright.  A leader's candidate is offered when the others can
        follow it there."""
        widget = self.controls[name]
        keep, why = [], {}
        for label, value in self.candidates[name]:
            if value == widget.value and now is not None:
                keep.append((label, value))
                continue
            if name in self.leaders:
                refused = self._reachable(name, value, now)
            else:
                refused = self._new_refusal({name: value}, now)
            if refused is None:
                keep.append((label, value))
            else:
                why[value] = refused
        return keep, why

    def refresh(self) -> None:
        """Show each active control only the values it may take beside the others as they are now."""
        self.learn()
        now = self.refusals()
        for name in self.candidates:
            if not self.active(name):
                continue
            keep, why = self.allowed(name, now)
            self.refused[name] = why
            widget = self.controls[name]
            show_options(widget, keep)
            # One allowed state (or option) is no choice: disabled, and the tooltip says why.
            alone = len(keep) < 2 and bool(why)
            widget.disabled = alone
            widget.tooltip = next(iter(why.values())) if alone else self.help[name]

    def conform(self) -> None:
        """After a leader moved: move each follower it left refused to the nearest value it may take."""
        for attempt in range(2):
            for name in self.followers():
                if not any(self.refusals()):
                    return
                widget = self.controls[name]
                keep, _ = self.allowed(name)
                values = [v for _, v in keep]
                if values and widget.value not in values:
                    order = [v for _, v in self.candidates[name]]
                    show_options(widget, self.candidates[name])
                    widget.value = nearest(values, widget.value, order)
            if attempt == 0 and any(self.refusals()):
                self.reset_knobs()  # a knob the new leader cannot take (hybrid on one host) blocks the rest


__all__ = ["Offers", "nearest", "offering", "options_of", "show_options"]
