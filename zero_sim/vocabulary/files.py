"""How every output file of the project is written: whole or not at all.

Run records, calibration files, traces and reports are read by other processes (a
notebook polling a run directory, a validation reading ``run.json``), so a reader must
never see half a file.  Both halves write JSON through :func:`write_json_atomic`.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_json_atomic(path, obj, **dump_kwargs) -> None:
    """Write ``obj`` as JSON to a temporary file beside ``path``, flush it to disk, then rename
    it into place: a reader sees the old file or the new one, never a half-written one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, **dump_kwargs)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
