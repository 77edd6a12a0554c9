#!/usr/bin/env bash
# `train --update-in-backward` through the CLI, on the CPU: without clipping
# a run writes the same checkpoint bytes as plain training, and resumes
# across both ways end there too; with clipping it says it takes two passes a
# step and its loss log matches plain training's steps (the clipping factor
# may differ in its last bits); it is refused beside gradient accumulation,
# --offload, ZeRO or several ranks, naming what is wrong.
source "$(dirname "$0")/lib.sh"
small_data "$TMP/data.safetensors"
tiny=()  # TINY with the batch in one micro-batch
for ((i = 0; i < ${#TINY[@]}; i++)); do
  if [ "${TINY[i]}" = --micro-batch ]; then i=$((i + 1)); else tiny+=("${TINY[i]}"); fi
done
flags=("${tiny[@]}" --data "$TMP/data.safetensors" --device cpu --warmup 2 --seed 3 --keep 10 --ckpt-every 2)
train_run plain "${flags[@]}" --out "$TMP/plain" --steps 4 --grad-clip 0
train_run fused "${flags[@]}" --out "$TMP/fused" --steps 4 --grad-clip 0 --update-in-backward
grep -q "updating each unit in the backward" "$TMP/fused.log" && pass "the run says it updates in the backward" \
  || fail "the run's log does not say it updates in the backward"
for s in 0000002 0000004; do
  if cmp -s "$TMP/plain/step_$s.safetensors" "$TMP/fused/step_$s.safetensors"; then
    pass "step $s: the checkpoint is byte-identical to plain training's"
  else
    fail "step $s: the checkpoint differs from plain training's"
  fi
done
if cmp -s "$TMP/plain/step_0000002.safetensors" "$TMP/plain/step_0000004.safetensors"; then
  fail "checkpoints of steps 2 and 4 are identical (the comparison above proves nothing)"
fi
resume_across --update-in-backward "$TMP/plain/step_0000004.safetensors" "${flags[@]}" --grad-clip 0
# clipping: two passes a step, the same training within the clipping factor's last bits (AdamW's
# update is blind to a gradient's scale where eps is small: eps 1 makes the clipping show)
train_run clip_p "${flags[@]}" --out "$TMP/cp" --steps 3 --grad-clip 0.05 --adam-eps 1 --log-every 1
train_run clip_f "${flags[@]}" --out "$TMP/cf" --steps 3 --grad-clip 0.05 --adam-eps 1 --log-every 1 --update-in-backward
grep -q "two passes a step" "$TMP/clip_f.log" && pass "with clipping the run says it takes two passes" \
  || fail "with clipping the log does not say two passes: $(grep -i backward "$TMP/clip_f.log")"
if awk -F, 'NR == FNR { if (FNR > 1) a[FNR] = $2; next }
            FNR > 1 { d = $2 - a[FNR]; if (d < 0) d = -d; if (!(d <= 1e-5 * ($2 < 0 ? -$2 : $2) + 1e-9)) bad = 1; n++ }
            END { exit bad || n != 3 }' "$TMP/cp/loss.csv" "$TMP/cf/loss.csv"; then
  pass "with clipping each step's loss matches plain training's"
else
  fail "with clipping the losses differ: $(paste -d' ' "$TMP/cp/loss.csv" "$TMP/cf/loss.csv")"
fi
expect_fail "--update-in-backward with accumulation" "one micro-batch" \
  diffusion train "${flags[@]}" --micro-batch 4 --out "$TMP/a" --update-in-backward
expect_fail "--update-in-backward with --offload" "choose one" \
  diffusion train "${flags[@]}" --out "$TMP/o" --update-in-backward --offload
expect_fail "--update-in-backward with --zero" "--update-in-backward runs on one rank" \
  diffusion train "${flags[@]}" --out "$TMP/z" --update-in-backward --zero 1 --ranks 2
expect_fail "--update-in-backward on several ranks" "--update-in-backward runs on one rank" \
  diffusion train "${flags[@]}" --out "$TMP/r" --update-in-backward --ranks 2
finish
