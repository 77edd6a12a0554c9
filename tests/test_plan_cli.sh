#!/usr/bin/env bash
# --max-gpu-memory on `train` and `bench`, on the CPU (where it budgets what
# the backend allocates): the plan is printed and obeyed, the flags given fix
# their part of it, junk sizes and budgets below the smallest plan are refused.
source "$(dirname "$0")/lib.sh"
small_data "$TMP/data.safetensors"
flags=("${TINY[@]}" --data "$TMP/data.safetensors" --device cpu --steps 2 --ckpt-every 2)
bench=(bench --batch 4 --iters 1 --warmup 0 --sample-batch 0 --device cpu --threads 2)
out=$(diffusion "${bench[@]}" --max-gpu-memory 8M 2>&1)
if [[ "$out" == *"plan: micro-batch 4, recompute"*"offload yes: predicted peak"*"of 8.0 MiB"* && "$out" == *"offload device:"* ]]; then
  pass "bench prints and follows an offload plan for 8M"
else
  fail "bench --max-gpu-memory 8M: $out"
fi
out=$(diffusion "${bench[@]}" --max-gpu-memory 1G 2>&1)
[[ "$out" == *"recompute off (all 6 blocks keep activations), offload no"* ]] && pass "bench: 1G keeps everything on the device" \
  || fail "bench --max-gpu-memory 1G: $out"
out=$(diffusion "${bench[@]}" --max-gpu-memory 8M --recompute 0 2>&1)
[[ "$out" == *"plan: micro-batch 4, recompute 0 (0 of 6"* ]] && pass "bench: --recompute fixes its part of the plan" \
  || fail "bench --recompute 0 --max-gpu-memory 8M: $out"
out=$(diffusion train "${flags[@]}" --out "$TMP/t" --max-gpu-memory 2.5M 2>&1)
if [[ $? -eq 0 && "$out" == *"plan: micro-batch"*"of 2.5 MiB"* && -f "$TMP/t/step_0000002.safetensors" ]]; then
  pass "train prints the plan and trains"
else
  fail "train --max-gpu-memory 2.5M: $out"
fi
# TINY gives --micro-batch 4 of --batch 8: left free, 1G would take all 8 at once
out=$(diffusion train "${flags[@]}" --out "$TMP/t2" --max-gpu-memory 1G 2>&1)
[[ "$out" == *"plan: micro-batch 4, recompute off"* ]] && pass "train: --micro-batch fixes its part of the plan" \
  || fail "train --micro-batch 4 --max-gpu-memory 1G: $out"
expect_fail "a budget below the smallest plan" "no training plan fits; the smallest needs" \
  diffusion train "${flags[@]}" --out "$TMP/t3" --max-gpu-memory 100K
[ -e "$TMP/t3/step_0000002.safetensors" ] && fail "a refused plan still trained"
for bad in 8 8GB 0G -1G abc 8G8; do
  expect_code 2 "train --max-gpu-memory $bad is a usage error" diffusion train "${flags[@]}" --out "$TMP/b" --max-gpu-memory "$bad"
  expect_fail "bench --max-gpu-memory $bad" "--max-gpu-memory" diffusion "${bench[@]}" --max-gpu-memory "$bad"
done
finish
