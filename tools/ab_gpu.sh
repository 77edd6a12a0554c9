#!/usr/bin/env bash
# Two builds of the engine against each other on one GPU, in one go: whether
# they write the same bytes (tools/same_outputs.sh on the device), then
# DiT-XL/2 training and sampling and the SD 1.5 step and whole-picture times,
# each measured alternately (old, new, old, new) so that drift of the
# machine's clocks falls on both. Prints a table last.
#
#   tools/ab_gpu.sh OLD_BIN NEW_BIN [LOGDIR]
#
# The SD 1.5 model is random-weight (the NEW build's sd_random; about 2 GB of
# disk, written once into LOGDIR/sd15). SAME=0 leaves out the bytes' check.
# Needs a GPU.
set -uo pipefail
old=${1:?usage: ab_gpu.sh OLD_BIN NEW_BIN [LOGDIR]}
new=${2:?usage: ab_gpu.sh OLD_BIN NEW_BIN [LOGDIR]}
logs=${3:-$(mktemp -d)}
here=$(cd "$(dirname "$0")/.." && pwd)
sd_random=${SD_RANDOM:-$(dirname "$new")/build/tools/sd_random}
[ -x "$sd_random" ] || sd_random=$here/build/tools/sd_random
mkdir -p "$logs"
t0=$SECONDS
same_rc=0
if [ "${SAME:-1}" != 0 ]; then  # SAME=0: the timings only
  bash "$here/tools/same_outputs.sh" "$old" "$new" cuda "$logs/same" > "$logs/same.log" 2>&1
  same_rc=$?
  echo "same_outputs: $(tail -1 "$logs/same.log") ($((SECONDS - t0)) s)"
  grep -E '^(FAIL|  )' "$logs/same.log" | head -20
fi

declare -A fig
for r in 1 2; do
  for side in old new; do
    bin=${!side}
    l=$logs/dit_${side}_$r.log
    timeout 240 "$bin" bench --model DiT-XL/2 --batch 64 --iters 10 --warmup 2 --sample-steps 20 --device cuda > "$l" 2>&1
    echo "DiT-XL/2 $side round $r: rc $? ($((SECONDS - t0)) s)"
    fig[dit_train_${side}_$r]=$(awk '/^train/ {for (i = 1; i < NF; i++) if ($(i+1) == "img/s") {print $i; exit}}' "$l")
    fig[dit_sample_${side}_$r]=$(awk '/^sample/ {for (i = 1; i < NF; i++) if ($(i+1) == "image-steps/s") {print $i; exit}}' "$l")
  done
done
[ -d "$logs/sd15" ] || timeout 300 "$sd_random" --config sd1.5 --layout diffusers --dtype f16 \
  --vocab "$here/data/bpe_simple_vocab_16e6.txt.gz" --out "$logs/sd15" > "$logs/sd_random.log" 2>&1
for r in 1 2; do
  for side in old new; do
    bin=${!side}
    l=$logs/sd_${side}_$r.log
    timeout 240 "$bin" bench --sd "$logs/sd15" --device cuda --iters 10 > "$l" 2>&1
    echo "SD 1.5 $side round $r: rc $? ($((SECONDS - t0)) s)"
    fig[sd_step1_${side}_$r]=$(awk '/UNet step, batch 1 / {for (i = 1; i < NF; i++) if ($(i+1) == "ms") {print $i; exit}}' "$l")
    fig[sd_step8_${side}_$r]=$(awk '/UNet step, batch 8 / {for (i = 1; i < NF; i++) if ($(i+1) == "ms") {print $i; exit}}' "$l")
    fig[sd_pic_${side}_$r]=$(awk '/whole picture/ {for (i = 1; i < NF; i++) if ($(i+1) == "s") {print $i; exit}}' "$l")
    fig[sd_pic8_${side}_$r]=$(awk '/pictures in one batch/ {for (i = 1; i < NF; i++) if ($(i+1) == "pictures/s") {print $i; exit}}' "$l")
  done
done
echo
echo "units: DiT train img/s, DiT sample image-steps/s, SD UNet step ms (batch 1 and 8, with guidance), one picture s, 8 pictures pictures/s"
echo "| figure | old r1 | new r1 | old r2 | new r2 |"
echo "|---|---|---|---|---|"
for k in dit_train dit_sample sd_step1 sd_step8 sd_pic sd_pic8; do
  echo "| $k | ${fig[${k}_old_1]:-?} | ${fig[${k}_new_1]:-?} | ${fig[${k}_old_2]:-?} | ${fig[${k}_new_2]:-?} |"
done
echo "(full lines in $logs/*.log; same_outputs exit $same_rc)"
[ "$same_rc" = 0 ]
