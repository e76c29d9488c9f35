"""The recorder counts activations without slowing the forwards it times."""

import torch

from real_runs.model import PRESETS, build_model, global_batch
from real_runs.record import Recorder
from zero_sim.vocabulary import ACTIVATIONS, fwd


def recorded_forward(rec, model, x, y, step):
    """One step's forward as a strategy records it: a compute span per layer."""
    rec.begin_step(step)
    with rec.saved_activations():
        h = x
        for i, layer in enumerate(model.layers):
            rec.open(fwd(i), i)
            h = layer(h, y) if i == len(model.layers) - 1 else layer(h)
            rec.close(fwd(i))
    rec.end_step()
    return h


def activation_samples(rec, step):
    return [m for m in rec.memory if m["step"] == step and m["category"] == ACTIVATIONS]


def test_later_forwards_charge_the_first_forwards_bytes_layer_by_layer_with_no_hook():
    cfg = PRESETS["nano"]
    model = build_model(cfg, seed=0)
    x, y = global_batch(cfg, 0, 0, 2, cfg.max_seq)
    rec = Recorder(0, torch.device("cpu"))
    try:
        recorded_forward(rec, model, x, y, 0).backward()
        rec.set_memory(ACTIVATIONS, 0)
        first = activation_samples(rec, 0)
        # The first forward counts every saved storage: many samples per layer.
        assert len(first) > len(model.layers)

        saved_hooks = []
        original = torch.autograd.graph.saved_tensors_hooks
        torch.autograd.graph.saved_tensors_hooks = lambda *a: saved_hooks.append(a) or original(*a)
        try:
            recorded_forward(rec, model, x, y, 1).backward()
        finally:
            torch.autograd.graph.saved_tensors_hooks = original
        later = activation_samples(rec, 1)
        # No hook ran in the second forward, yet it reached the same peak, one layer at a time,
        # each layer's bytes appearing when that layer's span closed.
        assert saved_hooks == []
        assert max(m["bytes"] for m in later) == max(m["bytes"] for m in first)
        assert len(later) == len(model.layers)
        ends = [op["end_s"] for op in rec.ops if op["step"] == 1]
        assert [m["t_s"] for m in later] == sorted(later_t := [m["t_s"] for m in later])
        assert all(end <= t for end, t in zip(ends, later_t, strict=True))
    finally:
        rec.shutdown()
