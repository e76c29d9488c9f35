"""Invariants that hold for every valid scenario, checked on random ones (hypothesis)."""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zero_sim import simulate
from zero_sim.engine.network import FluidNetwork
from zero_sim.system.collectives import bus_factor

STRATEGY_KNOBS = {
    "ddp": st.fixed_dictionaries({"bucket_mb": st.sampled_from([1.0, 5.0, 25.0, 100.0])}),
    "zero1": st.fixed_dictionaries({"bucket_mb": st.sampled_from([5.0, 25.0]),
                                    "zero1_reduce": st.sampled_from(["reduce_scatter", "all_reduce"])}),
    "zero2": st.fixed_dictionaries({"bucket_mb": st.sampled_from([0.0, 25.0]),
                                    "zero2_launch": st.sampled_from(["hook", "step"]),
                                    "compiled_backward": st.booleans()}),
    "zero3": st.fixed_dictionaries({"prefetch": st.integers(0, 3), "batch_collectives": st.booleans(),
                                    "fine_grained_sync": st.booleans(), "precomputed_fetch": st.booleans()}),
    "fsdp": st.fixed_dictionaries({"reshard_after_forward": st.booleans(),
                                   "backward_prefetch": st.sampled_from(["pre", "post", "none"]),
                                   "forward_prefetch": st.booleans(), "limit_all_gathers": st.booleans()}),
}


@st.composite
def scenarios(draw):
    strategy = draw(st.sampled_from(sorted(STRATEGY_KNOBS)))
    return dict(
        strategy=strategy,
        params=draw(st.sampled_from([20_000_000, 60_000_000])),
        seq_len=draw(st.sampled_from([256, 512])),
        micro_batch=draw(st.integers(1, 4)),
        grad_accum=draw(st.integers(1, 2)),
        gpus=draw(st.sampled_from([2, 4, 8])),
        topology=draw(st.sampled_from(["dgx-a100", "pcie", "pcie-host-bridge", "p4d-efa"])),
        recompute=draw(st.sampled_from(["none", "full"])),
        explicit_ranks=True,
        **draw(STRATEGY_KNOBS[strategy]),
    )


FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(scenarios())
def test_ops_on_one_stream_never_overlap(kw):
    result = simulate(**kw)
    lanes = defaultdict(list)
    for op in result.ops:
        if op["stream"] != "host":
            lanes[(op["rank"], op["stream"])].append((op["start_s"], op["end_s"]))
    for spans in lanes.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end - 1e-12


@FAST
@given(scenarios())
def test_a_collective_has_one_start_and_one_end_on_all_members(kw):
    result = simulate(**kw)
    by_key = defaultdict(list)
    for op in result.ops:
        if op["kind"] == "collective":
            by_key[(op["step"], op["stream"], op["name"])].append(op)
    for ops in by_key.values():
        # Ops of one name repeat within a step (per tensor); the k-th of each rank is one collective.
        per_rank = defaultdict(list)
        for op in ops:
            per_rank[op["rank"]].append((op["start_s"], op["end_s"]))
        columns = list(zip(*[sorted(v) for v in per_rank.values()], strict=True))
        for spans in columns:
            assert len({round(s, 12) for s, _ in spans}) == 1
            assert len({round(e, 12) for _, e in spans}) == 1


@FAST
@given(scenarios())
def test_bytes_moved_equal_the_strategys_theoretical_volume(kw):
    result = simulate(**kw)
    n, psi = kw["gpus"], result.metrics["params"]
    volume = result.metrics["comm_volume_bytes"]
    grad = 2  # bf16 gradients and weights (mixed precision)
    ar, rs = bus_factor("all_reduce", n), bus_factor("reduce_scatter", n)
    syncs = kw["grad_accum"]
    expected = {
        "ddp": ar * psi * grad,
        "zero1": (ar if kw.get("zero1_reduce") == "all_reduce" else rs) * psi * grad + rs * psi * grad,
        "zero2": rs * psi * grad * (syncs if kw.get("zero2_launch") == "hook" else 1) + rs * psi * grad,
    }.get(kw["strategy"])
    if expected is None:  # zero3 and fsdp: at least the 2 Psi of a ZeRO-2, at most 3 Psi per micro-step
        assert rs * psi * grad * 2 * syncs * 0.99 <= volume <= rs * psi * grad * 3 * syncs * 1.01
    else:
        assert volume == pytest.approx(expected, rel=1e-6)


@FAST
@given(scenarios(), st.sampled_from([10.0, 50.0, 200.0]))
def test_more_bandwidth_never_gives_a_slower_step(kw, gbps):
    slow = simulate(**kw, bandwidth_gbps=gbps).metrics["step_time_s"]
    fast = simulate(**kw, bandwidth_gbps=gbps * 2).metrics["step_time_s"]
    assert fast <= slow * (1 + 1e-9)


@FAST
@given(scenarios())
def test_memory_never_goes_negative_and_returns_to_its_start_at_step_end(kw):
    result = simulate(**kw)
    start = {}
    last = {}
    for m in result.memory:
        if m["rank"] != 0:
            continue
        assert m["bytes"] >= 0, m
        start.setdefault(m["category"], m["bytes"])
        last[m["category"]] = m["bytes"]
    assert last == start
    mem = result.metrics["memory"]
    assert start["params"] + start["grads"] + start["optimizer"] == mem["model_states_bytes"]


@FAST
@given(scenarios())
def test_collapsing_symmetric_ranks_changes_nothing(kw):
    explicit = simulate(**kw).metrics
    collapsed = simulate(**(kw | {"explicit_ranks": False})).metrics
    assert collapsed["step_time_s"] == pytest.approx(explicit["step_time_s"], rel=1e-9)
    assert collapsed["memory"] == explicit["memory"]


class _RerateAll(FluidNetwork):
    """The fluid network as it was: whenever a transfer starts or ends, every transfer's remaining
    bytes brought up to date and every transfer re-rated."""

    def _touched(self, flow):
        return None

    def _reshare(self, touched):
        now = self.env.now
        for flow, rate in zip(self.active, self._rates(), strict=True):
            if flow.rate:
                flow.remaining = max(0.0, flow.remaining - flow.rate * (now - flow.last))
            flow.last = now
            if rate != flow.rate:
                flow.rate, flow.version = rate, flow.version + 1
                timer = self.env.timeout(flow.remaining / rate)
                timer.callbacks.append(lambda _ev, f=flow, v=flow.version: self._finish(f, v))


LINKS = ["a", "b", "c", "d"]
TRANSFERS = st.lists(st.tuples(
    st.floats(0.0, 2.0),  # when it starts
    st.lists(st.tuples(st.sampled_from(LINKS), st.integers(1, 3)), max_size=3,
             unique_by=lambda load: load[0]),  # its links and loads (none: a latency)
    st.floats(0.1, 50.0),  # its bytes per edge
    st.sampled_from([math.inf, 5.0, 20.0]),  # its cap
    st.sampled_from([None, "x", "y"]),  # its caller
), min_size=1, max_size=12)


def _finish_times(network_class, transfers) -> list[float]:
    env = simpy.Environment()
    links = {name: SimpleNamespace(capacity=float(10 + 7 * i)) for i, name in enumerate(LINKS)}
    net = network_class(env, SimpleNamespace(links=links))
    ends = [0.0] * len(transfers)

    def run(i, start, loads, nbytes, cap, caller):
        yield env.timeout(start)
        yield net.transfer(tuple(loads), nbytes, cap, caller)
        ends[i] = env.now

    for i, transfer in enumerate(transfers):
        env.process(run(i, *transfer))
    env.run()
    return ends


@FAST
@given(TRANSFERS)
def test_re_rating_only_the_transfers_sharing_a_link_or_caller_changes_no_finish_time(transfers):
    # The network re-rates only the transfers a start or an end can slow or speed up, and brings a
    # transfer's remaining bytes up to date only when its rate changes; every finish time must be
    # the very float that updating and re-rating all of them at every change gives.
    ends = _finish_times(FluidNetwork, transfers)
    assert ends == _finish_times(_RerateAll, transfers)
    assert all(end >= start for end, (start, *_) in zip(ends, transfers, strict=True))
