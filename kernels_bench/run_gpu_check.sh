#!/usr/bin/env bash
# One prepared GPU check for kernels_bench (< 8 min on an H200): correctness, reduced sweep, fit.
# Usage (repository root): bash kernels_bench/run_gpu_check.sh [OUT_DIR]   (default results/gpu_check)
# Env: PYTHON (default python3, must hold CUDA torch + triton + numpy + xxhash), GPU_PROFILE (default h200),
#      MODEL_PROFILE (default llama-3-8b), SWEEP_TIMEOUT_S (default 420).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${1:-results/gpu_check}
GPU_PROFILE=${GPU_PROFILE:-h200}
MODEL_PROFILE=${MODEL_PROFILE:-llama-3-8b}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
start=$(date +%s)
stamp() { echo "== $(( $(date +%s) - start ))s: $*"; }

stamp "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
"$PY" -c 'import torch, sys; ok = torch.cuda.is_available(); print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0) if ok else None); sys.exit(0 if ok else 3)' \
  || { echo "no CUDA device visible to $PY"; exit 3; }

stamp "correctness (every kernel vs float32 SDPA on fresh random data)"
"$PY" -m kernels_bench.decode_locality --device cuda --check-only --out "$OUT_DIR/check.json" 2>&1 | tee "$OUT_DIR/check.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "correctness FAILED: see $OUT_DIR/check.log"; exit 1; }

stamp "grouped span kernel (feather_grouped's CUDA path) vs gather + SDPA"
"$PY" -m kernels_bench.grouped_spans --device cuda --out "$OUT_DIR/grouped_spans.json" 2>&1 | tee "$OUT_DIR/grouped_spans.log"

stamp "reduced sweep"
timeout "${SWEEP_TIMEOUT_S:-420}" "$PY" -m kernels_bench.decode_locality --device cuda --reduced \
  --out "$OUT_DIR/decode_locality_reduced.json" 2>&1 | tee "$OUT_DIR/sweep.log"
sweep_rc=${PIPESTATUS[0]}
[ "$sweep_rc" -eq 0 ] || { echo "sweep exited $sweep_rc (124 = timed out): see $OUT_DIR/sweep.log"; exit 1; }

stamp "fit -> simulator override (source: measured)"
"$PY" -m kernels_bench.fit "$OUT_DIR/decode_locality_reduced.json" --gpu "$GPU_PROFILE" --model "$MODEL_PROFILE" \
  --out "$OUT_DIR/$GPU_PROFILE-$MODEL_PROFILE.measured.json" 2>&1 | tee "$OUT_DIR/fit.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "fit FAILED: see $OUT_DIR/fit.log"; exit 1; }
"$PY" -m kernels_bench.bytes_table --gpu "$GPU_PROFILE" --model "$MODEL_PROFILE" \
  --override "$OUT_DIR/$GPU_PROFILE-$MODEL_PROFILE.measured.json" | tee "$OUT_DIR/bytes_table.log"
stamp "done; files in $OUT_DIR"
