#!/usr/bin/env bash
# The CLI on bad input: non-zero exit, a clear message, nothing overwritten.
source "$(dirname "$0")/lib.sh"

# st_file PATH JSON_HEADER DATA_BYTES: a safetensors file with zero-filled data
st_file() {
  local path=$1 header=$2 nbytes=$3
  while [ $(( ${#header} % 8 )) -ne 0 ]; do header="$header "; done
  { printf "$(printf '\\x%02x' $(( ${#header} & 255 )) $(( (${#header} >> 8) & 255 )) 0 0 0 0 0 0)"
    printf '%s' "$header"; head -c "$nbytes" /dev/zero; } > "$path"
}

for cmd in train sample forward info export; do
  $BIN $cmd --help | grep -q "usage: diffusion $cmd" && pass "$cmd --help" || fail "$cmd --help"
done
expect_fail "no command" "usage" $BIN
expect_fail "unknown command" "unknown command" $BIN fly
expect_fail "unknown flag" "unknown flag '--bogus'" $BIN train --bogus 1
expect_fail "bad integer" "--steps: 'abc' is not an integer" $BIN train --steps abc
expect_fail "missing value" "--lr needs a value" $BIN train --lr
expect_fail "bad model name" "unknown model 'DiT-Q/3'" $BIN train --model DiT-Q/3 --out "$TMP/x"
expect_fail "missing data" "/nonexistent" $BIN train --data /nonexistent --out "$TMP/x"
expect_fail "missing checkpoint" "no such file" $BIN sample --ckpt "$TMP/none.safetensors"
expect_fail "bad sampler" "--sampler must be ddpm or ddim" $BIN sample --sampler euler
expect_fail "heads not dividing" "not divisible" $BIN train --hidden 36 --heads 5 --out "$TMP/x"

# a real checkpoint to corrupt
$BIN train "${TINY[@]}" --steps 1 --out "$TMP/run" > "$TMP/train.log" 2>&1 || { cat "$TMP/train.log"; fail "tiny training run"; finish; }
ck="$TMP/run/step_0000001.safetensors"
$BIN info "$ck" | grep -q "depth 2, hidden 32, heads 2" && pass "info on a checkpoint" || fail "info on a checkpoint"
$BIN info "$TMP/run" | grep -q "step_0000001" && pass "info on a run folder" || fail "info on a run folder"
sum=$(md5sum < "$ck")
expect_fail "train into an existing run" "already holds checkpoints" $BIN train "${TINY[@]}" --steps 1 --out "$TMP/run"
[ "$(md5sum < "$ck")" = "$sum" ] && pass "existing checkpoint untouched" || fail "existing checkpoint changed"
expect_fail "resume with a recipe flag" "--lr is fixed by the checkpoint" $BIN train --resume "$TMP/run" --lr 0.5
mkdir -p "$TMP/other" && cp "$ck" "$TMP/other/step_0000009.safetensors"
expect_fail "resume into another run's folder" "holds checkpoints of another run" \
  $BIN train --resume "$TMP/run" --out "$TMP/other" --steps 3
[ "$(ls "$TMP/other")" = "step_0000009.safetensors" ] && pass "the other run is untouched" || fail "the other run changed"
expect_fail "export over a checkpoint" "refusing to overwrite the training checkpoint" \
  $BIN export --ckpt "$TMP/run" --out "$ck"
[ "$(md5sum < "$ck")" = "$sum" ] && pass "checkpoint untouched by export" || fail "checkpoint changed by export"
expect_fail "sample into a missing folder" "is missing or read-only" $BIN sample --ckpt "$ck" --grid "$TMP/no/dir/g.png"
expect_fail "duplicate classes" "class 3 is listed twice" $BIN sample --ckpt "$ck" --classes 3,3 --out-dir "$TMP/s"
expect_fail "too many samples" "over 1000000 samples" $BIN sample --ckpt "$ck" --per-class 429496730
expect_fail "absurd thread count" "--threads must be in 0..1024" $BIN sample --ckpt "$ck" --threads 100000
expect_fail "zero-size shape flag" "--input-size must be positive" $BIN train --input-size 0 --out "$TMP/z"
head -c 1000 "$ck" > "$TMP/trunc.safetensors"
expect_fail "truncated checkpoint (info)" "trunc.safetensors" $BIN info "$TMP/trunc.safetensors"
expect_fail "truncated checkpoint (sample)" "trunc.safetensors" $BIN sample --ckpt "$TMP/trunc.safetensors"
expect_fail "truncated checkpoint (resume)" "trunc.safetensors" $BIN train --resume "$TMP/trunc.safetensors"
printf 'garbage' > "$TMP/garbage.safetensors"
expect_fail "garbage file" "garbage.safetensors" $BIN info "$TMP/garbage.safetensors"
cp "$ck" "$TMP/flip.safetensors"; printf '\x7b' | dd of="$TMP/flip.safetensors" bs=1 seek=8 count=1 conv=notrunc 2>/dev/null
printf 'X' | dd of="$TMP/flip.safetensors" bs=1 seek=9 count=1 conv=notrunc 2>/dev/null
expect_fail "corrupt header" "flip.safetensors" $BIN info "$TMP/flip.safetensors"

# forward: wrong shapes fail and leave an existing output untouched
echo "keep me" > "$TMP/out.safetensors"
st_file "$TMP/bad_x.safetensors" '{"x":{"dtype":"F32","shape":[2,1,16,16],"data_offsets":[0,2048]},"t":{"dtype":"F32","shape":[2],"data_offsets":[2048,2056]},"y":{"dtype":"I64","shape":[2],"data_offsets":[2056,2072]}}' 2072
expect_fail "forward with wrong x shape" "'x' must have shape [N, 1, 32, 32]" \
  $BIN forward --weights "$ck" --input "$TMP/bad_x.safetensors" --output "$TMP/out.safetensors"
[ "$(cat "$TMP/out.safetensors")" = "keep me" ] && pass "failed forward left the output alone" || fail "output overwritten"
st_file "$TMP/no_y.safetensors" '{"x":{"dtype":"F32","shape":[1,1,32,32],"data_offsets":[0,4096]},"t":{"dtype":"F32","shape":[1],"data_offsets":[4096,4100]}}' 4100
expect_fail "forward without y" "needs tensors 'x', 't' and 'y'" \
  $BIN forward --weights "$ck" --input "$TMP/no_y.safetensors" --output "$TMP/out.safetensors"
st_file "$TMP/ok.safetensors" '{"x":{"dtype":"F32","shape":[2,1,32,32],"data_offsets":[0,8192]},"t":{"dtype":"I64","shape":[2],"data_offsets":[8192,8208]},"y":{"dtype":"I64","shape":[2],"data_offsets":[8208,8224]}}' 8224
if $BIN forward --weights "$ck" --input "$TMP/ok.safetensors" --output "$TMP/out2.safetensors" > /dev/null 2>&1 \
  && [ -s "$TMP/out2.safetensors" ]; then pass "forward on good input"; else fail "forward on good input"; fi
expect_fail "sample into an unwritable folder" "" $BIN sample --ckpt "$ck" --classes 0 --per-class 1 --steps 2 --grid /proc/nope/g.png
finish
