#!/usr/bin/env bash
# The CLI on bad input: the right exit status, a message in the user's terms,
# refused before any work, nothing overwritten.
source "$(dirname "$0")/lib.sh"

# ---- help, version, exit statuses
for cmd in train sample forward info export bench; do
  out=$(diffusion $cmd --help)
  [[ "$out" == *"usage: diffusion $cmd"* ]] && pass "$cmd --help" || fail "$cmd --help"
  # a flag's help states its default once (the text's own, or the generated one)
  twice=$(grep -E 'default.*default' <<< "$out")
  [ -z "$twice" ] && pass "$cmd --help: one default per flag" || fail "$cmd --help: two defaults: $twice"
done
# with --model the shape defaults are the model's, not the demo DiT's
hidden=$(diffusion train --model DiT-S/2 --help | grep -E '^ *--hidden ')
[[ "$hidden" == *"the --model's"* && "$hidden" != *"(default 64)"* ]] && pass "train --help under --model" \
  || fail "train --help under --model: '$hidden'"
version=$(diffusion --version)
[[ "$version" =~ ^diffusion\ [0-9]+\.[0-9]+\.[0-9]+ && "$version" == *"CUDA backend: "* ]] &&
  [[ "$(OPENBLAS_CORETYPE=Haswell diffusion --version)" == *"OpenBLAS kernels: Haswell"* ]] \
  && pass "--version: $(head -n 1 <<< "$version")" || fail "--version: '$version'"
expect_code 2 "no command" diffusion
expect_code 2 "unknown command" diffusion fly
expect_code 2 "unknown flag" diffusion train --bogus 1
expect_code 2 "bad flag value" diffusion sample --steps abc --grid "$TMP/g.png"
expect_code 2 "missing required flag" diffusion export --ckpt "$TMP"
expect_code 2 "info without a file" diffusion info
expect_code 1 "missing file (a failure, not a usage error)" diffusion info "$TMP/none.safetensors"
expect_fail "no command" "usage" diffusion
expect_fail "unknown command" "unknown command" diffusion fly
expect_fail "unknown flag" "unknown flag '--bogus'" diffusion train --bogus 1
# the backend's kernel paths, named by the environment for measuring
B=(bench --device cpu --iters 1 --warmup 0 --sample-batch 0 --latency 0 --batch 2)
expect_fail "unknown kernel path" "DC_KERNELS_OFF: unknown kernel path 'bogus' (valid: attention_sm90," \
  env DC_KERNELS_OFF=winograd,bogus "$BIN" "${B[@]}"
DC_KERNELS_OFF=winograd,geglu_sm90 diffusion "${B[@]}" > /dev/null 2>&1 && pass "known kernel paths accepted" \
  || fail "DC_KERNELS_OFF=winograd,geglu_sm90 refused"

# ---- flag values, in the user's terms
expect_fail "not an integer" "--steps: 'abc' is not an integer" diffusion train --steps abc
expect_fail "integer out of range" "2147483648 is out of range" diffusion train --steps 2147483648
expect_fail "exponent for an integer" "write 1000" diffusion train --steps 1e3
expect_fail "fraction for an integer" "'2.5' is not an integer" diffusion train --steps 2.5
expect_fail "float underflow" "1e-50 is too close to 0: it underflows" diffusion train --lr 1e-50
expect_fail "float overflow" "1e50 is out of range" diffusion train --lr 1e50
expect_fail "not finite" "'nan' is not a finite number" diffusion train --lr nan
expect_fail "missing value" "--lr needs a value" diffusion train --lr
expect_fail "flag given twice" "--steps is given twice" diffusion train --steps 3 --steps 4 --out "$TMP/x"
expect_fail "bad model name" "unknown model 'DiT-Q/3'" diffusion train --model DiT-Q/3 --out "$TMP/x"
expect_fail "missing data" "/nonexistent" diffusion train --data /nonexistent --out "$TMP/x"
expect_fail "heads not dividing" "not divisible" diffusion train --hidden 36 --heads 5 --out "$TMP/x"
expect_fail "width out of range" "hidden width 65540 is out of range (4..65536)" \
  diffusion train --hidden 65540 --heads 4 --out "$TMP/x"
# refused from the flags, before the data set is read and padded
err=$(diffusion train --input-size 4096 --out "$TMP/x" 2>&1)
[[ $? -eq 2 && "$err" == *"tokens (input 4096, patch 4): at most "*" are supported"* && "$err" != *"memory"* ]] \
  && pass "input size too large for the model, before padding" || fail "input size 4096: '$err'"
[ ! -e "$TMP/x" ] && pass "refused runs create no folder" || fail "a refused run created $TMP/x"
expect_fail "zero-size shape flag" "--input-size must be positive" diffusion train --input-size 0 --out "$TMP/z"
expect_fail "negative heads (train)" "--heads must be positive" diffusion train --heads -1 --out "$TMP/z"
expect_fail "--force without --resume" "--force only applies with --resume" diffusion train --force --out "$TMP/z"
expect_fail "bad sampler" "--sampler must be ddpm or ddim" diffusion sample --sampler euler --grid "$TMP/g.png"
expect_fail "sample without an output" "--grid PNG, --out-dir DIR and/or --tensor-out FILE" diffusion sample
expect_fail "huge guidance scale" "--cfg-scale must be in 0..100" diffusion sample --cfg-scale 3.4e38 --grid "$TMP/g.png"
expect_fail "negative grid columns" "--grid-cols must be positive" diffusion sample --grid-cols -1 --grid "$TMP/g.png"
expect_fail "reversed class range" "5-3 is a reversed range" diffusion sample --classes 5-3 --grid "$TMP/g.png"
for cmd in "sample --grid $TMP/g.png" "export --ckpt $TMP --out $TMP/e.safetensors" "info $TMP" \
           "forward --weights $TMP --input $TMP/i --output $TMP/o"; do
  expect_fail "negative heads (${cmd%% *})" "--heads must be positive" diffusion $cmd --heads -1
done
expect_fail "bench latency" "--latency must be 0 or 1" diffusion bench --latency -1
expect_fail "bench batch overflow" "--batch must be in 1..65535" diffusion bench --batch 1073741824
if [[ "$version" == *"CUDA backend: no"* ]]; then
  expect_fail "--device cuda on a CPU-only build" "this build has no CUDA backend" \
    diffusion sample --device cuda --ckpt "$TMP" --grid "$TMP/g.png"
fi

# ---- a real checkpoint
small_data "$TMP/small.safetensors"
TINY+=(--data "$TMP/small.safetensors")
diffusion train "${TINY[@]}" --steps 1 --out "$TMP/run" > "$TMP/train.log" 2>&1 || { cat "$TMP/train.log"; fail "tiny training run"; finish; }
expect_fail "a DiT has no selective recompute" "a DiT has no selective recompute" \
  diffusion train "${TINY[@]}" --steps 1 --out "$TMP/sel" --selective-recompute
ck="$TMP/run/step_0000001.safetensors"
diffusion info "$ck" | grep -q "depth 2, hidden 32, heads 2" && pass "info on a checkpoint" || fail "info on a checkpoint"
diffusion info "$TMP/run" | grep -q "step_0000001" && pass "info on a run folder" || fail "info on a run folder"
sum=$(md5sum < "$ck")
expect_fail "train into an existing run" "already holds checkpoints" diffusion train "${TINY[@]}" --steps 1 --out "$TMP/run"
[ "$(md5sum < "$ck")" = "$sum" ] && pass "existing checkpoint untouched" || fail "existing checkpoint changed"
expect_fail "resume with a recipe flag" "--lr is fixed by the checkpoint" diffusion train --resume "$TMP/run" --lr 0.5
mkdir -p "$TMP/other" && cp "$ck" "$TMP/other/step_0000009.safetensors"
expect_fail "resume into another run's folder" "holds checkpoints of another run" \
  diffusion train --resume "$TMP/run" --out "$TMP/other" --steps 3
[ "$(ls "$TMP/other")" = "step_0000009.safetensors" ] && pass "the other run is untouched" || fail "the other run changed"
expect_fail "export over a checkpoint" "refusing to overwrite the training checkpoint" \
  diffusion export --ckpt "$TMP/run" --out "$ck"
[ "$(md5sum < "$ck")" = "$sum" ] && pass "checkpoint untouched by export" || fail "checkpoint changed by export"
mkdir "$TMP/cwd"
(cd "$TMP/cwd" && diffusion sample --ckpt "$ck" --classes 0 --per-class 1 --steps 2 > /dev/null 2>&1; [ -z "$(ls)" ]) \
  && pass "sample without an output writes no default file" || fail "sample wrote $(ls "$TMP/cwd")"
expect_fail "class outside the model" "class 10 is outside the model's classes 0..9" \
  diffusion sample --ckpt "$ck" --classes 10 --grid "$TMP/g.png"
diffusion sample --ckpt "$ck" --classes all --per-class 1 --steps 2 --grid "$TMP/all.png" > /dev/null 2>&1 \
  && [ -s "$TMP/all.png" ] && pass "sample --classes all" || fail "sample --classes all"
# Every PNG says how it was made: AUTOMATIC1111's `parameters` text chunk
# (png_parameters, lib.sh: read from the bytes, independent of libpng).
want="classes 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
Steps: 2, Sampler: DDPM, CFG scale: 4, Seed: 0, Size: 32x32, Model: $(basename "$ck"), Weights: EMA, Guided channels: all"
got=$(png_parameters "$TMP/all.png")
[ "$got" = "$want" ] && pass "grid PNG carries its parameters" || fail "grid parameters: '$got'"
diffusion sample --ckpt "$ck" --classes 7 --per-class 2 --steps 3 --sampler ddim --cfg-scale 1.5 --seed 9 \
  --out-dir "$TMP/params" > /dev/null 2>&1
want="class 7
Steps: 3, Sampler: DDIM, CFG scale: 1.5, Seed: 9, Size: 32x32, Model: $(basename "$ck"), Weights: EMA, Guided channels: all, Eta: 0, Sample index: 1"
got=$(png_parameters "$TMP/params/class7_1.png")
[ "$got" = "$want" ] && pass "sample PNG carries its parameters" || fail "sample parameters: '$got'"
# a checkpoint whose file name is not text: the PNG says '?' for the byte, and the samples are written
odd="$TMP/ck"$'\xff'".safetensors"
cp "$ck" "$odd"
diffusion sample --ckpt "$odd" --classes 1 --per-class 1 --steps 2 --out-dir "$TMP/odd" > /dev/null 2>&1
got=$(png_parameters "$TMP/odd/class1_0.png")
[[ "$got" == *"Model: ck?.safetensors, Weights"* ]] && pass "a file name that is not UTF-8 in the parameters" \
  || fail "non-UTF-8 checkpoint name: '$got'"
expect_fail "duplicate classes" "class 3 is listed twice" diffusion sample --ckpt "$ck" --classes 3,3 --out-dir "$TMP/s"
expect_fail "too many samples" "over 1000000 samples" diffusion sample --ckpt "$ck" --per-class 429496730 --grid "$TMP/g.png"
expect_fail "absurd thread count" "--threads must be in 0..1024" diffusion sample --ckpt "$ck" --threads 100000 --grid "$TMP/g.png"
head -c 1000 "$ck" > "$TMP/trunc.safetensors"
expect_fail "truncated checkpoint (info)" "trunc.safetensors" diffusion info "$TMP/trunc.safetensors"
expect_fail "truncated checkpoint (sample)" "trunc.safetensors" diffusion sample --ckpt "$TMP/trunc.safetensors" --grid "$TMP/g.png"
expect_fail "truncated checkpoint (resume)" "trunc.safetensors" diffusion train --resume "$TMP/trunc.safetensors"
printf 'garbage' > "$TMP/garbage.safetensors"
expect_fail "garbage file" "garbage.safetensors" diffusion info "$TMP/garbage.safetensors"
cp "$ck" "$TMP/flip.safetensors"; printf '\x7b' | dd of="$TMP/flip.safetensors" bs=1 seek=8 count=1 conv=notrunc 2>/dev/null
printf 'X' | dd of="$TMP/flip.safetensors" bs=1 seek=9 count=1 conv=notrunc 2>/dev/null
expect_fail "corrupt header" "flip.safetensors" diffusion info "$TMP/flip.safetensors"

# ---- outputs: checked before any work; what is not a regular file is never replaced
mkfifo "$TMP/fifo"
expect_fail "export onto a pipe" "is a pipe" diffusion export --ckpt "$ck" --out "$TMP/fifo"
[ -p "$TMP/fifo" ] && pass "the pipe is still a pipe" || fail "export replaced the pipe"
ln -s "$TMP/fifo" "$TMP/link"
expect_fail "export onto a link to a pipe" "is a pipe" diffusion export --ckpt "$ck" --out "$TMP/link"
[ -p "$TMP/fifo" ] && [ -L "$TMP/link" ] && pass "link and pipe untouched" || fail "export replaced the link or pipe"
mkdir "$TMP/adir"
expect_fail "forward onto a folder" "is a folder" \
  diffusion forward --weights "$ck" --input "$TMP/fifo" --output "$TMP/adir"
expect_fail "tensor-out onto a pipe" "is a pipe" diffusion sample --ckpt "$ck" --tensor-out "$TMP/fifo"
# sample: a bad --grid or --out-dir file is refused before the sampling, not after it
long=$(printf 'g%.0s' {1..300})
for target in "--grid $TMP/adir" "--grid $TMP/$long.png" "--grid $TMP/no/dir/g.png" "--out-dir $TMP/fifo"; do
  err=$(diffusion sample --ckpt "$ck" --classes 0 --per-class 1 --steps 2 $target 2>&1)
  if [ $? -ne 0 ] && [[ "$err" != *sampling* ]]; then pass "sample $(sed "s|$TMP/||; s|g\{20,\}|g...g|" <<< "$target") refused first: ${err:0:90}"
  else fail "sample $target: '$err'"; fi
done
mkdir -p "$TMP/samples/class0_1.png"
err=$(diffusion sample --ckpt "$ck" --classes 0 --per-class 2 --steps 2 --out-dir "$TMP/samples" 2>&1)
[[ $? -ne 0 && "$err" == *"class0_1.png exists and is not a regular file"* && "$err" != *sampling* ]] \
  && pass "sample --out-dir with a folder in a file's place, refused first" || fail "out-dir file check: '$err'"
expect_fail "sample into a missing folder" "does not exist" diffusion sample --ckpt "$ck" --grid "$TMP/no/dir/g.png"

# ---- no output may be a file the command reads: by any name (a hard link, a symbolic link)
ln "$ck" "$TMP/hard.png"; ln -s "$ck" "$TMP/soft.safetensors"
data=$TMP/small.safetensors
refuse_input "export --out: a hard link to --ckpt" "$ck" "which this command reads (--ckpt)" \
  diffusion export --ckpt "$TMP/run" --out "$TMP/hard.png"
refuse_input "export --out: a symbolic link to --ckpt" "$ck" "which this command reads (--ckpt)" \
  diffusion export --ckpt "$ck" --out "$TMP/soft.safetensors"
diffusion export --ckpt "$TMP/run" --out "$TMP/run/exported.safetensors" > /dev/null 2>&1 && \
  diffusion export --ckpt "$TMP/run" --out "$TMP/run/exported.safetensors" > /dev/null 2>&1 \
  && pass "export into the run folder, twice (only its checkpoints are read)" || fail "export into the run folder"
refuse_input "sample --grid: a hard link to --ckpt" "$ck" "which this command reads (--ckpt)" \
  diffusion sample --ckpt "$TMP/run" --classes 0 --per-class 1 --steps 2 --grid "$TMP/hard.png"
refuse_input "sample --tensor-out: a symbolic link to --ckpt" "$ck" "which this command reads (--ckpt)" \
  diffusion sample --ckpt "$ck" --classes 0 --per-class 1 --steps 2 --tensor-out "$TMP/soft.safetensors"
mkdir -p "$TMP/od" && ln "$ck" "$TMP/od/class0_0.png"
refuse_input "sample --out-dir holding a hard link to --ckpt" "$ck" "which this command reads (--ckpt)" \
  diffusion sample --ckpt "$ck" --classes 0 --per-class 1 --steps 2 --out-dir "$TMP/od"
st_file "$TMP/fin.safetensors" '{"x":{"dtype":"F32","shape":[1,1,32,32],"data_offsets":[0,4096]},"t":{"dtype":"F32","shape":[1],"data_offsets":[4096,4100]},"y":{"dtype":"I64","shape":[1],"data_offsets":[4100,4108]}}' 4108
ln "$TMP/fin.safetensors" "$TMP/fin-link.safetensors"
refuse_input "forward --output: a hard link to --input" "$TMP/fin.safetensors" "which this command reads (--input)" \
  diffusion forward --weights "$ck" --input "$TMP/fin.safetensors" --output "$TMP/fin-link.safetensors"
cp "$ck" "$TMP/w.safetensors"
refuse_input "forward --output: --weights itself" "$TMP/w.safetensors" "is read by this command (--weights)" \
  diffusion forward --weights "$TMP/w.safetensors" --input "$TMP/fin.safetensors" --output "$TMP/w.safetensors"
cp "$ck" "$TMP/info.safetensors"
refuse_input "info >> the checkpoint" "$TMP/info.safetensors" "standard output is" \
  bash -c "'$BIN' info '$TMP/info.safetensors' >> '$TMP/info.safetensors'"
# train writes .lock (its PID) and step_* checkpoints into --out: never over its data set
mkdir -p "$TMP/lockrun" && ln -s "$data" "$TMP/lockrun/.lock"
refuse_input "train: --out's .lock is a link to --data" "$data" "which this command reads (--data)" \
  diffusion train "${TINY[@]}" --steps 1 --out "$TMP/lockrun"
mkdir -p "$TMP/lockrun2" && ln "$ck" "$TMP/lockrun2/.lock"
refuse_input "train --resume: --out's .lock is a hard link to the checkpoint" "$ck" "which this command reads (--resume)" \
  diffusion train --resume "$ck" --out "$TMP/lockrun2" --steps 2
expect_fail "sample into an unwritable folder" "cannot write" diffusion sample --ckpt "$ck" --classes 0 --per-class 1 --steps 2 --grid /proc/nope/g.png

# ---- forward: wrong shapes and values fail and leave an existing output untouched
echo "keep me" > "$TMP/out.safetensors"; cp "$TMP/out.safetensors" "$TMP/keep"
st_file "$TMP/bad_x.safetensors" '{"x":{"dtype":"F32","shape":[2,1,16,16],"data_offsets":[0,2048]},"t":{"dtype":"F32","shape":[2],"data_offsets":[2048,2056]},"y":{"dtype":"I64","shape":[2],"data_offsets":[2056,2072]}}' 2072
expect_fail "forward with wrong x shape" "'x' must have shape [N, 1, 32, 32]" \
  diffusion forward --weights "$ck" --input "$TMP/bad_x.safetensors" --output "$TMP/out.safetensors"
cmp -s "$TMP/out.safetensors" "$TMP/keep" && pass "failed forward left the output alone" || fail "output overwritten"
st_file "$TMP/no_y.safetensors" '{"x":{"dtype":"F32","shape":[1,1,32,32],"data_offsets":[0,4096]},"t":{"dtype":"F32","shape":[1],"data_offsets":[4096,4100]}}' 4100
expect_fail "forward without y" "needs tensors 'x', 't' and 'y'" \
  diffusion forward --weights "$ck" --input "$TMP/no_y.safetensors" --output "$TMP/out.safetensors"
ok_header='{"x":{"dtype":"F32","shape":[2,1,32,32],"data_offsets":[0,8192]},"t":{"dtype":"F32","shape":[2],"data_offsets":[8192,8200]},"y":{"dtype":"I64","shape":[2],"data_offsets":[8200,8216]}}'
st_file "$TMP/ok.safetensors" "$ok_header" 8216
if diffusion forward --weights "$ck" --input "$TMP/ok.safetensors" --output "$TMP/out2.safetensors" > /dev/null 2>&1 \
  && [ -s "$TMP/out2.safetensors" ]; then pass "forward on good input"; else fail "forward on good input"; fi
# x[1, 0, 2, 3] = NaN (float index 1*1024 + 2*32 + 3), t[1] = -5, then t[0] = 1e9
st_file "$TMP/nan.safetensors" "$ok_header" 8216; st_poke "$TMP/nan.safetensors" $(( (1024 + 67) * 4 )) '\x00\x00\xc0\x7f'
expect_fail "forward on NaN input" "x[1, 0, 2, 3] is NaN" \
  diffusion forward --weights "$ck" --input "$TMP/nan.safetensors" --output "$TMP/out.safetensors"
st_file "$TMP/tneg.safetensors" "$ok_header" 8216; st_poke "$TMP/tneg.safetensors" 8196 '\x00\x00\xa0\xc0'
expect_fail "forward on a negative timestep" "t[1] = -5 is outside [0, 1000)" \
  diffusion forward --weights "$ck" --input "$TMP/tneg.safetensors" --output "$TMP/out.safetensors"
st_file "$TMP/tbig.safetensors" "$ok_header" 8216; st_poke "$TMP/tbig.safetensors" 8192 '\x28\x6b\x6e\x4e'
expect_fail "forward on a huge timestep" "t[0] = 1e+09 is outside [0, 1000)" \
  diffusion forward --weights "$ck" --input "$TMP/tbig.safetensors" --output "$TMP/out.safetensors"
cmp -s "$TMP/out.safetensors" "$TMP/keep" && pass "refused forwards left the output alone" || fail "output overwritten"
finish
