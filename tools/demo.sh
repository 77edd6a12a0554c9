#!/usr/bin/env bash
# The main job: train the small demo DiT on Fashion-MNIST on the CPU and
# draw 100 samples of each class. Writes into runs/demo/; run again, it
# continues an unfinished training run instead of starting over.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh
make -s diffusion
out=runs/demo
if ls "$out"/step_*.safetensors >/dev/null 2>&1; then
  ./diffusion train --resume "$out"
else
  ./diffusion train --out "$out"
fi
rm -rf "$out/samples"
./diffusion sample --ckpt "$out" --classes 0-9 --per-class 100 --steps 50 --cfg-scale 4 \
  --batch 100 --grid "$out/grid.png" --grid-cols 10 --out-dir "$out/samples"
ck=$(ls "$out"/step_*.safetensors | tail -n 1)
echo
echo "checkpoint: $ck"
echo "grid:       $out/grid.png (rows = classes 0..9)"
echo "samples:    $out/samples/class{c}_{i}.png (100 per class)"
