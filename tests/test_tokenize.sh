#!/usr/bin/env bash
# diffusion tokenize: the ids of OpenAI's reference prompt, the vocabulary's
# lookup and its errors, truncation warnings, --count, standard input, bad text.
source "$(dirname "$0")/lib.sh"

VOCAB=$(cd "$(dirname "$0")/.." && pwd)/../shared/data/bpe_simple_vocab_16e6.txt.gz
if [ ! -f "$VOCAB" ]; then
  echo "SKIP test_tokenize: $VOCAB not found (shared/ beside the repository)"
  exit 0
fi
unset DIFFUSION_VOCAB

out=$(diffusion tokenize --help)
[[ "$out" == *"usage: diffusion tokenize"* && "$out" == *"DIFFUSION_VOCAB"* ]] && pass "--help" || fail "--help: '$out'"

# OpenAI's example, then <|endoftext|> to 77 ids
want="49406 320 1125 539 550 18376 6765 320 4558 525 7496 49407"
for ((i = 12; i < 77; i++)); do want="$want 49407"; done
out=$(diffusion tokenize --vocab "$VOCAB" "a photo of an astronaut riding a horse on mars")
[ "$out" == "$want" ] && pass "the reference prompt's 77 ids" || fail "reference prompt: '$out'"
out=$(DIFFUSION_VOCAB="$VOCAB" diffusion tokenize "A Photo of an  astronaut riding a horse on MARS ")
[ "$out" == "$want" ] && pass "DIFFUSION_VOCAB, case and spaces" || fail "DIFFUSION_VOCAB: '$out'"
out=$(cd "$TMP" && ln -sf "$VOCAB" bpe_simple_vocab_16e6.txt.gz && diffusion tokenize "a photo of an astronaut riding a horse on mars")
[ "$out" == "$want" ] && pass "the vocabulary in the current folder" || fail "./bpe_simple_vocab_16e6.txt.gz: '$out'"
rm -f "$TMP/bpe_simple_vocab_16e6.txt.gz"

# one line per prompt, in order; "-" reads lines from standard input; "--" ends the flags
out=$(printf 'a photo\n\nrock &amp; roll\n' | diffusion tokenize --count --vocab "$VOCAB" "one" - -- --count)
[ "$out" == "$(printf '1\n2\n0\n3\n2')" ] && pass "--count, standard input and --" || fail "counts: '$out'"
lines=$(diffusion tokenize --vocab "$VOCAB" "x" "" "y z" | awk '{ print NF }' | tr '\n' ' ')
[ "$lines" == "77 77 77 " ] && pass "77 ids per prompt" || fail "ids per line: '$lines'"

# truncation: the ids stop at 75 tokens, stderr says how many there were
long=$(printf 'cat %.0s' {1..100})
err=$(diffusion tokenize --vocab "$VOCAB" "short" "$long" 2>&1 > "$TMP/ids")
[[ $? -eq 0 && "$err" == *"prompt 2: 100 tokens, truncated to 75"* && "$err" != *"prompt 1"* ]] \
  && pass "truncation warning" || fail "truncation warning: '$err'"
last=$(sed -n 2p "$TMP/ids" | awk '{ print $76, $77, NF }')
[ "$last" == "2368 49407 77" ] && pass "a truncated prompt ends in EOS" || fail "truncated ids end in '$last'"

# errors: usage (2) and failures (1), in the user's terms
expect_code 2 "no prompt" diffusion tokenize --vocab "$VOCAB"
expect_fail "no prompt" "tokenize needs a PROMPT" diffusion tokenize --vocab "$VOCAB"
expect_code 2 "unknown flag" diffusion tokenize --vocab "$VOCAB" --bogus x
expect_code 1 "missing vocabulary file" diffusion tokenize --vocab "$TMP/none.txt.gz" x
expect_fail "missing vocabulary file" "$TMP/none.txt.gz: cannot open" diffusion tokenize --vocab "$TMP/none.txt.gz" x
expect_fail "no vocabulary anywhere" "give --vocab FILE|FOLDER or set DIFFUSION_VOCAB (looked for ./bpe_simple_vocab_16e6.txt.gz" \
  bash -c "cd '$TMP' && '$BIN' tokenize x"
mkdir -p "$TMP/empty"
expect_fail "a folder without vocab.json" "without vocab.json" diffusion tokenize --vocab "$TMP/empty" x
printf '#version: 0.2\na b\n' > "$TMP/small.txt"
expect_fail "a BPE file cut short" "1 merge rules after the header line" diffusion tokenize --vocab "$TMP/small.txt" x
expect_code 1 "invalid UTF-8" diffusion tokenize --vocab "$VOCAB" "ok" $'caf\xe9'
expect_fail "invalid UTF-8" "prompt 2: the text is not valid UTF-8: byte 0xe9 at offset 3" \
  diffusion tokenize --vocab "$VOCAB" "ok" $'caf\xe9'
finish
