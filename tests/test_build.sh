#!/usr/bin/env bash
# The build's guards: it refuses to compile against a cblas.h that is not
# OpenBLAS's (objects built that way once linked into a program that crashed),
# and a change of configuration (flags, CUDA on or off, nvcc or a library
# appearing, a header resolving elsewhere) rebuilds the objects instead of
# linking stale ones. Builds two small objects in a scratch build folder.
# Also: `make demo` builds nothing before tools/demo.sh installs what it needs.
cd "$(dirname "$0")/.."
source tests/lib.sh

B=$TMP/build
objs=("$B/src/core/error.o" "$B/src/backend/cpu/cpu_linear.o")
# build [make settings...]: builds the objects; make's output (the commands
# it ran, the messages) is in $TMP/make.log
# (without the settings of a make this test may run under, such as make test's)
build() {
  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory CUDA=0 OPT=-O0 BUILD="$B" "$@" \
    "${objs[@]}" > "$TMP/make.log" 2>&1
}
# rebuilt: whether the last build compiled both objects again
rebuilt() { grep -q -- "-c src/core/error.c" "$TMP/make.log" && grep -q -- "-c src/backend/cpu/cpu_linear.c" "$TMP/make.log"; }

# headers standing in for the ones a machine may select: OpenBLAS's own (two
# copies, as after an alternatives switch) and a reference BLAS's, which has
# the cblas_ functions but not OpenBLAS's extensions
openblas_h=$(readlink -f "$(echo '#include <cblas.h>' | ${CC:-cc} -E -H -x c - ${BLAS_CFLAGS:-$(pkg-config --cflags openblas 2>/dev/null)} \
  -o /dev/null 2>&1 | sed -n 's/^\. //p' | head -n 1)")
mkdir -p "$TMP/blas1" "$TMP/blas2" "$TMP/ref"
for d in blas1 blas2; do
  cp "$(dirname "$openblas_h")"/*.h "$TMP/$d/"
done
if [ -f /usr/include/x86_64-linux-gnu/cblas-netlib.h ]; then
  cp /usr/include/x86_64-linux-gnu/cblas-netlib.h "$TMP/ref/cblas.h"  # Debian's libblas-dev
else
  cat > "$TMP/ref/cblas.h" <<'EOF'
/* A reference BLAS's cblas.h: the standard interface only. */
enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };
void cblas_sgemm(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, int, int, int,
                 float, const float *, int, const float *, int, float, float *, int);
EOF
fi

# Another BLAS's header first on the include path: refused before compiling.
if build CPPFLAGS="-I$TMP/ref"; then
  fail "a cblas.h without OpenBLAS's functions was accepted"
elif ! grep -q "is not OpenBLAS's" "$TMP/make.log" || ! grep -q "libopenblas-dev" "$TMP/make.log"; then
  fail "another BLAS's cblas.h: the message lacks the cause or the package: $(cat "$TMP/make.log")"
elif ls "${objs[@]}" > /dev/null 2>&1 || grep -q -- " -c " "$TMP/make.log"; then
  fail "another BLAS's cblas.h: objects were compiled"
else
  pass "refuses another BLAS's cblas.h, naming libopenblas-dev, before compiling"
fi

build CPPFLAGS="-I$TMP/blas1" && rebuilt && pass "builds with OpenBLAS's header" ||
  fail "build with OpenBLAS's header: $(cat "$TMP/make.log")"
build CPPFLAGS="-I$TMP/blas1" && ! grep -q -- " -c " "$TMP/make.log" &&
  pass "an unchanged configuration rebuilds nothing" || fail "unchanged configuration: $(cat "$TMP/make.log")"

# The same header name resolving to another file (an alternatives switch, a
# library installed or upgraded) rebuilds.
build CPPFLAGS="-I$TMP/blas2" && rebuilt && pass "cblas.h found elsewhere rebuilds" ||
  fail "cblas.h found elsewhere did not rebuild: $(cat "$TMP/make.log")"
grep -q "^header=$(readlink -f "$TMP/blas2/cblas.h")$" "$B/config" &&
  pass "the configuration records the cblas.h used" || fail "config lacks $TMP/blas2/cblas.h"

build CPPFLAGS="-I$TMP/blas2" OPT=-O1 && rebuilt && pass "changed flags rebuild" ||
  fail "changed flags did not rebuild: $(cat "$TMP/make.log")"

# nvcc appearing turns the CUDA backend on: the C objects (built with
# DC_HAVE_CUDA from then on) are rebuilt. A stand-in toolkit is enough, as
# only C objects are asked for: an nvcc that tells its version, and empty
# libraries for the configuration's link check.
mkdir -p "$TMP/cuda/bin" "$TMP/cuda/lib64"
printf '#!/bin/sh\necho "Cuda compilation tools, release 99.9"\n' > "$TMP/cuda/bin/nvcc"
chmod +x "$TMP/cuda/bin/nvcc"
for l in cudart cublasLt cudnn; do ${CC:-cc} -shared -o "$TMP/cuda/lib64/lib$l.so" -x c /dev/null; done
build CPPFLAGS="-I$TMP/blas2" OPT=-O1 NVCC="$TMP/cuda/bin/nvcc" CUDA=1 && rebuilt &&
  grep -q -- "-DDC_HAVE_CUDA -c src/core/error.c" "$TMP/make.log" &&
  pass "nvcc appearing (CUDA on) rebuilds" || fail "CUDA on did not rebuild: $(cat "$TMP/make.log")"
build CPPFLAGS="-I$TMP/blas2" OPT=-O1 && rebuilt && ! grep -q DC_HAVE_CUDA "$TMP/make.log" &&
  pass "CUDA off again rebuilds" || fail "CUDA off did not rebuild: $(cat "$TMP/make.log")"

# Undeclared functions are errors, not warnings.
grep -q -- "-Werror=implicit-function-declaration" "$B/config" &&
  printf '#include "core/error.h"\nint f(void) { return undeclared_fn(); }\n' > "$TMP/undeclared.c" &&
  ! ${CC:-cc} $(sed -n 's/^CFLAGS=//p' "$B/config") -c "$TMP/undeclared.c" -o "$TMP/undeclared.o" 2> /dev/null &&
  pass "the build's flags make an undeclared function an error" ||
  fail "an undeclared function compiles with the build's flags"
# The first commands: `make demo` leaves building to tools/demo.sh, which
# installs the dependencies first (it once compiled before they were there).
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -n --no-print-directory BUILD="$TMP/none" BIN="$TMP/none/diffusion" demo \
  > "$TMP/demo.n" 2>&1
[ "$(cat "$TMP/demo.n")" = "bash tools/demo.sh" ] && pass "make demo runs tools/demo.sh and builds nothing itself" ||
  fail "make demo would run: $(cat "$TMP/demo.n")"
finish
