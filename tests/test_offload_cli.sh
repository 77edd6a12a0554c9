#!/usr/bin/env bash
# `train --offload` and `bench --offload` through the CLI, on the CPU: an
# offloaded run writes the same checkpoint bytes as a plain one (with
# clipping and micro-batches), resumes across both ways end there too, and
# the flag is refused beside ZeRO or several ranks; the DC_OFFLOAD_* tuning
# variables reach the settings (a device share of 1 updates every unit on the
# device, the others leave the bytes as they are) and malformed ones are
# refused, naming the variable.
source "$(dirname "$0")/lib.sh"
small_data "$TMP/data.safetensors"
flags=("${TINY[@]}" --data "$TMP/data.safetensors" --device cpu --warmup 2 --grad-clip 0.5 --seed 3 --keep 10 --ckpt-every 2)
train_run plain "${flags[@]}" --out "$TMP/plain" --steps 4
train_run off "${flags[@]}" --out "$TMP/off" --steps 4 --offload
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
resume_across --offload "$TMP/plain/step_0000004.safetensors" "${flags[@]}"
# the tuning variables reach offload's settings (they change the schedule, never the bytes)
DC_OFFLOAD_DEFER=0 DC_OFFLOAD_PACE=0 DC_OFFLOAD_HOLD=0 train_run tuned "${flags[@]}" --out "$TMP/tuned" --steps 4 --offload
if cmp -s "$TMP/plain/step_0000004.safetensors" "$TMP/tuned/step_0000004.safetensors"; then
  pass "offload with DC_OFFLOAD_DEFER, _PACE and _HOLD at 0 writes the plain run's checkpoint"
else
  fail "offload with DC_OFFLOAD_DEFER, _PACE and _HOLD at 0 differs from the plain run"
fi
DC_OFFLOAD_HOLD=two expect_fail "a malformed DC_OFFLOAD_HOLD" "DC_OFFLOAD_HOLD=two" diffusion train "${flags[@]}" --out "$TMP/h" --offload
DC_OFFLOAD_DEVICE_SHARE=1.5 expect_fail "DC_OFFLOAD_DEVICE_SHARE above 1" "DC_OFFLOAD_DEVICE_SHARE=1.5" diffusion train "${flags[@]}" --out "$TMP/s" --offload
DC_OFFLOAD_PACE=off expect_fail "DC_OFFLOAD_PACE neither 0 nor 1" "DC_OFFLOAD_PACE=off" diffusion train "${flags[@]}" --out "$TMP/p" --offload
expect_fail "offload with --zero" "--offload runs on one rank" diffusion train "${flags[@]}" --out "$TMP/z" --offload --zero 1 --ranks 2
expect_fail "offload on several ranks" "--offload runs on one rank" diffusion train "${flags[@]}" --out "$TMP/r" --offload --ranks 2
out=$(diffusion bench --batch 2 --iters 1 --warmup 0 --sample-batch 0 --device cpu --threads 2 --offload 2>&1)
if [[ "$out" == *"train   batch"* && "$out" == *"offload device:"* ]]; then pass "bench --offload"; else echo "$out"; fail "bench --offload"; fi
out=$(DC_OFFLOAD_DEVICE_SHARE=1 diffusion bench --batch 2 --iters 1 --warmup 0 --sample-batch 0 --device cpu --threads 2 --offload 2>&1)
if [[ "$out" =~ "offload units: "([0-9]+)" of "([0-9]+)" (100%" && ${BASH_REMATCH[1]} == "${BASH_REMATCH[2]}" ]]; then
  pass "bench --offload with DC_OFFLOAD_DEVICE_SHARE=1 updates every unit on the device"
else
  echo "$out"; fail "bench --offload with DC_OFFLOAD_DEVICE_SHARE=1 did not update every unit on the device"
fi
finish
