#!/usr/bin/env bash
# The GPU checks and benchmarks of the CUDA backend, in one run on a machine
# with an NVIDIA GPU. Steps (any subset, in this order):
#   check     test_cuda, test_cuda_latent, test_cuda_errors and test_cuda_attention
#             (every op, CPU vs GPU, fp32 and bf16 modes, a whole DiT, errors
#             returned as errors), test_ops, test_ops_latent and test_ops_ff on the GPU in fp32
#             against float64 references, `diffusion forward` GPU vs CPU on the
#             golden model, the same seed's starting noise on both, and a short
#             training run on each whose loss curves are compared
#   sanitize  compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over the
#             CPU-vs-GPU op programs
#   bench     `diffusion bench` on --model at --batch (training, sampling at 32
#             and at 1 with guidance), then tools/bench_pytorch.py on the same
#             workloads (eager bf16 and torch.compile), then the ratios
#
#   tools/gpu_check.sh [--bin DIR] [--out DIR] [--data DIR] [--model NAME]
#                      [--batch N] [--torch-modes eager,compile] [steps...]
# --bin holds diffusion and tests/ (default: ./diffusion and build/tests).
set -u
cd "$(dirname "$0")/.."
BIN=. TESTS=build/tests OUT=runs/gpu-check DATA=/usr/share/datasets/fashion-mnist
MODEL=DiT-XL/2 BATCH=64 TORCH_MODES=eager,compile STEPS=()
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; TESTS=$2/tests; shift 2;;
    --out) OUT=$2; shift 2;;
    --data) DATA=$2; shift 2;;
    --model) MODEL=$2; shift 2;;
    --batch) BATCH=$2; shift 2;;
    --torch-modes) TORCH_MODES=$2; shift 2;;
    -h|--help) sed -n '2,19p' "$0"; exit 0;;
    check|sanitize|bench) STEPS+=("$1"); shift;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2;;
  esac
done
[ ${#STEPS[@]} -gt 0 ] || STEPS=(check sanitize bench)
mkdir -p "$OUT"
D=$BIN/diffusion
grep -q avx512f /proc/cpuinfo && export OPENBLAS_CORETYPE=SkylakeX
summary=()
note() { summary+=("$1"); echo "== $1"; }
has() { local s; for s in "${STEPS[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
# The CUDA backend links cuDNN 9: where the toolkit folder lacks it, use the
# copy that PyTorch's wheels bring.
if ! ldconfig -p 2>/dev/null | grep -q libcudnn.so.9 && [ ! -e /usr/local/cuda/lib64/libcudnn.so.9 ]; then
  d=$(python3 -c "import nvidia.cudnn as m; print(list(m.__path__)[0])" 2>/dev/null) &&
    export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && echo "cuDNN from $d/lib"
fi

if has check; then
  seed=$(date +%s)
  for t in test_cuda test_cuda_latent test_cuda_errors test_cuda_attention; do
    if "$TESTS/$t" "$seed" > "$OUT/$t.log" 2>&1; then r=PASS; else r=FAIL; fi
    grep -E "^FAIL" "$OUT/$t.log"
    note "$t (seed $seed): $r, $(tail -1 "$OUT/$t.log")"
  done
  if "$TESTS/test_ops" "$seed" cuda-fp32 > "$OUT/test_ops_gpu.log" 2>&1; then r=PASS; else r=FAIL; fi
  grep -E "FAIL" "$OUT/test_ops_gpu.log" | head
  note "test_ops on cuda-fp32 vs float64: $r, $(tail -1 "$OUT/test_ops_gpu.log")"
  for t in test_ops_latent test_ops_ff; do
    if "$TESTS/$t" "$seed" cuda-fp32 > "$OUT/${t}_gpu.log" 2>&1; then r=PASS; else r=FAIL; fi
    grep -E "FAIL" "$OUT/${t}_gpu.log" | head
    note "$t on cuda-fp32 vs float64: $r, $(tail -1 "$OUT/${t}_gpu.log")"
  done

  # forward on the golden model: GPU fp32 within 1e-4, bf16 within 2e-2 of the CPU
  g=tests/golden/dit_b.safetensors in=$OUT/fwd_in.safetensors
  python3 tools/st_read.py extract "$g" "$in" input.
  $D forward --weights "$g" --input "$in" --output "$OUT/fwd_cpu.safetensors" --device cpu > /dev/null
  $D forward --weights "$g" --input "$in" --output "$OUT/fwd_f32.safetensors" --device cuda --precision fp32 > /dev/null
  $D forward --weights "$g" --input "$in" --output "$OUT/fwd_bf16.safetensors" --device cuda --precision bf16 > /dev/null
  note "$(python3 tools/compare_tensors.py out "$OUT/fwd_cpu.safetensors" "$OUT/fwd_f32.safetensors" 1e-4 'forward fp32 GPU vs CPU')"
  note "$(python3 tools/compare_tensors.py out "$OUT/fwd_cpu.safetensors" "$OUT/fwd_bf16.safetensors" 2e-2 'forward bf16 GPU vs CPU')"

  # a short run of the demo recipe on each device, same seed: loss curves
  for dev in cpu cuda; do
    $D train --data "$DATA" --out "$OUT/train_$dev" --steps 300 --log-every 25 --ckpt-every 300 \
      --device $dev --seed 3 > "$OUT/train_$dev.log" 2>&1 || echo "train on $dev failed"
  done
  note "$(python3 tools/compare_curves.py "$OUT/train_cpu.log" "$OUT/train_cuda.log")"
  # the same seed's samples: identical start noise, so fp32 images agree closely
  for dev in cpu cuda; do
    prec=fp32; [ $dev = cpu ] && prec=auto
    $D sample --ckpt "$OUT/train_$dev" --classes 0-9 --per-class 2 --steps 20 --seed 9 --device $dev \
      --precision $prec --tensor-out "$OUT/sample_$dev.safetensors" --out-dir "$OUT/samples_$dev" > /dev/null 2>&1
  done
  $D sample --ckpt "$OUT/train_cpu" --classes 0-9 --per-class 2 --steps 20 --seed 9 --device cuda \
    --precision fp32 --tensor-out "$OUT/sample_cpu_ckpt_on_gpu.safetensors" --out-dir "$OUT/samples_x" > /dev/null 2>&1
  note "$(python3 tools/compare_tensors.py samples "$OUT/sample_cpu.safetensors" "$OUT/sample_cpu_ckpt_on_gpu.safetensors" 1e-3 'CPU checkpoint sampled on GPU (fp32) vs CPU, same seed')"
fi

if has sanitize; then
  if command -v compute-sanitizer > /dev/null; then
    # memcheck (out-of-bounds and misaligned accesses), racecheck (shared-memory
    # hazards), synccheck (barriers) and initcheck (reads of unwritten memory)
    # (racecheck and initcheck over the engine's own shared-memory kernels only:
    # under them cuBLASLt's products take many minutes)
    for tool in memcheck racecheck synccheck initcheck; do
      runs=("test_cuda all" "test_cuda_latent all" "test_cuda_errors all")
      case $tool in racecheck|initcheck) runs=("test_cuda attention,adaln,pointwise");; esac
      for run in "${runs[@]}"; do
        set -- $run
        log=$OUT/sanitize_${tool}_$1.log
        timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool $tool --error-exitcode 9 "$TESTS/$1" 1 $2 \
          > "$log" 2>&1
        rc=$?
        grep -E "Invalid|Race|Barrier|Uninitialized|FAIL" "$log" | head -3
        note "compute-sanitizer $tool on $1 ($2): exit $rc, $(grep -h 'SUMMARY' "$log" | tail -1)"
      done
    done
  else
    note "compute-sanitizer: not installed"
  fi
fi

if has bench; then
  $D bench --model "$MODEL" --batch "$BATCH" --iters 10 --warmup 2 --sample-steps 20 --device cuda \
    2>&1 | tee "$OUT/bench_engine.txt"
  PYTHONUNBUFFERED=1 python3 tools/bench_pytorch.py --model "$MODEL" --batch "$BATCH" --device cuda \
    --modes "$TORCH_MODES" --iters 10 --sample-steps 20 --repeats 3 --json "$OUT/bench_torch.json" \
    > "$OUT/bench_torch.txt" 2>&1 || echo "bench_pytorch failed"
  tail -8 "$OUT/bench_torch.txt"
  python3 tools/compare_bench.py "$OUT/bench_engine.txt" "$OUT/bench_torch.json" | tee "$OUT/bench_table.txt"
fi

echo
echo "== summary"
for s in "${summary[@]}"; do echo "  $s"; done
[ -f "$OUT/bench_table.txt" ] && cat "$OUT/bench_table.txt"
