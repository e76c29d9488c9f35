"""What every notebook panel shares: controls that redraw it, a result, and one sentence when refused.

Each panel is a small object with the same shape:

* ``controls``: name -> ipywidget; the names are ``simulate()`` keywords wherever a
  control maps to one, so a panel's state reads like a CLI command line;
* ``update()``: recompute from the controls and redraw; every control calls it;
* ``result``: what the panel shows now (a :class:`~zero_sim.results.SimResult`, a dict
  of them, a pandas frame, a fit ...);
* ``error``: the one-sentence :class:`~zero_sim.ScenarioError` message when the
  settings cannot be simulated, else ``None``; the panel prints that sentence where
  the headline numbers were, never a traceback;
* ``widget``: the layout to display (panels also display themselves in Jupyter).

Strategy knobs are not hard-coded: a :class:`ScenarioPanel` asks
``zero_sim.strategies.get_strategy(name).knobs`` which knobs the chosen strategy takes,
shows and passes only those (a knob given to the wrong strategy is an error), and builds
a control for any knob it has never seen from the knob's kind, default and choices.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from typing import Any

import ipywidgets as W
from IPython.display import display

from zero_sim.links import bottleneck_gbps
from zero_sim.strategies import all_knobs
from zero_sim.ui.controls import (
    COMMON_SETTINGS,
    STYLE,
    control_label,
    kind_of,
    knob_default,
    read_control,
    set_control,
    setting_control,
    strategy_knob_names,
    wide_layout,
)


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
    visible, enabled and passed.
    """

    def __init__(self, settings: Iterable[str], values: Mapping[str, Any],
                 knobs: Iterable[str] | str = "all", fixed: Mapping[str, Any] | None = None):
        super().__init__()
        values = dict(values)
        self.fixed = dict(fixed or {})
        self.strategy = values.get("strategy", "ddp")
        for name in settings:
            if name == "bandwidth_gbps":
                self._bandwidth_controls(values.get("bandwidth_gbps"), values)
            else:
                self.controls[name] = setting_control(name, values.get(name))
        owners = all_knobs()
        knob_names = list(owners) if knobs == "all" else list(knobs)
        self.knob_names = [k for k in knob_names if k not in self.controls]
        strategy = self._strategy_value()
        for name in self.knob_names:
            own = name in strategy_knob_names(strategy)
            default = knob_default(strategy, name) if own else owners[name][0][1].default
            self.controls[name] = setting_control(name, values.get(name, default))
        # Anything else the caller gave is fixed (not a control).
        for name, value in values.items():
            if name not in self.controls and name not in ("strategy", "bandwidth_override"):
                self.fixed.setdefault(name, value)
        self._sync_knobs(reset=False)

    def _bandwidth_controls(self, value, values):
        """A log slider plus "override the preset" (unticked: the topology's own links)."""
        topology = values.get("topology", COMMON_SETTINGS["topology"].default)
        preset = bottleneck_gbps(topology, values.get("gpus", 8)) or 100.0
        start = value if value is not None else preset
        self.controls["bandwidth_gbps"] = W.FloatLogSlider(
            value=start, base=10, min=0, max=math.log10(5000), step=0.01,
            description=control_label("bandwidth_gbps"), style=STYLE, layout=wide_layout(),
            continuous_update=False, readout_format=".3g")
        self.controls["bandwidth_gbps"].add_class("zs-bandwidth")
        self.controls["bandwidth_override"] = W.Checkbox(
            value=value is not None, description="override the topology's bottleneck link", indent=False)

    def _strategy_value(self) -> str:
        w = self.controls.get("strategy")
        return w.value if w is not None else self.strategy

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

    def on_control(self, name, change):
        if name == "strategy":
            self._sync_knobs(reset=True)
        if name == "bandwidth_gbps" and change is not None and "bandwidth_override" in self.controls:
            self.controls["bandwidth_override"].value = True  # moving the slider means "use this"
        if name in ("topology", "gpus") and "bandwidth_gbps" in self.controls:
            if not self.controls["bandwidth_override"].value:
                preset = bottleneck_gbps(self._value("topology"), self._value("gpus"))
                if preset:
                    self.controls["bandwidth_gbps"].value = preset

    def _value(self, name):
        """The value of one setting now: its control's, else the fixed one, else its default."""
        if name in self.controls:
            return read_control(self.controls[name], kind_of(name))
        return self.fixed.get(name, COMMON_SETTINGS[name].default if name in COMMON_SETTINGS else None)

    def settings(self) -> dict:
        """The ``simulate()`` keywords the controls stand for now."""
        strategy = self._strategy_value()
        own = set(strategy_knob_names(strategy))
        owners = all_knobs()
        s: dict[str, Any] = {"strategy": strategy}
        for name, value in self.fixed.items():
            if name in owners and name not in own:
                continue  # a fixed knob of another strategy: not this one's business
            s[name] = value
        for name, w in self.controls.items():
            if name in ("strategy", "bandwidth_override"):
                continue
            if name == "bandwidth_gbps":
                s[name] = w.value if self.controls["bandwidth_override"].value else None
            elif name in self.knob_names:
                if name in own:
                    s[name] = read_control(w, kind_of(name))
            else:
                s[name] = read_control(w, kind_of(name))
        return {k: v for k, v in s.items() if v is not None}

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
