"""Choosing a model: by name (presets, the shapes of published models, each with where its shape
and parameter count come from) or by size (a GPT shape synthesised for a parameter count, read
from ``7.5e9``, ``7.5B`` or ``350M``).  Plain data over :class:`zero_sim.system.gpt_layers.GPTShape`;
``preset(name)`` builds the workload of one.  ``docs/models.md`` lists the presets and sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zero_sim.system.gpt_layers import GPTShape, gpt_workload
from zero_sim.system.workload import (
    DEFAULT_ATTENTION,
    DEFAULT_ELEMENTWISE,
    Workload,
    WorkloadError,
    check_positive,
)


@dataclass(frozen=True)
class PresetSource:
    """Where a preset's shape and its published parameter count come from."""

    shape: str  # the publication (and table) the shape is read from
    params: str | None  # the parameter count as the source prints it ("6.74B"); None: not published
    params_source: str = ""  # where that count is printed, when not where the shape is
    note: str = ""  # what was assumed or approximated


def published_params(text: str) -> tuple[float, float]:
    """A printed count (``"6.74B"``, ``"350M"``) as (value, half a unit of its last significant digit).

    Trailing zeros of a whole number are not significant ("350M" is 35 tens of millions), as
    the sources round their model names: GPT-3's "350M" model has 355.9M parameters."""
    units = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}
    digits, unit = text[:-1], units[text[-1].upper()]
    if "." in digits:
        step = 10.0 ** -len(digits.split(".")[1])
    else:
        stripped = digits.rstrip("0")
        step = 10.0 ** (len(digits) - len(stripped))
    return float(digits) * unit, step * unit / 2


_GPT3 = "Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1"
_GPT3_TIED = ("vocabulary 50257 and 2048 learned positions as GPT-2's, embeddings tied as in GPT-2 "
              "(the counts of Table 2.1 include one token table)")
_LLAMA2 = "Touvron et al. 2023, 'Llama 2: Open Foundation and Fine-Tuned Chat Models', Table 1 and Sec. 2.2"
_LLAMA2_CONFIG = ("FFN widths and vocabulary 32000 as the released model code and params.json give them "
                  "(meta-llama/llama repository)")
_LLAMA3 = "Meta, Llama 3 model card (meta-llama/llama3 MODEL_CARD.md), released model code and params.json"
_MPT = "MosaicML, MPT-{} model card on Hugging Face (mosaicml/mpt-{}), 'Model Description' table"
_HF_CARD = "the model's Hugging Face page (safetensors parameter count)"

# Preset shapes.  GPT-2 sizes are the published ones.  gpt-7.5b follows the ZeRO paper's
# 7.5B model size with a GPT-3-like aspect ratio; the RoBERTa sizes of the Amazon Science
# article on DeepSpeed ZeRO are encoders whose shapes the article does not give: we assume
# GPT-like blocks (same FLOPs and bytes as an encoder block) at RoBERTa's sequence length
# of 512.
_LLAMA = dict(mlp="swiglu", norm="rmsnorm", bias=False, positions="rotary", dropout=False)
PRESETS: dict[str, GPTShape] = {
    "gpt2-124m": GPTShape(12, 768, 12, 50257, 1024, tied=True, mlp="gelu_tanh"),
    "gpt2-350m": GPTShape(24, 1024, 16, 50257, 1024, tied=True, mlp="gelu_tanh"),
    "gpt2-1.5b": GPTShape(48, 1600, 25, 50257, 1024, tied=True, mlp="gelu_tanh"),
    "gpt-7.5b": GPTShape(36, 4096, 32, 50257, 2048, tied=True),
    "gpt3-175b": GPTShape(96, 12288, 96, 50257, 2048),
    "roberta-10b": GPTShape(50, 4096, 32, 50265, 512, causal=False),
    "roberta-50b": GPTShape(62, 8192, 64, 50265, 512, causal=False),
    "gpt3-125m": GPTShape(12, 768, 12, 50257, 2048, tied=True),
    "gpt3-350m": GPTShape(24, 1024, 16, 50257, 2048, tied=True),
    "gpt3-760m": GPTShape(24, 1536, 16, 50257, 2048, tied=True),
    "gpt3-1.3b": GPTShape(24, 2048, 16, 50257, 2048, tied=True),
    "gpt3-2.7b": GPTShape(32, 2560, 32, 50257, 2048, tied=True),
    "gpt3-6.7b": GPTShape(32, 4096, 32, 50257, 2048, tied=True),
    "gpt3-13b": GPTShape(40, 5120, 40, 50257, 2048, tied=True),
    "llama2-7b": GPTShape(32, 4096, 32, 32000, 4096, ffn_hidden=11008, **_LLAMA),
    "llama2-13b": GPTShape(40, 5120, 40, 32000, 4096, ffn_hidden=13824, **_LLAMA),
    "llama2-70b": GPTShape(80, 8192, 64, 32000, 4096, kv_heads=8, ffn_hidden=28672, **_LLAMA),
    "llama3-8b": GPTShape(32, 4096, 32, 128256, 8192, kv_heads=8, ffn_hidden=14336, **_LLAMA),
    "llama3-70b": GPTShape(80, 8192, 64, 128256, 8192, kv_heads=8, ffn_hidden=28672, **_LLAMA),
    "mistral-7b": GPTShape(32, 4096, 32, 32000, 8192, kv_heads=8, ffn_hidden=14336, window=4096, **_LLAMA),
    "mpt-7b": GPTShape(32, 4096, 32, 50432, 2048, tied=True, bias=False, positions="alibi", dropout=False),
    "mpt-30b": GPTShape(48, 7168, 64, 50432, 8192, tied=True, bias=False, positions="alibi", dropout=False),
    "t5-11b": GPTShape(48, 1024, 128, 32128, 512, tied=True, head_dim=128, ffn_hidden=65536, mlp="relu",
                       norm="rmsnorm", bias=False, positions="relative", cross_attention=24, causal=False),
    "bert-large": GPTShape(24, 1024, 16, 30522, 512, tied=True, causal=False),
}

PRESET_SOURCES: dict[str, PresetSource] = {
    "gpt2-124m": PresetSource("Radford et al. 2019, 'Language Models are Unsupervised Multitask Learners', "
                              "Table 2 (smallest model), and the released GPT-2 code", "124M",
                              "openai-community/gpt2 on Hugging Face",
                              "the paper's Table 2 prints 117M; the released weights have 124.4M"),
    "gpt2-350m": PresetSource("Radford et al. 2019, Table 2 (second model)", "355M",
                              "openai-community/gpt2-medium on Hugging Face",
                              "the paper prints 345M for this model"),
    "gpt2-1.5b": PresetSource("Radford et al. 2019, Table 2 (largest model)", "1542M",
                              "Radford et al. 2019, Table 2"),
    "gpt-7.5b": PresetSource("Rajbhandari et al. 2020, 'ZeRO: Memory Optimizations Toward Training Trillion "
                             "Parameter Models', Sec. 1 and Table 1 (7.5B model)", "7.5B", "",
                             "the paper gives the size, not the shape: a GPT-3-like aspect ratio is assumed"),
    "gpt3-175b": PresetSource(_GPT3 + " (GPT-3 175B)", "175.0B", _GPT3,
                              "kept untied as this preset always was (tied, it would have 174.6B)"),
    "roberta-10b": PresetSource("Amazon Science, 'Making DeepSpeed ZeRO run efficiently on more-affordable "
                                "hardware' (RoBERTa 10B)", None, "",
                                "the article gives the size, not the shape: GPT-like blocks assumed, "
                                "10.5B parameters"),
    "roberta-50b": PresetSource("Amazon Science, 'Making DeepSpeed ZeRO run efficiently on more-affordable "
                                "hardware' (RoBERTa 50B)", None, "",
                                "the article gives the size, not the shape: GPT-like blocks assumed, "
                                "50.8B parameters"),
    "gpt3-125m": PresetSource(_GPT3 + " (GPT-3 Small)", "125M", _GPT3, _GPT3_TIED),
    "gpt3-350m": PresetSource(_GPT3 + " (GPT-3 Medium)", "350M", _GPT3, _GPT3_TIED),
    "gpt3-760m": PresetSource(_GPT3 + " (GPT-3 Large)", "760M", _GPT3, _GPT3_TIED),
    "gpt3-1.3b": PresetSource(_GPT3 + " (GPT-3 XL)", "1.3B", _GPT3,
                              _GPT3_TIED + "; the table prints 24 heads of 128, which does not divide "
                              "d_model 2048: we use 16 heads of 128, which does and gives 1.3B"),
    "gpt3-2.7b": PresetSource(_GPT3 + " (GPT-3 2.7B)", "2.7B", _GPT3, _GPT3_TIED),
    "gpt3-6.7b": PresetSource(_GPT3 + " (GPT-3 6.7B)", "6.7B", _GPT3, _GPT3_TIED),
    "gpt3-13b": PresetSource(_GPT3 + " (GPT-3 13B)", "13B", _GPT3,
                             _GPT3_TIED + "; the table prints d_model 5140 with 40 heads of 128: we use "
                                          "40 x 128 = 5120"),
    "llama2-7b": PresetSource(_LLAMA2, "6.74B", "meta-llama/Llama-2-7b-hf, " + _HF_CARD, _LLAMA2_CONFIG),
    "llama2-13b": PresetSource(_LLAMA2, "13.0B", "meta-llama/Llama-2-13b-hf, " + _HF_CARD, _LLAMA2_CONFIG),
    "llama2-70b": PresetSource(_LLAMA2 + " (GQA with 8 KV heads)", "69.0B",
                               "meta-llama/Llama-2-70b-hf, " + _HF_CARD, _LLAMA2_CONFIG),
    "llama3-8b": PresetSource(_LLAMA3, "8.03B", "meta-llama/Meta-Llama-3-8B, " + _HF_CARD,
                              "GQA with 8 KV heads, vocabulary 128256, 8192-token context"),
    "llama3-70b": PresetSource(_LLAMA3, "70.6B", "meta-llama/Meta-Llama-3-70B, " + _HF_CARD,
                               "GQA with 8 KV heads, vocabulary 128256, 8192-token context"),
    "mistral-7b": PresetSource("Jiang et al. 2023, 'Mistral 7B', Table 1", "7.24B",
                               "mistralai/Mistral-7B-v0.1, " + _HF_CARD,
                               "sliding window 4096 over an 8192-token context: attention FLOPs count "
                               "4096 keys per query"),
    "mpt-7b": PresetSource(_MPT.format("7B", "7b"), "6.7B", "",
                           "ALiBi (no position table), no biases (LayerNorm included), tied embeddings, "
                           "dropout 0"),
    "mpt-30b": PresetSource(_MPT.format("30B", "30b"), "29.95B", "",
                            "ALiBi, no biases, tied embeddings, dropout 0, 8192-token context"),
    "t5-11b": PresetSource("Raffel et al. 2020, 'Exploring the Limits of Transfer Learning with a Unified "
                           "Text-to-Text Transformer', Sec. 3.7 (T5-11B)", "11B", "",
                           "encoder (24 blocks) and decoder (24 blocks with cross-attention) as one stack; "
                           "inputs and targets both 512 tokens; vocabulary 32128 as released"),
    "bert-large": PresetSource("Devlin et al. 2019, 'BERT: Pre-training of Deep Bidirectional Transformers', "
                               "Sec. 3 (BERT-LARGE)", "340M", "",
                               "encoder blocks as GPT-like blocks; vocabulary 30522 (uncased); the "
                               "token-type table, embedding LayerNorm, pooler and MLM transform (2.1M) "
                               "left out"),
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


def preset(name: str, micro_batch: int = 1, seq_len: int | None = None, recompute: str = "none",
           attention: str = DEFAULT_ATTENTION, elementwise: str = DEFAULT_ELEMENTWISE) -> Workload:
    if name not in PRESETS:
        raise WorkloadError(f"unknown model preset {name!r}; choose one of {', '.join(preset_names())} "
                            "or give --params N")
    return gpt_workload(PRESETS[name], micro_batch, seq_len, recompute, name, attention, elementwise)


def synthesize_shape(target_params: int, seq_len: int = 1024, vocab: int = 50257) -> GPTShape:
    """The GPT shape closest to ``target_params`` with a GPT-3-like depth/width ratio.

    Width is a multiple of 64 with 64-wide heads and depth is about width/100 (GPT-3's
    family runs from 1/64 to 1/128); among those we take the closest parameter count.
    """
    check_positive(params=target_params)
    best: tuple[float, GPTShape] | None = None
    for h in range(64, 32768 + 1, 64):
        per_block = 12 * h * h + 13 * h
        fixed = vocab * h * 2 + seq_len * h + 2 * h
        for n_layer in {max(1, round(h / d)) for d in (64, 80, 100, 128)}:
            shape = GPTShape(n_layer, h, max(1, h // 64), vocab, seq_len)
            err = abs(fixed + n_layer * per_block - target_params)
            if best is None or err < best[0]:
                best = (err, shape)
        if fixed > 2 * target_params:
            break
    assert best is not None
    return best[1]


_SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(value) -> int:
    """A parameter count from ``7.5e9``, ``"7.5e9"``, ``"7.5B"``, ``"350M"``, ``"1.3b"`` or an int.

    Raises :class:`WorkloadError` (one sentence) for anything else, zero or negative."""
    bad = WorkloadError(f"--params must be a positive count such as 7.5e9, 7.5B, 350M or 1.3b, got {value!r}")
    if isinstance(value, bool):
        raise bad
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        text = value.strip().replace("_", "").replace(",", "")
        scale = 1.0
        if text and text[-1].lower() in _SUFFIXES:
            scale, text = _SUFFIXES[text[-1].lower()], text[:-1]
        try:
            number = float(text) * scale
        except ValueError:
            raise bad from None
    else:
        raise bad
    if not math.isfinite(number) or round(number) <= 0:
        raise bad
    return int(round(number))


def human_params(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    return f"{n:,}"
