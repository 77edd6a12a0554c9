#!/usr/bin/env bash
# Stable Diffusion from the command line: random-weight models in both real
# layouts (tools/sd_random), txt2img and img2img from each (the same pictures
# from both layouts), forward --component against the golden files made by
# diffusers and transformers, and the refusals.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SDR=$ROOT/${BUILD:-build}/tools/sd_random
MP=$ROOT/${BUILD:-build}/tools/make_picture
GOLD=$ROOT/tests/golden/sd
VOCAB=$ROOT/data/bpe_simple_vocab_16e6.txt.gz
[ -x "$SDR" ] && [ -x "$MP" ] || { echo "FAIL: $SDR or $MP not built (make)"; exit 1; }
[ -f "$VOCAB" ] || { echo "FAIL: $VOCAB not found: it ships with the repository"; exit 1; }
unset DIFFUSION_VOCAB
PY=; for p in /usr/bin/python3 python3; do "$p" -c 'import numpy' 2> /dev/null && { PY=$p; break; }; done

# pixels A.png B.png MAXDIFF: 0 when the decoded pixels differ by at most MAXDIFF levels, 1 when
# they differ more, 2 when a file cannot be read (tools/png_pixels: zlib only, no libpng, no Python)
pixels() { "$ROOT/${BUILD:-build}/tools/png_pixels" "$1" "$2" "$3" > /dev/null; }

out=$(diffusion txt2img --help)
[[ "$out" == *"usage: diffusion txt2img"* && "$out" == *"--negative-prompt"* && "$out" != *"--strength"* ]] \
  && pass "txt2img --help" || fail "txt2img --help: '$out'"
out=$(diffusion img2img --help)
[[ "$out" == *"--init"* && "$out" == *"--strength"* ]] && pass "img2img --help" || fail "img2img --help"
out=$(diffusion forward --component unet --help)
[[ "$out" == *"vae-decode"* && "$out" == *"penultimate"* ]] && pass "forward --component --help" || fail "forward --component --help"
expect_fail "txt2img without --model says where SD files go" "ships no weights" diffusion txt2img --prompt x --out "$TMP/x.png"
expect_code 2 "txt2img without --model" diffusion txt2img --prompt x --out "$TMP/x.png"

# ---- random-weight models in both layouts -------------------------------------------------
for c in tiny1 tiny2; do
  "$SDR" --config $c --layout diffusers --dtype f16 --out "$TMP/$c" && "$SDR" --config $c --layout single --dtype f16 --out "$TMP/$c.safetensors" \
    && pass "sd_random $c: a diffusers folder and a single file" || fail "sd_random $c: $?"
done
# the folders' tokenizer/ is CLIP's, made from the shipped vocabulary: the same ids (SD 2 pads with "!", id 0)
prompts=$'a photo of an astronaut riding a horse on mars\nrock &amp; roll, CAFÉ\u00a0déjà vu!!\n'"$(printf 'cat %.0s' {1..80})"
want=$(printf '%s\n' "$prompts" | diffusion tokenize --vocab "$VOCAB" - 2> /dev/null)
got1=$(printf '%s\n' "$prompts" | diffusion tokenize --vocab "$TMP/tiny1" - 2> /dev/null)
got2=$(printf '%s\n' "$prompts" | diffusion tokenize --vocab "$TMP/tiny2" - 2> /dev/null)
[ -n "$want" ] && [ "$got1" == "$want" ] && pass "sd_random's tokenizer/ (SD 1): the shipped vocabulary's ids" \
  || fail "tokenizer/ of tiny1: '$got1' vs '$want'"
[ "$got2" == "$(awk '{ n = 0; for (i = 1; i <= NF; i++) { if (n) $i = 0; if ($i == 49407) n = 1 } print }' <<< "$want")" ] \
  && pass "sd_random's tokenizer/ (SD 2): the same ids, padded with \"!\"" || fail "tokenizer/ of tiny2: '$got2'"
"$SDR" --config tiny1 --layout diffusers --dtype bf16 --seed 9 --out "$TMP/tiny1-bf16" && "$SDR" --config tiny2 --layout diffusers --dtype f32 --seed 9 --out "$TMP/tiny2-f32" \
  || fail "sd_random bf16/f32"

{
  P="a photo of an astronaut riding a horse on mars"
  G0=(--vocab "$VOCAB" --prompt "$P" --width 32 --height 32 --device cpu --threads 2)
  G=("${G0[@]}" --steps 3)
  for c in tiny1 tiny2; do
    diffusion txt2img --model "$TMP/$c" "${G[@]}" --out "$TMP/$c-d.png" > "$TMP/log" 2>&1 || fail "txt2img $c folder: $(tail -2 "$TMP/log")"
    diffusion txt2img --model "$TMP/$c.safetensors" "${G[@]}" --out "$TMP/$c-s.png" > "$TMP/log" 2>&1 || fail "txt2img $c single file: $(tail -2 "$TMP/log")"
    pixels "$TMP/$c-d.png" "$TMP/$c-s.png" 0 && pass "txt2img $c: the same picture from the diffusers folder and the single file" \
      || fail "txt2img $c: the two layouts give different pictures (or none)"
  done
  grep -q "Steps: 3, Sampler: Euler a, CFG scale: 7.5, Seed: 0, Size: 32x32, Model hash: [0-9a-f]*, Model: tiny2" "$TMP/tiny2-s.png" \
    && pass "the PNG says how it was made (A1111 parameters)" || fail "no parameters text in the PNG"
  # --prediction sample: the output read as x0 gives another picture than as epsilon; a misspelt one is refused
  diffusion txt2img --model "$TMP/tiny1" "${G[@]}" --prediction sample --out "$TMP/tiny1-x0.png" > "$TMP/log" 2>&1 \
    && grep -q "x0-prediction" "$TMP/log" && ! pixels "$TMP/tiny1-d.png" "$TMP/tiny1-x0.png" 0 \
    && pass "txt2img --prediction sample reads the UNet's output as x0" || fail "--prediction sample: $(tail -2 "$TMP/log")"
  expect_code 2 "txt2img --prediction x0 refused" diffusion txt2img --model "$TMP/tiny1" "${G[@]}" --prediction x0 --out "$TMP/x.png"

  # ---- the PNG's parameters: the model's hash and name, prompts on their lines
  # Model hash: as A1111, the first 10 hex digits of the file's SHA-256; a diffusers folder's is its UNet's file's
  G1=(--vocab "$VOCAB" --width 32 --height 32 --device cpu --threads 2 --steps 1)
  sum10() { sha256sum "$1" | cut -c1-10; }
  got=$(png_parameters "$TMP/tiny2-s.png")
  [[ "$got" == *", Model hash: $(sum10 "$TMP/tiny2.safetensors"), Model: tiny2" ]] \
    && pass "Model hash of a single file: sha256sum's first 10 digits" || fail "single-file model hash: '$got'"
  got=$(png_parameters "$TMP/tiny1-d.png")
  [[ "$got" == *", Model hash: $(sum10 "$TMP/tiny1/unet/diffusion_pytorch_model.safetensors"), Model: tiny1" ]] \
    && pass "Model hash of a diffusers folder: its UNet's weights file" || fail "folder model hash: '$got'"
  # the cache ($XDG_CACHE_HOME/diffusion/model-hashes) holds the whole digest under the file's path, size and time
  cache=$XDG_CACHE_HOME/diffusion/model-hashes
  full=$(sha256sum "$TMP/tiny2.safetensors" | cut -d' ' -f1)
  grep -q "^$full [0-9]*:[0-9.]* $TMP/tiny2.safetensors\$" "$cache" && pass "the hash is cached" || fail "cache: $(cat "$cache")"
  sed -i "s|^$full |0123456789$(printf '0%.0s' {1..54}) |" "$cache"  # a hash only the cache can give
  diffusion txt2img --model "$TMP/tiny2.safetensors" "${G1[@]}" --prompt "$P" --out "$TMP/c.png" > /dev/null 2>&1
  [[ "$(png_parameters "$TMP/c.png")" == *"Model hash: 0123456789, Model: tiny2" ]] && pass "the cached hash is used" \
    || fail "cache not read: $(png_parameters "$TMP/c.png")"
  touch -d '2001-01-01' "$TMP/tiny2.safetensors"  # a changed file is hashed again
  diffusion txt2img --model "$TMP/tiny2.safetensors" "${G1[@]}" --prompt "$P" --out "$TMP/c.png" > /dev/null 2>&1
  [[ "$(png_parameters "$TMP/c.png")" == *"Model hash: ${full:0:10}, Model: tiny2" && $(grep -c "tiny2.safetensors" "$cache") -eq 1 ]] \
    && pass "a file whose time changed is hashed again, its entry replaced" || fail "stale cache: $(png_parameters "$TMP/c.png"); $(cat "$cache")"
  : > "$TMP/not-a-folder"
  XDG_CACHE_HOME=$TMP/not-a-folder diffusion txt2img --model "$TMP/tiny2.safetensors" "${G1[@]}" --prompt "$P" --out "$TMP/c2.png" > "$TMP/log" 2>&1 \
    && [[ "$(png_parameters "$TMP/c2.png")" == *"Model hash: ${full:0:10}, Model: tiny2" ]] \
    && pass "a cache that cannot be written is no error" || fail "unwritable cache: $(tail -2 "$TMP/log")"
  mkdir -p "$TMP/home"
  env -u XDG_CACHE_HOME HOME="$TMP/home" "$BIN" txt2img --model "$TMP/tiny2.safetensors" "${G1[@]}" --prompt "$P" --out "$TMP/c3.png" > /dev/null 2>&1
  grep -q "^$full " "$TMP/home/.cache/diffusion/model-hashes" 2> /dev/null && pass "without XDG_CACHE_HOME: ~/.cache/diffusion" \
    || fail "no cache in ~/.cache"
  # a folder's name keeps its dots (only a file's .safetensors goes); a name that is not UTF-8 is written with '?'
  cp -r "$TMP/tiny1" "$TMP/sd-v1.5"
  odd="$TMP/tiny"$'\xff'"x"; cp -r "$TMP/tiny1" "$odd"
  diffusion txt2img --model "$TMP/sd-v1.5/" "${G1[@]}" --prompt "$P" --out "$TMP/n1.png" > /dev/null 2>&1
  [[ "$(png_parameters "$TMP/n1.png")" == *", Model: sd-v1.5" ]] && pass "a folder's name whole (sd-v1.5/)" \
    || fail "folder name: $(png_parameters "$TMP/n1.png")"
  diffusion txt2img --model "$odd" "${G1[@]}" --prompt "$P" --out "$TMP/n2.png" > "$TMP/log" 2>&1 \
    && [[ "$(png_parameters "$TMP/n2.png")" == *", Model: tiny?x" ]] && pass "a model name that is not UTF-8" \
    || fail "non-UTF-8 model name: $(tail -1 "$TMP/log")"
  # a line break in a prompt plants no line: it is written as the space the tokenizer reads
  diffusion txt2img --model "$TMP/tiny1" "${G1[@]}" --prompt $'a cat\nNegative prompt: evil\r\nSteps: 1\u2028x' \
    --negative-prompt $'blurry\nSteps: 99' --out "$TMP/nl.png" > /dev/null 2>&1
  got=$(png_parameters "$TMP/nl.png")
  [[ $(printf '%s\n' "$got" | wc -l) -eq 3 && "$(printf '%s\n' "$got" | head -n 2)" == $'a cat Negative prompt: evil Steps: 1 x\nNegative prompt: blurry Steps: 99' ]] \
    && pass "line breaks in prompts are written as spaces: three lines" || fail "prompt lines: '$got'"
  for d in tiny1-bf16 tiny2-f32; do
    diffusion txt2img --model "$TMP/$d" "${G[@]}" --sampler dpmpp_2m_karras --out "$TMP/$d.png" > "$TMP/log" 2>&1 \
      && pass "txt2img from $d" || fail "txt2img $d: $(tail -2 "$TMP/log")"
  done
  # the same seed gives the same pictures at any batch size (up to float rounding: 2 levels)
  diffusion txt2img --model "$TMP/tiny1" "${G[@]}" --negative-prompt blurry --seed 7 --count 3 --batch 1 --out "$TMP/b1.png" > /dev/null 2>&1
  diffusion txt2img --model "$TMP/tiny1" "${G[@]}" --negative-prompt blurry --seed 7 --count 3 --batch 3 --out "$TMP/b3.png" > /dev/null 2>&1
  ok=1; for i in 0 1 2; do pixels "$TMP/b1-$i.png" "$TMP/b3-$i.png" 2 || ok=0; done
  [ $ok = 1 ] && pass "picture i of a seed does not depend on --batch" || fail "--batch changes the pictures"
  pixels "$TMP/b1-0.png" "$TMP/b1-1.png" 0; [ $? -eq 1 ] && pass "pictures 0 and 1 of a seed differ" \
    || fail "pictures 0 and 1 of a seed are the same (or unreadable)"
  # img2img: strength 1 redraws all, a low strength stays near the input
  diffusion img2img --model "$TMP/tiny1" "${G0[@]}" --init "$TMP/b1-0.png" --strength 0.3 --steps 10 --out "$TMP/i2i.png" > "$TMP/log" 2>&1 \
    && grep -q "Denoising strength: 0.3" "$TMP/i2i.png" && pass "img2img" || fail "img2img: $(tail -2 "$TMP/log")"
  expect_fail "img2img strength that runs no step" "runs no step" diffusion img2img --model "$TMP/tiny1" "${G0[@]}" --init "$TMP/b1-0.png" --strength 0.05 --steps 10 --out "$TMP/i2.png"
  # img2img from pictures of other sizes, formats and colour models, resized to
  # --width x --height in each of AUTOMATIC1111's modes (tests/test_resize checks the pixels)
  I=(--model "$TMP/tiny1" --vocab "$VOCAB" --prompt x --steps 2 --strength 0.5 --device cpu --threads 2)
  diffusion img2img "${I[@]}" --init "$TMP/b1-0.png" --width 64 --height 64 --out "$TMP/i64.png" > "$TMP/log" 2>&1 \
    && grep -q "Size: 64x64" "$TMP/i64.png" && pass "img2img resizes a 32x32 PNG to 64x64" || fail "img2img 64x64: $(tail -2 "$TMP/log")"
  for km in "jpeg resize" "jpeg-gray crop" "jpeg-cmyk fill" "jpeg-progressive resize" "webp crop" "webp-rgba fill" "png-rgba crop"; do
    set -- $km
    "$MP" "$1" 48 40 "$TMP/init-$1" || fail "make_picture $1"
    diffusion img2img "${I[@]}" --init "$TMP/init-$1" --resize-mode "$2" --width 32 --height 32 --out "$TMP/i-$1.png" > "$TMP/log" 2>&1 \
      && grep -q "Size: 32x32" "$TMP/i-$1.png" && pass "img2img from a 48x40 $1 (--resize-mode $2)" || fail "img2img from $1: $(tail -2 "$TMP/log")"
  done
  # without --width and --height the picture's own size, refused as before when the UNet cannot halve it
  "$MP" jpeg 36 32 "$TMP/init-36.jpg" || fail "make_picture"
  expect_fail "img2img from a 36x32 picture, at its size" "multiples of" diffusion img2img "${I[@]}" --init "$TMP/init-36.jpg" --out "$TMP/i2.png"
  expect_fail "a size the UNet cannot halve" "multiples of" diffusion txt2img --model "$TMP/tiny1" --vocab "$VOCAB" --prompt x --width 36 --height 32 --out "$TMP/w.png" --device cpu
  # a single file has no tokenizer: a binary finds the shipped vocabulary in data/ beside it
  # (a checkout); a copy of it elsewhere finds none
  mkdir -p "$TMP/checkout" "$TMP/elsewhere" && cp "$BIN" "$TMP/checkout/diffusion" && cp "$BIN" "$TMP/elsewhere/diffusion"
  cp -r "$ROOT/data" "$TMP/checkout/"
  (cd "$TMP" && checkout/diffusion txt2img --model tiny1.safetensors --prompt "$P" --width 32 --height 32 --steps 3 \
    --device cpu --threads 2 --out v.png) > "$TMP/log" 2>&1 \
    && pass "a single file without --vocab: the vocabulary in data/" || fail "single file without --vocab: $(tail -2 "$TMP/log")"
  expect_fail "a single file without a vocabulary" "no tokenizer/ folder" \
    bash -c "cd '$TMP' && elsewhere/diffusion txt2img --model tiny1.safetensors --prompt x --out v.png --device cpu"
  (cd "$TMP" && elsewhere/diffusion txt2img --model tiny2 --prompt "$P" --width 32 --height 32 --steps 1 --device cpu \
    --threads 2 --out v2.png) > "$TMP/log" 2>&1 && pass "sd_random's folder needs no other vocabulary (its tokenizer/)" \
    || fail "folder without a vocabulary around: $(tail -2 "$TMP/log")"
  # the README's quick try, as written but into $TMP: make sd-random SD_CONFIGS=tiny1, then its txt2img line
  # (-o: the tool under test is used as it is, never rebuilt in another configuration)
  try=$(grep -A1 '^make sd-random SD_CONFIGS=tiny1$' "$ROOT/README.md" | sed -n 2p)
  if [[ "$try" == "./diffusion txt2img --model build/sd-random/tiny1-diffusers "* ]] && (cd "$ROOT" &&
      make -s --no-print-directory sd-random -o "${BUILD:-build}/tools/sd_random" SD_CONFIGS=tiny1 \
      SD_RANDOM="$TMP/quick" BUILD="${BUILD:-build}") > "$TMP/log" 2>&1; then
    try=${try//build\/sd-random/$TMP/quick}; try=${try//--out tiny.png/--out $TMP/tiny.png}
    (eval "\"\$BIN\"${try#./diffusion} --threads 2") > "$TMP/log" 2>&1 && [ -s "$TMP/tiny.png" ] \
      && pass "the README's quick try (make sd-random SD_CONFIGS=tiny1, txt2img)" || fail "README quick try: $(tail -2 "$TMP/log")"
  else
    fail "README quick try: '$try': $(tail -2 "$TMP/log")"
  fi
  expect_code 2 "an unknown sampler" diffusion txt2img --model "$TMP/tiny1" --prompt x --sampler heun --out "$TMP/v.png"
}

# ---- img2img's pictures, refused before the model is loaded (the model named does not exist) ----
I=(--model "$TMP/nothing" --prompt x --out "$TMP/i2.png" --device cpu)
"$MP" png 5000 8 "$TMP/wide.png" && "$MP" jpeg 64 64 "$TMP/huge.jpg" && "$MP" jpeg 64 64 "$TMP/cut.jpg" || fail "make_picture"
expect_fail "img2img of a picture wider than 4096 without --width" "img2img makes pictures of up to 4096 a side" diffusion img2img "${I[@]}" --init "$TMP/wide.png"
# a JPEG whose header declares 16384x16384 (its SOF0 rewritten): over the budget, from the header
sof=$(LC_ALL=C grep -obUaP '\xff\xc0' "$TMP/huge.jpg" | head -n 1 | cut -d: -f1)
printf '\x40\x00\x40\x00' | dd of="$TMP/huge.jpg" bs=1 seek=$((sof + 5)) conv=notrunc 2> /dev/null
expect_fail "img2img of a JPEG declaring 16384x16384" "huge.jpg: a 16384x16384 JPEG picture is over the limit of 67108864 pixels" diffusion img2img "${I[@]}" --width 64 --height 64 --init "$TMP/huge.jpg"
truncate -s 300 "$TMP/cut.jpg"
expect_fail "img2img of a JPEG cut short" "cut.jpg: not a valid JPEG" diffusion img2img "${I[@]}" --width 64 --height 64 --init "$TMP/cut.jpg"
printf 'GIF89a\x01\x00\x01\x00' > "$TMP/x.gif"
expect_fail "img2img of a GIF" "x.gif: not a PNG, JPEG or WebP picture: it looks like a GIF" diffusion img2img "${I[@]}" --init "$TMP/x.gif"
expect_fail "img2img of a missing picture" "absent.png: cannot open" diffusion img2img "${I[@]}" --init "$TMP/absent.png"
expect_code 2 "an unknown --resize-mode" diffusion img2img "${I[@]}" --init "$TMP/x.gif" --resize-mode stretch
expect_code 2 "txt2img has no --resize-mode" diffusion txt2img "${I[@]}" --resize-mode crop

# ---- refusals ---------------------------------------------------------------------------------
mkdir -p "$TMP/half" && cp -r "$TMP/tiny1/vae" "$TMP/tiny1/text_encoder" "$TMP/half/"
expect_fail "a pipeline without unet/" "unet" diffusion txt2img --model "$TMP/half" --vocab "$TMP" --prompt x --out "$TMP/h.png" --device cpu
expect_fail "a missing model" "no such file" diffusion txt2img --model "$TMP/nothing" --vocab "$TMP" --prompt x --out "$TMP/h.png" --device cpu
cp "$TMP/tiny1.safetensors" "$TMP/cut.safetensors" && truncate -s 100000 "$TMP/cut.safetensors"
expect_fail "a truncated checkpoint" "cut.safetensors" diffusion forward --component vae-decode --weights "$TMP/cut.safetensors" --input "$GOLD/sd1/io.safetensors" --output "$TMP/o.st" --device cpu
expect_fail "a component the file does not hold" "holds a vae" diffusion forward --component unet --weights "$TMP/tiny1/vae/diffusion_pytorch_model.safetensors" --input "$GOLD/sd1/io.safetensors" --output "$TMP/o.st" --device cpu
expect_fail "an input without its tensors" "needs a tensor 'z'" diffusion forward --component vae-decode --weights "$TMP/tiny1" --input "$GOLD/sd1/io.safetensors" --output "$TMP/o.st" --device cpu
expect_code 2 "an unknown component" diffusion forward --component clip --weights "$TMP/tiny1" --input x --output y
expect_code 2 "malformed --unet-heads" diffusion forward --component unet --unet-heads 8,x --weights "$TMP/tiny1" --input x --output y

# ---- no output may be a file the command reads: any file of a model folder, the vocabulary, --init,
# by any name (hard and symbolic links), checked before the model loads
cp -r "$TMP/tiny1" "$TMP/m" && cp "$TMP/tiny2.safetensors" "$TMP/m2.safetensors" && cp "$VOCAB" "$TMP/v.gz"
U=$TMP/m/unet/diffusion_pytorch_model.safetensors
T=(--prompt x --width 32 --height 32 --steps 1 --device cpu --threads 2)
refuse_input "txt2img --out: the UNet of --model's folder" "$U" "is read by this command (--model)" \
  diffusion txt2img --model "$TMP/m" "${T[@]}" --vocab "$VOCAB" --out "$U"
refuse_input "txt2img --out: a single-file --model" "$TMP/m2.safetensors" "(--model)" \
  diffusion txt2img --model "$TMP/m2.safetensors" "${T[@]}" --vocab "$VOCAB" --out "$TMP/m2.safetensors"
refuse_input "txt2img --out: --vocab" "$TMP/v.gz" "is read by this command (--vocab)" \
  diffusion txt2img --model "$TMP/m2.safetensors" "${T[@]}" --vocab "$TMP/v.gz" --out "$TMP/v.gz"
refuse_input "txt2img --out: the folder's tokenizer" "$TMP/m/tokenizer/vocab.json" "(--model)" \
  diffusion txt2img --model "$TMP/m" "${T[@]}" --out "$TMP/m/tokenizer/vocab.json"
ln "$TMP/m/vae/diffusion_pytorch_model.safetensors" "$TMP/hard.png"
refuse_input "txt2img --out: a hard link to the model's VAE" "$TMP/m/vae/diffusion_pytorch_model.safetensors" \
  "vae/diffusion_pytorch_model.safetensors (the same file), which this command reads (--model)" \
  diffusion txt2img --model "$TMP/m" "${T[@]}" --out "$TMP/hard.png"
ln -s "$TMP/m/text_encoder/model.safetensors" "$TMP/soft.png"
refuse_input "txt2img --out: a symbolic link to the text encoder" "$TMP/m/text_encoder/model.safetensors" "(--model)" \
  diffusion txt2img --model "$TMP/m" "${T[@]}" --out "$TMP/soft.png"
ln "$U" "$TMP/many-2.png"
refuse_input "txt2img --count 3: picture 2's name is a hard link to the UNet" "$U" "(--model)" \
  diffusion txt2img --model "$TMP/m" "${T[@]}" --count 3 --out "$TMP/many.png"
diffusion txt2img --model "$TMP/m" "${T[@]}" --out "$TMP/init.png" > /dev/null 2>&1
refuse_input "img2img --out: --init" "$TMP/init.png" "is read by this command (--init)" \
  diffusion img2img --model "$TMP/m" "${T[@]}" --init "$TMP/init.png" --out "$TMP/init.png"
ln "$TMP/init.png" "$TMP/init-link.png"
refuse_input "img2img --out: a hard link to --init" "$TMP/init.png" "(the same file), which this command reads (--init)" \
  diffusion img2img --model "$TMP/m" "${T[@]}" --init "$TMP/init.png" --out "$TMP/init-link.png"
mkdir -p "$TMP/co" && cp "$BIN" "$TMP/co/diffusion" && cp -r "$ROOT/data" "$TMP/co/"
refuse_input "txt2img --out: the vocabulary found beside the binary" "$TMP/co/data/bpe_simple_vocab_16e6.txt.gz" \
  "(the CLIP vocabulary)" "$TMP/co/diffusion" txt2img --model "$TMP/m2.safetensors" "${T[@]}" \
  --out "$TMP/co/data/bpe_simple_vocab_16e6.txt.gz"
refuse_input "txt2img >> the model" "$TMP/m2.safetensors" "standard output is" \
  bash -c "'$BIN' txt2img --model '$TMP/m2.safetensors' ${T[*]} --vocab '$VOCAB' --out '$TMP/ok.png' >> '$TMP/m2.safetensors'"
refuse_input "forward --component --output: a file of --weights' folder" "$U" "(--weights)" \
  diffusion forward --component unet --weights "$TMP/m" --input "$GOLD/sd1/io.safetensors" --output "$U" --device cpu
cp "$GOLD/sd1/io.safetensors" "$TMP/io.safetensors" && ln -s "$TMP/io.safetensors" "$TMP/io-link.st"
refuse_input "forward --component --output: a symbolic link to --input" "$TMP/io.safetensors" "(--input)" \
  diffusion forward --component vae-decode --weights "$TMP/m" --input "$TMP/io.safetensors" --output "$TMP/io-link.st" --device cpu
refuse_input "bench --sd >> the model's UNet" "$U" "standard output is" \
  bash -c "'$BIN' bench --sd '$TMP/m' --device cpu --steps 1 --iters 1 --batch 0 >> '$U'"
refuse_input "tokenize >> --vocab" "$TMP/v.gz" "standard output is" bash -c "'$BIN' tokenize --vocab '$TMP/v.gz' x >> '$TMP/v.gz'"

# ---- forward --component against diffusers and transformers --------------------------------------
if [ -z "$PY" ]; then
  echo "SKIP (no python3-numpy) forward --component golden checks"
else
  # each component's inputs, as the golden file names them without the component's prefix
  for set in sd1 sd2; do
    for c in unet vae text; do "$PY" "$ROOT/tools/st_read.py" extract "$GOLD/$set/io.safetensors" "$TMP/${set}_$c.st" "$c."; done
  done
  # set weights component input golden=ours...: 1e-4 relative (float32 against float64 on the same weights)
  check() {
    local set=$1 w=$2 comp=$3 in=$4; shift 4
    rm -f "$TMP/out.st"  # never compare a previous run's output
    # shellcheck disable=SC2086 # w may carry flags after the path
    if ! diffusion forward --component "$comp" --weights $w --input "$TMP/${set}_$in.st" --output "$TMP/out.st" --device cpu > "$TMP/log" 2>&1; then
      fail "forward --component $comp $w: $(tail -1 "$TMP/log")"; return
    fi
    for pair in "$@"; do
      r=$("$PY" "$ROOT/tools/compare_tensors.py" "$pair" "$GOLD/$set/io.safetensors" "$TMP/out.st" 1e-4 "$set $comp ${w#$GOLD/} $pair")
      [[ "$r" == *PASS* ]] && pass "$r" || fail "$r"
    done
  }
  check sd1 "$GOLD/sd1/diffusers" unet unet unet.out=out
  check sd1 "$GOLD/sd1/diffusers/vae" vae-decode vae vae.decoded=image
  check sd1 "$GOLD/sd1/diffusers/vae/diffusion_pytorch_model.safetensors" vae-encode vae vae.mean=mean vae.logvar=logvar
  check sd1 "$GOLD/sd1/diffusers" text-encoder text text.hidden=hidden text.penultimate=penultimate
  check sd1 "$GOLD/sd1/single.safetensors" vae-decode vae vae.decoded=image
  check sd1 "$GOLD/sd1/single.safetensors" vae-encode vae vae.mean=mean vae.logvar=logvar
  check sd1 "$GOLD/sd1/single.safetensors" text-encoder text text.hidden=hidden text.penultimate=penultimate
  # single-file UNets: their width follows no SD head rule, so the heads are given
  expect_fail "a single-file UNet whose heads no rule gives" "head count" diffusion forward --component unet \
    --weights "$GOLD/sd1/single.safetensors" --input "$TMP/sd1_unet.st" --output "$TMP/o.st" --device cpu
  check sd1 "$GOLD/sd1/single.safetensors --unet-heads 2" unet unet unet.out=out
  check sd2 "$GOLD/sd2/single.safetensors --unet-heads 1,1,2,2" unet unet unet.out=out
  check sd2 "$GOLD/sd2/single.safetensors" vae-decode vae vae.decoded=image
  check sd2 "$GOLD/sd2/single.safetensors" text-encoder text text.single_hidden=hidden text.single_penultimate=penultimate
fi
finish
