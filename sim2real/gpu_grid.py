"""The grid ``zero-sim validate --device cuda`` runs on a box of G GPUs.

On GPUs there is nothing to emulate: the links are the box's own (NVLink or PCIe), so a
case is a strategy, a rank count, a bucket size where buckets exist, and a model.  The grid
takes all of them:

* **strategy**: every real strategy whose collectives the run records (as the sampled CPU
  grid, :data:`sim2real.sampling.SAMPLED_STRATEGIES`);
* **N**: 1, 2, 4, ... up to G, and G itself;
* **bucket size**: 25 MB (torch's default) and 4 MB for the bucketed strategies;
* **model**: ``gpt2-124m`` and ``gpt2-350m`` (the simulator's presets of the same shapes),
  long enough a step to time on a GPU, with ``MICRO_BATCH`` sequences of 1024 tokens a rank;
  runs train in bf16 with fp32 masters, as GPU users train.
"""

from __future__ import annotations

from sim2real.sampling import BUCKETED_REAL, SAMPLED_STRATEGIES, Case

GPU_MODELS = ("gpt2-124m", "gpt2-350m")
GPU_BUCKETS_MB = (25.0, 4.0)
MICRO_BATCH = 4


def rank_counts(gpus: int) -> list[int]:
    """1, 2, 4, ... below ``gpus``, and ``gpus`` itself."""
    if gpus < 1:
        raise ValueError(f"a GPU grid needs at least one GPU, got {gpus}")
    counts, n = [], 1
    while n < gpus:
        counts.append(n)
        n *= 2
    return [*counts, gpus]


def gpu_grid(gpus: int, models: tuple[str, ...] = GPU_MODELS) -> tuple[Case, ...]:
    """Every case of the grid for a box of ``gpus`` GPUs (module docstring)."""
    return tuple(
        Case(strategy, n, None, bucket, model=model, global_batch=MICRO_BATCH * n)
        for model in models for n in rank_counts(gpus) for strategy in SAMPLED_STRATEGIES
        for bucket in (GPU_BUCKETS_MB if strategy in BUCKETED_REAL else (None,))
    )
