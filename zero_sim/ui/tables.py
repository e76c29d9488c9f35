"""Result tables a learner can read: a few columns, named in words with their units, numbers rounded.

A planner or sweep table carries thirty columns named for code (``tokens_per_s_low``); shown
whole, JupyterLab cuts it at the right and prints ``176417.971219``. :func:`readable` keeps the
columns asked for, in that order, renames them (``tokens/s``, ``step (ms)``), joins a likely
range into one column, writes large counts with thousands separators and shows a missing value
as what it means (``-``: nothing fits, no interval applies) instead of ``NaN``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

NAMES = {
    "step_ms": "step (ms)", "exposed_comm_ms": "exposed comm (ms)", "compute_ms": "compute (ms)",
    "tokens_per_s": "tokens/s", "tflops_per_gpu": "TFLOP/s per GPU", "mfu": "MFU",
    "reserved_GB": "reserved (GB)", "peak_GB": "peak (GB)", "capacity_GB": "GPU memory (GB)",
    "model_states_GB": "model states (GB)", "activations_GB": "activations (GB)",
    "buffers_GB": "buffers (GB)",
    "too_close_to_call": "within 5% of the best", "fastest_fitting": "fastest that fits (tokens/s)",
    "least_memory": "least reserved (GB)",
}
LIKELY = "likely tokens/s"  # tokens_per_s_low and _high, joined


def _cell(value, column: str) -> str | object:
    if value is None or isinstance(value, float) and math.isnan(value):
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if column == "mfu":
        return f"{value:.0%}"
    return f"{value:,.0f}" if abs(value) >= 1000 or column.startswith("tokens") else f"{value:,.1f}"


def readable(df: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``columns`` of ``df`` (a "likely" column where ``tokens_per_s_low/high`` are asked for), in words."""
    out = pd.DataFrame(index=df.index)
    for column in columns:
        if column == "tokens_per_s_low" and "tokens_per_s_high" in df:
            out[LIKELY] = [f"{_cell(lo, 'tokens')}-{_cell(hi, 'tokens')}" if lo == lo and hi == hi else "-"
                           for lo, hi in zip(df["tokens_per_s_low"], df["tokens_per_s_high"], strict=True)]
        elif column == "tokens_per_s_high" or column not in df:
            continue
        else:
            out[NAMES.get(column, column)] = [_cell(v, column) for v in df[column]]
    return out


__all__ = ["LIKELY", "NAMES", "readable"]
