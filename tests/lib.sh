# Shared helpers of the shell tests.
set -u
BIN=${BIN:-./diffusion}
[[ "$BIN" == */* ]] && BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")  # tests may cd
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# The engine's caches (the model hashes of txt2img) go here, not into the user's home.
export XDG_CACHE_HOME=$TMP/cache
FAILS=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }
# A tiny model and recipe so shell tests run in seconds.
TINY=(--input-size 32 --depth 2 --hidden 32 --heads 2 --patch 8 --batch 8 --micro-batch 4 --threads 2)
finish() { [ "$FAILS" -eq 0 ] && echo "all passed" && exit 0; echo "$FAILS failed"; exit 1; }
# diffusion ARGS...: the binary under test, bounded in time (a run that hangs
# fails the test instead of stalling the suite; on the limit it gets SIGTERM,
# which makes training write a checkpoint and stop, then SIGKILL 10 s later).
RUN_LIMIT=${RUN_LIMIT:-120}
diffusion() { timeout -k 10 "$RUN_LIMIT" "$BIN" "$@"; }
# expect_fail "what" "message part" cmd...: the command must exit non-zero and
# print the message part on stderr.
expect_fail() {
  local what=$1 msg=$2; shift 2
  local err
  if err=$("$@" 2>&1 >/dev/null); then fail "$what: exited 0"; return; fi
  if [[ "$err" != *"$msg"* ]]; then fail "$what: message '$err' lacks '$msg'"; return; fi
  pass "$what"
}
# expect_code CODE "what" cmd...: the command must exit with status CODE.
expect_code() {
  local code=$1 what=$2; shift 2
  "$@" > /dev/null 2>&1
  local rc=$?
  if [ "$rc" -eq "$code" ]; then pass "$what (exit $code)"; else fail "$what: exit $rc, expected $code"; fi
}
# wait_for FILE REGEX SECONDS [PID]: 0 once a line of FILE matches; 1 when the
# time is up or process PID has ended.
wait_for() {
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    grep -qE "$2" "$1" 2> /dev/null && return 0
    [ -n "${4:-}" ] && ! kill -0 "$4" 2> /dev/null && return 1
    sleep 0.1
  done
  return 1
}
# st_data FILE: the data buffer of a safetensors file (everything after the header)
# children_of PID: the processes whose parent is PID, oldest first (read from
# /proc: a minimal Debian has no pgrep)
children_of() {
  local s pid comm state ppid
  for s in /proc/[0-9]*/stat; do
    read -r pid comm state ppid _ < "$s" 2> /dev/null && [ "$ppid" = "$1" ] && echo "$pid"
  done | sort -n
}
st_data() { local h; h=$(od -An -t u8 -N8 "$1" | tr -d ' '); tail -c +$((9 + h)) "$1"; }
# st_file PATH JSON_HEADER DATA_BYTES: a safetensors file with zero-filled data
st_file() {
  local path=$1 header=$2 nbytes=$3
  while [ $(( ${#header} % 8 )) -ne 0 ]; do header="$header "; done
  { printf "$(printf '\\x%02x' $(( ${#header} & 255 )) $(( (${#header} >> 8) & 255 )) 0 0 0 0 0 0)"
    printf '%s' "$header"; head -c "$nbytes" /dev/zero; } > "$path"
}
# st_poke FILE OFFSET BYTES: writes printf-escaped BYTES at OFFSET of FILE's data buffer.
st_poke() {
  local h; h=$(od -An -t u8 -N8 "$1" | tr -d ' ')
  printf "$3" | dd of="$1" bs=1 seek=$((8 + h + $2)) conv=notrunc 2> /dev/null
}
# small_data PATH: 64 random 1x32x32 images in 10 classes, a data set that
# loads in no time (for tests where what is learnt does not matter)
small_data() {
  local hdr='{"images":{"dtype":"U8","shape":[64,1,32,32],"data_offsets":[0,65536]},"labels":{"dtype":"U8","shape":[64],"data_offsets":[65536,65600]}}'
  st_file "$1" "$hdr" 0
  head -c 65536 /dev/urandom >> "$1"
  local i; for ((i = 0; i < 64; i++)); do printf "\\x0$((i % 10))"; done >> "$1"
}
# png_parameters FILE: the text of FILE's tEXt chunk "parameters" (AUTOMATIC1111's
# generation parameters), read from the bytes with standard tools: the chunk's
# 4-byte big-endian length, "tEXt", "parameters", a NUL, then the text.
png_parameters() {
  local at len
  at=$(LC_ALL=C grep -obUa 'tEXtparameters' "$1" | head -n 1 | cut -d: -f1)
  [ -n "$at" ] || return 1
  len=$(od -An -tu1 -j $((at - 4)) -N4 "$1" | awk '{ print (($1 * 256 + $2) * 256 + $3) * 256 + $4 }')
  tail -c +$((at + 16)) "$1" | head -c $((len - 11))
}
# refuse_input WHAT FILE MSG cmd...: the command must fail with MSG on stderr,
# before any work (no "loading", "sampling", "training" or "step" line), and
# leave FILE (the input it was asked to overwrite) as it was.
refuse_input() {
  local what=$1 file=$2 msg=$3 sum err rc
  shift 3
  sum=$(md5sum < "$file")
  err=$("$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -eq 0 ]; then fail "$what: exited 0"
  elif [[ "$err" != *"$msg"* ]]; then fail "$what: message '$err' lacks '$msg'"
  elif [[ "$err" =~ (loading|sampling|training|step\ ) ]]; then fail "$what: refused only after work began: '$err'"
  elif [ "$(md5sum < "$file")" != "$sum" ]; then fail "$what: $file changed"
  else pass "$what"; fi
}

# train_run NAME ARGS...: a training run that must succeed (its log in $TMP/NAME.log).
train_run() {
  local name=$1; shift
  diffusion train "$@" > "$TMP/$name.log" 2>&1 || { cat "$TMP/$name.log"; fail "$name"; finish; }
}

# resume_across WAY STRAIGHT ARGS...: two runs of ARGS to step 2, one plain
# and one with the flag WAY, each resumed to step 4 the other way, must end
# byte-identical to STRAIGHT (the checkpoint of an uninterrupted run).
resume_across() {
  local way=$1 straight=$2 d; shift 2
  train_run half_plain "$@" --out "$TMP/half_plain" --steps 2
  train_run half_way "$@" --out "$TMP/half_way" --steps 2 "$way"
  train_run plain_to_way --resume "$TMP/half_plain" --steps 4 --threads 2 "$way"
  train_run way_to_plain --resume "$TMP/half_way" --steps 4 --threads 2
  for d in half_plain half_way; do
    if cmp -s "$straight" "$TMP/$d/step_0000004.safetensors"; then
      pass "resumed across ($d, $way) ends byte-identical to the straight run"
    else
      fail "resumed across ($d, $way) differs from the straight run"
    fi
  done
}
