#!/usr/bin/env bash
# The DreamBooth demo: teaches the text-to-image demo's model
# (runs/t2i-demo/model, tools/t2i_demo.sh: Fashion-MNIST's classes 0-8,
# which never saw an ankle boot) "sks boot" from 20 ankle-boot pictures of
# Fashion-MNIST's training set, with prior preservation on "a photo of a
# shoe" pictures the model draws itself, as diffusers' train_dreambooth.py
# teaches a subject:
#   - a LoRA (rank 8, kohya's format) of the UNet and the text encoder:
#     runs/dreambooth-demo/lora.safetensors;
#   - the whole UNet fine-tuned: runs/dreambooth-demo/model/ (a diffusers
#     folder txt2img loads);
#   - the LoRA again without prior preservation, to show what it keeps.
# Then it draws, at guidance 5, pictures of "a photo of sks boot" with each
# and of "a photo of a {class}" for the nine other classes, and, where
# Debian's python3-torch is installed, scores them with tools/fmnist_judge.py:
# the boots recognised as ankle boots, and the nine classes still recognised
# (what the model forgets).
#   DB_STEPS=N    train N steps instead of the recipe's
#   DB_DEVICE=D   cpu (default) or cuda
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${DB_STEPS:-800}
device=${DB_DEVICE:-cpu}
per_class=${DB_PER_CLASS:-50}
if ! [[ "$steps" =~ ^[1-9][0-9]*$ ]]; then
  echo "dreambooth demo: DB_STEPS must be a positive number of steps, not '$steps'" >&2
  exit 2
fi
base=runs/t2i-demo/model
if [ ! -f "$base/model_index.json" ]; then
  echo "dreambooth demo: $base is missing: make it first with bash tools/t2i_demo.sh" >&2
  exit 1
fi
fmnist=/usr/share/datasets/fashion-mnist
bash tools/deps.sh
bash tools/build.sh diffusion build/tools/fmnist_pictures
out=runs/dreambooth-demo
mkdir -p "$out"
t0=$SECONDS
if [ ! -f "$out/boots/.done" ]; then  # 20 ankle boots (class 9) of the training set; their captions are not read
  rm -rf "$out/boots"
  echo "{}" > "$out/template.txt"
  build/tools/fmnist_pictures --data "$fmnist" --templates "$out/template.txt" --classes 9-9 --per-class 20 \
    --split train --out "$out/boots"
  touch "$out/boots/.done"
fi
common=(--model "$base" --instance-data "$out/boots" --instance-prompt "a photo of sks boot" --steps "$steps"
        --ema-decay 0.99 --ckpt-every 400 --sample-every 0 --device "$device")
prior=(--class-prompt "a photo of a shoe" --class-images 200 --class-data "$out/shoes" --batch 8)
run() {  # name flags...: trains into $out/NAME (or continues it)
  local name=$1; shift
  if ls "$out/$name"/step_*.safetensors > /dev/null 2>&1; then
    ./diffusion train --resume "$out/$name" --steps "$steps" --device "$device"
  else
    ./diffusion train "${common[@]}" --out "$out/$name" "$@"
  fi
}
echo "dreambooth demo: a rank-8 LoRA of the UNet and the text encoder, with prior preservation"
run lora-run "${prior[@]}" --lora 8 --train-text-encoder --lr 1e-3
cp "$out/lora-run/lora.safetensors" "$out/lora.safetensors"
echo "dreambooth demo: the whole UNet, with prior preservation"
run full-run "${prior[@]}" --lr 2e-4
rm -rf "$out/model"
./diffusion export --ckpt "$out/full-run" --out "$out/model" --raw
echo "dreambooth demo: the LoRA without prior preservation"
run lora-noprior --lora 8 --train-text-encoder --lr 1e-3 --batch 4
names=(t-shirt trouser pullover dress coat sandal shirt sneaker bag)
draw() {  # folder model [flags...]: class9-* for "a photo of sks boot", class{c}-* for the others
  local dir=$1 model=$2; shift 2
  rm -rf "$dir" && mkdir -p "$dir"
  local g=(--count "$per_class" --batch "$per_class" --steps 25 --sampler ddim --cfg-scale 5 --device "$device")
  ./diffusion txt2img --model "$model" "$@" --prompt "a photo of sks boot" --seed 9 --out "$dir/class9.png" "${g[@]}" \
    > "$out/txt2img.log" 2>&1 || { cat "$out/txt2img.log" >&2; exit 1; }
  for c in "${!names[@]}"; do
    ./diffusion txt2img --model "$model" "$@" --prompt "a photo of a ${names[c]}" --seed "$c" --out "$dir/class$c.png" \
      "${g[@]}" > "$out/txt2img.log" 2>&1 || { cat "$out/txt2img.log" >&2; exit 1; }
  done
}
echo "dreambooth demo: drawing $per_class pictures of \"a photo of sks boot\" and of each other class"
draw "$out/samples-lora" "$base" --lora "$out/lora.safetensors"
draw "$out/samples-full" "$out/model"
draw "$out/samples-noprior" "$base" --lora "$out/lora-noprior/lora.safetensors"
draw "$out/samples-base" "$base"
echo "dreambooth demo: done in $(((SECONDS - t0) / 60)) min"
echo "LoRA:     $out/lora.safetensors (txt2img --model $base --lora $out/lora.safetensors --prompt \"a photo of sks boot\")"
echo "model:    $out/model (txt2img --model $out/model --prompt \"a photo of sks boot\")"
py=python3; [ -x /usr/bin/python3 ] && py=/usr/bin/python3  # Debian's, where python3-torch lives
if $py -c "import torch, PIL" 2> /dev/null; then
  [ -f runs/judge.pt ] || $py tools/fmnist_judge.py train
  for s in lora full noprior base; do
    echo "judged, $s (class 9: \"a photo of sks boot\"; the others: \"a photo of a {class}\"):"
    $py tools/fmnist_judge.py score "$out/samples-$s"
  done
else
  echo "(install python3-torch and python3-pil to score the pictures with tools/fmnist_judge.py)"
fi
