"""A behaviour snapshot: every figure the simulator gives for fifty-five scenarios, in one file.

    python bench/snapshot.py > out/snapshot-before.txt
    ... restructure ...
    python bench/snapshot.py > out/snapshot-after.txt && cmp out/snapshot-*.txt

A refactoring that claims "behaviour unchanged" is checked by comparing two snapshots byte for
byte.  Each scenario prints its metrics and its scenario record as sorted JSON (floats in full
``repr`` precision), and the SHA-256 of its op records, memory events, notes and both trace formats; the end
prints ``zero-sim validate --published --json``'s figures the same way.  The scenarios cross
models, every strategy, GPU topologies (NVSwitch, PCIe, InfiniBand, EFA), the emulated CPU
cluster with a CPU calibration (gloo's in-flight calls, per-call CPU cost, paces while
computing) and the knobs each strategy owns.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import replace

from zero_sim import simulate
from zero_sim.calibration import Calibration, CollectiveFit, ComputeCalibration, CpuCalibration
from zero_sim.kineto import rank_traces

GPU_BASES = [
    dict(model="gpt2-124m", gpus=8, topology="pcie"),
    dict(model="gpt2-1.5b", gpus=16, topology="dgx-a100"),
    dict(model="llama3-8b", gpus=64, topology="dgx-h100", seq_len=2048, micro_batch=2),
    dict(model="roberta-10b", gpus=64, topology="p4d-efa", micro_batch=8, recompute="full"),
    dict(model="llama2-7b", gpus=8, topology="ib-h100", micro_batch=1, explicit_ranks=True),
]
STRATEGIES = ["ddp", "zero1", "zero2", "zero3", "fsdp"]
KNOB_CASES = [
    dict(strategy="ddp", bucket_mb=1.0, gradient_as_bucket_view=True),
    dict(strategy="ddp", grad_accum=4, bandwidth_gbps=25.0),
    dict(strategy="ddp", straggler_prob=0.2, straggler_ms=3.0, seed=7, steps=3),
    dict(strategy="zero1", zero1_reduce="all_reduce", overlap_comm=False),
    dict(strategy="zero2", zero2_launch="step", bucket_mb=0.0),
    dict(strategy="zero2", compiled_backward=True, recompute="selective"),
    dict(strategy="zero3", batch_collectives=False, fine_grained_sync=False, precomputed_fetch=False),
    dict(strategy="zero3", prefetch=2, reduce_bucket_size=50_000_000, overlap_comm=False),
    dict(strategy="fsdp", reshard_after_forward=False, backward_prefetch="post", forward_prefetch=True),
    dict(strategy="fsdp", hybrid=True, copies="fsdp2", update="per_unit"),
    dict(strategy="fsdp", limit_all_gathers=False, param_dtype="fp32", attention="eager",
         elementwise="eager"),
    dict(strategy="fsdp", wrap="none", recompute="op", precision="fp32"),
    dict(strategy="ddp", efficiency=0.4, overlap_slowdown=0.0, gpu_spread=0.05, host_overhead_us=30.0),
    dict(strategy="zero2", params="3B", seq_len=4096, micro_batch=1, gpu="H200"),
    dict(strategy="fsdp", layers=10, hidden=2048, heads=16, kv_heads=4, ffn_hidden=5632),
]
KNOB_BASE = dict(model="gpt2-350m", gpus=16, topology="dgx-a100")


def cpu_calibration(n: int) -> Calibration:
    """A calibration like `zero-sim calibrate` writes on the emulated cluster: fits with queued
    latency, a layer table and the CPU section, for ``n`` ranks."""
    fits = {k: CollectiveFit(k, n, 8e-4, 60e6, 0.0, queued_latency_s=5e-4)
            for k in ("all_reduce", "reduce_scatter", "all_gather")}
    compute = ComputeCalibration({"embedding": {"fwd": 1e-3, "bwd": 2e-3},
                                  "block": {"fwd": 10e-3, "bwd": 20e-3},
                                  "head": {"fwd": 5e-3, "bwd": 10e-3}}, 4096, 1e-8, n, 2, 1.1, "small")
    cpu = CpuCalibration(3e-4, 0.25, n, cores=2, call_cpu_s=2e-4, streaming_cores=0.4,
                         comm_rate_while_computing=0.6, comm_bytes_rate_while_computing=0.8)
    return Calibration(fits, compute, "gloo", {"host": "snapshot"}, cpu=cpu)


def cpu_cases():
    base = dict(model="gpt2-124m", micro_batch=1, seq_len=256, topology="emu-uniform", gpus_per_node=1,
                gpu="CPU", backend="gloo", precision="fp32")
    for n in (2, 4):
        for strategy in STRATEGIES:
            yield f"cpu-cal n={n} {strategy}", dict(base, gpus=n, strategy=strategy,
                                                    calibration=cpu_calibration(n))
    yield "cpu-plain zero2 hook", dict(base, gpus=4, strategy="zero2", bucket_mb=0.0)
    # GPU ranks given a CPU calibration: its shared-core costs wrap the GPU device.
    for strategy in ("ddp", "fsdp"):
        yield f"gpu-with-cpu-cal n=2 {strategy}", dict(model="gpt2-124m", micro_batch=1, seq_len=256, gpus=2,
                                                       topology="dgx-a100", backend="gloo", strategy=strategy,
                                                       calibration=cpu_calibration(2))
    yield "cpu-two-nodes fsdp", dict(base, gpus=4, topology="emu-two-nodes", gpus_per_node=2, strategy="fsdp")
    yield "cpu-cal no-queue ddp", dict(base, gpus=2, strategy="ddp", calibration=replace(
        cpu_calibration(2), collectives={k: replace(f, queued_latency_s=None)
                                         for k, f in cpu_calibration(2).collectives.items()}))


def cases():
    for base in GPU_BASES:
        for strategy in STRATEGIES:
            name = f"{base['model']} {base['topology']} N={base['gpus']} {strategy}"
            yield name, dict(base, strategy=strategy)
    for i, knobs in enumerate(KNOB_CASES):
        yield f"knobs-{i} " + " ".join(f"{k}={v}" for k, v in knobs.items()), dict(KNOB_BASE, **knobs)
    yield from cpu_cases()


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()


def scenario_dict(scenario) -> dict:
    # The typed scenario's JSON form, or the plain dict older code returned.
    return scenario.to_dict() if hasattr(scenario, "to_dict") else dict(scenario)


def snapshot_case(name: str, settings: dict) -> str:
    try:
        result = simulate(**settings)
    except Exception as exc:  # a refusal is behaviour too
        return f"== {name}\nrefused: {type(exc).__name__}: {exc}\n"
    return (f"== {name}\n"
            f"metrics {json.dumps(result.metrics, sort_keys=True, default=repr)}\n"
            f"scenario {json.dumps(scenario_dict(result.scenario), sort_keys=True, default=repr)}\n"
            f"ops {digest(result.ops)} memory {digest(result.memory)} notes {digest(result.notes)} "
            f"window {result.window!r} ranks {list(result.simulated_ranks)!r} events {result.events}\n"
            f"perfetto {digest(result.to_chrome_trace())} kineto {digest(rank_traces(result))}\n")


def published() -> str:
    from zero_sim.published.judge import judge

    return "== validate --published\n" + json.dumps(judge().to_dict(), sort_keys=True, default=repr) + "\n"


def main() -> None:
    count = 0
    for name, settings in cases():
        sys.stdout.write(snapshot_case(name, settings))
        count += 1
    sys.stdout.write(published())
    print(f"# {count} scenarios", file=sys.stderr)


if __name__ == "__main__":
    main()
