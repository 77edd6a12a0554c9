#!/usr/bin/env bash
# LoRA files from the command line (txt2img/img2img --lora FILE[:W]) on a
# random-weight SD 1.x model with random LoRAs on every attention projection
# of its UNet and text encoder (tools/lora_random): a LoRA changes the
# picture, kohya's and PEFT's files of the same factors draw the same pixels,
# at run time (several at once, stacked) as merged (--lora-merge), and so
# do LyCORIS LoHa and LoKr files,
# weight 0 draws what no LoRA does, two halves about what one whole does, the
# PNG carries AUTOMATIC1111's "Lora hashes" (the first 12 hex digits of the
# SHA-256 of the file after its header), the prompt's <lora:NAME:TE[:UNET]>
# tags draw what the flag does, `info` describes the files, `lora merge`
# writes the model with the LoRA folded in, and the refusals.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
T=$ROOT/${BUILD:-build}/tools
VOCAB=$ROOT/data/bpe_simple_vocab_16e6.txt.gz
[ -x "$T/sd_random" ] && [ -x "$T/lora_random" ] && [ -x "$T/png_pixels" ] || { echo "FAIL: tools not built (make)"; exit 1; }
pixels() { "$T/png_pixels" "$1" "$2" "$3" > /dev/null; }
# st1 OUT NAME: a safetensors file of one F32 [1, 1] tensor (1.0) named NAME
st1() {
  local h="{\"$2\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[0,4]}}" n
  while [ $((${#h} % 8)) -ne 0 ]; do h="$h "; done
  n=${#h}
  printf "$(printf '\\%03o\\%03o\\000\\000\\000\\000\\000\\000' $((n & 255)) $((n >> 8 & 255)))" > "$1"
  printf '%s' "$h" >> "$1"
  printf '\000\000\200\077' >> "$1"
}

"$T/sd_random" --config tiny1 --layout diffusers --vocab "$VOCAB" --out "$TMP/m" > /dev/null \
  && "$T/lora_random" --model "$TMP/m" --out "$TMP/style.safetensors" --rank 2 --alpha 1 --scale 0.5 > /dev/null \
  && "$T/lora_random" --model "$TMP/m" --out "$TMP/peft.safetensors" --rank 2 --alpha 1 --scale 0.5 --format peft > /dev/null \
  && "$T/lora_random" --model "$TMP/m" --out "$TMP/loha.safetensors" --rank 2 --alpha 2 --scale 0.3 --format loha > /dev/null \
  && "$T/lora_random" --model "$TMP/m" --out "$TMP/lokr.safetensors" --rank 2 --alpha 2 --scale 0.3 --format lokr > /dev/null \
  || { fail "making the model and LoRAs"; finish; }
out=$(diffusion txt2img --help)
[[ "$out" == *"--lora FILE[:W]"* && "$out" == *"repeatable"* ]] && pass "txt2img --help names --lora" || fail "--help: '$out'"
draw() {  # OUT [flags...] (a later --prompt replaces "a cat")
  local o=$1; shift
  local prompt="a cat" args=()
  while [ $# -gt 0 ]; do
    if [ "$1" = --prompt ]; then prompt=$2; shift 2; else args+=("$1"); shift; fi
  done
  diffusion txt2img --model "$TMP/m" --prompt "$prompt" --steps 4 --seed 3 --out "$o" "${args[@]}" > "$TMP/log" 2>&1 \
    || { cat "$TMP/log"; fail "txt2img $*"; }
}
draw "$TMP/none.png"
draw "$TMP/k.png" --lora "$TMP/style.safetensors"
draw "$TMP/p.png" --lora "$TMP/peft.safetensors:1"
draw "$TMP/zero.png" --lora "$TMP/style.safetensors:0"
draw "$TMP/halves.png" --lora "$TMP/style.safetensors:0.5" --lora "$TMP/peft.safetensors:0.5"
pixels "$TMP/none.png" "$TMP/k.png" 8 && fail "a LoRA left the picture as it was" || pass "a LoRA changes the picture"
pixels "$TMP/k.png" "$TMP/p.png" 0 && pass "kohya's and PEFT's files draw the same pixels" || fail "kohya and PEFT differ"
# at run time (the default) and merged (--lora-merge): the same pictures up to rounding (the product and its
# delta rounded apart or together, which this random model's sampling magnifies to a few levels;
# test_unet_lora holds the UNet's and text encoder's outputs to 1e-5)
grep -q "applying LoRA" "$TMP/log" && pass "LoRAs apply at run time by default" || fail "log: $(cat "$TMP/log")"
draw "$TMP/km.png" --lora "$TMP/style.safetensors" --lora-merge
grep -q "merging LoRA" "$TMP/log" && pixels "$TMP/k.png" "$TMP/km.png" 4 \
  && pass "--lora-merge: the run-time LoRA's picture" || fail "merged and run-time LoRAs differ"
draw "$TMP/halves_m.png" --lora "$TMP/style.safetensors:0.5" --lora "$TMP/peft.safetensors:0.5" --lora-merge
pixels "$TMP/none.png" "$TMP/zero.png" 0 && pass "weight 0 draws what no LoRA does" || fail "weight 0 changes the picture"
# LyCORIS's LoHa and LoKr: they change the picture, and draw the same at run time and merged
for kind in loha lokr; do
  draw "$TMP/$kind.png" --lora "$TMP/$kind.safetensors"
  draw "$TMP/${kind}_m.png" --lora "$TMP/$kind.safetensors" --lora-merge
  pixels "$TMP/none.png" "$TMP/$kind.png" 8 && fail "$kind: the picture as it was" \
    || { pixels "$TMP/$kind.png" "$TMP/${kind}_m.png" 4 && pass "a $kind file changes the picture, the same at run time and merged" \
         || fail "$kind: run time and merged differ"; }
done
pixels "$TMP/k.png" "$TMP/halves.png" 8 && pass "two halves draw about what one whole does" || fail "halves differ from the whole"
pixels "$TMP/halves.png" "$TMP/halves_m.png" 4 && pass "two LoRAs at once: run time and merged draw the same" \
  || fail "two LoRAs at run time and merged differ"
hlen=$(od -An -t u8 -N8 "$TMP/style.safetensors" | tr -d ' ')
want=$(tail -c +$((9 + hlen)) "$TMP/style.safetensors" | sha256sum | cut -c1-12)
grep -aq "Lora hashes: \"style: $want\"" "$TMP/k.png" && pass "the PNG names the LoRA with its hash ($want)" \
  || fail "no 'Lora hashes: \"style: $want\"' in the PNG"
grep -aq "Lora hashes: \"style: $want, peft: " "$TMP/halves.png" && pass "two LoRAs named in order" || fail "two LoRAs' hashes"
diffusion img2img --model "$TMP/m" --init "$TMP/none.png" --prompt "a cat" --steps 4 --out "$TMP/i.png" \
  --lora "$TMP/style.safetensors" > /dev/null 2>&1 && grep -aq "Lora hashes" "$TMP/i.png" \
  && pass "img2img takes --lora" || fail "img2img --lora"
out=$(diffusion info "$TMP/style.safetensors")
[[ "$out" == *"kohya names; "*" UNet layers, "*" text encoder layers"* && "$out" == *"rank          2"* && \
   "$out" == *"alpha         1"* && "$out" == *"ss_network_dim       2"* ]] && pass "info describes a kohya LoRA" \
  || fail "info: '$out'"
out=$(diffusion info "$TMP/loha.safetensors")
[[ "$out" == *"deltas        LoHa (LyCORIS)"* && "$out" == *"rank          2"* ]] && pass "info tells a LoHa" || fail "info: '$out'"
out=$(diffusion info "$TMP/peft.safetensors")
[[ "$out" == *"PEFT names"* ]] && pass "info tells PEFT's names" || fail "info: '$out'"
# AUTOMATIC1111's tags: <lora:NAME:TE[:UNET]> with NAME.safetensors in --lora-dir
draw "$TMP/tag.png" --lora-dir "$TMP" --prompt "a cat <lora:style:1>"
pixels "$TMP/k.png" "$TMP/tag.png" 0 && pass "<lora:style:1> draws what --lora style.safetensors does" \
  || fail "the tag and the flag differ"
grep -aq "a cat <lora:style:1>" "$TMP/tag.png" && pass "the PNG keeps the prompt with its tag" || fail "the tag is gone"
draw "$TMP/named.png" --lora-dir "$TMP" --prompt "a cat <lora:style:unet=1:te=1>"
pixels "$TMP/k.png" "$TMP/named.png" 0 && pass "te= and unet= read as the positional multipliers" || fail "te=/unet="
draw "$TMP/te.png" --lora-dir "$TMP" --prompt "a cat <lora:style:1:0>"
! pixels "$TMP/te.png" "$TMP/none.png" 0 && ! pixels "$TMP/te.png" "$TMP/k.png" 0 \
  && pass "<lora:style:1:0> adapts the text encoder alone" || fail "a UNet multiplier of 0"
expect_fail "a tag without --lora-dir" "needs --lora-dir" diffusion txt2img --model "$TMP/m" --prompt "x <lora:style:1>" \
  --out "$TMP/r.png"
expect_fail "a tag of no file" "nothing.safetensors" diffusion txt2img --model "$TMP/m" --lora-dir "$TMP" \
  --prompt "x <lora:nothing:1>" --out "$TMP/r.png"
for bad in "<lora:style:x>" "<lora:style:1:2:3>" "<lora:style:dyn=4>" "<lora::1>"; do
  expect_fail "a malformed tag $bad" "<lora:" diffusion txt2img --model "$TMP/m" --lora-dir "$TMP" --prompt "x $bad" \
    --out "$TMP/r.png"
done
# refusals: nothing is written
expect_fail "a missing LoRA file" "nope.safetensors" diffusion txt2img --model "$TMP/m" --prompt x --steps 2 \
  --out "$TMP/r.png" --lora "$TMP/nope.safetensors"
st1 "$TMP/stray.safetensors" lora_unet_down_blocks_9_attentions_0_proj_in.lora_down.weight
expect_fail "a key of no layer" "down_blocks_9_attentions_0_proj_in: the UNet has no such layer" diffusion txt2img \
  --model "$TMP/m" --prompt x --steps 2 --out "$TMP/r.png" --lora "$TMP/stray.safetensors"
st1 "$TMP/narrow.safetensors" lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight
expect_fail "a layer with a down factor alone" "attn1.to_q.weight has no up factor" diffusion txt2img \
  --model "$TMP/m" --prompt x --steps 2 --out "$TMP/r.png" --lora "$TMP/narrow.safetensors"
expect_fail "':' without a weight" "a weight after ':'" diffusion txt2img --model "$TMP/m" --prompt x \
  --out "$TMP/r.png" --lora "$TMP/style.safetensors:"
expect_fail "a weight out of range" "outside -10..10" diffusion txt2img --model "$TMP/m" --prompt x \
  --out "$TMP/r.png" --lora "$TMP/style.safetensors:99"
expect_fail "a picture cannot replace the LoRA" "--lora" diffusion txt2img --model "$TMP/m" --prompt x \
  --out "$TMP/style.safetensors" --lora "$TMP/style.safetensors"
[ ! -e "$TMP/r.png" ] && pass "no picture written when refused" || fail "a refused run wrote a picture"
many=(); for i in $(seq 17); do many+=(--lora "$TMP/style.safetensors"); done
expect_fail "more than 16 LoRAs" "more than 16" diffusion txt2img --model "$TMP/m" --prompt x --out "$TMP/r.png" "${many[@]}"
# diffusion lora merge: the LoRA folded into the model and written (a folder, one file): they draw what the
# base with the LoRA merged at run does (the UNet written in fp32, not rounded into the base's fp16: a level)
diffusion lora merge --model "$TMP/m" --lora "$TMP/style.safetensors:0.7" --out "$TMP/merged" > "$TMP/log" 2>&1 \
  && diffusion lora merge --model "$TMP/m" --lora "$TMP/style.safetensors:0.7" --out "$TMP/merged.safetensors" \
     > /dev/null 2>&1 || fail "lora merge: $(tail -2 "$TMP/log")"
draw "$TMP/mf.png" --lora "$TMP/style.safetensors:0.7" --lora-merge
diffusion txt2img --model "$TMP/merged" --prompt "a cat" --steps 4 --seed 3 --out "$TMP/m1.png" > /dev/null 2>&1
diffusion txt2img --model "$TMP/merged.safetensors" --prompt "a cat" --steps 4 --seed 3 --width 32 --height 32 \
  --out "$TMP/m2.png" > /dev/null 2>&1
pixels "$TMP/m1.png" "$TMP/mf.png" 1 && pixels "$TMP/m1.png" "$TMP/m2.png" 0 \
  && pass "lora merge: the folder and the single file draw the base with the LoRA" || fail "lora merge draws differently"
expect_code 2 "lora merge without --lora" diffusion lora merge --model "$TMP/m" --out "$TMP/y"
expect_code 2 "lora without a subcommand" diffusion lora
expect_fail "lora merge into a folder that exists" "already exists" diffusion lora merge --model "$TMP/m" \
  --lora "$TMP/style.safetensors" --out "$TMP/merged"
finish
