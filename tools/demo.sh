#!/usr/bin/env bash
# The main job: train the small demo DiT on Fashion-MNIST on the CPU and draw
# 100 samples of each class. Installs what is missing first (tools/deps.sh),
# so it is the first command to run on a machine with nothing installed.
# Writes into runs/demo/; run again, it continues an unfinished training run
# instead of starting over.
#   DEMO_STEPS=N  train N steps instead of the recipe's 7000 (DEMO_STEPS=300
#                 runs in about a minute on two cores, a check that all
#                 works: the model is not trained yet, and tools/fmnist_judge.py
#                 recognises 11% of its samples, chance being 10%; 43% after
#                 1000 steps, 93% after 7000). A later run with a larger N, or
#                 without it, continues the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${DEMO_STEPS:-7000}  # the demo recipe's length, diffusion train's default
if ! [[ "$steps" =~ ^[1-9][0-9]*$ ]]; then
  echo "demo: DEMO_STEPS must be a positive number of steps, not '$steps'" >&2
  exit 2
fi
echo "demo: checking the Debian packages it needs (tools/deps.sh)"
bash tools/deps.sh
bash tools/build.sh diffusion
out=runs/demo
if ls "$out"/step_*.safetensors > /dev/null 2>&1; then
  echo "demo: continuing the training run in $out to step $steps"
  ./diffusion train --resume "$out" --steps "$steps"
else
  echo "demo: training the demo DiT on Fashion-MNIST for $steps steps into $out"
  ./diffusion train --out "$out" --steps "$steps"
fi
rm -rf "$out/samples"
echo "demo: drawing 100 samples of each class"
./diffusion sample --ckpt "$out" --classes 0-9 --per-class 100 --steps 50 --cfg-scale 4 \
  --batch 100 --grid "$out/grid.png" --grid-cols 10 --out-dir "$out/samples"
ck=$(ls "$out"/step_*.safetensors | tail -n 1)
echo
echo "checkpoint: $ck"
echo "grid:       $out/grid.png (rows = classes 0..9)"
echo "samples:    $out/samples/class{c}_{i}.png (100 per class)"
