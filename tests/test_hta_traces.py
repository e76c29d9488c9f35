"""Simulated traces that Holistic Trace Analysis reads as it reads the PyTorch profiler's.

A small FSDP run and a small DDP run, every rank simulated, are written one Kineto file per
rank and loaded with ``hta.trace_analysis.TraceAnalysis``.  HTA must then find every rank, link
every kernel to its launch, and report the compute time and the communication overlap that
the simulator's own op lists give under HTA's definitions.  The simulator's steps are all
complete, so HTA is asked to keep the last one (``include_last_profiler_step=True``).
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

pytest.importorskip("hta")
from hta.trace_analysis import TraceAnalysis  # noqa: E402

from zero_sim import simulate  # noqa: E402
from zero_sim.breakdown import length, uncovered, union  # noqa: E402
from zero_sim.kineto import (  # noqa: E402
    COMPUTE_STREAM,
    DEVICE_WORK,
    collective_flows,
    collective_instances,
    gpu_pid,
    host_pid,
    rank_traces,
    us,
    write_rank_traces,
)

# HTA 0.5 calls pandas with keywords pandas 3 deprecates; that noise is not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword")

CASES = {
    "fsdp": dict(model="gpt2-124m", strategy="fsdp", gpus=4, seq_len=256, micro_batch=2, explicit_ranks=True),
    "ddp": dict(model="gpt2-124m", strategy="ddp", gpus=4, seq_len=256, micro_batch=2, explicit_ranks=True),
    "zero2-offload": dict(model="gpt2-124m", strategy="zero2", offload_optimizer="cpu", gpus=4, seq_len=256,
                          micro_batch=2, explicit_ranks=True),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each case's result, its written files and HTA's analysis of them."""
    out = {}
    for name, settings in CASES.items():
        result = simulate(**settings)
        directory = tmp_path_factory.mktemp(name)
        paths = write_rank_traces(result, directory)
        out[name] = (result, paths, TraceAnalysis(trace_dir=str(directory), include_last_profiler_step=True))
    return out


@pytest.fixture(params=sorted(CASES))
def run(request, runs):
    return runs[request.param]


def spans(result, rank: int, kind: str) -> list[tuple[int, int]]:
    """The rank's ops of one kind as whole-microsecond spans, as the files hold them."""
    return [(us(o["start_s"]), us(o["end_s"])) for o in result.ops if o["rank"] == rank and o["kind"] == kind]


def test_every_simulated_rank_is_parsed_with_its_rank(run):
    result, paths, analysis = run
    assert [p.name for p in paths] == [f"rank-{r}.pt.trace.json" for r in result.simulated_ranks]
    assert analysis.t.get_ranks() == result.simulated_ranks
    for rank in result.simulated_ranks:
        info = analysis.t.meta_data[rank]["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (rank, 4, "nccl")


def test_every_kernel_is_on_an_integer_stream_and_linked_to_its_launch(run):
    result, _, analysis = run
    df = analysis.t.get_trace(0)
    kernels = df[df["stream"].ne(-1)]
    device_ops = [o for o in result.ops if o["rank"] == 0 and o["kind"] in DEVICE_WORK]
    assert len(kernels) == len(device_ops)
    others = {o["stream"] for o in device_ops} - {"compute"}  # comm, and the copy streams when offloading
    assert set(kernels["stream"]) == {COMPUTE_STREAM, *range(20, 20 + len(others))}
    assert kernels["index_correlation"].gt(0).all()
    # Through its launch each kernel lands in its own step's ProfilerStep.
    per_step = defaultdict(int)
    for op in device_ops:
        per_step[op["step"]] += 1
    assert kernels["iteration"].value_counts().to_dict() == dict(per_step)


def test_the_host_thread_nests_and_each_launch_falls_in_its_step(runs):
    # Launch times are drawn, not simulated; drawn, they must still nest as a profiler's do.
    result, _, _ = runs["fsdp"]
    for rank, trace in rank_traces(result).items():
        host = sorted((e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == host_pid(rank)),
                      key=lambda e: (e["ts"], -e["dur"]))
        open_ends: list[int] = []
        for e in host:
            open_ends = [end for end in open_ends if end > e["ts"]]
            assert all(e["ts"] + e["dur"] <= end for end in open_ends)
            open_ends.append(e["ts"] + e["dur"])
        steps = {int(e["name"].split("#")[1]): e for e in host if e["name"].startswith("ProfilerStep")}
        kernels = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "kernel"]
        step_of = {e["args"]["correlation"]: e["args"]["step"] for e in kernels}
        for launch in (e for e in host if e["name"] == "cudaLaunchKernel"):
            step = steps[step_of[launch["args"]["correlation"]]]
            assert step["ts"] <= launch["ts"] < step["ts"] + step["dur"]


def test_hta_counts_the_collectives_as_communication(run):
    _, _, analysis = run
    by_type = analysis.get_gpu_kernel_breakdown(visualize=False)[0].set_index("kernel_type")["sum"]
    assert by_type["COMMUNICATION"] > 0 and by_type["COMPUTATION"] > 0


def test_hta_counts_copies_to_and_from_host_memory_as_memory(runs):
    result, _, analysis = runs["zero2-offload"]
    per_kernel = analysis.get_gpu_kernel_breakdown(visualize=False)[1]
    memory = per_kernel[per_kernel["kernel_type"].eq("MEMORY") & per_kernel["rank"].eq(0)]
    assert set(memory["name"]) == {"Memcpy DtoH (Device -> Pinned)", "Memcpy HtoD (Pinned -> Device)"}
    assert memory["sum (us)"].sum() == sum(end - start for start, end in spans(result, 0, "copy"))


def test_temporal_breakdown_compute_is_the_simulated_compute(run):
    # Compute ops share one FIFO stream and never overlap, so HTA's merged compute intervals add
    # up to the sum of the compute ops' durations: exact on the whole-microsecond spans written,
    # and within 1% of the simulator's float durations (each span moves by under 1 us).
    result, _, analysis = run
    breakdown = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    for rank in result.simulated_ranks:
        row = breakdown.loc[rank]
        written = sum(end - start for start, end in spans(result, rank, "compute"))
        simulated = sum(o["end_s"] - o["start_s"] for o in result.ops
                        if o["rank"] == rank and o["kind"] == "compute") * 1e6
        assert row["compute_time(us)"] == written
        assert row["compute_time(us)"] == pytest.approx(simulated, rel=0.01)
        parts = row["idle_time(us)"] + row["compute_time(us)"] + row["non_compute_time(us)"]
        assert parts == row["kernel_time(us)"]


def test_comm_comp_overlap_is_the_simulators_overlap(run):
    # HTA: time when some collective and some compute run together, over the collectives' time;
    # the simulator's comm_overlap_fraction is the same ratio (1 - exposed / comm) over one step.
    result, _, analysis = run
    overlap = analysis.get_comm_comp_overlap(visualize=False).set_index("rank")["comp_comm_overlap_pctg"]
    for rank in result.simulated_ranks:
        comm = union(spans(result, rank, "collective"))
        compute = union(spans(result, rank, "compute"))
        ours = 100 * (1 - uncovered(comm, compute) / length(comm))
        assert overlap[rank] == pytest.approx(ours, abs=0.01)
        # HTA spans both steps, the metric only the reported one; here the warm-up overlaps alike.
        assert overlap[rank] == pytest.approx(100 * result.metrics["comm_overlap_fraction"], abs=2)


def test_flows_link_every_rank_of_each_collective(runs):
    result, paths, _ = runs["fsdp"]
    flows = collective_flows(result.ops)
    pairs = defaultdict(dict)
    for flow in flows:
        pairs[flow["id"]][flow["ph"]] = flow["pid"]
    linked = {(pair["s"], pair["f"]) for pair in pairs.values()}
    for members in collective_instances(result.ops):
        pids = [gpu_pid(op["rank"]) for op in members]
        assert len(pids) == 4
        assert all((a, b) in linked for a, b in zip(pids, pids[1:], strict=False))


def test_each_file_holds_its_flow_ends_inside_its_collectives(runs):
    # Ids agree across the files, so traces merged into one show each arrow whole.
    _, paths, _ = runs["fsdp"]
    ends = defaultdict(list)
    for path in paths:
        events = json.loads(path.read_text())["traceEvents"]
        kernels = [e for e in events if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel")]
        for flow in (e for e in events if e.get("cat") == "collective"):
            ends[flow["id"]].append(flow["ph"])
            assert any(k["tid"] == flow["tid"] and k["ts"] <= flow["ts"] <= k["ts"] + k["dur"]
                       for k in kernels)
    assert all(sorted(phases) == ["f", "s"] for phases in ends.values())


def test_only_simulated_ranks_are_written(tmp_path):
    # Rank 0 standing for 16 identical ranks: one file, which says the world has 16.
    result = simulate(model="gpt2-124m", strategy="ddp", gpus=16, seq_len=256, micro_batch=2)
    paths = write_rank_traces(result, tmp_path)
    assert [p.name for p in paths] == ["rank-0.pt.trace.json"]
    assert json.loads(paths[0].read_text())["distributedInfo"]["world_size"] == 16
