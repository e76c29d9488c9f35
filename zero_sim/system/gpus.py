"""What each accelerator is, as data: peak FLOP/s, HBM bandwidth, the memory torch reports, and
what its kernels reach (the per-op compute model's profile), each figure with its source.

:mod:`zero_sim.system.hardware` turns these figures into seconds per op; docs/compute.md
tabulates them with their sources and the sweeps the fitted ones came from.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1024**3
MiB = 1024**2
GB = 1e9


@dataclass(frozen=True)
class ComputeProfile:
    """What a GPU's kernels reach, for the per-op model (fractions of the GPU's peaks)."""

    gemm_max: float  # maximum achievable matmul FLOPs (MAMF) / peak
    gemm_fill_us: float  # GEMM fill time scale: a GEMM whose ideal time is this runs at e_max / 2
    flash_max: float  # FlashAttention fwd+bwd at long sequences, head dim >= 128, no mask / peak
    hbm_efficiency: float  # achievable fraction of HBM bandwidth (stream copy)
    source: str = ""
    # What eager PyTorch's element-wise and normalization kernels reach (None: the stream copy's).
    elementwise_efficiency: float | None = None


@dataclass(frozen=True)
class GPU:
    name: str
    peak_tflops: float  # dense bf16 (fp16 on the V100, which has no bf16 tensor cores)
    hbm_bytes: int  # what torch.cuda.get_device_properties().total_memory reports
    hbm_gbps: float  # GB/s
    source: str = ""
    profile: ComputeProfile | None = None  # None: no per-op model (the flat roofline only)
    # Dense FP8 (e4m3/e5m2) tensor-core peak from the vendor's data sheet, half the "with sparsity"
    # figure; None: no FP8 tensor cores (V100, A100, the CPU), so ``--precision fp8`` is refused.
    fp8_tflops: float | None = None

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12

    @property
    def fp8_peak_flops(self) -> float | None:
        return None if self.fp8_tflops is None else self.fp8_tflops * 1e12


# GEMM e_max: stas00/ml-engineering, compute/accelerator/README.md, "Maximum Achievable Matmul
# FLOPS comparison table" (BF16, mean of 100 iterations, best shape); where a GPU is missing
# there, the best square bf16/fp16 torch.matmul of zzc0721/torch-performance-test-data
# (database.md and its issues; sizes 1024..10240).
# GEMM fill: fitted (least squares in log) to cuBLAS size sweeps: V100 fp16 squares
# (torch-performance-test-data issue #140), A100 fp16 1024^3 and 1152^3 (triton-lang/triton
# issue #7085), H100 M=2048 N=K=512..8192 (triton issue #2339) and bf16 squares
# (torch-performance-test-data issue #79), B200 bf16 squares 1024..8192 (pytorch/ao PR #2427).
# Fitted fills: V100 14.3 us, A100 14.3 us, H100 12.8 us, B200 4.8 us; GPUs with no sweep take
# their generation's (Hopper 13) or 14 us.
# flash_max: FA2 figures (attention_kernels.FLASH_CURVES): A100 205/312 = 0.657, H100 344/989 = 0.348.  B200:
# FlashAttention-4 (CuTe DSL) fwd 1535 and bwd 1360 TFLOP/s at seqlen 8k, head dim 128
# (flash-attention PR #2280) -> 1406 fwd+bwd -> 0.640 at long sequences.  GPUs with no
# attention benchmark here take A100's ratio to its GEMMs (0.657 / 0.869 = 0.756) times their
# e_max; Hopper variants take H100's (0.348 / 0.803 = 0.433).
# hbm_efficiency: device-to-device copy 1355 GB/s on an A100-40GB of 1555 (0.87;
# PTsolvers/gpu-workshop-JuliaCon23 issue #7), used for every NVIDIA part; MI300X 0.80 is an
# assumption (AMD: the 5.3 TB/s "is the theoretical peak, not achievable with real-world tests",
# ROCm/rocm_bandwidth_test issue #121; no measured figure found).
# elementwise_efficiency: the median achieved fraction of HBM bandwidth of Liger-Kernel's PyTorch
# baselines at 16M-67M elements (linkedin/Liger-Kernel benchmark/data/all_benchmark_data.csv;
# bytes counted per kernel; docs/compute.md): A100-SXM4-80GB 0.555 (native LayerNorm fp32
# 0.51-0.54, Llama RMSNorm chain 0.57-0.62), H100 80GB HBM3 0.75 (LayerNorm 0.52-0.61, ReLU^2
# 0.75-0.86, add + RMSNorm chain 0.74-0.82).  Parts with no such benchmark take their
# generation's measured part's ratio to the stream copy: A100's (0.555 / 0.87 = 0.64) before
# Hopper, H100's (0.75 / 0.87 = 0.86) after; with the same copy fraction (0.87), its value.
_A100_ELEMENTWISE = 0.555
_H100_ELEMENTWISE = 0.75
# One profile per chip: the A100's two memory sizes, and the H100 SXM's two, share their kernels.
_A100_SXM = ComputeProfile(0.869, 14.0, 0.657, 0.87,
                           "e_max: MAMF 271.2 of 312 (A100 SXM); fill fitted 14.3 us; FA2 A100 figures",
                           _A100_ELEMENTWISE)
_H100_SXM = ComputeProfile(0.803, 13.0, 0.348, 0.87,
                           "e_max: MAMF 794.5 of 989 (H100 SXM); fill fitted 12.8 us; FA2 H100 figures",
                           _H100_ELEMENTWISE)

# Dense FP8 tensor-core peaks, TFLOP/s: each vendor data sheet's FP8 figure "with sparsity" halved
# (docs/fp8.md).  NVIDIA H100 SXM 3,958 (so 1,979); H100 PCIe 3,026 (1,513); H200 3,958 (1,979);
# HGX/DGX B200 72 PFLOP/s FP8 for 8 GPUs with sparsity (4,500 dense per GPU; pytorch/ao's
# roofline_utils takes the same 4.5e15); L40S 1,466 (733); AMD MI300X 5,229.8 with sparsity, 2,614.9
# dense.  The 96 GB H100 of Meta's hosts is an H100 SXM and takes its peak (pytorch/ao roofline_utils:
# "fp8_peak_tops": 1979e12 for "NVIDIA H100").  Volta and Ampere (V100, A100) have no FP8 tensor cores.
FP8_DENSE_TFLOPS = {"H100": 1979.0, "H100-PCIe": 1513.0, "H200": 1979.0, "B200": 4500.0, "L40S": 733.0,
                    "MI300X": 2614.9}

_A100_ATTN_PER_GEMM = _A100_SXM.flash_max / _A100_SXM.gemm_max
_HOPPER_ATTN_PER_GEMM = _H100_SXM.flash_max / _H100_SXM.gemm_max

GPUS: dict[str, GPU] = {
    "V100": GPU(
        "V100", 125.0, 34089730048, 900.0,
        "NVIDIA V100 SXM2 data sheet: 125 TFLOP/s fp16 tensor cores (no bf16 tensor cores), 900 GB/s; "
        "deviceQuery on a Tesla V100-SXM2-32GB: 32510 MBytes (34089730048 bytes)",
        ComputeProfile(0.77, 14.0, 0.77 * _A100_ATTN_PER_GEMM, 0.87,
                       "e_max: fp16 squares peak at 94.8-97.4 TFLOP/s (torch-performance-test-data "
                       "database.md and issue #140); fill fitted 14.3 us", _A100_ELEMENTWISE)),
    "A100-40GB": GPU(
        "A100-40GB", 312.0, 42298834944, 1555.0,
        "NVIDIA A100 data sheet: 312 TFLOP/s bf16 dense, 40GB HBM2 1,555 GB/s; deviceQuery on an "
        "A100-SXM4-40GB: 40339 MBytes (42298834944 bytes) (bottlerocket-os/bottlerocket PR #3873)",
        _A100_SXM),
    "A100-80GB": GPU(
        "A100-80GB", 312.0, 81251 * MiB, 2039.0,
        "NVIDIA A100 data sheet: 312 TFLOP/s bf16 dense, 80GB HBM2e 2,039 GB/s (SXM); deviceQuery on an "
        "A100-SXM4-80GB: 81251 MBytes (nvidia-smi shows 81920 MiB, modal-labs/modal-client PR #2797)",
        _A100_SXM),
    "H100": GPU(
        "H100", 989.0, 81089 * MiB, 3350.0,
        "NVIDIA H100 SXM data sheet: 1,979 TFLOP/s bf16 with sparsity = 989 dense, 3.35 TB/s; torch "
        "_CudaDeviceProperties(name='NVIDIA H100 80GB HBM3', total_memory=81089MB) (81082-81090 seen)",
        _H100_SXM, FP8_DENSE_TFLOPS["H100"]),
    # The 96 GB HBM2e SXM part of Meta's Grand Teton hosts (torchtitan's H100 benchmarks), run at
    # a 500 W limit: the bandwidth its benchmark page states, the capacity torch reports there, and
    # what PyTorch's own roofline measured on "Meta's H100 variant" (pytorch/ao PR #668,
    # torchao/testing/training/roofline_utils.py): large GEMMs at 0.78 of 989 ("experimental
    # observation with sample large inputs"), pointwise Triton kernels at 0.92 of 2.4 TB/s.
    # FlashAttention and the eager element-wise kernels take the 700 W H100's (no measurement).
    "H100-96GB": GPU(
        "H100-96GB", 989.0, int(95.0396 * 2**30), 2400.0,
        "H100 SXM with 96 GB of HBM2e at 2.4 TB/s, 500 W (pytorch/torchtitan benchmarks/"
        "llama3_h100_202412_torchtitan.md, Grand Teton); total_memory 95.0396 GiB as "
        "pytorch/torchtitan#165 reports; GEMM and copy fractions measured by pytorch/ao PR #668",
        ComputeProfile(0.78, 13.0, 0.348, 0.92,
                       "e_max 0.78 and copies 0.92 on Meta's H100 variant (pytorch/ao roofline_utils); "
                       "fill, attention and element-wise kernels as H100", _H100_ELEMENTWISE),
        FP8_DENSE_TFLOPS["H100"]),
    "H100-PCIe": GPU(
        "H100-PCIe", 756.0, 81008 * MiB, 2000.0,
        "NVIDIA H100 PCIe data sheet: 1,513 TFLOP/s bf16 with sparsity = 756 dense, 2 TB/s HBM2e; torch "
        "_CudaDeviceProperties(name='NVIDIA H100 PCIe', total_memory=81008MB)",
        ComputeProfile(0.656, 13.0, 0.656 * _HOPPER_ATTN_PER_GEMM, 0.87,
                       "e_max: bf16 squares peak at 495.9 of 756 (torch-performance-test-data database.md)"
                       "; fill and attention as H100", _H100_ELEMENTWISE),
        FP8_DENSE_TFLOPS["H100-PCIe"]),
    "H200": GPU(
        "H200", 989.0, 143156 * MiB, 4800.0,
        "NVIDIA H200 data sheet: 989 TFLOP/s bf16 dense, 141 GB HBM3e at 4.8 TB/s; torch "
        "_CudaDeviceProperties(name='NVIDIA H200', total_memory=143156MB)",
        ComputeProfile(0.803, 13.0, 0.348, 0.87,
                       "e_max: MAMF table says H200 is the same as H100 SXM (bf16 squares 790.3 of 989 "
                       "in torch-performance-test-data); fill and attention as H100", _H100_ELEMENTWISE),
        FP8_DENSE_TFLOPS["H200"]),
    "B200": GPU(
        "B200", 2250.0, 182631 * MiB, 8000.0,
        "NVIDIA DGX B200 data sheet: 2.25 PFLOP/s bf16 dense per GPU, 180 GB HBM3e at 8 TB/s; torch "
        "_CudaDeviceProperties(name='NVIDIA B200', total_memory=182631MB) (182642 seen)",
        ComputeProfile(0.776, 5.0, 0.640, 0.87,
                       "e_max: MAMF 1745 of 2250 (B200 SXM); fill fitted 4.8 us (pytorch/ao PR #2427); "
                       "attention: FlashAttention-4 (flash-attention PR #2280)", _H100_ELEMENTWISE),
        FP8_DENSE_TFLOPS["B200"]),
    "L40S": GPU(
        "L40S", 362.05, 45589 * MiB, 864.0,
        "NVIDIA L40S data sheet: 362.05 TFLOP/s bf16 dense (733 with sparsity), 48 GB GDDR6 at 864 GB/s; "
        "torch _CudaDeviceProperties(name='NVIDIA L40S', total_memory=45589MB)",
        ComputeProfile(0.744, 14.0, 0.744 * _A100_ATTN_PER_GEMM, 0.87,
                       "e_max: bf16 squares peak at 269.2 of 362 (torch-performance-test-data "
                       "database.md); fill and attention ratio assumed as A100's", _A100_ELEMENTWISE),
        FP8_DENSE_TFLOPS["L40S"]),
    "MI300X": GPU(
        "MI300X", 1307.4, 196592 * MiB, 5300.0,
        "AMD Instinct MI300X specifications: 1307.4 TFLOP/s bf16 dense, 192 GB HBM3 at 5.3 TB/s; torch "
        "_CudaDeviceProperties(name='AMD Instinct MI300X', total_memory=196592MB) (ROCm/ROCm issue #4203)",
        ComputeProfile(0.511, 14.0, 0.511 * _A100_ATTN_PER_GEMM, 0.80,
                       "e_max: MAMF 668.4 TFLOP/s (torch 2.5.1, ROCm 6.3, TunableOp); fill and attention "
                       "ratio assumed as A100's; HBM fraction assumed",
                       0.80 * _H100_ELEMENTWISE / _H100_SXM.hbm_efficiency),
        FP8_DENSE_TFLOPS["MI300X"]),
    # One CPU process for gloo runs: an order-of-magnitude stand-in until calibrated.
    "CPU": GPU("CPU", 0.05, 24 * GiB, 10.0,
               "one CPU process for gloo runs: an order-of-magnitude stand-in until calibrated"),
}

# The architecture generation of each GPU: the unit a fitted whole-run overhead is kept per
# (zero_sim.system.run_overheads), since kernels, clocks and drivers age together within one.
GENERATIONS = {"V100": "volta", "A100-40GB": "ampere", "A100-80GB": "ampere", "L40S": "ada",
               "H100": "hopper", "H100-96GB": "hopper", "H100-PCIe": "hopper", "H200": "hopper",
               "B200": "blackwell", "MI300X": "cdna3", "CPU": "cpu"}
