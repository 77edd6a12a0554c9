#!/usr/bin/env bash
# Exact resume: 4 steps straight, and 2 steps + resume + 2 steps, must give
# byte-identical checkpoints (weights, EMA, moments and metadata). Signals
# (SIGINT, SIGTERM, SIGHUP, SIGPIPE) end a run with a checkpoint it resumes from.
source "$(dirname "$0")/lib.sh"
small_data "$TMP/data.safetensors"
flags=("${TINY[@]}" --data "$TMP/data.safetensors" --warmup 3 --grad-clip 0.5 --hflip --seed 7 --keep 10 --log-every 1)
diffusion train "${flags[@]}" --ckpt-every 1 --out "$TMP/a" --steps 4 > "$TMP/a.log" 2>&1 || { cat "$TMP/a.log"; fail "straight run"; finish; }
diffusion train "${flags[@]}" --ckpt-every 1 --out "$TMP/b" --steps 2 > "$TMP/b.log" 2>&1 || { cat "$TMP/b.log"; fail "first half"; finish; }
diffusion train --resume "$TMP/b" --steps 4 --threads 2 > "$TMP/c.log" 2>&1 || { cat "$TMP/c.log"; fail "resume"; finish; }
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

# The EMA warm-up is recorded in the checkpoint: a run without it resumes
# without it (falling back to the default, on, would write another EMA); the
# option changes the EMA; a resume cannot change it; a bad value is a usage error.
diffusion train "${flags[@]}" --ema-warmup off --out "$TMP/eo" --steps 4 > "$TMP/eo.log" 2>&1 || fail "--ema-warmup off"
diffusion train "${flags[@]}" --ema-warmup off --out "$TMP/eh" --steps 2 > "$TMP/eh.log" 2>&1 \
  && diffusion train --resume "$TMP/eh" --steps 4 --threads 2 >> "$TMP/eh.log" 2>&1 || fail "--ema-warmup off, resumed"
f4=step_0000004.safetensors
[ -s "$TMP/eo/$f4" ] && cmp -s "$TMP/eo/$f4" "$TMP/eh/$f4" \
  && pass "--ema-warmup off: 2 steps resumed for 2 more are byte-identical to 4 straight" \
  || fail "--ema-warmup off: the resumed run differs from the straight one"
[ -s "$TMP/eo/$f4" ] && ! cmp -s <(st_data "$TMP/a/$f4") <(st_data "$TMP/eo/$f4") \
  && pass "the EMA warm-up changes the run (on by default)" || fail "--ema-warmup off trains what on trains"
expect_code 2 "--ema-warmup with --resume" diffusion train --resume "$TMP/eh" --ema-warmup on --steps 5
expect_code 2 "--ema-warmup maybe" diffusion train "${flags[@]}" --ema-warmup maybe --out "$TMP/ebad"

# A signal: the step in progress ends, a checkpoint is written, the exit
# status is 128 + the signal, and resuming from it is exact. The signal is
# sent once the run logs its first step (never after a fixed sleep, which a
# loaded machine outruns); every run is bounded by `timeout`, which passes
# the signal on to the trainer.
interrupted() {  # interrupted NAME SIGNAL EXPECTED_STATUS
  local name=$1 sig=$2 want=$3 dir="$TMP/$1"
  timeout -k 10 60 "$BIN" train "${flags[@]}" --out "$dir" --steps 100000 --ckpt-every 100000 > "$dir.log" 2>&1 &
  local pid=$!
  if ! wait_for "$dir.log" '^step ' 30 $pid; then
    kill -KILL $pid 2> /dev/null; wait $pid 2> /dev/null; cat "$dir.log"; fail "$name: the run never started"; return
  fi
  kill -$sig $pid; wait $pid; local rc=$?
  local ck; ck=$(ls "$dir"/step_*.safetensors 2> /dev/null | tail -n 1)
  if [ "$rc" -ne "$want" ] || [ -z "$ck" ]; then fail "$name: exit $rc (want $want), checkpoint '$ck'"; return; fi
  pass "$name writes a checkpoint ($(basename "$ck")) and exits $want"
  check_exact "$name" "$dir" "$ck"
}
check_exact() {  # check_exact NAME DIR CHECKPOINT: resuming 3 more steps matches a straight run
  local name=$1 dir=$2 k; k=$(basename "$3" .safetensors); k=$((10#${k#step_})); local m=$((k + 3))
  diffusion train --resume "$dir" --steps $m --threads 2 > /dev/null 2>&1
  diffusion train "${flags[@]}" --out "$dir.straight" --steps $m --ckpt-every 100000 > /dev/null 2>&1
  local f; f=$(printf 'step_%07d.safetensors' $m)
  # the two runs differ only in the recorded plan (steps): compare all tensor bytes
  if [ -s "$dir/$f" ] && cmp -s <(st_data "$dir/$f") <(st_data "$dir.straight/$f"); then
    pass "$name: the resumed run matches the straight run"
  else
    fail "$name: the resumed run differs"
  fi
}
interrupted sigint INT 130
interrupted sighup HUP 129
interrupted sigterm TERM 143

# SIGPIPE: the log's reader goes away (`train 2>&1 | head`); the run checkpoints
# and exits promptly instead of dying silently or training on.
start=$SECONDS
timeout -k 10 60 "$BIN" train "${flags[@]}" --out "$TMP/pipe" --steps 100000 --ckpt-every 100000 2>&1 | head -n 3 > /dev/null
rc=${PIPESTATUS[0]}
ck=$(ls "$TMP/pipe"/step_*.safetensors 2> /dev/null | tail -n 1)
if [ "$rc" -eq 141 ] && [ -n "$ck" ] && [ $((SECONDS - start)) -lt 30 ]; then
  pass "SIGPIPE writes a checkpoint ($(basename "$ck")) and exits 141 in $((SECONDS - start)) s"
  check_exact sigpipe "$TMP/pipe" "$ck"
else
  fail "SIGPIPE: exit $rc, checkpoint '$ck', $((SECONDS - start)) s"
fi

# keep K: only the newest checkpoints stay
diffusion train "${TINY[@]}" --data "$TMP/data.safetensors" --out "$TMP/k" --steps 5 --ckpt-every 1 --keep 2 > /dev/null 2>&1
n=$(ls "$TMP/k" | grep -c '^step_.*\.safetensors$')
[ "$n" -eq 2 ] && pass "--keep 2 keeps 2 checkpoints" || fail "--keep 2 left $n checkpoints"
ls "$TMP/k" | grep -q tmp && fail "temporary files left behind" || pass "no temporary files left"
finish
