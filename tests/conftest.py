"""Shared fixtures.  ``figures`` prints reproduction figures even when pytest captures output."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture
def figures(capsys):
    def show(*lines: str) -> None:
        with capsys.disabled():
            print()
            for line in lines:
                print("    " + line)

    return show


@pytest.fixture
def data_dir() -> Path:
    return DATA
