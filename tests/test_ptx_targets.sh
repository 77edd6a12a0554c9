#!/usr/bin/env bash
# The CUDA backend on Ampere and Ada GPUs (sm_80, sm_86, sm_89: the 8 GB
# cards people fine-tune on), which run the build's compute_80 PTX, compiled
# by the driver when the program loads:
# - the Makefile's GENCODE embeds compute_80 PTX beside the sm_90a code;
# - every CUDA source compiles to compute_80 PTX with the build's flags, and
#   ptxas turns that PTX into machine code for sm_80, sm_86 and sm_89, as the
#   driver does there: no kernel uses an instruction or resource those GPUs
#   lack;
# - every kernel of the sm_90a build is in that PTX too (the Hopper-only ones
#   with an empty body, which the backend never launches off sm_90a:
#   cuda_sm90.h's sm90_device).
# `test_cuda_* ` run on a GPU by a build of that PTX alone (GENCODE=
# "-gencode=arch=compute_80,code=compute_80") check the kernels compute what
# they should there; docs/PERFORMANCE.md records such a run.
# Needs the CUDA toolkit (nvcc, ptxas) but no GPU; skips, saying so, without it.
set -u
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)}
if [ -z "$NVCC" ]; then echo "SKIP (no GPU toolkit) test_ptx_targets: no nvcc to compile the PTX with"; exit 0; fi
PTXAS=$(dirname "$NVCC")/ptxas
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

grep -q 'arch=compute_80,code=compute_80' Makefile && ok "the build embeds compute_80 PTX" ||
    bad "the Makefile's GENCODE has no compute_80 PTX"

flags=(-std=c++20 -Isrc -DDC_HAVE_CUDA)
nsrc=0 nkern=0
for f in src/backend/cuda/*.cu; do
    b=$(basename "$f" .cu)
    if ! "$NVCC" -ptx -arch=compute_80 "${flags[@]}" -o "$tmp/$b.80.ptx" "$f" 2> "$tmp/$b.log"; then
        bad "$f: no compute_80 PTX: $(head -3 "$tmp/$b.log")"; continue
    fi
    for a in sm_80 sm_86 sm_89; do
        "$PTXAS" -arch=$a -o /dev/null "$tmp/$b.80.ptx" 2> "$tmp/$b.$a.log" ||
            bad "$f: ptxas for $a: $(head -3 "$tmp/$b.$a.log")"
    done
    # the kernels of the Hopper build, each in the compute_80 PTX
    if ! "$NVCC" -ptx -arch=compute_90a "${flags[@]}" -o "$tmp/$b.90.ptx" "$f" 2> "$tmp/$b.log"; then
        bad "$f: no compute_90a PTX: $(head -3 "$tmp/$b.log")"; continue
    fi
    grep -o '^\.visible \.entry [A-Za-z0-9_]*\|^\.entry [A-Za-z0-9_]*' "$tmp/$b.90.ptx" | awk '{print $NF}' | sort -u > "$tmp/$b.90.k"
    grep -o '^\.visible \.entry [A-Za-z0-9_]*\|^\.entry [A-Za-z0-9_]*' "$tmp/$b.80.ptx" | awk '{print $NF}' | sort -u > "$tmp/$b.80.k"
    missing=$(comm -23 "$tmp/$b.90.k" "$tmp/$b.80.k")
    [ -z "$missing" ] || bad "$f: kernels of the sm_90a build missing from the compute_80 PTX: $missing"
    nsrc=$((nsrc + 1)) nkern=$((nkern + $(wc -l < "$tmp/$b.80.k")))
done
[ "$nkern" -gt 100 ] && ok "$nsrc sources, $nkern kernels: compute_80 PTX assembles for sm_80, sm_86 and sm_89, and holds every kernel of the sm_90a build" ||
    bad "only $nkern kernels found in $nsrc sources"
[ $fail = 0 ] && echo "all passed"
exit $fail
