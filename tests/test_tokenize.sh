#!/usr/bin/env bash
# diffusion tokenize: the ids of OpenAI's reference prompt, the vocabulary's
# lookup (beside the binary, in a checkout and once installed) and its errors,
# truncation warnings, --count, standard input, bad text.
source "$(dirname "$0")/lib.sh"

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VOCAB=$ROOT/data/bpe_simple_vocab_16e6.txt.gz
[ -f "$VOCAB" ] || { echo "FAIL $VOCAB not found: it ships with the repository"; exit 1; }
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

# without --vocab: data/ beside the binary (a checkout), ../share/diffusion/
# beside it (an installation); a copy of the binary elsewhere finds neither
mkdir -p "$TMP/checkout/data" "$TMP/elsewhere"
cp "$BIN" "$TMP/checkout/diffusion" && cp "$BIN" "$TMP/elsewhere/diffusion" && cp "$VOCAB" "$TMP/checkout/data/"
out=$(cd "$TMP" && checkout/diffusion tokenize "a photo of an astronaut riding a horse on mars")
[ "$out" == "$want" ] && pass "the vocabulary in data/ beside the binary" || fail "data/ beside the binary: '$out'"
fixed=0; for d in /usr/local/share/diffusion /usr/share/diffusion; do [ -e "$d/bpe_simple_vocab_16e6.txt.gz" ] && fixed=1; done
if [ $fixed = 0 ]; then
  expect_fail "no vocabulary anywhere" "give --vocab FILE|FOLDER or set DIFFUSION_VOCAB (looked for ./bpe_simple_vocab_16e6.txt.gz, $TMP/elsewhere/data/bpe_simple_vocab_16e6.txt.gz, $TMP/elsewhere/../share/diffusion/bpe_simple_vocab_16e6.txt.gz" \
    bash -c "cd '$TMP' && elsewhere/diffusion tokenize x"
else  # this machine has one installed: it is found
  out=$(cd "$TMP" && elsewhere/diffusion tokenize "a photo of an astronaut riding a horse on mars")
  [ "$out" == "$want" ] && pass "the installed vocabulary" || fail "the installed vocabulary: '$out'"
fi
# make install (DESTDIR honoured) puts the binary and the vocabulary where it looks
# (-o: the binary under test is installed as it is, never rebuilt in another configuration)
stage=$TMP/stage; prefix=/opt/diffusion-test
if (cd "$ROOT" && make -s --no-print-directory install -o "$BIN" DESTDIR="$stage" PREFIX="$prefix" BIN="$BIN") > "$TMP/install.log" 2>&1; then
  out=$(cd "$TMP" && "$stage$prefix/bin/diffusion" tokenize "a photo of an astronaut riding a horse on mars")
  [ "$out" == "$want" ] && [ -f "$stage$prefix/share/diffusion/LICENSE.CLIP" ] \
    && pass "make install DESTDIR: the installed binary finds its vocabulary" || fail "installed binary: '$out'"
  printf 'not a vocabulary' > "$stage$prefix/share/diffusion/bpe_simple_vocab_16e6.txt.gz"  # the one it reads, named
  expect_fail "the installed binary reads PREFIX/share/diffusion/" "$stage$prefix/bin/../share/diffusion/bpe_simple_vocab_16e6.txt.gz" \
    bash -c "cd '$TMP' && '$stage$prefix/bin/diffusion' tokenize x"
  (cd "$ROOT" && make -s --no-print-directory uninstall DESTDIR="$stage" PREFIX="$prefix") > /dev/null 2>&1
  [ -z "$(find "$stage" -type f)" ] && pass "make uninstall removes what install put" || fail "left after uninstall: $(find "$stage" -type f)"
else
  fail "make install DESTDIR=$stage: $(tail -3 "$TMP/install.log")"
fi
mkdir -p "$TMP/empty"
expect_fail "a folder without vocab.json" "without vocab.json" diffusion tokenize --vocab "$TMP/empty" x
printf '#version: 0.2\na b\n' > "$TMP/small.txt"
expect_fail "a BPE file cut short" "1 merge rules after the header line" diffusion tokenize --vocab "$TMP/small.txt" x
expect_code 1 "invalid UTF-8" diffusion tokenize --vocab "$VOCAB" "ok" $'caf\xe9'
expect_fail "invalid UTF-8" "prompt 2: the text is not valid UTF-8: byte 0xe9 at offset 3" \
  diffusion tokenize --vocab "$VOCAB" "ok" $'caf\xe9'
finish
