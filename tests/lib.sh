# Shared helpers of the shell tests.
set -u
BIN=${BIN:-./diffusion}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
FAILS=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }
# A tiny model and recipe so shell tests run in seconds.
TINY=(--input-size 32 --depth 2 --hidden 32 --heads 2 --patch 8 --batch 8 --micro-batch 4 --threads 2)
finish() { [ "$FAILS" -eq 0 ] && echo "all passed" && exit 0; echo "$FAILS failed"; exit 1; }
# expect_fail "what" "message part" cmd...: the command must exit non-zero and
# print the message part on stderr.
expect_fail() {
  local what=$1 msg=$2; shift 2
  local err
  if err=$("$@" 2>&1 >/dev/null); then fail "$what: exited 0"; return; fi
  if [[ "$err" != *"$msg"* ]]; then fail "$what: message '$err' lacks '$msg'"; return; fi
  pass "$what"
}
# st_data FILE: the data buffer of a safetensors file (everything after the header)
st_data() { local h; h=$(od -An -t u8 -N8 "$1" | tr -d ' '); tail -c +$((9 + h)) "$1"; }
