#!/usr/bin/env bash
# Runs every test program and shell test; prints a summary; non-zero on failure.
cd "$(dirname "$0")/.."
fail=0; passed=0; failed=()
run() {
  local name=$1; shift
  local t0=$SECONDS
  if "$@" > "build/tests/$name.log" 2>&1; then
    passed=$((passed + 1)); echo "PASS $name ($((SECONDS - t0)) s)"
    grep -h "^SKIP" "build/tests/$name.log" | sed 's/^/     /'
  else
    fail=1; failed+=("$name"); echo "FAIL $name ($((SECONDS - t0)) s)"; tail -n 30 "build/tests/$name.log"
  fi
}
mkdir -p build/tests
for t in build/tests/test_*; do
  [ -x "$t" ] && [ -f "$t" ] || continue
  case "$t" in *.log|*.d) continue;; esac
  run "$(basename "$t")" "$t"
done
for t in tests/test_*.sh; do
  [ -f "$t" ] && run "$(basename "$t" .sh)" bash "$t"
done
echo "$passed passed, ${#failed[@]} failed${failed:+: ${failed[*]}}"
exit $fail
