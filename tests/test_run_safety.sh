#!/usr/bin/env bash
# Run folders stay safe: one training run writes into a folder at a time,
# resuming never overwrites newer checkpoints unasked, leftovers of killed
# writes are cleaned up, an unwritable folder is refused before any training,
# and an unreadable newest checkpoint falls back to the one before it.
source "$(dirname "$0")/lib.sh"
small_data "$TMP/small.safetensors"
flags=("${TINY[@]}" --data "$TMP/small.safetensors" --log-every 1)

# trainer_of PID: the diffusion process that `timeout` (PID) runs
trainer_of() { children_of "$1" | head -n 1; }

# ---- the lock: a second run into a busy folder fails, naming the first
diffusion train "${flags[@]}" --steps 1 --out "$TMP/busy" > "$TMP/busy0.log" 2>&1 || { cat "$TMP/busy0.log"; fail "first run"; finish; }
timeout -k 10 60 "$BIN" train --resume "$TMP/busy" --steps 100000 --ckpt-every 100000 --threads 2 > "$TMP/busy.log" 2>&1 &
tpid=$!
if wait_for "$TMP/busy.log" '^step ' 30 $tpid; then
  pid=$(trainer_of $tpid)
  expect_fail "resume into a folder in use" "in use by another training run (PID $pid)" \
    diffusion train --resume "$TMP/busy" --steps 5 --threads 2
  expect_fail "fresh run into a folder in use" "in use by another training run (PID $pid)" \
    diffusion train "${flags[@]}" --steps 5 --out "$TMP/busy"
  kill -TERM $tpid; wait $tpid; rc=$?
  n=$(ls "$TMP/busy" | grep -c '^step_')
  [ "$rc" -eq 143 ] && [ "$n" -eq 2 ] && pass "the first run was undisturbed: SIGTERM -> its checkpoint, exit 143" \
    || fail "the first run: exit $rc, $n checkpoints: $(ls "$TMP/busy")"
else
  kill -KILL $tpid 2> /dev/null; wait $tpid; cat "$TMP/busy.log"; fail "the first run never started training"
fi
# kill -9 drops the lock with the process
timeout -k 10 60 "$BIN" train --resume "$TMP/busy" --steps 100000 --ckpt-every 100000 --threads 2 > "$TMP/busy2.log" 2>&1 &
tpid=$!
if wait_for "$TMP/busy2.log" '^step ' 30 $tpid; then
  kill -KILL "$(trainer_of $tpid)"; wait $tpid 2> /dev/null
  last=$(ls "$TMP/busy" | grep '^step_' | tail -n 1); k=$((10#$(tr -dc 0-9 <<< "$last") + 1))
  diffusion train --resume "$TMP/busy" --steps $k --threads 2 > "$TMP/busy3.log" 2>&1 \
    && pass "a run killed with -9 leaves no lock behind" || { cat "$TMP/busy3.log"; fail "lock after kill -9"; }
else
  kill -KILL $tpid 2> /dev/null; wait $tpid; fail "the second background run never started training"
fi

# ---- resuming from an older checkpoint: refused unless --force, naming the newer ones
diffusion train "${flags[@]}" --steps 3 --ckpt-every 1 --keep 10 --out "$TMP/n" > /dev/null 2>&1 || fail "run n"
sums=$(md5sum "$TMP"/n/step_*)
expect_fail "resume from an older checkpoint" "step_0000002.safetensors, step_0000003.safetensors" \
  diffusion train --resume "$TMP/n/step_0000001.safetensors" --steps 4 --threads 2
[ "$(md5sum "$TMP"/n/step_*)" = "$sums" ] && pass "the newer checkpoints are untouched" || fail "newer checkpoints changed"
cp "$TMP/n/step_0000002.safetensors" "$TMP/n2.safetensors"
if diffusion train --resume "$TMP/n/step_0000001.safetensors" --steps 2 --force --threads 2 > "$TMP/force.log" 2>&1 \
   && [ "$(ls "$TMP/n" | grep '^step_' | tr '\n' ' ')" = "step_0000001.safetensors step_0000002.safetensors " ] \
   && grep -q "removed .*step_0000003.safetensors" "$TMP/force.log"; then
  pass "--force: the newer checkpoints are replaced by the resumed run's"
else
  cat "$TMP/force.log"; ls "$TMP/n"; fail "--force"
fi
# resuming is exact, so the new step 2 holds the same tensors as the old one
cmp -s <(st_data "$TMP/n2.safetensors") <(st_data "$TMP/n/step_0000002.safetensors") \
  && pass "--force resume reproduces step 2" || fail "--force resume differs at step 2"

# ---- a kill -9 during a checkpoint write leaves step_*.safetensors.tmp.PID: removed at start
touch "$TMP/n/step_0000007.safetensors.tmp.12345" "$TMP/n/notes.tmp.1"
diffusion train --resume "$TMP/n" --steps 3 --threads 2 > "$TMP/stale.log" 2>&1
if [ ! -e "$TMP/n/step_0000007.safetensors.tmp.12345" ] && [ -e "$TMP/n/notes.tmp.1" ] \
   && grep -q "removed .*step_0000007.safetensors.tmp.12345" "$TMP/stale.log"; then
  pass "stale checkpoint temporaries removed (and only those)"
else
  cat "$TMP/stale.log"; ls "$TMP/n"; fail "stale temporaries"
fi

# ---- an unwritable run folder is refused before any training or sampling. Root
# writes through chmod, so the folder is made read-only by a bind mount in a
# private mount namespace where that is allowed.
# read_only DIR CMD...: runs CMD with DIR read-only
read_only() {
  local dir=$1; shift
  unshare -m sh -c 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"' sh "$dir" "$@"
}
cp -r "$TMP/n" "$TMP/ro"
if read_only "$TMP/ro" true 2> /dev/null; then :
elif [ "$(id -u)" -ne 0 ]; then read_only() { local dir=$1; shift; chmod a-w "$dir"; "$@"; local rc=$?; chmod u+w "$dir"; return $rc; }
else read_only() { return 125; }; fi
if read_only "$TMP/ro" true; then
  err=$(read_only "$TMP/ro" timeout -k 10 60 "$BIN" train --resume "$TMP/ro" --steps 6 --threads 2 --log-every 1 2>&1)
  [[ $? -eq 1 && "$err" == *"cannot write"* && "$err" != *"step "* ]] \
    && pass "resume in a read-only folder refused before training" || fail "read-only resume: '$err'"
  err=$(read_only "$TMP/ro" timeout -k 10 60 "$BIN" sample --ckpt "$TMP/ro" --classes 0 --per-class 1 --steps 2 --grid "$TMP/ro/g.png" 2>&1)
  [[ $? -eq 1 && "$err" == *"cannot write"* && "$err" != *"sampling"* ]] \
    && pass "sample into a read-only folder refused before sampling" || fail "read-only sample: '$err'"
  err=$(read_only "$TMP/ro" timeout -k 10 60 "$BIN" sample --ckpt "$TMP/ro" --classes 0 --per-class 1 --steps 2 --out-dir "$TMP/ro/s" 2>&1)
  [[ $? -eq 1 && "$err" != *"sampling"* ]] && pass "sample --out-dir in a read-only folder refused first" \
    || fail "read-only out-dir: '$err'"
else
  echo "SKIP (privileges: root without unshare -m) read-only folder tests: no private mount namespace"
fi

# ---- an unreadable newest checkpoint: a run folder falls back to the one before
diffusion train "${flags[@]}" --steps 3 --ckpt-every 1 --keep 10 --out "$TMP/f" > /dev/null 2>&1 || fail "run f"
cp "$TMP/f/step_0000003.safetensors" "$TMP/f3.safetensors"
truncate -s 1000 "$TMP/f/step_0000003.safetensors"
err=$(diffusion sample --ckpt "$TMP/f" --classes 0 --per-class 1 --steps 2 --grid "$TMP/f.png" 2>&1)
[[ $? -eq 0 && "$err" == *"step_0000003.safetensors"* && "$err" == *"using $TMP/f/step_0000002.safetensors"* ]] \
  && pass "sample falls back to the older checkpoint, saying so" || fail "sample fallback: '$err'"
expect_fail "a bad checkpoint named explicitly" "step_0000003.safetensors" \
  diffusion sample --ckpt "$TMP/f/step_0000003.safetensors" --classes 0 --per-class 1 --grid "$TMP/f.png"
err=$(diffusion train --resume "$TMP/f" --steps 4 --threads 2 2>&1)
[[ $? -eq 0 && "$err" == *"continues from step 2 and replaces step_0000003.safetensors"* ]] \
  && pass "resume falls back to the older checkpoint, saying so" || fail "resume fallback: '$err'"
diffusion info "$TMP/f/step_0000003.safetensors" > /dev/null 2>&1 && [ -s "$TMP/f/step_0000004.safetensors" ] \
  && pass "the truncated checkpoint was rewritten" || fail "step 3 not rewritten"
cmp -s <(st_data "$TMP/f3.safetensors") <(st_data "$TMP/f/step_0000003.safetensors") \
  && pass "the rewritten step 3 equals the lost one" || fail "the rewritten step 3 differs"
for f in "$TMP"/f/step_*; do truncate -s 1000 "$f"; done
expect_fail "no readable checkpoint at all" "no older checkpoint in $TMP/f can be read either" \
  diffusion train --resume "$TMP/f" --steps 5 --threads 2

# ---- checksums (--no-verify) and the data set's fingerprint (--allow-data-change)
mkdir -p "$TMP/v" && cp "$TMP/n/step_0000001.safetensors" "$TMP/v/step_0000001.safetensors"
v="$TMP/v/step_0000001.safetensors"
st_poke "$v" 100 '\x01\x02\x03'
expect_fail "a damaged checkpoint is detected" "checksum" diffusion info "$v"
diffusion info --no-verify "$v" > /dev/null 2>&1 && pass "info --no-verify" || fail "info --no-verify"
diffusion export --no-verify --ckpt "$v" --out "$TMP/v.safetensors" > /dev/null 2>&1 && pass "export --no-verify" || fail "export --no-verify"
diffusion sample --no-verify --ckpt "$v" --classes 0 --per-class 1 --steps 2 --grid "$TMP/v.png" > /dev/null 2>&1 \
  && pass "sample --no-verify" || fail "sample --no-verify"
st_file "$TMP/in.safetensors" '{"x":{"dtype":"F32","shape":[1,1,32,32],"data_offsets":[0,4096]},"t":{"dtype":"F32","shape":[1],"data_offsets":[4096,4100]},"y":{"dtype":"I64","shape":[1],"data_offsets":[4100,4108]}}' 4108
diffusion forward --no-verify --weights "$v" --input "$TMP/in.safetensors" --output "$TMP/vo.safetensors" > /dev/null 2>&1 \
  && pass "forward --no-verify" || fail "forward --no-verify"
diffusion train --no-verify --resume "$v" --steps 2 --threads 2 > /dev/null 2>&1 && pass "train --resume --no-verify" \
  || fail "train --resume --no-verify"
hdr='{"images":{"dtype":"U8","shape":[16,1,8,8],"data_offsets":[0,1024]},"labels":{"dtype":"U8","shape":[16],"data_offsets":[1024,1040]}}'
st_file "$TMP/d1.safetensors" "$hdr" 1040
cp "$TMP/d1.safetensors" "$TMP/d2.safetensors"; st_poke "$TMP/d2.safetensors" 0 '\x80'
diffusion train --data "$TMP/d1.safetensors" --patch 4 --depth 1 --hidden 32 --heads 2 --batch 8 --threads 2 \
  --steps 1 --out "$TMP/dc" > "$TMP/dc.log" 2>&1 || { cat "$TMP/dc.log"; fail "run on a small data set"; }
expect_fail "resume on a changed data set" "allow-data-change" \
  diffusion train --resume "$TMP/dc" --data "$TMP/d2.safetensors" --steps 2 --threads 2
diffusion train --resume "$TMP/dc" --data "$TMP/d2.safetensors" --steps 2 --threads 2 --allow-data-change > /dev/null 2>&1 \
  && pass "--allow-data-change resumes on the changed data" || fail "--allow-data-change"
# ---- activation checkpointing changes nothing but memory: the same checkpoint, byte for byte
diffusion train "${flags[@]}" --out "$TMP/rc0" --steps 2 --ckpt-every 2 > /dev/null 2>&1
diffusion train "${flags[@]}" --out "$TMP/rc1" --steps 2 --ckpt-every 2 --recompute 0 > /dev/null 2>&1
if [ -s "$TMP/rc1/step_0000002.safetensors" ] && \
   cmp -s <(st_data "$TMP/rc0/step_0000002.safetensors") <(st_data "$TMP/rc1/step_0000002.safetensors"); then
  pass "--recompute 0 trains to the same checkpoint"
else
  fail "--recompute 0 changes the training run"
fi
expect_code 2 "--recompute -1" diffusion train "${flags[@]}" --out "$TMP/rc2" --recompute -1
finish
