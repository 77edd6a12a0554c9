#!/usr/bin/env bash
# The test runner (tests/run_all.sh) on made-up tests: its summary counts and
# names the skips, and a test that skips without a reason it knows (no GPU,
# no python3..., privileges...) fails, as does one that skips with none.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mk() { printf '%s\n' "$2" > "$TMP/$1.sh"; }
mk t_plain 'echo "ok   a check"'
mk t_gpu 'echo "SKIP (no GPU) t_gpu: this build has no CUDA backend"'
mk t_py 'echo "ok   one"; echo "SKIP (no python3-torch) interop"; echo "  SKIP (privileges: root without mknod) devices"'
mk t_file 'echo "SKIP (no data) the vocabulary is not there"'
mk t_bare 'echo "skip: the manifest is absent"'
mk t_fails 'echo "FAIL x"; exit 1'
run_all() { BUILD="$TMP/build" bash "$ROOT/tests/run_all.sh" "$@" 2>&1; }

out=$(run_all "$TMP/t_plain.sh" "$TMP/t_gpu.sh" "$TMP/t_py.sh"); rc=$?
[ $rc -eq 0 ] && pass "allowed skips pass (exit 0)" || fail "allowed skips: exit $rc: $out"
[[ "$out" == *"3 passed, 0 failed, 3 skipped: t_gpu (no GPU), t_py (no python3-torch), t_py (privileges: root without mknod)"* ]] \
  && pass "the summary counts and names the skips" || fail "summary: '$out'"
[[ "$out" == *"     SKIP (no python3-torch) interop"* ]] && pass "each skip is listed under its test" || fail "listing: '$out'"
out=$(run_all "$TMP/t_plain.sh" "$TMP/t_file.sh"); rc=$?
[[ $rc -eq 1 && "$out" == *"FAIL t_file"* && "$out" == *"1 passed, 1 failed (t_file), 0 skipped"* ]] \
  && pass "a skip for a reason outside the classes fails its test" || fail "unknown reason: exit $rc: '$out'"
out=$(run_all "$TMP/t_bare.sh"); rc=$?
[[ $rc -eq 1 && "$out" == *"FAIL t_bare"* && "$out" == *"a skip needs a reason"* ]] \
  && pass "a skip without a reason fails its test" || fail "no reason: exit $rc: '$out'"
out=$(run_all "$TMP/t_fails.sh"); rc=$?
[[ $rc -eq 1 && "$out" == *"0 passed, 1 failed (t_fails), 0 skipped"* ]] && pass "a failing test fails the run" \
  || fail "failure: exit $rc: '$out'"
finish
