#!/usr/bin/env bash
# Builds make targets (default: the diffusion program) so that a newcomer sees
# what is happening: a line saying what is built, then one short line per
# file compiled, per library archived and per program linked, compiler
# warnings and errors in full, and the time it took. The full commands go to
# $BUILD/build.log (BUILD default build); on a failure the end of it is shown.
# tools/demo.sh builds through it.
#   tools/build.sh [TARGET...]     MAKE: the make to run (default make)
set -euo pipefail
cd "$(dirname "$0")/.."
log=${BUILD:-build}/build.log
mkdir -p "$(dirname "$log")"
targets=("${@:-diffusion}")
echo "build: ${targets[*]}, $(nproc) jobs at once (each command in full: $log)"
t0=$SECONDS
# A command line becomes "compiling FILE", "archiving LIB" or "linking PROGRAM";
# anything else (make's own words, warnings, errors) is printed as it is.
short() {
  awk '
    / -c [^ ]+\.(c|cu) / { for (i = 1; i < NF; i++) if ($i == "-c") { print "  compiling " $(i + 1); break }; next }
    /^ar rcs / { print "  archiving " $3; next }
    / -o [^ ]+/ && /^[^ ]*(cc|gcc|clang[^ ]*|nvcc|c\+\+|g\+\+) / {
      for (i = 1; i < NF; i++) if ($i == "-o") { print "  linking " $(i + 1); break }; next }
    { print; fflush() }
  '
}
if ! "${MAKE:-make}" -j"$(nproc)" "${targets[@]}" 2>&1 | tee "$log" | short; then
  echo "build: failed; the end of $log:" >&2
  tail -n 25 "$log" >&2
  exit 1
fi
echo "build: done in $((SECONDS - t0)) s"
