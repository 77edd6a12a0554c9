#!/usr/bin/env bash
# Runs every test program and shell test; prints a summary that counts and
# names what was skipped; non-zero on failure.
# BUILD (default build) is where make put the test programs, BIN (default
# ./diffusion) the program the shell tests run. Arguments, when given, are the
# tests to run instead of all (programs, or .sh scripts).
#
# A test may skip a part it cannot run here, with a line
#   SKIP (REASON) what was not checked
# and REASON one of the classes below. Every part of the suite that needs
# neither a GPU nor Python runs everywhere (the files it reads ship with the
# repository; the Debian packages it needs are tools/deps.sh's), so a skip
# line for anything else, or without a reason, fails its test.
#   no GPU...          no CUDA backend in this build, no GPU, or a GPU without a feature
#   no python3...      python3 or one of its packages (python3-torch, -numpy) missing
#   privileges...      a check of permissions that this user cannot set up (root
#                      without a private mount namespace, mknod refused)
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=${BIN:-./diffusion}
case "$BIN" in */*) ;; *) BIN=./$BIN ;; esac  # make's "diffusion" is a path, not a command
export BUILD BIN
logs=$BUILD/tests
fail=0; passed=0; failed=(); skipped=()
# skips LOG: the log's skip lines, as REASON, a 0x1f byte, WHAT (REASON empty
# when the line gives none)
skips() {
  sed -nE 's/^[[:space:]]*[Ss][Kk][Ii][Pp]([[:space:]:]+|$)(.*)$/\2/p' "$1" |
    sed -E 's/^\(([^)]*)\)[[:space:]]*(.*)$/\1\x1f\2/; t; s/^/\x1f/'
}
allowed() { case "$1" in "no GPU"* | "no python3"* | privileges*) return 0 ;; esac; return 1; }
run() {
  local name=$1; shift
  local t0=$SECONDS ok=1 bad=() reason what
  "$@" > "$logs/$name.log" 2>&1 || ok=0
  while IFS=$'\x1f' read -r reason what; do
    if allowed "$reason"; then skipped+=("$name ($reason)")
    else bad+=("skipped ${reason:+($reason) }${what:-without saying what}: a skip needs a reason (no GPU, no python3..., privileges...)"); fi
  done < <(skips "$logs/$name.log")
  [ ${#bad[@]} -gt 0 ] && ok=0
  if [ $ok = 1 ]; then
    passed=$((passed + 1)); echo "PASS $name ($((SECONDS - t0)) s)"
    skips "$logs/$name.log" | sed -E 's/^([^\x1f]*)\x1f(.*)$/     SKIP (\1) \2/'
  else
    fail=1; failed+=("$name"); echo "FAIL $name ($((SECONDS - t0)) s)"; tail -n 30 "$logs/$name.log"
    local b; for b in "${bad[@]}"; do echo "     $b"; done
  fi
}
mkdir -p "$logs"
if [ $# -gt 0 ]; then
  for t in "$@"; do
    case "$t" in *.sh) run "$(basename "$t" .sh)" bash "$t" ;; *) run "$(basename "$t")" "$t" ;; esac
  done
else
  for t in "$logs"/test_*; do
    [ -x "$t" ] && [ -f "$t" ] || continue
    case "$t" in *.log|*.d) continue;; esac
    run "$(basename "$t")" "$t"
  done
  for t in tests/test_*.sh; do
    [ -f "$t" ] && run "$(basename "$t" .sh)" bash "$t"
  done
fi
summary="$passed passed, ${#failed[@]} failed${failed:+ (${failed[*]})}, ${#skipped[@]} skipped"
for i in "${!skipped[@]}"; do summary+="$([ "$i" = 0 ] && echo ":" || echo ",") ${skipped[i]}"; done
echo "$summary"
exit $fail
