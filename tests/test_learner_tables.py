"""What a learner reads under a planner table: named columns, formatted numbers, and every knob explained."""

import math

import pandas as pd

from zero_sim.strategies import all_knobs
from zero_sim.ui.knob_words import GLOSSARY_TERM, knob_meanings, knob_names
from zero_sim.ui.tables import LIKELY, readable
from zero_sim.vocabulary.glossary import entry


def test_a_table_keeps_the_columns_asked_for_named_in_words_with_numbers_a_reader_can_read():
    df = pd.DataFrame({"strategy": ["fsdp", "ddp"], "tokens_per_s": [176417.971219, math.nan],
                       "tokens_per_s_low": [150000.2, math.nan], "tokens_per_s_high": [190000.9, math.nan],
                       "step_ms": [1243.25, math.nan], "reserved_GB": [20.94, 156.1], "noise": [1, 2]})
    shown = readable(df, ["strategy", "step_ms", "tokens_per_s", "tokens_per_s_low", "tokens_per_s_high",
                          "reserved_GB"])
    assert list(shown.columns) == ["strategy", "step (ms)", "tokens/s", LIKELY, "reserved (GB)"]
    assert shown.iloc[0].tolist() == ["fsdp", "1,243", "176,418", "150,000-190,001", "20.9"]
    # Nothing fits: a dash, never NaN.
    assert shown.iloc[1].tolist() == ["ddp", "-", "-", "-", "156.1"]


def test_every_knob_a_row_names_gets_its_meaning_and_a_glossary_link_where_the_glossary_has_one():
    labels = ["reshard_after_forward=False", "defaults", "copies=none, update=per_unit", "hybrid=True"]
    assert knob_names(labels) == ["reshard_after_forward", "copies", "update", "hybrid"]
    text = knob_meanings(labels).data
    for name in ("reshard_after_forward", "copies", "update", "hybrid"):
        line = next(line for line in text.splitlines() if line.startswith(f"* `{name}`"))
        assert all_knobs()[name][0][1].help in line and "glossary.md#" in line
    assert text.startswith("`defaults`")


def test_every_glossary_term_a_knob_points_to_exists_and_names_a_real_knob():
    for knob, term in GLOSSARY_TERM.items():
        assert knob in all_knobs(), knob
        assert entry(term).meaning
