"""The workload: what a model is made of, in parameters, FLOPs and saved activations."""

import pytest

from zero_sim.system.gpt_layers import GPTShape, gpt_workload
from zero_sim.system.model_presets import PRESETS, preset, synthesize_shape
from zero_sim.system.workload import WorkloadError, block_activation_bytes


def test_gpt2_presets_have_their_published_sizes():
    assert preset("gpt2-124m").params == 124_439_808  # tied embeddings, as GPT-2
    assert abs(preset("gpt2-1.5b").params - 1.558e9) / 1.558e9 < 0.01
    assert abs(preset("gpt3-175b").params - 175e9) / 175e9 < 0.01


def test_every_preset_is_embedding_blocks_head():
    for name, shape in PRESETS.items():
        w = preset(name)
        assert [layer.kind for layer in w.layers] == (["embedding"] + ["block"] * shape.n_layer
                                                      + ["head"]), name
        assert [layer.index for layer in w.layers] == list(range(shape.n_layer + 2))


def test_block_activations_follow_korthikanti():
    s, b, h, a = 1024, 8, 768, 12
    assert block_activation_bytes(s, b, h, a, "none") == s * b * h * (34 + 5 * a * s // h)
    assert block_activation_bytes(s, b, h, a, "selective") == s * b * h * 34
    assert block_activation_bytes(s, b, h, a, "full") == 2 * s * b * h


def test_recompute_keeps_fewer_activations_but_not_fewer_flops():
    # Eager attention, as Korthikanti et al. count it: the s x s scores dominate what is saved.
    full = preset("gpt2-124m", micro_batch=4, recompute="full", attention="eager")
    none = preset("gpt2-124m", micro_batch=4, attention="eager")
    assert full.saved_activation_bytes() < none.saved_activation_bytes() / 5
    assert full.model_flops() == none.model_flops()


def test_synthesized_shapes_land_near_the_requested_size():
    for target in (50e6, 1e9, 13e9):
        got = synthesize_shape(int(target)).params()
        assert abs(got - target) / target < 0.05, (target, got)


def test_bad_sizes_are_refused_with_a_sentence():
    with pytest.raises(WorkloadError, match="micro-batch must be a positive integer"):
        gpt_workload(GPTShape(2, 64, 2), micro_batch=0)
    with pytest.raises(WorkloadError, match="unknown model preset 'gpt5'"):
        preset("gpt5")


def test_a_torch_module_on_the_meta_device_becomes_a_workload():
    torch = pytest.importorskip("torch")
    from sim2real.module_workload import workload_from_module

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(100, 32)
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(3))
            self.head = torch.nn.Linear(32, 100, bias=False)

        def forward(self, idx):
            x = self.emb(idx)
            for block in self.blocks:
                x = torch.relu(block(x))
            return self.head(x)

    with torch.device("meta"):
        model = Tiny()
    w = workload_from_module(model, torch.zeros(4, 16, dtype=torch.long, device="meta"))
    assert [layer.numel for layer in w.layers] == [3200, 1056, 1056, 1056, 3200]
    # A Linear(32, 32) on 4x16 tokens: 2 * 64 * 32 * 32 FLOPs forward.
    assert w.layers[1].fwd_flops == 2 * 64 * 32 * 32
    assert w.layers[1].activation_bytes > 0  # its input was saved for backward
    assert w.seq_len == 16 and w.micro_batch == 4
