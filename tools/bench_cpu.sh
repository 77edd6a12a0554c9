#!/usr/bin/env bash
# CPU throughput of the engine beside PyTorch (tools/bench_pytorch.py, the
# reference model) on the same machine, same threads, same workloads.
#   tools/bench_cpu.sh [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-$(nproc)}
py=/usr/bin/python3
make -s diffusion
run() {  # name, engine flags, pytorch flags
  echo "== $1 ($threads threads) =="
  echo "-- diffusion.c"; ./diffusion bench --threads "$threads" $2
  if $py -c "import torch" 2>/dev/null; then
    echo "-- PyTorch"; $py tools/bench_pytorch.py --threads "$threads" $3
  else
    echo "-- PyTorch: not installed (python3-torch)"
  fi
}
run "demo DiT (6 x 64, 28x28x1, patch 4)" "--batch 64 --iters 20 --sample-batch 32 --sample-steps 20" \
    "--model demo --batch 64 --iters 20 --sample-batch 32 --sample-steps 20"
run "DiT-S/2 (32x32x4 latents)" "--model DiT-S/2 --batch 16 --iters 3 --sample-batch 8 --sample-steps 3" \
    "--model DiT-S/2 --batch 16 --iters 3 --sample-batch 8 --sample-steps 3"
