"""What a CUDA run ran on, for its ``run.json``: the GPU as torch names it, how many, its
memory and SMs, the driver, NCCL, and ``nvidia-smi topo -m``'s link matrix.

A GPU recording is only worth replaying if it says which GPU it came from: the bridge
to the simulator picks the GPU preset from ``name`` (:mod:`zero_sim.system.device_names`),
and a reader of the file can tell an SXM part from a PCIe one, or NVLink from PCIe links,
by the topology matrix.  Anything ``nvidia-smi`` cannot tell (it is missing, or slow) is
``None``; the stamp never stops a run.
"""

from __future__ import annotations

import functools
import re
import subprocess

SMI_TIMEOUT_S = 20
# nvidia-smi underlines the matrix's header with terminal escape codes even into a pipe.
TERMINAL_CODES = re.compile(r"\x1b\[[0-9;]*m")


def _smi(*args: str) -> str | None:
    try:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return TERMINAL_CODES.sub("", done.stdout).strip() or None if done.returncode == 0 else None


@functools.cache
def gpu_stamp() -> dict | None:
    """The stamp of this process's CUDA device, or None without one.  Read once per process:
    a validation plans every case with it, and each reading runs nvidia-smi twice."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    driver = _smi("--query-gpu=driver_version", "--format=csv,noheader")
    return {
        "name": props.name,
        "count": torch.cuda.device_count(),
        "capability": f"{props.major}.{props.minor}",
        "total_memory_bytes": int(props.total_memory),
        "multiprocessors": int(props.multi_processor_count),
        "driver": driver.splitlines()[0].strip() if driver else None,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "topology": _smi("topo", "-m"),
    }
