"""The allocator CPU ranks start on: jemalloc where it is installed, glibc told to keep
what it frees elsewhere, and a run that says which one it ran on."""

from __future__ import annotations

import subprocess
import sys

from real_runs.allocator import (
    JEMALLOC,
    JEMALLOC_CONF,
    KEEP_FREED_MEMORY,
    allocator_env,
    jemalloc_library,
    ranks_allocator,
)
from real_runs.launch import rank_env


def test_where_jemalloc_is_installed_ranks_preload_it_and_never_purge_freed_pages():
    env = allocator_env({}, library=JEMALLOC)
    assert env["LD_PRELOAD"] == JEMALLOC
    assert env["MALLOC_CONF"] == JEMALLOC_CONF
    # Whatever still calls glibc's malloc keeps what it frees as well.
    assert KEEP_FREED_MEMORY.items() <= env.items()


def test_a_preload_and_jemalloc_options_already_set_are_kept_and_win_where_they_differ():
    theirs = {"LD_PRELOAD": "/opt/lib/libfoo.so", "MALLOC_CONF": "dirty_decay_ms:1000"}
    env = allocator_env(theirs, library=JEMALLOC)
    assert env["LD_PRELOAD"] == f"{JEMALLOC}:/opt/lib/libfoo.so"
    # jemalloc reads options left to right: the caller's come last, so they take effect.
    assert env["MALLOC_CONF"] == f"{JEMALLOC_CONF},dirty_decay_ms:1000"


def test_a_jemalloc_the_caller_preloaded_is_not_preloaded_twice():
    env = allocator_env({"LD_PRELOAD": "/usr/local/lib/libjemalloc.so.2"}, library=JEMALLOC)
    assert env["LD_PRELOAD"] == "/usr/local/lib/libjemalloc.so.2"


def test_a_conda_environments_own_jemalloc_is_preloaded_by_its_path(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / JEMALLOC).write_bytes(b"")
    assert jemalloc_library({"CONDA_PREFIX": str(tmp_path)}) == str(tmp_path / "lib" / JEMALLOC)
    assert allocator_env({"CONDA_PREFIX": str(tmp_path)})["LD_PRELOAD"] == str(tmp_path / "lib" / JEMALLOC)


def test_without_jemalloc_ranks_run_on_glibc_told_to_keep_what_it_frees():
    env = allocator_env({"LD_PRELOAD": "/opt/lib/libfoo.so"}, library=None)
    assert env == KEEP_FREED_MEMORY  # the caller's preload passes through rank_env untouched


def test_a_process_started_with_the_ranks_environment_runs_on_the_allocator_it_was_given():
    probe = "from real_runs.allocator import allocator_in_use; print(allocator_in_use())"
    out = subprocess.run([sys.executable, "-c", probe], env=rank_env(), capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out == ranks_allocator()
