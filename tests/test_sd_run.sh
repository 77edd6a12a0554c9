#!/usr/bin/env bash
# Pixel-space models from the command line: `prepare` writes pixels for the
# t2i-demo base (tools/sd_random: no UNet, no VAE) with --vae none and with
# --vae auto, `txt2img` refuses to draw with it (no UNet) and draws with a
# pixel-space model (tiny-pixel) at the UNet's own size. The values are
# checked by test_sd_run.c (and the shards' by test_prepare.c).
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TOOLS=$ROOT/${BUILD:-build}/tools
MP=$TOOLS/make_picture
for c in t2i-demo tiny-pixel; do
  "$TOOLS/sd_random" --config $c --vocab "$ROOT/data/bpe_simple_vocab_16e6.txt.gz" --out "$TMP/$c" > /dev/null \
    || { echo "FAIL sd_random --config $c (make builds it)"; exit 1; }
done
samples() { grep -o '"samples": [0-9]*' "$1/index.json" | awk '{ s += $2 } END { print s + 0 }'; }

mkdir -p "$TMP/src"
for i in 1 2 3; do "$MP" png 40 32 "$TMP/src/$i.png" && echo "a photo of a shirt $i" > "$TMP/src/$i.txt"; done
for vae in none auto; do
  diffusion prepare --model "$TMP/t2i-demo" --data "$TMP/src" --out "$TMP/shards-$vae" --size 32 --vae $vae \
    --device cpu --threads 2 > "$TMP/log" 2>&1 \
    && [ "$(samples "$TMP/shards-$vae")" = 3 ] && grep -q '"ndarray:uint8:3,32,32"' "$TMP/shards-$vae/index.json" \
    && pass "prepare --vae $vae on the t2i-demo base: 3 pictures of 32x32 pixels" \
    || fail "prepare --vae $vae on t2i-demo: $(tail -3 "$TMP/log")"
done
expect_fail "txt2img with a base that has no UNet" "names no UNet" \
  diffusion txt2img --model "$TMP/t2i-demo" --prompt "a shirt" --out "$TMP/x.png" --device cpu
diffusion txt2img --model "$TMP/tiny-pixel" --prompt "a shirt" --steps 3 --out "$TMP/p.png" --device cpu --threads 2 \
  > "$TMP/log" 2>&1 && [[ "$(png_parameters "$TMP/p.png")" == *"Size: 16x16,"*"Model: tiny-pixel" ]] \
  && grep -q "pixel space" "$TMP/log" \
  && pass "txt2img draws with a pixel-space model at its own size (16x16)" || fail "txt2img pixel: $(tail -3 "$TMP/log")"
diffusion img2img --model "$TMP/tiny-pixel" --init "$TMP/src/1.png" --width 16 --height 16 --prompt "a shirt" --steps 3 \
  --out "$TMP/q.png" --device cpu --threads 2 > "$TMP/log" 2>&1 && [ -s "$TMP/q.png" ] \
  && pass "img2img with a pixel-space model" || fail "img2img pixel: $(tail -3 "$TMP/log")"
finish
