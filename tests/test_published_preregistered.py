"""Pre-registered sources: a new source's points are predicted by the committed model and frozen in
one commit, and the report reads the frozen predictions (first seen) beside the current model's (now)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from zero_sim.published import PublishedError
from zero_sim.published.first_seen import format_block, load_frozen, preregistered_block, summarise
from zero_sim.published.preregister import FROZEN_DIR, SOURCES_DIR, freeze, main, model_commit, predict_point

ROOT = Path(__file__).resolve().parent.parent

SOURCE = """
[source]
title = "A made-up benchmark table"
url = "https://example.org/table"
table = "Table 1, rows 1-2"

[[point]]
id = "made-up-ddp-8"
source = "A made-up benchmark table, Table 1 row 1"
metric = "tokens_per_s_per_gpu"
value = 3000.0
[point.scenario]
model = "gpt2-350m"
strategy = "ddp"
gpus = 8
topology = "dgx-a100"
micro_batch = 8
stack = "pytorch-eager"

[[point]]
id = "made-up-zero1-16-step"
source = "A made-up benchmark table, Table 1 row 2"
metric = "step_time_s"
value = 0.5
[point.scenario]
model = "gpt2-350m"
strategy = "zero1"
gpus = 16
topology = "dgx-a100"
micro_batch = 8
"""


@pytest.fixture
def frozen(tmp_path) -> dict:
    src = tmp_path / "made-up.toml"
    src.write_text(SOURCE)
    return json.loads(freeze(src, "a" * 40, tmp_path / "out").read_text())


def test_a_frozen_file_names_the_source_the_model_commit_and_each_prediction_with_its_interval(frozen):
    assert frozen["source"] == {"title": "A made-up benchmark table", "url": "https://example.org/table",
                                "table": "Table 1, rows 1-2", "slug": "made-up"}
    assert frozen["model_commit"] == "a" * 40 and re.fullmatch(r"\d{4}-\d\d-\d\d", frozen["date"])
    ddp, step = frozen["points"]
    assert ddp["published"] == 3000.0 and ddp["point"]["scenario"]["strategy"] == "ddp"
    assert ddp["low"] < ddp["predicted"] < ddp["high"] and ddp["fits"] is True
    assert ddp["speed_error"] == pytest.approx(ddp["predicted"] / 3000.0 - 1)
    # a step time's speed error is inverted: a shorter predicted step is a faster prediction
    assert step["speed_error"] == pytest.approx(0.5 / step["predicted"] - 1)


def test_a_registered_file_is_never_rewritten(tmp_path, frozen):
    with pytest.raises(PublishedError, match="never rewritten"):
        freeze(tmp_path / "made-up.toml", "b" * 40, tmp_path / "out")


def test_a_source_file_must_say_where_its_table_was_published(tmp_path):
    src = tmp_path / "nameless.toml"
    src.write_text(SOURCE.replace('url = "https://example.org/table"\n', ""))
    with pytest.raises(PublishedError, match="url"):
        freeze(src, "a" * 40, tmp_path / "out")


def test_the_cli_refuses_a_bad_source_with_one_sentence_and_status_2(tmp_path, capsys):
    src = tmp_path / "bad.toml"
    src.write_text("[source]\ntitle = 'x'\n")
    assert main([str(src)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_first_seen_is_read_from_the_frozen_file_and_now_is_predicted_again(frozen):
    # Pretend the model of that commit predicted the DDP run 25% too fast, inside its interval.
    ddp = frozen["points"][0]
    ddp.update(predicted=3750.0, speed_error=0.25, low=3500.0, high=4000.0)
    block = preregistered_block([frozen])
    assert block["points"] == 2 and block["sources"] == 1
    first = block["first_seen"]
    assert first["too_fast"] + first["too_slow"] == 2
    step_error = abs(frozen["points"][1]["speed_error"])
    assert first["median_abs_error"] == pytest.approx((0.25 + step_error) / 2)
    now = predict_point(ddp["point"])
    assert block["by_source"]["made-up"]["now"]["median_abs_error"] == pytest.approx(
        (abs(now["speed_error"]) + step_error) / 2)


def test_coverage_counts_a_point_without_an_interval_as_outside():
    inside = {"published": 10.0, "low": 9.0, "high": 11.0, "speed_error": 0.05}
    outside = {"published": 10.0, "low": 11.0, "high": 12.0, "speed_error": 0.15}
    bare = {"published": 10.0, "low": None, "high": None, "speed_error": -0.1}
    s = summarise([inside, outside, bare])
    assert s["coverage"] == pytest.approx(1 / 3)
    assert (s["too_fast"], s["too_slow"]) == (2, 1)


def test_the_text_block_puts_first_seen_before_now(frozen):
    lines = format_block(preregistered_block([frozen]))
    assert "2 runs from 1 sources" in lines[0]
    assert lines[1].strip().startswith("first seen") and lines[2].strip().startswith("now")


def test_model_commit_refuses_uncommitted_model_code(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "zero_sim").mkdir()
    (tmp_path / "zero_sim" / "m.py").write_text("x = 1\n")
    env = ["-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", *env, "add", "."], cwd=tmp_path, check=True)
    subprocess.run(["git", *env, "commit", "-qm", "m"], cwd=tmp_path, check=True)
    assert re.fullmatch(r"[0-9a-f]{40}", model_commit(tmp_path))
    (tmp_path / "zero_sim" / "m.py").write_text("x = 2\n")
    with pytest.raises(PublishedError, match="commit the model first"):
        model_commit(tmp_path)


# The shipped files ------------------------------------------------------------------------------

SHIPPED = sorted(FROZEN_DIR.glob("*.json"))


def test_every_shipped_file_parses_names_a_commit_and_has_its_source_file():
    for path in SHIPPED:
        f = json.loads(path.read_text())
        assert re.fullmatch(r"[0-9a-f]{40}", f["model_commit"]), path.name
        assert f["source"]["url"] and f["source"]["table"] and f["points"], path.name
        assert (SOURCES_DIR / f"{path.stem}.toml").exists(), path.name
    assert len(load_frozen()) == len(SHIPPED)


def _history_available() -> str | None:
    """Why the files' history cannot be read here, or None."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return "no git history here (not a git checkout)"
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT,
                             capture_output=True, text=True)
    if shallow.returncode != 0 or shallow.stdout.strip() == "true":
        return "a shallow clone: a file's first commit may be missing"
    return None


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_each_shipped_file_was_written_in_one_commit_and_never_edited(path):
    if (why := _history_available()):
        pytest.skip(why)
    log = subprocess.run(["git", "log", "--follow", "--format=%H", "--", str(path.relative_to(ROOT))],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    uncommitted = subprocess.run(["git", "status", "--porcelain", "--", str(path.relative_to(ROOT))],
                                 cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    if not log and uncommitted:
        pytest.skip(f"{path.name} is not committed yet")
    assert len(log) == 1, f"{path.name} changed in {len(log)} commits; a pre-registered file is never edited"
    assert not uncommitted, f"{path.name} has uncommitted edits"
