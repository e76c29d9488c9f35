"""Panels of controls and pictures that the notebooks compose.

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

Why panels and not plotting cells: the point of the suite is to *move* something
(bandwidth, bucket size, N) and see the step change.  ``simulate()`` takes about 10 ms
for GPT-2 124M on 8 ranks, so a panel can recompute on every slider release; figures
are created once and their axes cleared and redrawn, so with the ``ipympl`` backend
(``%matplotlib widget``) a redraw costs milliseconds, not a new image.  With any other
backend (tests, static renders) the same figure is shown through an ``Output``.

Strategy knobs are not hard-coded: a panel asks
``zero_sim.strategies.get_strategy(name).knobs`` which knobs the chosen strategy takes,
shows and passes only those (a knob given to the wrong strategy is an error), and builds
a control for any knob it has never seen from the knob's kind, default and choices, so a
newly registered strategy appears in every panel without changes here.

Panels:

* :class:`TimelineExplorer`: one scenario, a Gantt per rank x stream, memory over time,
  headline metrics, and a button that writes a Perfetto trace;
* :class:`ComparePanel`: several variants of one scenario side by side on one time axis;
* :class:`MemoryCalculator`: the ZeRO paper's per-rank model-state arithmetic, no simulation;
* :class:`NcclFitPanel`: paste nccl-tests output, fit latency and bus bandwidth;
* :class:`Planner`: which strategies and knobs fit in memory, and which is fastest;
* :func:`sweep`: many simulations into one table, with a progress bar.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ipywidgets as W

from zero_sim.scenario import COMMON, ScenarioError, simulate
from zero_sim.strategies import STRATEGIES, all_knobs, get_strategy
from zero_sim.vocabulary import MEMORY_CATEGORIES

GB = 1e9  # the suite reports decimal gigabytes, as the ZeRO paper and seed 003 do
STAGE_NAMES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
STAGE_STRATEGIES = ("ddp", "zero1", "zero2", "zero3")

_STYLE = {"description_width": "10em"}


def _wide() -> W.Layout:
    return W.Layout(width="27em")  # a fresh Layout per control: hiding one must not hide the others

# ----------------------------------------------------------------------------- controls

# Sensible stops for numeric settings; any other value given by a notebook is inserted.
_STOPS: dict[str, list] = {
    "gpus": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
    "micro_batch": [1, 2, 4, 8, 16, 32, 64],
    "grad_accum": [1, 2, 4, 8, 16],
    "bucket_mb": [0, 1, 2, 5, 10, 25, 50, 100, 200, 500],
    "prefetch": [0, 1, 2, 3, 4, 6, 8],
    "prefetch_bucket_mb": [0, 1, 5, 10, 25, 50, 100, 200, 500],
    "straggler_ms": [0, 1, 2, 5, 10, 20, 50, 100, 200, 500],
    "straggler_prob": [0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1],
    "overlap_slowdown": [0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5],
}
_LABELS = {
    "gpus": "GPUs (N)", "micro_batch": "micro-batch", "grad_accum": "grad accumulation",
    "bucket_mb": "bucket (MiB)", "bandwidth_gbps": "bandwidth (Gbit/s)", "prefetch": "prefetch (layers)",
    "reshard_after_forward": "reshard after forward", "overlap_slowdown": "overlap slowdown",
    "straggler_prob": "straggler chance", "straggler_ms": "straggler stall (ms)",
}
_DEFAULT = "(default)"  # dropdown label for "None: let the simulator choose"


def _label(name: str) -> str:
    return _LABELS.get(name, name.replace("_", " "))


def _with_stop(stops: list, value) -> list:
    return stops if value in stops or value is None else sorted([*stops, value])


def _stop_options(name: str, value) -> list:
    return [(_stop_label(name, v), v) for v in _with_stop(_STOPS[name], value)]


def _stop_label(name: str, v) -> str:
    if name == "bucket_mb" and v == 0:
        return "0 (per tensor)"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _choice_widget(name: str, options: Iterable, value, help_text: str = "") -> W.Dropdown:
    opts = list(options)
    if value is None:
        opts = [(_DEFAULT, _DEFAULT)] + [(str(o), o) for o in opts]
        value = _DEFAULT
    return W.Dropdown(options=opts, value=value, description=_label(name), style=_STYLE,
                      tooltip=help_text or None)


def make_control(name: str, value, kind: type = float, choices: Iterable | None = None,
                 help_text: str = "") -> W.ValueWidget:
    """A control for one setting or knob, chosen from its kind, choices and known stops."""
    if kind is bool:
        return W.Checkbox(value=bool(value), description=_label(name), indent=False, tooltip=help_text or None)
    if choices:
        return _choice_widget(name, choices, value, help_text)
    if name in _STOPS and (value is None or isinstance(value, int | float)):
        stops = _with_stop(_STOPS[name], value)
        return W.SelectionSlider(options=_stop_options(name, value), value=value if value is not None else stops[0],
                                 description=_label(name), style=_STYLE, layout=_wide(),
                                 continuous_update=False, tooltip=help_text or None)
    if kind is int and value is not None:
        return W.IntText(value=int(value), description=_label(name), style=_STYLE, tooltip=help_text or None)
    if kind is float and value is not None:
        return W.FloatText(value=float(value), description=_label(name), style=_STYLE, tooltip=help_text or None)
    # Unknown kinds, and numbers whose default is "let the strategy decide": free text, "" = default.
    return W.Text(value="" if value is None else str(value), description=_label(name), style=_STYLE,
                  placeholder="default", tooltip=help_text or None)


def read_control(widget: W.ValueWidget, kind: type = str):
    """The value a control stands for, converted to the setting's kind (``None`` = default)."""
    v = widget.value
    if v == _DEFAULT:
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
            name = next((k for k, lbl in _LABELS.items() if lbl == widget.description), "")
            widget.options = [(_stop_label(name, v), v) for v in sorted([*values, value])]
    elif isinstance(widget, W.Dropdown):
        values = [o[1] if isinstance(o, tuple) else o for o in widget.options]
        if value is None and _DEFAULT in values:
            value = _DEFAULT
        elif value not in values:
            widget.options = [*widget.options, (str(value), value)]
    elif isinstance(widget, W.Text):
        value = "" if value is None else str(value)
    widget.value = value


_COMMON = {s.name: s for s in COMMON}


def setting_control(name: str, value=None) -> W.ValueWidget:
    """A control for a common setting (``COMMON``) or any strategy's knob, starting at ``value``."""
    from zero_sim.system.topology import PRESETS as TOPOLOGIES
    from zero_sim.system.workload import PRESETS as MODELS

    if name == "strategy":
        return W.Dropdown(options=list(STRATEGIES), value=value or "ddp", description="strategy", style=_STYLE)
    if name == "model":
        names = sorted(MODELS, key=lambda m: MODELS[m].params())
        return W.Dropdown(options=names, value=value or "gpt2-124m", description="model", style=_STYLE)
    if name == "topology":
        return W.Dropdown(options=sorted(TOPOLOGIES), value=value or _COMMON["topology"].default,
                          description="topology", style=_STYLE)
    if name in _COMMON:
        s = _COMMON[name]
        return make_control(name, s.default if value is None else value, s.kind, s.choices, s.help)
    owners = all_knobs().get(name)
    if not owners:
        raise KeyError(f"{name!r} is neither a common setting nor a knob of any strategy")
    knob = owners[0][1]
    return make_control(name, knob.default if value is None else value, knob.kind, knob.choices, knob.help)


def kind_of(name: str) -> type:
    if name in _COMMON:
        return _COMMON[name].kind
    owners = all_knobs().get(name)
    return owners[0][1].kind if owners else str


def strategy_knob_names(strategy: str) -> list[str]:
    """Names of the knobs ``strategy`` accepts (empty for an unknown strategy)."""
    try:
        return [k.name for k in get_strategy(strategy).knobs]
    except ValueError:
        return []


def knob_default(strategy: str, name: str):
    for k in get_strategy(strategy).knobs:
        if k.name == name:
            return k.default
    raise KeyError(name)


def bottleneck_gbps(topology: str, gpus: int, gpus_per_node: int | None = None) -> float | None:
    """Bandwidth of the link that limits a ring over every rank, in Gbit/s (what --bandwidth-gbps overrides)."""
    from zero_sim.system.topology import build_topology

    try:
        topo = build_topology(topology, gpus, gpus_per_node)
    except ValueError:
        return None
    kind = topo.bottleneck_kind()
    caps = [link.capacity for link in topo.links.values() if link.kind == kind]
    return min(caps) * 8 / 1e9 if caps else None


# ----------------------------------------------------------------------------- formatting


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _gb(nbytes: float) -> str:
    return f"{nbytes / GB:.2f} GB"


def metrics_text(m: Mapping[str, Any]) -> str:
    """The headline numbers as one line of plain text (what the panels show, and tests read)."""
    mem = m["memory"]
    ov = m["comm_overlap_fraction"]
    fit = "fits" if mem["fits"] else f"does NOT fit (short by {_gb(mem['shortfall_bytes'])})"
    return (f"step time {_ms(m['step_time_s'])} · compute {_ms(m['compute_time_s'])} · "
            f"exposed comm {_ms(m['exposed_comm_s'])} · overlap {'n/a' if ov is None else f'{ov:.0%}'} · "
            f"{m['tflops_per_gpu']:.1f} TFLOP/s per GPU · "
            f"peak memory {_gb(mem['peak_bytes'])} of {_gb(mem['capacity_bytes'])}, {fit}")


def metrics_html(m: Mapping[str, Any]) -> str:
    mem = m["memory"]
    ov = m["comm_overlap_fraction"]
    fit_color = "#2e7d32" if mem["fits"] else "#c62828"
    fit = "fits" if mem["fits"] else f"does NOT fit (short by {_gb(mem['shortfall_bytes'])})"
    cells = [
        ("step time", _ms(m["step_time_s"])),
        ("compute", _ms(m["compute_time_s"])),
        ("exposed comm", _ms(m["exposed_comm_s"])),
        ("overlap", "n/a" if ov is None else f"{ov:.0%}"),
        ("TFLOP/s per GPU", f"{m['tflops_per_gpu']:.1f}"),
        ("peak memory", f"{_gb(mem['peak_bytes'])} of {_gb(mem['capacity_bytes'])}"),
    ]
    items = "".join(f"<span style='margin-right:1.4em'><b class='zs-metric-name'>{k}</b> "
                    f"<span class='zs-metric-value'>{v}</span></span>" for k, v in cells)
    return (f"<div style='font-size:1.05em;line-height:1.6'>{items}"
            f"<span style='color:{fit_color};font-weight:bold'>{fit}</span></div>")


def error_html(sentence: str) -> str:
    return (f"<div style='color:#b71c1c;background:#fdecea;padding:4px 8px;border-radius:4px'>"
            f"<b>cannot simulate this:</b> {html.escape(sentence)}</div>")


def summary_row(result) -> dict:
    """One flat row of a result's headline metrics, in ms and GB (for tables and charts)."""
    m = result.metrics
    mem = m["memory"]
    ov = m["comm_overlap_fraction"]
    return {
        "params": m["params"],
        "step_ms": m["step_time_s"] * 1e3,
        "compute_ms": m["compute_time_s"] * 1e3,
        "exposed_comm_ms": m["exposed_comm_s"] * 1e3,
        "overlap": ov,
        "forward_ms": m["phases"]["forward_s"] * 1e3,
        "backward_ms": m["phases"]["backward_s"] * 1e3,
        "optimizer_ms": m["phases"]["optimizer_s"] * 1e3,
        "tflops_per_gpu": m["tflops_per_gpu"],
        "tokens_per_s": m["tokens_per_s"],
        "comm_GB": m["comm_volume_bytes"] / GB,
        "collectives": m.get("collectives_per_step"),
        "model_states_GB": mem["model_states_bytes"] / GB,
        "activations_GB": mem["activations_bytes"] / GB,
        "buffers_GB": mem["buffers_bytes"] / GB,
        "peak_GB": mem["peak_bytes"] / GB,
        "capacity_GB": mem["capacity_bytes"] / GB,
        "fits": mem["fits"],
    }


# ----------------------------------------------------------------------------- figures


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def _interactive_backend() -> bool:
    import matplotlib

    return "ipympl" in matplotlib.get_backend() or "widget" in matplotlib.get_backend()


class _Figure:
    """One matplotlib figure reused for every redraw: a live canvas under ipympl, else an Output."""

    def __init__(self, figsize, nrows=1, height_ratios=None, sharex=False):
        import matplotlib.pyplot as plt
        from matplotlib.figure import Figure

        kw = {"gridspec_kw": {"height_ratios": height_ratios}} if height_ratios else {}
        if _interactive_backend():
            with plt.ioff():
                self.fig = plt.figure(figsize=figsize)
            self.fig.canvas.header_visible = False
            self.fig.canvas.footer_visible = False
            self.fig.canvas.toolbar_position = "right"
            self.fig.canvas.resizable = False
            self.widget = self.fig.canvas
            self.live = True
        else:
            self.fig = Figure(figsize=figsize)
            self.widget = W.Output()
            self.live = False
        axes = self.fig.subplots(nrows, 1, sharex=sharex, **kw)
        self.axes = list(axes) if nrows > 1 else [axes]

    def clear(self):
        for ax in self.axes:
            ax.clear()

    def show(self):
        if self.live:
            self.fig.canvas.draw_idle()
        elif _in_kernel():
            from IPython.display import display

            self.widget.clear_output(wait=True)
            with self.widget:
                display(self.fig)

    def message(self, text: str):
        """Blank the axes and write ``text`` on the first one (shown when settings are refused)."""
        self.clear()
        for ax in self.axes:
            ax.set_axis_off()
        self.axes[0].text(0.5, 0.5, text, ha="center", va="center", wrap=True, color="#b71c1c",
                          transform=self.axes[0].transAxes)
        self.show()

    def restore_axes(self):
        for ax in self.axes:
            ax.set_axis_on()


# ----------------------------------------------------------------------------- panels


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

    def _watch(self, names: Iterable[str] | None = None):
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
        from IPython.display import display

        display(self.widget)


class ScenarioPanel(Panel):
    """A panel whose controls are ``simulate()`` settings and knobs of the chosen strategy.

    ``fixed`` settings are passed on every call without a control.  Knob controls exist
    for every knob of every strategy the panel may show; only the chosen strategy's are
    visible, enabled and passed.
    """

    def __init__(self, settings: Iterable[str], values: Mapping[str, Any], knobs: Iterable[str] | str = "all",
                 fixed: Mapping[str, Any] | None = None):
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
        for name in self.knob_names:
            first_owner = self._strategy_value() if name in strategy_knob_names(self._strategy_value()) else None
            default = knob_default(first_owner, name) if first_owner else owners[name][0][1].default
            self.controls[name] = setting_control(name, values.get(name, default))
        # Anything else the caller gave is fixed (not a control).
        for name, value in values.items():
            if name not in self.controls and name not in ("strategy", "bandwidth_override"):
                self.fixed.setdefault(name, value)
        self._sync_knobs(reset=False)

    # bandwidth: a log slider plus "override the preset" (off = the topology's own links)
    def _bandwidth_controls(self, value, values):
        preset = bottleneck_gbps(values.get("topology", _COMMON["topology"].default), values.get("gpus", 8)) or 100.0
        start = value if value is not None else preset
        self.controls["bandwidth_gbps"] = W.FloatLogSlider(
            value=start, base=10, min=0, max=math.log10(5000), step=0.01, description=_label("bandwidth_gbps"),
            style=_STYLE, layout=_wide(), continuous_update=False, readout_format=".3g")
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
        if name in self.controls:
            return read_control(self.controls[name], kind_of(name))
        return self.fixed.get(name, _COMMON[name].default if name in _COMMON else None)

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


def _control_grid(panel: ScenarioPanel, names: Iterable[str]) -> W.Widget:
    names = [n for n in names if n in panel.controls]
    boxes = []
    for name in names:
        if name == "bandwidth_gbps":
            boxes.append(W.VBox([panel.controls["bandwidth_gbps"], panel.controls["bandwidth_override"]]))
        elif name != "bandwidth_override":
            boxes.append(panel.controls[name])
    half = (len(boxes) + 1) // 2
    return W.HBox([W.VBox(boxes[:half]), W.VBox(boxes[half:])])


def _tidy_timeline(ax):
    """Smaller type, and the legend under the ticks where the x label was (the axis below repeats it)."""
    ax.title.set_fontsize(9)
    ax.tick_params(labelsize=8)
    ax.set_xlabel("")
    legend = ax.get_legend()
    if legend is not None:
        legend.set_bbox_to_anchor((0.5, -0.06))
        legend.set_loc("upper center")


class TimelineExplorer(ScenarioPanel):
    """One scenario, live: Gantt per rank x stream, memory over time, headline metrics, trace export.

    ``TimelineExplorer(strategy="ddp", topology="pcie", gpus=8)``: keywords are
    ``simulate()`` settings; those with a control start there, the rest are fixed.
    """

    SETTINGS = ("strategy", "model", "gpus", "topology", "bandwidth_gbps", "micro_batch", "recompute")

    def __init__(self, settings: Iterable[str] = SETTINGS, knobs: Iterable[str] | str = "all",
                 max_ranks: int = 4, trace_dir: str | Path = "out", figsize=(9, 6.2), auto: bool = True,
                 **values):
        values.setdefault("strategy", "ddp")
        values.setdefault("topology", "pcie")
        values.setdefault("gpus", 8)
        super().__init__(settings, values, knobs)
        self.max_ranks = max_ranks
        self.trace_dir = Path(trace_dir)
        self.metrics = W.HTML(layout=W.Layout(min_height="2.2em"))
        self.metrics.add_class("zs-metrics")
        self.errors = W.HTML()
        self.errors.add_class("zs-error")
        self.notes = W.HTML()
        self.trace_button = W.Button(description="save Perfetto trace", icon="download",
                                     tooltip="write this step as a Chrome/Perfetto trace JSON")
        self.trace_status = W.HTML()
        self.trace_status.add_class("zs-trace-status")
        self.trace_button.on_click(lambda _: self.save_trace())
        self.figure = _Figure(figsize, nrows=2, height_ratios=[3, 2])
        self.figure.fig.subplots_adjust(left=0.16, right=0.98, top=0.94, bottom=0.08, hspace=0.55)
        self.widget = W.VBox([
            _control_grid(self, list(settings) + self.knob_names),
            self.metrics, self.errors, self.figure.widget, self.notes,
            W.HBox([self.trace_button, self.trace_status]),
        ])
        self.widget.add_class("zs-timeline-explorer")
        self._watch()
        if auto:
            self.update()

    def update(self, *_):
        try:
            self.result = simulate(**self.settings())
            self.error = None
        except (ScenarioError, ValueError) as exc:
            self.result, self.error = None, str(exc)
        self.render()
        return self.result

    def render(self):
        fig = self.figure
        if self.error:
            self.metrics.value = ""
            self.errors.value = error_html(self.error)
            self.notes.value = ""
            fig.message(self.error)
            return
        self.errors.value = ""
        self.metrics.value = metrics_html(self.result.metrics)
        notes = list(self.result.notes)
        if len(self.result.simulated_ranks) < self.result.world_size:
            notes.append(f"all {self.result.world_size} ranks behave alike here, so one was simulated "
                         f"and its lanes are repeated")
        self.notes.value = ("<small>" + " · ".join(html.escape(n) for n in notes) + "</small>") if notes else ""
        fig.clear()
        fig.restore_axes()
        ax_t, ax_m = fig.axes
        self.result.plot_timeline(ax=ax_t, max_ranks=self.max_ranks)
        self.result.plot_memory(ax=ax_m)
        _tidy_timeline(ax_t)
        ax_m.set_xlim(ax_t.get_xlim())
        ax_m.title.set_fontsize(9)
        ax_m.legend(loc="upper right", fontsize=7, ncol=3, frameon=False)
        fig.show()

    def save_trace(self, path: str | Path | None = None) -> Path | None:
        """Write the shown step as a Chrome/Perfetto trace; returns the path (None when nothing to save)."""
        if self.result is None:
            self.trace_status.value = "nothing to save: the settings above cannot be simulated"
            return None
        m = self.result.metrics
        if path is None:
            path = self.trace_dir / f"{m['strategy']}_{m['model']}_N{m['gpus']}_{m['topology']}.json"
        path = Path(path)
        trace = self.result.to_chrome_trace(path)
        self.trace_status.value = (f"wrote <code>{html.escape(str(path))}</code> "
                                   f"({len(trace['traceEvents']):,} events): open it at "
                                   f"<a href='https://ui.perfetto.dev' target='_blank'>ui.perfetto.dev</a>")
        return path


class ComparePanel(ScenarioPanel):
    """Several variants of one scenario, their timelines stacked on one time axis.

    ``ComparePanel({"step": {"zero2_launch": "step"}, "hook": {"zero2_launch": "hook"}},
    strategy="zero2", settings=("gpus", "bandwidth_gbps"))``: each variant's settings are
    laid over the shared ones (a variant may change the strategy); ``result`` is a dict
    label -> SimResult, and ``errors`` label -> sentence for variants that were refused.
    """

    def __init__(self, variants: Mapping[str, Mapping[str, Any]], settings: Iterable[str] = ("gpus", "bandwidth_gbps"),
                 knobs: Iterable[str] = (), max_ranks: int = 1, figsize=None, auto: bool = True, **values):
        values.setdefault("strategy", "ddp")
        super().__init__(settings, values, knobs)
        # Knob controls here apply to whichever variants accept them, so keep them all visible.
        for name in self.knob_names:
            self.controls[name].disabled = False
            self.controls[name].layout.display = None
        self.variants = {label: dict(v) for label, v in variants.items()}
        self.max_ranks = max_ranks
        self.errors: dict[str, str] = {}
        self.table = W.HTML()
        self.table.add_class("zs-metrics")
        self.error_box = W.HTML()
        self.error_box.add_class("zs-error")
        n = len(self.variants)
        lanes = max_ranks * 3
        self.figure = _Figure(figsize or (9, 1.0 + n * (0.45 * lanes + 0.9)), nrows=n, sharex=True)
        self.figure.fig.subplots_adjust(left=0.16, right=0.98, top=0.95, bottom=0.1 + 0.1 / n, hspace=0.75)
        self.widget = W.VBox([_control_grid(self, list(settings) + self.knob_names), self.table,
                              self.error_box, self.figure.widget])
        self._watch()
        if auto:
            self.update()

    def on_control(self, name, change):
        super().on_control(name, change)
        for k in self.knob_names:  # stay visible whatever the shared strategy
            self.controls[k].disabled = False
            self.controls[k].layout.display = None

    def variant_settings(self, label: str) -> dict:
        base = self.settings()
        # Knob controls were filtered by the shared strategy; re-add those this variant takes.
        v = self.variants[label]
        strategy = v.get("strategy", base["strategy"])
        own = set(strategy_knob_names(strategy))
        owners = all_knobs()
        out = {k: val for k, val in base.items() if k not in owners or k in own}
        for name in self.knob_names:
            if name in own:
                out[name] = read_control(self.controls[name], kind_of(name))
        for k, val in self.fixed.items():
            if k in owners and k in own:
                out[k] = val
        out.update(v)
        return {k: val for k, val in out.items() if val is not None}

    def update(self, *_):
        results, errors = {}, {}
        for label in self.variants:
            try:
                results[label] = simulate(**self.variant_settings(label))
            except (ScenarioError, ValueError) as exc:
                errors[label] = str(exc)
        self.result, self.errors = results, errors
        self.error = "; ".join(f"{k}: {v}" for k, v in errors.items()) or None
        self.render()
        return self.result

    def frame(self):
        import pandas as pd

        return pd.DataFrame({label: summary_row(r) for label, r in self.result.items()}).T.infer_objects()

    def render(self):
        rows = "".join(
            f"<tr><td><b>{html.escape(label)}</b></td><td>{html.escape(metrics_text(r.metrics))}</td></tr>"
            for label, r in self.result.items())
        self.table.value = f"<table>{rows}</table>"
        self.error_box.value = "".join(error_html(f"{k}: {v}") for k, v in self.errors.items())
        fig = self.figure
        fig.clear()
        fig.restore_axes()
        longest = max((r.metrics["step_time_s"] for r in self.result.values()), default=0) * 1e3
        for ax, label in zip(fig.axes, self.variants, strict=True):
            r = self.result.get(label)
            if r is None:
                ax.set_axis_off()
                ax.text(0.5, 0.5, f"{label}: {self.errors[label]}", ha="center", va="center", wrap=True,
                        color="#b71c1c", transform=ax.transAxes)
                continue
            m = r.metrics
            r.plot_timeline(ax=ax, max_ranks=self.max_ranks, legend=ax is fig.axes[-1],
                            title=f"{label}: step {m['step_time_s'] * 1e3:.2f} ms, exposed comm "
                                  f"{m['exposed_comm_s'] * 1e3:.2f} ms, optimizer phase "
                                  f"{m['phases']['optimizer_s'] * 1e3:.2f} ms")
            _tidy_timeline(ax)
        # One legend for the whole figure, under the last axis's label.
        fig.fig.legends.clear()
        legend = next((ax.get_legend() for ax in reversed(fig.axes) if ax.get_legend()), None)
        if legend is not None:
            handles, labels = legend.legend_handles, [t.get_text() for t in legend.get_texts()]
            legend.remove()
            fig.fig.legend(handles, labels, loc="lower center", ncol=8, fontsize=8, frameon=False)
        fig.axes[-1].set_xlabel("time in step (ms)")
        for ax in fig.axes:
            if longest:
                ax.set_xlim(0, longest * 1.02)
            ax.xaxis.set_tick_params(labelbottom=True)
        fig.show()


# ----------------------------------------------------------------------------- memory arithmetic


def model_state_bytes(psi: float, n: int, stage: int, k: float = 12, param_bytes: float = 2,
                      grad_bytes: float = 2) -> dict:
    """Per-rank bytes of parameters, gradients and optimizer state (ZeRO paper, Figure 1).

    ``stage`` 0 is plain data parallelism (everything replicated); stage 1 shards the
    optimizer state over ``n`` ranks, stage 2 also the gradients, stage 3 also the
    parameters.  With mixed-precision Adam (2 + 2 + K, K = 12): DDP 16 Psi, ZeRO-1
    4 Psi + 12 Psi/N, ZeRO-2 2 Psi + 14 Psi/N, ZeRO-3 16 Psi/N.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
    if n < 1:
        raise ValueError(f"N must be at least 1, got {n!r}")
    params = param_bytes * psi / (n if stage >= 3 else 1)
    grads = grad_bytes * psi / (n if stage >= 2 else 1)
    optimizer = k * psi / (n if stage >= 1 else 1)
    return {"params_bytes": params, "grads_bytes": grads, "optimizer_bytes": optimizer,
            "total_bytes": params + grads + optimizer}


def comm_volume_elements(psi: float, stage: int) -> float:
    """Elements each rank sends and receives per step: 2 Psi for DDP and stages 1-2, 3 Psi for stage 3."""
    return (3 if stage == 3 else 2) * psi


# Sizes people train (GPT-2, LLaMA-style, the ZeRO paper's 7.5B, GPT-3), in billions of parameters.
MODEL_SIZES_BILLION = [0.125, 0.35, 0.76, 1, 1.5, 2.7, 3, 6.7, 7, 7.5, 13, 20, 30, 40, 65, 70, 100, 175, 530, 1000]


class MemoryCalculator(Panel):
    """Sliders for model size, N, ZeRO stage and K; bars of per-rank model states for every stage.

    Pure arithmetic (:func:`model_state_bytes`), no simulation: it is the back-of-the-envelope
    the ZeRO paper teaches, and what the simulator's ``memory`` metrics must agree with.
    """

    def __init__(self, params_billion: float = 1.5, gpus: int = 8, stage: int = 0, k: int = 12,
                 gpu: str = "A100-80GB", figsize=(9, 3.6), auto: bool = True):
        from zero_sim.system.hardware import GPUS

        super().__init__()
        self.controls = {
            # Common model sizes, not a log scale: a log slider would round 1.5 to 1.51 in the browser.
            "params_billion": W.SelectionSlider(options=_with_stop(MODEL_SIZES_BILLION, params_billion),
                                                value=params_billion, description="model size (billions)",
                                                style=_STYLE, layout=_wide()),
            "gpus": W.SelectionSlider(options=_with_stop([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], gpus),
                                      value=gpus, description="GPUs (N)", style=_STYLE, layout=_wide()),
            "stage": W.ToggleButtons(options=[(name, i) for i, name in enumerate(STAGE_NAMES)], value=stage,
                                     description="who shards what", style={"description_width": "11em",
                                                                           "button_width": "7em"}),
            "k": W.IntSlider(value=k, min=0, max=16, description="K (optimizer bytes)", style=_STYLE, layout=_wide()),
            "gpu": W.Dropdown(options=[g for g in GPUS if g != "CPU"], value=gpu, description="GPU", style=_STYLE),
        }
        self.summary = W.HTML()
        self.summary.add_class("zs-memory-summary")
        self.figure = _Figure(figsize)
        self.figure.fig.subplots_adjust(left=0.1, right=0.98, top=0.88, bottom=0.14)
        self.widget = W.VBox([W.HBox([W.VBox([self.controls["params_billion"], self.controls["gpus"],
                                              self.controls["k"]]),
                                      W.VBox([self.controls["gpu"]])]),
                              self.controls["stage"], self.summary, self.figure.widget])
        self._watch()
        if auto:
            self.update()

    def update(self, *_):
        from zero_sim.system.hardware import GPUS

        c = self.controls
        psi = c["params_billion"].value * 1e9
        n, stage, k = c["gpus"].value, c["stage"].value, c["k"].value
        capacity = GPUS[c["gpu"].value].hbm_bytes
        per_stage = [model_state_bytes(psi, n, s, k) for s in range(4)]
        chosen = per_stage[stage]
        self.result = chosen | {
            "params": psi, "gpus": n, "stage": stage, "k": k, "capacity_bytes": capacity,
            "fits": chosen["total_bytes"] <= capacity,
            "comm_volume_elements": comm_volume_elements(psi, stage),
            "comm_volume_bytes": comm_volume_elements(psi, stage) * 2,
            "all_stages": per_stage,
        }
        self.error = None
        self.render()
        return self.result

    def render(self):
        r = self.result
        name = STAGE_NAMES[r["stage"]]
        fits = ("<span style='color:#2e7d32'><b>fits</b></span>" if r["fits"] else
                "<span style='color:#c62828'><b>does not fit</b></span>")
        vol = "3&Psi;" if r["stage"] == 3 else "2&Psi;"
        self.summary.value = (
            f"<div style='line-height:1.6'>With <b>{name}</b>, each of the {r['gpus']} GPUs holds "
            f"<b>{_gb(r['params_bytes'])}</b> of parameters + <b>{_gb(r['grads_bytes'])}</b> of gradients + "
            f"<b>{_gb(r['optimizer_bytes'])}</b> of optimizer state = <b>{_gb(r['total_bytes'])}</b> "
            f"of model states, which {fits} in a {self.controls['gpu'].value} "
            f"({_gb(r['capacity_bytes'])}) before a single activation is stored.<br>"
            f"Each GPU sends and receives about {vol} = {r['comm_volume_bytes'] / GB:.1f} GB per step "
            f"(bf16 gradients{'' if r['stage'] < 3 else ' and parameters'}).</div>")
        fig = self.figure
        fig.clear()
        ax = fig.axes[0]
        xs = range(4)
        bottoms = [0.0] * 4
        from zero_sim.ui.plots import MEMORY_COLORS

        for key, cat in (("params_bytes", "params"), ("grads_bytes", "grads"), ("optimizer_bytes", "optimizer")):
            heights = [s[key] / GB for s in r["all_stages"]]
            ax.bar(xs, heights, bottom=bottoms, color=MEMORY_COLORS[cat], label=cat,
                   edgecolor=["black" if i == r["stage"] else "none" for i in xs],
                   linewidth=[2 if i == r["stage"] else 0 for i in xs])
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        for i, total in enumerate(bottoms):
            ax.text(i, total, f"{total:.3g} GB", ha="center", va="bottom", fontsize=9,
                    fontweight="bold" if i == r["stage"] else "normal")
        ax.axhline(r["capacity_bytes"] / GB, color="black", linestyle="--", linewidth=1,
                   label=f"{self.controls['gpu'].value} memory")
        ax.set_xticks(list(xs), STAGE_NAMES)
        ax.set_ylabel("GB per GPU")
        ax.set_ylim(0, max(max(bottoms), r["capacity_bytes"] / GB) * 1.18)
        ax.set_title(f"model states per GPU: {r['params'] / 1e9:.3g}B parameters, N = {r['gpus']}, K = {r['k']}",
                     fontsize=10)
        ax.legend(fontsize=8, loc="upper right", frameon=False)
        fig.show()


# ----------------------------------------------------------------------------- sweeps


def progress_bar(total: int, description: str = "simulating") -> W.IntProgress:
    bar = W.IntProgress(value=0, min=0, max=max(total, 1), description=description, style=_STYLE)
    bar.add_class("zs-progress")
    if _in_kernel():
        from IPython.display import display

        display(bar)
    return bar


def sweep(scenarios: Iterable[Mapping[str, Any]], progress: bool | W.IntProgress = True,
          description: str = "simulating"):
    """Simulate each scenario (a dict of ``simulate()`` keywords) into one pandas frame.

    Each row holds the scenario's keywords, then :func:`summary_row`'s metrics; a refused
    scenario gets its sentence in ``error`` instead of metrics.  ``progress`` shows an
    ``IntProgress`` bar (or advances the one given).
    """
    import pandas as pd

    scenarios = [dict(s) for s in scenarios]
    bar = progress if isinstance(progress, W.IntProgress) else (
        progress_bar(len(scenarios), description) if progress else None)
    rows = []
    for s in scenarios:
        try:
            row = dict(s) | summary_row(simulate(**s)) | {"error": None}
        except (ScenarioError, ValueError) as exc:
            row = dict(s) | {"error": str(exc)}
        rows.append(row)
        if bar is not None:
            bar.value += 1
    if bar is not None:
        bar.bar_style = "success"
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- nccl-tests


def predicted_collective_s(sizes: Iterable[float], topology: str, gpus: int, kind: str = "all_reduce",
                           gpus_per_node: int | None = None, bandwidth_gbps: float | None = None,
                           backend: str = "nccl") -> list[float]:
    """Seconds the simulator's network model gives one isolated collective over every rank, per size.

    What nccl-tests measures (one collective, nothing else running), so the two can be
    laid side by side.
    """
    from zero_sim.system.collectives import CollectiveModel
    from zero_sim.system.topology import build_topology

    topo = build_topology(topology, gpus, gpus_per_node)
    if bandwidth_gbps is not None:
        topo = topo.with_bandwidth(bandwidth_gbps)
    model = CollectiveModel(topo, backend)
    members = (tuple(range(gpus)),)
    return [model.plan(kind, float(size), members).isolated_time(topo) for size in sizes]


class NcclFitPanel(Panel):
    """Paste nccl-tests output, press fit: latency + bus bandwidth, and the fit against each row."""

    def __init__(self, tables: Mapping[str, str], collective: str = "all_reduce", figsize=(10, 3.4),
                 auto: bool = True):
        super().__init__()
        self.examples = dict(tables)
        first = next(iter(self.examples.values()), "")
        self.controls = {
            "example": W.Dropdown(options=list(self.examples) + ["(my own)"], description="table",
                                  style=_STYLE),
            "text": W.Textarea(value=first, layout=W.Layout(width="95%", height="12em"),
                               placeholder="paste all_reduce_perf output here"),
            "collective": W.Dropdown(options=["all_reduce", "reduce_scatter", "all_gather"], value=collective,
                                     description="collective", style=_STYLE),
        }
        self.button = W.Button(description="fit", icon="line-chart", button_style="primary")
        self.button.on_click(lambda _: self.update())
        self.summary = W.HTML()
        self.summary.add_class("zs-metrics")
        self.figure = _Figure(figsize)
        self.figure.fig.subplots_adjust(left=0.1, right=0.98, top=0.88, bottom=0.16)
        self.widget = W.VBox([W.HBox([self.controls["example"], self.controls["collective"], self.button]),
                              self.controls["text"], self.summary, self.figure.widget])
        self.controls["example"].observe(self._pick, names="value")
        self.controls["collective"].observe(lambda _: self.update(), names="value")
        if auto:
            self.update()

    def _pick(self, change):
        if change["new"] in self.examples:
            self.controls["text"].value = self.examples[change["new"]]
            self.update()

    def update(self, *_):
        from zero_sim.system.collectives import CollectiveError, fit_nccl_tests, parse_nccl_tests

        try:
            table = parse_nccl_tests(self.controls["text"].value, self.controls["collective"].value)
            fit = fit_nccl_tests(table)
            self.result, self.error = {"table": table, "fit": fit}, None
        except (CollectiveError, ValueError) as exc:
            self.result, self.error = None, str(exc)
        self.render()
        return self.result

    def frame(self):
        import pandas as pd

        table, fit = self.result["table"], self.result["fit"]
        return pd.DataFrame([{"size_MB": r.size_bytes / 2**20, "measured_us": r.time_us,
                              "fitted_us": fit.time(r.size_bytes) * 1e6, "busbw_GBps": r.busbw_gbps,
                              "error": fit.time(r.size_bytes) * 1e6 / r.time_us - 1} for r in table.rows])

    def render(self):
        fig = self.figure
        if self.error:
            self.summary.value = error_html(self.error)
            fig.message(self.error)
            return
        table, fit = self.result["table"], self.result["fit"]
        self.summary.value = (f"{table.n_ranks} ranks · latency <b>{fit.latency_s * 1e6:.1f} us</b> · "
                              f"bus bandwidth <b>{fit.busbw / 1e9:.2f} GB/s</b> "
                              f"(= {fit.busbw * 8 / 1e9:.0f} Gbit/s) · worst error {fit.max_rel_error:.1%}")
        fig.clear()
        fig.restore_axes()
        ax = fig.axes[0]
        sizes = [r.size_bytes for r in table.rows]
        ax.plot([s / 2**20 for s in sizes], [r.busbw_gbps for r in table.rows], "o", label="measured busbw")
        import numpy as np

        grid = np.geomspace(min(sizes), max(sizes), 60)
        fitted = [fit.factor * s / fit.time(s) / 1e9 for s in grid]
        ax.plot(grid / 2**20, fitted, "-", label=f"fit: {fit.latency_s * 1e6:.0f} us + size / {fit.busbw / 1e9:.1f} GB/s")
        ax.set_xscale("log")
        ax.set_xlabel("message size (MiB)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_ylim(0, max(r.busbw_gbps for r in table.rows) * 1.2)
        ax.set_title("small messages never reach the link's bandwidth: the fixed latency dominates", fontsize=10)
        ax.legend(fontsize=8, frameon=False, loc="lower right")
        fig.show()


# ----------------------------------------------------------------------------- planner


# Knobs the planner leaves at their defaults: they change number formats, not the schedule.
PLANNER_SKIPS = ("param_dtype", "reduce_dtype")


def candidates(strategies: Iterable[str] | None = None,
               recompute: Iterable[str] = ("none", "selective", "full"),
               skip: Iterable[str] = PLANNER_SKIPS) -> list[dict]:
    """Settings worth trying: every strategy at its defaults, and each knob varied one at a time.

    Variations come from the knobs themselves (booleans flipped, every other choice of a
    multiple-choice knob), so a new strategy's knobs are explored without changes here.
    Each is tried under every activation-recompute mode in ``recompute``.
    """
    out = []
    for name in strategies or STRATEGIES:
        strategy = get_strategy(name)
        variants: list[dict] = [{}]
        for knob in strategy.knobs:
            if knob.name in skip:
                continue
            if knob.kind is bool:
                variants.append({knob.name: not knob.default})
            elif knob.choices:
                variants.extend({knob.name: c} for c in knob.choices if c != knob.default)
        for variant in variants:
            for mode in recompute:
                out.append({"strategy": name, **variant, "recompute": mode})
    return out


def _knobs_label(row: Mapping[str, Any]) -> str:
    owners = all_knobs()
    parts = [f"{k}={v}" for k, v in row.items() if k in owners and v is not None and not _isnan(v)]
    return ", ".join(parts) or "defaults"


def _isnan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def plan(model: str = "gpt2-1.5b", gpus: int = 8, topology: str = "dgx-a100", gpu: str | None = None,
         micro_batch: int = 4, strategies: Iterable[str] | None = None,
         recompute: Iterable[str] = ("none", "selective", "full"), progress: bool | W.IntProgress = True,
         **extra):
    """Simulate every candidate for one model on one cluster; fastest that fits first."""
    base = {"model": model, "gpus": gpus, "topology": topology, "micro_batch": micro_batch, **extra}
    if gpu:
        base["gpu"] = gpu
    scenarios = [base | c for c in candidates(strategies, recompute)]
    df = sweep(scenarios, progress=progress, description="planning")
    df.insert(1, "knobs", [_knobs_label(r) for r in df.to_dict("records")])
    if "fits" not in df:
        df["fits"] = False
    df["fits"] = df["fits"].fillna(False).astype(bool)
    df = df.sort_values(["fits", "tokens_per_s"], ascending=[False, False], na_position="last")
    df.index = range(1, len(df) + 1)
    df.index.name = "rank"
    return df


class Planner(Panel):
    """Pick a model, GPUs and a topology; press plan: a ranked table and a chart of the candidates."""

    def __init__(self, model: str = "gpt2-1.5b", gpus: int = 8, topology: str = "dgx-a100",
                 micro_batch: int = 4, recompute: Iterable[str] = ("none", "selective", "full"),
                 figsize=(10, 4), auto: bool = True, top: int = 12):
        super().__init__()
        self.recompute = tuple(recompute)
        self.top = top
        self.controls = {name: setting_control(name, value) for name, value in
                         (("model", model), ("gpus", gpus), ("topology", topology),
                          ("gpu", None), ("micro_batch", micro_batch))}
        self.button = W.Button(description="plan", icon="search", button_style="primary")
        self.button.on_click(lambda _: self.update())
        self.progress = W.IntProgress(value=0, min=0, max=1, description="candidates", style=_STYLE)
        self.progress.add_class("zs-progress")
        self.summary = W.HTML()
        self.summary.add_class("zs-metrics")
        self.table = W.Output()
        self.figure = _Figure(figsize)
        self.figure.fig.subplots_adjust(left=0.1, right=0.75, top=0.9, bottom=0.13)
        c = self.controls
        self.widget = W.VBox([
            W.HBox([W.VBox([c["model"], c["topology"], c["gpu"]]), W.VBox([c["gpus"], c["micro_batch"]])]),
            W.HBox([self.button, self.progress]), self.summary, self.figure.widget, self.table])
        if auto:
            self.update()

    def settings(self) -> dict:
        return {name: read_control(w, kind_of(name)) for name, w in self.controls.items()}

    def update(self, *_):
        s = self.settings()
        n = len(candidates(None, self.recompute))
        self.progress.max, self.progress.value, self.progress.bar_style = n, 0, ""
        self.result = plan(**s, recompute=self.recompute, progress=self.progress)
        ok = self.result[self.result["error"].isna()]
        self.error = None if len(ok) else "no candidate could be simulated: " + str(self.result["error"].iloc[0])
        self.render()
        return self.result

    def best(self):
        """The fastest candidate that fits, as a row (None when nothing fits)."""
        df = self.result
        fitting = df[df["fits"]]
        return None if fitting.empty else fitting.iloc[0]

    def render(self):
        df, s = self.result, self.settings()
        best = self.best()
        if self.error:
            self.summary.value = error_html(self.error)
        elif best is None:
            least = df.dropna(subset=["peak_GB"]).sort_values("peak_GB").iloc[0]
            self.summary.value = (f"<b>nothing fits</b>: the leanest candidate ({least['strategy']}, "
                                  f"{least['knobs']}, recompute {least['recompute']}) still needs "
                                  f"{least['peak_GB']:.1f} GB of {least['capacity_GB']:.1f} GB. "
                                  f"Try more GPUs, a smaller micro-batch, or a bigger GPU.")
        else:
            n_fit = int(df["fits"].sum())
            self.summary.value = (f"{n_fit} of {len(df)} candidates fit. Fastest that fits: "
                                  f"<b>{best['strategy']}</b> ({best['knobs']}, recompute {best['recompute']}): "
                                  f"step {best['step_ms']:.1f} ms, {best['tokens_per_s']:,.0f} tokens/s, "
                                  f"peak {best['peak_GB']:.1f} of {best['capacity_GB']:.1f} GB")
        cols = ["strategy", "knobs", "recompute", "fits", "step_ms", "exposed_comm_ms", "tokens_per_s",
                "tflops_per_gpu", "peak_GB", "model_states_GB", "activations_GB", "error"]
        shown = df[[c for c in cols if c in df]].head(self.top)
        if _in_kernel():
            from IPython.display import display

            self.table.clear_output(wait=True)
            with self.table:
                display(shown.round(2))
        fig = self.figure
        fig.clear()
        ax = fig.axes[0]
        from zero_sim.ui.plots import COLORS

        palette = list(COLORS.values())
        ok = df.dropna(subset=["step_ms"])
        for i, (name, group) in enumerate(ok.groupby("strategy", sort=False)):
            color = palette[i % len(palette)]
            fit = group[group["fits"]]
            nofit = group[~group["fits"]]
            if len(fit):
                ax.scatter(fit["peak_GB"], fit["step_ms"], color=color, label=f"{name} (fits)", s=30)
            if len(nofit):
                ax.scatter(nofit["peak_GB"], nofit["step_ms"], facecolors="none", edgecolors=color,
                           label=f"{name} (does not fit)", s=30)
        if len(ok):
            ax.axvline(ok["capacity_GB"].iloc[0], color="black", linestyle="--", linewidth=1, label="GPU memory")
        if best is not None:
            ax.annotate("fastest that fits", (best["peak_GB"], best["step_ms"]), xytext=(10, 10),
                        textcoords="offset points", fontsize=8, arrowprops={"arrowstyle": "->"})
        ax.set_xlabel("peak memory per GPU (GB)")
        ax.set_ylabel("step time (ms)")
        ax.set_title(f"{s['model']} on {s['gpus']} GPUs, {s['topology']}: every candidate", fontsize=10)
        ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.show()


# ----------------------------------------------------------------------------- real runs


def load_real_run(run_dir: str | Path) -> dict | None:
    """A finished real run (``run.json`` plus ``rank0.json``) from ``real_runs.train``, or None."""
    import json

    run_dir = Path(run_dir)
    run_file, rank_file = run_dir / "run.json", run_dir / "rank0.json"
    if not (run_file.is_file() and rank_file.is_file()):
        return None
    run = json.loads(run_file.read_text())
    run["rank0"] = json.loads(rank_file.read_text())
    return run


def plot_real_step(run: Mapping[str, Any], ax=None, step: int | None = None, title: str | None = None):
    """Gantt of rank 0's streams for one measured step (the last by default), times from its start."""
    import matplotlib.pyplot as plt

    from zero_sim.ui.plots import op_color

    ops = [op for op in run["rank0"]["ops"] if op.get("end_s") is not None]
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 1.6))
    if not ops:
        ax.text(0.5, 0.5, "this run recorded no ops", ha="center", transform=ax.transAxes)
        return ax
    step = max(op["step"] for op in ops) if step is None else step
    ops = [op for op in ops if op["step"] == step]
    t0 = min(op["start_s"] for op in ops)
    order = {"host": 0, "compute": 1}
    streams = sorted({op["stream"] for op in ops}, key=lambda s: (order.get(s, 2), s))
    for y, stream in enumerate(streams):
        mine = [op for op in ops if op["stream"] == stream]
        ax.broken_barh([((op["start_s"] - t0) * 1e3, (op["end_s"] - op["start_s"]) * 1e3) for op in mine],
                       (y - 0.4, 0.8), facecolors=[op_color(op["name"]) for op in mine],
                       edgecolor="white", linewidth=0.2)
    ax.set_yticks(range(len(streams)), [f"rank 0 {s}" for s in streams])
    ax.invert_yaxis()
    ax.set_xlabel("time in step (ms), measured")
    ax.set_title(title or f"measured: {run.get('strategy')} on {run.get('world_size')} ranks "
                          f"({run.get('backend')}), step {step}", fontsize=9)
    return ax


__all__ = [
    "ComparePanel", "MemoryCalculator", "NcclFitPanel", "Panel", "Planner", "ScenarioPanel", "TimelineExplorer",
    "bottleneck_gbps", "candidates", "comm_volume_elements", "load_real_run", "make_control", "metrics_text",
    "model_state_bytes", "plan", "plot_real_step", "predicted_collective_s", "progress_bar", "read_control",
    "set_control",
    "setting_control", "summary_row", "sweep", "MEMORY_CATEGORIES",
]
