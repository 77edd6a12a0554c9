#!/usr/bin/env bash
# Exact resume: 4 steps straight, and 2 steps + resume + 2 steps, must give
# byte-identical checkpoints (weights, EMA, moments and metadata).
source "$(dirname "$0")/lib.sh"
flags=("${TINY[@]}" --warmup 3 --grad-clip 0.5 --hflip --seed 7 --ckpt-every 1 --keep 10 --log-every 1)
$BIN train "${flags[@]}" --out "$TMP/a" --steps 4 > "$TMP/a.log" 2>&1 || { cat "$TMP/a.log"; fail "straight run"; finish; }
$BIN train "${flags[@]}" --out "$TMP/b" --steps 2 > "$TMP/b.log" 2>&1 || { cat "$TMP/b.log"; fail "first half"; finish; }
$BIN train --resume "$TMP/b" --steps 4 --threads 2 > "$TMP/c.log" 2>&1 || { cat "$TMP/c.log"; fail "resume"; finish; }
if cmp -s "$TMP/a/step_0000004.safetensors" "$TMP/b/step_0000004.safetensors"; then
  pass "resumed run is byte-identical to the straight run"
else
  fail "resumed run differs from the straight run"
fi
# the straight run changes the weights at every step (the test can fail)
if cmp -s "$TMP/a/step_0000003.safetensors" "$TMP/a/step_0000004.safetensors"; then
  fail "checkpoints of steps 3 and 4 are identical"
else
  pass "weights move between steps"
fi
# Ctrl-C: the step in progress ends, a checkpoint is written, resuming is exact
$BIN train "${flags[@]}" --out "$TMP/i" --steps 100000 --ckpt-every 100000 > "$TMP/i.log" 2>&1 &
pid=$!; sleep 1; kill -INT $pid; wait $pid; rc=$?
ck=$(ls "$TMP/i"/step_*.safetensors 2>/dev/null | tail -n 1)
if [ "$rc" -eq 130 ] && [ -n "$ck" ]; then
  pass "SIGINT writes a checkpoint ($(basename "$ck")) and exits 130"
  k=$(basename "$ck" .safetensors); k=$((10#${k#step_})); m=$((k + 3))
  $BIN train --resume "$TMP/i" --steps $m --threads 2 > /dev/null 2>&1
  $BIN train "${flags[@]}" --out "$TMP/j" --steps $m --ckpt-every 100000 > /dev/null 2>&1
  f=$(printf 'step_%07d.safetensors' $m)
  # the two runs differ only in the recorded plan (steps): compare all tensor bytes
  if [ -s "$TMP/j/$f" ] && cmp -s <(st_data "$TMP/i/$f") <(st_data "$TMP/j/$f"); then
    pass "interrupted and resumed run matches the straight run"
  else
    fail "interrupted and resumed run differs"
  fi
else
  fail "SIGINT: exit $rc, checkpoint '$ck'"
fi
# keep K: only the newest checkpoints stay
$BIN train "${TINY[@]}" --out "$TMP/k" --steps 5 --ckpt-every 1 --keep 2 > /dev/null 2>&1
n=$(ls "$TMP/k" | grep -c '^step_.*\.safetensors$')
[ "$n" -eq 2 ] && pass "--keep 2 keeps 2 checkpoints" || fail "--keep 2 left $n checkpoints"
ls "$TMP/k" | grep -q tmp && fail "temporary files left behind" || pass "no temporary files left"
finish
