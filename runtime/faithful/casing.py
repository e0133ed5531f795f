"""The first letter of a translation takes the case the source's has: a capitalised label, sentence or
message (`Empty slot`, `<para>An error occurred...`) comes back capitalised (`Ranura vacía`, not
`slot vacío`). The model sometimes starts in lowercase, more often right after markup; on the valid split
every output that did so had a capitalised reference. Only the first letter of the whole text changes
(after leading whitespace, markup, opening punctuation and bullets), and never a name written in
lowercase on purpose: a do-not-translate term (`systemd`, `pngquant`) or a word with a capital or digit
inside (`iPod`, `x86`)."""

from __future__ import annotations

import re
from collections.abc import Collection

_LEAD = re.compile(r"(?:\s|<[^<>]*>|&[A-Za-z]+;|[¿¡\"'«“‘(\[*•·-])*")
_WORD = re.compile(r"[\w.+'-]+")


def first_letter(text: str) -> int | None:
    """Index of the text's first letter when it opens the text (past markup and punctuation), else None."""
    i = _LEAD.match(text).end()
    return i if i < len(text) and text[i].isalpha() else None


def match_first_case(source: str, output: str, keep: Collection[str] = ()) -> str:
    """`output` with its first letter upper-cased when the source's is upper-case and the output's is not;
    keep: terms written as they are (the model's do-not-translate list)."""
    i, j = first_letter(source), first_letter(output)
    if i is None or j is None or not source[i].isupper() or not output[j].islower():
        return output
    word = _WORD.match(output, j).group(0)
    if word in keep or not word.isalpha() or (len(word) > 1 and not word[1:].islower()):
        return output
    return output[:j] + output[j].upper() + output[j + 1 :]
