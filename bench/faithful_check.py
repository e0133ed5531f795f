"""The faithfulness benchmark's independent checker (nothing here comes from the text layer under test):
what a translation must keep, how a source is labelled, how an output is scored.

``protected_spans``: placeholders (``runtime.tokenizer.PLACEHOLDER_PATTERN``), URLs, e-mails, numbers and
versions, file paths, command-line options, product names, shortcuts, emoji, non-Latin script and tabs;
``check_spans``: the multiset check; ``tags_well_formed``: markup nesting; ``count_sentences``
(``sentencex``); ``categorize``: the categories (``CATEGORIES``) a source of the set is labelled with.
``score_item`` / ``aggregate`` / ``groups_of``: per-item verdicts and per-group figures of ``bench.faithful``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from runtime.tokenizer import PLACEHOLDER_PATTERN, is_markup

HANDWRITTEN = "handwritten"
SHORT_RATIO = 0.6

CATEGORIES = (
    "printf", "qt", "brace", "python", "shell", "markup", "url", "email", "path", "option", "number",
    "name", "multi_sentence", "tab",
)  # fmt: skip

# Product and project names that a translation keeps as they are (CamelCase names are found by shape).
KNOWN_NAMES = frozenset(
    """Firefox Mozilla Thunderbird Chrome Chromium Google Linux Debian Ubuntu GNU GNOME KDE Xfce LXDE
    Windows Microsoft Apple Android Bluetooth Wayland Xorg Python Perl Java Qt GTK Akonadi Kontact Kleopatra
    Openbox Pitivi Deluge Blueman Ristretto Parole Evince Nautilus Thunar Emacs Vim Samba OpenSSL GnuPG GPG
    PGP Unicode Flatpak Inkscape GIMP Krita Wesnoth Bash Tracker Totem pngquant""".split()
)

# --------------------------------------------------------------------------------------------
# Protected spans (an independent checker: nothing here comes from the text layer under test)

_URL = re.compile(r"(?:(?:https?|ftp|file)://|www\.)[^\s<>\"'`]+")
_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
_PATH = re.compile(r"(?<![\w/:.~-])(?:~|\.{1,2})?/(?:[A-Za-z0-9._+-]+/?)+")
_OPTION = re.compile(r"(?<![\w%-])(?:--[A-Za-z0-9][A-Za-z0-9_-]*|-[A-Za-z][A-Za-z0-9]*(?![\w-]))")
_NUMBER = re.compile(r"(?:(?<=\bv)|(?<![\w.,%$#{]))\d+(?:[.,:]\d+)*(?!\w)")
_CAMEL = re.compile(r"\b(?![A-Z]+s\b)(?=[A-Za-z0-9]*[a-z][A-Z]|[A-Z]{2,}[a-z])[A-Za-z][A-Za-z0-9]*\b")
_SHORTCUT = re.compile(r"\b(?:Ctrl|Alt|Shift|Super|Meta|Cmd)(?:\+[A-Za-z0-9]+)+(?!\w)")
_WORD = re.compile(r"\b[A-Za-z][A-Za-z0-9]*\b")
_EMOJI_CHAR = "[\U0001f000-\U0001faff\u2600-\u27bf\u2b00-\u2bff]\ufe0f?"
_EMOJI = re.compile(f"{_EMOJI_CHAR}(?:\u200d{_EMOJI_CHAR})*")
_NON_LATIN = re.compile(
    "[\u0370-\u03ff\u0400-\u052f\u0530-\u058f\u0590-\u05ff\u0600-\u06ff\u0900-\u0dff\u0e00-\u0e7f"
    "\u10a0-\u10ff\u1100-\u11ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff66-\uff9f]+"
)
_TRAILING_PUNCT = ".,;:!?)]}'\""


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    kind: (
        str  # printf qt brace python shell markup tag url email path option number name key emoji script tab
    )
    text: str

    @property
    def key(self) -> str:
        """What must survive: the text itself; numbers compare with ',' and '.' as one separator."""
        return re.sub(r"[.,]", ".", self.text) if self.kind == "number" else self.text


def placeholder_kind(token: str) -> str:
    """Category of a PLACEHOLDER_PATTERN match: printf, qt, python, brace, shell, markup or tag."""
    if token.startswith("%("):
        return "python"
    if re.fullmatch(r"%\d+", token):
        return "qt"
    if token.startswith("%"):
        return "printf"
    if token.startswith("{"):
        return "brace"
    if token.startswith("$"):
        return "shell"
    if token.startswith("&") or is_markup(token):
        return "markup"
    return "tag"  # <file>, <name>: angle-bracketed words of usage messages


def _candidates(text: str) -> Iterable[Span]:
    for match in PLACEHOLDER_PATTERN.finditer(text):
        yield Span(match.start(), match.end(), placeholder_kind(match.group()), match.group())
    for kind, pattern in (("url", _URL), ("path", _PATH)):
        for match in pattern.finditer(text):
            token = match.group().rstrip(_TRAILING_PUNCT)
            if kind == "path" and token.count("/") < 2 and not token.startswith(("/", "~/", "./", "../")):
                continue
            if kind == "path" and len(token) < 3:
                continue  # "/", "./"
            yield Span(match.start(), match.start() + len(token), kind, token)
    for kind, pattern in (
        ("email", _EMAIL), ("option", _OPTION), ("number", _NUMBER), ("name", _CAMEL), ("key", _SHORTCUT)
    ):  # fmt: skip
        for match in pattern.finditer(text):
            yield Span(match.start(), match.end(), kind, match.group())
    for match in _WORD.finditer(text):
        if match.group() in KNOWN_NAMES:
            yield Span(match.start(), match.end(), "name", match.group())
    for kind, pattern in (("emoji", _EMOJI), ("script", _NON_LATIN)):
        for match in pattern.finditer(text):
            yield Span(match.start(), match.end(), kind, match.group())
    for match in re.finditer("\t", text):
        yield Span(match.start(), match.end(), "tab", "\t")


def protected_spans(text: str) -> list[Span]:
    """Non-overlapping spans a faithful translation keeps verbatim, in order. Overlaps resolve to the
    earliest start, then the longest (a tag with a URL inside is one span; a number inside a URL none)."""
    spans: list[Span] = []
    end = 0
    for span in sorted(_candidates(text), key=lambda s: (s.start, -(s.end - s.start))):
        if span.start >= end:
            spans.append(span)
            end = span.end
    return spans


def span_counts(text: str) -> Counter:
    return Counter(span.key for span in protected_spans(text))


@dataclass
class SpanCheck:
    total: int  # spans in the source
    kept: int  # sum over keys of min(source count, output count)
    missing: list[str]  # keys the output has fewer copies of (one entry per lost copy)
    extra: list[str]  # source keys the output has more copies of (one entry per extra copy)

    @property
    def ok(self) -> bool | None:
        """None without spans; else whether every span occurs exactly as often as in the source."""
        return None if not self.total else not self.missing and not self.extra


def check_spans(source: str, output: str) -> SpanCheck:
    wanted, got = span_counts(source), span_counts(output)
    missing = sorted((wanted - got).elements())
    extra = sorted(Counter({k: got[k] - wanted[k] for k in wanted if got[k] > wanted[k]}).elements())
    kept = sum(min(n, got[k]) for k, n in wanted.items())
    return SpanCheck(sum(wanted.values()), kept, missing, extra)


# --------------------------------------------------------------------------------------------
# Markup structure

_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9]*)(?:\s[^<>]*?)?(/?)>")
_VOID_TAGS = frozenset({"br", "hr", "img", "link", "meta", "input"})


def markup_tags(text: str) -> list[tuple[str, str]]:
    """(``open``/``close``, name) of each markup tag (runtime.tokenizer.MARKUP_TAGS), void and
    self-closing tags left out."""
    tags = []
    for match in _TAG.finditer(text):
        closing, name, self_closing = match.groups()
        if not is_markup(match.group()) or self_closing or name.lower() in _VOID_TAGS:
            continue
        tags.append(("close" if closing else "open", name.lower()))
    return tags


def tags_well_formed(text: str) -> bool:
    """Every markup tag is closed, in order (vacuously true without tags)."""
    stack: list[str] = []
    for kind, name in markup_tags(text):
        if kind == "open":
            stack.append(name)
        elif not stack or stack.pop() != name:
            return False
    return not stack


# --------------------------------------------------------------------------------------------
# Sentences


@lru_cache(maxsize=1)
def _segmenter():
    try:
        from sentencex import segment
    except ImportError:  # pragma: no cover - the bench needs it; a rough fallback keeps the tests honest
        return None
    return segment


_FALLBACK_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[¿¡\"'(]?[A-Z0-9ÁÉÍÓÚÑ])|\n\s*\n")


def split_sentences(text: str, lang: str = "en") -> list[str]:
    """Non-blank sentences of a text (``sentencex``; a regex split if it is missing)."""
    segment = _segmenter()
    parts = segment(lang, text) if segment else _FALLBACK_SPLIT.split(text)
    return [p.strip() for p in parts if p and p.strip()]


def count_sentences(text: str, lang: str = "en") -> int:
    return len(split_sentences(text, lang))


def sentence_splitter() -> str:
    segment = _segmenter()
    if segment is None:
        return "regex fallback (sentencex not installed)"
    from importlib.metadata import version

    return f"sentencex {version('sentencex')}"


# --------------------------------------------------------------------------------------------
# Categories


def categorize(text: str) -> list[str]:
    """The categories (CATEGORIES, in that order) a source belongs to."""
    kinds = {span.kind for span in protected_spans(text)}
    found = set(kinds & set(CATEGORIES))
    if "name" in found and len(_WORD.findall(text)) < 3:
        found.discard("name")  # a name inside a sentence, not a bare name
    if count_sentences(text) >= 2:
        found.add("multi_sentence")
    return [c for c in CATEGORIES if c in found]


# --------------------------------------------------------------------------------------------
# Scoring


def score_item(item: dict, output: str) -> dict:
    source, reference = item["source"], item.get("target")
    spans = check_spans(source, output)
    row: dict = {
        "spans": {"total": spans.total, "kept": spans.kept, "missing": spans.missing, "extra": spans.extra},
        "spans_ok": spans.ok,
        "reference_spans_ok": check_spans(source, reference).ok if reference is not None else None,
        "tags_ok": None,
        "sentences": None,
    }
    if markup_tags(source) and tags_well_formed(source):
        row["tags_ok"] = tags_well_formed(output)
    if "multi_sentence" in item["kinds"]:
        src_n, out_n = count_sentences(source, "en"), count_sentences(output, "es")
        row["sentences"] = {
            "source": src_n,
            "output": out_n,
            "fewer": out_n < src_n,
            "ratio_to_reference": round(len(output) / len(reference), 3) if reference else None,
            "ratio_to_source": round(len(output) / max(len(source), 1), 3),
        }
    return row


def _pct(hits: int, n: int) -> float | None:
    return round(100.0 * hits / n, 1) if n else None


def aggregate(items: Sequence[dict], outputs: Sequence[str], rows: Sequence[dict]) -> dict:
    import sacrebleu

    with_spans = [r for r in rows if r["spans_ok"] is not None]
    with_ref_spans = [r for r in rows if r["reference_spans_ok"] is not None]
    tagged = [r for r in rows if r["tags_ok"] is not None]
    multi = [r["sentences"] for r in rows if r["sentences"] is not None]
    multi_ref = [m for m in multi if m["ratio_to_reference"] is not None]
    total = sum(r["spans"]["total"] for r in rows)
    figures: dict = {
        "n": len(items),
        "with_spans": len(with_spans),
        "spans_all_kept": _pct(sum(bool(r["spans_ok"]) for r in with_spans), len(with_spans)),
        "spans_total": total,
        "spans_kept": _pct(sum(r["spans"]["kept"] for r in rows), total),
        "texts_with_extra_copies": sum(bool(r["spans"]["extra"]) for r in rows),
        "reference_spans_all_kept": _pct(
            sum(bool(r["reference_spans_ok"]) for r in with_ref_spans), len(with_ref_spans)
        ),
        "with_tags": len(tagged),
        "tags_ok": _pct(sum(bool(r["tags_ok"]) for r in tagged), len(tagged)),
        "multi_sentence": len(multi),
        "fewer_sentences": _pct(sum(m["fewer"] for m in multi), len(multi)),
        "multi_with_reference": len(multi_ref),
        "short_vs_reference": _pct(
            sum(m["ratio_to_reference"] < SHORT_RATIO for m in multi_ref), len(multi_ref)
        ),
        "short_vs_source": _pct(sum(m["ratio_to_source"] < SHORT_RATIO for m in multi), len(multi)),
    }
    refs = [(o, i["target"]) for i, o in zip(items, outputs, strict=True) if i.get("target")]
    figures["with_reference"] = len(refs)
    if refs:
        hyps, references = [o for o, _ in refs], [r for _, r in refs]
        bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
        figures["bleu"] = round(bleu.corpus_score(hyps, [references]).score, 2)
        figures["chrf"] = round(chrf.corpus_score(hyps, [references]).score, 2)
        figures["signatures"] = {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())}
    else:
        figures["bleu"] = figures["chrf"] = None
    return figures


def groups_of(items: Sequence[dict]) -> dict[str, list[int]]:
    """Positions per category (catalog and hand-written items alike), then catalog, hand-written, all."""
    groups: dict[str, list[int]] = {kind: [] for kind in CATEGORIES}
    for pos, item in enumerate(items):
        for kind in item["kinds"]:
            groups.setdefault(kind, []).append(pos)
    groups["catalog"] = [p for p, i in enumerate(items) if i["package"] != HANDWRITTEN]
    groups[HANDWRITTEN] = [p for p, i in enumerate(items) if i["package"] == HANDWRITTEN]
    groups["overall"] = list(range(len(items)))
    return groups
