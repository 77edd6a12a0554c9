#!/usr/bin/env bash
# Data-parallel training speed and memory of DiT-XL/2 at 256 px (latents
# 4x32x32), batch 64 per GPU, beside PyTorch DDP, in one run on a machine with
# N GPUs. In this order: the engine on 1 GPU, the engine on N GPUs with ZeRO
# stages 0, 1 and 2 (`diffusion bench --gpus N --zero S`; stage 2 again with
# NCCL_MAX_CTAS=8), then PyTorch DDP
# (tools/bench_pytorch_ddp.py, the official model) eager and torch.compile on
# 1 and N GPUs. Logs go into $OUT (a temporary folder when unset); a table of
# img/s, scaling, per-GPU peak memory and ZeRO state bytes is printed last.
#
#   bash tools/dist_bench.sh path/to/diffusion [--gpus N] [--model NAME] [--batch B] [--no-torch]
#
# Builds nothing. PyTorch 2 with CUDA must be importable as python3 for the
# PyTorch rows (--no-torch skips them). About 6 minutes on 2 H200s, most of it
# torch.compile.
set -u
BIN=${1:?usage: bash tools/dist_bench.sh path/to/diffusion [--gpus N] [--model NAME] [--batch B] [--no-torch]}
shift
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
cd "$(dirname "$0")/.." || exit 1
N=2 MODEL=DiT-XL/2 BATCH=64 TORCH=1
while [ $# -gt 0 ]; do
  case $1 in
    --gpus) N=$2; shift 2;;
    --model) MODEL=$2; shift 2;;
    --batch) BATCH=$2; shift 2;;
    --no-torch) TORCH=0; shift;;
    *) echo "dist_bench: unknown argument $1" >&2; exit 2;;
  esac
done
if [ -n "${OUT:-}" ]; then LOGS=$OUT; mkdir -p "$LOGS"; else LOGS=$(mktemp -d); fi
echo "logs in $LOGS"

# NVLink SHARP (multicast) stays off; cuDNN and NCCL come from the python
# packages where the system has none.
export NCCL_NVLS_ENABLE=0
for pkg in cudnn nccl; do
  d=$(python3 -c "import nvidia.$pkg as m; print(list(m.__path__)[0])" 2> /dev/null) && [ -d "$d/lib" ] &&
    export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
grep -q avx512f /proc/cpuinfo && export OPENBLAS_CORETYPE=SkylakeX
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt"
have=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
[ "$have" -ge "$N" ] || { echo "dist_bench: --gpus $N, but this machine has $have GPUs" >&2; exit 1; }

t_all=$SECONDS
run() {  # run NAME CMD...: the command's output into $LOGS/NAME.txt, its time and status shown
  local name=$1 t0=$SECONDS; shift
  echo "== $name: $*"
  "$@" > "$LOGS/$name.txt" 2>&1
  local rc=$?
  grep -E '^(train|zero|ddp) ' "$LOGS/$name.txt"
  [ $rc -eq 0 ] || { echo "   FAILED (exit $rc):"; tail -n 5 "$LOGS/$name.txt" | sed 's/^/   /'; }
  echo "   ($((SECONDS - t0)) s)"
}
E=(bench --model "$MODEL" --batch "$BATCH" --iters 20 --warmup 3 --sample-batch 0 --device cuda)
run engine_1 "$BIN" "${E[@]}"
for z in 0 1 2; do run "engine_${N}_zero$z" "$BIN" "${E[@]}" --gpus "$N" --zero "$z"; done
# NCCL's kernels run beside backward on SMs of their own; a few suffice for
# the bytes a unit's reduce-scatter moves, so a cap leaves the rest to compute
run "engine_${N}_zero2_ctas8" env NCCL_MAX_CTAS=8 "$BIN" "${E[@]}" --gpus "$N" --zero 2
if [ "$TORCH" = 1 ]; then
  for mode in eager compile; do
    for n in 1 "$N"; do
      run "torch_${mode}_$n" python3 -m torch.distributed.run --standalone --nproc_per_node "$n" \
        tools/bench_pytorch_ddp.py --model "$MODEL" --batch "$BATCH" --mode "$mode" --iters 10 --warmup 3 \
        --repeats 3 --json "$LOGS/torch_${mode}_$n.json"
    done
  done
fi

# ---- the table
# field FILE REGEX: the first number after REGEX on the result lines of FILE ("" if absent)
field() { grep -E '^(train|zero|ddp) ' "$1" 2> /dev/null | grep -oE "$2 *[0-9.]+" | head -n 1 | grep -oE '[0-9.]+$'; }
# engine FILE: img/s total (the single-rank line has no "total"), peak and held GiB, state MiB, % of stage 0
engine() {
  local f=$1 tot
  tot=$(grep -E '^train ' "$f" 2> /dev/null | grep -oE '[0-9.]+ img/s' | head -n 1 | grep -oE '^[0-9.]+')
  echo "${tot:--} $(field "$f" 'peak GPU') $(field "$f" 'held') $(field "$f" 'state') \
$(grep -oE '\([0-9.]+% of stage 0' "$f" 2> /dev/null | grep -oE '[0-9.]+' | head -n 1)"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2fx", a / b; else printf "-" }'; }
EZ=() QZ=() TC=''
{
  echo
  echo "$MODEL, batch $BATCH per GPU, on $(head -n 1 "$LOGS/gpu.txt" | cut -d, -f1) x $N; $(date -u +%F)"
  printf '%-22s %5s %10s %10s %9s %9s %9s %10s %8s\n' run GPUs "img/s" "per GPU" scaling "peak GiB" "held GiB" \
    "state MiB" "of ZeRO-0"
  read -r e1 p1 h1 s1 q1 <<< "$(engine "$LOGS/engine_1.txt")"
  printf '%-22s %5s %10s %10s %9s %9s %9s %10s %8s\n' "engine" 1 "$e1" "$e1" "1.00x" "${p1:--}" "${h1:--}" \
    "${s1:--}" "${q1:+$q1%}"
  for z in 0 1 2; do
    read -r e p h s q <<< "$(engine "$LOGS/engine_${N}_zero$z.txt")"
    EZ[$z]=$e QZ[$z]=$q
    per=$(awk -v a="$e" -v n="$N" 'BEGIN { if (a + 0 > 0) printf "%.1f", a / n; else printf "-" }')
    printf '%-22s %5s %10s %10s %9s %9s %9s %10s %8s\n' "engine ZeRO-$z" "$N" "${e:--}" "$per" "$(ratio "$e" "$e1")" \
      "${p:--}" "${h:--}" "${s:--}" "${q:+$q%}"
  done
  read -r e p h s q <<< "$(engine "$LOGS/engine_${N}_zero2_ctas8.txt")"
  per=$(awk -v a="$e" -v n="$N" 'BEGIN { if (a + 0 > 0) printf "%.1f", a / n; else printf "-" }')
  printf '%-22s %5s %10s %10s %9s %9s %9s %10s %8s\n' "engine ZeRO-2, 8 CTAs" "$N" "${e:--}" "$per" \
    "$(ratio "$e" "$e1")" "${p:--}" "${h:--}" "${s:--}" "${q:+$q%}"
  for mode in eager compile; do
    t1='' tn=''
    for n in 1 "$N"; do
      f=$LOGS/torch_${mode}_$n.txt
      t=$(grep -E '^ddp ' "$f" 2> /dev/null | grep -oE '[0-9.]+ img/s total' | grep -oE '^[0-9.]+')
      [ "$n" = 1 ] && t1=$t || tn=$t
      per=$(awk -v a="$t" -v n="$n" 'BEGIN { if (a + 0 > 0) printf "%.1f", a / n; else printf "-" }')
      printf '%-22s %5s %10s %10s %9s %9s %9s %10s %8s\n' "PyTorch DDP $mode" "$n" "${t:--}" "$per" \
        "$(ratio "$t" "$t1")" "$(field "$f" 'peak GPU')" - - -
    done
    [ "$mode" = compile ] && TC=$tn
  done
  echo
  need=$(case $N in 2) echo 1.95;; 4) echo 3.85;; *) echo "";; esac)
  echo "engine $N GPUs ZeRO-0 / engine 1 GPU: $(ratio "${EZ[0]}" "$e1")${need:+ (goal >= ${need}x)}"
  echo "engine $N GPUs ZeRO-0 / PyTorch DDP compile $N GPUs: $(ratio "${EZ[0]}" "$TC") (goal >= 1.15x)"
  echo "engine $N GPUs ZeRO-2 / PyTorch DDP compile $N GPUs: $(ratio "${EZ[2]}" "$TC")"
  echo "ZeRO-1 state per GPU: ${QZ[1]:--}% of ZeRO-0's; ZeRO-2: ${QZ[2]:--}% (goal <= 60%)"
  echo "(state: gradients + fp32 master + AdamW moments + EMA per GPU, dc_zero_mem_of; peak: the engine's"
  echo " since start, set-up included; held: what the engine holds during the steps; PyTorch: peak"
  echo " allocated over the timed steps; every figure the slowest or largest GPU's)"
  echo "whole run: $((SECONDS - t_all)) s"
} | tee "$LOGS/table.txt"
