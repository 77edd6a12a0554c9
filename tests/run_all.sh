#!/usr/bin/env bash
# Runs every test program and shell test; prints a summary; non-zero on failure.
# BUILD (default build) is where make put the test programs, BIN (default
# ./diffusion) the program the shell tests run.
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=${BIN:-./diffusion}
case "$BIN" in */*) ;; *) BIN=./$BIN ;; esac  # make's "diffusion" is a path, not a command
export BUILD BIN
logs=$BUILD/tests
fail=0; passed=0; failed=()
run() {
  local name=$1; shift
  local t0=$SECONDS
  if "$@" > "$logs/$name.log" 2>&1; then
    passed=$((passed + 1)); echo "PASS $name ($((SECONDS - t0)) s)"
    grep -hi "^SKIP" "$logs/$name.log" | sed 's/^/     /'
  else
    fail=1; failed+=("$name"); echo "FAIL $name ($((SECONDS - t0)) s)"; tail -n 30 "$logs/$name.log"
  fi
}
mkdir -p "$logs"
for t in "$logs"/test_*; do
  [ -x "$t" ] && [ -f "$t" ] || continue
  case "$t" in *.log|*.d) continue;; esac
  run "$(basename "$t")" "$t"
done
for t in tests/test_*.sh; do
  [ -f "$t" ] && run "$(basename "$t" .sh)" bash "$t"
done
echo "$passed passed, ${#failed[@]} failed${failed:+: ${failed[*]}}"
exit $fail
