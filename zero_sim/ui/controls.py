"""Controls for simulator settings and strategy knobs, built from what each setting declares.

A control is built from a setting's :class:`~zero_sim.settings.Setting` (``zero_sim.scenario.settings.COMMON``
for the common settings, each strategy's ``knobs`` for the rest): booleans become
checkboxes, multiple-choice settings dropdowns, numbers with well-known stops (GPUs, bucket
sizes, bandwidths ...) sliders over those stops, other numbers boxes bounded by the
setting's own range, and anything else a text box where empty means "the default".  So a
newly registered strategy's knobs get working controls without changes here.

The stops are candidates, not promises: which of them a control offers at a given moment
(those the current strategy and the other settings accept) is decided by
:mod:`zero_sim.ui.offers`.  :func:`read_control` turns a control back into the setting's
value (``None`` for "let the simulator choose"), and :func:`set_control` sets one, growing
a slider's stops or a dropdown's options when the value is new.  The headline text lives
in :mod:`zero_sim.ui.text` (re-exported here).
"""

from __future__ import annotations

from collections.abc import Iterable

import ipywidgets as W

from zero_sim.plan.sweep import sweep
from zero_sim.scenario import ScenarioError
from zero_sim.scenario.settings import COMMON, DEFAULT_STRATEGY
from zero_sim.settings import Setting
from zero_sim.strategies import STRATEGIES, all_knobs, get_strategy
from zero_sim.system.model_presets import PRESETS as MODELS
from zero_sim.system.topology import PRESETS as TOPOLOGIES
from zero_sim.ui.text import error_html, format_gb, format_ms, metrics_html, metrics_text, optimizer_text

# Labels sit in a column this wide, so the controls line up; it holds about 24 characters at
# JupyterLab's font, and a longer label takes its own width (label_style) rather than being cut.
STYLE = {"description_width": "13em"}
LABEL_FITS = 24
COMMON_SETTINGS = {s.name: s for s in COMMON}

# Candidate stops for numeric settings; any other value given by a notebook is inserted.  Which of
# them a control offers depends on the strategy and the other settings (zero_sim.ui.offers): 0 MiB
# buckets are ZeRO-2's "one reduce-scatter per tensor" and refused by DDP and ZeRO-1.
STOPS: dict[str, list] = {
    "gpus": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
    "micro_batch": [1, 2, 4, 8, 16, 32, 64],
    "grad_accum": [1, 2, 4, 8, 16],
    "bucket_mb": [0, 1, 2, 5, 10, 25, 50, 100, 200, 500],
    "bandwidth_gbps": [1, 2, 5, 10, 20, 50, 100, 200, 400, 800, 1600, 3200],
    "prefetch": [0, 1, 2, 3, 4, 6, 8],
    "prefetch_bucket_size": [0, 1_000_000, 5_000_000, 10_000_000, 50_000_000, 100_000_000, 500_000_000],
    "straggler_ms": [0, 1, 2, 5, 10, 20, 50, 100, 200, 500],
    "straggler_prob": [0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1],
    "overlap_slowdown": [0, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0],
}
LABELS = {
    "gpus": "GPUs (N)", "micro_batch": "micro-batch", "grad_accum": "grad accumulation",
    "bucket_mb": "bucket (MiB)", "bandwidth_gbps": "bandwidth (Gbit/s)", "prefetch": "prefetch (layers)",
    "reshard_after_forward": "reshard after forward", "root": "FSDP root layers",
    "overlap_slowdown": "overlap slowdown",
    "straggler_prob": "straggler chance", "straggler_ms": "straggler stall (ms)",
}
DEFAULT = "(default)"  # dropdown label for "None: let the simulator choose"


def wide_layout() -> W.Layout:
    """The layout of a wide control; a fresh one per control, as hiding one must not hide the others."""
    return W.Layout(width="30em")


def label_style(label: str) -> dict:
    """The label column's width, or the label's own when it is longer: a label is never cut."""
    return STYLE if len(label) <= LABEL_FITS else {"description_width": "initial"}


def checkbox_layout() -> W.Layout:
    """A checkbox as wide as its words (ipywidgets' fixed 300 px cuts a long description)."""
    return W.Layout(width="auto")


def control_label(name: str) -> str:
    return LABELS.get(name, name.replace("_", " "))


def with_stop(stops: list, value) -> list:
    """``stops`` with ``value`` inserted in order when it is not one of them."""
    return stops if value in stops or value is None else sorted([*stops, value])


def stop_options(name: str, stops: Iterable, marked=None, mark: str = "") -> list[tuple[str, object]]:
    """(label, value) for each stop; the stop equal to ``marked`` gets ``mark`` after its number."""
    return [(_stop_label(name, v) + (mark if mark and v == marked else ""), v) for v in stops]


def _stop_label(name: str, v) -> str:
    if name == "bucket_mb" and v == 0:
        return "0 (per tensor)"
    if name == "bandwidth_gbps":
        return f"{v:.0f}" if v >= 100 else f"{v:.3g}"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _choice_widget(name: str, options: Iterable, value, help_text: str = "") -> W.Dropdown:
    opts = list(options)
    if value is None:
        opts = [(DEFAULT, DEFAULT)] + [(str(o), o) for o in opts]
        value = DEFAULT
    return W.Dropdown(options=opts, value=value, description=control_label(name),
                      style=label_style(control_label(name)), tooltip=help_text or None)


def _bounds(setting: Setting | None, kind: type) -> dict:
    """A number box's min and max from the setting's range (a whole number above ``gt`` starts at gt + 1)."""
    if setting is None:
        return {}
    out = {}
    if setting.ge is not None:
        out["min"] = setting.ge
    elif setting.gt is not None:
        out["min"] = setting.gt + 1 if kind is int else setting.gt
    if setting.le is not None:
        out["max"] = setting.le
    if kind is int:
        out = {k: int(v) for k, v in out.items()}
    return out


def make_control(name: str, value, kind: type = float, choices: Iterable | None = None,
                 help_text: str = "", setting: Setting | None = None) -> W.ValueWidget:
    """A control for one setting or knob, chosen from its kind, choices and known stops; a number
    box is bounded by ``setting``'s range, so it cannot hold a number the setting refuses."""
    tooltip = help_text or None
    if kind is bool:
        return W.Checkbox(value=bool(value), description=control_label(name), indent=False, tooltip=tooltip,
                          layout=checkbox_layout())
    if choices:
        return _choice_widget(name, choices, value, help_text)
    if name in STOPS and isinstance(value, int | float) and not isinstance(value, bool):
        return W.SelectionSlider(options=stop_options(name, with_stop(STOPS[name], value)),
                                 value=value,
                                 description=control_label(name), style=label_style(control_label(name)),
                                 layout=wide_layout(), continuous_update=False, tooltip=tooltip)
    bounds = _bounds(setting, kind)
    if kind is int and value is not None:
        box = W.BoundedIntText if bounds else W.IntText
        return box(value=int(value), description=control_label(name), style=label_style(control_label(name)),
                   tooltip=tooltip, **bounds)
    if kind is float and value is not None:
        box = W.BoundedFloatText if bounds else W.FloatText
        label = control_label(name)
        return box(value=float(value), description=label, style=label_style(label), tooltip=tooltip, **bounds)
    # Unknown kinds, and numbers whose default is "let the strategy decide": free text, "" = default.
    return W.Text(value="" if value is None else str(value), description=control_label(name),
                  style=label_style(control_label(name)), placeholder="default", tooltip=tooltip)


def read_value(widget: W.ValueWidget, value, kind: type = str):
    """The setting ``value`` stands for when ``widget`` holds it, converted to the setting's kind
    (``None`` = default): what :func:`read_control` reads, for a value the widget may not hold yet."""
    if value == DEFAULT:
        return None
    if isinstance(widget, W.Text):
        text = value.strip()
        if not text:
            return None
        if kind in (int, float):
            try:
                number = float(text)
            except ValueError:
                raise ScenarioError(f"{widget.description} must be a number, got {text!r}") from None
            return int(number) if kind is int else number
        return text
    return value


def widget_value(widget: W.ValueWidget, value):
    """What a control holds to stand for the setting ``value``: for None, "(default)" in a dropdown
    and an empty text box."""
    if value is None and isinstance(widget, W.Dropdown):
        return DEFAULT
    if isinstance(widget, W.Text):
        return "" if value is None else str(value)
    return value


def read_control(widget: W.ValueWidget, kind: type = str):
    """The value a control stands for, converted to the setting's kind (``None`` = default)."""
    return read_value(widget, widget.value, kind)


def set_control(widget: W.ValueWidget, value) -> None:
    """Set a control, adding the value to a slider's stops or a dropdown's options when new."""
    if isinstance(widget, W.SelectionSlider):
        values = [o[1] if isinstance(o, tuple) else o for o in widget.options]
        if value not in values:
            name = next((k for k, lbl in LABELS.items() if lbl == widget.description), "")
            widget.options = [(_stop_label(name, v), v) for v in sorted([*values, value])]
    elif isinstance(widget, W.Dropdown):
        values = [o[1] if isinstance(o, tuple) else o for o in widget.options]
        if value is None and DEFAULT in values:
            value = DEFAULT
        elif value not in values:
            widget.options = [*widget.options, (str(value), value)]
    elif isinstance(widget, W.Text):
        value = "" if value is None else str(value)
    widget.value = value


def setting_of(name: str, strategy: str | None = None) -> Setting:
    """The :class:`Setting` a control stands for: a common one, ``strategy``'s knob, or the first
    strategy's that has a knob of that name."""
    if name in COMMON_SETTINGS:
        return COMMON_SETTINGS[name]
    owners = all_knobs().get(name)
    if not owners:
        raise KeyError(f"{name!r} is neither a common setting nor a knob of any strategy")
    return next((knob for owner, knob in owners if owner == strategy), owners[0][1])


def setting_control(name: str, value=None, strategy: str | None = None) -> W.ValueWidget:
    """A control for a common setting (``COMMON``) or a knob (of ``strategy`` when it has one of that
    name), starting at ``value``."""
    if name == "strategy":
        return W.Dropdown(options=list(STRATEGIES), value=value or DEFAULT_STRATEGY, description="strategy",
                          style=STYLE)
    if name == "model":
        names = sorted(MODELS, key=lambda m: MODELS[m].params())
        return W.Dropdown(options=names, value=value or "gpt2-124m", description="model", style=STYLE)
    if name == "topology":
        return W.Dropdown(options=sorted(TOPOLOGIES), value=value or COMMON_SETTINGS["topology"].default,
                          description="topology", style=STYLE)
    s = setting_of(name, strategy)
    return make_control(name, s.default if value is None else value, s.kind, s.choices, s.help, s)


def kind_of(name: str) -> type:
    """The kind (``int``, ``float``, ``bool``, ``str``) of a common setting or a knob."""
    if name in COMMON_SETTINGS:
        return COMMON_SETTINGS[name].kind
    owners = all_knobs().get(name)
    return owners[0][1].kind if owners else str


def strategy_knob_names(strategy: str) -> list[str]:
    """Names of the knobs ``strategy`` accepts (empty for an unknown strategy)."""
    try:
        return [k.name for k in get_strategy(strategy).knobs]
    except ValueError:
        return []


def knob_default(strategy: str, name: str):
    """The default of ``strategy``'s knob ``name``."""
    for k in get_strategy(strategy).knobs:
        if k.name == name:
            return k.default
    raise KeyError(name)


def sweep_with_bar(scenarios, description: str = "simulating"):
    """:func:`zero_sim.plan.sweep.sweep` with a tqdm progress bar (a widget in the notebook)."""
    return sweep(scenarios, progress=True, description=description)


__all__ = [
    "COMMON_SETTINGS", "DEFAULT", "DEFAULT_STRATEGY", "LABELS", "STOPS", "STYLE", "control_label",
    "error_html", "format_gb",
    "format_ms", "kind_of", "knob_default", "make_control", "metrics_html", "metrics_text", "optimizer_text",
    "read_control", "read_value", "set_control", "setting_control", "setting_of", "stop_options",
    "strategy_knob_names", "sweep_with_bar", "wide_layout", "widget_value", "with_stop",
]
