#!/usr/bin/env bash
# The text-to-image demo's captions (tools/fmnist_pictures with the demo's
# templates and fillers): the held-out phrasings' own words ("drawing",
# "close-up", "product", "shot", "plain", "background") are in no caption the
# demo trains on, the same command writes the same captions, every caption
# names its picture's class, and filler words go around about three in five.
source "$(dirname "$0")/lib.sh"
if [ ! -d /usr/share/datasets/fashion-mnist ]; then echo "FAIL dataset-fashion-mnist is not installed (tools/deps.sh installs it)"; exit 1; fi
tool=${BUILD:-build}/tools/fmnist_pictures
args=(--data /usr/share/datasets/fashion-mnist --templates tools/t2i_demo/templates.txt
      --fillers tools/t2i_demo/fillers.txt --classes 0-8 --per-class 200)
"$tool" "${args[@]}" --out "$TMP/a" > /dev/null && "$tool" "${args[@]}" --out "$TMP/b" > /dev/null \
  || fail "fmnist_pictures"
n=$(ls "$TMP/a"/*.txt | wc -l)
[ "$n" = 1800 ] && pass "1800 captioned pictures" || fail "$n captions, 1800 expected"
diff -rq "$TMP/a" "$TMP/b" > /dev/null && pass "the same command writes the same pictures and captions" \
  || fail "two runs differ"
cat "$TMP/a"/*.txt > "$TMP/all.txt"
for w in drawing close-up product shot plain background; do
  grep -qw -- "$w" "$TMP/all.txt" && fail "\"$w\" (a held-out phrasing's word) is in a training caption"
done
grep -qwE 'drawing|close-up|product|shot|plain|background' tools/t2i_demo/fillers.txt tools/t2i_demo/templates.txt \
  && fail "a held-out phrasing's word is in the templates or fillers" || pass "no held-out word in any caption"
# captions that are a template with the class name alone, against those with fillers
plain=0
mapfile -t tpl < tools/t2i_demo/templates.txt
names=(t-shirt trouser pullover dress coat sandal shirt sneaker bag)
for f in "$TMP/a"/*.txt; do
  cap=$(cat "$f")
  for t in "${tpl[@]}"; do
    for c in "${names[@]}"; do [ "$cap" = "${t//\{\}/$c}" ] && { plain=$((plain + 1)); break 2; }; done
  done
done
awk -v p="$plain" -v n="$n" 'BEGIN { exit !(p > 0.33 * n && p < 0.47 * n) }' \
  && pass "$plain of $n captions without fillers (about two in five)" || fail "$plain of $n captions without fillers"
bad=0
for f in "$TMP/a"/*.txt; do grep -qwE 't-shirt|trouser|pullover|dress|coat|sandal|shirt|sneaker|bag' "$f" || bad=$((bad + 1)); done
[ "$bad" = 0 ] && pass "every caption names a class" || fail "$bad captions name no class"
finish
