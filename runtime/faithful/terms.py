"""Word lists of a model bundle that the text layer reads: the do-not-translate list (keep_terms.txt) and
the source words the model was trained on (source_words.txt). Both are written by `model.keep_terms`.

A capitalised word that the training sources never hold, in any inflection (`Openbox`, `Guake`,
`Kdenlive`), is a name the model cannot know: the text layer keeps it rather than let the model invent a
translation for it.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path

__all__ = ["SOURCE_WORD", "is_known_word", "read_term_list"]

SOURCE_WORD = re.compile(r"[^\W\d_]{3,}")  # the words listed in source_words.txt (lowercased)
_SUFFIXES = ("s", "es", "ed", "d", "ing", "ly", "er", "ers")


def read_term_list(path: Path) -> list[str]:
    """One term per line (its first tab-separated field), '#' comment lines and blank lines skipped."""
    terms = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            term = line.split("\t", 1)[0].strip()
            if term:
                terms.append(term)
    return terms


def is_known_word(word: str, known: Collection[str]) -> bool:
    """Whether `word` (or its stem without a common English suffix) is among the known lowercase words."""
    w = word.lower()
    if w in known:
        return True
    for suffix in _SUFFIXES:
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            stem = w[: -len(suffix)]
            if stem in known or stem + "e" in known:
                return True
    return False
