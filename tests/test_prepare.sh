#!/usr/bin/env bash
# diffusion prepare from the command line, on a tiny random SD model
# (tools/sd_random) and pictures from tools/make_picture: every source layout
# (caption files, kohya's N_ folders, metadata.jsonl, webdataset tars made by
# GNU tar in its gnu, ustar and pax formats), unreadable pictures skipped and
# counted, the refusals naming the file at fault, buckets, --vae none, and a
# run killed with SIGKILL (and one stopped by SIGTERM) continued to the bytes
# of an uninterrupted run. The values in the shards are checked against the
# models by test_prepare.c; here the shards are read through their index and
# the captions found in them.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SDR=$ROOT/${BUILD:-build}/tools/sd_random
MP=$ROOT/${BUILD:-build}/tools/make_picture
VOCAB=$ROOT/data/bpe_simple_vocab_16e6.txt.gz
[ -x "$SDR" ] && [ -x "$MP" ] || { echo "FAIL: $SDR or $MP not built (make)"; exit 1; }
"$SDR" --config tiny1 --layout diffusers --vocab "$VOCAB" --out "$TMP/tiny1" > /dev/null || { echo "FAIL sd_random"; exit 1; }
P=(--model "$TMP/tiny1" --device cpu --threads 2)

# samples DIR: the samples index.json lists
samples() { grep -o '"samples": [0-9]*' "$1/index.json" | awk '{ s += $2 } END { print s + 0 }'; }
# has DIR TEXT: the shards hold TEXT (a caption) this many times
has() { cat "$1"/shard.*.mds | grep -a -o -F "$2" | wc -l; }

out=$(diffusion prepare --help)
for f in --data --out --model --vae --size --buckets --min-side --max-side --batch --caption-ext --caption-column \
  --shard-bytes --zstd --overwrite --vocab --device; do
  [[ "$out" == *"$f "* ]] || fail "prepare --help does not document $f"
done
pass "prepare --help documents every flag"
expect_code 2 "prepare without --data" diffusion prepare --model "$TMP/tiny1" --out "$TMP/x"
expect_code 2 "prepare --vae other" diffusion prepare --data "$TMP" --model "$TMP/tiny1" --out "$TMP/x" --vae sd

# ---- a folder tree: .txt and .caption captions, kohya's 4_ folder, an unreadable picture
mkdir -p "$TMP/src/4_sks dog" "$TMP/src/sub"
"$MP" png 40 30 "$TMP/src/a.png" && echo "a red ball" > "$TMP/src/a.txt"
"$MP" jpeg 30 50 "$TMP/src/sub/b.jpg" && echo "  a blue box  " > "$TMP/src/sub/b.caption"
"$MP" webp 64 64 "$TMP/src/4_sks dog/c.webp"
"$MP" jpeg-progressive 48 48 "$TMP/src/4_sks dog/d.jpeg" && echo "sks dog in the snow" > "$TMP/src/4_sks dog/d.txt"
"$MP" jpeg 64 64 "$TMP/x.jpg" && head -c 300 "$TMP/x.jpg" > "$TMP/src/sub/torn.jpg" && echo "torn" > "$TMP/src/sub/torn.txt"
diffusion prepare "${P[@]}" --data "$TMP/src" --out "$TMP/o1" --size 32 --batch 2 > "$TMP/log" 2>&1 \
  || fail "prepare a folder: $(tail -3 "$TMP/log")"
[ "$(samples "$TMP/o1")" = 10 ] && pass "folder: 1 + 1 + 4 x 2 samples (kohya's repeats written out)" \
  || fail "folder: $(samples "$TMP/o1") samples, want 10"
[ "$(has "$TMP/o1" "a red ball")" = 1 ] && [ "$(has "$TMP/o1" "a blue box")" = 1 ] \
  && [ "$(has "$TMP/o1" "sks dog in the snow")" = 4 ] && [ "$(has "$TMP/o1" "sks dog")" = 8 ] \
  && pass "captions: .txt, .caption (trimmed), and kohya's class tokens where there is none" \
  || fail "captions in the shards: $(has "$TMP/o1" "sks dog") 'sks dog'"
grep -q "torn.jpg" "$TMP/log" && grep -q "1 unreadable pictures were skipped" "$TMP/log" \
  && pass "an unreadable picture is named, skipped and counted" || fail "torn picture: $(cat "$TMP/log")"
grep -q '"corrupt": 1' "$TMP/o1/prepare.json" && grep -q '"latent_scaling_applied": false' "$TMP/o1/prepare.json" \
  && pass "prepare.json: the count and the scaling factor, not applied" || fail "prepare.json: $(cat "$TMP/o1/prepare.json")"
grep -q '"ndarray:float16:4,8,8"' "$TMP/o1/index.json" && grep -q '"ndarray:float16:77,64"' "$TMP/o1/index.json" \
  && pass "index: fp16 latents (4 x 32/4 x 32/4: tiny1's VAE halves twice) and embeddings [77, 64]" || fail "columns: $(head -c 400 "$TMP/o1/index.json")"
expect_fail "a finished folder is not overwritten" "--overwrite" diffusion prepare "${P[@]}" --data "$TMP/src" --out "$TMP/o1" --size 32
diffusion prepare "${P[@]}" --data "$TMP/src" --out "$TMP/o1" --size 32 --batch 2 --overwrite > /dev/null 2>&1 \
  && [ "$(samples "$TMP/o1")" = 10 ] && pass "--overwrite makes it again" || fail "--overwrite"
diffusion prepare "${P[@]}" --data "$TMP/src" --out "$TMP/o2" --size 32 --caption-ext .caption > "$TMP/log" 2>&1
[ "$(has "$TMP/o2" "a blue box")" = 1 ] && [ "$(has "$TMP/o2" "a red ball")" = 0 ] && grep -q "a.png has no caption" "$TMP/log" \
  && pass "--caption-ext .caption: only those files, the others warned about" || fail "--caption-ext: $(tail -3 "$TMP/log")"

# ---- diffusers' metadata.jsonl, with its caption column named
mkdir -p "$TMP/hf/train"
"$MP" png 32 32 "$TMP/hf/train/0.png" && "$MP" webp 40 20 "$TMP/hf/train/1.webp" && "$MP" png 20 40 "$TMP/hf/extra.png"
printf '%s\n' '{"file_name": "train/0.png", "prompt": "a cat on a mat", "text": "no"}' '' \
  '{"file_name": "train/1.webp", "prompt": "a wide \u00e9t\u00e9 field"}' > "$TMP/hf/metadata.jsonl"
diffusion prepare "${P[@]}" --data "$TMP/hf" --out "$TMP/o3" --size 32 --caption-column prompt > "$TMP/log" 2>&1 \
  && [ "$(samples "$TMP/o3")" = 2 ] && [ "$(has "$TMP/o3" "a cat on a mat")" = 1 ] && [ "$(has "$TMP/o3" "a wide été field")" = 1 ] \
  && pass "metadata.jsonl: the pictures it lists, captions from --caption-column" || fail "metadata.jsonl: $(tail -3 "$TMP/log")"
printf '%s\n' '{"file_name": "train/0.png", "text": "ok"}' '{"file_name": 3}' > "$TMP/hf/metadata.jsonl"
expect_fail "a malformed metadata line is named" "metadata.jsonl, line 2" diffusion prepare "${P[@]}" --data "$TMP/hf" --out "$TMP/o4" --size 32
printf '%s\n' '{"file_name": "../x.png", "text": "ok"}' > "$TMP/hf/metadata.jsonl"
expect_fail "a file_name outside the folder is refused" "not a path inside the folder" diffusion prepare "${P[@]}" --data "$TMP/hf" --out "$TMP/o4" --size 32

# ---- webdataset tars as img2dataset writes them, in GNU tar's three formats
mkdir -p "$TMP/wds/00000"
long=$(printf 'k%.0s' {1..120})
"$MP" jpeg 48 32 "$TMP/wds/00000/000000001.jpg" && echo "a photo of a ship" > "$TMP/wds/00000/000000001.txt"
"$MP" png 32 48 "$TMP/wds/00000/000000002.png" && echo '{"caption": "a json caption", "url": "x"}' > "$TMP/wds/00000/000000002.json"
"$MP" webp 32 32 "$TMP/wds/00000/$long.webp" && echo "a long name" > "$TMP/wds/00000/$long.txt"
"$MP" jpeg 32 32 "$TMP/wds/00000/000000004.jpg"
echo '{"status": "failed"}' > "$TMP/wds/00000/000000005.json"
for fmt in gnu ustar pax; do
  [ $fmt = ustar ] && names=(00000/000000001.jpg 00000/000000001.txt 00000/000000002.png 00000/000000002.json 00000/000000004.jpg 00000/000000005.json) \
    || names=(00000)
  tar -C "$TMP/wds" --format=$fmt -cf "$TMP/shard-$fmt.tar" "${names[@]}"
  want=$([ $fmt = ustar ] && echo 3 || echo 4)
  diffusion prepare "${P[@]}" --data "$TMP/shard-$fmt.tar" --out "$TMP/t-$fmt" --size 32 > "$TMP/log" 2>&1 \
    && [ "$(samples "$TMP/t-$fmt")" = $want ] && [ "$(has "$TMP/t-$fmt" "a photo of a ship")" = 1 ] \
    && [ "$(has "$TMP/t-$fmt" "a json caption")" = 1 ] && grep -q "000000004.jpg has no caption" "$TMP/log" \
    && pass "webdataset tar ($fmt): $want samples, captions from key.txt and key.json" \
    || fail "tar $fmt: $(samples "$TMP/t-$fmt") samples; $(tail -3 "$TMP/log")"
done
[ "$(has "$TMP/t-pax" "a long name")" = 1 ] && [ "$(has "$TMP/t-gnu" "a long name")" = 1 ] \
  && pass "tar: long member names (pax and GNU records)" || fail "tar long names"
head -c 3000 "$TMP/shard-gnu.tar" > "$TMP/cut.tar"
expect_fail "a truncated tar is named" "cut.tar is truncated" diffusion prepare "${P[@]}" --data "$TMP/cut.tar" --out "$TMP/o5" --size 32
cp "$TMP/shard-gnu.tar" "$TMP/bad.tar" && printf 'X' | dd of="$TMP/bad.tar" bs=1 seek=0 conv=notrunc 2> /dev/null
expect_fail "a tar with a damaged header is named" "bad.tar: the header at byte 0 fails its checksum" \
  diffusion prepare "${P[@]}" --data "$TMP/bad.tar" --out "$TMP/o5" --size 32

# ---- buckets, and --vae none
mkdir -p "$TMP/b"
for s in 100x100 190x100 100x300 64x64; do "$MP" png ${s%x*} ${s#*x} "$TMP/b/$s.png"; done
diffusion prepare "${P[@]}" --data "$TMP/b" --out "$TMP/ob" --buckets --size 128 --min-side 64 --max-side 192 > "$TMP/log" 2>&1 \
  && [ "$(samples "$TMP/ob/128x128")" = 3 ] && [ "$(samples "$TMP/ob/64x192")" = 1 ] && [ ! -e "$TMP/ob/192x64" ] \
  && grep -q '"ndarray:float16:4,48,16"' "$TMP/ob/64x192/index.json" \
  && pass "--buckets: a folder per bucket used (190x100 to 128x128, 100x300 to 64x192)" || fail "buckets: $(ls "$TMP/ob"); $(tail -3 "$TMP/log")"
diffusion prepare "${P[@]}" --data "$TMP/src" --out "$TMP/op" --size 24 --vae none > "$TMP/log" 2>&1 \
  && grep -q '"pixels"' "$TMP/op/index.json" && grep -q '"ndarray:uint8:3,24,24"' "$TMP/op/index.json" \
  && ! grep -q latents "$TMP/op/index.json" && pass "--vae none: the pictures' bytes, no latents" || fail "--vae none: $(tail -3 "$TMP/log")"

# ---- killed and continued: the bytes of one uninterrupted run
mkdir -p "$TMP/many"
for i in $(seq 100 179); do "$MP" png $((20 + i % 30)) $((20 + i % 17)) "$TMP/many/$i.png"; echo "picture $i" > "$TMP/many/$i.txt"; done
K=(--data "$TMP/many" --size 64 --batch 3 --shard-bytes 30000)
diffusion prepare "${P[@]}" "${K[@]}" --out "$TMP/whole" > /dev/null 2>&1 || fail "the uninterrupted run"
"$BIN" prepare "${P[@]}" "${K[@]}" --out "$TMP/killed" > "$TMP/klog" 2>&1 &
pid=$!
for ((i = 0; i < 600; i++)); do [ -e "$TMP/killed/shard.00003.mds" ] && break; sleep 0.02; done
if kill -KILL $pid 2> /dev/null; then
  wait $pid 2> /dev/null
  [ ! -e "$TMP/killed/index.json" ] && [ -e "$TMP/killed/prepare.progress.json" ] || fail "the kill came too late to test anything"
  # what a kill can leave half written, whichever file it hit: all of it removed on continuing
  for f in prepare.progress.json prepare.json shard.00009.mds index.json; do echo half > "$TMP/killed/$f.tmp.99999"; done
  diffusion prepare "${P[@]}" "${K[@]}" --out "$TMP/killed" > "$TMP/log" 2>&1 || fail "continuing: $(tail -3 "$TMP/log")"
  grep -q "continued a stopped run" "$TMP/log" && diff -r "$TMP/whole" "$TMP/killed" > /dev/null \
    && pass "killed (SIGKILL) and continued: the same files, byte for byte" || fail "killed and continued: $(diff -r "$TMP/whole" "$TMP/killed" | head -3)"
else
  fail "the run ended before it could be killed"
fi
"$BIN" prepare "${P[@]}" "${K[@]}" --out "$TMP/termed" > "$TMP/tlog" 2>&1 &
pid=$!
for ((i = 0; i < 600; i++)); do [ -e "$TMP/termed/shard.00001.mds" ] && break; sleep 0.02; done
kill -TERM $pid 2> /dev/null
wait $pid
rc=$?
grep -q "stopped by signal 15" "$TMP/tlog" && [ $rc = 143 ] || fail "SIGTERM: exit $rc; $(tail -2 "$TMP/tlog")"
expect_fail "an unfinished run is not continued with other settings" "other settings" \
  diffusion prepare "${P[@]}" "${K[@]}" --out "$TMP/termed" --zstd 3
diffusion prepare "${P[@]}" "${K[@]}" --out "$TMP/termed" > /dev/null 2>&1 && diff -r "$TMP/whole" "$TMP/termed" > /dev/null \
  && pass "stopped by SIGTERM after a batch (exit 143) and continued: the same files" || fail "SIGTERM and continued"
finish
