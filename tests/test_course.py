"""The course's order lives in one list (zero_sim.ui.course); the README and docs/notebooks.md follow it."""

import re
from pathlib import Path

import pytest

from zero_sim.ui.course import COURSE, STEMS, next_in_course, position

ROOT = Path(__file__).resolve().parents[1]


def test_every_notebook_is_in_the_course_once_and_the_course_names_no_missing_notebook():
    on_disk = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(STEMS) == on_disk
    assert len(set(STEMS)) == len(STEMS)


def test_the_readme_s_path_for_newcomers_is_the_start_of_the_course():
    readme = (ROOT / "README.md").read_text()
    paragraph = next(p for p in readme.split("\n\n") if "New to ML training?" in p)
    named = re.findall(r"`(\d\d_[a-z0-9_]+)`", paragraph)
    assert len(named) >= 3, "the README's newcomer path names at least the first three notebooks"
    assert tuple(named) == STEMS[:len(named)]


def test_docs_notebooks_table_lists_the_course_in_its_order():
    page = (ROOT / "docs" / "notebooks.md").read_text()
    table = page.split("## The order for a newcomer", 1)[1].split("\n\n", 2)[1]
    named = re.findall(r"^\| `(\d\d_[a-z0-9_]+)`", table, flags=re.M)
    assert tuple(named) == STEMS


def test_the_closing_cell_shows_the_whole_path_and_names_the_next_notebook():
    text = next_in_course("00_quickstart").data
    assert "**00** (you are here)" in text
    assert text.index("01") < text.index("09") < text.index("02")
    assert f"Next in the course: **{COURSE[1][0]}**" in text
    assert "last notebook" in next_in_course(STEMS[-1]).data


def test_a_name_outside_the_course_is_refused_with_the_course_named():
    with pytest.raises(ValueError, match="00_quickstart"):
        position("99_nonexistent")
