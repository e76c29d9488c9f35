"""Many simulations into one pandas table: one row per scenario, its settings then its headline metrics.

The notebooks compare scenarios by the dozen (bucket sizes, bandwidths, N, strategies);
:func:`sweep` runs each through ``simulate()`` and flattens the metrics with
:func:`summary_row` into milliseconds and decimal gigabytes, the units the suite reports.
A scenario the simulator refuses still gets its row, with the one-sentence reason in
``error``, so one bad corner of a grid does not lose the rest.

Progress is optional: ``progress=True`` shows a ``tqdm`` bar (a text bar in a terminal, a
widget in JupyterLab, through ``tqdm.auto``), a callback gets ``progress(done, total)``, and a
bar the caller made (anything with ``update``, such as a ``tqdm``) is advanced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

import pandas as pd

from zero_sim.plan.executors import map_on
from zero_sim.scenario import ScenarioError, simulate
from zero_sim.system.gpus import GB

# How a sweep reports each finished scenario: None or False, silently; True, on a tqdm bar of its
# own; a callable, by calling it with (done, total); anything else is a bar whose update(1) it calls.
Progress = Any


def summary_row(result) -> dict:
    """One flat row of a result's headline metrics, in ms and GB (for tables and charts)."""
    m = result.metrics
    mem = m["memory"]
    ov = m["comm_overlap_fraction"]
    band = m.get("tokens_per_s_interval") or (None, None)
    step_band = m.get("step_time_s_interval") or (None, None)
    return {
        "params": m["params"],
        "stack": m.get("stack"),
        "step_ms": m["step_time_s"] * 1e3,
        "step_ms_low": step_band[0] * 1e3 if step_band[0] is not None else None,  # the 80% interval
        "step_ms_high": step_band[1] * 1e3 if step_band[1] is not None else None,
        "compute_ms": m["compute_time_s"] * 1e3,
        "exposed_comm_ms": m["exposed_comm_s"] * 1e3,
        "overlap": ov,
        "forward_ms": m["phases"]["forward_s"] * 1e3,
        "backward_ms": m["phases"]["backward_s"] * 1e3,
        "optimizer_ms": m["phases"]["optimizer_s"] * 1e3,
        "optimizer_wait_ms": m["phases"]["optimizer_wait_s"] * 1e3,
        "optimizer_update_ms": m["phases"]["optimizer_update_s"] * 1e3,
        "tflops_per_gpu": m["tflops_per_gpu"],
        "tokens_per_s": m["tokens_per_s"],
        "tokens_per_s_low": band[0],  # the 80% interval (zero_sim.intervals.speed); None where none applies
        "tokens_per_s_high": band[1],
        "mfu": m.get("mfu"),
        "comm_GB": m["comm_volume_bytes"] / GB,
        "collectives": m.get("collectives_per_step"),
        "model_states_GB": mem["model_states_bytes"] / GB,
        "activations_GB": mem["activations_bytes"] / GB,
        "buffers_GB": mem["buffers_bytes"] / GB,
        "peak_GB": mem["peak_bytes"] / GB,  # the tensors' peak (torch.cuda.max_memory_allocated)
        "reserved_GB": mem["reserved_peak_bytes"] / GB,  # what must fit: the one definition of "fits"
        "capacity_GB": mem["capacity_bytes"] / GB,
        "spare_GB": (mem["capacity_bytes"] - mem["reserved_peak_bytes"]) / GB,  # the margin
        "reserved_high_GB": mem["reserved_interval_bytes"][1] / GB,  # the 80% interval's top
        "fit_verdict": mem["fit_verdict"],  # fits, tight or does_not_fit (zero_sim.intervals.memory)
        "fits": mem["fits"],
    }


def simulate_row(scenario: Mapping[str, Any], interval: bool | str = True) -> dict:
    """One scenario's row: its keywords, then its figures or the sentence that refused it; its 80%
    interval's columns are None without ``interval``, and with ``interval="later"`` the row keeps
    what computes them in ``later_interval`` (:func:`zero_sim.intervals.speed.later_columns`).
    A top-level function, so that a process pool or a Dask worker can run it."""
    s = dict(scenario)
    try:
        result = simulate(**s, interval=interval)
    except (ScenarioError, ValueError) as exc:
        return s | {"error": str(exc)}
    later = {"later_interval": result.later_interval} if interval == "later" else {}
    return s | summary_row(result) | {"error": None} | later


def sweep(scenarios: Iterable[Mapping[str, Any]], progress: Progress = None,
          description: str = "simulating", executor: Any = None) -> pd.DataFrame:
    """Simulate each scenario (a dict of ``simulate()`` keywords) into one pandas frame.

    Each row holds the scenario's keywords, then :func:`summary_row`'s metrics; a refused
    scenario gets its sentence in ``error`` instead of metrics.  ``progress`` says how to
    report each finished scenario (see :data:`Progress`); ``description`` labels its own bar.
    ``executor`` (a :class:`concurrent.futures.Executor`, :mod:`zero_sim.plan.executors`) runs them
    elsewhere; rows keep the scenarios' order.
    """
    scenarios = [dict(s) for s in scenarios]
    return pd.DataFrame(run_rows(scenarios, progress, description, executor))


def run_rows(scenarios: list[dict], progress: Progress = None, description: str = "simulating",
             executor: Any = None, interval: bool | str = True) -> list[dict]:
    """:func:`simulate_row` of each scenario, here or on ``executor``, reporting progress."""
    own_bar = progress is True
    if own_bar:
        from tqdm.auto import tqdm

        progress = tqdm(total=len(scenarios), desc=description, unit="scenario")
    elif progress is False:
        progress = None
    # One scenario per message while there are few: a handful of long simulations split evenly.
    results = map_on(executor, partial(simulate_row, interval=interval), scenarios,
                     chunksize=1 if len(scenarios) < 64 else 4)
    rows = []
    for done, row in enumerate(results, start=1):
        rows.append(row)
        if callable(progress):
            progress(done, len(scenarios))
        elif progress is not None:
            progress.update(1)
    if own_bar:
        progress.close()
    return rows


__all__ = ["Progress", "run_rows", "simulate_row", "summary_row", "sweep"]
