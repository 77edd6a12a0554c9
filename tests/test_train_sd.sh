#!/usr/bin/env bash
# diffusion train --model SD_PATH from the command line, on a tiny random SD
# model (tools/sd_random) and captioned pictures prepared by `diffusion
# prepare`: fine-tuning its UNet and training one from scratch, the run
# folder's contents (checkpoints naming the base model, the loss log and its
# plot, the sampling grids), an exact resume, the run folder as a model
# txt2img draws from, a LoRA of the base's UNet, DreamBooth, and the refusals.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SDR=$ROOT/${BUILD:-build}/tools/sd_random
MP=$ROOT/${BUILD:-build}/tools/make_picture
VOCAB=$ROOT/data/bpe_simple_vocab_16e6.txt.gz
[ -x "$SDR" ] && [ -x "$MP" ] || { echo "FAIL: $SDR or $MP not built (make)"; exit 1; }
"$SDR" --config tiny1 --layout diffusers --vocab "$VOCAB" --out "$TMP/base" > /dev/null || { echo "FAIL sd_random"; exit 1; }
C=(--device cpu --threads 2)
# meta FILE KEY: a checkpoint's metadata value (the header is JSON on one line)
meta() { head -c 200000 "$1" | grep -ao "\"$2\":\"[^\"]*\"" | head -1 | sed 's/.*:"\(.*\)"/\1/'; }

mkdir -p "$TMP/pics"
for i in 0 1 2 3 4 5 6 7; do
  "$MP" png 40 36 "$TMP/pics/p$i.png" && echo "a test picture, number $((i % 3))" > "$TMP/pics/p$i.txt"
done
diffusion prepare --model "$TMP/base" --data "$TMP/pics" --out "$TMP/data" --size 32 "${C[@]}" > /dev/null 2>&1 \
  || { echo "FAIL prepare"; exit 1; }

out=$(diffusion train --help)
[[ "$out" == *"sd1.5 or sd2.1"* ]] || fail "train --help does not name the built-in UNet configs"
for f in --model --data --unet-config --init --prediction --min-snr-gamma --noise-offset --caption-dropout --train-text-encoder \
  --lora --lora-alpha --lora-targets --lora-format --instance-data --instance-prompt --class-prompt --class-data \
  --class-images --prior-loss-weight --resolution \
  --sample-every --sample-prompts --sample-steps --sample-cfg --vocab --latents-column --text-column \
  --column-shape --column-dtype --latent-scale; do
  [[ "$out" == *"$f "* ]] || fail "train --help does not document $f"
done
pass "train --help documents the text-to-image flags"

# ---- fine-tuning the base's UNet
T=(--model "$TMP/base" --data "$TMP/data" --batch 4 --ckpt-every 2 --log-every 2 "${C[@]}")
printf 'a test picture, number 1\na picture of nothing\n' > "$TMP/prompts.txt"
diffusion train "${T[@]}" --out "$TMP/run" --steps 4 --sample-every 4 --sample-steps 2 --sample-prompts "$TMP/prompts.txt" \
  > "$TMP/log" 2>&1 || fail "fine-tune: $(tail -3 "$TMP/log")"
grep -q "from the base's weights" "$TMP/log" && grep -q "8 captioned latents" "$TMP/log" \
  && pass "fine-tunes the base's UNet on the prepared latents" || fail "log: $(head -3 "$TMP/log")"
[ -f "$TMP/run/step_0000002.safetensors" ] && [ -f "$TMP/run/step_0000004.safetensors" ] \
  && pass "checkpoints every 2 steps" || fail "checkpoints: $(ls "$TMP/run")"
[ "$(meta "$TMP/run/step_0000004.safetensors" base_model)" = "$(cd "$TMP/base" && pwd -P)" ] \
  && [ "$(meta "$TMP/run/step_0000004.safetensors" model)" = UNet2DConditionModel ] \
  && pass "a checkpoint names its base model (absolute) and holds a UNet" \
  || fail "base_model: '$(meta "$TMP/run/step_0000004.safetensors" base_model)'"
[ "$(meta "$TMP/run/step_0000004.safetensors" lr)" = 1e-05 ] && [ "$(meta "$TMP/run/step_0000004.safetensors" weight_decay)" = 0.01 ] \
  && [ "$(meta "$TMP/run/step_0000004.safetensors" grad_clip)" = 1 ] && [ "$(meta "$TMP/run/step_0000004.safetensors" class_dropout)" = 0.1 ] \
  && pass "diffusers' fine-tuning recipe by default (lr 1e-5, decay 0.01, clipping 1, 10% caption dropout)" \
  || fail "recipe: lr $(meta "$TMP/run/step_0000004.safetensors" lr)"
rows=$(cut -d, -f1 "$TMP/run/loss.csv" | tr '\n' ' ')
[ "$rows" = "step 1 2 4 " ] && pass "loss.csv: a header and a row per logged step" || fail "loss.csv steps: $rows"
[ "$(head -c 8 "$TMP/run/loss.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] \
  && pass "loss.png is a PNG" || fail "loss.png"

# the grid: 2 prompts x 4 seeds of 32x32 with make_grid's 2-pixel padding
size=$(od -An -tu1 -j16 -N8 "$TMP/run/samples/step_0000004.png" 2>/dev/null | awk '{print $3*256+$4, $7*256+$8}')
[ "$size" = "138 70" ] && [ ! -e "$TMP/run/samples/step_0000002.png" ] \
  && pass "a sampling grid at step 4 (--sample-every 4): a row for each prompt, 4 seeds" || fail "grid: size '$size', $(ls "$TMP/run/samples" 2>&1)"
diffusion txt2img --model "$TMP/run" --prompt "a test picture, number 1" --steps 2 --out "$TMP/from_run.png" "${C[@]}" \
  > "$TMP/log" 2>&1 && grep -aq "Model: run" "$TMP/from_run.png" \
  && pass "txt2img draws from the run folder (its newest checkpoint)" || fail "txt2img --model RUN: $(tail -2 "$TMP/log")"

# ---- an exact resume, which keeps the loss log's rows up to its step
diffusion train "${T[@]}" --out "$TMP/whole" --steps 6 --sample-every 0 > /dev/null 2>&1
echo "9,9,9,9,9,9" >> "$TMP/run/loss.csv"  # a row the interrupted run logged past its last checkpoint
diffusion train --resume "$TMP/run/step_0000004.safetensors" --steps 6 "${C[@]}" > "$TMP/log" 2>&1 \
  || fail "resume: $(tail -3 "$TMP/log")"
cmp -s "$TMP/run/step_0000006.safetensors" "$TMP/whole/step_0000006.safetensors" \
  && pass "4 steps, then 2 more resumed: the checkpoint of 6 in one go, byte for byte" || fail "resumed run differs"
rows=$(cut -d, -f1 "$TMP/run/loss.csv" | tr '\n' ' ')
[ "$rows" = "step 1 2 4 5 6 " ] && pass "a resumed run drops the log's rows past its step (and logs its first step)" \
  || fail "loss.csv steps: $rows"

# ---- several ranks and offload: one rank's bytes (the CPU sums micro-batches in one order; ZeRO's
# global norm is combined from its shards', so it matches to the bit with clipping off)
P=(--model "$TMP/base" --data "$TMP/data" --batch 4 --micro-batch 2 --steps 2 --sample-every 0 --device cpu --threads 1)
diffusion train "${P[@]}" --out "$TMP/one" > /dev/null 2>&1
diffusion train "${P[@]}" --out "$TMP/two" --ranks 2 > /dev/null 2>&1
diffusion train "${P[@]}" --out "$TMP/off" --offload > /dev/null 2>&1
diffusion train "${P[@]}" --out "$TMP/one0" --grad-clip 0 > /dev/null 2>&1
diffusion train "${P[@]}" --out "$TMP/zero2" --grad-clip 0 --ranks 2 --zero 2 > /dev/null 2>&1
diffusion train "${P[@]}" --out "$TMP/sel" --selective-recompute > /dev/null 2>&1
P4=(--model "$TMP/base" --data "$TMP/data" --batch 4 --steps 2 --sample-every 0 --device cpu --threads 1)
diffusion train "${P4[@]}" --out "$TMP/whole4" > /dev/null 2>&1
diffusion train "${P4[@]}" --out "$TMP/whole4sel" --selective-recompute > /dev/null 2>&1
cmp -s "$TMP/one/step_0000002.safetensors" "$TMP/two/step_0000002.safetensors" \
  && pass "2 ranks write one rank's checkpoint, byte for byte" || fail "2 ranks differ from one"
cmp -s "$TMP/one/step_0000002.safetensors" "$TMP/off/step_0000002.safetensors" \
  && pass "--offload writes the plain run's checkpoint" || fail "offload differs"
cmp -s "$TMP/one0/step_0000002.safetensors" "$TMP/zero2/step_0000002.safetensors" \
  && pass "ZeRO 2 on 2 ranks writes one rank's checkpoint (no clipping)" || fail "ZeRO 2 differs"
cmp -s "$TMP/one/step_0000002.safetensors" "$TMP/sel/step_0000002.safetensors" \
  && pass "--selective-recompute writes the plain run's checkpoint" || fail "selective recompute differs"
# one micro-batch a step: the gradients lie in the activations' memory
[ -f "$TMP/whole4/step_0000002.safetensors" ] && cmp -s "$TMP/whole4/step_0000002.safetensors" \
  "$TMP/whole4sel/step_0000002.safetensors" \
  && pass "--selective-recompute writes the plain run's checkpoint (one micro-batch)" \
  || fail "selective recompute differs (one micro-batch)"

# ---- the text encoder trained along (--train-text-encoder): one model whose checkpoints hold both (the
# encoder under text_encoder.), resumed exactly, on 2 ranks with ZeRO 2 as on one, drawn from as a run
E=(--model "$TMP/base" --data "$TMP/data" --batch 4 --micro-batch 2 --sample-every 0 --train-text-encoder --device cpu --threads 1)
diffusion train "${E[@]}" --out "$TMP/te" --steps 2 --ckpt-every 1 > "$TMP/log" 2>&1 || fail "--train-text-encoder: $(tail -3 "$TMP/log")"
ck=$TMP/te/step_0000002.safetensors
grep -q "with its CLIP text encoder" "$TMP/log" && [ "$(meta "$ck" text_encoder_hidden_size)" = 64 ] \
  && head -c 200000 "$ck" | grep -aq '"ema.text_encoder.encoder.layers.0.mlp.fc1.weight"' \
  && head -c 200000 "$ck" | grep -aq '"train.adam_m"' \
  && pass "--train-text-encoder: the checkpoint holds the encoder (and its EMA) and its config" \
  || fail "text encoder run: $(head -2 "$TMP/log"), hidden '$(meta "$ck" text_encoder_hidden_size)'"
diffusion train --resume "$TMP/te/step_0000001.safetensors" --out "$TMP/te1" --steps 2 --device cpu --threads 1 > /dev/null 2>&1
cmp -s "$ck" "$TMP/te1/step_0000002.safetensors" \
  && pass "with the text encoder: 1 step, then 1 more resumed, the checkpoint of 2 in one go" || fail "resume differs"
diffusion train "${E[@]}" --out "$TMP/te0" --steps 2 --grad-clip 0 > /dev/null 2>&1
diffusion train "${E[@]}" --out "$TMP/te2" --steps 2 --grad-clip 0 --ranks 2 --zero 2 > /dev/null 2>&1
cmp -s "$TMP/te0/step_0000002.safetensors" "$TMP/te2/step_0000002.safetensors" \
  && pass "with the text encoder: ZeRO 2 on 2 ranks writes one rank's checkpoint" || fail "ZeRO 2 with the encoder differs"
diffusion txt2img --model "$TMP/te" --prompt "a test picture, number 1" --steps 2 --out "$TMP/te.png" "${C[@]}" \
  > "$TMP/log" 2>&1 && pass "txt2img draws from a run that trains its text encoder" || fail "txt2img: $(tail -2 "$TMP/log")"
expect_code 2 "--train-text-encoder for a DiT" diffusion train --out "$TMP/x" --train-text-encoder
expect_code 2 "--train-text-encoder on resume" diffusion train --resume "$TMP/run" --train-text-encoder

# ---- a LoRA of the base's UNet (--lora RANK): the base frozen, the factors train; RUN/lora.safetensors
# in kohya's format (or diffusers'); resumed exactly, 2 ranks with ZeRO 1 as one (the factors are one
# unit: stage 2 is refused); drawn from as a run and as the base with the file
PNGS=$ROOT/${BUILD:-build}/tools/png_pixels
L=(--model "$TMP/base" --data "$TMP/data" --batch 4 --ckpt-every 2 --sample-every 0 --lora 4 --device cpu --threads 1)
diffusion train "${L[@]}" --out "$TMP/lora" --steps 4 > "$TMP/log" 2>&1 || fail "LoRA: $(tail -3 "$TMP/log")"
grep -q "a rank-4 LoRA (transformer) of" "$TMP/log" && pass "the log says a LoRA trains" || fail "log: $(head -2 "$TMP/log")"
ck=$TMP/lora/step_0000004.safetensors
[ "$(meta "$ck" lora_rank)" = 4 ] && [ "$(meta "$ck" lora_alpha)" = 4 ] && [ "$(meta "$ck" lora_targets)" = transformer ] \
  && [ "$(meta "$ck" lr)" = 0.0001 ] && ! head -c 200000 "$ck" | grep -aq '"conv_in.weight"' \
  && pass "--lora 4: the checkpoint holds the factors alone, rank 4, alpha 4, kohya's targets, lr 1e-4" \
  || fail "LoRA checkpoint: rank '$(meta "$ck" lora_rank)' targets '$(meta "$ck" lora_targets)' lr '$(meta "$ck" lr)'"
out=$(diffusion info "$TMP/lora/lora.safetensors" 2>&1)
[[ "$out" == *"kohya names; 72 UNet layers, 0 text encoder layers"* ]] && [[ "$out" == *"ss_network_dim       4"* ]] \
  && [[ "$out" == *"ss_base_model_version sd_v1"* ]] && [[ "$out" == *"ss_steps             4"* ]] \
  && pass "RUN/lora.safetensors: kohya's names and ss_ metadata, the transformers' 72 layers" || fail "lora file: $out"
mkdir -p "$TMP/lr"  # the same folder name: the file's ss_output_name is the run folder's
diffusion train "${L[@]}" --out "$TMP/lr/lora" --steps 2 > /dev/null 2>&1
diffusion train --resume "$TMP/lr/lora" --steps 4 --device cpu --threads 1 > /dev/null 2>&1
cmp -s "$ck" "$TMP/lr/lora/step_0000004.safetensors" && cmp -s "$TMP/lora/lora.safetensors" "$TMP/lr/lora/lora.safetensors" \
  && pass "LoRA: 2 steps, then 2 more resumed: the checkpoint and lora.safetensors of 4 in one go, byte for byte" \
  || fail "the resumed LoRA run differs"
diffusion train "${L[@]}" --out "$TMP/lora_1" --steps 2 --micro-batch 2 --grad-clip 0 > /dev/null 2>&1
diffusion train "${L[@]}" --out "$TMP/lora_2" --steps 2 --micro-batch 2 --grad-clip 0 --ranks 2 --zero 1 > /dev/null 2>&1
cmp -s "$TMP/lora_1/step_0000002.safetensors" "$TMP/lora_2/step_0000002.safetensors" \
  && pass "LoRA: ZeRO 1 on 2 ranks writes one rank's checkpoint" || fail "LoRA on 2 ranks differs"
Q=(--prompt "a test picture, number 1" --steps 2 --seed 5 "${C[@]}")
diffusion txt2img --model "$TMP/lora" "${Q[@]}" --out "$TMP/l_run.png" > /dev/null 2>&1
diffusion txt2img --model "$TMP/base" --lora "$TMP/lora/lora.safetensors" --lora-merge "${Q[@]}" --out "$TMP/l_file.png" \
  > /dev/null 2>&1
diffusion txt2img --model "$TMP/base" "${Q[@]}" --out "$TMP/l_base.png" > /dev/null 2>&1
"$PNGS" "$TMP/l_run.png" "$TMP/l_file.png" 0 > /dev/null && ! "$PNGS" "$TMP/l_run.png" "$TMP/l_base.png" 0 > /dev/null \
  && pass "txt2img: the LoRA run draws the base with its lora.safetensors, and not the base alone" \
  || fail "LoRA run and file draw differently (or as the base)"
diffusion train "${L[@]}" --out "$TMP/lora_d" --steps 2 --lora-targets all --lora-alpha 2 --lora-format diffusers \
  > /dev/null 2>&1
out=$(diffusion info "$TMP/lora_d/lora.safetensors" 2>&1)
[[ "$out" == *"diffusers names"* ]] && [ "$(meta "$TMP/lora_d/step_0000002.safetensors" lora_targets)" = all ] \
  && pass "--lora-targets all --lora-format diffusers: diffusers' names, the convolutions too" || fail "diffusers' file: $out"
expect_fail "--lora with ZeRO stage 2 (the factors are one unit)" "use --zero 1" diffusion train "${L[@]}" \
  --out "$TMP/x" --steps 1 --micro-batch 2 --ranks 2 --zero 2
rm -rf "$TMP/x"
expect_code 2 "--lora-alpha without --lora" diffusion train "${T[@]}" --out "$TMP/x" --lora-alpha 2
expect_code 2 "--lora with --unet-config" diffusion train "${T[@]}" --out "$TMP/x" --lora 4 --unet-config sd1.5 --init random
# the text encoder's LoRA too: kohya's lora_te_ layers, an exact resume, drawn from as a run
diffusion train "${L[@]}" --out "$TMP/lt/lora" --steps 2 --train-text-encoder > "$TMP/log" 2>&1 || fail "TE LoRA: $(tail -3 "$TMP/log")"
out=$(diffusion info "$TMP/lt/lora/lora.safetensors" 2>&1)
[[ "$out" == *"kohya names; 72 UNet layers, 12 text encoder layers"* ]] \
  && pass "--lora with --train-text-encoder: the text encoder's attention and MLP layers too" || fail "TE LoRA file: $out"
diffusion train "${L[@]}" --out "$TMP/lt1/lora" --steps 1 --train-text-encoder > /dev/null 2>&1
diffusion train --resume "$TMP/lt1/lora" --steps 2 --device cpu --threads 1 > /dev/null 2>&1
cmp -s "$TMP/lt/lora/step_0000002.safetensors" "$TMP/lt1/lora/step_0000002.safetensors" \
  && cmp -s "$TMP/lt/lora/lora.safetensors" "$TMP/lt1/lora/lora.safetensors" \
  && pass "the text encoder's LoRA: 1 step, then 1 more resumed, the same bytes" || fail "TE LoRA resume differs"
diffusion txt2img --model "$TMP/lt/lora" "${Q[@]}" --out "$TMP/lt_run.png" > /dev/null 2>&1
diffusion txt2img --model "$TMP/base" --lora "$TMP/lt/lora/lora.safetensors" --lora-merge "${Q[@]}" \
  --out "$TMP/lt_file.png" > /dev/null 2>&1
"$PNGS" "$TMP/lt_run.png" "$TMP/lt_file.png" 0 > /dev/null \
  && pass "txt2img: a run with the text encoder's LoRA draws the base with its file" || fail "TE LoRA run and file differ"
expect_fail "--lora-targets other" "attn, transformer or all" diffusion train "${T[@]}" --out "$TMP/x" --lora 4 \
  --lora-targets convs
expect_code 2 "--lora on resume (the checkpoint fixes it)" diffusion train --resume "$TMP/lora" --lora 8

# ---- DreamBooth (--instance-data, --instance-prompt; --class-prompt for prior preservation): the class
# pictures drawn by the base where the class folder holds too few, both sets prepared into the run folder,
# each batch half instance and half class pictures; resumed exactly (the tensors: the metadata names the
# run's own folders); with a LoRA; the refusals
mkdir -p "$TMP/inst" "$TMP/cls"
for i in 0 1 2; do "$MP" png 40 36 "$TMP/inst/b$i.png"; done
D=(--model "$TMP/base" --instance-data "$TMP/inst" --instance-prompt "a photo of sks boot" --resolution 32
   --ckpt-every 2 --sample-every 0 --device cpu --threads 1)
diffusion train "${D[@]}" --class-prompt "a photo of a shoe" --class-images 4 --out "$TMP/db" --steps 4 \
  > "$TMP/log" 2>&1 || fail "DreamBooth: $(tail -3 "$TMP/log")"
ck=$TMP/db/step_0000004.safetensors
[ "$(ls "$TMP/db/dreambooth/class_images" | tr '\n' ' ')" = "class_00000.png class_00001.png class_00002.png class_00003.png " ] \
  && [ -f "$TMP/db/dreambooth/instance/index.json" ] && [ -f "$TMP/db/dreambooth/class/index.json" ] \
  && pass "DreamBooth: 4 class pictures drawn by the base, both sets prepared in the run folder" \
  || fail "DreamBooth's folders: $(ls -R "$TMP/db/dreambooth" | head)"
[ "$(meta "$ck" prior_loss_weight)" = 1 ] && [ "$(meta "$ck" lr)" = 5e-06 ] && [ "$(meta "$ck" class_dropout)" = 0 ] \
  && [ "$(meta "$ck" batch)" = 2 ] && [ "$(meta "$ck" dreambooth_class_data)" = "$TMP/db/dreambooth/class" ] \
  && grep -q "each batch half class pictures" "$TMP/log" \
  && pass "DreamBooth's recipe: batch 2 (an instance and a class picture), lr 5e-6, no caption dropout, weight 1" \
  || fail "DreamBooth recipe: lr $(meta "$ck" lr), batch $(meta "$ck" batch), $(meta "$ck" dreambooth_class_data)"
cp "$TMP/db/dreambooth/class_images/class_0000"[01].png "$TMP/cls/"
diffusion train "${D[@]}" --class-prompt "a photo of a shoe" --class-images 4 --class-data "$TMP/cls" \
  --out "$TMP/db2" --steps 2 > /dev/null 2>&1
diffusion train --resume "$TMP/db2" --steps 4 --device cpu --threads 1 > /dev/null 2>&1
data_of() { local h; h=$(od -An -t u8 -N8 "$1" | tr -d ' '); tail -c +$((9 + h)) "$1"; }
[ "$(ls "$TMP/cls" | wc -l)" = 4 ] && cmp -s <(data_of "$ck") <(data_of "$TMP/db2/step_0000004.safetensors") \
  && [ "$(meta "$ck" loss)" = "$(meta "$TMP/db2/step_0000004.safetensors" loss)" ] \
  && pass "a class folder of 2 gets the 2 missing; 2 steps, then 2 resumed: the 4 steps' weights and loss" \
  || fail "DreamBooth: class folder $(ls "$TMP/cls" | wc -l), or the resumed run differs"
diffusion train "${D[@]}" --class-prompt "a photo of a shoe" --class-images 4 --class-data "$TMP/cls" --lora 4 \
  --out "$TMP/dbl" --steps 2 > /dev/null 2>&1
diffusion train "${D[@]}" --out "$TMP/db1" --steps 2 > "$TMP/log" 2>&1
[ -f "$TMP/dbl/lora.safetensors" ] && [ "$(meta "$TMP/dbl/step_0000002.safetensors" lr)" = 0.0001 ] \
  && [ "$(meta "$TMP/db1/step_0000002.safetensors" batch)" = 1 ] && grep -q "no prior preservation" "$TMP/log" \
  && pass "DreamBooth with a LoRA (lr 1e-4), and without prior preservation (batch 1)" || fail "DreamBooth variants"
expect_code 2 "--instance-prompt without --instance-data" diffusion train "${T[@]}" --out "$TMP/x" --instance-prompt a
expect_code 2 "--instance-data without --instance-prompt" diffusion train --model "$TMP/base" --out "$TMP/x" \
  --instance-data "$TMP/inst"
expect_code 2 "--class-images without --class-prompt" diffusion train "${D[@]}" --out "$TMP/x" --class-images 3
expect_code 2 "--data with --instance-data" diffusion train "${D[@]}" --out "$TMP/x" --data "$TMP/data"
expect_fail "an odd batch with prior preservation" "must be even" diffusion train "${D[@]}" --out "$TMP/x" \
  --class-prompt "a photo of a shoe" --class-images 4 --class-data "$TMP/cls" --batch 3 --steps 1
rm -rf "$TMP/x"

# ---- aspect-ratio buckets (prepare --buckets): the steps' batches each from one bucket, trained at its
# size; resumed exactly; 2 ranks as one
mkdir -p "$TMP/bpics"
for i in 0 1 2 3 4 5 6 7 8 9; do
  s=(100x100 100x300 300x100); s=${s[i % 3]}
  "$MP" png ${s%x*} ${s#*x} "$TMP/bpics/p$i.png" && echo "picture $i, $s" > "$TMP/bpics/p$i.txt"
done
diffusion prepare --model "$TMP/base" --data "$TMP/bpics" --out "$TMP/bdata" --buckets --size 128 --min-side 64 \
  --max-side 192 "${C[@]}" > /dev/null 2>&1 || fail "prepare --buckets"
K=(--model "$TMP/base" --data "$TMP/bdata" --batch 2 --micro-batch 1 --sample-every 0 --device cpu --threads 1)
diffusion train "${K[@]}" --out "$TMP/bk" --steps 6 --ckpt-every 3 --log-every 1 > "$TMP/log" 2>&1 \
  && grep -q "10 captioned latents" "$TMP/log" && [ "$(grep -c '^step ' "$TMP/log")" = 6 ] \
  && pass "trains on a bucketed data set (3 buckets)" || fail "buckets: $(tail -3 "$TMP/log")"
diffusion train --resume "$TMP/bk/step_0000003.safetensors" --out "$TMP/bk3" --steps 6 --device cpu --threads 1 \
  > /dev/null 2>&1
cmp -s "$TMP/bk/step_0000006.safetensors" "$TMP/bk3/step_0000006.safetensors" \
  && pass "buckets: 3 steps, then 3 more resumed, the checkpoint of 6 in one go" || fail "buckets: resume differs"
diffusion train "${K[@]}" --out "$TMP/bk2" --steps 6 --ckpt-every 3 --ranks 2 > /dev/null 2>&1
cmp -s "$TMP/bk/step_0000006.safetensors" "$TMP/bk2/step_0000006.safetensors" \
  && pass "buckets: 2 ranks write one rank's checkpoint" || fail "buckets: 2 ranks differ"

# ---- from scratch: a UNet config and random weights; v prediction
diffusion train "${T[@]}" --out "$TMP/scratch" --steps 2 --unet-config "$TMP/base/unet/config.json" --init random \
  --prediction v --min-snr-gamma 5 --noise-offset 0.1 --sample-every 0 > "$TMP/log" 2>&1 || fail "from scratch: $(tail -3 "$TMP/log")"
grep -q "from random weights" "$TMP/log" && [ "$(meta "$TMP/scratch/step_0000002.safetensors" prediction)" = v_prediction ] \
  && [ "$(meta "$TMP/scratch/step_0000002.safetensors" min_snr_gamma)" = 5 ] \
  && pass "--unet-config --init random: a new UNet, v prediction and Min-SNR recorded" || fail "scratch: $(head -2 "$TMP/log")"

# ---- MDS shards in MosaicML's layout (tools/mds_mosaic: raw fp16 in bytes columns latents_256 and
# caption_latents, no prepare.json, no token counts), their columns named by flags
MM=$ROOT/${BUILD:-build}/tools/mds_mosaic
"$MM" "$TMP/data" "$TMP/mosaic" && "$MM" "$TMP/data" "$TMP/mosaicz" zstd && "$MM" "$TMP/data" "$TMP/mosaiccut" cut 3 \
  || fail "mds_mosaic"
M0=(--model "$TMP/base" --latents-column latents_256 --text-column caption_latents --batch 4 --ckpt-every 2
    --sample-every 0 "${C[@]}")
M=("${M0[@]}" --column-shape latents_256=4,8,8)
ck=$TMP/mm/step_0000002.safetensors
diffusion train "${M[@]}" --data "$TMP/mosaic" --out "$TMP/mm" --steps 2 > "$TMP/log" 2>&1 \
  && grep -q "8 captioned latents" "$TMP/log" && [ "$(meta "$ck" data_latents_column)" = latents_256 ] \
  && [ "$(meta "$ck" data_text_column)" = caption_latents ] && [ "$(meta "$ck" data_column_shapes)" = latents_256=4,8,8 ] \
  && pass "trains on MosaicML's layout with its columns named; the checkpoint records them" \
  || fail "MosaicML's layout: $(tail -2 "$TMP/log")"
# the scaling factor: the base VAE config's (0.18215) unless given
diffusion train "${M[@]}" --data "$TMP/mosaic" --out "$TMP/mm_s" --steps 2 --latent-scale 0.18215 > /dev/null 2>&1
diffusion train "${M[@]}" --data "$TMP/mosaic" --out "$TMP/mm_h" --steps 2 --latent-scale 0.5 > /dev/null 2>&1
l=$(meta "$ck" loss) ls=$(meta "$TMP/mm_s/step_0000002.safetensors" loss) lh=$(meta "$TMP/mm_h/step_0000002.safetensors" loss)
[ -n "$l" ] && [ "$l" = "$ls" ] && [ -n "$lh" ] && [ "$lh" != "$l" ] \
  && [ "$(meta "$TMP/mm_h/step_0000002.safetensors" data_latent_scale)" = 0.5 ] \
  && pass "the latent scale defaults to the base VAE's scaling factor; --latent-scale is recorded" \
  || fail "latent scale: loss '$l', with 0.18215 '$ls', with 0.5 '$lh'"
# zstd shards, and an exact resume that takes the mapping from the checkpoint
diffusion train "${M[@]}" --data "$TMP/mosaicz" --out "$TMP/mz_whole" --steps 4 > /dev/null 2>&1
diffusion train "${M[@]}" --data "$TMP/mosaicz" --out "$TMP/mz" --steps 2 > /dev/null 2>&1
diffusion train --resume "$TMP/mz" --steps 4 "${C[@]}" > "$TMP/log" 2>&1 || fail "resume zstd: $(tail -2 "$TMP/log")"
cmp -s "$TMP/mz/step_0000004.safetensors" "$TMP/mz_whole/step_0000004.safetensors" \
  && pass "zstd shards: 2 steps, then 2 resumed without the flags: the 4 steps in one go, byte for byte" \
  || fail "the resumed run on MosaicML's layout differs"
expect_code 2 "a column flag with --resume (the checkpoint fixes them)" diffusion train --resume "$TMP/mz" --steps 6 \
  --text-column caption "${C[@]}"
expect_fail "resuming on other shards is caught" "changed since" diffusion train --resume "$TMP/mm" --steps 4 \
  --data "$TMP/mosaicz" --out "$TMP/x" "${C[@]}"
expect_fail "a bytes column without its shape" 'column "latents_256" holds bytes' diffusion train "${M0[@]}" \
  --data "$TMP/mosaic" --out "$TMP/x"
expect_fail "a shape that does not fit the bytes" 'column "latents_256" holds 512 bytes' \
  diffusion train "${M0[@]}" --data "$TMP/mosaic" --column-shape latents_256=4,8,9 --out "$TMP/x"
expect_fail "a sample short of bytes" 'sample 3: column "latents_256"' \
  diffusion train "${M[@]}" --data "$TMP/mosaiccut" --steps 4 --out "$TMP/x"
rm -rf "$TMP/x"
expect_fail "a malformed --column-shape" "NAME=D0,D1" diffusion train "${M0[@]}" --data "$TMP/mosaic" \
  --column-shape 4,8,8 --out "$TMP/x"
expect_fail "--column-dtype other" "float16, float32 or bfloat16" diffusion train "${M[@]}" --data "$TMP/mosaic" \
  --column-dtype latents_256=int8 --out "$TMP/x"
expect_fail "--latent-scale against prepare.json's" "prepare.json gives" diffusion train "${T[@]}" --out "$TMP/x" \
  --latent-scale 0.5
expect_fail "MosaicML's layout without its columns named" "prepare.json" diffusion train --batch 4 "${C[@]}" \
  --out "$TMP/x" --model "$TMP/base" --data "$TMP/mosaic"
expect_code 2 "--latents-column for a DiT" diffusion train --out "$TMP/x" --latents-column latents_256

# ---- refusals
expect_fail "a named UNet whose text is not the base's" "reads text 768 wide" diffusion train "${T[@]}" \
  --out "$TMP/x" --unet-config sd1.5 --init random
expect_code 2 "--unet-config with --init base" diffusion train "${T[@]}" --out "$TMP/x" --unet-config "$TMP/base/unet/config.json" --init base
expect_code 2 "a DiT shape flag for an SD model" diffusion train "${T[@]}" --out "$TMP/x" --hidden 64
expect_code 2 "--class-dropout for an SD model" diffusion train "${T[@]}" --out "$TMP/x" --class-dropout 0.2
expect_code 2 "--caption-dropout for a DiT" diffusion train --out "$TMP/x" --caption-dropout 0.2
expect_code 2 "--prediction other" diffusion train "${T[@]}" --out "$TMP/x" --prediction x0
R=(--batch 4 "${C[@]}" --out "$TMP/x")
expect_fail "pictures that were not prepared" "prepare.json" diffusion train "${R[@]}" --model "$TMP/base" --data "$TMP/pics"
mkdir -p "$TMP/nounet" && cp -r "$TMP/base/text_encoder" "$TMP/base/tokenizer" "$TMP/base/scheduler" "$TMP/nounet/"
expect_fail "a base without a UNet and no --unet-config" "--unet-config" diffusion train "${R[@]}" --model "$TMP/nounet" \
  --data "$TMP/data"
[ ! -e "$TMP/x" ] && pass "a refused run leaves no folder behind" || fail "$TMP/x was left: $(ls "$TMP/x")"
finish
