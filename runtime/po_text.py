"""Text rules of gettext catalog filling (runtime.po_catalog: `python -m client po`, /translate_file):
menu accelerators and the spans they never touch.

An accelerator marker (GTK `_Save`, Qt/KDE `&Save`, LibreOffice `~Save`) is stripped before a text is
translated (the model was trained on accelerator-free text) and put back on one letter of the
translation. What is not a marker: a doubled one (`&&`, `__`: gettext's escape), one inside a
placeholder (`%(file_name)s`), tag, entity (`&amp;`), URL, e-mail or path (`~/.config`), one not
followed by a letter or digit, an ampersand between capitals (`AT&T`, `R&D`) and an underscore of an
identifier (`file_name`, `NO_PROXY`, `x86_64`, `a_b_c`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

from runtime.catalog import ACCELERATOR_MARKERS, CREDIT_MSGIDS  # noqa: F401 - CREDIT_MSGIDS re-exported

MARKERS = ACCELERATOR_MARKERS

# Spans a marker is never in or on: placeholders (printf with positions and flags, %(name)s, Qt %1,
# {name}, $VAR), tags, entities, URLs, e-mail addresses, paths and command-line options.
SPANS = re.compile(
    "|".join(
        [
            r"%\([^)\s]*\)[-+ #0]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[diouxXeEfFgGcrsa%]",
            r"%(?:\d+\$)?[-+#0']*(?:\*|\d+)?(?:\.(?:\*|\d+))?(?:hh|h|ll|l|L|q|j|z|Z|t)?[diouxXeEfFgGaAcsSpn%]",
            r"%L?\d+",
            r"\{[^{}\s]*\}",
            r"\$\{?[A-Za-z_]\w*\}?",
            r"</?[A-Za-z][^<>]*>",
            r"&(?:[A-Za-z][A-Za-z0-9]*|#\d+|#x[0-9A-Fa-f]+);",
            r"\b(?:[A-Za-z][A-Za-z0-9+.-]*://|www\.|mailto:)[^\s<>\"']+",
            r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+",
            r"(?<![\w/.~-])(?:~[\w-]*|\.{1,2})?/[\w.+@/-]*",
            r"(?<![\w-])--?[A-Za-z][\w-]*",
        ]
    )
)


def span_mask(text: str) -> list[bool]:
    """True at every position inside a protected span (placeholder, tag, URL...)."""
    mask = [False] * len(text)
    for m in SPANS.finditer(text):
        for i in range(m.start(), m.end()):
            mask[i] = True
    return mask


def gettext_count(text: str, mark: str) -> int:
    """Markers as `msgfmt --check-accelerators` counts them: every `mark` but doubled ones."""
    n = i = 0
    while (i := text.find(mark, i)) >= 0:
        if text[i + 1 : i + 2] == mark:
            i += 2
            continue
        n += 1
        i += 1
    return n


def _identifier_underscore(text: str, i: int) -> bool:
    """Whether the `_` at `i` belongs to an identifier (file_name, NO_PROXY, x86_64, a_b_c), not a label."""
    start, end = i, i + 1
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    while end < len(text) and (text[end].isalnum() or text[end] == "_"):
        end += 1
    token, left, right = text[start:end], text[start:i], text[i + 1 : end]
    if token.count("_") > 1:
        return True
    if not left:  # word start: _Open, Save _As, _OK
        return False
    if any(c.isdigit() for c in token) or (token.upper() == token and len(token) > 2):
        return True
    # Mid-word: Re_move, E_xit, hidde_n are labels; file_name, key_file are identifiers.
    return left.islower() and right.islower() and len(left) > 1 and len(right) > 1


def candidates(text: str, mark: str, mask: Sequence[bool] | None = None) -> list[int]:
    """Positions of what may be an accelerator `mark` in `text` (see the module docstring)."""
    mask = span_mask(text) if mask is None else mask
    out = []
    i = 0
    while (i := text.find(mark, i)) >= 0:
        if text[i + 1 : i + 2] == mark:
            i += 2
            continue
        nxt = text[i + 1 : i + 2]
        acronym = mark == "&" and text[i - 1 : i].isupper() and nxt.isupper()  # AT&T, R&D
        if (
            not mask[i]
            and nxt.isalnum()
            and not acronym
            and not (mark == "_" and _identifier_underscore(text, i))
        ):
            out.append(i)
        i += 1
    return out


def catalog_markers(msgids: Iterable[str], declared: str = "") -> str:
    """The accelerator markers a catalog uses, its convention first: `declared` (the header's
    X-Accelerator-Marker) if set, else the marker most entries carry exactly once (at least 2 entries);
    another marker counts too when at least 3 entries and a tenth as many as the first carry it."""
    counts: Counter[str] = Counter()
    for text in msgids:
        mask = span_mask(text)
        for mark in MARKERS:
            if len(candidates(text, mark, mask)) == 1:
                counts[mark] += 1
    ranked = [m for m, n in counts.most_common() if n >= 2]
    if declared:
        ranked = [declared] + [m for m in ranked if m != declared]
    if not ranked:
        return ""
    top = counts[ranked[0]]
    return ranked[0] + "".join(m for m in ranked[1:] if counts[m] >= max(3, top / 10))


def strip_accelerator(text: str, markers: str) -> tuple[str, tuple[str, str, bool] | None]:
    """`text` without its accelerator, and (marker, letter, on its first letter: `on_first_letter`) when
    it had one: the first of `markers` of which `text` has exactly one candidate."""
    if not markers:
        return text, None
    mask = span_mask(text)
    for mark in markers:
        found = candidates(text, mark, mask)
        if len(found) == 1:
            i = found[0]
            stripped = text[:i] + text[i + 1 :]
            return stripped, (mark, text[i + 1], on_first_letter(stripped, i))
    return text, None


def on_first_letter(text: str, i: int) -> bool:
    """Whether position `i` of `text` (a text without its marker) is its first letter or digit, past
    leading punctuation, placeholders and tags (`_Save`, `<b>_Name</b>`, `¿_Save?`)."""
    mask = span_mask(text)
    return not any(c.isalnum() and not mask[k] for k, c in enumerate(text[:i]))


LONE_MID_WORD_MAX_WORDS = 5  # `_` inside a word (E_xit) counts in a label, not in prose (Quarter_note)


def lone_accelerator(text: str) -> tuple[str, tuple[int, str, str] | None]:
    """A text with no catalog around it to learn the convention from (a Translate call): `text` without
    its accelerator, and (position, marker, letter) when it has one. Stricter than a catalog's
    `strip_accelerator`: the marker is the only one of its character in the text (`A_b-c_2` is an
    identifier) and is followed by a letter (`~5 minutes`), in a word without a slash (`America/El_Paso`);
    an `_` or `~` inside a word only in a short label (`E_xit`, not `the SF_Array object ...`), an `&`
    inside a word only before a lowercase letter (`Mar&k`, not `Drag&Drop`)."""
    mask = span_mask(text)
    for mark in MARKERS:
        found = candidates(text, mark, mask)
        if len(found) != 1 or gettext_count(text, mark) != 1:
            continue
        i = found[0]
        nxt, prev = text[i + 1], text[i - 1 : i]
        word_start = text.rfind(" ", 0, i) + 1
        word_end = len(text) if (e := text.find(" ", i)) < 0 else e
        if not nxt.isalpha() or "/" in text[word_start:word_end]:  # America/Costa_Rica: a name
            continue
        # Inside a word: `&` before a lowercase letter is a KDE accelerator at any length (`Mar&k articles
        # as read when they arrive`); an `_` only in a short label (prose has identifiers: `SF_Array`).
        if prev.isalnum() and (
            (mark == "&" and nxt.isupper()) or (mark != "&" and len(text.split()) > LONE_MID_WORD_MAX_WORDS)
        ):
            continue
        return text[:i] + text[i + 1 :], (i, mark, nxt)
    return text, None


def place_accelerator(text: str, mark: str, letter: str, first: bool) -> str | None:
    """`text` with `mark` before one letter, outside placeholders and tags; None when `text` has none.

    first: whether the source's marker was on its first letter (`on_first_letter`). Then the
    translation's goes on its first letter too (`_Auto Indent` -> `_Sangrado automático`). Else not there
    while another letter will do: the source's letter at a word start (a word of three letters or more
    first: not on "de"), else the start of another word, else the source's letter inside a word, else
    any other letter (`Find _Next` -> `Buscar _siguiente`, `Cu_t` -> `Cor_tar`, not `_Buscar
    siguiente`, `_Cortar`).
    Chosen on Debian's GTK catalogs, where the human translations keep a marker off the first letter
    when the source does 3 times in 4 (translate-toolkit's `startpunc` flags the others)."""
    mask = span_mask(text)

    def free(i: int) -> bool:
        return not mask[i] and (i == 0 or text[i - 1] not in MARKERS)

    others = [i for i, c in enumerate(text) if c.isalnum() and free(i)]
    starts = [i for i in others if text[i].isalpha() and (i == 0 or not text[i - 1].isalnum())]
    if first:
        choices = [starts, others]
    else:
        head = others[:1]  # the translation's first letter: the last resort
        starts, others = [i for i in starts if i not in head], [i for i in others if i not in head]
        same = [i for i in starts if text[i].lower() == letter.lower()]
        long_same = [i for i in same if text[i + 2 : i + 3].isalpha()]  # "_destino" before "_de"
        inside = [i for i in others if text[i].lower() == letter.lower() and text[i].isalpha()]
        choices = [long_same, same, starts, inside, others, head]
    for choice in choices:
        if choice:
            return text[: choice[0]] + mark + text[choice[0] :]
    return None
