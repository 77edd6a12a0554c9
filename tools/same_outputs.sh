#!/usr/bin/env bash
# Whether two builds of the engine make the same bytes: the check a redesign
# or a refactor must pass. Both binaries train a small DiT (one rank, ranks
# with ZeRO, gradient accumulation, recompute; offload on a GPU), sample it
# with DDPM and DDIM, with and without guidance, and draw pictures with tiny
# random SD 1.x and 2.x (v) models with every sampler, txt2img and img2img.
# Every checkpoint, tensor file and picture's pixels must be equal, byte for
# byte (PNG text, which names the build, is left out of the comparison).
#
#   tools/same_outputs.sh OLD_BIN NEW_BIN [cpu|cuda] [WORKDIR]
#
# The tiny SD models are written by the NEW build's sd_random (beside it in
# build/tools/, or SD_RANDOM=path) and png_pixels compares pictures (PNG_PIXELS=
# path). DATA=path trains on that data set instead of the installed
# Fashion-MNIST. Prints one line a case and a summary; exit 0 when all are equal.
set -uo pipefail
old=${1:?usage: same_outputs.sh OLD_BIN NEW_BIN [cpu|cuda] [WORKDIR]}
new=${2:?usage: same_outputs.sh OLD_BIN NEW_BIN [cpu|cuda] [WORKDIR]}
dev=${3:-cpu}
work=${4:-$(mktemp -d)}
here=$(cd "$(dirname "$0")/.." && pwd)
sd_random=${SD_RANDOM:-$(dirname "$new")/build/tools/sd_random}
[ -x "$sd_random" ] || sd_random=$here/build/tools/sd_random
png_pixels=${PNG_PIXELS:-$here/build/tools/png_pixels}
for f in "$old" "$new" "$sd_random" "$png_pixels"; do
  [ -x "$f" ] || { echo "same_outputs: $f is not an executable (build it first)"; exit 2; }
done
threads=(--threads 2)
[ "$dev" = cuda ] && threads=()
mkdir -p "$work/old" "$work/new" "$work/models"
same=0 differ=0

# run NAME ARGS...: runs both binaries with ARGS, where @OUT@ stands for each
# one's output folder; then compares every file both wrote under NAME.
run() {
  local name=$1; shift
  for side in old new; do
    local bin=${!side} args=()
    for a in "$@"; do args+=("${a//@OUT@/$work/$side/$name}"); done
    mkdir -p "$work/$side/$name"
    if ! "$bin" "${args[@]}" > "$work/$side/$name.log" 2>&1; then
      echo "FAIL $name: the $side build failed (log: $work/$side/$name.log)"; tail -5 "$work/$side/$name.log"
      differ=$((differ + 1)); return
    fi
  done
  local n=0 bad=0
  while IFS= read -r f; do
    n=$((n + 1))
    local a=$work/old/$name/$f b=$work/new/$name/$f
    if [ ! -f "$b" ]; then echo "     $name/$f: only the old build wrote it"; bad=1; continue; fi
    case $f in
      *.png) "$png_pixels" "$a" "$b" 0 > /dev/null || { echo "     $name/$f: pixels differ"; bad=1; } ;;
      *.csv|*.log|*.json|*.txt|.lock|*/.lock) ;;
      *) cmp -s "$a" "$b" || { echo "     $name/$f: bytes differ"; bad=1; } ;;
    esac
  done < <(cd "$work/old/$name" && find . -type f | sed 's|^\./||' | sort)
  if [ "$n" = 0 ]; then echo "FAIL $name: wrote nothing"; differ=$((differ + 1));
  elif [ "$bad" = 0 ]; then echo "same $name ($n files)"; same=$((same + 1));
  else echo "FAIL $name"; differ=$((differ + 1)); fi
}

train=(train --depth 2 --hidden 64 --heads 4 --patch 4 --lr 1e-3 --warmup 3 --grad-clip 1
       --log-every 5 --device "$dev" --seed 7 "${threads[@]}" ${DATA:+--data "$DATA"})
run dit-train "${train[@]}" --batch 16 --steps 12 --out @OUT@/run
run dit-accum "${train[@]}" --batch 16 --micro-batch 4 --steps 8 --recompute 1 --out @OUT@/run
if [ "$dev" = cpu ]; then
  run dit-zero2 "${train[@]}" --batch 16 --micro-batch 4 --steps 8 --ranks 2 --zero 2 --out @OUT@/run
  run dit-zero1 "${train[@]}" --batch 16 --steps 8 --ranks 2 --zero 1 --out @OUT@/run
else
  run dit-offload "${train[@]}" --batch 16 --steps 8 --offload --out @OUT@/run
fi
ck=$work/old/dit-train/run
if [ -d "$ck" ]; then
  smp=(sample --ckpt "$ck" --classes 0,3,7 --per-class 2 --steps 10 --device "$dev" --seed 3 "${threads[@]}")
  run dit-ddpm "${smp[@]}" --tensor-out @OUT@/s.safetensors --grid @OUT@/g.png
  run dit-ddpm-cfg "${smp[@]}" --cfg-scale 4 --tensor-out @OUT@/s.safetensors
  run dit-ddim "${smp[@]}" --sampler ddim --tensor-out @OUT@/s.safetensors
  run dit-ddim-eta "${smp[@]}" --sampler ddim --eta 0.5 --cfg-scale 2 --tensor-out @OUT@/s.safetensors
fi

for cfg in tiny1 tiny2; do
  m=$work/models/$cfg
  [ -d "$m" ] || "$sd_random" --config $cfg --layout diffusers --dtype f16 --seed 5 \
    --vocab "$here/data/bpe_simple_vocab_16e6.txt.gz" --out "$m" > /dev/null || { echo "FAIL sd_random $cfg"; exit 2; }
  t2i=(txt2img --model "$m" --prompt "a red coat" --negative-prompt "blurry" --steps 6 --seed 11
       --count 2 --batch 2 --device "$dev" "${threads[@]}")
  for s in euler_a euler ddim dpmpp_2m dpmpp_2m_karras; do
    run "$cfg-$s" "${t2i[@]}" --sampler $s --out @OUT@/p.png
  done
  run "$cfg-ddim-eta" "${t2i[@]}" --sampler ddim --eta 1 --cfg-scale 1 --out @OUT@/p.png
  pic=$work/old/$cfg-euler/p-0.png
  if [ -f "$pic" ]; then
    for s in euler_a dpmpp_2m ddim; do
      run "$cfg-img2img-$s" img2img --model "$m" --init "$pic" --prompt "a blue coat" --strength 0.6 \
        --steps 8 --seed 4 --sampler $s --device "$dev" "${threads[@]}" --out @OUT@/p.png
    done
  fi
done
echo "same_outputs ($dev): $same cases the same, $differ differ"
[ "$differ" = 0 ]
