#!/usr/bin/env bash
# Stable Diffusion settings from the command line: a request checked against
# the model's configs before its weights are read (a model of garbage weights
# still gets the size error, at once), the scheduler config refused by key and
# file or followed (another schedule or spacing changes the pictures), what a
# sampler does not follow warned about, sharded weights with their index
# giving the same pictures as one file, pickles and link loops named.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SDR=$ROOT/${BUILD:-build}/tools/sd_random
VOCAB=$ROOT/data/bpe_simple_vocab_16e6.txt.gz
[ -x "$SDR" ] || { echo "FAIL: $SDR not built (make)"; exit 1; }
unset DIFFUSION_VOCAB

# pixels A B N: 0 when the pictures differ by at most N levels of 255, 1 when
# they differ more, 2 when one cannot be read (tools/png_pixels)
pixels() { "$ROOT/${BUILD:-build}/tools/png_pixels" "$1" "$2" "$3" > /dev/null; }
# differ A B: the two pictures were both read and differ
differ() { pixels "$1" "$2" 0; [ $? -eq 1 ]; }

"$SDR" --config tiny1 --layout diffusers --dtype f16 --out "$TMP/m" > /dev/null || { fail "sd_random"; finish; }
SCHED=$TMP/m/scheduler/scheduler_config.json
cp "$SCHED" "$TMP/sched.json"
# sched JSON: the model's scheduler config, replaced
sched() { printf '%s\n' "$1" > "$SCHED"; }
stock() { cp "$TMP/sched.json" "$SCHED"; }

# ---- the request, before the weights ----------------------------------------------------------
cp -r "$TMP/m" "$TMP/garbage"
for f in "$TMP"/garbage/*/*.safetensors; do head -c 100000 /dev/urandom | tr '{' x > "$f"; done
G=(--vocab "$VOCAB" --prompt x --device cpu --threads 2)
if [ -f "$VOCAB" ]; then
  t0=$(date +%s%N)
  expect_fail "a width the UNet cannot halve, before the weights (garbage here) are read" "multiples of 8" \
    diffusion txt2img --model "$TMP/garbage" "${G[@]}" --width 100 --out "$TMP/w.png"
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  [ "$ms" -lt 5000 ] && pass "refused in $ms ms" || fail "the size refusal took $ms ms"
  expect_fail "the weights are read only after the checks" "not a safetensors file" \
    diffusion txt2img --model "$TMP/garbage" "${G[@]}" --width 32 --height 32 --out "$TMP/w.png"
else
  fail "$VOCAB not found: it ships with the repository"
fi
expect_code 2 "--width 0" diffusion txt2img --model "$TMP/garbage" --prompt x --width 0 --out "$TMP/w.png"
expect_code 2 "--height -8" diffusion txt2img --model "$TMP/garbage" --prompt x --height -8 --out "$TMP/w.png"

# ---- the scheduler config: refused by key and file ----------------------------------------------
refuse() {  # refuse JSON KEY
  sched "$1"
  expect_fail "scheduler config $1" "$2" diffusion txt2img --model "$TMP/m" --prompt x --vocab "$VOCAB" --out "$TMP/s.png"
  local err; err=$(diffusion txt2img --model "$TMP/m" --prompt x --vocab "$VOCAB" --out "$TMP/s.png" 2>&1 >/dev/null)
  [[ "$err" == *"scheduler/scheduler_config.json"* ]] || fail "the message of $1 does not name the file: $err"
}
refuse '{"beta_schedule": "scaled_linear", "num_train_timesteps": -5}' "num_train_timesteps"
refuse '{"beta_schedule": "scaled_linear", "beta_start": "x"}' "beta_start"
refuse '{"beta_schedule": "cosine"}' "beta_schedule"
refuse '{"beta_schedule": "scaled_linear", "prediction_type": 42}' "prediction_type"
refuse '{"beta_schedule": "scaled_linear", "timestep_spacing": "even"}' "timestep_spacing"
refuse '{"beta_schedule": "scaled_linear", "beta_schedule": "linear"}' "duplicate key 'beta_schedule'"
stock

# ---- followed: another schedule or spacing, other pictures ----------------------------------------
if [ -f "$VOCAB" ]; then
  P=(--vocab "$VOCAB" --prompt "a red cube" --width 32 --height 32 --steps 4 --device cpu --threads 2 --seed 3)
  run() { diffusion txt2img --model "$TMP/m" "${P[@]}" "${@:2}" --out "$TMP/$1.png" > "$TMP/$1.log" 2>&1 || fail "txt2img $1: $(tail -2 "$TMP/$1.log")"; }
  run stock
  run stock2
  pixels "$TMP/stock.png" "$TMP/stock2.png" 0 && pass "the same settings, the same picture" || fail "two runs differ"
  base='"beta_start": 0.00085, "beta_end": 0.012, "num_train_timesteps": 1000, "steps_offset": 1'
  sched "{\"beta_schedule\": \"linear\", $base}"
  run linear
  sched "{\"beta_schedule\": \"scaled_linear\", $base, \"timestep_spacing\": \"trailing\"}"
  run trailing
  for v in linear trailing; do
    differ "$TMP/stock.png" "$TMP/$v.png" && pass "$v: another picture" || fail "$v: not another picture than the stock config's"
  done
  # steps_offset moves the "leading" timesteps of DDIM only
  sched "{\"beta_schedule\": \"scaled_linear\", \"beta_start\": 0.00085, \"beta_end\": 0.012, \"steps_offset\": 0}"
  run ddim0 --sampler ddim
  stock
  run ddim1 --sampler ddim
  differ "$TMP/ddim0.png" "$TMP/ddim1.png" && pass "steps_offset followed by DDIM" || fail "steps_offset 0 and 1: not two DDIM pictures"
  # what a sampler does not follow is said
  sched "{\"beta_schedule\": \"scaled_linear\", $base, \"use_karras_sigmas\": true}"
  run karras --sampler euler
  grep -q "use_karras_sigmas" "$TMP/karras.log" && pass "use_karras_sigmas with euler: warned" || fail "no warning: $(cat "$TMP/karras.log")"
  stock
  run euler --sampler euler
  pixels "$TMP/euler.png" "$TMP/karras.png" 0 && pass "euler runs its own ladder whatever use_karras_sigmas" || fail "use_karras_sigmas changed euler"
  sched "{\"beta_schedule\": \"scaled_linear\", $base, \"use_karras_sigmas\": true}"
  run karras_dpm --sampler dpmpp_2m_karras
  grep -q "use_karras_sigmas" "$TMP/karras_dpm.log" && fail "use_karras_sigmas with dpmpp_2m_karras: warned" || pass "dpmpp_2m_karras follows use_karras_sigmas: no warning"
  stock

  # ---- sharded weights: an index and two shards give the one file's picture ----------------------
  cp -r "$TMP/m" "$TMP/sharded"
  "$ROOT/${BUILD:-build}/tools/st_shard" "$TMP/sharded/unet/diffusion_pytorch_model.safetensors" 2 \
    "$TMP/sharded/unet" diffusion_pytorch_model && rm "$TMP/sharded/unet/diffusion_pytorch_model.safetensors" \
    || fail "splitting the UNet"
  diffusion txt2img --model "$TMP/sharded" "${P[@]}" --out "$TMP/sharded.png" > "$TMP/sharded.log" 2>&1 || fail "txt2img from shards: $(tail -2 "$TMP/sharded.log")"
  pixels "$TMP/stock.png" "$TMP/sharded.png" 0 && pass "a sharded UNet with its index: the same picture" || fail "shards give another picture"
  rm "$TMP"/sharded/unet/diffusion_pytorch_model-00002-of-00002.safetensors
  expect_fail "a missing shard is named" "diffusion_pytorch_model-00002-of-00002.safetensors" \
    diffusion txt2img --model "$TMP/sharded" "${P[@]}" --out "$TMP/x.png"
else
  fail "$VOCAB not found: it ships with the repository"
fi

# ---- pickles and link loops ------------------------------------------------------------------
printf 'PK\003\004 a zip' > "$TMP/model.ckpt"
expect_fail "a .ckpt: a pickle, and how to convert it" "safetensors.torch" diffusion txt2img --model "$TMP/model.ckpt" --prompt x --out "$TMP/p.png"
ln -s "$TMP/loop" "$TMP/loop"
expect_fail "a link loop" "loop of symbolic links" diffusion txt2img --model "$TMP/loop" --prompt x --out "$TMP/p.png"
finish
