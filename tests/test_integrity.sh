#!/usr/bin/env bash
# File integrity end to end: bit flips in a checkpoint's data and edits of its
# metadata are refused by info, sample, export and resume; --no-verify loads
# them anyway; exports carry checksums too; files without checksums (official
# ones) still load while our own stripped of them do not; NaN moments are
# named; a changed data set stops a resume unless --allow-data-change; FIFOs
# and devices are neither waited on nor replaced.
source "$(dirname "$0")/lib.sh"
FLAGS=(--depth 2 --hidden 32 --heads 2 --patch 4 --batch 8 --micro-batch 4 --threads 2 --device cpu --lr 0.001)
SAMPLE=(--steps 1 --per-class 1 --threads 2 --device cpu)

# hdr_len FILE: the JSON header's length; data0 FILE: where the data buffer starts
hdr_len() { od -An -t u8 -N8 "$1" | tr -d ' '; }
data0() { echo $((8 + $(hdr_len "$1"))); }
# flip_bit FILE OFFSET BIT
flip_bit() {
  local b; b=$(od -An -t u1 -j "$2" -N1 "$1" | tr -d ' ')
  printf "$(printf '\\x%02x' $(( b ^ (1 << $3) )))" | dd of="$1" bs=1 seek="$2" count=1 conv=notrunc 2>/dev/null
}
# put_bytes FILE OFFSET '\xHH...'
put_bytes() { printf "$3" | dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null; }
# tensor_begin FILE NAME: the tensor's first data byte, as a file offset
tensor_begin() {
  local b; b=$(head -c "$(data0 "$1")" "$1" | grep -ao "\"$2\":{[^}]*}" | sed 's/.*data_offsets":\[\([0-9]*\),.*/\1/')
  echo $(( $(data0 "$1") + b ))
}
# edit FILE OLD NEW: replaces a header string by one of the same length
edit() { LC_ALL=C sed -i "s/$2/$3/" "$1"; }

# A data set of 16 grey 16x16 images in 4 classes, in safetensors.
make_data() {
  local h='{"images":{"dtype":"U8","shape":[16,1,16,16],"data_offsets":[0,4096]},'
  h+='"labels":{"dtype":"U8","shape":[16],"data_offsets":[4096,4112]}}'
  while [ $(( ${#h} % 8 )) -ne 0 ]; do h="$h "; done
  { printf "$(printf '\\x%02x' $(( ${#h} & 255 )) $(( ${#h} >> 8 )) 0 0 0 0 0 0)"; printf '%s' "$h"
    head -c 4096 /dev/zero | tr '\0' '\200'; printf '\0\1\2\3%.0s' 1 2 3 4; } > "$1"
}
make_data "$TMP/data.safetensors"
$BIN train "${FLAGS[@]}" --data "$TMP/data.safetensors" --steps 2 --ckpt-every 1 --out "$TMP/run" \
  > "$TMP/train.log" 2>&1 || { cat "$TMP/train.log"; fail "tiny training run"; finish; }
ck="$TMP/run/step_0000002.safetensors"
$BIN info "$ck" > /dev/null 2>&1 && pass "info on an intact checkpoint" || fail "info on an intact checkpoint"
head -c "$(data0 "$ck")" "$ck" | grep -aq '"checksum.train.adam_v":"[0-9a-f]\{16\}"' \
  && pass "the checkpoint carries checksums" || fail "no checksums in the checkpoint"
size=$(stat -c %s "$ck"); d0=$(data0 "$ck"); n=$((size - d0))

# 50 random single-bit flips in the data: info refuses every one; sample and
# export (slower) the first five.
refused=0; msg_ok=0
for i in $(seq 1 50); do
  cp "$ck" "$TMP/flip.safetensors"
  off=$(( d0 + ((RANDOM << 15 | RANDOM) % n) ))
  flip_bit "$TMP/flip.safetensors" "$off" $((RANDOM % 8))
  if err=$($BIN info "$TMP/flip.safetensors" 2>&1 >/dev/null); then :; else
    refused=$((refused + 1))
    [[ "$err" == *"flip.safetensors: tensor '"*"' does not match its checksum: the file is corrupt"* ]] && msg_ok=$((msg_ok + 1))
  fi
  if [ "$i" -le 5 ]; then
    expect_fail "flip $i: sample" "does not match its checksum" $BIN sample --ckpt "$TMP/flip.safetensors" "${SAMPLE[@]}" --grid "$TMP/g.png"
    expect_fail "flip $i: export" "does not match its checksum" $BIN export --ckpt "$TMP/flip.safetensors" --out "$TMP/e.safetensors"
  fi
done
[ "$refused" -eq 50 ] && pass "info refuses 50 of 50 bit flips" || fail "info refused only $refused of 50 bit flips"
[ "$msg_ok" -eq 50 ] && pass "each message names the file and the tensor" || fail "$msg_ok of 50 messages name the tensor"

# --no-verify: the lowest bit of the first weight (one ulp) loads everywhere.
cp "$ck" "$TMP/ulp.safetensors"; flip_bit "$TMP/ulp.safetensors" "$d0" 0
expect_fail "one-ulp flip refused" "does not match its checksum" $BIN info "$TMP/ulp.safetensors"
$BIN info --no-verify "$TMP/ulp.safetensors" > /dev/null 2>&1 && pass "info --no-verify" || fail "info --no-verify"
$BIN sample --no-verify --ckpt "$TMP/ulp.safetensors" "${SAMPLE[@]}" --grid "$TMP/g.png" > /dev/null 2>&1 \
  && pass "sample --no-verify" || fail "sample --no-verify"
$BIN export --no-verify --ckpt "$TMP/ulp.safetensors" --out "$TMP/ulp_export.safetensors" > /dev/null 2>&1 \
  && pass "export --no-verify" || fail "export --no-verify"
mkdir -p "$TMP/ulp_run" && cp "$TMP/ulp.safetensors" "$TMP/ulp_run/step_0000002.safetensors"
$BIN train --resume "$TMP/ulp_run" --no-verify --steps 3 --threads 2 --device cpu > /dev/null 2>&1 \
  && pass "train --resume --no-verify" || fail "train --resume --no-verify"

# Edited metadata of the same length: refused as edited.
for e in 's/"num_heads":"2"/"num_heads":"4"/' 's/"step":"2"/"step":"7"/' 's/"lr":"0.001"/"lr":"0.009"/'; do
  cp "$ck" "$TMP/edit.safetensors"; LC_ALL=C sed -i "$e" "$TMP/edit.safetensors"
  if cmp -s "$ck" "$TMP/edit.safetensors"; then fail "edit $e did not apply"; continue; fi
  expect_fail "edited metadata ($e)" "metadata or tensor list does not match its checksum" $BIN info "$TMP/edit.safetensors"
done

# Exports carry checksums and are verified too.
$BIN export --ckpt "$ck" --out "$TMP/export.safetensors" > /dev/null 2>&1 || fail "export"
head -c "$(data0 "$TMP/export.safetensors")" "$TMP/export.safetensors" | grep -aq '"checksum.x_embedder.proj.weight"' \
  && pass "the export carries checksums" || fail "no checksums in the export"
cp "$TMP/export.safetensors" "$TMP/export_flip.safetensors"
flip_bit "$TMP/export_flip.safetensors" $(( $(data0 "$TMP/export_flip.safetensors") + 100 )) 3
expect_fail "flipped export (info)" "does not match its checksum" $BIN info "$TMP/export_flip.safetensors"
expect_fail "flipped export (sample)" "does not match its checksum" \
  $BIN sample --ckpt "$TMP/export_flip.safetensors" "${SAMPLE[@]}" --grid "$TMP/g.png"

# Without checksums: an official-style file (no metadata at all) loads; our
# checkpoint stripped of its checksums does not.
if command -v python3 > /dev/null; then
  strip() {  # strip SRC DST all|checksums
    python3 - "$@" <<'EOF'
import json, struct, sys
src, dst, what = sys.argv[1:4]
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
meta = h.pop("__metadata__", {})
meta = {} if what == "all" else {k: v for k, v in meta.items() if not k.startswith("checksum.")}
if meta: h["__metadata__"] = meta
s = json.dumps(h, separators=(",", ":")).encode()
s += b" " * (-len(s) % 8)
open(dst, "wb").write(struct.pack("<Q", len(s)) + s + b[8 + n:])
EOF
  }
  strip "$TMP/export.safetensors" "$TMP/official.safetensors" all
  $BIN info --heads 2 "$TMP/official.safetensors" > /dev/null 2>&1 && pass "a file without checksums loads (info)" \
    || fail "a file without checksums: info"
  $BIN sample --ckpt "$TMP/official.safetensors" --heads 2 "${SAMPLE[@]}" --classes 0 --grid "$TMP/g.png" > /dev/null 2>&1 \
    && pass "a file without checksums loads (sample)" || fail "a file without checksums: sample"
  strip "$ck" "$TMP/stripped.safetensors" checksums
  expect_fail "our checkpoint stripped of its checksums" "carries no checksums" $BIN info "$TMP/stripped.safetensors"
else
  echo "SKIP (no python3) checksum-free files: python3 not found"
fi

# A NaN in train.adam_v: the checksum catches it; past --no-verify, the
# loader names the tensor.
cp "$ck" "$TMP/nan_run_ck.safetensors"
put_bytes "$TMP/nan_run_ck.safetensors" $(( $(tensor_begin "$ck" train.adam_v) + 40 )) '\x00\x00\xc0\x7f'
mkdir -p "$TMP/nan_run" && mv "$TMP/nan_run_ck.safetensors" "$TMP/nan_run/step_0000002.safetensors"
expect_fail "NaN in train.adam_v" "tensor 'train.adam_v' does not match its checksum" \
  $BIN train --resume "$TMP/nan_run" --steps 3 --threads 2 --device cpu
expect_fail "NaN in train.adam_v past --no-verify" "tensor 'train.adam_v' element 10 (parameter" \
  $BIN train --resume "$TMP/nan_run" --no-verify --steps 3 --threads 2 --device cpu

# The data set changed on disk (one pixel): the resume stops, unless asked.
cp -r "$TMP/run" "$TMP/run2"
put_bytes "$TMP/data.safetensors" $(( $(data0 "$TMP/data.safetensors") + 77 )) '\x81'
expect_fail "resume on a changed data set" "changed since the checkpoint" \
  $BIN train --resume "$TMP/run" --steps 3 --threads 2 --device cpu
if $BIN train --resume "$TMP/run2" --allow-data-change --steps 3 --threads 2 --device cpu > "$TMP/allow.log" 2>&1 \
  && [ -s "$TMP/run2/step_0000003.safetensors" ]; then pass "--allow-data-change resumes"
else cat "$TMP/allow.log"; fail "--allow-data-change"; fi

# FIFOs and devices: inputs refused at once, outputs never replaced.
mkfifo "$TMP/fifo" "$TMP/fifo.safetensors"
expect_fail "info on a FIFO" "FIFO" timeout 20 $BIN info "$TMP/fifo"
expect_fail "--resume from a FIFO" "FIFO" timeout 20 $BIN train --resume "$TMP/fifo.safetensors" --device cpu
expect_fail "--data from a FIFO" "FIFO" timeout 20 $BIN train "${FLAGS[@]}" --data "$TMP/fifo.safetensors" --out "$TMP/r3"
expect_fail "export onto a FIFO" "" timeout 20 $BIN export --ckpt "$ck" --out "$TMP/fifo"
[ -p "$TMP/fifo" ] && pass "the FIFO is still a FIFO" || fail "the FIFO was replaced"
# As root a copy of /dev/null's device node stands in for it: were the check
# broken, root would replace the system's /dev/null. Another user cannot
# replace it, so /dev/null itself serves.
dev=
if mknod "$TMP/null" c 1 3 2> /dev/null; then dev=$TMP/null
elif [ "$(id -u)" -ne 0 ]; then dev=/dev/null; fi
if [ -n "$dev" ]; then
  expect_fail "export onto a device" "$dev is a device" $BIN export --ckpt "$ck" --out "$dev"
  [ -c "$dev" ] && pass "the device is still a device" || fail "the device was replaced by a file"
else
  echo "SKIP (privileges: root without mknod) export onto a device"
fi
finish
