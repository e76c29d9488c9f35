"""The notebooks as a course: their order, in one place.

A newcomer reads the notebooks in this order (the README's "New to ML training?" path and
docs/notebooks.md's table follow it, and ``tests/test_course.py`` checks that they do). Every
notebook ends with :func:`next_in_course`, so its closing cell names the course's next notebook
from this list rather than from a hand-typed one that drifts when the order changes.
"""

from __future__ import annotations

from IPython.display import Markdown

# (notebook stem, what it teaches in a few words), in the order a newcomer should read them:
# first what a step is and where memory goes, then the step played and checked, then each
# strategy's timing in depth, the planner, and last the notebooks that need real runs or traces.
COURSE: tuple[tuple[str, str], ...] = (
    ("00_quickstart", "one simulated step as a timeline, and how to read it"),
    ("01_memory_for_engineers", "where the memory goes, and what each ZeRO stage shards"),
    ("09_play_a_step_and_check_yourself", "one step of DDP and each ZeRO stage played side by side; "
                                          "three exercises that check your answer"),
    ("02_timeline_explorer", "every setting of a step on a slider"),
    ("03_ddp_buckets_and_interconnects", "DDP's gradient buckets, shared PCIe buses and host bridges"),
    ("04_zero2_backward_hooks", "why *when* a reduce-scatter starts matters as much as its size"),
    ("05_zero3_on_slow_networks", "ZeRO-3 when the network is slow, and the fixes that win it back"),
    ("07_planner", "which strategy fits your model on your GPUs, and which is fastest"),
    ("06_real_runs_overlay", "real runs on this machine laid over the prediction"),
    ("08_reading_a_real_trace", "reading a real profiler trace"),
    ("10_bring_your_own_trace", "a profiler trace of your own run, checked against the simulator"),
)
STEMS = tuple(stem for stem, _what in COURSE)


def position(stem: str) -> int:
    """Where ``stem`` sits in the course (0 for the first notebook)."""
    if stem not in STEMS:
        raise ValueError(f"{stem!r} is not a notebook of the course; the course is {', '.join(STEMS)}")
    return STEMS.index(stem)


def next_in_course(stem: str) -> Markdown:
    """The course's path with ``stem`` marked, and the notebook to open next (Markdown for a notebook)."""
    here = position(stem)
    path = " → ".join(f"**{s[:2]}** (you are here)" if i == here else s[:2] for i, s in enumerate(STEMS))
    if here + 1 < len(COURSE):
        following, what = COURSE[here + 1]
        nxt = f"Next in the course: **{following}**: {what}."
    else:
        nxt = "This is the course's last notebook; any of the others is a good place to go back to."
    return Markdown(f"The course, in order: {path}.\n\n{nxt}")


__all__ = ["COURSE", "STEMS", "next_in_course", "position"]
