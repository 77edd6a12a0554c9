#!/usr/bin/env bash
# Checks what the build needs and prints the build's configuration, which the
# Makefile keeps in $(BUILD)/config: every object depends on that file, so
# when anything printed here changes (compiler, flags, CUDA on or off, which
# OpenBLAS, libpng, zlib, libjpeg, libwebp and libzstd headers and libraries are found) everything is
# rebuilt. Run by make with the settings in the environment:
#   DC_CC DC_CFLAGS DC_CPPFLAGS DC_LDFLAGS DC_LDLIBS  the C compiler and its flags
#   DC_CUDA DC_NVCC DC_NVFLAGS                       the CUDA backend (DC_CUDA=1)
#   DC_FUZZ=1                                        also check libFuzzer and the sanitizers
# A missing dependency stops the build before anything compiles, with the
# Debian packages that provide it: objects compiled against the wrong header
# (another BLAS's cblas.h, which lacks OpenBLAS's functions) must never link.
set -uo pipefail
cd "$(dirname "$0")/.."

CC=${DC_CC:-cc}
read -r -a cflags <<< "${DC_CFLAGS:-} ${DC_CPPFLAGS:-}"
read -r -a ldflags <<< "${DC_LDFLAGS:-}"
read -r -a ldlibs <<< "${DC_LDLIBS:-}"
hint="bash tools/deps.sh installs everything the build needs"
[ "${DC_FUZZ:-0}" = 1 ] && hint="bash tools/deps.sh --tests installs it, with clang and the sanitizer runtimes"

die() {
  echo "build: $*" >&2
  exit 1
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

read -r -a cc_cmd <<< "$CC"
command -v "${cc_cmd[0]}" > /dev/null ||
  die "no C compiler '$CC': install build-essential ($hint)"

# compile NAME 'C source': compiles a probe with the build's flags, treating an
# undeclared function as the error it is here; the compiler's message is in
# $tmp/NAME.log.
compile() {
  printf '%s\n' "$2" > "$tmp/$1.c"
  "${cc_cmd[@]}" "${cflags[@]}" -Werror=implicit-function-declaration \
    -c "$tmp/$1.c" -o "$tmp/$1.o" -MF "$tmp/$1.d" > "$tmp/$1.log" 2>&1
}

# The header that <name> resolves to with the build's flags, for messages.
header_path() {
  echo "#include <$1>" > "$tmp/which.c"
  "${cc_cmd[@]}" "${cflags[@]}" -E -H "$tmp/which.c" -o "$tmp/which.i" -MF "$tmp/which.d" 2>&1 |
    sed -n 's/^\. //p' | head -n 1
}

openblas_probe='#include <cblas.h>
int main(void) { openblas_set_num_threads(1); return openblas_get_corename() == 0; }'
if ! compile openblas "$openblas_probe"; then
  if grep -q "cblas.h" "$tmp/openblas.log" && ! grep -q "implicit" "$tmp/openblas.log"; then
    die "OpenBLAS's cblas.h is not found: install libopenblas-dev ($hint)"
  fi
  die "the cblas.h found first, $(readlink -f "$(header_path cblas.h)"), is not OpenBLAS's
  (it lacks openblas_set_num_threads): another BLAS's header, such as Debian's libblas-dev,
  is selected. Install libopenblas-dev ($hint) and make its header the one found:
  install pkg-config (the Makefile asks it for OpenBLAS's include folder), or select
  OpenBLAS as the system's BLAS (its cblas.h comes with it), on Debian:
  update-alternatives --set libblas.so-x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so"
fi
compile png '#include <png.h>
int main(void) { return png_access_version_number() == 0; }' ||
  die "libpng's png.h is not found: install libpng-dev ($hint)"
compile zlib '#include <zlib.h>
int main(void) { return zlibVersion() == 0; }' ||
  die "zlib's zlib.h is not found: install zlib1g-dev ($hint)"
compile jpeg '#include <stdio.h>
#include <jpeglib.h>
int main(void) { struct jpeg_error_mgr e; return jpeg_std_error(&e) == 0; }' ||
  die "libjpeg's jpeglib.h is not found: install libjpeg62-turbo-dev ($hint)"
compile webp '#include <webp/decode.h>
int main(void) { return WebPGetDecoderVersion() == 0; }' ||
  die "libwebp's webp/decode.h is not found: install libwebp-dev ($hint)"
compile zstd '#include <zstd.h>
int main(void) { return ZSTD_versionNumber() == 0; }' ||
  die "libzstd's zstd.h is not found: install libzstd-dev ($hint)"
compile omp '#include <omp.h>
int main(void) { return omp_get_max_threads() < 1; }' ||
  die "OpenMP (omp.h, -fopenmp) does not work with '$CC': $(head -n 3 "$tmp/omp.log")"

# The CUDA backend's libraries, each on its own so that a missing one is named:
# cuDNN (the convolutions) is installed apart from the toolkit on many machines.
if [ "${DC_CUDA:-0}" = 1 ]; then
  libdirs=()
  for f in "${ldlibs[@]}"; do [[ $f == -L* ]] && libdirs+=("$f"); done
  echo 'int main(void) { return 0; }' > "$tmp/cudalibs.c"
  for lib in cudart cublasLt cudnn; do
    "${cc_cmd[@]}" "$tmp/cudalibs.c" -o "$tmp/cudalibs" "${ldflags[@]}" "${libdirs[@]}" "-l$lib" \
      > "$tmp/cudalibs.log" 2>&1 && continue
    [ "$lib" = cudnn ] && die "cuDNN's library (libcudnn.so) is not found (searched: ${libdirs[*]:-the default paths}):
  the CUDA backend runs its convolutions on it. Install cuDNN 9 for this CUDA (NVIDIA's
  cudnn9-cuda-<version> package, or its archive unpacked into the toolkit), or build with CUDA=0"
    die "the CUDA toolkit's lib$lib.so is not found (searched: ${libdirs[*]:-the default paths}):
  install the CUDA toolkit, or build with CUDA=0"
  done
fi

# One program using all of them, linked as the engine is; the linker's trace
# names the library files it took.
main='#include <stdio.h>
#include <cblas.h>
#include <jpeglib.h>
#include <omp.h>
#include <png.h>
#include <webp/decode.h>
#include <zlib.h>
#include <zstd.h>
int main(void) {
    struct jpeg_error_mgr e;
    openblas_set_num_threads(1);
    return !openblas_get_corename() + !png_access_version_number() + !zlibVersion() + !omp_get_max_threads() +
           !jpeg_std_error(&e) + !WebPGetDecoderVersion() + !ZSTD_versionNumber();
}'
fuzz_flags=()
if [ "${DC_FUZZ:-0}" = 1 ]; then
  # a libFuzzer harness: the fuzzer runtime brings main()
  main="${main/int main(void)/static int probe(void)}
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { (void)data; return size > 1u << 30 ? probe() : 0; }"
  fuzz_flags=(-fsanitize=fuzzer)
fi
compile all "$main" || die "the probe program does not compile: $(head -n 5 "$tmp/all.log")"
if ! "${cc_cmd[@]}" "${cflags[@]}" "${fuzz_flags[@]}" "$tmp/all.o" -o "$tmp/all" "${ldflags[@]}" \
    "${ldlibs[@]}" -Wl,--trace > "$tmp/link.log" 2>&1; then
  need="libopenblas-dev libpng-dev zlib1g-dev libjpeg62-turbo-dev libwebp-dev libzstd-dev"
  [ "${DC_FUZZ:-0}" = 1 ] && need="clang-14 libclang-rt-14-dev libomp-14-dev (libFuzzer, the sanitizers, OpenMP)"
  die "linking with ${ldlibs[*]} fails: install $need ($hint).
$(grep -i "error\|cannot\|undefined" "$tmp/link.log" | head -n 5)"
fi

echo "# Written by tools/build_config.sh: when this changes, everything is rebuilt."
echo "CC=$CC"
echo "cc_version=$("${cc_cmd[@]}" --version 2>&1 | head -n 1)"
echo "CFLAGS=${DC_CFLAGS:-}"
echo "CPPFLAGS=${DC_CPPFLAGS:-}"
echo "LDFLAGS=${DC_LDFLAGS:-}"
echo "LDLIBS=${DC_LDLIBS:-}"
# The dependencies' headers (resolved through links such as Debian's
# alternatives; the C library's own are left out) and the libraries the link took.
sed -e 's/\\$//' -e 's/^[^:]*://' "$tmp/all.d" | tr ' ' '\n' | grep '^/' | grep -v "^$tmp/" |
  grep -v '/\(bits\|sys\|gnu\|linux\|asm\|asm-generic\)/' | sort -u |
  while read -r f; do echo "header=$(readlink -f "$f")"; done
grep -o '/[^ ()]*\.\(so[.0-9]*\|a\)\b' "$tmp/link.log" | sort -u |
  while read -r f; do echo "library=$(readlink -f "$f")"; done
if [ "${DC_CUDA:-0}" = 1 ]; then
  [ -n "${DC_NVCC:-}" ] && [ -x "${DC_NVCC}" ] || command -v "${DC_NVCC:-nvcc}" > /dev/null ||
    die "CUDA=1 but nvcc ('${DC_NVCC:-}') is not found: install the CUDA toolkit, or build with CUDA=0"
  echo "CUDA=1"
  echo "NVCC=$(readlink -f "$(command -v "$DC_NVCC")")"
  echo "nvcc_version=$("$DC_NVCC" --version 2>&1 | grep -i release)"
  echo "NVFLAGS=${DC_NVFLAGS:-}"
else
  echo "CUDA=0"
fi
