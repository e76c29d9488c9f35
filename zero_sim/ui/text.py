"""The words every panel shows: the headline numbers, the optimizer phase split, and a refusal.

Written here once, as plain text (:func:`metrics_text`, what tests and tables read) and as
HTML (:func:`metrics_html`, the panels' headline), so a number is named the same way
everywhere.  The optimizer phase is always shown split in two (:func:`optimizer_text`):
time the compute stream idles waiting for the last gradient communication, and the
update's own compute; one total hides which of the two a strategy changes.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any

from zero_sim.intervals.speed import widest_inputs
from zero_sim.system.gpus import GB


def format_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def format_gb(nbytes: float) -> str:
    return f"{nbytes / GB:.2f} GB"


def _fit_text(mem: Mapping[str, Any]) -> str:
    return "fits" if mem["fits"] else f"does NOT fit (short by {format_gb(mem['shortfall_bytes'])})"


def optimizer_text(phases: Mapping[str, float], digits: int = 2) -> str:
    """"optimizer: 72.00 ms waiting for communication + 2.00 ms update" (the phase split in two)."""
    wait = phases.get("optimizer_wait_s")
    update = phases.get("optimizer_update_s")
    if wait is None or update is None:  # metrics written before the split: the total alone
        return f"optimizer: {phases['optimizer_s'] * 1e3:.{digits}f} ms"
    return (f"optimizer: {wait * 1e3:.{digits}f} ms waiting for communication + "
            f"{update * 1e3:.{digits}f} ms update")


def metrics_text(m: Mapping[str, Any]) -> str:
    """The headline numbers as one line of plain text (what the panels show, and tests read)."""
    mem = m["memory"]
    ov = m["comm_overlap_fraction"]
    overlap = "n/a" if ov is None else f"{ov:.0%}"
    return (f"step time {format_ms(m['step_time_s'])} · compute {format_ms(m['compute_time_s'])} · "
            f"exposed comm {format_ms(m['exposed_comm_s'])} · overlap {overlap} · "
            f"{optimizer_text(m['phases'])} · "
            f"{m['tflops_per_gpu']:.1f} TFLOP/s per GPU{_likely(m)} · "
            f"memory {_memory(mem)}, {_fit_text(mem)} · stack {m.get('stack', '?')}")


def _memory(mem: Mapping[str, Any]) -> str:
    """What "fits" compares, the reserved figure against capacity, with the tensors' peak beside."""
    return (f"{format_gb(mem['reserved_peak_bytes'])} reserved of {format_gb(mem['capacity_bytes'])} "
            f"(peak memory of tensors {format_gb(mem['peak_bytes'])})")


def _likely(m: Mapping[str, Any]) -> str:
    """The 80% interval of throughput per GPU, where one applies (zero_sim.intervals.speed)."""
    band = m.get("tokens_per_s_per_gpu_interval")
    return f" · likely {band[0]:,.0f}-{band[1]:,.0f} tokens/s per GPU (80%{_why(m)})" if band else ""


def _why(m: Mapping[str, Any]) -> str:
    """What widens the interval most, and the features no fit has seen (zero_sim.intervals.speed)."""
    how = m.get("prediction_interval") or {}
    unfitted = [u["feature"] for u in how.get("unfitted", [])]
    return (f"; most from {widest_inputs(how)}" if how.get("shares") else "") + \
        (f"; wider: {', '.join(unfitted)} never fitted" if unfitted else "")


def metrics_html(m: Mapping[str, Any]) -> str:
    """The headline numbers as one line of HTML, the verdict on memory in green or red."""
    mem = m["memory"]
    ov = m["comm_overlap_fraction"]
    fit_color = "#2e7d32" if mem["fits"] else "#c62828"
    name, _, value = optimizer_text(m["phases"]).partition(": ")
    cells = [
        ("step time", format_ms(m["step_time_s"])),
        ("compute", format_ms(m["compute_time_s"])),
        ("exposed comm", format_ms(m["exposed_comm_s"])),
        ("overlap", "n/a" if ov is None else f"{ov:.0%}"),
        (name, value),
        ("TFLOP/s per GPU", f"{m['tflops_per_gpu']:.1f}"),
        ("memory", _memory(mem)),
        ("stack", str(m.get("stack", "?"))),
    ]
    if band := m.get("tokens_per_s_per_gpu_interval"):
        cells.insert(6, ("likely tokens/s per GPU", f"{band[0]:,.0f}-{band[1]:,.0f} (80% interval{_why(m)})"))
    items = "".join(f"<span style='margin-right:1.4em'><b class='zs-metric-name'>{k}</b> "
                    f"<span class='zs-metric-value'>{html.escape(v)}</span></span>" for k, v in cells)
    return (f"<div style='font-size:1.05em;line-height:1.6'>{items}"
            f"<span style='color:{fit_color};font-weight:bold'>{_fit_text(mem)}</span></div>")


def without_flags(sentence: str) -> str:
    """A sentence written for the command line, in the notebook's words: ``--gpus-per-node`` is the
    ``gpus_per_node`` setting that panels and ``simulate()`` name."""
    return re.sub(r"--([a-z][a-z0-9-]*)", lambda m: m.group(1).replace("-", "_"), sentence)


def error_html(sentence: str) -> str:
    """A refusal, in red where the headline numbers were (the one place it is shown)."""
    return (f"<div class='zs-refusal' style='color:#b71c1c;background:#fdecea;padding:4px 8px;"
            f"border-radius:4px'><b>cannot simulate this:</b> {html.escape(sentence)}</div>")


__all__ = ["error_html", "format_gb", "format_ms", "metrics_html", "metrics_text", "optimizer_text",
           "without_flags"]
