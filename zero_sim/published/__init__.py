"""Measurements others have published, and how far the simulator's predictions are from them
(:mod:`zero_sim.published.judge`; the data is ``points.toml``)."""

from zero_sim.published.judge import POINTS_FILE, PublishedError, Verdict, format_table, judge, load_points

__all__ = ["POINTS_FILE", "PublishedError", "Verdict", "format_table", "judge", "load_points"]
