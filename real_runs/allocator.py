"""Which malloc a CPU rank runs on, and why it has to behave like a caching allocator.

A GPU's caching allocator keeps every block it has handed out and hands it out again, so
once the first step has run a training step's buffers cost nothing to allocate; the
simulator assumes exactly that and has no term for allocation.  On a CPU a rank's tensors
come from ``malloc``, and glibc's differs from a caching allocator in two ways that show up
as compute time no calibration measures:

* **freed buffers go back to the OS.**  Above its mmap threshold glibc unmaps a freed
  buffer, and the next step faults the same pages in again.  :data:`KEEP_FREED_MEMORY`
  raises the threshold and stops heap trimming, so freed memory stays with the rank.
* **its heap fragments.**  With the strategies that launch one collective per parameter
  the heap keeps growing a little every step, so a step's large temporaries keep landing
  on fresh heap, each fresh 4 KiB page a fault on first touch: the loss gradient (tokens x
  vocabulary) is zero-filled on fresh pages every step, and the head's backward runs far
  slower than in the per-layer calibration.  Which allocations split the holes is not
  known; not freeing the gradient buffers did not stop it.

jemalloc keeps small and large size classes apart, so small allocations never split a
large hole, and with page purging turned off (:data:`JEMALLOC_CONF`) it reuses freed pages
as a caching allocator does.  PyTorch's own CPU launcher (``torch.backends.xeon.run_cpu``)
preloads it (or TCMalloc) for much the same reasons.  Where ``libjemalloc.so.2`` is
installed (``make`` installs Debian's ``libjemalloc2`` when it can, ``environment.yml``
conda-forge's ``jemalloc``) every rank starts on it; elsewhere
ranks run on glibc with :data:`KEEP_FREED_MEMORY`, and the per-parameter strategies' steps
run a little longer than the simulator predicts.  Each run records which one it ran on
(``versions.allocator`` in ``run.json``).  Recorded memory does not depend on it: it is
counted per tensor, not from the process's resident size.
"""

from __future__ import annotations

import ctypes.util
import os
from collections.abc import Mapping
from pathlib import Path

JEMALLOC = "libjemalloc.so.2"

# glibc: keep what is freed (no unmapping of large buffers, no trimming of the heap).
KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str((1 << 32) - 1)}

# jemalloc: never purge freed pages (-1 disables decay), so a freed buffer's pages are
# reused by the next allocation of its size class instead of faulting in again.
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"


def jemalloc_library(environ: Mapping[str, str] = os.environ) -> str | None:
    """jemalloc's shared library: a conda environment's own (conda-forge's ``jemalloc``),
    else the one on the dynamic linker's search path (Debian's ``libjemalloc2``); None if
    neither is installed."""
    prefix = environ.get("CONDA_PREFIX")
    if prefix and (Path(prefix) / "lib" / JEMALLOC).is_file():
        return str(Path(prefix) / "lib" / JEMALLOC)
    return JEMALLOC if ctypes.util.find_library("jemalloc") else None


def ranks_allocator() -> str:
    """The allocator :func:`allocator_env` starts ranks on here: ``jemalloc`` or ``glibc``."""
    return "glibc" if jemalloc_library() is None else "jemalloc"


def allocator_env(environ: Mapping[str, str] = os.environ, library: str | None = ...) -> dict[str, str]:
    """The variables that start a rank on a caching-like allocator: jemalloc's ``library``
    preloaded (by default the installed one, :func:`jemalloc_library`; None: none), besides
    glibc's settings for whatever still runs on glibc.  A preload or jemalloc options already
    in ``environ`` are kept: ours come first and theirs after, so theirs win where they differ."""
    env = dict(KEEP_FREED_MEMORY)
    if library is ...:
        library = jemalloc_library(environ)
    if library is None:
        return env
    preload = [p for p in environ.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
    if not any(Path(p).name.startswith("libjemalloc") for p in preload):
        preload.insert(0, library)
    env["LD_PRELOAD"] = ":".join(preload)
    env["MALLOC_CONF"] = ",".join(c for c in (JEMALLOC_CONF, environ.get("MALLOC_CONF")) if c)
    return env


def allocator_in_use() -> str:
    """``jemalloc`` when this process runs on it, else ``glibc`` (``unknown`` where the
    process's memory map cannot be read)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "unknown"
    return "jemalloc" if "libjemalloc" in maps else "glibc"
