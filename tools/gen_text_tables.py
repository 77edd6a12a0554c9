#!/usr/bin/env python3
"""Generates the Unicode and HTML tables of the CLIP tokenizer (src/text/).

    python3 tools/gen_text_tables.py     # rewrites src/text/unicode_tables.c and html_entities.c

Run it with Debian 12's /usr/bin/python3 and python3-regex (`apt-get install python3-regex`)
to reproduce the committed files byte for byte; another Python or regex version gives the
tables of its own Unicode version.

Every table is taken from the behaviour the tokenizer must match, not from a description:

  * the character classes of OpenAI's pre-tokenizer regex are read from the `regex` module
    itself, with the pattern's flag (IGNORECASE): [\\p{L}], [\\p{N}], \\s, and the code points
    that none of its alternatives match (U+0345, which folds to a letter, is one);
  * lower-casing is Python's str.lower(), including its Final_Sigma rule, whose "cased" and
    "case-ignorable" properties are read from str.lower() on probe strings;
  * NFC (ftfy normalises to NFC) from unicodedata: canonical decompositions, combining classes,
    and the compositions NFC actually performs (a decomposition whose result NFC keeps);
  * html.unescape's tables (html.entities.html5, html._invalid_charrefs,
    html._invalid_codepoints) and ftfy's extra upper-case entity names, built by ftfy's rule
    (a lower-case name ending in ';', upper-cased, that html.unescape leaves alone).
"""
import html
import html.entities
import os
import re
import sys
import unicodedata

import regex

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MAX = 0x110000

# Classes, in the order the tokenizer's regex tries them (see src/text/text_tables.h).
OTHER, LETTER, NUMBER, SPACE, NONE = 0, 1, 2, 3, 4
CASED, CASE_IGNORABLE, DIGIT = 8, 16, 32


def code_points():
    return (c for c in range(MAX) if not 0xD800 <= c <= 0xDFFF)


def regex_class(ch, letter, number, other, space):
    if letter.match(ch):
        return LETTER
    if number.match(ch):
        return NUMBER
    if other.match(ch):
        return OTHER
    return SPACE if space.match(ch) else NONE


def case_class(ch):
    # CPython lowers U+03A3 to final sigma when a cased letter precedes it (skipping
    # case-ignorable ones) and none follows. Probes: 'A' c 'Σ' ends in ς when c is
    # case-ignorable or cased; 'AΣ' c keeps σ when c is cased and not case-ignorable.
    if ch == "\u03a3":
        return CASED
    final_after = ("A" + ch + "\u03a3").lower()[-1] == "\u03c2"
    sigma_before = ("A\u03a3" + ch).lower()[1] == "\u03c3"
    if sigma_before:
        return CASED
    return CASE_IGNORABLE if final_after else 0


def props_table():
    flags = regex.IGNORECASE
    letter = regex.compile(r"[\p{L}]", flags)
    number = regex.compile(r"[\p{N}]", flags)
    other = regex.compile(r"[^\s\p{L}\p{N}]", flags)
    digit = re.compile(r"\d")  # Python's re, as ftfy's terminal-escape pattern uses it
    space = regex.compile(r"\s")  # whitespace_clean's pattern has no flags
    space_i = regex.compile(r"\s", flags)
    out, prev = [], None
    for c in range(MAX):
        if 0xD800 <= c <= 0xDFFF:
            v = OTHER  # never looked up: UTF-8 cannot hold surrogates
        else:
            ch = chr(c)
            assert bool(space.match(ch)) == bool(space_i.match(ch))
            v = regex_class(ch, letter, number, other, space) | case_class(ch)
            if digit.match(ch):
                v |= DIGIT
            # str.isspace(), used by strip(), is \s plus U+001C..U+001F (the tokenizer
            # codes that difference; check it still holds).
            assert ch.isspace() == (bool(space.match(ch)) or 0x1C <= c <= 0x1F), hex(c)
        if v != prev:
            out.append((c, v))
            prev = v
    return out


def check_case_insensitive_literals():
    # The contractions and special tokens are matched with IGNORECASE after lower-casing:
    # besides the lower-case letter itself only U+017F (long s) matches one of them.
    extra = {}
    for a in "startofextendlvm'<|>":
        same = [c for c in code_points() if regex.match(regex.escape(a), chr(c), regex.IGNORECASE)]
        extra[a] = [c for c in same if c not in (ord(a), ord(a.upper()))]
    assert extra["s"] == [0x17F] and all(not v for k, v in extra.items() if k != "s"), extra


def lower_runs():
    pairs = []
    for c in code_points():
        low = chr(c).lower()
        if c == 0x130:
            assert low == "i\u0307"  # the one multi-character lower-case mapping, coded by hand
            continue
        assert len(low) == 1, hex(c)
        if ord(low) != c and c != 0x3A3:  # U+03A3 depends on context: coded by hand
            pairs.append((c, ord(low) - c))
    runs = []  # (start, count, stride, delta)
    i = 0
    while i < len(pairs):
        start, delta = pairs[i]
        count, stride = 1, 0
        j = i + 1
        if j < len(pairs) and pairs[j][1] == delta and pairs[j][0] - start in (1, 2):
            stride = pairs[j][0] - start
            while j < len(pairs) and pairs[j][1] == delta and pairs[j][0] == start + count * stride:
                count += 1
                j += 1
        runs.append((start, count, stride or 1, delta))
        i = j
    return runs


def nfc_tables():
    decomps, comps, ccc = [], [], []
    for c in code_points():
        d = unicodedata.decomposition(chr(c))
        if d and not d.startswith("<"):
            parts = [int(x, 16) for x in d.split()]
            assert len(parts) in (1, 2)
            # NFC recomposes a pair only when the character is not excluded from
            # composition: exactly when NFC leaves the character as it is.
            composes = len(parts) == 2 and unicodedata.normalize("NFC", chr(c)) == chr(c)
            decomps.append((c, parts[0], parts[1] if len(parts) == 2 else 0))
            if composes:
                comps.append((parts[0], parts[1], c))
        k = unicodedata.combining(chr(c))
        if k:
            if ccc and ccc[-1][1] == c - 1 and ccc[-1][2] == k:
                ccc[-1] = (ccc[-1][0], c, k)
            else:
                ccc.append((c, c, k))
    comps.sort()
    return decomps, comps, ccc


def width_map():
    # ftfy's fix_character_width (chardata._build_width_map): U+3000 and the
    # halfwidth and fullwidth forms become their NFKC form.
    out = [(0x3000, " ")]
    for c in range(0xFF01, 0xFFF0):
        alt = unicodedata.normalize("NFKC", chr(c))
        if alt != chr(c):
            out.append((c, alt))
    return out


def c_string(s):
    return '"' + "".join("\\x%02x" % b for b in s.encode("utf-8")) + '"'


def c_name(s):
    assert s.replace(";", "").isalnum() and s.isascii()  # entity names need no escapes
    return '"' + s + '"'


def rows(items, per_line, indent="    "):
    lines = []
    for i in range(0, len(items), per_line):
        lines.append(indent + " ".join(items[i:i + per_line]))
    return "\n".join(lines)


def header(what):
    return ("// Generated by tools/gen_text_tables.py (Python %s, Unicode %s; regex module %s)\n"
            "// -- do not edit. %s\n" % (sys.version.split()[0], unicodedata.unidata_version,
                                        getattr(regex, "__version__", "?"), what))


def write_unicode(path):
    props = props_table()
    check_case_insensitive_literals()
    runs = lower_runs()
    decomps, comps, ccc = nfc_tables()
    widths = width_map()
    out = [header("Character classes, lower-casing and NFC data."),
           '#include "text/text_tables.h"\n',
           "// (first code point << 8) | class and case flags, for each run of equal values.",
           "const uint32_t dc_uc_props[] = {",
           rows(["0x%x," % (c << 8 | v) for c, v in props], 10),
           "};",
           "const int dc_uc_props_count = %d;\n" % len(props),
           "// Python's str.lower(): count code points from start, stride apart, move by delta.",
           "const dc_uc_case_run dc_uc_lower_runs[] = {",
           rows(["{0x%x, %d, %d, %d}," % r for r in runs], 5),
           "};",
           "const int dc_uc_lower_runs_count = %d;\n" % len(runs),
           "// Canonical decompositions {code point, first, second (0: a singleton)}, by code point.",
           "const dc_uc_triple dc_uc_decomps[] = {",
           rows(["{0x%x, 0x%x, 0x%x}," % d for d in decomps], 4),
           "};",
           "const int dc_uc_decomps_count = %d;\n" % len(decomps),
           "// The pairs NFC composes {first, second, result}, by (first, second).",
           "const dc_uc_triple dc_uc_comps[] = {",
           rows(["{0x%x, 0x%x, 0x%x}," % t for t in comps], 4),
           "};",
           "const int dc_uc_comps_count = %d;\n" % len(comps),
           "// Canonical combining classes other than 0 {first, last, class}.",
           "const dc_uc_triple dc_uc_ccc[] = {",
           rows(["{0x%x, 0x%x, %d}," % t for t in ccc], 4),
           "};",
           "const int dc_uc_ccc_count = %d;\n" % len(ccc),
           "// ftfy's fix_character_width: U+3000 and the halfwidth and fullwidth forms -> NFKC.",
           "const dc_uc_mapping dc_ftfy_width[] = {",
           rows(["{0x%x, %s}," % (c, c_string(v)) for c, v in widths], 4),
           "};",
           "const int dc_ftfy_width_count = %d;" % len(widths)]
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def write_html(path):
    html5 = sorted(html.entities.html5.items(), key=lambda kv: kv[0].encode())
    upper = {}
    for name, char in html.entities.html5.items():  # ftfy's rule, chardata._build_html_entities
        if name.endswith(";") and name == name.lower():
            entity = "&" + name.upper()
            if html.unescape(entity) == entity:
                upper[name.upper()] = char.upper()
    upper = sorted(upper.items(), key=lambda kv: kv[0].encode())
    bad_refs = sorted(html._invalid_charrefs.items())
    assert all(len(v) == 1 for _, v in bad_refs)
    bad_cps = []
    for c in sorted(html._invalid_codepoints):
        if bad_cps and bad_cps[-1][1] == c - 1:
            bad_cps[-1] = (bad_cps[-1][0], c)
        else:
            bad_cps.append((c, c))
    out = [header("HTML5 character references."),
           '#include "text/text_tables.h"\n',
           "// html.entities.html5: name (with its ';' where it has one) -> UTF-8, by name.",
           "const dc_text_entity dc_html5_entities[] = {",
           rows(["{%s, %s}," % (c_name(k), c_string(v)) for k, v in html5], 4),
           "};",
           "const int dc_html5_entities_count = %d;\n" % len(html5),
           "// ftfy's upper-case names (\"EACUTE;\" -> \"\\u00c9\"), by name.",
           "const dc_text_entity dc_ftfy_upper_entities[] = {",
           rows(["{%s, %s}," % (c_name(k), c_string(v)) for k, v in upper], 4),
           "};",
           "const int dc_ftfy_upper_entities_count = %d;\n" % len(upper),
           "// html.unescape's replacements for numeric references to C1 controls, 0 and CR.",
           "const uint32_t dc_html_invalid_charrefs[][2] = {",
           rows(["{0x%x, 0x%x}," % (k, ord(v)) for k, v in bad_refs], 6),
           "};",
           "const int dc_html_invalid_charrefs_count = %d;\n" % len(bad_refs),
           "// Code points html.unescape drops from numeric references {first, last}.",
           "const uint32_t dc_html_invalid_codepoints[][2] = {",
           rows(["{0x%x, 0x%x}," % r for r in bad_cps], 6),
           "};",
           "const int dc_html_invalid_codepoints_count = %d;" % len(bad_cps)]
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    write_unicode(os.path.join(ROOT, "src", "text", "unicode_tables.c"))
    write_html(os.path.join(ROOT, "src", "text", "html_entities.c"))
