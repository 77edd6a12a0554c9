#!/usr/bin/env bash
# Stable Diffusion on a machine with an NVIDIA GPU, in one run: correctness
# (the attention and UNet tests on the GPU, every component against the golden
# files, the two layouts to the same pixels, and an SD 1.5-size random model
# against diffusers and transformers in fp32), then speed and memory beside
# diffusers in fp16 (eager and torch.compile). Prints a summary table last.
#
#   tools/sd_gpu.sh --bin DIR --diffusers SRC [--vocab FILE] [--out DIR] [--config sd1.5|sd2.1]
#                   [tests] [check] [bench]
# tests: the GPU test programs; check: components against golden files and
# diffusers; bench: speed and memory beside diffusers.
# --bin holds diffusion, tests/ and tools/ (the binaries `make` builds);
# --diffusers is diffusers' src folder (pure Python, loaded from source).
set -u
cd "$(dirname "$0")/.."
BIN=. OUT=runs/sd-gpu DIFF= VOCAB=data/bpe_simple_vocab_16e6.txt.gz CONFIG=sd1.5 STEPS=()
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2;;
    --out) OUT=$2; shift 2;;
    --diffusers) DIFF=$2; shift 2;;
    --vocab) VOCAB=$2; shift 2;;
    --config) CONFIG=$2; shift 2;;
    -h|--help) sed -n '2,14p' "$0"; exit 0;;
    tests|check|bench) STEPS+=("$1"); shift;;
    *) echo "sd_gpu: unknown argument $1" >&2; exit 2;;
  esac
done
[ ${#STEPS[@]} -gt 0 ] || STEPS=(tests check bench)
has() { local s; for s in "${STEPS[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
mkdir -p "$OUT"
D=$BIN/diffusion T=$BIN/tests SDR=$BIN/tools/sd_random G=tests/golden/sd
if ! ldconfig -p 2>/dev/null | grep -q libcudnn.so.9 && [ ! -e /usr/local/cuda/lib64/libcudnn.so.9 ]; then
  d=$(python3 -c "import nvidia.cudnn as m; print(list(m.__path__)[0])" 2>/dev/null) &&
    export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
grep -q avx512f /proc/cpuinfo && export OPENBLAS_CORETYPE=SkylakeX
summary=()
note() { summary+=("$1"); echo "== $1"; }
cmp_t() { python3 tools/compare_tensors.py "$@"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

MODEL=/tmp/sd-random-$CONFIG
t0=$SECONDS
[ -d "$MODEL" ] || "$SDR" --config "$CONFIG" --layout diffusers --dtype f16 --out "$MODEL" || exit 1
note "random-weight $CONFIG pipeline folder written in $((SECONDS - t0)) s"

if has tests; then
  seed=$(date +%s)
  for t in "test_cuda_attention $seed" "test_unet cuda" "test_unet cuda-fp32" "test_cuda $seed" \
           "test_cuda_latent $seed" "test_cuda_errors $seed"; do
    set -- $t
    if "$T/$1" "${@:2}" > "$OUT/$1_$2.log" 2>&1; then r=PASS; else r=FAIL; fi
    grep -E "^FAIL" "$OUT/$1_$2.log" | head -5
    note "$1 $2: $r, $(tail -1 "$OUT/$1_$2.log")"
  done
  # the UNet on our own attention kernels against the same references
  # (test_cuda_attention holds them against the CPU itself)
  if "$T/test_unet" cuda cudnn_attention > "$OUT/test_unet_kernels.log" 2>&1; then r=PASS; else r=FAIL; fi
  note "test_unet cuda with cudnn_attention off (our kernels): $r, $(tail -1 "$OUT/test_unet_kernels.log")"
fi

if has check; then
  # every component on the GPU against the golden files (fp32 1e-4, bf16 3e-2)
  for c in unet vae text; do python3 tools/st_read.py extract $G/sd1/io.safetensors "$OUT/g_$c.st" "$c."; done
  for prec in fp32 bf16; do
    tol=1e-4; [ $prec = bf16 ] && tol=3e-2
    for c in "unet unet unet.out=out" "vae-decode vae vae.decoded=image" "vae-encode vae vae.mean=mean" "text-encoder text text.hidden=hidden"; do
      set -- $c
      rm -f "$OUT/g_$2_out.st"  # never compare a previous run's output
      $D forward --component $1 --weights $G/sd1/diffusers --input "$OUT/g_$2.st" --output "$OUT/g_$2_out.st" \
        --device cuda --precision $prec > "$OUT/g_$2_$prec.log" 2>&1 || tail -2 "$OUT/g_$2_$prec.log"
      note "$(cmp_t "$3" $G/sd1/io.safetensors "$OUT/g_$2_out.st" $tol "golden sd1 $1 on cuda $prec")"
    done
  done
  # the same pictures from both layouts on the GPU
  for l in diffusers single; do
    o=/tmp/tiny1-$l; [ $l = single ] && o=$o.safetensors
    "$SDR" --config tiny1 --layout $l --out $o
    $D txt2img --model $o --vocab "$VOCAB" --prompt "a red cube" --steps 5 --width 32 --height 32 --device cuda \
      --out "$OUT/tiny1-$l.png" > /dev/null 2>&1 || echo "txt2img tiny1 $l failed"
  done
  "$BIN/tools/png_pixels" "$OUT/tiny1-diffusers.png" "$OUT/tiny1-single.png" > "$OUT/layouts.txt" 2>&1
  note "txt2img on cuda, diffusers folder vs single file: $(cat "$OUT/layouts.txt")"
  # full size against diffusers / transformers, fp32 without TF32 on their side
  python3 tools/sd_pytorch.py check --model "$MODEL" --diffusers "$DIFF" --out "$OUT/full" > "$OUT/full_ref.log" 2>&1 ||
    tail -5 "$OUT/full_ref.log"
  for prec in fp32 bf16; do
    tol=2e-3; [ $prec = bf16 ] && tol=5e-2
    for c in "unet unet_in unet.out=out" "unet unet_in_batch unet.out_batch=out" "vae-decode dec_in vae.image=image" \
      "text-encoder txt_in text.hidden=hidden"; do
      set -- $c
      rm -f "$OUT/full/$2_$prec.st"
      $D forward --component $1 --weights "$MODEL" --input "$OUT/full/$2.safetensors" --output "$OUT/full/$2_$prec.st" \
        --device cuda --precision $prec > "$OUT/full_$2_$prec.log" 2>&1 || tail -2 "$OUT/full_$2_$prec.log"
      note "$(cmp_t "$3" "$OUT/full/ref.safetensors" "$OUT/full/$2_$prec.st" $tol \
        "$CONFIG-size $1 ($2) on cuda $prec vs diffusers fp32")"
    done
  done
fi

# watched NAME CMD...: runs CMD while sampling the GPU's power and SM clock
# every 50 ms, and notes their means over the busy samples (utilization over
# 50%) and how often the power limit held the clock down.
watched() {
  local name=$1 pid; shift
  nvidia-smi --query-gpu=utilization.gpu,power.draw,clocks.sm,clocks_event_reasons.active \
    --format=csv,noheader,nounits -lms 50 > "$OUT/power_$name.csv" 2>/dev/null & pid=$!
  "$@"
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  note "$name: $(python3 - "$OUT/power_$name.csv" <<'PY'
import sys
rows = []
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split(',')]
    try:
        rows.append((float(f[0]), float(f[1]), float(f[2]), int(f[3], 16)))
    except (ValueError, IndexError):
        pass
busy = [r for r in rows if r[0] > 50]
if not busy:
    print('no busy samples')
else:
    n = len(busy)
    print(f'power {sum(r[1] for r in busy) / n:.0f} W, SM clock {sum(r[2] for r in busy) / n:.0f} MHz on average '
          f'over {n} busy samples, {100 * sum(1 for r in busy if r[3] & 4) // n}% at the power limit')
PY
)"
}

if has bench; then
  nvidia-smi --query-gpu=power.limit,clocks.max.sm --format=csv,noheader | tee "$OUT/power_limit.txt"
  watched engine_bench sh -c "$D bench --sd '$MODEL' --vocab '$VOCAB' --device cuda --batch 8 --steps 50 2>&1 |
    tee '$OUT/bench_engine.txt'"
  DC_KERNELS_OFF=cudnn_attention $D bench --sd "$MODEL" --vocab "$VOCAB" --device cuda --batch 8 --steps 50 2>&1 |
    tee "$OUT/bench_engine_kernels.txt"
  watched diffusers_bench sh -c "python3 tools/sd_pytorch.py bench --model '$MODEL' --diffusers '$DIFF' \
    --batch 8 --steps 50 2>&1 | grep -v Warning | tee '$OUT/bench_pytorch.txt'"
  /usr/bin/time -v $D txt2img --model "$MODEL" --vocab "$VOCAB" --prompt "a photo of an astronaut riding a horse on mars" \
    --steps 50 --device cuda --out "$OUT/astronaut.png" > "$OUT/txt2img.log" 2>&1
  note "txt2img 50 steps end to end: $(grep -E 'made 1 picture' "$OUT/txt2img.log" | tail -1), max RSS $(grep 'Maximum resident' "$OUT/txt2img.log" | awk '{print $NF}') KB"
fi

echo
echo "==== summary ($(head -1 "$OUT/gpu.txt"))"
for s in "${summary[@]}"; do echo "  $s"; done
[ -f "$OUT/bench_engine.txt" ] && sed -n '1,12p' "$OUT/bench_engine.txt"
[ -f "$OUT/bench_engine_kernels.txt" ] && echo "-- with DC_KERNELS_OFF=cudnn_attention (our attention kernels):" &&
  sed -n '1,12p' "$OUT/bench_engine_kernels.txt"
[ -f "$OUT/bench_pytorch.txt" ] && cat "$OUT/bench_pytorch.txt"
