#!/usr/bin/env bash
# Several GPUs, checked on a machine with 2 or more: a short `train --gpus 2`
# run and the same run on one GPU, then their checkpoints compared (NCCL sums
# in its own order and bf16 compute rounds, so: close, not identical), and a
# rank killed mid-run stopping the other within seconds.
# Builds nothing: usage: [DATA=data set] bash tools/dist_gpu.sh path/to/diffusion [steps]
# (DATA: a Fashion-MNIST folder or .safetensors data set; default: train's own default)
set -u
BIN=${1:?usage: bash tools/dist_gpu.sh path/to/diffusion [steps]}
STEPS=${2:-50}
cd "$(dirname "$0")/.."
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
fails=0
C=(--model DiT-S/2 --input-size 32 --batch 64 --micro-batch 32 --log-every 10 --precision fp32 ${DATA:+--data "$DATA"})
A=("${C[@]}" --steps "$STEPS" --ckpt-every "$STEPS")
echo "== 1 GPU"; "$BIN" train "${A[@]}" --out "$OUT/one" || fails=$((fails + 1))
echo "== 2 GPUs"; "$BIN" train "${A[@]}" --gpus 2 --out "$OUT/two" || fails=$((fails + 1))
f=$(printf 'step_%07d.safetensors' "$STEPS")
# fp32 compute: the two runs differ by the order of the gradient sums only
for t in final_layer.linear.weight ema.final_layer.linear.weight blocks.0.attn.qkv.weight train.adam_m; do
  python3 tools/compare_tensors.py "$t" "$OUT/one/$f" "$OUT/two/$f" 1e-4 || fails=$((fails + 1))
done
echo "== kill -9 of rank 1 during a --gpus 2 run: the job must stop within seconds, naming it"
"$BIN" train "${C[@]}" --steps 100000 --ckpt-every 100000 --gpus 2 --out "$OUT/kill" 2> "$OUT/kill.log" & parent=$!
for ((i = 0; i < 600; i++)); do grep -q '^step ' "$OUT/kill.log" && break; sleep 0.1; done
kill -9 "$(pgrep -P $parent | tail -n 1)"; t0=$SECONDS
wait $parent; rc=$?
echo "exit $rc after $((SECONDS - t0)) s: $(tail -n 2 "$OUT/kill.log")"
[ $rc -ne 0 ] && [ $((SECONDS - t0)) -le 30 ] || fails=$((fails + 1))
echo "$fails failed"
exit $((fails > 0))
