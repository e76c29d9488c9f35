"""``zero-sim plan``'s flags and plain-text answers.

Every setting plan shares with ``simulate`` is the same flag, built from the one schema: the
same type, the same choices.  Where plan searches a list of values (``--gpus 8,16,32``), that
meaning is plan's own, and a value named twice is tried once.  Candidates the simulator
refuses are explained in the plain text, not only in ``--csv``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import pytest

from zero_sim.cli import build_parser, main
from zero_sim.plan.cli import TRIED
from zero_sim.scenario.settings import COMMON

SMALL = ["--model", "gpt2-124m", "--topology", "pcie", "--micro-batch", "1", "--recompute", "none"]


def flags_of(command: str) -> dict[str, argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {flag: action for action in sub._actions for flag in action.option_strings}


def test_every_setting_plan_shares_with_simulate_is_the_same_flag():
    plan, simulate = flags_of("plan"), flags_of("simulate")
    shared = [s.flag for s in COMMON if s.flag in plan and s.name not in TRIED]
    assert {"--model", "--seq-len", "--precision", "--offload-optimizer", "--lora-base"} <= set(shared)
    for flag in shared:
        assert (plan[flag].type, plan[flag].choices) == (simulate[flag].type, simulate[flag].choices), flag


def test_plan_gains_the_schemas_choices():
    plan = flags_of("plan")
    assert "nvme" in plan["--offload-optimizer"].choices and "nvme" in plan["--offload-params"].choices
    assert set(plan["--precision"].choices) == {"mixed", "fp32", "fp8", "amp"}


def test_plans_list_flags_keep_their_meaning_and_zeropp_its_flags():
    plan = flags_of("plan")
    assert {"--gpus", "--micro-batch", "--strategies", "--recompute", "--global-batch", "--top"} <= set(plan)
    assert plan["--gpus"].default == "8" and plan["--model"].default == "gpt2-1.5b"
    zeropp = {"--zero-quantized-weights", "--zero-hpz-partition-size", "--zero-quantized-gradients"}
    assert zeropp <= set(plan)


def test_a_gpu_count_named_twice_is_tried_once(capsys):
    def plan(gpus: str) -> tuple[dict, list[str]]:
        assert main(["plan", *SMALL, "--strategies", "ddp", "--gpus", gpus, "--json"]) == 0
        table = json.loads(capsys.readouterr().out)
        assert main(["plan", *SMALL, "--strategies", "ddp", "--gpus", gpus]) == 0
        rows = [line[6:] for line in capsys.readouterr().out.splitlines() if line[:4].strip().isdigit()]
        return table["summary"], rows

    once, twice = plan("8,4"), plan("8,4,8")
    assert twice[0]["candidates"] == once[0]["candidates"]
    assert twice[1] == once[1] and len(set(twice[1])) == len(twice[1])  # no row printed twice


@pytest.mark.parametrize("strategies", ["ddp,zero3", "ddp,zero3,fsdp"])
def test_candidates_that_cannot_run_are_explained_in_the_plain_text(capsys, strategies):
    """QLoRA's 4-bit base cannot be sharded (zero3 and fsdp refuse it): the line under the header
    says how many candidates cannot run and why; with two reasons, the commoner and the count of others."""
    args = ["plan", *SMALL, "--gpus", "8", "--lora-rank", "8", "--lora-base", "nf4",
            "--strategies", strategies, "--top", "1"]
    assert main([*args, "--json"]) == 0
    errors = Counter(c["error"] for c in json.loads(capsys.readouterr().out)["candidates"] if c["error"])
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    (reason, n), *others = errors.most_common()
    said = f"cannot run: {sum(errors.values())} candidates, "
    if others:
        said += f"{n} of them because {reason}; {sum(errors.values()) - n} for 1 other reason"
    else:
        said += f"because {reason}"
    assert "4-bit QLoRA base" in reason and out[1].startswith(said), out[1]
    assert out[2].startswith("fastest that fits: ddp")
