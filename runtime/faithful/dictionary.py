"""Dictionary terms: the words and phrases that Debian's software catalogs seldom hold, translated as the
model's bilingual dictionaries give them (written by `model.dictionary_terms`, read by the text layer).

The model learns a word from the catalogs' many examples; a word that only the dictionaries teach it
(seen once an epoch) comes out garbled or in English: `Estoy buscando un pharmacy`, `El superbloque está
abierto` for `supermarket`, `Bien mañana` for `Good morning`. The bundle's `dictionary_terms.tsv` lists
the dictionary entries (one to four lowercase words) that fewer than a few catalog sources hold and that
the dictionaries translate one way only; the text layer masks such a word or phrase in a source, as it
masks a glossary term, and writes the dictionary's translation in its place. A request's glossary, the
translation memory and the do-not-translate terms come first.

Matching (`DictionaryTerms.find`): whole words, longest entry first, every word in lower case or
capitalised (`Pharmacy`, not `PHARMACY` or `iPhone`), only the first one capitalised, words joined by
single spaces, not part of a longer word (`café`, `naïve`) nor of a hyphenated or apostrophised one
(`follow-up`, `user's`). The translation is written as the dictionary has it (`viernes` for
`Friday`), with a capital first letter where the source's term is capitalised at the start of a text or
sentence (`Farmacia cerrada`).

File format: UTF-8 text; `#` lines are comments (the first says how it was made), every other line is
`phrase<TAB>translation`, the phrase in lower case.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = [
    "DICTIONARY_FILE",
    "MAX_WORDS",
    "TERM_WORD",
    "DictionaryTerms",
    "read_dictionary_terms",
    "write_dictionary_terms",
]

DICTIONARY_FILE = "dictionary_terms.tsv"  # in a model directory and in its bundle
MAX_WORDS = 4  # the longest phrase an entry may hold
TERM_WORD = re.compile(r"[A-Za-z]+")  # a word of an entry, in a text (model.dictionary_terms counts so too)
_JOINERS = "-'’_"  # a word next to one of these is part of a longer token (follow-up, user's, snake_case)


def _joined(ch: str) -> bool:
    """Whether a character next to a match makes it part of a longer word: a letter or digit the ASCII
    word pattern left out (`caf` of `café`), or a joiner."""
    return ch.isalnum() or ch in _JOINERS


def _plain_shape(word: str) -> bool:
    return word.islower() or (word[:1].isupper() and (len(word) == 1 or word[1:].islower()))


class DictionaryTerms:
    """The entries of a bundle's dictionary_terms.tsv: lowercase phrase -> translation."""

    def __init__(self, entries: Mapping[str, str]) -> None:
        self.entries = {" ".join(k.split()).lower(): v for k, v in entries.items() if k.strip() and v.strip()}
        self.max_words = max((len(k.split()) for k in self.entries), default=0)

    def __len__(self) -> int:
        return len(self.entries)

    def find(self, text: str) -> list[tuple[int, int, str]]:
        """(start, end, translation) of each entry found in `text`, in order, without overlaps."""
        if not self.entries:
            return []
        words = list(TERM_WORD.finditer(text))
        taken = [False] * len(words)
        found = []
        for n in range(min(self.max_words, len(words)), 0, -1):
            for i in range(len(words) - n + 1):
                span = words[i : i + n]
                if any(taken[i : i + n]) or not all(_plain_shape(w.group()) for w in span):
                    continue
                if any(w.group()[:1].isupper() for w in span[1:]):
                    continue
                if any(text[a.end() : b.start()] != " " for a, b in zip(span, span[1:], strict=False)):
                    continue
                start, end = span[0].start(), span[-1].end()
                if (start and _joined(text[start - 1])) or (end < len(text) and _joined(text[end])):
                    continue
                target = self.entries.get(" ".join(w.group() for w in span).lower())
                if target is None:
                    continue
                before = text[:start].rstrip()
                if span[0].group()[:1].isupper() and (not before or before[-1] in ".!?:"):
                    target = target[:1].upper() + target[1:]
                found.append((start, end, target))
                taken[i : i + n] = [True] * n
        return sorted(found)


def read_dictionary_terms(path: Path) -> DictionaryTerms:
    """The DictionaryTerms of a file; ValueError names the file and line of a malformed entry."""
    entries = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        phrase, sep, target = line.partition("\t")
        if not sep or not phrase.strip() or not target.strip() or len(phrase.split()) > MAX_WORDS:
            raise ValueError(f"{path}:{number}: want `phrase<TAB>translation` (1 to {MAX_WORDS} words)")
        entries[phrase] = target.strip()
    return DictionaryTerms(entries)


def write_dictionary_terms(path: Path, entries: Iterable[tuple[str, str]], header: Iterable[str]) -> int:
    """Write the entries (sorted) after the `#` header lines; returns how many. Same entries, same bytes."""
    rows = sorted({(" ".join(p.split()).lower(), " ".join(t.split())) for p, t in entries})
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# {h}" for h in header] + [f"{p}\t{t}" for p, t in rows]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(path)
    return len(rows)
