"""Which GPU preset stands for a device as torch names it.

``torch.cuda.get_device_name()`` (and ``nvidia-smi``) report names such as
``NVIDIA H100 80GB HBM3`` or ``NVIDIA A100-SXM4-40GB``.  A recorded GPU run carries that
name; replaying it needs the preset of :data:`zero_sim.system.gpus.GPUS` with the same
peak, memory and bandwidth.  The rules are read in order and the first whose words all
are words of the name wins, so the more specific names (PCIe, 40GB) come before the general.
A part no preset models (H100 NVL, GH200, a new part) gets none rather than a near miss.
"""

from __future__ import annotations

# (words that must all be words of the upper-cased name, preset or None); first match wins.
# None: a part whose memory or bandwidth no preset has (the H100 NVL's 94 GB at 3.9 TB/s, the
# A100 PCIe's 300 W and 1.9 TB/s).
DEVICE_RULES: tuple[tuple[tuple[str, ...], str | None], ...] = (
    (("H100", "NVL"), None),
    (("H100", "PCIE"), "H100-PCIe"),
    (("H100", "96GB"), "H100-96GB"),
    (("H100", "HBM2E"), "H100-96GB"),
    (("H100",), "H100"),
    (("H200",), "H200"),
    (("B200",), "B200"),
    (("A100", "PCIE"), None),
    (("A100", "40GB"), "A100-40GB"),
    (("A100", "80GB"), "A100-80GB"),
    (("V100",), "V100"),
    (("L40S",), "L40S"),
    (("MI300X",), "MI300X"),
)

# The single-node topology preset of GPUs linked by NVLink, by GPU preset (their NVSwitch
# generation); GPUs that nvidia-smi shows on PCIe alone take ``PCIE_TOPOLOGY``.
NVLINK_TOPOLOGY = {
    "A100-40GB": "p4d-efa", "A100-80GB": "dgx-a100", "H100": "dgx-h100", "H100-96GB": "dgx-h100",
    "H200": "dgx-h200", "B200": "dgx-b200",
}
PCIE_TOPOLOGY = "pcie"


def preset_for_device(name: str) -> str | None:
    """The GPU preset for a torch device name, or None when no rule knows it."""
    words = set(name.upper().replace("-", " ").split())
    for needed, preset in DEVICE_RULES:
        if words.issuperset(needed):
            return preset
    return None


def nvlink_in_matrix(matrix: str) -> bool:
    """Whether ``nvidia-smi topo -m`` shows an NVLink (``NV<k>``) between two GPUs."""
    return any(cell.startswith("NV") and cell[2:].isdigit() for cell in matrix.split())


def node_topology(preset: str, matrix: str | None) -> str | None:
    """The topology preset of one node of ``preset`` GPUs: PCIe when the recorded link matrix
    has no NVLink, else the preset's NVSwitch generation; None when neither is known."""
    if matrix is not None and not nvlink_in_matrix(matrix):
        return PCIE_TOPOLOGY
    return NVLINK_TOPOLOGY.get(preset)
