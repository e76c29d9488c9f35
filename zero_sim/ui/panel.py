"""What every notebook panel shares: controls that redraw it, a result, and one sentence when refused.

Each panel is a small object with the same shape:

* ``controls``: name -> ipywidget; the names are ``simulate()`` keywords wherever a
  control maps to one, so a panel's state reads like a CLI command line;
* ``update()``: recompute from the controls and redraw; every control calls it;
* ``result``: what the panel shows now (a :class:`~zero_sim.results.SimResult`, a dict
  of them, a pandas frame, a fit ...);
* ``error``: the one-sentence :class:`~zero_sim.ScenarioError` message when the
  settings cannot be simulated, else ``None``; the panel prints that sentence once, where
  the headline numbers were, never a traceback, and leaves the figure blank;
* ``widget``: the layout to display (panels also display themselves in Jupyter).

Strategy knobs are not hard-coded: a :class:`ScenarioPanel` asks
``zero_sim.strategies.get_strategy(name).knobs`` which knobs the chosen strategy takes,
shows and passes only those (a knob given to the wrong strategy is an error), and builds
a control for any knob it has never seen from the knob's kind, default and choices.
Its sliders, dropdowns and checkboxes offer only what the simulator accepts beside the
other settings (:mod:`zero_sim.ui.offers`), so a refusal can come only from typed input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from typing import Any

import ipywidgets as W
from IPython.display import display

from zero_sim.links import bottleneck_gbps
from zero_sim.strategies import all_knobs
from zero_sim.ui.controls import (
    COMMON_SETTINGS,
    DEFAULT_STRATEGY,
    STOPS,
    STYLE,
    checkbox_layout,
    control_label,
    kind_of,
    knob_default,
    read_control,
    read_value,
    set_control,
    setting_control,
    stop_options,
    strategy_knob_names,
    wide_layout,
    widget_value,
    with_stop,
)
from zero_sim.ui.offers import Offers


class Panel:
    """What every panel shares: controls that call ``update()``, a result, an error sentence."""

    def __init__(self):
        self.controls: dict[str, W.ValueWidget] = {}
        self.result = None
        self.error: str | None = None
        self._holding = 0
        self.widget: W.Widget = W.VBox()

    @contextmanager
    def hold(self):
        """Change several controls and update once, at the end."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1

    def watch(self, names: Iterable[str] | None = None):
        """Make the named controls (default: all) recompute the panel when they change."""
        for name in names or self.controls:
            self.controls[name].observe(lambda change, name=name: self._changed(name, change), names="value")

    def _changed(self, name: str, change) -> None:
        if self._holding:
            return
        with self.hold():
            self.on_control(name, change)
        self.update()

    def on_control(self, name: str, change) -> None:
        """Hook: adjust other controls before the update (e.g. reset knobs on a strategy change)."""

    def set(self, **values) -> Panel:
        """Set several controls at once, then update (a notebook's or a test's shortcut)."""
        with self.hold():
            for name, value in values.items():
                if name not in self.controls:
                    raise KeyError(f"this panel has no control {name!r}; it has {', '.join(self.controls)}")
                set_control(self.controls[name], value)
                self.on_control(name, None)
        self.update()
        return self

    def update(self, *_):
        raise NotImplementedError

    def _ipython_display_(self):
        display(self.widget)


class ScenarioPanel(Panel):
    """A panel whose controls are ``simulate()`` settings and knobs of the chosen strategy.

    ``fixed`` settings are passed on every call without a control.  Knob controls exist
    for every knob of every strategy the panel may show; only the chosen strategy's are
    visible, enabled and passed.  Every slider, dropdown and checkbox offers only the values
    the simulator accepts beside the others (:class:`~zero_sim.ui.offers.Offers`); strategy,
    model and topology lead, and the others follow them.
    """

    LEADERS = ("strategy", "model", "topology")

    def __init__(self, settings: Iterable[str], values: Mapping[str, Any],
                 knobs: Iterable[str] | str = "all", fixed: Mapping[str, Any] | None = None):
        super().__init__()
        values = dict(values)
        self.fixed = dict(fixed or {})
        self.strategy = values.get("strategy", DEFAULT_STRATEGY)
        for name in settings:
            if name == "bandwidth_gbps":
                self._bandwidth_controls(values.get("bandwidth_gbps"), values)
            else:
                self.controls[name] = setting_control(name, values.get(name), self.strategy)
        owners = all_knobs()
        knob_names = list(owners) if knobs == "all" else list(knobs)
        self.knob_names = [k for k in knob_names if k not in self.controls]
        strategy = self._strategy_value()
        for name in self.knob_names:
            own = name in strategy_knob_names(strategy)
            default = knob_default(strategy, name) if own else owners[name][0][1].default
            self.controls[name] = setting_control(name, values.get(name, default), strategy)
        # Anything else the caller gave is fixed (not a control).
        for name, value in values.items():
            if name not in self.controls and name not in ("strategy", "bandwidth_override"):
                self.fixed.setdefault(name, value)
        self._sync_knobs(reset=False)
        self.offers = Offers(self.controls, self.scenarios, self.LEADERS, self.active, self._knob_defaults,
                             self._reset_knobs)
        with self.hold():
            self.offers.refresh()

    def _bandwidth_controls(self, value, values):
        """A slider over bandwidth stops plus "override the preset" (unticked: the topology's own links)."""
        topology = values.get("topology", COMMON_SETTINGS["topology"].default)
        preset = bottleneck_gbps(topology, values.get("gpus", 8)) or 100.0
        start = value if value is not None else preset
        self.controls["bandwidth_gbps"] = W.SelectionSlider(
            options=self._bandwidth_stops(preset, start), value=start,
            description=control_label("bandwidth_gbps"), style=STYLE, layout=wide_layout(),
            continuous_update=False, tooltip=COMMON_SETTINGS["bandwidth_gbps"].help)
        self.controls["bandwidth_gbps"].add_class("zs-bandwidth")
        self.controls["bandwidth_override"] = W.Checkbox(
            value=value is not None, indent=False, layout=checkbox_layout(),
            description="override the topology's slowest link (* marks its own speed)")

    @staticmethod
    def _bandwidth_stops(preset: float, value: float) -> list:
        """The stops, the topology's own bottleneck marked among them, and the value shown now."""
        stops = with_stop(with_stop(STOPS["bandwidth_gbps"], preset), value)
        # The slider's readout is a few characters wide: the topology's own speed is marked "*".
        return stop_options("bandwidth_gbps", stops, marked=preset, mark="*")

    def _strategy_value(self) -> str:
        w = self.controls.get("strategy")
        return w.value if w is not None else self.strategy

    def active(self, name: str) -> bool:
        """Whether a control matters now: every setting, and the knobs of the chosen strategy."""
        return name not in self.knob_names or name in strategy_knob_names(self._strategy_value())

    def _sync_knobs(self, reset: bool):
        """Show and enable the chosen strategy's knobs; with ``reset``, put them at its defaults."""
        strategy = self._strategy_value()
        own = strategy_knob_names(strategy)
        for name in self.knob_names:
            w = self.controls[name]
            mine = name in own
            w.disabled = not mine
            w.layout.display = None if mine else "none"
            if mine and reset:
                set_control(w, knob_default(strategy, name))

    def _reset_knobs(self):
        self._sync_knobs(reset=True)

    def _knob_defaults(self, override: Mapping[str, Any]) -> dict:
        """Widget values of the defaults of every knob control, under ``override``'s strategy if it
        names one."""
        strategy = override.get("strategy", self._strategy_value())
        own = strategy_knob_names(strategy)
        return {name: widget_value(w, knob_default(strategy, name)) for name, w in self.controls.items()
                if name in own}

    def on_control(self, name, change):
        if name == "strategy":
            self._sync_knobs(reset=True)
        if name == "bandwidth_gbps" and change is not None and "bandwidth_override" in self.controls:
            self.controls["bandwidth_override"].value = True  # moving the slider means "use this"
        if name in self.LEADERS:
            self.offers.conform()  # the others follow the leader: GPUs down to a single host's size
        if name in ("topology", "gpus") and "bandwidth_gbps" in self.controls:
            self._follow_bandwidth()
        self.offers.refresh()

    def _follow_bandwidth(self):
        """The bandwidth slider's stops mark the topology's bottleneck; unticked, the slider sits on it."""
        preset = bottleneck_gbps(self._value("topology"), self._value("gpus"))
        if not preset:
            return
        w = self.controls["bandwidth_gbps"]
        value = w.value if self.controls["bandwidth_override"].value else preset
        self.offers.replace("bandwidth_gbps", self._bandwidth_stops(preset, value))
        w.value = value

    def _value(self, name):
        """The value of one setting now: its control's, else the fixed one, else its default."""
        if name in self.controls:
            return read_control(self.controls[name], kind_of(name))
        return self.fixed.get(name, COMMON_SETTINGS[name].default if name in COMMON_SETTINGS else None)

    def settings(self, override: Mapping[str, Any] | None = None) -> dict:
        """The ``simulate()`` keywords the controls stand for now; ``override`` (name -> a value the
        control could hold) stands in for some controls' own values, to ask about a move first."""
        override = override or {}

        def value(name):
            w = self.controls[name]
            return read_value(w, override[name], kind_of(name)) if name in override else read_control(
                w, kind_of(name))

        strategy = override.get("strategy", self._strategy_value())
        own = set(strategy_knob_names(strategy))
        owners = all_knobs()
        s: dict[str, Any] = {"strategy": strategy}
        for name, fixed in self.fixed.items():
            if name in owners and name not in own:
                continue  # a fixed knob of another strategy: not this one's business
            s[name] = fixed
        for name in self.controls:
            if name in ("strategy", "bandwidth_override"):
                continue
            if name == "bandwidth_gbps":
                on = override.get("bandwidth_override", self.controls["bandwidth_override"].value)
                s[name] = value(name) if on else None
            elif name in self.knob_names:
                if name in own:
                    s[name] = value(name)
            else:
                s[name] = value(name)
        return {k: v for k, v in s.items() if v is not None}

    def scenarios(self, override: Mapping[str, Any] | None = None) -> list[dict]:
        """Every ``simulate()`` call an update makes (one here; one per variant in a comparison)."""
        return [self.settings(override)]

    def command_line(self) -> str:
        """The same scenario as a ``zero-sim simulate`` command (to copy into a terminal)."""
        parts = ["zero-sim simulate"]
        for k, v in self.settings().items():
            flag = "--" + k.replace("_", "-")
            if isinstance(v, bool):
                parts.append(flag if v else "--no-" + flag[2:])
            else:
                parts.append(f"{flag} {v}")
        return " ".join(parts)


def control_grid(panel: ScenarioPanel, names: Iterable[str]) -> W.Widget:
    """The named controls in two columns, the bandwidth slider with its override box."""
    names = [n for n in names if n in panel.controls]
    boxes = []
    for name in names:
        if name == "bandwidth_gbps":
            boxes.append(W.VBox([panel.controls["bandwidth_gbps"], panel.controls["bandwidth_override"]]))
        elif name != "bandwidth_override":
            boxes.append(panel.controls[name])
    half = (len(boxes) + 1) // 2
    return W.HBox([W.VBox(boxes[:half]), W.VBox(boxes[half:])])


__all__ = ["Panel", "ScenarioPanel", "control_grid"]
