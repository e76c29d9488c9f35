"""The GPU validation grid: what `zero-sim validate --device cuda` runs on a box of G GPUs,
and how it refuses on a machine without them."""

import pytest
import torch

from sim2real import validate as v
from sim2real.gpu_grid import GPU_MODELS, MICRO_BATCH, gpu_grid, rank_counts
from sim2real.sampling import BUCKETED_REAL, SAMPLED_STRATEGIES, Case


def test_rank_counts_double_up_to_the_box_and_end_on_it():
    assert rank_counts(8) == [1, 2, 4, 8]
    assert rank_counts(6) == [1, 2, 4, 6]
    assert rank_counts(1) == [1]
    with pytest.raises(ValueError, match="at least one GPU"):
        rank_counts(0)


def test_the_grid_takes_every_strategy_rank_count_bucket_and_model():
    grid = gpu_grid(8)
    # 7 strategies, 4 of them at two bucket sizes: 11 configurations, at N = 1, 2, 4, 8, for two models.
    assert len(grid) == 11 * 4 * len(GPU_MODELS)
    assert {c.strategy for c in grid} == set(SAMPLED_STRATEGIES)
    assert {c.gpus for c in grid} == {1, 2, 4, 8} and {c.model for c in grid} == set(GPU_MODELS)
    for c in grid:
        assert c.global_batch == MICRO_BATCH * c.gpus  # every rank trains MICRO_BATCH sequences
        assert c.bandwidth_gbps is None and c.shape is None  # the box's own links: nothing emulated
        assert (c.bucket_mb is not None) == (c.strategy in BUCKETED_REAL)


def test_a_gpu_case_is_planned_and_launched_on_cuda_in_bf16(tmp_path):
    opts = v.Options(device="cuda", precision="bf16")
    case = Case("zero2", 2, None, 25.0, model="gpt2-124m", global_batch=8)
    planned = v.planned_run(case, opts, None)
    # The prediction is made from this plan: it must name the GPUs the case will run on.
    assert (planned["device"], planned["precision"]) == ("cuda", "bf16") and "gpu" in planned
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            v._train_argv(case, opts, tmp_path)
        return
    argv = v._train_argv(case, opts, tmp_path)
    assert argv[argv.index("--device") + 1] == "cuda" and argv[argv.index("--precision") + 1] == "bf16"


@pytest.mark.skipif(torch.cuda.device_count() >= 8, reason="this machine has the GPUs the grid asks for")
def test_a_grid_wider_than_the_box_is_refused_before_anything_runs():
    with pytest.raises(v.ValidationError, match="--device cuda needs 8 GPU"):
        v.check_grid(gpu_grid(8), v.Options(device="cuda", precision="bf16"))
