#!/usr/bin/env bash
# Records, on a machine with one CUDA GPU or more, what the suite checks its GPU predictions against:
#   1. the tests that skip without CUDA (NCCL runs, CUDA events and memory stats, bf16 layer timings);
#   2. a traced real run (DDP, bf16, one GPU) for `zero-sim calibrate --from-trace` and
#      `zero-sim validate --trace`, and the same run untraced (what tracing itself costs);
#   3. per-layer times by CUDA events (`python -m real_runs.microbench layers`) to set beside the trace's;
#   4. the same run untraced at other batch sizes: what a calibration from the trace must predict.
#
# Usage: bash bench/record_on_gpu.sh OUT_DIR
#   MODEL (gpt2-124m), BATCH (8 sequences), OTHER_BATCHES ("4 16"), STEPS (6), PYTHON (python3) change
#   what is recorded; TESTS=0 leaves the tests out.
# Each part has its own time limit; a part that fails is reported and the others still run. Everything
# lands in OUT_DIR, the traces gzipped; `zero-sim calibrate --from-trace OUT_DIR/<run>/traces` reads them.
set -u
out=${1:?usage: bash bench/record_on_gpu.sh OUT_DIR}
model=${MODEL:-gpt2-124m}
batch=${BATCH:-8}
steps=${STEPS:-6}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

part() {  # part NAME SECONDS COMMAND...: run it under a time limit, log to OUT_DIR/NAME.log, say how it went
    local name=$1 limit=$2 t0=$SECONDS rc
    shift 2
    echo "== $name"
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    rc=$?
    echo "   exit $rc after $((SECONDS - t0)) s"
    tail -n 4 "$out/$name.log" | sed 's/^/   | /'
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  nvidia-smi topo -m
  "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl',
torch.cuda.nccl.version(), torch.cuda.get_device_name())"; } > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

[ "${TESTS:-1}" = 0 ] || part gpu_tests 150 "$py" -m pytest -q -p no:cacheprovider \
    "tests/test_real_runs_faults.py::test_one_rank_on_cuda_records_events_and_peak_memory" \
    "tests/test_real_runs_faults.py::test_a_bf16_run_on_cuda_holds_2_2_12_bytes_a_parameter_and_replays" \
    "tests/test_validate.py::test_layer_timings_on_a_gpu_in_bf16_carry_the_gpus_stamp"

run_args=(--strategy ddp-torch --device cuda --nproc 1 --model "$model" --precision bf16 --steps "$steps")
part "ddp_${model}_traced" 100 "$py" -m real_runs.train "${run_args[@]}" --global-batch "$batch" --trace \
    --out "$out/ddp_${model}_traced"
part "ddp_${model}" 60 "$py" -m real_runs.train "${run_args[@]}" --global-batch "$batch" --out "$out/ddp_${model}"
part "layers_${model}" 60 "$py" -m real_runs.microbench --device cuda --nproc 1 layers --model "$model" \
    --micro-batch "$batch" --precision bf16 --out "$out/layers_${model}.json"

for b in ${OTHER_BATCHES-4 16}; do
    part "ddp_${model}_b$b" 60 "$py" -m real_runs.train "${run_args[@]}" --global-batch "$b" \
        --out "$out/ddp_${model}_b$b"
done

gzip -f "$out"/*/traces/*.json 2>/dev/null
du -ah "$out" | sort -h | tail -n 12
