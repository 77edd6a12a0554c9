#!/usr/bin/env bash
# The text-to-image demo: trains, from scratch, a small text-conditioned UNet
# on Fashion-MNIST's classes 0-8 (class 9, the ankle boot, is kept out for
# tools/dreambooth_demo.sh) with captions made from templates
# (tools/t2i_demo/templates.txt), three in five of them with filler words
# around them (tools/t2i_demo/fillers.txt), and the class names in lower
# case. It works in pixel space (no VAE) at 28x28, with the real CLIP
# tokenizer and a small CLIP text encoder that is random-initialised and
# trained along with the UNet (frozen, it could not tell "shirt" from
# "t-shirt", nor a coat from its unseen phrasings). Then it draws pictures,
# at guidance 5, for "a photo of a {class}" and for phrasings the captions do
# not hold (tools/t2i_demo/heldout.txt), and, where Debian's python3-torch is
# installed, scores them with tools/fmnist_judge.py.
#
# Writes runs/t2i-demo/: base/ (tokenizer, text encoder, scheduler), pictures/
# and data/ (the prepared shards), run/ (checkpoints, loss.csv, loss.png,
# samples/ grids), model/ (the exported diffusers folder txt2img loads),
# samples/ and heldout/ (the judged pictures, class{c}-{i}.png).
#   T2I_STEPS=N   train N steps instead of the recipe's (a later run continues)
#   T2I_DEVICE=D  cpu (default) or cuda
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${T2I_STEPS:-2000}
device=${T2I_DEVICE:-cpu}
per_class=${T2I_PER_CLASS:-50}
if ! [[ "$steps" =~ ^[1-9][0-9]*$ ]]; then
  echo "t2i demo: T2I_STEPS must be a positive number of steps, not '$steps'" >&2
  exit 2
fi
fmnist=/usr/share/datasets/fashion-mnist
bash tools/deps.sh
bash tools/build.sh diffusion build/tools/sd_random build/tools/fmnist_pictures
out=runs/t2i-demo
mkdir -p "$out"
t0=$SECONDS
if [ ! -d "$out/base" ]; then
  echo "t2i demo: a random-initialised small CLIP text encoder with CLIP's tokenizer, no VAE"
  build/tools/sd_random --config t2i-demo --layout diffusers --seed 1 --out "$out/base.tmp"
  mv "$out/base.tmp" "$out/base"
fi
if [ ! -f "$out/pictures/.done" ]; then
  rm -rf "$out/pictures"
  build/tools/fmnist_pictures --data "$fmnist" --templates tools/t2i_demo/templates.txt \
    --fillers tools/t2i_demo/fillers.txt --classes 0-8 --out "$out/pictures"
  touch "$out/pictures/.done"
fi
# prepare continues an unfinished run by itself, and leaves a finished one alone
[ -f "$out/data/prepare.json" ] || ./diffusion prepare --model "$out/base" --vae none --data "$out/pictures" \
  --out "$out/data" --size 28 --batch 256 --device "$device"
recipe=(--steps "$steps" --batch 64 --lr 1e-3 --warmup 100 --ema-decay 0.999 --caption-dropout 0.1 --prediction v --min-snr-gamma 5
        --train-text-encoder
        --ckpt-every 500 --sample-every 1000 --sample-prompts tools/t2i_demo/prompts.txt --sample-steps 25
        --sample-cfg 5 --device "$device")
if ls "$out"/run/step_*.safetensors > /dev/null 2>&1; then
  echo "t2i demo: continuing the training run in $out/run to step $steps"
  ./diffusion train --resume "$out/run" --steps "$steps" --device "$device"
else
  echo "t2i demo: training a text-to-image UNet from scratch, and its text encoder, for $steps steps into $out/run"
  ./diffusion train --model "$out/base" --unet-config tools/t2i_demo/unet.json --init random \
    --data "$out/data" --out "$out/run" "${recipe[@]}"
fi
rm -rf "$out/model" "$out/samples" "$out/heldout"
./diffusion export --ckpt "$out/run" --out "$out/model"
names=(t-shirt trouser pullover dress coat sandal shirt sneaker bag)
mapfile -t heldout < tools/t2i_demo/heldout.txt
echo "t2i demo: drawing $per_class pictures of each class for \"a photo of a {class}\" and for held-out phrasings"
mkdir -p "$out/samples" "$out/heldout"
for c in "${!names[@]}"; do
  ./diffusion txt2img --model "$out/model" --prompt "a photo of a ${names[c]}" --count "$per_class" \
    --batch "$per_class" --steps 25 --sampler ddim --cfg-scale 5 --seed "$c" --out "$out/samples/class$c.png" \
    --device "$device" > "$out/txt2img.log" 2>&1 || { cat "$out/txt2img.log" >&2; exit 1; }
  # a phrasing the training captions never held, a different one for each class
  h=${heldout[c % ${#heldout[@]}]}
  ./diffusion txt2img --model "$out/model" --prompt "${h//\{\}/${names[c]}}" --count "$per_class" \
    --batch "$per_class" --steps 25 --sampler ddim --cfg-scale 5 --seed "$c" --out "$out/heldout/class$c.png" \
    --device "$device" > "$out/txt2img.log" 2>&1 || { cat "$out/txt2img.log" >&2; exit 1; }
done
echo "t2i demo: done in $(((SECONDS - t0) / 60)) min"
echo "model:    $out/model (txt2img --model $out/model --prompt \"a photo of a bag\")"
echo "grids:    $out/run/samples/"
echo "loss:     $out/run/loss.png"
py=python3; [ -x /usr/bin/python3 ] && py=/usr/bin/python3  # Debian's, where python3-torch lives
if $py -c "import torch, PIL" 2> /dev/null; then
  [ -f runs/judge.pt ] || $py tools/fmnist_judge.py train
  echo "judged, \"a photo of a {class}\":"
  $py tools/fmnist_judge.py score "$out/samples"
  echo "judged, held-out phrasings:"
  $py tools/fmnist_judge.py score "$out/heldout"
else
  echo "(install python3-torch and python3-pil to score the pictures with tools/fmnist_judge.py)"
fi
