#!/usr/bin/env python3
"""Golden outputs of ftfy for the mojibake repair test (tests/golden/ftfy/cases.txt).

    export PYTHONPATH=path/to/python-ftfy  # ftfy 6.3.1's source: pure Python, not in Debian 12
    python3 tools/ftfy_golden.py          # rewrite tests/golden/ftfy/cases.txt
    python3 tools/ftfy_golden.py --check  # recompute and compare with the file

Every expected value is computed by the real ftfy (never by this script):

  * fix_text / fix_encoding of hand-picked texts: UTF-8 read as Windows-1252 and as Latin-1,
    the other encodings ftfy tries (Windows-1250/1251/1253/1254/1257, ISO-8859-2, MacRoman,
    cp437), mojibake of mojibake, curly quotes, NBSPs turned into spaces, characters lost to
    U+FFFD or '?', CESU-8 and Java's U+0000, C1 controls, mojibake inside good text, and text
    that ftfy must leave alone (accented Latin, Greek, Cyrillic, CJK, emoji, kaomoji, ASCII);
  * the same for seeded random texts in many scripts, garbled by random encodings and damage;
  * is_bad (ftfy.badness.is_bad) of strings sampled from each alternative of ftfy's own
    BADNESS_RE, and of near misses (one character changed, no longer bad);
  * CLIP token ids of a few mojibake prompts, from tools/clip_tokenizer_golden.py's tokenizer
    with ftfy installed (needs `regex`; the vocabulary is the repository's data/).

Run it with the Python that tools/gen_text_tables.py uses (Debian 12's /usr/bin/python3, Unicode
14.0): Python's \\w and \\s and the tokenizer's classes depend on the Unicode version.
"""
import argparse
import json
import os
import random
import re
import sys
import unicodedata

import ftfy
import ftfy.bad_codecs  # registers the sloppy codecs
from ftfy import badness, chardata

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "tests", "golden", "ftfy", "cases.txt")
ALL = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)


def moji(text, encoding):
    """text encoded as UTF-8 and decoded in `encoding` (ftfy's sloppy codecs fill the holes)."""
    return text.encode("utf-8").decode(encoding)


def cesu8(text):
    """text's UTF-8 with characters above U+FFFF written as CESU-8 surrogate pairs."""
    out = b""
    for ch in text:
        c = ord(ch)
        if c < 0x10000:
            out += ch.encode("utf-8")
        else:
            c -= 0x10000
            out += chr(0xD800 + (c >> 10)).encode("utf-8", "surrogatepass")
            out += chr(0xDC00 + (c & 0x3FF)).encode("utf-8", "surrogatepass")
    return out


W1252 = "sloppy-windows-1252"

HAND = [
    # UTF-8 read as Windows-1252
    "caf\u00c3\u00a9", "sch\u00c3\u00b6n", moji("über alles", W1252), moji("naïve café", W1252),
    moji("Español", W1252), moji("français", W1252), moji("Straße", W1252), moji("Mötley Crüe", W1252),
    moji("São Paulo", W1252), moji("Ñandú", W1252), moji("ÀÉÎÕÜ", W1252),
    moji("“quoted”", W1252), moji("it’s", W1252), moji("‘single’", W1252),
    moji("The Mona Lisa doesn’t have eyebrows.", W1252), moji("em—dash", W1252), moji("wait…", W1252),
    moji("€100", W1252), moji("£5", W1252), moji("©2024 ®", W1252), moji("• bullet", W1252),
    moji("à la carte", W1252), moji("voilà le travail", W1252).replace("\xa0", " "),
    moji("à la carte", W1252).replace("\xa0", " "), "f\u00c3 cil", "\u00c3 quele", "\u00c3 s coisas",
    moji("😀", W1252), moji("🐱 cat", W1252), moji("👩‍👩‍👧 family", W1252), moji("日本語", W1252),
    moji("中文字", W1252), moji("한국어", W1252), moji("Привет", W1252), moji("Ελληνικά", W1252),
    moji("مرحبا", W1252), moji("हिन्दी", W1252), moji("שלום", W1252), moji("¯\\_(ツ)_/¯", W1252),
    moji("✔ No problems", W1252), moji("ℵ ∑ √", W1252),
    # UTF-8 read as Latin-1 (C1 controls left in)
    moji("“quoted”", "latin-1"), moji("it’s", "latin-1"), moji("em—dash", "latin-1"), moji("😀", "latin-1"),
    moji("café", "latin-1"), moji("Привет мир", "latin-1"), moji("日本語", "latin-1"),
    # the other encodings ftfy tries
    moji("žluťoučký kůň", "sloppy-windows-1250"), moji("Привет мир", "sloppy-windows-1251"),
    moji("“quoted”", "sloppy-windows-1251"), moji("Ελληνικά", "sloppy-windows-1253"),
    moji("İstanbul ğüşıöç", "sloppy-windows-1254"), moji("Ķīļ ģērbonis", "sloppy-windows-1257"),
    moji("Zażółć gęślą", "iso-8859-2"), moji("café crème", "macroman"), moji("“quoted”", "macroman"),
    moji("café naïve", "cp437"), moji("Привет", "cp437"),
    # mojibake of mojibake
    moji(moji("café", W1252), W1252), moji(moji("über", W1252), W1252), moji(moji("“", W1252), W1252),
    moji(moji(moji("café", W1252), W1252), W1252), moji(moji("Привет", "sloppy-windows-1251"), W1252),
    moji(moji("😀", W1252), "latin-1"),
    # characters lost to U+FFFD or '?', and a lone U+FFFD or SUB
    "\u00e2\u20ac\u0153 like this \u00e2\u20ac\ufffd", "caf\u00c3?", "\u00c3\u00a9\ufffd and \u00e2\u20ac\ufffd",
    moji("😀", W1252)[:3] + "\ufffd", "a\ufffdb", "a\x1ab \u00c3\u00a9",
    # CESU-8 and Java's C0 80 for U+0000
    cesu8("😀 smile").decode("latin-1"), cesu8("😀 smile").decode(W1252), "a\u00c0\x80b \u00c3\u00a9",
    # C1 controls alone
    "\x93quoted\x94", "\x80\x81\x8d abc", "price \x80 5",
    # mojibake inside good text (decode_inconsistent_utf8)
    "café and caf\u00c3\u00a9", "naïve " + moji("naïve", W1252), "日本語 " + moji("日本語", W1252),
    "“real” and " + moji("“fake”", W1252), "caf\u00c3\u00a9 — " + moji("über", "latin-1"),
    # its utf-8-variants codec's reading of a final "\n" (C0 0A, and a CESU-8 pair's last byte)
    "caf\u00c3\u00a9 \u00c0\n", "caf\u00c3\u00a9 \u00c0\nxyz", "\u00ed\xa0\x80\u00ed\u00b0\n",
    # lines, entities and other fixes around it
    "line one caf\u00c3\u00a9\nline two \u00c3\u00bcber\n", "caf\u00c3&copy; &amp; cr\u00c3&uml;me",
    "&lt;b&gt;caf\u00c3\u00a9", "<b>caf\u00c3\u00a9 &amp;</b>", moji("ﬁne ＬＯＵＤ", W1252),
    moji("“curly”\r\n", W1252),
    # text to leave alone
    "naïve café", "résumé façade", "Straße", "Ελληνικά κείμενα", "Привет мир", "日本語のテキスト", "中文",
    "한국어", "😀🐱🚀", "👩‍👩‍👧 🇫🇷 ❤️", "ASCII only text", "", " ", "¯\\_(ツ)_/¯", "(╯°□°)╯︵ ┻━┻",
    "ᕙ(⇀‸↼‶)ᕗ", "ಠ_ಠ", "100°C", "½ cup", "© 2024 – all rights — reserved", "5€ or £5", "×2", "Ø 5mm",
    "Åland", "São Paulo", "NO-BREAK\xa0SPACE", "\u00c3", "\u00c2", "Ã©", "cafe\u0301", "ǅemal ĳssel",
]

TOKEN_PROMPTS = [
    moji("a photo of a café in Paris, “golden hour”", W1252),
    moji("a cat’s face — watercolor", "latin-1"),
    moji("Привет мир, oil painting", "sloppy-windows-1251"),
    moji(moji("crème brûlée on a plate", W1252), W1252),
    "an astronaut " + moji("😀", W1252) + " riding a horse",
]


def random_texts(n, seed):
    """Texts in many scripts, mostly garbled: a random encoding, sometimes twice, partly, with
    NBSPs made spaces, bytes lost to U+FFFD, or a trailing line break."""
    rng = random.Random(seed)
    words = ["café", "naïve", "résumé", "Straße", "über", "à la", "señor", "voilà", "“quoted”", "it’s",
             "—", "…", "€100", "£5", "日本語", "中文", "한국어", "Привет", "Ελληνικά", "שלום", "مرحبا",
             "हिन्दी", "😀", "🐱🚀", "ñ", "ç", "ø", "Å", "×", "½", "°C", "™", "®", "©", "•", "\xa0", "ąę",
             "łódź", "ğüşıöç", "žluťoučký", "Ķīļ", "ﬁ", "ＡＢ", "a", "the", "photo", "of", " ", "-", "'"]
    encodings = chardata.CHARMAP_ENCODINGS + ["windows-1252", "cp850"]

    def garble(s):
        enc = rng.choice(encodings)
        t = s.encode("utf-8").decode(enc, errors="replace")
        r = rng.random()
        if r < 0.1:
            t = t.replace("\xa0", " ")
        elif r < 0.15:
            t = garble(t)
        elif r < 0.25:
            k = rng.randint(0, len(s))
            t = s[:k] + garble(s[k:])
        elif r < 0.3:
            t = t.replace("\x9d", "\ufffd").replace("\x81", "?")
        elif r < 0.33:
            t += "\n"
        return t

    out = []
    for _ in range(n):
        s = "".join(rng.choice(words) + rng.choice(["", " "]) for _ in range(rng.randint(1, 6)))
        out.append(s if rng.random() < 0.15 else garble(s))
    return out


def badness_alternatives():
    """The top-level alternatives of ftfy's BADNESS_RE (a verbose pattern without groups)."""
    src = badness.BADNESS_RE.pattern
    assert "(" not in src
    alts, cur, i, in_class = [], "", 0, False
    while i < len(src):
        c = src[i]
        if c == "\\":
            cur += src[i:i + 2]
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "#":
            while i < len(src) and src[i] != "\n":
                i += 1
            continue
        elif c == "|":
            alts.append(cur)
            cur, i = "", i + 1
            continue
        cur += c
        i += 1
    return [a for a in alts + [cur] if a.strip()]


def atoms(alt):
    """An alternative as a list of (pool of characters, optional); pool None is the '^' anchor."""
    out, i = [], 0
    while i < len(alt):
        c = alt[i]
        if c in " \t\n":
            i += 1
            continue
        if c == "[":
            j = alt.index("]", i + 2)
            while alt[j - 1] == "\\":
                j = alt.index("]", j + 1)
            text, i = alt[i:j + 1], j + 1
        elif c == "\\":
            text, i = alt[i:i + 2], i + 2
        elif c == "?":
            out[-1] = (out[-1][0], True)
            i += 1
            continue
        elif c == "^":
            out.append((None, False))
            i += 1
            continue
        else:
            text, i = re.escape(c) if c != "." else ".", i + 1
        pool = re.findall(text, ALL)
        if len(pool) > 5000:  # '.', '\w', '[^A-Za-z]': a sample will do
            pool = random.Random(len(pool)).sample(pool, 400) + re.findall(text, " aZ0_.é\n\t中")
        out.append((pool, False))
    return out


def badness_cases(per_alt, seed):
    """Strings that each alternative of BADNESS_RE matches, in random context, and near misses."""
    rng = random.Random(seed)
    context = sorted(set(re.findall("[" + "".join(badness.MOJIBAKE_CATEGORIES.values()) + "]", ALL)) | set("ab Z.\n"))
    positives, negatives = [], []
    alts = badness_alternatives()
    for alt in alts:
        seq = atoms(alt)
        for _ in range(per_alt):
            core = ""
            anchored = seq[0][0] is None
            for pool, optional in seq:
                if pool is not None and not (optional and rng.random() < 0.5):
                    core += rng.choice(pool)
            before = "" if anchored else "".join(rng.choice(context) for _ in range(rng.randint(0, 2)))
            s = before + core + "".join(rng.choice(context) for _ in range(rng.randint(0, 2)))
            assert re.search(alt, s, re.VERBOSE), (alt, s)
            positives.append(s)
            miss = list(s)
            for _ in range(4):
                k = rng.randrange(len(miss))
                miss[k] = rng.choice(context)
                if not badness.is_bad("".join(miss)):
                    negatives.append("".join(miss))
                    break
    return len(alts), positives + negatives


def js(s):
    return json.dumps(s, ensure_ascii=True)


def lines():
    out = []
    seen = set()
    hand = [s for s in HAND if not (s in seen or seen.add(s))]
    for s in hand + random_texts(300, 7):
        out.append("fix_text\t%s\t%s" % (js(s), js(ftfy.fix_text(s))))
        out.append("fix_encoding\t%s\t%s" % (js(s), js(ftfy.fix_encoding(s))))
    n_alts, cases = badness_cases(12, 11)
    for s in cases:
        out.append("is_bad\t%s\t%d" % (js(s), badness.is_bad(s)))
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import clip_tokenizer_golden as clip  # noqa: E402 (beside this script)
    assert clip.ftfy is not None and clip.FIX_ENCODING
    tok = clip.ClipTokenizer(clip.DEFAULT_VOCAB)
    for p in TOKEN_PROMPTS:
        n, ids = tok.tokenize(p)
        out.append("tokens\t%s\t%d\t%s" % (js(p), n, " ".join(map(str, ids))))
    header = [
        "# ftfy golden outputs: tools/ftfy_golden.py (ftfy %s, Python %s, Unicode %s)."
        % (ftfy.__version__, sys.version.split()[0], unicodedata.unidata_version),
        "# %d hand-picked texts first, then 300 random ones; is_bad of strings from each of the %d"
        % (len(hand), n_alts),
        "# alternatives of ftfy's BADNESS_RE and near misses; CLIP ids of mojibake prompts.",
        "# Lines: fix_text|fix_encoding <TAB> input <TAB> ftfy's output (JSON strings);",
        "#        is_bad <TAB> input <TAB> 0|1;  tokens <TAB> prompt <TAB> count <TAB> 77 ids.",
    ]
    return header, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = ap.parse_args()
    header, body = lines()
    if args.check:
        with open(args.out, encoding="utf-8") as f:
            stored = [line.rstrip("\n") for line in f if not line.startswith("#")]
        diff = [(a, b) for a, b in zip(body, stored) if a != b]
        for a, b in diff[:20]:
            print("differs:\n  now    %s\n  stored %s" % (a, b))
        print("%d of %d lines differ%s" % (len(diff), len(body), "" if len(body) == len(stored) else
                                           " (%d now, %d stored)" % (len(body), len(stored))))
        sys.exit(1 if diff or len(body) != len(stored) else 0)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(header + body) + "\n")
    print("wrote %d lines to %s" % (len(body), os.path.relpath(args.out)))


if __name__ == "__main__":
    main()
