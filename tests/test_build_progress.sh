#!/usr/bin/env bash
# tools/build.sh, the demo's build: what it prints while make runs (a line
# per file compiled, library archived and program linked; warnings and errors
# in full), the full commands in its log, and a failed build shown and
# passed on. A stand-in make replays a build's output, so nothing compiles.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cat > "$TMP/make" << 'MAKE'
#!/usr/bin/env bash
echo "cc -I/usr/include -O3 -std=c11 -Isrc -MD -MP -c src/core/dtype.c -o build/src/core/dtype.o"
echo "src/core/dtype.c:3:5: warning: unused variable 'x' [-Wunused-variable]"
echo "/usr/local/cuda/bin/nvcc -O3 -std=c++20 -Isrc -c src/backend/cuda/cuda_norm.cu -o build/src/backend/cuda/cuda_norm.o"
echo "ar rcs build/libdiffusion.a build/src/core/dtype.o"
echo "cc -O3 -std=c11 build/src/cli/main.o build/libdiffusion.a -o diffusion -lopenblas -lpng -lz -lm -fopenmp"
[ "${FAKE_FAIL:-0}" = 1 ] && { echo "src/cli/main.c:9:1: error: expected ';'"; echo "make: *** [Makefile:95: build/src/cli/main.o] Error 1"; exit 2; }
exit 0
MAKE
chmod +x "$TMP/make"
out=$(cd "$ROOT" && MAKE="$TMP/make" BUILD="$TMP/b" bash tools/build.sh diffusion 2>&1); rc=$?
want="  compiling src/core/dtype.c
src/core/dtype.c:3:5: warning: unused variable 'x' [-Wunused-variable]
  compiling src/backend/cuda/cuda_norm.cu
  archiving build/libdiffusion.a
  linking diffusion"
[[ $rc -eq 0 && "$out" == "build: diffusion, "*" jobs at once"*"$want"*"build: done in "* ]] \
  && pass "a line per step, warnings in full, the time taken" || fail "build output: '$out'"
grep -q -- "-c src/core/dtype.c -o build/src/core/dtype.o" "$TMP/b/build.log" && pass "the full commands in the log" \
  || fail "log: $(cat "$TMP/b/build.log")"
out=$(cd "$ROOT" && FAKE_FAIL=1 MAKE="$TMP/make" BUILD="$TMP/b" bash tools/build.sh diffusion 2>&1); rc=$?
[[ $rc -eq 1 && "$out" == *"expected ';'"* && "$out" == *"build: failed; the end of $TMP/b/build.log"* ]] \
  && pass "a failed build: its error shown, a non-zero exit" || fail "failed build: exit $rc: '$out'"
grep -q "bash tools/build.sh diffusion" "$ROOT/tools/demo.sh" && pass "the demo builds through tools/build.sh" \
  || fail "tools/demo.sh does not use tools/build.sh"
finish
