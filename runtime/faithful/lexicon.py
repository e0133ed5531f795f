"""The target-language lexicon of a model bundle, and the non-words of a translation: words that are in
no dictionary, not copied from the source and not protected (written by `model.lexicon`).

A model that spells words piece by piece can write words that exist in no language (`Hanllo`,
`Desmuto`, `Teclastrocos`, `cableableableableados`). The lexicon holds every form of Debian's
hunspell-es dictionaries (expanded with their affix rules, lowercased); a word is known when it is in
it, or when it is a verb form that may carry enclitic pronouns followed by such pronouns, spelled with
the accent the stress then needs (`vuélvelo`, `muéstramelo`, `guardémonos`, `sentaos`: forms that the
affix data lacks). The enclitic forms the rule rebuilds are left out of the file, which keeps it small.
The rule only ever applies to the hosts a file marks: a lexicon of another language marks none.

The other languages' files (hunspell-fr, -de-de, -it, -pt-br) are the same kind of word list. German
writes compounds that no dictionary lists (Dateiverwaltungsprogramm); its file marks the forms that
de_DE.aff lets begin (`b`), continue (`m`) or end (`e`) a compound, and a word is also known when it
splits into a first and a last part, or a first, a middle and a last one, each at least `min` letters
long (the header's `compound`): an approximation of hunspell's compounding, which allows any number of
middle parts and checks capitals. A file may also carry its affix file's ICONV pairs (fr.aff: ’ is '),
applied to a word before it is looked up. French and Italian elided particles are a rule too (the
header's `elision`: `l'` before any known word, Italian's only before a vowel or h), not one form per
particle. Two ways of writing fewer lines rebuild exactly the words they leave out: a stem followed by
each ending of one of the header's `tails` classes (Italian enclitics: guardar + lo, la, ne, ...), and a
hyphenated form, known when every part is a word or a part marked `h` (pt_BR: desprestigiá-las-ia).

File format: gzip-compressed text. The first line is a JSON header (`format`, `command`, `words`,
`hosts`; optional `compound`: {"min": N}, `iconv`: [[from, to], ...], `elision`: {particle: initials},
`tails`: [[ending, ...], ...], `hyphenated`: N); every other line is a word,
sorted, with a trailing `*` when it is a host (a verb form that may carry enclitic pronouns: infinitive,
gerund, imperative or subjunctive by its ending), and a tab and its compound roles when it is a compound
part (`b`, `m`, `e`), a stem of the tails class it names (`0`-`9`, `A`-`Z`) or a part of hyphenated
words (`h`); `o`: no word by itself.

In memory the words are kept as sorted 64-bit hashes (8 bytes a word, about 8 MB, where a set of
Python strings would take some 60 MB); that an invented word shares a hash with a known one is a
chance of about 1 in 10^13.
"""

from __future__ import annotations

import gzip
import json
import re
import unicodedata
from collections.abc import Collection, Container, Iterable, Sequence
from pathlib import Path

import numpy as np

from runtime.faithful.spans import find_spans

__all__ = [
    "FORMAT",
    "LEXICON_FILE",
    "Lexicon",
    "guard_reason",
    "is_enclitic_host",
    "is_guard_note",
    "non_word_rate",
    "non_words",
    "read_lexicon",
    "write_lexicon",
]

FORMAT = "lexicon/1"
LEXICON_FILE = "lexicon.txt.gz"  # in a model directory (model.lexicon writes it) and in its bundle (export)
HOST_MARK = "*"
PART_MARK = "\t"  # before a line's roles: compound part (b, m, e), stem of a class of tails (0-9)
ONLY_IN_COMPOUND = "o"  # the line is no word by itself: a compound part, a stem, a hyphen part only
IN_HYPHENATED = "h"  # a part of a hyphenated word (pt_BR's enclitics: desprestigiá-las-ia)
_CLASSES = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # the roles naming a class of tails, in order

# Enclitic pronouns in their order (se, then 2nd person, then 1st, then 3rd): dáselo, guardártelo.
_CHAIN = re.compile(r"(?:se)?(?:te|os)?(?:me|nos)?(?:lo|la|le|los|las|les)?$")
_ENCLITICS = ("se", "te", "os", "me", "nos", "lo", "la", "le", "los", "las", "les")
# Endings of the verb forms pronouns attach to: infinitive (-r), gerund (-ndo), imperative and
# subjunctive (-a, -e, -an, -en, haz, pon, sal, di), nosotros (-mos, which drops its s), vosotros (-d).
_HOST = re.compile(r"(?:r|ndo|[aeiáéí]|n|mos|d|z|l)$")

_STRONG = set("aeoáéóíú")  # an accented i/u is a vowel of its own (hiatus: oír, reírse)
_VOWELS = _STRONG | set("iuü")
_PLAIN = str.maketrans("áéíóú", "aeiou")
_ACUTE = {"a": "á", "e": "é", "i": "í", "o": "ó", "u": "ú"}
# A token: word characters with inner apostrophes and hyphens (the model's `e-mail`); one with a digit or
# an underscore is an identifier or a number, never a word to check.
WORD = re.compile(r"\w+(?:['’-]\w+)*")
_NOT_A_WORD = re.compile(r"[\d_]")


def is_enclitic_host(form: str) -> bool:
    """Whether a verb form may carry enclitic pronouns, by its ending (the builder asks it of verb forms
    only)."""
    return bool(_HOST.search(form))


def _nuclei(word: str) -> list[tuple[int, int]]:
    """The syllable nuclei of a word, (start, end) each: runs of vowels split between strong ones; a
    `u` after q/g before e/i is silent (que, guiar)."""
    out: list[tuple[int, int]] = []
    strong = False
    prev = -2
    for i, ch in enumerate(word):
        if ch not in _VOWELS:
            continue
        if ch == "u" and i > 0 and word[i - 1] in "qg" and i + 1 < len(word) and word[i + 1] in "eéií":
            continue
        if prev == i - 1 and out and not (ch in _STRONG and strong):
            out[-1] = (out[-1][0], i + 1)
            strong = strong or ch in _STRONG
        else:
            out.append((i, i + 1))
            strong = ch in _STRONG
        prev = i
    return out


def _stressed(word: str, nuclei: list[tuple[int, int]]) -> int:
    """Index of the stressed nucleus: the accented one, else the penultimate when the word ends in a
    vowel, n or s, else the last."""
    for k, (a, b) in enumerate(nuclei):
        if any(ch in "áéíóú" for ch in word[a:b]):
            return k
    if len(nuclei) < 2:
        return 0
    return len(nuclei) - 2 if word[-1] in "aeiouns" else len(nuclei) - 1


def with_enclitics(host: str, pronouns: str) -> str:
    """How `host` + `pronouns` is spelled: the nosotros form drops its s before nos/se (guardémonos),
    the vosotros form its d before os (sentaos); the stress stays where it was, and takes a written
    accent when it no longer falls on the penultimate syllable (guárdalo, dámelo, guardármelo; dele,
    estate) or sits on an i/u in hiatus (oírlo)."""
    nuclei = _nuclei(host)
    if not nuclei:
        return host + pronouns
    k = _stressed(host, nuclei)
    base = host
    if host.endswith("mos") and pronouns.startswith(("nos", "se")):
        base = host[:-1]
    elif host.endswith("d") and pronouns.startswith("os"):
        base = host[:-1]
    word = base + pronouns
    joined = _nuclei(word)
    if k >= len(joined):
        return word
    a, b = joined[k]
    accented = [i for i in range(a, b) if word[i] in "áéíóú"]
    hiatus = accented and word[accented[0]] in "íú"
    plain = word.translate(_PLAIN)
    if k == len(joined) - 2 and not hiatus:
        return plain
    if accented:
        at = accented[0]
    else:
        strong = [i for i in range(a, b) if plain[i] in "aeo"]
        at = strong[0] if strong else b - 1
    return plain[:at] + _ACUTE.get(plain[at], plain[at]) + plain[at + 1 :]


def _hash(words: Iterable[str]) -> np.ndarray:
    """Sorted unique 64-bit hashes: Python's own string hash, fast, and only ever compared within the
    process that computed it (the file holds the words)."""
    return np.unique(np.fromiter((hash(w) for w in words), dtype=np.int64))


class Lexicon:
    """Known words (any case) of a language: `word in lexicon`. `parts` maps compound parts to their
    roles (`b` first, `m` middle, `e` last), each at least `compound_min` letters; `iconv` are the
    replacements made in a word before it is looked up."""

    def __init__(
        self,
        words: Iterable[str],
        hosts: Iterable[str] = (),
        parts: dict[str, str] | None = None,
        compound_min: int = 3,
        iconv: Sequence[tuple[str, str]] = (),
        elision: dict[str, str] | None = None,
        tails: Sequence[Sequence[str]] = (),
    ) -> None:
        self._words = _hash(w.lower() for w in words)
        self._hosts = _hash(w.lower() for w in hosts)
        parts = parts or {}
        self._begin, self._middle, self._end = (
            _hash(w.lower() for w, roles in parts.items() if role in roles) for role in "bme"
        )
        # a stem per class of tails (roles: its number), and the stems of any class for each tail
        self._stems = [
            _hash(w.lower() for w, roles in parts.items() if _CLASSES[k] in roles) for k in range(len(tails))
        ]
        self._tails = [(t, k) for k, ends in enumerate(tails) for t in ends]
        self._hyphen = _hash(w.lower() for w, roles in parts.items() if IN_HYPHENATED in roles)
        self.compound_min = compound_min
        self._iconv = [(a, b) for a, b in iconv if a != b]
        # A particle ends at its one apostrophe, so at most one fits the start of a word.
        self._elision = sorted((elision or {}).items())
        if self._elision:  # as hunspell does, ’ is read as ' where the dictionary writes '
            self._iconv.append(("’", "'"))
        self.size = int(self._words.size)

    @staticmethod
    def _has(table: np.ndarray, word: str) -> bool:
        if not table.size:
            return False
        key = hash(word)
        i = int(np.searchsorted(table, key))
        return i < table.size and table[i] == key

    def __contains__(self, word: object) -> bool:
        if not isinstance(word, str):
            return False
        w = unicodedata.normalize("NFC", word)
        for a, b in self._iconv:
            w = w.replace(a, b)
        w = w.lower()
        if self._known(w):
            return True
        for particle, initials in self._elision:
            rest = w[len(particle) :]
            if w.startswith(particle) and rest and (not initials or rest[0] in initials):
                return self._known(rest)
        return False

    def _known(self, w: str) -> bool:
        if "-" in w.strip("-") and self._hyphen.size:
            parts = [p for p in w.split("-") if p]
            return all(self._has(self._hyphen, p) or self._known(p) for p in parts)
        if self._has(self._words, w) or self.enclitic_host(w) is not None or self.compound(w) is not None:
            return True
        return any(w.endswith(t) and self._has(self._stems[k], w[: -len(t)]) for t, k in self._tails)

    def compound(self, word: str) -> tuple[str, ...] | None:
        """The parts a lowercase word splits into as a compound (first + last, or first + middle + last;
        the first split found, shortest first part first), or None."""
        if not self._end.size:
            return None
        least, n = self.compound_min, len(word)
        for i in range(least, n - least + 1):
            head = word[:i]
            if not self._has(self._begin, head):
                continue
            if self._has(self._end, word[i:]):
                return head, word[i:]
            for j in range(i + least, n - least + 1):
                if self._has(self._middle, word[i:j]) and self._has(self._end, word[j:]):
                    return head, word[i:j], word[j:]
        return None

    def enclitic_host(self, word: str) -> str | None:
        """The verb form `word` is made of, followed by enclitic pronouns it spells correctly (vuélvelo ->
        vuelve), or None."""
        for cut in range(len(word) - 2, max(len(word) - 10, 0), -1):
            pronouns = word[cut:]
            if not pronouns.startswith(_ENCLITICS) or not _CHAIN.match(pronouns):
                continue
            stem = word[:cut]
            plain = stem.translate(_PLAIN)
            for host in {stem, plain, plain + "s", plain + "d", stem + "s", stem + "d"}:
                if self._has(self._hosts, host) and with_enclitics(host, pronouns) == word:
                    return host
        return None


def write_lexicon(
    path: Path,
    words: Collection[str],
    hosts: Collection[str],
    header: dict,
    parts: dict[str, str] | None = None,
    iconv: Sequence[tuple[str, str]] = (),
    compound_min: int = 3,
    elision: dict[str, str] | None = None,
    tails: Sequence[str] = (),
    hyphenated: bool = False,
) -> int:
    """Write the words (hosts marked) and the compound parts (with their roles), leaving out the
    enclitic forms the reader's rule rebuilds from the hosts; returns the file's size in bytes. The same
    words give the same bytes (committed)."""
    hosts, parts = set(hosts), parts or {}
    rule = Lexicon((), hosts)
    kept = sorted(w for w in words if w in hosts or rule.enclitic_host(w) is None)
    # A hyphenated form is left out, its parts kept: pt_BR.dic writes its enclitic pronouns so
    # (desprestigiá-las-ia), 7.7 million forms; the reader accepts a word whose parts are all known.
    hyphen: set[str] = set()
    if hyphenated and any("-" in w.strip("-") for w in kept):
        joined = [w for w in kept if "-" in w.strip("-")]
        known = set(kept)
        hyphen = {p for w in joined for p in w.split("-") if p and p not in known}
        cut = set(joined)
        kept = [w for w in kept if w not in cut]
    classes, stems = tail_classes(kept, tails) if tails else ([], {})
    if stems:
        rebuilt = {s + t for s, k in stems.items() for t in classes[k]}
        kept = [w for w in kept if w not in rebuilt]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    head = {"format": FORMAT, **header, "words": len(kept), "hosts": len(hosts), "expanded": len(words)}
    if parts:
        head["compound"] = {"min": compound_min, "parts": len(parts)}
    if iconv:
        head["iconv"] = [list(pair) for pair in iconv]
    if elision:
        head["elision"] = dict(sorted(elision.items()))
    if stems:
        head["tails"] = classes
    if hyphen:
        head["hyphenated"] = len(hyphen)
    lines = {w: w + (HOST_MARK if w in hosts else "") for w in kept}
    marks = dict(parts)
    for p in hyphen:
        marks[p] = marks.get(p, "") + IN_HYPHENATED
    for s, k in stems.items():
        marks[s] = marks.get(s, "") + _CLASSES[k]
    for w, roles in marks.items():
        only = "" if w in lines else ONLY_IN_COMPOUND
        lines[w] = lines.get(w, w) + PART_MARK + roles + only
    with tmp.open("wb") as f, gzip.GzipFile("", "wb", compresslevel=9, fileobj=f, mtime=0) as raw:
        raw.write((json.dumps(head, ensure_ascii=False) + "\n").encode())
        raw.write("".join(lines[w] + "\n" for w in sorted(lines)).encode())
    tmp.replace(path)
    return path.stat().st_size


def tail_classes(words: Iterable[str], tails: Sequence[str]) -> tuple[list[list[str]], dict[str, int]]:
    """The sets of `tails` that follow many stems in `words` (at most 10: infinitive and gerund take all
    of them, an imperative some), and the stems whose tails in `words` are exactly one such set, with
    its number. The file writes such a stem, marked, and none of its words: the reader rebuilds exactly
    them."""
    index = {t: i for i, t in enumerate(sorted(set(tails)))}
    by_length: dict[int, set[str]] = {}
    for t in index:
        by_length.setdefault(len(t), set()).add(t)
    found: dict[str, int] = {}  # stem -> bitmask of the tails that follow it
    for w in words:
        for n, ends in by_length.items():
            if len(w) > n and w[-n:] in ends:
                found[w[:-n]] = found.get(w[:-n], 0) | 1 << index[w[-n:]]
    # the sets that save the most lines: each stem in one saves as many lines as the set has tails
    saving: dict[int, int] = {}
    for mask in found.values():
        saving[mask] = saving.get(mask, 0) + mask.bit_count() - 1
    best = sorted((m for m in saving if m.bit_count() >= 4), key=lambda m: (-saving[m], m))[: len(_CLASSES)]
    classes = [[t for t, i in index.items() if mask >> i & 1] for mask in best]
    number = {mask: k for k, mask in enumerate(best)}
    return classes, {stem: number[mask] for stem, mask in found.items() if mask in number}


def read_lexicon(path: Path) -> Lexicon:
    """The Lexicon of a file. ValueError names the file when it is not a lexicon."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        header = json.loads(f.readline() or "{}")
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ValueError(f"{path}: not a lexicon (want format {FORMAT!r} in its first line)")
        lines = f.read().split("\n")
    compound = header.get("compound") or {}
    iconv = [(a, b) for a, b in header.get("iconv", [])]
    elision = header.get("elision") or {}
    tails = header.get("tails") or []
    if not compound and not tails and not header.get("hyphenated"):  # a plain word list (Spanish: with hosts)
        words = [w.rstrip(HOST_MARK) for w in lines if w]
        hosts = (w[:-1] for w in lines if w.endswith(HOST_MARK))
        return Lexicon(words, hosts, iconv=iconv, elision=elision)
    words, hosts, parts = [], [], {}
    for line in lines:
        w, _, roles = line.partition(PART_MARK)
        if not w:
            continue
        if roles:
            parts[w.rstrip(HOST_MARK)] = roles
        if ONLY_IN_COMPOUND not in roles:
            words.append(w.rstrip(HOST_MARK))
        if w.endswith(HOST_MARK):
            hosts.append(w[:-1])
    return Lexicon(words, hosts, parts, int(compound.get("min", 3)), iconv, elision, tails)


def non_words(
    source: str,
    output: str,
    lexicon: Lexicon,
    allowed: Container[str] = frozenset(),
) -> list[str]:
    """The words of `output` that are neither in the lexicon nor copied from `source` (any case) nor
    inside a protected span of the output (placeholders, markup, URLs, paths, numbers, CamelCase names:
    runtime.faithful.spans) nor in `allowed` (lowercase words: translation-memory or glossary targets,
    do-not-translate terms), in order of appearance. Tokens with a digit or an underscore, single
    letters and acronyms (all capitals: EAU, PPP, XOF) count as fine: no spelling to invent there."""
    # NFC first: a model can spell ó as o + a combining accent, which would cut the word in two.
    source, output = unicodedata.normalize("NFC", source), unicodedata.normalize("NFC", output)
    copied = {p.lower() for w in WORD.findall(source) for p in (w, *re.split(r"['’-]", w)) if p}
    spans = find_spans(output)
    out = []
    for m in WORD.finditer(output):
        w = m.group()
        if len(w) < 2 or w.isupper() or _NOT_A_WORD.search(w) or _fine(w, copied, allowed, lexicon):
            continue
        if any(s.start <= m.start() and m.end() <= s.end for s in spans):
            continue
        parts = [p for p in re.split(r"['’-]", w) if p]
        if len(parts) > 1 and all(_fine(p, copied, allowed, lexicon) or p.isupper() for p in parts):
            continue
        out.append(w)
    return out


def _fine(word: str, copied: Container[str], allowed: Container[str], lexicon: Lexicon) -> bool:
    low = word.lower()
    return low in copied or low in allowed or word in lexicon


# The lexical guard's notes say this (server/engine/faithful.py writes them, bench.evaluate counts them).
_GUARD_NOTE = "is in no dictionary"


def guard_reason(word: str, used: int | None, beam: int = 0) -> str:
    """The note of a segment whose best hypothesis holds `word`, a word in no dictionary: hypothesis
    `used` (1-based; of a wider beam when `beam`) was taken instead, or None: none was without one."""
    if used is None:
        return f"{word!r} {_GUARD_NOTE}; no hypothesis without such a word"
    wider = f" of a beam of {beam}" if beam else ""
    return f"{word!r} {_GUARD_NOTE}; used hypothesis {used}{wider}"


def is_guard_note(reason: str, used: bool) -> bool:
    """Whether a note's reason is the lexical guard's, having used another hypothesis (used) or not."""
    return _GUARD_NOTE in reason and ("used hypothesis" in reason.rsplit(_GUARD_NOTE, 1)[1]) == used


def non_word_rate(pairs: Sequence[tuple[str, str]], lexicon: Lexicon) -> dict:
    """Share of outputs with at least one non-word, over (source, output) pairs: count, percent, and a
    few examples."""
    hits = [(s, o, non_words(s, o, lexicon)) for s, o in pairs]
    bad = [(o, nw) for _, o, nw in hits if nw]
    return {
        "n": len(pairs),
        "count": len(bad),
        "percent": round(100.0 * len(bad) / max(len(pairs), 1), 2),
        "examples": [w for _, nw in bad[:20] for w in nw[:1]],
    }
