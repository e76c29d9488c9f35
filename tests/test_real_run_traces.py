"""Real-run traces that the profiling tools people already use can read.

``train.py --trace`` writes one torch.profiler trace per rank to
``<out>/traces/rank<r>.pt.trace.json``: a folder of their own (HTA reads every ``.json`` in
the folder it is given, and TensorBoard's plugin only ``*.pt.trace.json`` files), profiled on
a schedule that skips step 0 and records every later step as a ``ProfilerStep#<n>`` span, and
labelled with ``record_function`` spans named as the simulator names its ops (``fwd L1``,
``bwd L1``, ``opt B0``, ``all_reduce B0``, ``wait all_reduce B0``).

A small ddp run on two gloo ranks is launched once for the module and read from several
angles; an fsdp-torch run shows the overlay reading collectives back from the new place, and
from the old one (``trace_rank<r>.json`` beside ``run.json``) for run folders written before.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest
from real_runs_helpers import launch_retrying_native_abort

from real_runs.launch import clear_outputs, launch
from real_runs.train import profiler_schedule
from sim2real.overlay import load_run, measured_step
from sim2real.overlay.traces import trace_file
from zero_sim.vocabulary import COMPUTE, bwd, fwd, parse_op_name

# HTA 0.5 calls pandas with keywords pandas 3 deprecates; that noise is not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword")

# Small enough that two ranks on two cores finish in seconds; 0.1 MB buckets make several.
RUN = dict(model="nano", global_batch=8, seq_len=32, steps=4, seed=3, lr=1e-3, bucket_mb=0.1)
PROFILED = list(range(1, RUN["steps"]))  # every step but the first
TRACES = ["rank0.pt.trace.json", "rank1.pt.trace.json"]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("traced") / "ddp"
    run = launch_retrying_native_abort("ddp", 2, out=out, trace=True, timeout_s=120, **RUN)
    return run, out


def trace_of(out, rank: int) -> dict:
    return json.loads((out / "traces" / f"rank{rank}.pt.trace.json").read_text())


def spans(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


def vocabulary_labels(trace: dict) -> list[dict]:
    """The trace's ``record_function`` spans whose names are op names of the shared vocabulary."""
    out = []
    for e in spans(trace):
        if e.get("cat") == "user_annotation":
            try:
                parse_op_name(e["name"])
            except ValueError:
                continue
            out.append(e)
    return out


def recorded(out, rank: int, steps: list[int]) -> list[dict]:
    ops = json.loads((out / f"rank{rank}.json").read_text())["ops"]
    return [op for op in ops if op["step"] in steps]


# --- 1. Where the files are -------------------------------------------------------------------

@pytest.mark.slow
def test_a_traced_run_writes_one_trace_per_rank_in_a_folder_of_their_own(ddp_run):
    run, out = ddp_run
    assert sorted(p.name for p in (out / "traces").iterdir()) == TRACES
    assert not list(out.glob("trace_rank*.json"))  # nothing beside run.json for HTA to mistake
    assert [f for f in run["files"] if f.startswith("traces/")] == [f"traces/{t}" for t in TRACES]
    for rank in (0, 1):  # torch names the rank in each file, which is how HTA tells them apart
        info = trace_of(out, rank)["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (rank, 2, "gloo")


def test_the_schedule_skips_the_warm_up_step_the_overlay_skips():
    assert profiler_schedule(4) == {"wait": 0, "warmup": 1, "active": 3}
    assert profiler_schedule(1) == {"wait": 0, "warmup": 0, "active": 1}  # the only step is the one compared


def test_a_new_run_clears_the_previous_runs_traces(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    for name in ("rank0.pt.trace.json", ".rank1.pt.trace.json.123.tmp"):
        (traces / name).write_text("{}")
    clear_outputs(tmp_path)
    assert list(traces.iterdir()) == []


def test_profile_memory_without_trace_is_refused_in_one_sentence(tmp_path):
    with pytest.raises(ValueError) as refused:
        launch("ddp", nproc=2, out=tmp_path, profile_memory=True, **RUN)
    assert str(refused.value) == ("--profile-memory adds memory events to the --trace profiler traces; "
                                  "add --trace too.")


# --- 2. What is in them ---------------------------------------------------------------------

@pytest.mark.slow
def test_each_profiled_step_is_a_profiler_step_and_its_work_is_labelled_as_the_simulator_names_it(ddp_run):
    _, out = ddp_run
    for rank in (0, 1):
        trace = trace_of(out, rank)
        steps = {int(e["name"][len("ProfilerStep#"):]): e for e in spans(trace)
                 if e["name"].startswith("ProfilerStep#")}
        assert sorted(steps) == PROFILED
        labels = vocabulary_labels(trace)
        names = Counter(e["name"] for e in labels)
        assert names[fwd(1)] == names[bwd(1)] == len(PROFILED)
        assert {parse_op_name(n).kind for n in names} >= {"fwd", "bwd", "opt", "all_reduce", "wait"}
        # One label for every op the rank file holds for those steps: compute spans, host
        # waits, and each collective's launch.
        assert names == Counter(op["name"] for op in recorded(out, rank, PROFILED))
        for e in labels:  # every label lies inside a profiled step
            assert any(s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"]
                       for s in steps.values())


# --- 3. Holistic Trace Analysis ------------------------------------------------------------

@pytest.mark.slow
def test_hta_reads_the_folder_with_every_rank_and_step_and_the_recorded_compute(ddp_run):
    """HTA parses both files and finds each rank (``distributedInfo``) and every profiled step.

    HTA 0.5's analyses measure GPU kernels, and a gloo run on CPU has none (every event is a
    CPU op, on HTA's stream -1): the kernel breakdown is empty and the temporal breakdown
    stops inside HTA on its empty kernel table.  What HTA does read meaningfully is the CPU
    side: its parsed events hold the vocabulary labels, one per compute op the rank file
    recorded for the same steps, each lasting as long as the recorded op.  The last step is
    complete (the trace is written after it), so HTA is asked to keep it."""
    from hta.trace_analysis import TraceAnalysis

    _, out = ddp_run
    analysis = TraceAnalysis(trace_dir=str(out / "traces"), include_last_profiler_step=True)
    assert analysis.t.get_ranks() == [0, 1]
    assert analysis.get_profiler_steps() == PROFILED
    symbols = analysis.t.symbol_table.get_sym_table()
    for rank in (0, 1):
        assert analysis.t.meta_data[rank]["distributedInfo"]["rank"] == rank
        df = analysis.t.get_trace(rank)
        assert (df["stream"] == -1).all()  # CPU ops only: no GPU kernels for HTA's GPU analyses
        names = df["name"].map(lambda i: symbols[i])
        assert sorted(df.loc[names.str.startswith("ProfilerStep#"), "iteration"]) == PROFILED
        compute = df[names.map(lambda n: n.split(" ")[0] in ("fwd", "bwd", "opt"))]
        hta_spans = sorted(zip(compute["iteration"], compute["name"].map(symbols.__getitem__),
                               compute["ts"], compute["dur"] / 1e6, strict=True))
        rec_spans = sorted((op["step"], op["name"], op["start_s"], op["end_s"] - op["start_s"])
                           for op in recorded(out, rank, PROFILED) if op["stream"] == COMPUTE)
        assert [s[:2] for s in hta_spans] == [s[:2] for s in rec_spans]  # the same ops, step by step
        # Each label opens before the recorder's start stamp and closes after its end stamp, so
        # it holds the recorded span; what it adds is the label's own cost, plus any moment the
        # watcher thread took the interpreter in between, which a busy box makes now and then.
        extra_s = [h[3] - r[3] for h, r in zip(hta_spans, rec_spans, strict=True)]
        assert min(extra_s) > -2e-6  # the profiler keeps microseconds
        assert sorted(extra_s)[len(extra_s) // 2] < 1e-4
    kernels, _ = analysis.get_gpu_kernel_breakdown(visualize=False)
    assert kernels.empty
    with pytest.raises(IndexError):  # HTA 0.5 on a trace with no GPU kernels
        analysis.get_temporal_breakdown(visualize=False)


# --- 4. The overlay reads them back ------------------------------------------------------

@pytest.mark.slow
def test_load_run_reads_a_traced_run(ddp_run):
    _, out = ddp_run
    run = load_run(out)  # ddp records its own collectives: the traces are left alone
    assert run.world_size == 2 and not run.notes
    assert set(run.ops["source"]) == {"record"}


@pytest.mark.slow
def test_collectives_are_read_from_the_traces_folder_and_from_the_old_name(tmp_path):
    """fsdp-torch records compute only; its collectives come from the traces, for the profiled
    steps, which include the step the overlay compares.  A run folder of the older layout,
    ``trace_rank<r>.json`` beside ``run.json``, is read the same way."""
    out = tmp_path / "fsdp-torch"
    launch_retrying_native_abort("fsdp-torch", 2, out=out, trace=True, timeout_s=120, **{**RUN, "steps": 3})
    run = load_run(out)
    comm = run.ops[run.ops["stream"] == "comm"]
    assert set(comm["source"]) == {"trace"} and set(comm["step"]) == {1, 2}
    assert any("read from traces/rank0.pt.trace.json" in n for n in run.notes)
    step = measured_step(run)
    assert (step.ops["stream"] == "comm").any()

    old = tmp_path / "old"
    shutil.copytree(out, old)
    for rank in (0, 1):
        (old / "traces" / f"rank{rank}.pt.trace.json").rename(old / f"trace_rank{rank}.json")
    (old / "traces").rmdir()
    again = load_run(old)
    assert any("read from trace_rank0.json" in n for n in again.notes)
    old_comm = again.ops[again.ops["stream"] == "comm"].reset_index(drop=True)
    assert old_comm.equals(comm.reset_index(drop=True))


def test_a_ranks_trace_is_found_at_its_new_place_first_then_at_the_old_name(tmp_path):
    assert trace_file(tmp_path, 0) is None
    (tmp_path / "trace_rank0.json").write_text("{}")
    assert trace_file(tmp_path, 0) == tmp_path / "trace_rank0.json"
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "rank0.pt.trace.json").write_text("{}")
    assert trace_file(tmp_path, 0) == tmp_path / "traces" / "rank0.pt.trace.json"
    assert trace_file(tmp_path, 1) is None


# --- 5. Memory ------------------------------------------------------------------------------

@pytest.mark.slow
def test_profile_memory_adds_allocations_and_shapes_to_the_trace(tmp_path):
    out = tmp_path / "mem"
    launch_retrying_native_abort("ddp", 1, out=out, trace=True, profile_memory=True, timeout_s=120,
                                 **{**RUN, "steps": 2})
    trace = json.loads((out / "traces" / "rank0.pt.trace.json").read_text())
    memory = [e for e in trace["traceEvents"] if e.get("name") == "[memory]"]
    assert memory and all("Bytes" in e["args"] for e in memory)
    assert any("Input Dims" in e.get("args", {}) for e in spans(trace))
