#!/usr/bin/env bash
# A short end-to-end run on Fashion-MNIST: the loss must fall, and sampling
# and export must work on the result.
source "$(dirname "$0")/lib.sh"
if [ ! -d /usr/share/datasets/fashion-mnist ]; then echo "FAIL dataset-fashion-mnist is not installed (tools/deps.sh installs it)"; exit 1; fi
$BIN train --depth 2 --hidden 64 --heads 4 --patch 4 --batch 32 --steps 120 --lr 1e-3 --warmup 10 \
  --threads 2 --log-every 1 --out "$TMP/run" > "$TMP/train.log" 2>&1 || { cat "$TMP/train.log"; fail "training"; finish; }
# mean of the first 10 and last 10 step losses
read -r first last < <(grep -o 'loss [0-9.naif]*' "$TMP/train.log" | awk '{v[NR]=$2} END {
  for (i = 1; i <= 10; i++) { a += v[i]; b += v[NR - i + 1] } print a / 10, b / 10 }')
echo "mean loss: first 10 steps $first, last 10 steps $last"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.7 * a) }' && pass "loss falls by over 30%" || fail "loss did not fall enough ($first -> $last)"
$BIN sample --ckpt "$TMP/run" --classes 0,7 --per-class 3 --steps 10 --threads 2 \
  --grid "$TMP/g.png" --out-dir "$TMP/s" > "$TMP/sample.log" 2>&1 && [ -s "$TMP/g.png" ] && [ -s "$TMP/s/class7_2.png" ] \
  && pass "sampling writes the grid and the files" || { cat "$TMP/sample.log"; fail "sampling"; }
$BIN export --ckpt "$TMP/run" --out "$TMP/official.safetensors" > /dev/null 2>&1 && \
  $BIN info "$TMP/official.safetensors" > "$TMP/info.txt" 2>&1 && grep -q "depth 2, hidden 64, heads 4" "$TMP/info.txt" \
  && pass "export + info round trip" || { cat "$TMP/info.txt"; fail "export/info"; }
finish
