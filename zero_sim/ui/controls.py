"""Controls for simulator settings and strategy knobs, and the text every panel shows.

A control is built from what a setting declares about itself: its kind, default and
choices (``zero_sim.scenario.COMMON`` for the common settings, each strategy's ``knobs``
for the rest).  Booleans become checkboxes, multiple-choice settings dropdowns, numbers
with well-known stops (GPUs, bucket sizes ...) sliders over those stops, other numbers
number boxes, and anything else a text box where empty means "the default".  So a newly
registered strategy's knobs get working controls without changes here.

:func:`read_control` turns a control back into the setting's value (``None`` for "let the
simulator choose"), and :func:`set_control` sets one, growing a slider's stops or a
dropdown's options when the value is new.  The headline numbers are written here once,
as plain text (:func:`metrics_text`, what tests read) and as HTML (:func:`metrics_html`).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

import ipywidgets as W

from zero_sim.scenario import COMMON, ScenarioError
from zero_sim.strategies import STRATEGIES, all_knobs, get_strategy
from zero_sim.sweep import sweep
from zero_sim.system.hardware import GB
from zero_sim.system.model_presets import PRESETS as MODELS
from zero_sim.system.topology import PRESETS as TOPOLOGIES

STYLE = {"description_width": "10em"}
COMMON_SETTINGS = {s.name: s for s in COMMON}

# Sensible stops for numeric settings; any other value given by a notebook is inserted.
STOPS: dict[str, list] = {
    "gpus": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
    "micro_batch": [1, 2, 4, 8, 16, 32, 64],
    "grad_accum": [1, 2, 4, 8, 16],
    "bucket_mb": [0, 1, 2, 5, 10, 25, 50, 100, 200, 500],
    "prefetch": [0, 1, 2, 3, 4, 6, 8],
    "prefetch_bucket_size": [0, 1_000_000, 5_000_000, 10_000_000, 50_000_000, 100_000_000, 500_000_000],
    "straggler_ms": [0, 1, 2, 5, 10, 20, 50, 100, 200, 500],
    "straggler_prob": [0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1],
    "overlap_slowdown": [0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5],
}
LABELS = {
    "gpus": "GPUs (N)", "micro_batch": "micro-batch", "grad_accum": "grad accumulation",
    "bucket_mb": "bucket (MiB)", "bandwidth_gbps": "bandwidth (Gbit/s)", "prefetch": "prefetch (layers)",
    "reshard_after_forward": "reshard after forward", "overlap_slowdown": "overlap slowdown",
    "straggler_prob": "straggler chance", "straggler_ms": "straggler stall (ms)",
}
DEFAULT = "(default)"  # dropdown label for "None: let the simulator choose"


def wide_layout() -> W.Layout:
    """The layout of a wide control; a fresh one per control, as hiding one must not hide the others."""
    return W.Layout(width="27em")


def control_label(name: str) -> str:
    return LABELS.get(name, name.replace("_", " "))


def with_stop(stops: list, value) -> list:
    """``stops`` with ``value`` inserted in order when it is not one of them."""
    return stops if value in stops or value is None else sorted([*stops, value])


def _stop_options(name: str, value) -> list:
    return [(_stop_label(name, v), v) for v in with_stop(STOPS[name], value)]


def _stop_label(name: str, v) -> str:
    if name == "bucket_mb" and v == 0:
        return "0 (per tensor)"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _choice_widget(name: str, options: Iterable, value, help_text: str = "") -> W.Dropdown:
    opts = list(options)
    if value is None:
        opts = [(DEFAULT, DEFAULT)] + [(str(o), o) for o in opts]
        value = DEFAULT
    return W.Dropdown(options=opts, value=value, description=control_label(name), style=STYLE,
                      tooltip=help_text or None)


def make_control(name: str, value, kind: type = float, choices: Iterable | None = None,
                 help_text: str = "") -> W.ValueWidget:
    """A control for one setting or knob, chosen from its kind, choices and known stops."""
    tooltip = help_text or None
    if kind is bool:
        return W.Checkbox(value=bool(value), description=control_label(name), indent=False, tooltip=tooltip)
    if choices:
        return _choice_widget(name, choices, value, help_text)
    if name in STOPS and isinstance(value, int | float) and not isinstance(value, bool):
        return W.SelectionSlider(options=_stop_options(name, value),
                                 value=value,
                                 description=control_label(name), style=STYLE, layout=wide_layout(),
                                 continuous_update=False, tooltip=tooltip)
    if kind is int and value is not None:
        return W.IntText(value=int(value), description=control_label(name), style=STYLE, tooltip=tooltip)
    if kind is float and value is not None:
        return W.FloatText(value=float(value), description=control_label(name), style=STYLE, tooltip=tooltip)
    # Unknown kinds, and numbers whose default is "let the strategy decide": free text, "" = default.
    return W.Text(value="" if value is None else str(value), description=control_label(name), style=STYLE,
                  placeholder="default", tooltip=tooltip)


def read_control(widget: W.ValueWidget, kind: type = str):
    """The value a control stands for, converted to the setting's kind (``None`` = default)."""
    v = widget.value
    if v == DEFAULT:
        return None
    if isinstance(widget, W.Text):
        text = v.strip()
        if not text:
            return None
        if kind in (int, float):
            try:
                number = float(text)
            except ValueError:
                raise ScenarioError(f"{widget.description} must be a number, got {text!r}") from None
            return int(number) if kind is int else number
        return text
    return v


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


def setting_control(name: str, value=None) -> W.ValueWidget:
    """A control for a common setting (``COMMON``) or any strategy's knob, starting at ``value``."""
    if name == "strategy":
        return W.Dropdown(options=list(STRATEGIES), value=value or "ddp", description="strategy", style=STYLE)
    if name == "model":
        names = sorted(MODELS, key=lambda m: MODELS[m].params())
        return W.Dropdown(options=names, value=value or "gpt2-124m", description="model", style=STYLE)
    if name == "topology":
        return W.Dropdown(options=sorted(TOPOLOGIES), value=value or COMMON_SETTINGS["topology"].default,
                          description="topology", style=STYLE)
    if name in COMMON_SETTINGS:
        s = COMMON_SETTINGS[name]
        return make_control(name, s.default if value is None else value, s.kind, s.choices, s.help)
    owners = all_knobs().get(name)
    if not owners:
        raise KeyError(f"{name!r} is neither a common setting nor a knob of any strategy")
    knob = owners[0][1]
    return make_control(name, knob.default if value is None else value, knob.kind, knob.choices, knob.help)


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
    """:func:`zero_sim.sweep.sweep` with a tqdm progress bar (a widget in the notebook)."""
    return sweep(scenarios, progress=True, description=description)


# ----------------------------------------------------------------------------- text


def format_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def format_gb(nbytes: float) -> str:
    return f"{nbytes / GB:.2f} GB"


def _fit_text(mem: Mapping[str, Any]) -> str:
    return "fits" if mem["fits"] else f"does NOT fit (short by {format_gb(mem['shortfall_bytes'])})"


def metrics_text(m: Mapping[str, Any]) -> str:
    """The headline numbers as one line of plain text (what the panels show, and tests read)."""
    mem = m["memory"]
    ov = m["comm_overlap_fraction"]
    overlap = "n/a" if ov is None else f"{ov:.0%}"
    return (f"step time {format_ms(m['step_time_s'])} · compute {format_ms(m['compute_time_s'])} · "
            f"exposed comm {format_ms(m['exposed_comm_s'])} · overlap {overlap} · "
            f"{m['tflops_per_gpu']:.1f} TFLOP/s per GPU · "
            f"peak memory {format_gb(mem['peak_bytes'])} of {format_gb(mem['capacity_bytes'])}, "
            f"{_fit_text(mem)}")


def metrics_html(m: Mapping[str, Any]) -> str:
    """The headline numbers as one line of HTML, the verdict on memory in green or red."""
    mem = m["memory"]
    ov = m["comm_overlap_fraction"]
    fit_color = "#2e7d32" if mem["fits"] else "#c62828"
    cells = [
        ("step time", format_ms(m["step_time_s"])),
        ("compute", format_ms(m["compute_time_s"])),
        ("exposed comm", format_ms(m["exposed_comm_s"])),
        ("overlap", "n/a" if ov is None else f"{ov:.0%}"),
        ("TFLOP/s per GPU", f"{m['tflops_per_gpu']:.1f}"),
        ("peak memory", f"{format_gb(mem['peak_bytes'])} of {format_gb(mem['capacity_bytes'])}"),
    ]
    items = "".join(f"<span style='margin-right:1.4em'><b class='zs-metric-name'>{k}</b> "
                    f"<span class='zs-metric-value'>{v}</span></span>" for k, v in cells)
    return (f"<div style='font-size:1.05em;line-height:1.6'>{items}"
            f"<span style='color:{fit_color};font-weight:bold'>{_fit_text(mem)}</span></div>")


def error_html(sentence: str) -> str:
    """A refusal, in red where the headline numbers were."""
    return (f"<div style='color:#b71c1c;background:#fdecea;padding:4px 8px;border-radius:4px'>"
            f"<b>cannot simulate this:</b> {html.escape(sentence)}</div>")


__all__ = [
    "COMMON_SETTINGS", "DEFAULT", "LABELS", "STOPS", "STYLE", "control_label", "error_html", "format_gb",
    "format_ms", "kind_of", "knob_default", "make_control", "metrics_html", "metrics_text",
    "read_control", "set_control", "setting_control", "strategy_knob_names", "wide_layout", "with_stop",
]
