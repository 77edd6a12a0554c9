#!/usr/bin/env bash
# `diffusion bench --sd-train` on the CPU with a tiny UNet config: it trains
# through the trainer and prints its table, whose figures agree with each
# other and with the wall clock, on one rank and on two, with a LoRA (of the
# UNet, and of SD 1.5's UNet and text encoder), with offload and updating in
# the backward; bad flags and configs fail, naming what is
# wrong. tools/sd_train_bench.py (diffusers' side, run on a GPU) at least
# compiles.
source "$(dirname "$0")/lib.sh"
cat > "$TMP/tiny.json" <<'EOF'
{"_class_name": "UNet2DConditionModel", "act_fn": "silu", "in_channels": 4, "out_channels": 4,
 "block_out_channels": [32, 64], "layers_per_block": 1, "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
 "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"], "attention_head_dim": [1, 2], "cross_attention_dim": 48,
 "norm_num_groups": 16, "norm_eps": 1e-05, "sample_size": 8, "use_linear_projection": true}
EOF
Q=(--sd-train --unet-config "$TMP/tiny.json" --device cpu --threads 1)

# check_table FILE BATCH MICRO SECONDS: one table row, its figures finite and
# positive, img/s x ms/step = 1000 x batch and TFLOP/s = 3 (a LoRA: 2) x GFLOP/image x
# img/s / 1000 (each to the rounding printed), and the steps no faster than
# the command's whole run allows (steps x seconds a step <= wall seconds).
check_table() {  # FILE BATCH MICRO WALL STEPS [PASSES: forward passes a step, 3; a LoRA's 2]
  local f=$1 batch=$2 micro=$3 wall=$4 steps=$5 passes=${6:-3}
  local gf row
  gf=$(sed -nE 's/.*; ([0-9.e+-]+) GFLOP\/image forward;.*/\1/p' "$f")
  row=$(grep -E "^\| $batch \| $micro \| " "$f")
  if [ -z "$gf" ] || [ -z "$row" ]; then fail "batch $batch/$micro: no model line or table row in: $(cat "$f")"; return; fi
  awk -F'|' -v gf="$gf" -v b="$batch" -v wall="$wall" -v steps="$steps" -v passes="$passes" '{
      ips = $5 + 0; ms = $6 + 0; tf = $7 + 0; peak = $9 + 0
      if (!(ips > 0 && ms > 0 && peak > 0 && gf > 0)) { print "figures not positive: " $0; exit 1 }
      if (ips * ms < 1000 * b * 0.99 || ips * ms > 1000 * b * 1.01) { print "img/s x ms/step != 1000 x batch: " $0; exit 1 }
      want = passes * gf * ips / 1000
      if (tf < want - 0.006 || tf > want + 0.006) { print "TFLOP/s " tf " where " passes " x GFLOP x img/s gives " want; exit 1 }
      if (steps * ms / 1000 > wall) { print steps " steps of " ms " ms in a run of " wall " s"; exit 1 }
    }' <<< "$row" > "$TMP/why" && pass "batch $batch, micro-batch $micro: the table's figures agree" \
    || fail "batch $batch, micro-batch $micro: $(cat "$TMP/why")"
}

# ---- runs: a plain batch, gradient accumulation with recompute
t0=$(date +%s.%N)
diffusion bench "${Q[@]}" --size 64 --batch 4 --steps 3 --warmup 1 > "$TMP/a.txt" 2> "$TMP/a.err" \
  || fail "batch 4: $(tail -2 "$TMP/a.err")"
wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
grep -q '^| batch | micro-batch | recompute | img/s | ms/step | TFLOP/s | MFU | peak GiB |$' "$TMP/a.txt" \
  && pass "the table's header" || fail "no table header in: $(cat "$TMP/a.txt")"
grep -qE '^model   .*tiny.json: UNet2DConditionModel channels 32 64' "$TMP/a.txt" && \
  grep -qE '64x64 pictures, latents 4x8x8, text 77x48;' "$TMP/a.txt" \
  && pass "the model line: the config's UNet at --size 64" || fail "model line: $(head -2 "$TMP/a.txt")"
check_table "$TMP/a.txt" 4 4 "$wall" 3
grep -qE '^\| 4 \| 4 \| off \|.*\(process RSS\) \|$' "$TMP/a.txt" && pass "the CPU quotes the process's peak memory" \
  || fail "memory column: $(grep '^| 4' "$TMP/a.txt")"
t0=$(date +%s.%N)
diffusion bench "${Q[@]}" --size 32 --batch 4 --micro-batch 2 --recompute 1 --steps 1 --warmup 0 > "$TMP/b.txt" \
  2> "$TMP/b.err" || fail "micro-batch 2: $(tail -2 "$TMP/b.err")"
wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
check_table "$TMP/b.txt" 4 2 "$wall" 1
grep -qE '^\| 4 \| 2 \| keep 1 of [0-9]+ \|' "$TMP/b.txt" && pass "--recompute shows in the table" \
  || fail "recompute column: $(grep '^| 4' "$TMP/b.txt")"
diffusion bench "${Q[@]}" --size 32 --batch 2 --selective-recompute --steps 1 --warmup 0 > "$TMP/s.txt" 2>&1 \
  && grep -qE '^\| 2 \| 2 \| off, selective \|' "$TMP/s.txt" && pass "--selective-recompute shows in the table" \
  || fail "--selective-recompute: $(tail -2 "$TMP/s.txt")"

# ---- two ranks (the socket communicator on the CPU): batch 2 each, the table the job's (batch 4), and
# ZeRO stage 2
t0=$(date +%s.%N)
diffusion bench "${Q[@]}" --size 32 --batch 2 --steps 2 --warmup 1 --ranks 2 --zero 2 > "$TMP/r.txt" 2> "$TMP/r.err" \
  || fail "2 ranks: $(tail -2 "$TMP/r.err")"
wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
check_table "$TMP/r.txt" 4 2 "$wall" 2
grep -q '^ranks   2, sockets, ZeRO stage 2, batch 2 per rank (4 a step)' "$TMP/r.txt" \
  && grep -qE '^ranks 2: [0-9.]+ img/s a rank' "$TMP/r.txt" && [ "$(grep -c '^| 4 |' "$TMP/r.txt")" = 1 ] \
  && pass "--ranks 2 --zero 2: one table, of the job, from rank 0" || fail "2 ranks: $(cat "$TMP/r.txt")"

# ---- a LoRA over the frozen UNet (a step counts 2 forward passes), and the optimizer offloaded
t0=$(date +%s.%N)
diffusion bench "${Q[@]}" --size 32 --batch 2 --steps 2 --warmup 1 --lora 2 > "$TMP/l.txt" 2>&1 \
  || fail "--lora: $(tail -2 "$TMP/l.txt")"
wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
check_table "$TMP/l.txt" 2 2 "$wall" 3 2
diffusion bench "${Q[@]}" --size 32 --batch 2 --steps 2 --warmup 1 --offload > "$TMP/o.txt" 2>&1 \
  && grep -q '^| 2 | 2 | off |' "$TMP/o.txt" && pass "--offload: a table row" || fail "--offload: $(tail -2 "$TMP/o.txt")"
diffusion bench "${Q[@]}" --size 32 --batch 2 --steps 2 --warmup 1 --update-in-backward > "$TMP/f.txt" 2>&1 \
  && grep -q '^| 2 | 2 | off |' "$TMP/f.txt" && pass "--update-in-backward: a table row" \
  || fail "--update-in-backward: $(tail -2 "$TMP/f.txt")"
expect_fail "--update-in-backward with accumulation" "one micro-batch" \
  diffusion bench "${Q[@]}" --size 32 --batch 2 --micro-batch 1 --steps 1 --update-in-backward
# the text encoder's LoRA along (SD 1.5's UNet and CLIP ViT-L/14, reading token ids)
diffusion bench --sd-train --unet-config tools/configs/sd15_unet.json --device cpu --size 64 --batch 1 --steps 1 \
  --warmup 0 --lora 2 --train-text-encoder > "$TMP/te.txt" 2>&1 \
  && grep -q 'with its CLIP text encoder (width 768, 12 layers)' "$TMP/te.txt" && grep -q '^| 1 | 1 | off |' "$TMP/te.txt" \
  && pass "--lora --train-text-encoder: the UNet and CLIP ViT-L/14's LoRA, a table row" \
  || fail "--lora --train-text-encoder: $(tail -2 "$TMP/te.txt")"
expect_fail "--train-text-encoder for a UNet no SD encoder fits" "no SD text encoder is 48 wide" \
  diffusion bench "${Q[@]}" --train-text-encoder

# ---- flags and configs at fault
expect_fail "no --unet-config" "--unet-config is required" diffusion bench --sd-train
expect_code 2 "no --unet-config is a usage error" diffusion bench --sd-train
expect_fail "--size not a multiple of 8" "--size must be a multiple of 8" diffusion bench "${Q[@]}" --size 60
expect_fail "--micro-batch above --batch" "--micro-batch must be in 1..--batch (got 5)" \
  diffusion bench "${Q[@]}" --batch 4 --micro-batch 5
expect_fail "--steps 0" "--steps must be positive" diffusion bench "${Q[@]}" --steps 0
expect_fail "--recompute -2" "--recompute must be 0 or more" diffusion bench "${Q[@]}" --recompute -2
expect_fail "an unknown flag" "--iters" diffusion bench "${Q[@]}" --iters 3
expect_code 2 "a bad value is a usage error" diffusion bench "${Q[@]}" --batch 0
expect_fail "a missing config" "$TMP/none.json" diffusion bench --sd-train --unet-config "$TMP/none.json" --device cpu
expect_code 1 "a missing config fails the command" diffusion bench --sd-train --unet-config "$TMP/none.json"
echo '{"_class_name": "AutoencoderKL"}' > "$TMP/vae.json"
expect_fail "a config of another model" "AutoencoderKL" diffusion bench --sd-train --unet-config "$TMP/vae.json"
# 24 px: latents of 3, which the UNet's one downsampling cannot halve
expect_fail "a size the UNet cannot take" "latent size 3x3: the UNet needs multiples of 2" diffusion bench "${Q[@]}" --size 24

# ---- diffusers' side compiles (it runs on a GPU: tools/sd_train_gpu.sh)
if command -v python3 > /dev/null; then
  python3 -c 'import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)' \
    "$(dirname "$0")/../tools/sd_train_bench.py" "$TMP/bench.pyc" 2> "$TMP/py.err" \
    && pass "tools/sd_train_bench.py compiles" || fail "tools/sd_train_bench.py: $(cat "$TMP/py.err")"
else
  echo "SKIP (no python3) tools/sd_train_bench.py's syntax"
fi
finish
