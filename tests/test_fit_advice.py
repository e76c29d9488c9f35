"""When a scenario does not fit, the advice is settings that were simulated and fit, fastest first.

Each suggestion is ``simulate()`` keywords; applied to the same scenario they fit.  The text
output prints each as a command to paste.
"""

import json

import pytest

from zero_sim import simulate
from zero_sim.cli import main
from zero_sim.plan.fit_advice import as_flags, fit_advice

DDP_8B = dict(model="llama3-8b", strategy="ddp", gpus=8, topology="p4d-efa", micro_batch=4, seq_len=4096)


def test_every_suggestion_applied_to_the_scenario_fits(figures):
    advice = fit_advice(DDP_8B)
    assert advice
    for a in advice:
        assert set(a) == {"settings", "reserved_gb", "spare_gb", "tokens_per_s_per_gpu"}
        m = simulate(**(DDP_8B | a["settings"])).metrics
        figures(f"{a['settings']}: {m['tokens_per_s'] / m['gpus']:,.0f} tokens/s per GPU, "
                f"{a['spare_gb']:.1f} GB spare")
        assert m["memory"]["fits"]
        assert m["tokens_per_s"] / m["gpus"] == pytest.approx(a["tokens_per_s_per_gpu"], rel=1e-9)


def test_suggestions_come_fastest_first_and_try_more_than_one_kind_of_change():
    advice = fit_advice(DDP_8B)
    speeds = [a["tokens_per_s_per_gpu"] for a in advice]
    assert speeds == sorted(speeds, reverse=True)
    assert any("gpus" not in a["settings"] for a in advice)  # something fits on the GPUs there are
    assert len({tuple(sorted(a["settings"])) for a in advice}) > 1


def test_the_json_holds_the_list_and_the_text_prints_commands_to_paste(capsys):
    flags = ["--model", "llama3-8b", "--strategy", "ddp", "--gpus", "8", "--topology", "p4d-efa",
             "--micro-batch", "4", "--seq-len", "4096"]
    assert main(["simulate", *flags, "--json"]) == 0
    advice = json.loads(capsys.readouterr().out)["fit_advice"]
    assert isinstance(advice, list) and advice
    assert main(["simulate", *flags]) == 0
    out = capsys.readouterr().out
    first = " ".join(as_flags(advice[0]["settings"]))
    pasted = [line.strip() for line in out.splitlines() if line.strip().startswith("zero-sim simulate ")]
    assert pasted and all(f in pasted[0].split() for f in first.split())


def test_a_70b_model_on_32_h100_gets_what_the_planner_finds():
    """The planner fits llama3-70b on 32 H100 with ZeRO-3 or FSDP; DDP there does not fit, and the
    advice names a sharded strategy on those same 32 GPUs."""
    ddp = dict(model="llama3-70b", strategy="ddp", gpus=32, topology="dgx-h100", micro_batch=1, seq_len=8192)
    assert not simulate(**ddp, steps=1).metrics["memory"]["fits"]
    same_gpus = [a for a in fit_advice(ddp) if "gpus" not in a["settings"]]
    assert any(a["settings"].get("strategy") in ("zero3", "fsdp") for a in same_gpus)


def test_a_scenario_that_cannot_be_simulated_gets_no_advice_not_an_error():
    assert fit_advice(dict(model="llama3-8b", strategy="fsdp", gpus=8, hybrid=True)) == []
