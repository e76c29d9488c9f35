"""The pieces of a real run that need no second process: model, data, buffers, Adam."""

from __future__ import annotations

import pytest
import torch

from real_runs.model import GPT, PRESETS, build_model, count_params, global_batch, rank_shard
from real_runs.strategies.base import AdamState, AdamW, Flat, bucketize
from zero_sim.vocabulary.model_states import formula


def test_presets_span_a_few_hundred_thousand_to_gpt2_size():
    with torch.device("meta"):
        sizes = {name: count_params(GPT(cfg)) for name, cfg in PRESETS.items()}
    assert 1e5 < sizes["nano"] < 1e6
    assert 0.5e6 < sizes["tiny"] < 1.5e6
    # Untied head: GPT-2's 124M plus a second vocab x width matrix.
    assert 124e6 < sizes["gpt2-124m"] < 170e6


def test_layers_are_numbered_like_the_simulator_workload():
    model = build_model(PRESETS["nano"], seed=0)
    n = PRESETS["nano"].n_layer
    assert len(model.layers) == n + 2
    assert type(model.layers[0]).__name__ == "Embedding"
    assert all(type(b).__name__ == "Block" for b in model.layers[1:n + 1])
    assert type(model.layers[n + 1]).__name__ == "Head"


def test_the_same_seed_builds_the_same_weights_everywhere():
    a, b = build_model(PRESETS["nano"], seed=5), build_model(PRESETS["nano"], seed=5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    c = build_model(PRESETS["nano"], seed=6)
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


def test_a_batch_depends_only_on_seed_and_step_and_ranks_split_it_disjointly():
    cfg = PRESETS["nano"]
    x1, y1 = global_batch(cfg, seed=1, step=4, batch=8, seq_len=16)
    x2, _ = global_batch(cfg, seed=1, step=4, batch=8, seq_len=16)
    assert torch.equal(x1, x2)
    assert not torch.equal(x1, global_batch(cfg, seed=1, step=5, batch=8, seq_len=16)[0])
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the next tokens
    assert int(x1.max()) < cfg.vocab
    shards = [rank_shard(x1, r, 4) for r in range(4)]
    assert torch.equal(torch.cat(shards), x1)


def test_the_model_learns_the_synthetic_streams():
    torch.manual_seed(0)
    cfg = PRESETS["nano"]
    model = build_model(cfg, seed=0)
    opt = AdamW(lr=3e-3).torch_optimizer(model.parameters())
    losses = []
    for step in range(30):
        x, y = global_batch(cfg, 0, step, 8, 32)
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5


def test_adam_on_a_flat_shard_matches_torch_adamw_exactly():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(3 * AdamState.SLICE + 7))
    mine = p.detach().clone()
    hp = AdamW(lr=1e-2)
    opt, state = hp.torch_optimizer([p]), AdamState(mine, hp)
    for _ in range(3):
        g = torch.randn_like(mine)
        p.grad = g.clone()
        opt.step()
        state.update(mine, g)
    assert torch.equal(mine, p.detach())
    assert torch.equal(state.m, opt.state[p]["exp_avg"])


def test_flat_buffers_pad_uneven_sizes_to_equal_chunks_and_alias_the_parameters():
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(4))]
    before = [p.detach().clone() for p in params]
    flat = Flat(params, index=0, layer=None, world=4, rank=3)
    assert (flat.numel, flat.padded, flat.chunk) == (19, 20, 5)
    flat.bind()
    assert all(torch.equal(p, b) for p, b in zip(params, before, strict=True))
    flat.data.zero_()  # writing the buffer writes the parameters
    assert all(not p.detach().any() for p in params)
    assert flat.mine(flat.data).data_ptr() == flat.data[15:].data_ptr()


def test_buckets_follow_backward_order_and_respect_the_cap():
    params = [torch.nn.Parameter(torch.zeros(256)) for _ in range(5)]  # 1 KiB each
    buckets = bucketize(params, cap_bytes=2048)
    assert [len(b) for b in buckets] == [2, 2, 1]
    assert buckets[0][0] is params[-1]
    assert [len(b) for b in bucketize(params, 0)] == [1] * 5


@pytest.mark.parametrize("stage, expected", [(0, 16), (1, 8 + 8 / 4), (2, 4 + 12 / 4), (3, 16 / 4)])
def test_the_zero_formulas_for_fp32_adam(stage, expected):
    assert formula(stage, psi=1000, n=4, elem_bytes=4, k=8)["bytes"] == pytest.approx(expected * 1000)
