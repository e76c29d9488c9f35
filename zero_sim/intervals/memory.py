"""How sure "it fits" is: an 80% interval on reserved memory, and a three-way verdict.

The estimate (``memory.reserved_peak_bytes``, :mod:`zero_sim.results`) is the tensors' peak with
the caching allocator's reserve and the CUDA context added.  What a run really reserves differs,
for reasons the estimate cannot see: how the allocator splits and caches blocks when sizes vary
from layer to layer and step to step, workspaces, the framework's own buffers.  The interval
says how far, from evidence:

* **the published memory points** (``zero_sim/published/points.toml``, the rows with
  ``metric = "peak_memory_gb"``; ``zero-sim validate --published``): for each, the published
  figure over the predicted one.  Their 10th and 90th percentiles, :data:`RATIO_LOW` and
  :data:`RATIO_HIGH`, bound the interval: ``[estimate * RATIO_LOW, estimate * RATIO_HIGH]``.
  The spread is lopsided: most points land within 10%, but the ZeRO-3 / ZeRO++ tutorial's
  reserved memory is 30-36% above the prediction (its allocated memory within 2%), so the
  caching allocator can hold a third more than the estimate's reserve.
  ``tests/test_memory_interval.py`` recomputes both percentiles from the points.
* **the allocator's floor**: the allocator never holds less than the tensors it hands out, so the
  low end is at least the tensors' peak plus the context (it binds when ``allocator_reserve`` is
  set low by hand).
* **fragmentation under varying sizes**: GMLake (Guo et al., ASPLOS 2024) measures PyTorch's
  caching allocator at up to 30% fragmentation (``1 - peak active / peak reserved``) when LLMs
  train with ZeRO-3 and recompute, where block sizes vary most.  The high end is at least what
  that worst case reserves, ``peak / (1 - 0.30) + context``.

The verdict (``memory.fit_verdict``): ``fits`` when the whole interval is within the GPU's
memory, ``does_not_fit`` when all of it is above (or the offloaded states do not fit in host
memory), ``tight`` when the interval crosses the capacity.  ``memory.fits`` stays the verdict
on the estimate alone.
"""

from __future__ import annotations

FITS, TIGHT, DOES_NOT_FIT = "fits", "tight", "does_not_fit"
# 10th and 90th percentiles of published / predicted reserved-or-allocated memory over the published
# memory points (module docstring; recomputed by tests/test_memory_interval.py).
RATIO_LOW = 0.92
RATIO_HIGH = 1.33
WORST_FRAGMENTATION = 0.30  # GMLake's highest measured fragmentation of PyTorch's caching allocator


def reserved_interval(reserved: float, peak: float, context: float) -> tuple[int, int]:
    """The 80% interval ``[low, high]`` of reserved memory around the estimate ``reserved``, given the
    tensors' ``peak`` and the ``context`` outside them (all bytes)."""
    low = max(reserved * RATIO_LOW, peak + context)
    high = max(reserved * RATIO_HIGH, peak / (1.0 - WORST_FRAGMENTATION) + context)
    return int(round(low)), int(round(high))


def fit_verdict(interval: tuple[int, int], capacity: float, host_fits: bool = True) -> str:
    """``fits``, ``tight`` or ``does_not_fit`` for an interval against ``capacity``."""
    low, high = interval
    if low > capacity or not host_fits:
        return DOES_NOT_FIT
    return FITS if high <= capacity else TIGHT


def with_interval(memory: dict) -> dict:
    """``memory`` (the ``memory`` metrics) with ``reserved_interval_bytes`` and ``fit_verdict``."""
    interval = reserved_interval(memory["reserved_peak_bytes"], memory["peak_bytes"], memory["context_bytes"])
    return memory | {"reserved_interval_bytes": list(interval),
                     "fit_verdict": fit_verdict(interval, memory["capacity_bytes"],
                                                memory.get("host_fits", True))}


def published_ratios(judged) -> list[float]:
    """Published over predicted memory for each judged memory point that was predicted."""
    return [j.point["value"] / j.predicted for j in judged
            if j.family == "memory" and j.predicted]


__all__ = ["DOES_NOT_FIT", "FITS", "RATIO_HIGH", "RATIO_LOW", "TIGHT", "fit_verdict", "published_ratios",
           "reserved_interval", "with_interval"]
