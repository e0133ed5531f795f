"""Segmentation: a text -> the pieces the model translates one by one, and what lies between them.

Structure first (line breaks, tabs, list bullets, the spaces around them are never translated), then
sentences inside each line with `sentencex` (Wikimedia's rule-based segmenter; abbreviations, decimals and
ellipses are not boundaries); a usage line (runtime.faithful.code: `export [-fn] [name ...] or export -p`)
is not cut into sentences. A boundary that falls inside a protected span (a URL, a path, a tag with
attributes) is dropped. A sentence still too long for the model is split at a clause mark or a space
near its middle until every piece fits (`fits`). Concatenating the pieces gives the text back exactly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sentencex

from runtime.faithful.code import is_usage_line
from runtime.faithful.spans import Span

__all__ = ["COLUMNS", "MAX_TEXT_CHARS", "Piece", "segment", "split_to_fit"]

MAX_TEXT_CHARS = 20_000  # longest accepted text (a long help page); longer ones are refused

_STRUCTURE = re.compile(r"[ \t]*(?:\r\n|\n|\r|\t| {2})[ \t]*|\u2028|\u2029")
# Tabs and runs of spaces inside a line align columns (`--output=FILE   write to FILE`): structure.
COLUMNS = re.compile(r"\t|\S {2,}\S")
_BULLET = re.compile(r"[ \t]*(?:[-*\u2022\u2023\u25e6\u2043\u00b7+>]|\d{1,3}[.)]|[a-z][.)])[ \t]+(?=\S)")
_CLAUSE = re.compile(r"[;:,\u2014\u2013)](?=\s)|\s[-\u2013\u2014]\s|\s(?=\()")


@dataclass(frozen=True)
class Piece:
    """text[start:end]; `translate` is False for separators (line breaks, bullets, spaces)."""

    start: int
    end: int
    translate: bool


def _sentences(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """[start, end) of each sentence of text[start:end] (their trailing spaces included)."""
    out, pos = [], start
    for sentence in sentencex.segment("en", text[start:end]):
        if sentence:
            out.append((pos, pos + len(sentence)))
            pos += len(sentence)
    if pos != end:  # the segmenter dropped or changed characters: keep the chunk whole
        return [(start, end)]
    return out


def _inside_span(pos: int, spans: Sequence[Span]) -> bool:
    return any(s.start < pos < s.end for s in spans)


def _emit(text: str, start: int, end: int, out: list[Piece]) -> None:
    """Add text[start:end] as a translated piece, its outer whitespace as separators."""
    chunk = text[start:end]
    lead = len(chunk) - len(chunk.lstrip())
    trail = len(chunk.rstrip())
    if not chunk.strip():
        if end > start:
            out.append(Piece(start, end, False))
        return
    if lead:
        out.append(Piece(start, start + lead, False))
    out.append(Piece(start + lead, start + trail, True))
    if start + trail < end:
        out.append(Piece(start + trail, end, False))


def segment(text: str, spans: Sequence[Span] = ()) -> list[Piece]:
    """The pieces of `text`, in order, covering it exactly."""
    out: list[Piece] = []
    pos = 0
    breaks = [m for m in _STRUCTURE.finditer(text) if not _inside_span(m.start() + 1, spans)]
    for m in [*breaks, None]:
        line_end = m.start() if m is not None else len(text)
        line_start = pos
        if (b := _BULLET.match(text, line_start, line_end)) is not None:
            out.append(Piece(line_start, b.end(), False))
            line_start = b.end()
        bounds = _sentences(text, line_start, line_end) if line_end > line_start else []
        if len(bounds) > 1 and is_usage_line(text[line_start:line_end]):
            bounds = [(line_start, line_end)]  # `... ] or export -p` is no sentence of its own
        merged: list[list[int]] = []
        for s, e in bounds:
            if merged and _inside_span(s, spans):
                merged[-1][1] = e
            else:
                merged.append([s, e])
        for s, e in merged:
            _emit(text, s, e, out)
        if m is not None and m.end() > m.start():
            out.append(Piece(m.start(), m.end(), False))
        pos = m.end() if m is not None else len(text)
    return [p for p in out if p.end > p.start]


def split_to_fit(
    text: str, start: int, end: int, fits: Callable[[str], bool], spans: Sequence[Span] = ()
) -> list[Piece]:
    """text[start:end] as translated pieces (and the spaces between them) that each satisfy `fits`: split
    at the clause mark nearest the middle, else the space nearest the middle, else the middle."""
    if fits(text[start:end]) or end - start < 2:
        return [Piece(start, end, True)]
    mid = (start + end) // 2
    clauses = [m.end() for m in _CLAUSE.finditer(text, start, end) if start < m.end() < end]
    spaces = [start + m.start() for m in re.finditer(r"\s+", text[start:end]) if m.start() > 0]
    cands = [c for c in clauses if not _inside_span(c, spans)] or [
        c for c in spaces if not _inside_span(c, spans)
    ]
    cut = min(cands, key=lambda c: abs(c - mid)) if cands else mid
    out: list[Piece] = []
    for s, e in ((start, cut), (cut, end)):
        sub: list[Piece] = []
        _emit(text, s, e, sub)
        for p in sub:
            out += split_to_fit(text, p.start, p.end, fits, spans) if p.translate else [p]
    return out
