#!/usr/bin/env bash
# DiT training in little GPU memory, measured on a machine with an NVIDIA GPU
# (docs/PERFORMANCE.md, "Less memory on one GPU"): everything on the GPU, then
# --offload --recompute 0 with the CPU's threads at 16, 8 and 4, the plan
# --max-gpu-memory 8G picks, and for comparison device shares of a quarter and
# all and the host not paced. Each line: images/s, peak GPU memory and the
# CPU's update time a step; a table last. --check PATH first runs that
# test_offload program on the GPU (offload against plain training, fp32 and
# bf16, at every device share).
#   tools/offload_gpu.sh path/to/diffusion [--model DiT-XL/2] [--batch 64] [--out DIR] [--check PATH]
set -u
BIN=${1:?usage: tools/offload_gpu.sh path/to/diffusion [--model NAME] [--batch N] [--out DIR]}
shift
MODEL=DiT-XL/2 BATCH=64 OUT=runs/offload-gpu CHECK=
while [ $# -gt 0 ]; do
  case $1 in
    --check) CHECK=$2; shift 2;;
    --model) MODEL=$2; shift 2;;
    --batch) BATCH=$2; shift 2;;
    --out) OUT=$2; shift 2;;
    -h|--help) sed -n '2,10p' "$0"; exit 0;;
    *) echo "offload_gpu: unknown argument $1" >&2; exit 2;;
  esac
done
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
B=(bench --model "$MODEL" --batch "$BATCH" --iters 5 --warmup 2 --sample-batch 0)
rows=()
if [ -n "$CHECK" ]; then
  for mode in cuda-fp32 cuda; do
    if "$CHECK" $mode > "$OUT/test_offload_$mode.log" 2>&1; then r=PASS; else r=FAIL; fi
    grep -E "^FAIL" "$OUT/test_offload_$mode.log" | head -5
    rows+=("test_offload $mode | $r: $(tail -1 "$OUT/test_offload_$mode.log")")
  done
fi
run() {  # name, threads (empty: all), then the extra flags
  local name=$1 threads=$2; shift 2
  local log="$OUT/$(echo "$name" | tr -c 'A-Za-z0-9\n' '_').txt"
  if [ -n "$threads" ]; then OMP_NUM_THREADS=$threads "$BIN" "${B[@]}" "$@" > "$log" 2>&1
  else "$BIN" "${B[@]}" "$@" > "$log" 2>&1; fi || { rows+=("$name | failed: $(tail -1 "$log")"); return; }
  local ips peak upd
  ips=$(grep -oE '[0-9.]+ img/s' "$log" | head -1)
  peak=$(grep -oE 'peak GPU [0-9.]+ GiB' "$log" | head -1)
  upd=$(grep -oE 'CPU updates for [0-9.]+ ms' "$log" | head -1)
  rows+=("$name | $ips | $peak | ${upd:-}")
  echo "== $name: $ips, $peak ${upd:+, $upd}"
  grep -E '^(plan|offload)' "$log"
}
run "everything on the GPU" ""
run "--offload --recompute 0, all threads" "" --offload --recompute 0
run "--offload --recompute 0, 8 threads" 8 --offload --recompute 0
run "--offload --recompute 0, 4 threads" 4 --offload --recompute 0
run "--max-gpu-memory 8G" "" --max-gpu-memory 8G
DC_OFFLOAD_DEVICE_SHARE=0.25 run "--offload --recompute 0, a quarter on the device" "" --offload --recompute 0
DC_OFFLOAD_DEVICE_SHARE=1 run "--offload --recompute 0, all on the device" "" --offload --recompute 0
DC_OFFLOAD_PACE=0 run "--offload --recompute 0, host not paced" "" --offload --recompute 0
echo
echo "==== $MODEL, batch $BATCH ($(head -1 "$OUT/gpu.txt"))"
for r in "${rows[@]}"; do echo "  $r"; done
