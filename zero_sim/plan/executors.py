"""Where a search's simulations run: this process, a pool of processes, or a Dask cluster.

A search hands its scenarios to anything with the :class:`concurrent.futures.Executor`
interface (``map``):

* :func:`default_executor`: a :class:`~concurrent.futures.ProcessPoolExecutor` over this machine's
  cores, or None (run here, one after another) when there are too few scenarios to be worth
  starting processes for, or one core;
* :func:`dask_executor`: a ``dask.distributed`` cluster's executor (``pip install
  'zero-sim[dask]'``), from a scheduler address (``tcp://host:8786``) or a running ``Client``;
  ``client.get_executor()`` is the same thing;
* Ray's ``ray.util.multiprocessing.Pool`` is not an Executor; wrap it or run Ray's
  ``concurrent.futures``-style ``RayExecutor`` (``ray.util.concurrent.futures``) the same way.

Each worker imports ``zero_sim`` and simulates whole scenarios; only the scenario's settings go
out and one flat row of figures comes back, so any executor that can pickle a dict works.
"""

from __future__ import annotations

import os
from concurrent.futures import Executor, ProcessPoolExecutor

# Fewer scenarios than this run in this process: starting workers costs more than it saves.
MIN_FOR_POOL = 24


def default_executor(tasks: int, workers: int | None = None) -> Executor | None:
    """A process pool over the machine's cores, or None (run here) for small searches."""
    workers = workers or os.cpu_count() or 1
    if workers < 2 or tasks < MIN_FOR_POOL:
        return None
    return ProcessPoolExecutor(max_workers=workers)


def map_on(executor: Executor | None, fn, items: list, chunksize: int = 1):
    """``fn`` over ``items`` in order: here when ``executor`` is None, else on it (a process pool
    sends ``chunksize`` items per message; other executors take them one by one)."""
    if executor is None:
        return map(fn, items)
    batch = {"chunksize": chunksize} if isinstance(executor, ProcessPoolExecutor) else {}
    return executor.map(fn, items, **batch)


def dask_executor(scheduler) -> Executor:
    """The executor of a Dask cluster, given its scheduler's address or a ``Client``."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise ValueError("--dask-scheduler needs dask.distributed; install it with "
                         "`pip install 'zero-sim[dask]'`") from None
    client = scheduler if isinstance(scheduler, Client) else Client(scheduler, timeout="10s")
    return client.get_executor()


__all__ = ["MIN_FOR_POOL", "dask_executor", "default_executor", "map_on"]
