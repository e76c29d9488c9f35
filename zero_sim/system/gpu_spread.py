"""GPUs of one model differ in speed, and a synchronous step runs at its slowest one.

The per-op compute model (``hardware.py``) is anchored to benchmarks of one GPU: its matmul
ceiling is the maximum achievable matmul FLOPs (MAMF) that one accelerator reached.  A data
parallel step cannot go faster than its slowest GPU, because every layer's collective waits
for all ranks.  Taking the benchmarked GPU as a typical one, a job of ``n`` GPUs computes at
the expected speed of the slowest of ``n`` draws.

Model: a GPU's sustained compute speed, relative to the typical GPU, is normal with standard
deviation ``sigma``.  The slowest of ``n`` is ``sigma x E[max of n standard normals]`` below
the typical, so every compute op of a simulated rank takes

    slowest_gpu_factor(n) = 1 / (1 - sigma x E_max(n))

times the per-op model's time, where ``E_max(n) = integral of x n phi(x) Phi(x)^(n-1) dx``
(1.42 for 8 GPUs, 2.59 for 128).  One GPU (n = 1) is the typical one: factor 1.  Every
simulated rank runs at that pace, so the time a faster GPU would spend waiting in its
collectives for the slowest shows as compute instead; the step time is the same.

``sigma`` = 1.75% for every GPU generation, from two independent measurements of GPUs of one
SKU:

* stas00/ml-engineering, compute/accelerator ("Not all accelerators are created equal"):
  MAMF differs by "5% and higher" between the GPUs of one 8-GPU node.  Taken as the range
  of 8 draws, whose expectation is 2.85 sigma: sigma = 1.75%.
* Sinha et al., *Not All GPUs Are Created Equal* (arXiv 2208.11035 v3): over 90% of the
  GPUs of five clusters (V100 and MI60, a range of applications and cooling), an average
  performance variation of 8% between GPUs of a cluster, with outliers up to 1.5x slower
  than the median.  If that 8% spans the bulk of a few thousand GPUs (about 5 sigma), sigma
  is about 1.6%: the two agree.  The paper's SC22 abstract, from an earlier analysis of four
  of the clusters, gives 32% (max 72%); the later figure is the one taken.

What the model leaves out: the outliers (a single GPU 1.5x slower would dominate a job; the
factor assumes none was left in), how one GPU's speed drifts with its temperature during a
run, and the memory-bound kernels' smaller spread (they are slowed by the same factor).  An
explicit ``--efficiency`` or a calibration table is a statement about the cluster's own
ranks, so neither takes the factor; a measured table has its own ``slowest_rank_factor``.
"""

from __future__ import annotations

from functools import lru_cache
from statistics import NormalDist

# Relative standard deviation of one SKU's sustained compute speed (sources above).
GPU_SPEED_SIGMA = 0.0175


@lru_cache(maxsize=256)
def expected_max_normal(n: int) -> float:
    """E[max of n standard normal draws], by the trapezoid rule on [-9, 9] (error below 1e-6)."""
    unit, points = NormalDist(), 3601
    xs = [-9.0 + 18.0 * i / (points - 1) for i in range(points)]
    ys = [x * n * unit.pdf(x) * unit.cdf(x) ** (n - 1) for x in xs]
    return (sum(ys) - (ys[0] + ys[-1]) / 2) * 18.0 / (points - 1)


def expected_slowest_deficit(n: int, sigma: float = GPU_SPEED_SIGMA) -> float:
    """How far below the typical GPU's speed the slowest of ``n`` is expected to run (a fraction)."""
    if n <= 1 or sigma <= 0:
        return 0.0
    return sigma * expected_max_normal(n)


def slowest_gpu_factor(n: int, sigma: float = GPU_SPEED_SIGMA) -> float:
    """How many times longer each compute op takes on the slowest of ``n`` GPUs than on a typical one."""
    deficit = expected_slowest_deficit(n, sigma)
    if deficit >= 1.0:
        raise ValueError(f"a GPU speed spread of {sigma:g} leaves the slowest of {n} GPUs no speed; "
                         "give a spread below about 0.2")
    return 1.0 / (1.0 - deficit)
