#!/usr/bin/env bash
# Runs every fuzz harness for FUZZ_SECONDS each, starting from small valid
# seeds, and reports what each found; non-zero if any crashed, leaked, hung
# or broke an invariant. Called by `make fuzz` (which builds the harnesses):
#   FUZZ_DIR     where the harnesses and make_seeds are (build/fuzz)
#   CORPUS       corpus root, one folder per harness (build/fuzz_corpus); what
#                libFuzzer finds interesting is kept there for the next run
#   FUZZ_SECONDS time per harness (60)
# A failing input is saved as $FUZZ_DIR/crashes/<harness>-crash-<sha1> (or
# -oom-, -timeout-, -leak-); the harness run on that file alone reproduces it.
# Once the reader is fixed, copy it to tests/fuzz/crashes/<harness>-<what it
# does>, where every later run tries it first.
set -uo pipefail
cd "$(dirname "$0")/../.."
FUZZ_DIR=${FUZZ_DIR:-build/fuzz}
CORPUS=${CORPUS:-build/fuzz_corpus}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
mkdir -p "$CORPUS" "$FUZZ_DIR/crashes"
"$FUZZ_DIR/make_seeds" "$CORPUS" || exit 1
# what a sanitizer or libFuzzer reported: the error, the project's frames
report() {
  grep -E "ERROR|SUMMARY|runtime error|Test unit written| in [a-zA-Z_]+ .*/(src|tests)/" "$1" |
    head -n 20 | sed 's/^/     /'
}
limits=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256)
failed=()
for h in "$FUZZ_DIR"/fuzz_*; do
  [ -x "$h" ] && [ -f "$h" ] || continue
  case "$h" in *.d|*.log) continue ;; esac
  name=$(basename "$h")
  mkdir -p "$CORPUS/$name"
  log=$FUZZ_DIR/$name.log
  # Inputs that once crashed a reader (tests/fuzz/crashes/<harness>-*) run
  # first, each once: they are the regression tests of those fixes.
  regress=(tests/fuzz/crashes/"$name"-*)
  if [ -e "${regress[0]}" ] && ! "$h" "${limits[@]}" "${regress[@]}" > "$log" 2>&1; then
    failed+=("$name")
    echo "FAIL $name: an input in tests/fuzz/crashes fails again; $log ends:"
    report "$log"
    continue
  fi
  t0=$SECONDS
  # Inputs are at most a few hundred KB, so no allocation they justify comes
  # near 256 MB: one that does (a header's size taken on trust) is a finding,
  # as is an input that takes over 10 s (a hang). timeout is a backstop only.
  timeout -k 10 $((FUZZ_SECONDS + 120)) "$h" "${limits[@]}" -max_total_time="$FUZZ_SECONDS" \
    -print_final_stats=1 -artifact_prefix="$FUZZ_DIR/crashes/$name-" "$CORPUS/$name" > "$log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  if [ $rc -eq 0 ]; then
    echo "PASS $name ($((SECONDS - t0)) s, ${runs:-?} inputs, corpus $(ls "$CORPUS/$name" | wc -l))"
  else
    failed+=("$name")
    echo "FAIL $name (exit $rc after $((SECONDS - t0)) s); $log ends:"
    report "$log"
  fi
done
echo "fuzzing: ${#failed[@]} failed${failed:+: ${failed[*]}}"
[ ${#failed[@]} -eq 0 ]
