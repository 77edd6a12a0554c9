#!/usr/bin/env bash
# Training on several processes on the CPU: `train --ranks N` and ranks
# started as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR/PORT in the
# environment) give the checkpoint of one rank; a rank killed with SIGKILL
# stops the others within seconds with a message; SIGTERM to one rank
# checkpoints and stops them all, and the run resumes exactly; a signal
# before the first step says that nothing was saved.
source "$(dirname "$0")/lib.sh"
small_data "$TMP/d.safetensors"
# Each rank's 4 images are one of the single rank's micro-batches and every
# rank runs one thread: each micro-batch's gradients start from zero and join
# the step's sum in the global batch's order, so the files are identical,
# not merely close, at every step and across epochs.
T=(--input-size 32 --depth 2 --hidden 32 --heads 2 --patch 8 --batch 8 --micro-batch 4 --threads 1
   --data "$TMP/d.safetensors" --device cpu --log-every 1)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null \
  || echo $((20000 + RANDOM % 20000)); }
# close_to A B TOL: every float in checkpoint A's tensors is within TOL of B's,
# relative to the largest magnitude in A; NaN or infinity fails. Prints the error.
close_to() {
  paste -d ' ' <(st_data "$1" | od -An -v -t f4 -w4) <(st_data "$2" | od -An -v -t f4 -w4) | awk -v tol="$3" '
    { if ($1 !~ /^-?[0-9]/ || $2 !~ /^-?[0-9]/) bad++
      d = $1 - $2; if (d < 0) d = -d; if (d > md) md = d
      a = $1 < 0 ? -$1 : $1; if (a > ma) ma = a; n++ }
    END { r = ma > 0 ? md / ma : md; printf "%.2e", r; exit !(n > 0 && bad == 0 && r <= tol) }'
}
# rank R N PORT ARGS...: one rank of a torchrun-style job, in the background
rank() {
  local r=$1 n=$2 port=$3; shift 3
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout -k 5 120 "$BIN" train "$@" &
}
# pid_of PID: the program under `timeout` (PID), which is what a signal must reach
pid_of() { local c; for ((i = 0; i < 50; i++)); do c=$(children_of "$1" | head -n 1); [ -n "$c" ] && break; sleep 0.1; done; echo "$c"; }

# ---- flags
expect_fail "--ranks with --gpus" "give one" diffusion train --ranks 2 --gpus 2 --out "$TMP/x"
expect_fail "--zero 3" "--zero 3: the stages are 0, 1 and 2" diffusion train --zero 3 --out "$TMP/x"
expect_fail "--zero on one rank" "--zero 1 shards the state over several ranks" diffusion train --zero 1 --steps 1 --out "$TMP/x"
expect_fail "--gpus on the CPU" "with --device cpu use --ranks N" diffusion train --gpus 2 --device cpu --out "$TMP/x"
if ! nvidia-smi -L > /dev/null 2>&1; then
  expect_fail "--gpus without a GPU" "GPU" diffusion train --gpus 2 --out "$TMP/x"
fi
expect_fail "--ranks against the launcher's count" "--ranks 3, but torchrun started 2 ranks" \
  env RANK=0 WORLD_SIZE=2 "$BIN" train --ranks 3 --out "$TMP/x"
expect_fail "a malformed launcher variable" "WORLD_SIZE='two'" env RANK=0 WORLD_SIZE=two "$BIN" train --out "$TMP/x"
[ ! -e "$TMP/x" ] && pass "refused runs create no folder" || fail "a refused run created $TMP/x"

# ---- the same checkpoint as one rank
diffusion train "${T[@]}" --steps 3 --out "$TMP/one" > /dev/null 2>&1 || fail "one rank"
diffusion train "${T[@]}" --steps 3 --ranks 2 --out "$TMP/two" > "$TMP/two.log" 2>&1 || fail "--ranks 2: $(tail -3 "$TMP/two.log")"
cmp -s "$TMP/one/step_0000003.safetensors" "$TMP/two/step_0000003.safetensors" \
  && pass "--ranks 2 writes the checkpoint of one rank" || fail "--ranks 2: checkpoint differs from one rank's"
n=$(grep -c '^step ' "$TMP/two.log")
[ "$n" -eq 3 ] && pass "only rank 0 prints progress" || fail "$n progress lines for 3 steps"
# three epochs (64 images, 8 a step): the order is drawn again at each epoch
# boundary from (seed, epoch) alone, and each rank takes its share of it
diffusion train "${T[@]}" --steps 24 --out "$TMP/one24" > /dev/null 2>&1 || fail "one rank, 24 steps"
diffusion train "${T[@]}" --steps 24 --ranks 2 --out "$TMP/two24" > "$TMP/two24.log" 2>&1 \
  || fail "--ranks 2, 24 steps: $(tail -3 "$TMP/two24.log")"
cmp -s "$TMP/one24/step_0000024.safetensors" "$TMP/two24/step_0000024.safetensors" \
  && pass "--ranks 2 over 3 epochs writes the checkpoint of one rank" \
  || fail "--ranks 2 over 3 epochs: $(close_to "$TMP/one24/step_0000024.safetensors" \
       "$TMP/two24/step_0000024.safetensors" 1) from one rank's checkpoint, not the same file"
diffusion train "${T[@]}" --steps 24 --seed 1 --out "$TMP/seed1" > /dev/null 2>&1 || fail "one rank, seed 1"
e=$(close_to "$TMP/one24/step_0000024.safetensors" "$TMP/seed1/step_0000024.safetensors" 1e-6) \
  && fail "another seed is within 1e-6 ($e): the comparison cannot tell runs apart" \
  || pass "the comparison tells another seed's run apart ($e)"

# ---- one order of sums whatever the ranks: batch 12 in micro-batches of 2 is
# six micro-batches on one rank, three rounds of one each on 2 ranks, two on 3;
# 8 steps cross an epoch (64 images). Every layout writes one rank's file, and
# so does a run of 4 steps on 2 ranks resumed on 3 for 4 more. ZeRO-1 and 2
# too, with clipping off (their norm is combined from the shards' norms, which
# rounds otherwise: clipping would move the last bits).
M0=(--input-size 32 --depth 2 --hidden 32 --heads 2 --patch 8 --batch 12 --threads 1 --data "$TMP/d.safetensors"
    --device cpu --log-every 1)
M=("${M0[@]}" --micro-batch 2)
f8=step_0000008.safetensors
diffusion train "${M[@]}" --steps 8 --out "$TMP/m1" > /dev/null 2>&1 || fail "one rank, micro-batches of 2"
diffusion train "${M0[@]}" --steps 8 --micro-batch 4 --out "$TMP/m1b" > /dev/null 2>&1 || fail "micro-batches of 4"
[ -s "$TMP/m1b/$f8" ] && ! cmp -s "$TMP/m1/$f8" "$TMP/m1b/$f8" \
  && pass "one rank's micro-batches of 2 and of 4 sum otherwise ($(close_to "$TMP/m1/$f8" "$TMP/m1b/$f8" 1))" \
  || fail "micro-batches of 2 and 4 write the same file (or none): the comparison cannot tell sums apart"
for n in 2 3; do
  diffusion train "${M[@]}" --steps 8 --ranks $n --out "$TMP/m$n" > "$TMP/m$n.log" 2>&1 \
    || fail "--ranks $n, micro-batches of 2: $(tail -3 "$TMP/m$n.log")"
  cmp -s "$TMP/m1/$f8" "$TMP/m$n/$f8" && pass "--ranks $n, $((6 / n)) micro-batches each a step: one rank's checkpoint" \
    || fail "--ranks $n, micro-batches of 2: $(close_to "$TMP/m1/$f8" "$TMP/m$n/$f8" 1) from one rank's file, not the same"
done
diffusion train "${M[@]}" --steps 4 --ranks 2 --out "$TMP/mr" > /dev/null 2> "$TMP/mr.log" \
  && diffusion train --resume "$TMP/mr" --steps 8 --ranks 3 --threads 1 > /dev/null 2>> "$TMP/mr.log" \
  || fail "4 steps on 2 ranks, resumed on 3: $(tail -3 "$TMP/mr.log")"
cmp -s "$TMP/m1/$f8" "$TMP/mr/$f8" && pass "4 steps on 2 ranks and 4 more resumed on 3: the file of 8 on one rank" \
  || fail "2 ranks resumed on 3: $(close_to "$TMP/m1/$f8" "$TMP/mr/$f8" 1) from 8 steps on one rank, not the same file"
diffusion train "${M[@]}" --steps 8 --grad-clip 0 --out "$TMP/z0" > /dev/null 2>&1 || fail "one rank, no clipping"
for zr in "1 3" "2 2" "2 3"; do
  set -- $zr
  diffusion train "${M[@]}" --steps 8 --grad-clip 0 --zero $1 --ranks $2 --out "$TMP/z$1r$2" > "$TMP/z$1r$2.log" 2>&1 \
    || fail "--zero $1 --ranks $2: $(tail -3 "$TMP/z$1r$2.log")"
  cmp -s "$TMP/z0/$f8" "$TMP/z$1r$2/$f8" && pass "--zero $1 --ranks $2, no clipping: one rank's checkpoint" \
    || fail "--zero $1 --ranks $2: $(close_to "$TMP/z0/$f8" "$TMP/z$1r$2/$f8" 1) from one rank's file, not the same"
done
p=$(free_port)
rank 0 2 "$p" "${T[@]}" --steps 3 --out "$TMP/tr" 2> "$TMP/tr0.log"; a=$!
rank 1 2 "$p" "${T[@]}" --steps 3 --out "$TMP/tr" 2> "$TMP/tr1.log"; b=$!
wait $a; ra=$?; wait $b; rb=$?
[ $ra -eq 0 ] && [ $rb -eq 0 ] && cmp -s "$TMP/one/step_0000003.safetensors" "$TMP/tr/step_0000003.safetensors" \
  && pass "ranks started as torchrun does write the checkpoint of one rank" \
  || fail "torchrun-style ranks: exit $ra $rb; $(tail -2 "$TMP/tr0.log" "$TMP/tr1.log")"
# a rank started with another setting must not train its own variant silently
p=$(free_port)
rank 0 2 "$p" "${T[@]}" --steps 3 --out "$TMP/lr" 2> "$TMP/lr0.log"; a=$!
rank 1 2 "$p" "${T[@]}" --steps 3 --lr 0.0002 --out "$TMP/lr" 2> "$TMP/lr1.log"; b=$!
wait $a; ra=$?; wait $b; rb=$?
[ $ra -ne 0 ] && [ $rb -ne 0 ] && grep -q "rank 1 trains other settings than rank 0" "$TMP/lr0.log" "$TMP/lr1.log" \
  && [ ! -e "$TMP/lr/step_0000003.safetensors" ] \
  && pass "ranks with different settings stop before training, saying so" \
  || fail "ranks with different --lr: exit $ra $rb; $(tail -2 "$TMP/lr0.log" "$TMP/lr1.log")"

# ---- a signal before the first step ends the run at once, saying that
# nothing was saved: rank 0 of two waits in the rendezvous (listening, so long
# after the handlers are in place) for a rank 1 that never comes
listening() { awk -v p=":$(printf '%04X' "$1")" '$2 ~ p"$" && $4 == "0A" { f = 1 } END { exit !f }' \
  /proc/net/tcp /proc/net/tcp6 2> /dev/null; }
for sig in TERM:143:Terminated INT:130:Interrupt; do
  IFS=: read -r name code what <<< "$sig"
  p=$(free_port)
  rank 0 2 "$p" "${T[@]}" --steps 3 --out "$TMP/early$name" 2> "$TMP/early$name.log"; a=$!
  for ((i = 0; i < 300; i++)); do listening "$p" && break; sleep 0.1; done
  kill -$name "$(pid_of $a)"; wait $a; rc=$?
  [ $rc -eq $code ] && grep -q "interrupted ($what) before the first step: nothing was saved" "$TMP/early$name.log" \
    && [ ! -e "$TMP/early$name" ] \
    && pass "SIG$name before the first step: exit $code, saying nothing was saved" \
    || fail "SIG$name before the first step: exit $rc, log '$(tail -n 2 "$TMP/early$name.log")'"
done

# ---- gradients summed in bf16 over the sockets (--grad-comm bf16): each step's summed gradient
# rounded once to bf16 (relative 2^-9), which the moments carry (tests/test_zero.c: 4e-3 of
# each buffer's largest value). Here relative to the file's largest value, which the weights
# set: 1e-5 to 3e-5 seen (the data are random), 1e-3 asked; yet not the fp32 run's file. ZeRO-2
# sums the same way in its reduce-scatter. A rank summing in bf16 beside one in fp32 is refused.
expect_code 2 "--grad-comm fp16 is a usage error" diffusion train --grad-comm fp16 --out "$TMP/x"
for z in 0 2; do
  diffusion train "${T[@]}" --steps 3 --ranks 2 --zero $z --grad-comm bf16 --out "$TMP/bf$z" > "$TMP/bf$z.log" 2>&1 \
    || fail "--ranks 2 --zero $z --grad-comm bf16: $(tail -3 "$TMP/bf$z.log")"
  e=$(close_to "$TMP/one/step_0000003.safetensors" "$TMP/bf$z/step_0000003.safetensors" 1e-3) \
    && ! cmp -s "$TMP/two/step_0000003.safetensors" "$TMP/bf$z/step_0000003.safetensors" \
    && grep -q "gradients summed in bf16" "$TMP/bf$z.log" \
    && pass "--ranks 2 --zero $z --grad-comm bf16: $e from one rank in fp32, not the fp32 run's checkpoint" \
    || fail "--ranks 2 --zero $z --grad-comm bf16: $e from one rank (tolerance 1e-3), or the fp32 run's file"
done
# each rank's share is one micro-batch: ZeRO-2 rounds and sums the values ZeRO-0 does (test_zero)
cmp -s "$TMP/bf0/step_0000003.safetensors" "$TMP/bf2/step_0000003.safetensors" \
  && pass "--grad-comm bf16: ZeRO-2's reduce-scatter writes ZeRO-0's all-reduce's checkpoint" \
  || fail "--grad-comm bf16: ZeRO-2's checkpoint differs from ZeRO-0's"
p=$(free_port)
rank 0 2 "$p" "${T[@]}" --steps 3 --out "$TMP/gc" 2> "$TMP/gc0.log"; a=$!
rank 1 2 "$p" "${T[@]}" --steps 3 --grad-comm bf16 --out "$TMP/gc" 2> "$TMP/gc1.log"; b=$!
wait $a; ra=$?; wait $b; rb=$?
[ $ra -ne 0 ] && [ $rb -ne 0 ] && grep -q "rank 1 trains other settings than rank 0" "$TMP/gc0.log" "$TMP/gc1.log" \
  && pass "a rank summing gradients in bf16 beside one in fp32 stops before training" \
  || fail "ranks with different --grad-comm: exit $ra $rb; $(tail -2 "$TMP/gc0.log" "$TMP/gc1.log")"

# ---- a diverging run (inf or NaN in the losses of some images, so in one
# rank's share): every rank stops naming the step, and no checkpoint is
# written at or after it (one every step until then)
diffusion train "${T[@]}" --steps 100 --lr 0.9 --grad-clip 0 --warmup 0 --ckpt-every 1 --keep 1000 --ranks 2 \
  --out "$TMP/nan" > /dev/null 2> "$TMP/nan.log"; rn=$?
# (the loss or the gradient norm turns non-finite first, or the norm outgrows
# float32's moments first: "by step N;" or "by step N, beyond ...")
s0=$(sed -n 's/.*rank 0 of 2: .* became .* by step \([0-9]*\)[;,].*/\1/p' "$TMP/nan.log" | head -n 1)
s1=$(sed -n 's/.*rank 1 of 2: .* became .* by step \([0-9]*\)[;,].*/\1/p' "$TMP/nan.log" | head -n 1)
ck=$(ls "$TMP/nan"/step_*.safetensors 2> /dev/null | tail -n 1 | sed 's/.*step_0*\([0-9][0-9]*\).*/\1/')
last=$(printf '%s/step_%07d.safetensors' "$TMP/nan" "${ck:-0}")
[ $rn -eq 1 ] && [ -n "$s0" ] && [ "$s0" = "$s1" ] && [ -n "$ck" ] && [ "$ck" -eq $((s0 - 1)) ] \
  && close_to "$last" "$last" 0 > /dev/null \
  && pass "diverged at step $s0: both ranks stop saying so; the last checkpoint, step $ck, is finite" \
  || fail "diverging on 2 ranks: exit $rn, steps '$s0' '$s1', last checkpoint '$ck': $(tail -3 "$TMP/nan.log")"

# ---- kill -9 of a rank: the other stops by itself, naming it
p=$(free_port)
rank 0 2 "$p" "${T[@]}" --steps 100000 --out "$TMP/k" 2> "$TMP/k0.log"; a=$!
rank 1 2 "$p" "${T[@]}" --steps 100000 --out "$TMP/k" 2> "$TMP/k1.log"; b=$!
if wait_for "$TMP/k0.log" '^step ' 60 $a; then
  kill -9 "$(pid_of $b)"; t0=$SECONDS
  wait $a; ra=$?
  dt=$((SECONDS - t0))
  [ $ra -ne 0 ] && [ $dt -le 10 ] && grep -q "rank 1 of 2 died" "$TMP/k0.log" \
    && pass "rank 1 killed: rank 0 exits $ra within ${dt} s saying so" \
    || fail "rank 1 killed: rank 0 exit $ra after ${dt} s: $(tail -2 "$TMP/k0.log")"
else
  fail "kill -9: the job did not start: $(tail -2 "$TMP/k0.log" "$TMP/k1.log")"; kill -9 $a $b 2> /dev/null
fi
wait 2> /dev/null
# under train --ranks: the launcher stops the rest and names the rank
timeout -k 5 120 "$BIN" train "${T[@]}" --steps 100000 --ranks 2 --out "$TMP/k2" > /dev/null 2> "$TMP/k2.log" & parent=$!
if wait_for "$TMP/k2.log" '^step ' 60 $parent; then
  child=$(children_of "$(pid_of $parent)" | tail -n 1)  # timeout -> launcher -> ranks
  kill -9 "$child"; t0=$SECONDS
  wait $parent; rp=$?
  dt=$((SECONDS - t0))
  [ $rp -ne 0 ] && [ $dt -le 10 ] && grep -q "was killed by signal 9" "$TMP/k2.log" \
    && pass "--ranks 2, a rank killed: exit $rp within ${dt} s naming it" \
    || fail "--ranks 2, a rank killed: exit $rp after ${dt} s: $(tail -3 "$TMP/k2.log")"
else
  fail "--ranks 2 did not start: $(tail -3 "$TMP/k2.log")"; kill -9 $parent 2> /dev/null
fi

# ---- SIGTERM to rank 1: every rank checkpoints and stops; the run resumes exactly
STEPS=300
p=$(free_port)
rank 0 2 "$p" "${T[@]}" --steps $STEPS --out "$TMP/s" 2> "$TMP/s0.log"; a=$!
rank 1 2 "$p" "${T[@]}" --steps $STEPS --out "$TMP/s" 2> "$TMP/s1.log"; b=$!
if wait_for "$TMP/s0.log" '^step ' 60 $a; then
  kill -TERM "$(pid_of $b)"
  wait $a; ra=$?; wait $b; rb=$?
  ck=$(ls "$TMP/s"/step_*.safetensors 2> /dev/null | tail -n 1)
  [ $ra -eq 143 ] && [ $rb -eq 143 ] && [ -n "$ck" ] && grep -q "Terminated on rank 1" "$TMP/s0.log" \
    && pass "SIGTERM to rank 1: both exit 143 after writing $(basename "$ck")" \
    || fail "SIGTERM to rank 1: exit $ra $rb, checkpoint '$ck': $(tail -2 "$TMP/s0.log")"
  diffusion train --resume "$TMP/s" --ranks 2 --threads 1 > /dev/null 2> "$TMP/s2.log" \
    || fail "resume on 2 ranks: $(tail -2 "$TMP/s2.log")"
  diffusion train "${T[@]}" --steps $STEPS --ranks 2 --out "$TMP/s1" > /dev/null 2>&1 || fail "$STEPS steps at once"
  f=$(printf 'step_%07d.safetensors' $STEPS)
  cmp -s <(st_data "$TMP/s/$f") <(st_data "$TMP/s1/$f") && pass "interrupted and resumed on 2 ranks = $STEPS steps at once" \
    || fail "interrupted and resumed on 2 ranks differs from an uninterrupted run"
else
  fail "SIGTERM: the job did not start: $(tail -2 "$TMP/s0.log")"; kill -9 $a $b 2> /dev/null
fi
wait 2> /dev/null
finish
