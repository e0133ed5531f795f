"""Protected spans: the parts of a source text the model must not translate or touch.

`find_spans` lists, without overlaps, every span of a text that must come back exactly once in the
translation: placeholders (printf incl. positional and `%n`, Qt `%1`, `{name}` / `{0}`, `%(name)s`,
`$VAR` / `${VAR}`), other tools' masks of placeholders (Weblate's `[X7X]`), code (quoted literals and what
usage lines keep: runtime.faithful.code), markup tags and entities, URLs, e-mail addresses, file paths,
command-line options, keyboard shortcuts, numbers and versions, emoji and symbols, runs of text in scripts
the model was not trained on, words the tokenizer can only spell byte by byte, names from the
do-not-translate list, and glossary terms. The text layer (runtime.faithful.mask) replaces each span with
a sentinel before the model and puts it back after, so the guarantee does not depend on the model's
quality.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from runtime.faithful.code import code_spans
from runtime.tokenizer import PLACEHOLDER_PATTERN

__all__ = [
    "KINDS",
    "is_control_char",
    "MAX_GLOSSARY_ENTRIES",
    "Glossary",
    "InvalidGlossaryError",
    "Span",
    "make_glossary",
    "find_spans",
    "is_foreign_char",
    "is_symbol_char",
    "tag_name",
]

# Kinds, in priority order: where two matches overlap, the earlier start wins, then the longer one, then
# the kind listed first.
KINDS = (
    "glossary",
    "mask",
    "code",
    "url",
    "email",
    "tag",
    "entity",
    "placeholder",
    "path",
    "option",
    "shortcut",
    "keep",
    "name",
    "unknown",
    "quoted",
    "dictionary",
    "number",
    "symbol",
    "control",
    "foreign",
    "rare",
)
_PRIORITY = {k: i for i, k in enumerate(KINDS)}

_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9:_-]*(?:\s[^<>]{0,200})?/?>")
# A <script> or <style> element, content and all: code, never prose (format=html translated the text
# inside <script>). Kept as one span of kind "glossary", the hidden kind whose text is put back as it was.
_RAW_ELEMENT = re.compile(r"<(script|style)(?:\s[^<>]{0,200})?>.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_TAG_NAME = re.compile(r"</?([A-Za-z][A-Za-z0-9:_-]*)")
_ENTITY = re.compile(r"&(?:[A-Za-z][A-Za-z0-9]*|#\d+|#x[0-9A-Fa-f]+);")
_URL = re.compile(r"\b(?:(?:https?|ftp|file|sftp|ssh|git)://|www\.|mailto:)[^\s<>\"'`]+", re.IGNORECASE)
_EMAIL = re.compile(r"\b[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+\b")
# Unix paths from a root, home or current directory (one slash at least after the first component), and
# Windows drive paths. "and/or" is not a path: a path starts at a boundary with / ~/ ./ ../ or X:\.
_PATH = re.compile(
    r"(?<![\w/.~-])(?:~|\.{1,2})?/(?:[\w.+@-]+/)*[\w.+@*-]*[\w*/]"
    r"|(?<![\w])[A-Za-z]:\\(?:[\w .+-]+\\)*[\w.+-]+"
)
# "/Help/About", "/Conversation/Insert Link": a menu path of capitalised words, translated like text.
_MENU_PATH = re.compile(r"(?:/[A-Z][a-z]+(?: [A-Za-z][a-z]+)*)+/?")
_OPTION = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*(?:=[^\s,;)]+)?")
_SHORTCUT = re.compile(
    r"\b(?:Ctrl|Control|Alt|AltGr|Shift|Meta|Super|Cmd|Command|Option|Fn)"
    r"(?:\s?\+\s?(?:Ctrl|Control|Alt|AltGr|Shift|Meta|Super|Cmd|Command|Option|Fn))*"
    r"\s?\+\s?(?:F\d{1,2}|[A-Za-z0-9]\b|[^\s\w]|Tab|Enter|Return|Space|Esc|Escape|Delete|Del|Insert|Ins|"
    r"Home|End|PgUp|PgDn|PageUp|PageDown|Backspace|Up|Down|Left|Right)"
)
# Bounded by Latin letters only: a digit run glued to another script's letter ("0Ά00") is a number too.
_NUMBER = re.compile(r"(?<![A-Za-z0-9_.,])[-+]?\d+(?:[.,:]\d+)*(?![A-Za-z0-9_])")
# Names that look like names whatever the corpus says: CamelCase (LibreOffice, PulseAudio, iPhone) and
# identifiers mixing letters with digits or underscores (x86_64, Qt5, MP3, IPv6, UTF-8).
_NAME = re.compile(
    r"(?<![\w])(?:[A-Za-z]*[a-z][A-Z][A-Za-z]*|[A-Za-z]+[0-9][\w.-]*[\w]|[0-9]+[A-Za-z][\w]*"
    r"|[A-Za-z]\w*_\w+)(?![\w])"
)
_CAPITALISED = re.compile(r"(?<![\w])[A-Z][^\W\d_]{2,}(?![\w])")
# One lowercase word alone between quotes ('otioconvert', "gfe", 'barys'): a command, a file or a word
# quoted as a word. Not an apostrophe inside a name (Khmel'nyts'ky).
_QUOTED_WORD = re.compile(r"(?<![\w'’])[\"'“‘«]([a-z][a-z0-9_+-]*[a-z0-9])[\"'”’»](?![\w'’])")
_WORD = re.compile(r"[^\W_](?:[\w+.-]*[\w+])?")
_PRINTF_ORDERED = re.compile(r"%(?!\d+\$)[-+#0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?[a-zA-Z]+")


@dataclass(frozen=True)
class Span:
    """[start, end) of the source; `restore` is what the translation gets in its place (the source
    text, or a glossary term's required translation)."""

    start: int
    end: int
    kind: str
    text: str
    restore: str

    @property
    def ordered(self) -> bool:
        """Whether the span holds a non-positional printf placeholder (%s, %d; also inside a tag's
        attribute): their order is their meaning (msgfmt -c checks it), so the translation keeps them
        in the source's order."""
        return self.kind in ("placeholder", "tag") and bool(_PRINTF_ORDERED.search(self.text))


@dataclass(frozen=True)
class Glossary:
    """Per-request terms: source term -> required translation ("" = keep the term as it is). Matched as
    whole words, case-insensitively; the longest term wins where terms overlap."""

    terms: Mapping[str, str]

    def pattern(self) -> re.Pattern[str] | None:
        if not self.terms:
            return None
        alts = sorted((re.escape(t) for t in self.terms if t.strip()), key=len, reverse=True)
        return re.compile(r"(?<![\w])(?:" + "|".join(alts) + r")(?![\w])", re.IGNORECASE) if alts else None

    def target(self, matched: str) -> str:
        lowered = {k.lower(): v for k, v in self.terms.items()}
        wanted = self.terms.get(matched, lowered.get(matched.lower(), ""))
        return wanted or matched


MAX_GLOSSARY_ENTRIES = 1_000
MAX_GLOSSARY_TERM_CHARS = 200


class InvalidGlossaryError(ValueError):
    """A glossary the service refuses; the message says which entry and what to change."""


def make_glossary(entries: Sequence[tuple[str, str]]) -> dict[str, str]:
    """(source term, target or "" = keep) pairs -> the glossary mapping, or InvalidGlossaryError: at most
    MAX_GLOSSARY_ENTRIES entries, non-blank terms of at most MAX_GLOSSARY_TERM_CHARS, no term twice
    (case-insensitively)."""
    if len(entries) > MAX_GLOSSARY_ENTRIES:
        raise InvalidGlossaryError(
            f"glossary has {len(entries)} entries, the limit is {MAX_GLOSSARY_ENTRIES}; "
            "send only the terms that occur in these texts"
        )
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for i, (source, target) in enumerate(entries):
        term = source.strip()
        if not term:
            raise InvalidGlossaryError(f"glossary[{i}].source is blank: give the English term")
        if len(term) > MAX_GLOSSARY_TERM_CHARS or len(target) > MAX_GLOSSARY_TERM_CHARS:
            raise InvalidGlossaryError(
                f"glossary[{i}] is over {MAX_GLOSSARY_TERM_CHARS} characters: glossary entries are terms"
            )
        if term.lower() in seen:
            raise InvalidGlossaryError(
                f"glossary[{i}].source {term!r} repeats glossary[{seen[term.lower()]}] "
                "(terms match case-insensitively): keep one"
            )
        seen[term.lower()] = i
        out[term] = target.strip()
    return out


def tag_name(tag: str) -> tuple[str, str]:
    """('open' | 'close' | 'empty', lowercase name) of a markup tag."""
    m = _TAG_NAME.match(tag)
    name = m.group(1).lower() if m else ""
    if tag.startswith("</"):
        return "close", name
    return ("empty" if tag.endswith("/>") else "open"), name


@lru_cache(maxsize=4096)
def is_foreign_char(ch: str) -> bool:
    """A letter of a script the model was not trained on (neither Latin nor Greek-free Common): CJK,
    Cyrillic, Greek, Arabic, Hebrew, Indic, ... English and Spanish are written in Latin."""
    if not ch.isalpha():
        return False
    try:
        return not unicodedata.name(ch).startswith("LATIN")
    except ValueError:
        return True


@lru_cache(maxsize=4096)
def is_symbol_char(ch: str) -> bool:
    """Emoji and other pictographic symbols, with the joiners and modifiers that build them."""
    if ch in "\u200d\ufe0f\ufe0e\u20e3":
        return True
    cat = unicodedata.category(ch)
    if cat == "So":
        return True
    return cat == "Sk" and ord(ch) >= 0x1F3FB  # skin-tone modifiers


@lru_cache(maxsize=4096)
def is_control_char(ch: str) -> bool:
    """Characters that are not text: control (but line breaks and tabs, which are structure), private
    use (the tokenizer's own newline/tab symbols live there), unassigned, surrogates and zero-width format
    characters (those that build emoji belong to their symbol)."""
    if ch in "\n\t\r" or ch in "\u200d\ufe0f\ufe0e":
        return False
    return unicodedata.category(ch) in ("Cc", "Co", "Cn", "Cs", "Cf")


def _runs(text: str, pred: Callable[[str], bool], kind: str, glue: str = "") -> list[Span]:
    """Maximal runs of characters satisfying `pred` (characters in `glue` join two runs)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if not pred(text[i]):
            i += 1
            continue
        j = i + 1
        while j < n:
            if pred(text[j]):
                j += 1
                continue
            k = j
            while k < n and text[k] in glue:
                k += 1
            if k < n and k > j and pred(text[k]):
                j = k + 1
                continue
            break
        out.append(Span(i, j, kind, text[i:j], text[i:j]))
        i = j
    return out


def _trim_url(s: str) -> str:
    # A sentence's closing punctuation after a URL is not part of it; a ')' only when unbalanced.
    while s and s[-1] in ".,;:!?'\"":
        s = s[:-1]
    while s.endswith(")") and s.count(")") > s.count("("):
        s = s[:-1]
    return s


def _matches(pattern: re.Pattern[str], text: str, kind: str) -> list[Span]:
    out = []
    for m in pattern.finditer(text):
        s = m.group(0)
        if kind in ("url", "path"):
            s = _trim_url(s)
        if s:
            out.append(Span(m.start(), m.start() + len(s), kind, s, s))
    return out


def find_spans(
    text: str,
    *,
    keep_terms: Collection[str] = (),
    glossary: Glossary | None = None,
    rare_char: Callable[[str], bool] | None = None,
    unknown_word: Callable[[str], bool] | None = None,
    dictionary: Callable[[str], Iterable[tuple[int, int, str]]] | None = None,
) -> list[Span]:
    """Every protected span of `text`, in order, without overlaps.

    keep_terms: words kept as they are (the model's do-not-translate list), matched case-sensitively as
    whole words. rare_char(ch): whether the tokenizer can only spell `ch` byte by byte; a word holding one
    is protected (the model has hardly seen it and garbles it). unknown_word(w): whether the model never
    saw the word; a capitalised one is a name it cannot know (Openbox, Guake) and is kept. dictionary(text):
    (start, end, translation) of the words and phrases the bundle's dictionary terms translate
    (runtime.faithful.dictionary)."""
    found: list[Span] = []
    if glossary is not None and (pat := glossary.pattern()) is not None:
        for m in pat.finditer(text):
            found.append(Span(m.start(), m.end(), "glossary", m.group(0), glossary.target(m.group(0))))
    for m in _RAW_ELEMENT.finditer(text):
        found.append(Span(m.start(), m.end(), "glossary", m.group(0), m.group(0)))
    found += [Span(s, e, kind, text[s:e], text[s:e]) for kind, s, e in code_spans(text)]
    found += _matches(_URL, text, "url")
    found += _matches(_EMAIL, text, "email")
    found += _matches(_TAG, text, "tag")
    found += _matches(_ENTITY, text, "entity")
    for m in PLACEHOLDER_PATTERN.finditer(text):
        s = m.group(0)
        if s.startswith("<") or (s.startswith("&") and s.endswith(";")):
            continue  # tags and entities above
        found.append(Span(m.start(), m.end(), "placeholder", s, s))
    found += [s for s in _matches(_PATH, text, "path") if not _MENU_PATH.fullmatch(s.text)]
    found += _matches(_OPTION, text, "option")
    found += _matches(_SHORTCUT, text, "shortcut")
    if keep_terms:
        for m in _WORD.finditer(text):
            w = m.group(0)
            for cand in (w, w.rstrip(".")):
                if cand in keep_terms:
                    found.append(Span(m.start(), m.start() + len(cand), "keep", cand, cand))
                    break
    found += _matches(_NAME, text, "name")
    if unknown_word is not None:
        for m in _CAPITALISED.finditer(text):
            if unknown_word(m.group(0)):
                found.append(Span(m.start(), m.end(), "unknown", m.group(0), m.group(0)))
        for m in _QUOTED_WORD.finditer(text):
            if unknown_word(m.group(1)):
                found.append(Span(m.start(1), m.end(1), "quoted", m.group(1), m.group(1)))
    if dictionary is not None:
        found += [Span(a, b, "dictionary", text[a:b], target) for a, b, target in dictionary(text)]
    found += _matches(_NUMBER, text, "number")
    found += _runs(text, is_symbol_char, "symbol", glue=" ")
    found += _runs(text, is_control_char, "control")
    # Foreign-script runs take the spaces and punctuation between their words along.
    found += _runs(text, is_foreign_char, "foreign", glue=" \u3000、。・ー,.!?！？「」")
    if rare_char is not None:
        for m in re.finditer(r"\S+", text):
            w = m.group(0).strip(".,;:!?()[]\"'")
            if w and any(rare_char(c) for c in w if not is_symbol_char(c) and not is_foreign_char(c)):
                start = m.start() + m.group(0).index(w)
                found.append(Span(start, start + len(w), "rare", w, w))
    found.sort(key=lambda s: (s.start, -(s.end - s.start), _PRIORITY[s.kind]))
    out: list[Span] = []
    end = 0
    for s in found:
        if s.start >= end and s.end > s.start:
            out.append(s)
            end = s.end
    return out
