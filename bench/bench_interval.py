"""What the propagated 80% interval costs: CPU seconds of ``simulate()`` with it and without it,
side by side in this one run, and their ratio (goal, issue "Speed predictions that hold on runs
the model has never seen": at most 3x a plain simulate).

    python bench/bench_interval.py

Each case is simulated without the interval (``interval=False``) and with it, alternately,
``REPEATS`` times; the medians of CPU time (``time.process_time``: other work on the machine
does not count) are printed with the ratio.  Prints figures; asserts nothing.
"""

from __future__ import annotations

import statistics
import time

from zero_sim import simulate

REPEATS = 3
LLAMA = dict(model="llama3-8b", micro_batch=1, seq_len=4096)
CASES = [
    ("zero1, 256 GPUs, p5-efa, grad-accum 1", dict(LLAMA, strategy="zero1", topology="p5-efa", gpus=256)),
    ("zero1, 8 GPUs, p5-efa, grad-accum 32",
     dict(LLAMA, strategy="zero1", topology="p5-efa", gpus=8, grad_accum=32)),
    ("zero3 + ZeRO++, 64 GPUs, ib-400", dict(LLAMA, strategy="zero3", topology="ib-400", gpus=64,
                                             zero_quantized_weights=True, zero_hpz_partition_size=8,
                                             zero_quantized_gradients=True)),
    ("fsdp, 16 GPUs, dgx-h100", dict(LLAMA, strategy="fsdp", topology="dgx-h100", gpus=16)),
    ("ddp gpt3-175b, 1024 GPUs, dgx-a100", dict(model="gpt3-175b", strategy="ddp", topology="dgx-a100",
                                                gpus=1024, micro_batch=1)),
]


def cpu_seconds(settings: dict, interval: bool) -> float:
    start = time.process_time()
    simulate(**settings, interval=interval)
    return time.process_time() - start


def main() -> None:
    print(f"{'case':42} {'plain s':>8} {'with interval s':>16} {'ratio':>6}")
    ratios = []
    for name, settings in CASES:
        simulate(**settings, steps=1)  # warm the caches (presets, collective plans) before timing
        plain, with_interval = [], []
        for _ in range(REPEATS):
            plain.append(cpu_seconds(settings, False))
            with_interval.append(cpu_seconds(settings, True))
        a, b = statistics.median(plain), statistics.median(with_interval)
        ratios.append(b / a)
        print(f"{name:42} {a:8.3f} {b:16.3f} {b / a:6.2f}")
    print(f"largest ratio {max(ratios):.2f} (goal: at most 3)")


if __name__ == "__main__":
    main()
