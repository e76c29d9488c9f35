"""Check the FP8 model's three assumptions on a GPU with FP8 tensor cores (docs/fp8.md).

Needs torch with CUDA, nothing else (not part of ``make bench``).  It prints, for Llama-3-8B's block
projections at 8,192 tokens:

1. bf16 ``torch.mm`` and float8 ``torch._scaled_mm`` (tensorwise scales, e4m3 x e4m3 -> bf16) in
   TFLOP/s, and each as a fraction of the data sheet's dense peak (the model assumes FP8 reaches the
   same fraction of its peak as bf16 of its own);
2. a compiled tensorwise cast (amax, then one kernel writing row- and column-major float8) as GB/s
   over the bytes the model charges (6 an element), against a device-to-device copy;
3. torchao's eager cast chain (abs, max, to(float32), * scale, clamp, to(float8)) as GB/s over the
   33 bytes an element the model charges.

    python bench/fp8_on_gpu.py [--peak-bf16 989 --peak-fp8 1979]
"""

from __future__ import annotations

import argparse

import torch

E4M3 = torch.float8_e4m3fn
MAX = torch.finfo(E4M3).max
# Llama-3-8B block projections (K, N): q, k (and v), o, gate (and up), down.
SHAPES = {"q": (4096, 4096), "k": (4096, 1024), "o": (4096, 4096), "gate": (4096, 14336),
          "down": (14336, 4096)}
TOKENS = 8192


def timed(fn, iters: int = 20) -> float:
    """Seconds per call: the mean of ``iters`` calls after three warm-ups, timed with CUDA events."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def gemms(peak_bf16: float, peak_fp8: float) -> None:
    print(f"GEMMs at M = {TOKENS}: TFLOP/s (fraction of the dense peak)")
    for name, (k, n) in SHAPES.items():
        a = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        flops = 2.0 * TOKENS * k * n
        bf16 = flops / timed(lambda a=a, b=b: torch.mm(a, b.t())) / 1e12
        a8, b8 = a.to(E4M3), b.to(E4M3)  # b8.t() is column-major, as _scaled_mm takes its second operand
        one = torch.tensor(1.0, device="cuda")
        fp8 = flops / timed(lambda a8=a8, b8=b8, one=one: torch._scaled_mm(a8, b8.t(), one, one,
                                                                           out_dtype=torch.bfloat16)) / 1e12
        print(f"  {name:5} K={k:5} N={n:5}: bf16 {bf16:7.1f} ({bf16 / peak_bf16:.3f})  fp8 {fp8:7.1f} "
              f"({fp8 / peak_fp8:.3f})  fp8/bf16 time {bf16 / fp8:.2f}x faster")


def _cast_compiled(x: torch.Tensor):
    scale = MAX / torch.clamp(x.abs().amax().float(), min=1e-12)
    y = (x.float() * scale).clamp(-MAX, MAX).to(E4M3)
    return y, y.t().contiguous().t(), scale


def _cast_eager(x: torch.Tensor):
    amax = torch.max(torch.abs(x))
    scale = MAX / torch.clamp(amax.to(torch.float64), min=1e-12)
    y = x.to(torch.float32) * scale.to(torch.float32)
    return y.clamp(-MAX, MAX).to(E4M3)


def casts() -> None:
    x = torch.randn(TOKENS, 14336, device="cuda", dtype=torch.bfloat16)
    n = x.numel()
    copy = 2 * x.nbytes / timed(lambda: x.clone()) / 1e9
    compiled = torch.compile(_cast_compiled)
    fused = 6 * n / timed(lambda: compiled(x)) / 1e9
    eager = 33 * n / timed(lambda: _cast_eager(x)) / 1e9
    print(f"casts of a {TOKENS} x 14336 bf16 activation: device-to-device copy {copy:,.0f} GB/s; compiled "
          f"cast {fused:,.0f} GB/s over 6 B/element; eager cast {eager:,.0f} GB/s over 33 B/element")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak-bf16", type=float, default=989.0, help="dense bf16 TFLOP/s (H100 SXM: 989)")
    parser.add_argument("--peak-fp8", type=float, default=1979.0, help="dense fp8 TFLOP/s (H100 SXM: 1979)")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(0), torch.__version__)
    gemms(args.peak_bf16, args.peak_fp8)
    casts()


if __name__ == "__main__":
    main()
