"""fsdp-qwz, FSDP with ZeRO++'s int8 weight gathers: the quantizer's error bound, the loss of the
weights that really travelled, a loss curve within the quantization's own tolerance of plain
FSDP's, and a quarter (fp32) or a half (bf16) of its all-gather bytes plus the scales.

Tolerance of the loss curve, from the quantizer's error: a weight ``w`` in a block of scale
``s = max|block| / 127`` arrives as ``w + e`` with ``|e| <= s / 2``.  Rounding errors of different
weights are taken as independent and uniform on ``[-s/2, s/2]`` (variance ``s^2 / 12``), so to first
order the loss moves by ``sum_i g_i e_i``, of standard deviation ``sigma = sqrt(sum_i g_i^2 s_i^2 / 12)``
(``g`` the loss's gradient, ``s_i`` the scale of weight i's block).  Each step's loss must lie within
4 sigma, computed at the first step's weights, of plain FSDP's.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from real_runs_helpers import RUN, real_run

from real_runs.model import PRESETS, build_model, global_batch
from real_runs.strategies.fsdp_qwz import BLOCK, QMAX, SCALE_BYTES, dequantize, quantize

WORLD = 2


# --- the quantizer ------------------------------------------------------------------------------

def test_every_weight_arrives_within_half_a_step_of_its_own_blocks_scale():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3 * BLOCK + 100, generator=g) * 0.02
    x[5] = 3.0  # an outlier in the first block coarsens that block only
    x[2 * BLOCK: 3 * BLOCK] = 0.0  # an all-zero block travels as zeros
    q, scales = quantize(x)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= QMAX
    assert scales.shape == (4,) and scales.dtype == torch.float32
    back = dequantize(q[None], scales[None])[0]
    blocks = torch.nn.functional.pad(x, (0, -x.numel() % BLOCK)).view(-1, BLOCK)
    step = (blocks.abs().amax(dim=1) / QMAX).repeat_interleave(BLOCK)[:x.numel()]
    assert bool(((back - x).abs() <= step / 2 * (1 + 1e-6)).all())
    assert bool((back[2 * BLOCK: 3 * BLOCK] == 0).all())
    # The second block's weights are not flattened by the first block's outlier.
    assert float((back - x)[BLOCK:2 * BLOCK].abs().max()) < 3.0 / QMAX / 20


# --- the run --------------------------------------------------------------------------------

def shards_round_tripped(model: torch.nn.Module, world: int) -> tuple[torch.nn.Module, dict]:
    """``model`` with every layer's weights as fsdp-qwz's gathers deliver them (each layer's
    parameters laid end to end, padded to a multiple of ``world``, each rank's chunk quantized
    alone), and each parameter's per-element scale."""
    scale_of = {}
    with torch.no_grad():
        for layer in model.layers:
            params = list(layer.parameters())
            flat = torch.cat([p.flatten() for p in params])
            flat = torch.nn.functional.pad(flat, (0, -flat.numel() % world)).view(world, -1)
            pairs = [quantize(row) for row in flat]
            q, s = torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])
            back = dequantize(q, s).flatten()
            scales = torch.cat([s.repeat_interleave(BLOCK)[:flat.shape[1]] for _, s in pairs])
            off = 0
            for p in params:
                scale_of[p] = scales[off:off + p.numel()].view_as(p)
                p.copy_(back[off:off + p.numel()].view_as(p))
                off += p.numel()
    return model, scale_of


def first_step_loss_and_sigma() -> tuple[float, float, float]:
    """One process, step 0's global batch: the loss at the weights fsdp-qwz's gathers deliver, the
    loss at the exact weights, and sigma (module docstring) from the exact weights' gradient."""
    torch.set_num_threads(1)
    cfg = PRESETS[RUN["model"]]
    x, y = global_batch(cfg, RUN["seed"], 0, RUN["global_batch"], RUN["seq_len"])
    exact = build_model(cfg, RUN["seed"])
    loss = exact(x, y)
    loss.backward()
    rounded, scale_of = shards_round_tripped(build_model(cfg, RUN["seed"]), WORLD)
    scales = dict(zip(exact.parameters(), (scale_of[p] for p in rounded.parameters()), strict=True))
    variance = sum(float((p.grad.double() ** 2 * scales[p].double() ** 2).sum()) / 12
                   for p in exact.parameters())
    with torch.no_grad():
        return float(rounded(x, y)), float(loss), math.sqrt(variance)


@pytest.mark.slow
def test_the_first_loss_is_that_of_the_weights_the_int8_gathers_deliver():
    run, _ = real_run("fsdp-qwz", WORLD)
    rounded, exact, _ = first_step_loss_and_sigma()
    assert rounded != exact
    assert run["losses"][0] == pytest.approx(rounded, rel=1e-6)


@pytest.mark.slow
def test_the_loss_curve_is_plain_fsdps_within_the_quantizations_tolerance():
    quantized, plain = real_run("fsdp-qwz", WORLD)[0], real_run("fsdp", WORLD)[0]
    _, _, sigma = first_step_loss_and_sigma()
    gaps = [abs(a - b) for a, b in zip(quantized["losses"], plain["losses"], strict=True)]
    assert gaps[0] > 0  # the weights did travel in int8
    assert max(gaps) <= 4 * sigma, (gaps, sigma)
    # Adam updated the exact shards: the masters stay within a few updates of plain FSDP's.
    assert quantized["param_l2"] == pytest.approx(plain["param_l2"], rel=1e-3)


def gathers(out: str) -> dict[str, int]:
    """Bytes of each all-gather in rank 0's last step."""
    with open(os.path.join(out, "rank0.json")) as f:
        ops = json.load(f)["ops"]
    last = max(op["step"] for op in ops)
    return {op["name"]: op["bytes"] for op in ops
            if op["step"] == last and op["name"].startswith("all_gather")}


@pytest.mark.slow
@pytest.mark.parametrize("precision, elem_bytes", [("fp32", 4), ("bf16", 2)])
def test_each_gather_carries_one_byte_a_weight_plus_a_scale_per_block(precision, elem_bytes):
    quantized = gathers(real_run("fsdp-qwz", WORLD, precision=precision)[1])
    plain = gathers(real_run("fsdp", WORLD, precision=precision)[1])
    assert set(quantized) == set(plain) and len(plain) == PRESETS[RUN["model"]].n_layer + 2
    for name, full in plain.items():
        chunk = full // (WORLD * elem_bytes)  # each rank's shard of the layer, in weights
        assert quantized[name] == WORLD * (chunk + SCALE_BYTES * math.ceil(chunk / BLOCK))
        assert 1 / elem_bytes < quantized[name] / full < 1 / elem_bytes * 1.01
