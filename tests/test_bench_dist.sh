#!/usr/bin/env bash
# `diffusion bench` data parallel on the CPU (--ranks N --device cpu): the
# same ranks, socket communicator and trainer as `train --ranks N`, so the
# path that `bench --gpus N` takes on GPUs runs here. Rank 0 alone prints a
# training line for all ranks and the ZeRO state line; the flags that cannot
# work are refused before anything starts.
source "$(dirname "$0")/lib.sh"
# The demo DiT (0.03 GFLOP an image): a few steps take well under a second.
Q=(--batch 4 --iters 2 --warmup 1 --threads 1 --device cpu)

# ---- flags
expect_fail "--zero 3" "--zero 3: the stages are 0, 1 and 2" diffusion bench --zero 3
expect_fail "--zero on one rank" "--zero 1 shards the state over several ranks" diffusion bench "${Q[@]}" --zero 1
expect_fail "--ranks with --gpus" "give one" diffusion bench --ranks 2 --gpus 2
expect_fail "--gpus on the CPU" "with --device cpu use --ranks N" diffusion bench --gpus 2 --device cpu
expect_fail "negative --ranks" "--ranks must be 1 or more" diffusion bench --ranks -1
expect_fail "--comm-timeout 0" "--comm-timeout must be at least 1 second" diffusion bench --ranks 2 --comm-timeout 0
if ! nvidia-smi -L > /dev/null 2>&1; then
  expect_fail "--gpus without a GPU" "GPU" diffusion bench --gpus 2
fi
expect_fail "--ranks against the launcher's count" "--ranks 3, but torchrun started 2 ranks" \
  env RANK=0 WORLD_SIZE=2 "$BIN" bench --ranks 3
expect_code 2 "a bad flag is a usage error" diffusion bench --ranks 2 --zero 5

# ---- one rank: today's lines, and a ZeRO line of stage 0
diffusion bench "${Q[@]}" --sample-batch 0 > "$TMP/one.txt" 2> "$TMP/one.err" || fail "one rank: $(tail -2 "$TMP/one.err")"
grep -qE '^train   batch    4 +[0-9.]+ img/s' "$TMP/one.txt" && pass "one rank: the single-rank train line" \
  || fail "one rank: no train line in: $(cat "$TMP/one.txt")"
grep -qE '^zero    stage 0 on 1 rank,.*\(100\.0% of stage 0' "$TMP/one.txt" && pass "one rank: the ZeRO line" \
  || fail "one rank: no ZeRO line in: $(cat "$TMP/one.txt")"

# ---- two ranks, every stage
# check_run FILE STAGE: one "ranks", one "train" and one "zero" line (only rank 0 prints), the
# figures positive and finite, total img/s = ranks x per-rank = global batch / step time, and the
# state the stage keeps per rank (stage 0: all of it; 1 and 2 less, 2 less than 1).
check_run() {
  local f=$1 z=$2
  local n; n=$(grep -cE '^(ranks|train|zero|sample) ' "$f")
  [ "$n" -eq 3 ] || { fail "--zero $z: $n result lines, expected 3 (ranks, train, zero): $(cat "$f")"; return; }
  grep -qE "^ranks   2, sockets, ZeRO stage $z, batch 4 per rank \(8 per step\)" "$f" \
    || { fail "--zero $z: ranks line: $(grep '^ranks' "$f")"; return; }
  awk -v z="$z" '
    /^train/ {
      if (!match($0, /batch +4 x 2 ranks +[0-9.]+ img\/s total +[0-9.]+ img\/s per rank +[0-9.]+ ms\/step/)) bad = "train line"
      split(substr($0, RSTART, RLENGTH), w, / +/)
      tot = w[6] + 0; per = w[9] + 0; ms = w[13] + 0
      if (!(tot > 0 && per > 0 && ms > 0)) bad = "a figure is not positive"
      else if (tot / per < 1.99 || tot / per > 2.01) bad = sprintf("total %g is not 2 x per rank %g", tot, per)
      else if (tot * ms / 1000 < 7.6 || tot * ms / 1000 > 8.4) bad = sprintf("%g img/s x %g ms is not 8 images", tot, ms)
      if ($0 !~ /peak RSS [0-9.]+ GiB \(max over ranks\)$/) bad = "memory"
      if ($0 ~ /nan|inf/) bad = "nan"
    }
    /^zero/ {
      if (!match($0, /state [0-9.]+ MiB \([0-9.]+% of stage 0/)) { bad = "zero line"; next }
      split(substr($0, RSTART, RLENGTH), w, / +/); sub(/\(/, "", w[4]); pct = w[4] + 0
      if ($0 !~ "^zero    stage " z " on 2 ranks") bad = "zero stage"
      else if (z == 0 && pct != 100) bad = "stage 0 is not 100% of itself"
      else if (z > 0 && !(pct > 0 && pct < 100)) bad = sprintf("stage %d keeps %g%% of stage 0", z, pct)
      print pct > "/dev/stderr"
    }
    END { if (bad) { print bad; exit 1 } }' "$f" 2> "$TMP/pct$z" > "$TMP/why" \
    && pass "--ranks 2 --zero $z: $(grep -oE '[0-9.]+ img/s total' "$f"), state $(cat "$TMP/pct$z")% of stage 0" \
    || fail "--ranks 2 --zero $z: $(cat "$TMP/why"): $(cat "$f")"
}
for z in 0 1 2; do
  if diffusion bench "${Q[@]}" --ranks 2 --zero $z > "$TMP/z$z.txt" 2> "$TMP/z$z.err"; then
    check_run "$TMP/z$z.txt" $z
  else
    fail "--ranks 2 --zero $z: exit $?: $(tail -3 "$TMP/z$z.err")"
  fi
done
# ---- gradients summed in bf16: said on the ranks line, their bf16 copies in the state's gradients
expect_code 2 "--grad-comm fp16 is a usage error" diffusion bench --ranks 2 --grad-comm fp16
grads_mib() { grep -oE '^zero .*grads [0-9.]+ MiB' "$1" | grep -oE '[0-9.]+ MiB$' | grep -oE '[0-9.]+'; }
for z in 0 2; do
  if diffusion bench "${Q[@]}" --ranks 2 --zero $z --grad-comm bf16 > "$TMP/b$z.txt" 2> "$TMP/b$z.err"; then
    g16=$(grads_mib "$TMP/b$z.txt") g32=$(grads_mib "$TMP/z$z.txt")
    grep -qE "^ranks   2, sockets, ZeRO stage $z, .*gradients summed in bf16" "$TMP/b$z.txt" \
      && grep -qE '^train .*img/s total' "$TMP/b$z.txt" && awk -v a="$g16" -v b="$g32" 'BEGIN { exit !(a > b) }' \
      && pass "--ranks 2 --zero $z --grad-comm bf16: gradients $g16 MiB a rank with their bf16 copies ($g32 in fp32)" \
      || fail "--ranks 2 --zero $z --grad-comm bf16: $(cat "$TMP/b$z.txt")"
  else
    fail "--ranks 2 --zero $z --grad-comm bf16: exit $?: $(tail -3 "$TMP/b$z.err")"
  fi
done
p1=$(cat "$TMP/pct1" 2> /dev/null || echo 0) p2=$(cat "$TMP/pct2" 2> /dev/null || echo 100)
awk -v a="$p1" -v b="$p2" 'BEGIN { exit !(b < a) }' && pass "stage 2 keeps less per rank than stage 1 ($p2% < $p1%)" \
  || fail "stage 2 keeps $p2% of stage 0, stage 1 $p1%"
finish
