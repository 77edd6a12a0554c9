#!/usr/bin/env bash
# `train --offload` and `bench --offload` through the CLI, on the CPU: an
# offloaded run writes the same checkpoint bytes as a plain one (with
# clipping and micro-batches), resumes across both ways end there too, and
# the flag is refused beside ZeRO or several ranks.
source "$(dirname "$0")/lib.sh"
small_data "$TMP/data.safetensors"
flags=("${TINY[@]}" --data "$TMP/data.safetensors" --device cpu --warmup 2 --grad-clip 0.5 --seed 3 --keep 10 --ckpt-every 2)
run() {  # run NAME ARGS...: a training run that must succeed
  local name=$1; shift
  diffusion train "$@" > "$TMP/$name.log" 2>&1 || { cat "$TMP/$name.log"; fail "$name"; finish; }
}
run plain "${flags[@]}" --out "$TMP/plain" --steps 4
run off "${flags[@]}" --out "$TMP/off" --steps 4 --offload
grep -q "offload:" "$TMP/off.log" && pass "the offloaded run says so" || fail "the offloaded run's log does not mention offload"
for s in 0000002 0000004; do
  if cmp -s "$TMP/plain/step_$s.safetensors" "$TMP/off/step_$s.safetensors"; then
    pass "step $s: the offloaded checkpoint is byte-identical to the plain one"
  else
    fail "step $s: the offloaded checkpoint differs from the plain one"
  fi
done
if cmp -s "$TMP/plain/step_0000002.safetensors" "$TMP/plain/step_0000004.safetensors"; then
  fail "checkpoints of steps 2 and 4 are identical (the comparison above proves nothing)"
fi
# resume across: plain -> offload and offload -> plain
run half_p "${flags[@]}" --out "$TMP/hp" --steps 2
run half_o "${flags[@]}" --out "$TMP/ho" --steps 2 --offload
run p_to_o --resume "$TMP/hp" --steps 4 --threads 2 --offload
run o_to_p --resume "$TMP/ho" --steps 4 --threads 2
for d in hp ho; do
  if cmp -s "$TMP/plain/step_0000004.safetensors" "$TMP/$d/step_0000004.safetensors"; then
    pass "resumed across ($d) ends byte-identical to the straight run"
  else
    fail "resumed across ($d) differs from the straight run"
  fi
done
expect_fail "offload with --zero" "--offload runs on one rank" diffusion train "${flags[@]}" --out "$TMP/z" --offload --zero 1 --ranks 2
expect_fail "offload on several ranks" "--offload runs on one rank" diffusion train "${flags[@]}" --out "$TMP/r" --offload --ranks 2
out=$(diffusion bench --batch 2 --iters 1 --warmup 0 --sample-batch 0 --device cpu --threads 2 --offload 2>&1)
if [[ "$out" == *"train   batch"* && "$out" == *"offload device:"* ]]; then pass "bench --offload"; else echo "$out"; fail "bench --offload"; fi
finish
