#!/usr/bin/env bash
# SD UNet training speed and memory on one GPU, the engine beside diffusers,
# in one run (at most BUDGET seconds, default 480): `diffusion bench --sd-train` and
# tools/sd_train_bench.py (eager, then torch.compile) on the same configs,
# workloads and recipe, each in its own process, with random weights:
#   SD 2.1 at 256 px (latents 32x32), batch 64;
#   SD 2.1 at 512 px (latents 64x64), batch 16;
#   SD 1.5 at 512 px, batch 16 (while time is left).
# SD 2.1's runs go first; a run gets at most what is left of the budget, and
# one that would get under 30 s is left out (torch.compile alone takes a
# minute or more a shape).
# Logs go to --out; a table of img/s, peak GiB and ratios is printed last.
#
# With --lora RANK: a LoRA of that rank trained over the frozen UNet on both
# sides (kohya's default targets), SD 1.5 at 512 px, batch 1 and batch 8.
#
#   tools/sd_train_gpu.sh --bin PATH/diffusion --diffusers SRC [--out DIR] [--steps N] [--warmup N] [--lora RANK]
#
# --bin: a built binary (nothing is built here); --diffusers: diffusers' src
# folder (pure Python, loaded from source) when it is not installed.
set -u
cd "$(dirname "$0")/.."
BIN= DIFF= OUT=${OUT:-runs/sd-train-gpu} STEPS=10 WARM=3 LORA=0
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2;;
    --diffusers) DIFF=$2; shift 2;;
    --out) OUT=$2; shift 2;;
    --steps) STEPS=$2; shift 2;;
    --warmup) WARM=$2; shift 2;;
    --lora) LORA=$2; shift 2;;
    -h|--help) sed -n '2,20p' "$0"; exit 0;;
    *) echo "sd_train_gpu: unknown argument $1" >&2; exit 2;;
  esac
done
[ -x "$BIN" ] || { echo "sd_train_gpu: --bin PATH/diffusion (a built binary) is required" >&2; exit 2; }
mkdir -p "$OUT"
if ! ldconfig -p 2>/dev/null | grep -q libcudnn.so.9 && [ ! -e /usr/local/cuda/lib64/libcudnn.so.9 ]; then
  d=$(python3 -c "import nvidia.cudnn as m; print(list(m.__path__)[0])" 2>/dev/null) &&
    export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
PYDIFF=(); [ -n "$DIFF" ] && PYDIFF=(--diffusers "$DIFF")
t0=$SECONDS
# workloads: name config size batch
WORK=("sd21_256 tools/configs/sd21_unet.json 256 64" "sd21_512 tools/configs/sd21_unet.json 512 16"
      "sd15_512 tools/configs/sd15_unet.json 512 16")
LO=()
if [ "$LORA" -gt 0 ]; then
  LO=(--lora "$LORA")
  WORK=("sd15_512_b1 tools/configs/sd15_unet.json 512 1" "sd15_512_b8 tools/configs/sd15_unet.json 512 8"
        "sd15_512_b16 tools/configs/sd15_unet.json 512 16")
fi
declare -A ips gib

BUDGET=${BUDGET:-480}
# limit S: S seconds, or what is left of the budget when less
limit() { local left=$((BUDGET - (SECONDS - t0))); echo $(($1 < left ? $1 : left)); }

engine() {  # name config size batch
  local l=$OUT/engine_$1.log s; s=$(limit 150)
  [ "$s" -ge 30 ] || { echo "engine $1: left out (budget spent)"; return; }
  timeout "$s" "$BIN" bench --sd-train --unet-config "$2" --size "$3" --batch "$4" --steps "$STEPS" --warmup "$WARM" \
    --device cuda "${LO[@]}" > "$l" 2>&1
  echo "engine $1: rc $? ($((SECONDS - t0)) s)"; sed -n '/^| batch/,$p' "$l"
  read -r ips[engine_$1] gib[engine_$1] < <(awk '/^sd-train / {print $2, $6}' "$l")
}

reference() {  # mode limit_s name config size batch
  local l=$OUT/${1}_$3.log s; s=$(limit "$2")
  [ "$s" -ge 30 ] || { echo "diffusers $1 $3: left out (budget spent)"; return; }
  timeout "$s" python3 tools/sd_train_bench.py --config "$4" --size "$5" --batch "$6" --steps "$STEPS" \
    --warmup "$WARM" --modes "$1" "${PYDIFF[@]}" "${LO[@]}" > "$l" 2>&1
  echo "diffusers $1 $3: rc $? ($((SECONDS - t0)) s)"; grep -E '^  (eager|compile) ' "$l" || tail -3 "$l"
  read -r ips[${1}_$3] gib[${1}_$3] < <(awk '/^result / {print $3, $5}' "$l")
}

for w in "${WORK[@]:0:2}"; do engine $w; done
for w in "${WORK[@]:0:2}"; do reference eager 150 $w; done
for w in "${WORK[@]:0:2}"; do reference compile 240 $w; done
engine ${WORK[2]}
reference eager 150 ${WORK[2]}
reference compile 240 ${WORK[2]}

ratio() { awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else printf "-" }'; }
echo
echo "==== SD UNet training$([ "$LORA" -gt 0 ] && echo ", a rank-$LORA LoRA over the frozen UNet"), $(head -1 "$OUT/gpu.txt"); $STEPS timed steps after $WARM (engine bf16; diffusers bf16 autocast)"
echo "| workload | engine img/s | diffusers eager | compiled | engine/eager | engine/compiled | peak GiB engine | eager | compiled |"
echo "|---|---|---|---|---|---|---|---|---|"
for w in "${WORK[@]}"; do
  set -- $w
  echo "| $1 batch $4 | ${ips[engine_$1]:--} | ${ips[eager_$1]:--} | ${ips[compile_$1]:--} |" \
    "$(ratio "${ips[engine_$1]:-}" "${ips[eager_$1]:-}") | $(ratio "${ips[engine_$1]:-}" "${ips[compile_$1]:-}") |" \
    "${gib[engine_$1]:--} | ${gib[eager_$1]:--} | ${gib[compile_$1]:--} |"
done
if [ "$LORA" -gt 0 ]; then echo "goals: engine/eager >= 2x at the same memory or less"
else echo "goals: sd21_256 engine/compiled >= 1.25x, sd21_512 engine/eager >= 1.5x, engine peak <= compiled's"; fi
echo "logs in $OUT ($((SECONDS - t0)) s)"
