"""A real run's numeric precision: which dtype computes, and what each parameter costs.

Three precisions, the ones the simulator models (``zero_sim`` calls bf16 training ``mixed``):

* ``fp32``: weights, gradients and Adam's moments in fp32. Per parameter: weight 4 bytes,
  gradient 4, optimizer state 8 (m and v): ``b = 4``, ``K = 8``.
* ``bf16``: the model's weights and gradients are bf16, so forward, backward and every
  gradient collective run in bf16; the optimizer keeps an fp32 master copy of the weights
  it owns beside fp32 m and v, updates the master, and writes it back rounded to bf16.
  Per parameter: weight 2, gradient 2, optimizer state 12: ``b = 2``, ``K = 12``, the
  ZeRO paper's mixed-precision Adam.
* ``amp``: what Hugging Face Trainer and Lightning run: fp32 weights, and the forward under
  ``torch.autocast`` in bf16, which casts each weight as the op that uses it runs; the
  gradients of the fp32 weights are fp32 and travel in fp32, and Adam updates the weights
  themselves (no master).  Per parameter: weight 4, gradient 4, optimizer state 8, as fp32.

Plain data here, importable without torch: the command line checks it before any rank
starts, and the bridge to the simulator reads it from ``run.json``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    name: str
    dtype: str  # the torch dtype's name of weights and gradients, as run.json records it
    param_bytes: int  # b: bytes of one weight, and of one gradient
    optimizer_bytes: int  # K: optimizer-state bytes per parameter
    simulator: str  # the simulator's name for the same precision
    autocast: str | None = None  # the torch dtype's name the forward runs in under torch.autocast


PRECISIONS: dict[str, Precision] = {
    "fp32": Precision("fp32", "float32", 4, 8, "fp32"),
    "bf16": Precision("bf16", "bfloat16", 2, 12, "mixed"),
    "amp": Precision("amp", "float32", 4, 8, "amp", autocast="bfloat16"),
}
DEFAULT_PRECISION = "fp32"
# The precisions a layer can be timed in alone (microbench, calibrate): a dtype the weights are held in.
TIMED = ("fp32", "bf16")


def default_precision(device: str) -> str:
    """What a run trains in unless told: bf16 on GPUs, as GPU users train; fp32 on the CPU."""
    return "bf16" if device == "cuda" else DEFAULT_PRECISION


def precision_of_run(run: dict) -> Precision:
    """The precision a ``run.json`` was trained in (runs written before the field are fp32)."""
    by_dtype = {p.dtype: p for p in PRECISIONS.values() if p.autocast is None}
    name = run.get("precision")
    if name in PRECISIONS:
        return PRECISIONS[name]
    return by_dtype.get(run.get("dtype", "float32"), PRECISIONS[DEFAULT_PRECISION])
