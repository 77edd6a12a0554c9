#!/usr/bin/env python3
"""Golden token ids for the CLIP tokenizer test (tests/golden/clip_tokens.txt).

An independent Python implementation of OpenAI's CLIP tokenizer (clip/simple_tokenizer.py:
bytes_to_unicode, get_pairs, bpe, basic_clean, whitespace_clean, the pre-tokenizer regex,
clip.tokenize's [SOT] + tokens + [EOT] framing), written from the algorithm, run over a fixed
set of prompts that exercise each of its steps.

    python3 tools/clip_tokenizer_golden.py                 # rewrite tests/golden/clip_tokens.txt
    python3 tools/clip_tokenizer_golden.py --check         # recompute and compare with the file
    python3 tools/clip_tokenizer_golden.py --transformers  # also compare with transformers' CLIPTokenizer
    python3 tools/clip_tokenizer_golden.py --against ./diffusion --random 10000   # random prompts vs the engine

Needs the `regex` module (Debian: python3-regex; use /usr/bin/python3 there, whose Unicode
tables are the ones tools/gen_text_tables.py put in src/text/). The vocabulary defaults to
the repository's data/bpe_simple_vocab_16e6.txt.gz (--vocab FILE for another copy).

ftfy: OpenAI runs ftfy.fix_text first. When ftfy is installed it is used. Otherwise (it is not
packaged for Debian 12) this script applies ftfy's deterministic fixes itself, from Python's
own tables: its HTML unescaping, C1 controls as Windows-1252, Latin ligatures, character
width, curly quotes, line breaks, terminal escapes, control characters and NFC, line by line
until nothing changes. What that leaves out is ftfy's mojibake repair, which none of the
prompts below triggers; the file's header says which was used, and --check with ftfy
installed confirms the two agree on them. (The engine repairs mojibake too; its own golden
cases come from the real ftfy: tools/ftfy_golden.py.)

--against BIN runs `BIN tokenize -` on --random N generated prompts (entities, contractions,
quotes, ligatures, wide forms, combining marks, Greek sigma, controls, emoji, random code
points of every plane) and compares every id. With ftfy installed, --no-fix-encoding switches
off its mojibake repair (for comparing with an engine built before it had one).

--transformers builds vocab.json and merges.txt from the BPE file in a temporary folder and
loads CLIPTokenizer from it. Note that without ftfy CLIPTokenizer does not follow OpenAI: it
falls back to BERT's BasicTokenizer (no HTML unescaping; CJK characters split apart), so
differences on such prompts are expected there.
"""
import argparse
import gzip
import html
import html.entities
import json
import os
import random
import re as stdlib_re
import subprocess
import sys
import tempfile
import unicodedata

import regex

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DEFAULT_VOCAB = os.path.join(ROOT, "data", "bpe_simple_vocab_16e6.txt.gz")
GOLDEN = os.path.join(ROOT, "tests", "golden", "clip_tokens.txt")
CONTEXT = 77

try:
    import ftfy
except ImportError:
    ftfy = None


# ---- OpenAI's tokenizer --------------------------------------------------------------

def byte_symbols():
    """bytes_to_unicode(): byte -> a printable character, in OpenAI's order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


def adjacent_pairs(symbols):
    return {(symbols[i], symbols[i + 1]) for i in range(len(symbols) - 1)}


class ClipTokenizer:
    PATTERN = regex.compile(
        r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
        regex.IGNORECASE)

    def __init__(self, bpe_path):
        with gzip.open(bpe_path) as f:
            lines = f.read().decode("utf-8").split("\n")
        self.merges = [tuple(line.split()) for line in lines[1:49152 - 256 - 2 + 1]]
        self.byte_map = byte_symbols()
        base = list(self.byte_map.values())
        self.vocab = base + [s + "</w>" for s in base] + ["".join(m) for m in self.merges]
        self.vocab += ["<|startoftext|>", "<|endoftext|>"]
        self.ids = {s: i for i, s in enumerate(self.vocab)}
        self.ranks = {m: i for i, m in enumerate(self.merges)}
        self.known = {"<|startoftext|>": ["<|startoftext|>"], "<|endoftext|>": ["<|endoftext|>"]}

    def bpe(self, piece):
        if piece in self.known:
            return self.known[piece]
        word = list(piece[:-1]) + [piece[-1] + "</w>"]
        while len(word) > 1:
            pairs = adjacent_pairs(word)
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        self.known[piece] = word
        return word

    def encode(self, text):
        text = clean(text)
        out = []
        for piece in self.PATTERN.findall(text):
            mapped = "".join(self.byte_map[b] for b in piece.encode("utf-8"))
            out += [self.ids[s] for s in self.bpe(mapped)]
        return out

    def tokenize(self, text):
        """clip.tokenize(truncate=True) framing, padded with <|endoftext|> as diffusers pads."""
        tokens = self.encode(text)
        sot, eot = self.ids["<|startoftext|>"], self.ids["<|endoftext|>"]
        ids = [sot] + tokens[:CONTEXT - 2] + [eot]
        return len(tokens), ids + [eot] * (CONTEXT - len(ids))


FIX_ENCODING = True  # ftfy's mojibake repair, when ftfy is installed (--no-fix-encoding)


def clean(text):
    """whitespace_clean(basic_clean(text)).lower()"""
    text = ftfy.fix_text(text, fix_encoding=FIX_ENCODING) if ftfy else ftfy_fixes(text)
    text = html.unescape(html.unescape(text)).strip()
    return regex.sub(r"\s+", " ", text).strip().lower()


# ---- ftfy's deterministic fixes, when ftfy is not installed ------------------------------

def _ftfy_entities():
    names = {}
    for name, value in html.entities.html5.items():
        if name.endswith(";"):
            names["&" + name] = value
            upper = "&" + name.upper()
            if name == name.lower() and html.unescape(upper) == upper:
                names[upper] = value.upper()
    return names


FTFY_ENTITIES = _ftfy_entities()
LIGATURES = {0x132: "IJ", 0x133: "ij", 0x149: "\u02bcn", 0x1F1: "DZ", 0x1F2: "Dz", 0x1F3: "dz",
             0x1C4: "D\u017d", 0x1C5: "D\u017e", 0x1C6: "d\u017e", 0x1C7: "LJ", 0x1C8: "Lj",
             0x1C9: "lj", 0x1CA: "NJ", 0x1CB: "Nj", 0x1CC: "nj", 0xFB00: "ff", 0xFB01: "fi",
             0xFB02: "fl", 0xFB03: "ffi", 0xFB04: "ffl", 0xFB05: "\u017ft", 0xFB06: "st"}
WIDTH = {0x3000: " "}
WIDTH.update({c: unicodedata.normalize("NFKC", chr(c)) for c in range(0xFF01, 0xFFF0)
              if unicodedata.normalize("NFKC", chr(c)) != chr(c)})
CONTROLS = dict.fromkeys([*range(0, 9), 0x0B, *range(0x0E, 0x20), 0x7F, *range(0x206A, 0x2070), 0xFEFF,
                          *range(0xFFF9, 0xFFFD)])


def _unescape_entity(match):
    text = match.group(0)
    if text in FTFY_ENTITIES:
        return FTFY_ENTITIES[text]
    if text.startswith("&#"):
        decoded = html.unescape(text)
        return text if ";" in decoded else decoded
    return text


def _windows_1252(match):
    try:
        return bytes([ord(match.group(0))]).decode("windows-1252")
    except UnicodeDecodeError:  # the five bytes Windows-1252 leaves undefined stay as they are
        return match.group(0)


def _fix_segment(text, unescape):
    while True:
        before = text
        if unescape:
            text = stdlib_re.sub(r"&#?[0-9A-Za-z]{1,24};", _unescape_entity, text)
        text = stdlib_re.sub("[\x80-\x9f]", _windows_1252, text)
        text = text.translate(LIGATURES).translate(WIDTH)
        text = stdlib_re.sub("[\u201c-\u201f]", '"', text)
        text = stdlib_re.sub("[\u02bc\u2018-\u201b]", "'", text)
        for old in ("\r\n", "\r", "\u2028", "\u2029", "\u0085"):
            text = text.replace(old, "\n")
        text = stdlib_re.sub("\033\\[((?:\\d|;)*)([a-zA-Z])", "", text)
        text = unicodedata.normalize("NFC", text.translate(CONTROLS))
        if text == before:
            return text


def ftfy_fixes(text):
    out, pos, unescape = [], 0, True
    while pos < len(text):
        end = text.find("\n", pos) + 1 or len(text)
        end = min(end, pos + 1_000_000)
        if unescape and "<" in text[pos:end]:
            unescape = False
        out.append(_fix_segment(text[pos:end], unescape))
        pos = end
    return "".join(out)


# ---- the prompts ---------------------------------------------------------------------

LONG = " ".join(["a majestic lion resting under a tree at sunset in the savanna"] * 8)
PROMPTS = [
    "a photo of an astronaut riding a horse on mars",
    "",
    "   ",
    "A Photo Of An ASTRONAUT",
    "it's a dog's life, isn't it? we're here, they've gone, I'm fine, we'll see, he'd go",
    "IT'S LOUD AND WE'LL SHOUT",
    "in 1984 there were 3.14159 apples and 1,000,000 pears",
    "wow!!! ... ?!? --- *** (parens) [brackets] {braces} #hashtag @user $100 50% a+b=c",
    "rock &amp; roll &quot;quoted&quot; it&#39;s &lt;3 &#x263A; &hearts;",
    "&amp;amp; double &amp;lt;b&amp;gt; &amp;amp;amp;",
    "&ampx &notin &notit; &AMP &Eacute; &EACUTE; &SZLIG; &#0; &#128; &#x110000; &#xD800; &#65&#66",
    "<b>bold</b> &amp; more &EACUTE;",
    "&ampamp; &ltlt x &amp;amp\n<b> &amp;lt; &amp;amp; &EACUTE;\n&eacute; &EACUTE;",
    "  leading and trailing  \t tabs\tand\nnewlines\r\n and\u00a0nbsp\u3000ideographic  ",
    "caf\u00e9 na\u00efve fa\u00e7ade r\u00e9sum\u00e9",
    "cafe\u0301 decomposed e\u0301\u0323 reordered",
    "Stra\u00dfe GROSSE \u00df \u1e9e",
    "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440, \u041f\u0420\u0418\u0412\u0415\u0422",
    "\u6771\u4eac\u30bf\u30ef\u30fc\u306e\u591c\u666f\u3001\u7f8e\u3057\u3044",
    "\uff46\uff55\uff4c\uff4c\uff57\uff49\uff44\uff54\uff48\u3000\uff34\uff25\uff38\uff34 \uff8a\uff9d\uff76\uff78",
    "\ufb01ne \ufb02owers \ufb00 \u01c4emal \u0133ssel \u0149",
    "\u201ccurly quotes\u201d and \u2018single\u2019 it\u2019s &#x2019;s",
    "emoji \U0001f431\U0001f680 \U0001f469\u200d\U0001f469\u200d\U0001f467 \U0001f1eb\U0001f1f7 \u2764\ufe0f",
    "\u039f\u0394\u039f\u03a3 \u03a3\u039f\u03a6\u039f\u03a3 \u03a3 \u0391\u03a3. \u03a3\u0391",
    "\u0130stanbul D\u0130YARBAKIR",
    "numbers \u0663 \u00bd \u00b2 \u216b \u2460 \uff11\uff12",
    "<|startoftext|>hello<|endoftext|> world <|ENDOFTEXT|>",
    "<|\u017ftartoftext|> it'\u017f",
    "control\x07chars\x1bhere \x1b[31mred\x1b[0m text\x7f",
    "U.S.A. e.g. i.e. Mr. Smith's",
    "a,b;c:d!e?f",
    "snake_case kebab-case CamelCase dotted.name file.png",
    "ab" * 150,
    "a" * 40,
    "!" * 30,
    "https://example.com/path?query=1&amp;x=2",
    "masterpiece, best quality, (extremely detailed:1.2), 8k, trending on artstation",
    "4k 8K 1080p 16:9 2.5D 3d-render",
    "\u2126 \u03c9 \u00b5 \u03bc \u212b \u00c5 \u212a",
    "x\u0345y \u1fb3",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8 \u1100\u1161\u11a8 jamo",
    "tab\tseparated\x0bvt\x0cff\x1cfs\u2028ls\u0085nel",
    LONG,
]


def random_prompts(n, seed):
    """Prompts that hit every step of the clean-up and the pre-tokenizer, one a line."""
    rng = random.Random(seed)
    pieces = ["&amp;", "&#39;", "&#x41;", "&EACUTE;", "&eacute;", "&notin", "&amp", "&#128;", "&lt;", "<", ">",
              "&", "#", ";", "&#x2019;", "&#65", "&SZLIG;", "&ampx", "&#0;", "&#xD800;", "&#99999999999;",
              "&hearts;", "&NotEqualTilde;", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'\u017f",
              "<|endoftext|>", "<|startoftext|>", "<|ENDOFTEXT|>", "\x1b[31m", "\x1b[0;1m", "\x1b[", "\x1b",
              "\r", "\r\n", "\t", " ", "  ", "\u00a0", "\u3000", "\u2028", "\x85", "\x0b", "\x0c", "\x1c",
              "\u201c", "\u201d", "\u2018", "\u2019", "\u02bc", "\ufb01", "\ufb03", "\u0149", "\u01c4",
              "\u0133", "\uff21", "\uff41", "\uff11", "\uff01", "\uff8a", "\uffe3", "\uff9e", "\u0130",
              "\u03a3", "\u03c3", "\u0391", "\u0345", "\u0301", "\u0323", "\u0308", "e\u0301",
              "\u1100\u1161\u11a8", "\u212a", "\u2126", "\u212b", "\u00b5", "\u00df", "\u1e9e", "\u017f",
              "\ud55c", "\u6771", "\u30bf", "\u0663", "\u00bd", "\u216b", "\U0001f431",
              "\U0001f469\u200d\U0001f467", "\u2764\ufe0f", "\u200b", "\ufeff", "\u206a", "\ufff9", "\x7f",
              "\x01", "\u0080", "\u0093", "\u0081", "\u009d", "\u039f\u0394\u039f\u03a3", "\u03a3\u0391"]
    words = ["photo", "astronaut", "the", "cat", "Horse", "MARS", "a", "of", "riding", "beautiful", "xyzzy",
             "123", "3.14", "4k", "Stra\u00dfe", "\u041f\u0440\u0438\u0432\u0435\u0442", "na\u00efve",
             "dog's", "we'll"]

    def code_point():
        while True:
            c = rng.choice([rng.randrange(1, 0x250), rng.randrange(0x250, 0x3000), rng.randrange(0x3000, 0x10000),
                            rng.randrange(0x10000, 0x110000)])
            if not 0xD800 <= c <= 0xDFFF and c != 10:
                return chr(c)

    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randrange(0, 25)):
            r = rng.random()
            parts.append(rng.choice(pieces) if r < 0.35 else rng.choice(words) if r < 0.7
                         else code_point() if r < 0.85 else rng.choice(" .,!?-()"))
        out.append("".join(parts).replace("\n", " "))
    return out


def against(binary, vocab, tok, prompts):
    """Runs `binary tokenize --vocab vocab -` on the prompts; returns how many differ."""
    data = "".join(p + "\n" for p in prompts).encode("utf-8")
    res = subprocess.run([binary, "tokenize", "--vocab", vocab, "-"], input=data, capture_output=True)
    if res.returncode:
        print("%s tokenize failed (%d): %s" % (binary, res.returncode, res.stderr.decode(errors="replace")[-400:]))
        return len(prompts)
    got = res.stdout.decode().split("\n")
    bad = 0
    for i, p in enumerate(prompts):
        want = " ".join(map(str, tok.tokenize(p)[1]))
        if i >= len(got) or got[i] != want:
            bad += 1
            if bad <= 5:
                print("differs on %s:\n  python %s\n  engine %s" % (json.dumps(p), want, got[i] if i < len(got) else ""))
    print("%s: %d of %d prompts differ" % (binary, bad, len(prompts)))
    return bad


def golden_lines(tok):
    lines = []
    for p in PROMPTS:
        n, ids = tok.tokenize(p)
        lines.append("%s\t%d\t%s" % (json.dumps(p, ensure_ascii=False), n, " ".join(map(str, ids))))
    return lines


def header():
    how = ("ftfy %s" % ftfy.__version__) if ftfy else "ftfy not installed: its deterministic fixes applied by the script"
    return ["# CLIP token ids: tools/clip_tokenizer_golden.py (Python %s, Unicode %s, regex %s; %s)."
            % (sys.version.split()[0], unicodedata.unidata_version, regex.__version__, how),
            "# Each line: the prompt as a JSON string, its token count before truncation, its 77 ids."]


def check_transformers(vocab_path, tok):
    from transformers import CLIPTokenizer
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
            json.dump(tok.ids, f, ensure_ascii=False)
        with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "\n".join(" ".join(m) for m in tok.merges) + "\n")
        hf = CLIPTokenizer.from_pretrained(d)
        bad = 0
        for p in PROMPTS:
            want = tok.tokenize(p)[1]
            got = hf(p, padding="max_length", max_length=CONTEXT, truncation=True).input_ids
            if got != want:
                bad += 1
                print("transformers differs on %s:\n  ours %s\n  hf   %s" % (json.dumps(p), want, got))
        print("transformers (ftfy %s): %d of %d prompts differ" % ("installed" if ftfy else "absent", bad, len(PROMPTS)))
        return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", default=DEFAULT_VOCAB)
    ap.add_argument("--out", default=GOLDEN)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    ap.add_argument("--transformers", action="store_true", help="compare with transformers' CLIPTokenizer too")
    ap.add_argument("--against", metavar="BIN", help="compare `BIN tokenize` on random prompts instead")
    ap.add_argument("--random", type=int, default=5000, metavar="N", help="random prompts for --against")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-fix-encoding", action="store_true", help="ftfy without its mojibake repair")
    args = ap.parse_args()
    global FIX_ENCODING
    FIX_ENCODING = not args.no_fix_encoding
    tok = ClipTokenizer(args.vocab)
    assert tok.tokenize("a photo of an astronaut riding a horse on mars")[1][:12] == [
        49406, 320, 1125, 539, 550, 18376, 6765, 320, 4558, 525, 7496, 49407]
    if args.against:
        sys.exit(1 if against(args.against, args.vocab, tok, random_prompts(args.random, args.seed)) else 0)
    lines = golden_lines(tok)
    bad = check_transformers(args.vocab, tok) if args.transformers else 0
    if args.check:
        with open(args.out, encoding="utf-8") as f:
            stored = [line.rstrip("\n") for line in f if not line.startswith("#")]
        diff = [(a, b) for a, b in zip(lines, stored) if a != b]
        for a, b in diff:
            print("differs:\n  now    %s\n  stored %s" % (a, b))
        if len(lines) != len(stored):
            print("%d prompts now, %d stored" % (len(lines), len(stored)))
        print("%d of %d lines differ" % (len(diff), len(lines)))
        sys.exit(1 if diff or len(lines) != len(stored) or bad else 0)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(header() + lines) + "\n")
    print("wrote %d prompts to %s" % (len(lines), args.out))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
