"""Reading PyTorch profiler (Kineto) traces as they come: gzipped or not, of any size, in bounded memory.

A trace of a large job runs to gigabytes, almost all of it host-side operator events that a
calibration never looks at. :func:`read_trace` therefore streams the file (``ijson``: first the
header, up to where the events begin, then the events one at a time) and keeps only what
:mod:`zero_sim.calibration.from_traces` reads: GPU kernels, copies and memsets, the CUDA runtime
calls that launched them, annotated regions (``user_annotation``, ``gpu_user_annotation``,
profiler steps), each with only the fields and arguments used; plus the header
(``deviceProperties``, ``distributedInfo``). Memory then grows with the number of kernels,
not with the size of the file. ``on_progress(bytes_read, total_bytes)``, when given, hears how
far the read has come (the CLI draws a bar with it).

A file that is not a trace, a truncated one and a missing one are each one sentence
(:class:`~zero_sim.calibration.format.CalibrationError`).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

import ijson

from zero_sim.calibration.format import CalibrationError

# Kernel launches come from the runtime (cudaLaunchKernel) or the driver (cuLaunchKernelEx: cuBLAS's
# Hopper GEMMs); annotations from the user and from torch.
KEPT_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "user_annotation",
                   "gpu_user_annotation"}
# Of the many CPU ops, only two kinds are read: autograd's backward functions (they mark backward
# launches on autograd's own thread, where no user annotation is) and c10d's record of each collective
# (its message and group sizes, which older PyTorch records there and not on the NCCL kernel).
KEPT_CPU_OPS = ("autograd::engine::evaluate_function", "record_param_comms")
# With with_stack and with_modules, each nn.Module's forward is a python_function event of this name.
MODULE_CALLS = "nn.Module: "
KEPT_FIELDS = ("ph", "cat", "name", "ts", "dur", "tid", "pid")
KEPT_ARGS = ("correlation", "stream", "Collective name", "In msg nelems", "Out msg nelems", "Group size",
             "dtype", "grid", "block")
HEADER_KEYS = ("deviceProperties", "distributedInfo")
Progress = Callable[[int, int], None] | None


def trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """The trace files among ``paths``: files as given, folders by their ``*.json`` and ``*.json.gz``."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            inside = sorted([*p.glob("*.json"), *p.glob("*.json.gz")])
            if not inside:
                raise CalibrationError(f"folder {str(p)!r} holds no .json or .json.gz trace; pass the folder "
                                       f"torch.profiler wrote its traces to, or the files themselves")
            found += inside
        elif p.is_file():
            found.append(p)
        else:
            raise CalibrationError(f"trace {str(p)!r} does not exist; pass a PyTorch profiler trace "
                                   f"(.json or .json.gz) or a folder of them")
    return found


def _slim(event: dict) -> dict | None:
    """The parts of an event a calibration reads, or None for an event it never reads."""
    if not isinstance(event, dict) or event.get("ph") != "X":
        return None
    cat = event.get("cat")
    name = str(event.get("name", ""))
    kept_op = (cat == "cpu_op" and name.startswith(KEPT_CPU_OPS)) or (cat == "python_function"
                                                                       and name.startswith(MODULE_CALLS))
    if cat not in KEPT_CATEGORIES and not kept_op:
        return None
    kept = {k: event[k] for k in KEPT_FIELDS if k in event}
    args = event.get("args")
    if isinstance(args, dict):
        kept["args"] = {k: args[k] for k in KEPT_ARGS if k in args}
    return kept


class _Counting:
    """A binary file that says how many bytes of it have been read (of the file on disk)."""

    def __init__(self, raw, total: int, on_progress: Progress):
        self.raw, self.total, self.on_progress = raw, total, on_progress

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        if self.on_progress is not None:
            self.on_progress(self.raw.tell(), self.total)
        return data


def _open(path: Path, on_progress: Progress = None):
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller's with-block through the wrapper
    counted = _Counting(raw, path.stat().st_size, on_progress)
    return gzip.GzipFile(fileobj=counted) if path.suffix == ".gz" else counted, raw


def _header(path: Path) -> tuple[dict, bool]:
    """The header keys, and whether the file has a traceEvents list. Kineto writes the header
    (``deviceProperties``, ``distributedInfo``) before the events, so the scan stops where they begin."""
    builders: dict[str, ijson.ObjectBuilder] = {}
    stream, raw = _open(path)
    with raw:
        for prefix, kind, value in ijson.parse(stream, use_float=True):
            if prefix == "traceEvents" and kind == "start_array":
                return {k: b.value for k, b in builders.items()}, True
            top = prefix.split(".", 1)[0]
            if top in HEADER_KEYS:
                if prefix == top and kind in ("start_map", "start_array"):
                    builders[top] = ijson.ObjectBuilder()
                if top in builders:
                    builders[top].event(kind, value)
    return {}, False


def read_trace(path: Path, on_progress: Progress = None) -> dict:
    """The header and the events a calibration reads of one trace, streamed (module docstring)."""
    try:
        header, has_events = _header(path)
        if not has_events:
            raise CalibrationError(f"{path.name} is JSON but not a PyTorch profiler trace (no traceEvents "
                                   f"list); pass the files torch.profiler's trace handler writes")
        stream, raw = _open(path, on_progress)
        with raw:
            events = [slim for event in ijson.items(stream, "traceEvents.item", use_float=True)
                      if (slim := _slim(event)) is not None]
    except (OSError, EOFError, zlib.error) as exc:
        raise CalibrationError(f"{path.name} cannot be read ({exc.__class__.__name__}: {exc}); a truncated "
                               f"download or copy? Profile again or copy the file whole") from None
    except ijson.common.IncompleteJSONError as exc:
        raise CalibrationError(f"{path.name} is not complete JSON ({str(exc).splitlines()[0][:80]}); a "
                               f"trace cut short while being written? Let the profiler finish, then copy "
                               f"it") from None
    return {**header, "traceEvents": events}


__all__ = ["KEPT_ARGS", "KEPT_CATEGORIES", "KEPT_CPU_OPS", "read_trace", "trace_files"]
