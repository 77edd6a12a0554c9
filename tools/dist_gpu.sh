#!/usr/bin/env bash
# Several GPUs, checked on a machine with 2 or more. Builds nothing.
#
#   [DATA=data set] bash tools/dist_gpu.sh path/to/diffusion [steps]
#     a short `train --gpus 2` run and the same run on one GPU, then their
#     checkpoints compared (NCCL sums in its own order and bf16 compute rounds,
#     so: close, not identical), and a rank killed mid-run stopping the other
#     within seconds. DATA: a Fashion-MNIST folder or .safetensors data set
#     (default: train's own default).
#
#   [OUT=dir] [DATA=data set] bash tools/dist_gpu.sh path/to/diffusion compare [steps]
#     measures how far 2 GPUs end from 1, which the CPU's ranks match bit for
#     bit but NCCL's sums (in ring order) and the in-place accumulation of
#     micro-batches do not: the same small DiT (4 blocks of 192, patch 2, 32x32x4
#     latents, batch 64 in micro-batches of 32) trains `steps` steps (default
#     200) on 1 GPU, again on 1 GPU (run to run: the floor), and on 2 GPUs, in
#     fp32 and in bf16, writing a checkpoint every steps/10 with the step's
#     loss. Then a table: per comparison the largest absolute difference of the
#     raw weights, of the EMA and of the loss over the checkpoints, each also
#     relative to the reference's largest magnitude (tools/compare_runs.py).
#     DATA defaults to 4096 random latents made here. The runs and their logs
#     stay under $OUT/dist_compare when OUT is set (else in a temporary folder,
#     removed at the end); the table comes last, and also into table.txt there.
#     Exit status 1 when a run failed or a value is not finite.
#     DEVICE=cpu runs the same on 2 CPU ranks (fp32 only), a trial of the
#     script without GPUs: there 2 ranks must end bit for bit where 1 does.
set -u
BIN=${1:?usage: bash tools/dist_gpu.sh path/to/diffusion [steps] | path/to/diffusion compare [steps]}
BIN=$(readlink -f "$BIN")
[ -n "${DATA:-}" ] && DATA=$(readlink -f "$DATA")  # the paths as given, before the cd below
MODE=check
if [ "${2:-}" = compare ]; then MODE=compare; shift; fi
cd "$(dirname "$0")/.."

if [ "$MODE" = compare ]; then
  STEPS=${2:-200}
  if ! [[ "$STEPS" =~ ^[1-9][0-9]*$ ]]; then echo "compare: steps must be a positive number, not '$STEPS'" >&2; exit 2; fi
  dev=${DEVICE:-cuda}
  if [ "$dev" = cpu ]; then precisions=(fp32); two=(--ranks 2); what="2 CPU ranks"; one="1 rank"; name=$(uname -m)
  else
    precisions=(fp32 bf16); two=(--gpus 2); what="2 GPUs"; one="1 GPU"
    gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
    if [ "$gpus" -lt 2 ]; then echo "compare: needs 2 GPUs, this machine shows $gpus (nvidia-smi -L)" >&2; exit 2; fi
    name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
  fi
  PY=${PYTHON:-python3}
  if ! "$PY" -c 'import numpy' 2> /dev/null; then echo "compare: needs $PY with numpy (PYTHON=... picks another)" >&2; exit 2; fi
  if [ -n "${OUT:-}" ]; then W=$OUT/dist_compare; rm -rf "$W"; mkdir -p "$W" || exit 2
  else W=$(mktemp -d); trap 'rm -rf "$W"' EXIT; fi
  data=${DATA:-$W/latents.safetensors}
  if [ -z "${DATA:-}" ]; then
    "$PY" - "$data" <<'EOF' || { echo "compare: could not write $data" >&2; exit 2; }
import os, sys
import numpy as np
sys.path.insert(0, "tools")
import st_read
rng = np.random.default_rng(0)
st_read.write(sys.argv[1], {"images": rng.integers(0, 256, (4096, 4, 32, 32), dtype=np.uint8),
                            "labels": rng.integers(0, 10, 4096).astype(np.int64)})
EOF
  fi
  every=$((STEPS / 10 > 0 ? STEPS / 10 : 1))
  M=(--input-size 32 --depth 4 --hidden 192 --heads 3 --patch 2 --batch 64 --micro-batch 32 --data "$data"
     --steps "$STEPS" --ckpt-every "$every" --keep 100000 --log-every 10 --device "$dev")
  [ "$dev" = cpu ] && M+=(--threads 1)  # the same thread count on every rank as alone
  rows=(); bad=0
  for p in "${precisions[@]}"; do
    for run in one rerun two; do
      g=(); [ $run = two ] && g=("${two[@]}")
      echo "== $p, $run: $BIN train ... --precision $p ${g[*]}"
      if ! "$BIN" train "${M[@]}" --precision $p "${g[@]}" --out "$W/$p.$run" > "$W/$p.$run.log" 2>&1; then
        echo "   failed: $(tail -n 2 "$W/$p.$run.log")"
      fi
      tail -n 1 "$W/$p.$run.log"
    done
    rows+=("$("$PY" tools/compare_runs.py "$W/$p.one" "$W/$p.two" "$p: $what vs 1")") || bad=$((bad + 1))
    rows+=("$("$PY" tools/compare_runs.py "$W/$p.one" "$W/$p.rerun" "$p: $one again vs 1")") || bad=$((bad + 1))
  done
  {
    echo
    echo "1 vs $what, $STEPS steps, checkpoints every $every ($name):"
    echo "largest |difference| over the checkpoints; rel: relative to the $one run's largest magnitude"
    "$PY" tools/compare_runs.py --header
    printf '%s\n' "${rows[@]}"
    [ $bad -eq 0 ] || echo "$bad comparisons failed (a run failed, or a value is not finite): see the logs in $W"
  } | tee "$W/table.txt"
  exit $((bad > 0))
fi

STEPS=${2:-50}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fails=0
C=(--model DiT-S/2 --input-size 32 --batch 64 --micro-batch 32 --log-every 10 --precision fp32 ${DATA:+--data "$DATA"})
A=("${C[@]}" --steps "$STEPS" --ckpt-every "$STEPS")
echo "== 1 GPU"; "$BIN" train "${A[@]}" --out "$W/one" || fails=$((fails + 1))
echo "== 2 GPUs"; "$BIN" train "${A[@]}" --gpus 2 --out "$W/two" || fails=$((fails + 1))
f=$(printf 'step_%07d.safetensors' "$STEPS")
# fp32 compute: the two runs differ by the order of the gradient sums only
for t in final_layer.linear.weight ema.final_layer.linear.weight blocks.0.attn.qkv.weight train.adam_m; do
  python3 tools/compare_tensors.py "$t" "$W/one/$f" "$W/two/$f" 1e-4 || fails=$((fails + 1))
done
echo "== kill -9 of rank 1 during a --gpus 2 run: the job must stop within seconds, naming it"
"$BIN" train "${C[@]}" --steps 100000 --ckpt-every 100000 --gpus 2 --out "$W/kill" 2> "$W/kill.log" & parent=$!
for ((i = 0; i < 600; i++)); do grep -q '^step ' "$W/kill.log" && break; sleep 0.1; done
kill -9 "$(pgrep -P $parent | tail -n 1)"; t0=$SECONDS
wait $parent; rc=$?
echo "exit $rc after $((SECONDS - t0)) s: $(tail -n 2 "$W/kill.log")"
[ $rc -ne 0 ] && [ $((SECONDS - t0)) -le 30 ] || fails=$((fails + 1))
echo "$fails failed"
exit $((fails > 0))
