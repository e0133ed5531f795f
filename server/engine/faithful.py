"""The faithful-text layer of the engine: texts -> model segments before decoding, n-best lists -> texts
after, with every protected span kept (runtime.faithful does the string work; this adds the tokenizer).

Two rounds, each a batch of segments for the scheduler (request-level and in-flight alike):

1. `prepare`: a text that fits the model (and has no tab) is one segment, the rest are cut into sentences
   and lines (separators copied from the source; sentences longer than SEGMENT_TOKENS split at a clause
   mark). Only what the model cannot read (emoji, other scripts, byte-spelled words) and glossary terms
   are masked; placeholders, tags, numbers and names stay visible, the way the model was trained.
2. `finish` verifies each output: every visible span back verbatim and as often, nothing placeholder-like
   lost or invented, printf in order, tags nested, and for a text sent whole the same sentences, lines and
   bullets. What passes is kept. What fails goes to a second round, sentence by sentence with every span
   masked (`finish` returns that round's Prepared), where the first hypothesis that restores cleanly is
   used, else the best one deliberately repaired, else the segment untranslated, with a note.

So a translation is as fluent as the model where the model is faithful, and faithful where it is not.
See docs/service.md, "Faithful text".
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Container, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

from runtime.decoding import DecodingOptions
from runtime.faithful.casing import match_first_case
from runtime.faithful.dictionary import DictionaryTerms
from runtime.faithful.lexicon import WORD, Lexicon, guard_reason, non_words
from runtime.faithful.mask import SENTINEL_PATTERN, Masked, mask, repair, restore
from runtime.faithful.memory import MemoryEntry, note_reason
from runtime.faithful.segment import COLUMNS, MAX_TEXT_CHARS, segment, split_to_fit
from runtime.faithful.spans import Glossary, Span, find_spans
from runtime.faithful.terms import is_known_word
from runtime.po_text import lone_accelerator, on_first_letter, place_accelerator
from runtime.tokenizer import Tokenizer
from server.contract import Hypothesis, InputTooLongError, Prepared, SegmentNote

__all__ = ["HIDDEN_KINDS", "SEGMENT_TOKENS", "TextLayer"]

# Longest segment given to the model whole, in source tokens: about the longest training segments (the
# corpus keeps pairs up to 250 characters); a longer sentence is split at clause marks, where the model
# translates far better than past anything it was trained on.
SEGMENT_TOKENS = 96
# Spans masked from the first round on: the model cannot read them, the glossary replaces them, or they
# are another tool's masks it has never seen (Weblate's `[X7X]`). Code (runtime.faithful.code) stays
# visible like placeholders and is verified: masked from the start, the held-out make, findutils, sed and
# cpio catalogs scored up to 0.4 chrF lower, with as few quoting failures.
HIDDEN_KINDS = frozenset({"glossary", "dictionary", "mask", "symbol", "control", "foreign", "rare"})

# The lexical guard's second try: a unit whose every hypothesis holds a non-word is decoded again with a
# beam this many times wider (on valid, beam 8 found a clean hypothesis for about half of them).
GUARD_BEAM_FACTOR = 2
Candidate = tuple[str, float, list[int]]  # (restored text, score, target ids)


@dataclass(eq=False)
class _Unit:
    """A region text[start:end] translated as one model segment."""

    start: int
    end: int
    masked: Masked
    visible: list[Span] | None  # first round: spans left visible (verified); None: everything masked
    whole: bool  # first round over several sentences or lines: the structure is verified too
    index: int = -1  # into the round's Prepared.segments; -1: nothing to translate
    cands: list[Candidate] = field(default_factory=list)
    note: SegmentNote | None = None
    # Sent again with a wider beam by the lexical guard: its first-round candidates and note, to keep
    # when the wider beam finds nothing better.
    kept: tuple[list[Candidate], SegmentNote | None] | None = None


@dataclass
class _Text:
    text: str  # without its menu accelerator, if it had one
    parts: list[str | _Unit]  # separators (copied) and units, in order
    accelerator: tuple[int, str, str] | None = None  # (position in the source, marker, letter)


@dataclass
class _Plan:
    """Prepared.plan: the requested options, the texts, and the units of the round being decoded."""

    requested: DecodingOptions
    glossary: Glossary | None
    texts: list[_Text]
    units: list[_Unit]
    rounds: int = 0  # rounds prepared so far


class TextLayer:
    """Segmentation, protection and restoration around a tokenizer and the model's window."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_source_tokens: int,
        keep_terms: Collection[str] = (),
        source_words: Collection[str] = (),
        memory: Mapping[str, MemoryEntry] | None = None,
        lexicon: Lexicon | None = None,
        max_beam_size: int = 0,
        dictionary: DictionaryTerms | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.memory = memory or {}
        # The lexical guard (docs/service.md, "Faithful text"): None = off, or a bundle without a lexicon.
        self.lexicon = lexicon
        self.max_beam_size = max_beam_size
        self._allowed = _allowed_words(keep_terms, self.memory) if lexicon is not None else frozenset()
        self.max_source_tokens = max_source_tokens
        self.segment_tokens = min(max_source_tokens, SEGMENT_TOKENS)
        self.keep_terms = frozenset(keep_terms)
        self.source_words = frozenset(source_words)
        # Words the catalogs seldom hold, as the dictionaries translate them (runtime.faithful.dictionary).
        self.dictionary = dictionary if dictionary else None
        self._byte_piece = lru_cache(maxsize=8192)(self._is_rare)
        self._unknown = lru_cache(maxsize=65536)(self._is_unknown) if self.source_words else None
        self._plain_spans = lru_cache(maxsize=4096)(lambda text: tuple(self._find_spans(text, None)))

    def _is_unknown(self, word: str) -> bool:
        """Whether the model never saw `word` in any inflection (runtime.faithful.terms)."""
        return not is_known_word(word, self.source_words)

    def _is_rare(self, ch: str) -> bool:
        """Whether the tokenizer can only spell `ch` with byte pieces (the model has hardly seen it)."""
        sp = self.tokenizer.sp
        ids = [i for i in sp.encode(ch) if sp.id_to_piece(i) != "\u2581"]
        return bool(ids) and all(sp.is_byte(i) for i in ids)

    def spans(self, text: str, glossary: Glossary | None = None) -> list[Span]:
        """The protected spans of `text`. Without a glossary they are cached: the first round looks at a
        text up to three times (does it fit, its sentences, its unit)."""
        if glossary is None:
            return list(self._plain_spans(text))
        return self._find_spans(text, glossary)

    def _find_spans(self, text: str, glossary: Glossary | None) -> list[Span]:
        return find_spans(
            text,
            keep_terms=self.keep_terms,
            glossary=glossary,
            rare_char=self._byte_piece,
            unknown_word=self._unknown,
            dictionary=self.dictionary.find if self.dictionary is not None else None,
        )

    def _tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    # ---- units ----------------------------------------------------------------------------------------

    def _unit(
        self, text: str, start: int, end: int, first: bool, whole: bool, gloss: Glossary | None
    ) -> _Unit:
        piece = text[start:end]
        spans = self.spans(piece, gloss)
        spans = [s for s in spans if s.kind != "unknown" or _name_like(piece, s, len(spans))]
        hidden = [s for s in spans if s.kind in HIDDEN_KINDS]
        visible = [s for s in spans if s.kind not in HIDDEN_KINDS]
        full = mask(piece, spans)
        if not full.translatable:  # only spans (a number, a name, an emoji): nothing for the model
            return _Unit(start, end, full, None, False)
        # A first try only when it can differ from the full masking, and never with visible %1 / {0}
        # next to sentinels (they would read as each other).
        if first and (visible or whole) and not (hidden and SENTINEL_PATTERN.search(piece)):
            tags = [s for s in visible if s.kind == "tag"]
            return _Unit(start, end, mask(piece, hidden, tags), visible, whole)
        return _Unit(start, end, full, None, False)

    def _fits(self, hide_all: bool, gloss: Glossary | None):
        def fits(piece: str) -> bool:
            spans = self.spans(piece, gloss)
            hidden = spans if hide_all else [s for s in spans if s.kind in HIDDEN_KINDS]
            return self._tokens(mask(piece, hidden).text) <= self.segment_tokens

        return fits

    def _split(
        self, text: str, start: int, end: int, first: bool, gloss: Glossary | None
    ) -> list[str | _Unit]:
        """text[start:end] cut into sentences and lines that fit: separators and units."""
        parts: list[str | _Unit] = []
        fits = self._fits(not first, gloss)
        region = text[start:end]
        for piece in segment(region, self.spans(region, gloss)):
            if not piece.translate:
                parts.append(region[piece.start : piece.end])
                continue
            for sub in split_to_fit(region, piece.start, piece.end, fits):
                if sub.translate:
                    parts.append(self._unit(text, start + sub.start, start + sub.end, first, False, gloss))
                else:
                    parts.append(region[sub.start : sub.end])
        return parts

    def _from_memory(self, text: str, start: int, end: int, gloss: Glossary | None) -> _Unit | None:
        """text[start:end] as the translation memory has it (runtime/faithful/memory.py), or None: not
        in it, a glossary term of the request is in it (the request's terms win), or the human
        translation does not keep the protected spans verbatim (a reformatted number, say)."""
        piece = text[start:end]
        entry = self.memory.get(piece)
        if entry is None:
            return None
        # A dictionary term gives way to the human translation (which need not hold it verbatim).
        spans = [s for s in self.spans(piece, gloss) if s.kind != "dictionary"]
        if any(s.kind == "glossary" for s in spans):
            return None
        # visible: the spans the model's alternatives must keep too, when n-best is asked (_round).
        unit = _Unit(start, end, mask(piece, []), spans, False)
        kept, problem = restore(unit.masked, entry.target, spans)
        if kept is None or problem is not None:
            return None
        unit.cands = [(entry.target, 0.0, [])]
        unit.note = SegmentNote("memory", start, end, note_reason(entry))
        return unit

    def _first_round(self, text: str, gloss: Glossary | None) -> list[str | _Unit]:
        core = text.strip()
        if not core:
            return [text]
        a = len(text) - len(text.lstrip())
        b = a + len(core)
        lead, trail = [text[:a]] if a else [], [text[b:]] if b < len(text) else []
        if (known := self._from_memory(text, a, b, gloss)) is not None:
            return [*lead, known, *trail]
        if not COLUMNS.search(core) and self._fits(False, gloss)(core):
            several = sum(p.translate for p in segment(core, self.spans(core, gloss))) > 1
            return [*lead, self._unit(text, a, b, True, several, gloss), *trail]
        return [*lead, *self._split(text, a, b, True, gloss), *trail]

    def _round(self, plan: _Plan, units: list[_Unit], options: DecodingOptions) -> Prepared:
        """The Prepared of a round: the distinct masked segments of its translatable units."""
        index: dict[str, int] = {}
        segments: list[str] = []
        waiting = []
        for u in units:
            if u.cands and not self._memory_alternatives(u, options):  # the memory's: nothing for the model
                continue
            if not u.masked.translatable:  # only spans: as they are (a glossary term as its target)
                kept = restore(u.masked, u.masked.text, u.visible)[0]
                u.cands = [(kept if kept is not None else u.masked.source, 0.0, [])]
                # Only spans. A dictionary term among them is a translation (unnoted, as one inside a
                # sentence is), not the source kept: a catalog client would leave the entry out.
                if not any(s.kind == "dictionary" for s in u.masked.spans):
                    u.note = SegmentNote("passed_through", u.start, u.end, "nothing to translate")
                continue
            u.index = index.setdefault(u.masked.text, len(segments))
            if u.index == len(segments):
                segments.append(u.masked.text)
            waiting.append(u)
        plan.units = waiting
        plan.rounds += 1
        # Candidates to fall back on, for every segment whatever its batch-mates (a segment's result must
        # not depend on the request it came with): a first try may pass with the beam's second hypothesis,
        # a masked segment needs them to restore. Measured on test: +0.3 BLEU at the same time.
        run = replace(options, num_hypotheses=options.beam_size) if options.beam_size > 1 else options
        return Prepared(segments, [self._tokens(s) for s in segments], run, plan)

    def _memory_alternatives(self, u: _Unit, options: DecodingOptions) -> bool:
        """Whether a unit answered from the translation memory also goes to the model: only when an
        n-best list was asked for (the memory holds one translation; without the model's, a client asking
        for alternatives got none for such a text) and the text fits the model's window."""
        return (
            u.note is not None
            and u.note.action == "memory"
            and options.num_hypotheses > 1
            and u.masked.translatable
            and self._tokens(u.masked.text) <= self.segment_tokens
        )

    # ---- the contract -----------------------------------------------------------------------------------

    def prepare(
        self,
        texts: Sequence[str],
        options: DecodingOptions,
        glossary: Mapping[str, str] | None = None,
        *,
        accelerators: bool = True,
    ) -> Prepared:
        """The first round; InputTooLongError names a text over MAX_TEXT_CHARS. accelerators: a text's
        menu accelerator (`_Save`, `&Save`, `~Save`: runtime.po_text.lone_accelerator) is taken out before
        the model (trained without them) and put on a letter of the translation; False when the caller
        handled them (catalogs) or the texts are not UI labels."""
        gloss = Glossary(dict(glossary)) if glossary else None
        plans = []
        for i, text in enumerate(texts):
            if len(text) > MAX_TEXT_CHARS:
                raise InputTooLongError(
                    f"texts[{i}] has {len(text)} characters, over the limit of {MAX_TEXT_CHARS} "
                    "(max_text_chars); send long documents in several texts (e.g. one per paragraph)"
                )
            text, accel = lone_accelerator(text) if accelerators else (text, None)
            plans.append(_Text(text, self._first_round(text, gloss), accel))
        units = [u for t in plans for u in t.parts if isinstance(u, _Unit)]
        return self._round(_Plan(options, gloss, plans, []), units, options)

    def finish(
        self, prepared: Prepared, results: Sequence[list[Hypothesis] | None]
    ) -> list[list[Hypothesis]] | Prepared:
        """The texts' n-best lists (at most the requested size, never empty), or the Prepared of the
        second round when some first-round output failed its checks (decode it and call finish again)."""
        plan: _Plan = prepared.plan
        n_best = plan.requested.num_hypotheses
        retry: dict[int, list[str | _Unit]] = {}
        for u in plan.units:
            hyps = results[u.index]
            assert hyps is not None, "finish() needs every segment's n-best list"
            if u.note is not None and u.note.action == "memory":
                # The memory's translation first, the model's as its alternatives (spans kept verbatim).
                model = [c for c in _first_candidates(u, hyps) if c[0] != u.cands[0][0]]
                u.cands = [u.cands[0], *model][:n_best]
                continue
            if u.kept is not None:
                self._wider_beam(u, hyps, plan.glossary, prepared.options.beam_size)
                u.cands = u.cands[:n_best]
                _note_copy(u, self.lexicon)
                continue
            if u.visible is None:
                u.cands, u.note = _final_candidates(u, hyps)
            else:
                u.cands = _first_candidates(u, hyps)
            if self._guard(u, plan.glossary) and plan.rounds == 1 and self._second_beam(plan.requested):
                u.kept, u.cands, u.note = (u.cands, u.note), [], None
                retry[id(u)] = [u]
                continue
            u.cands = u.cands[:n_best]
            _note_copy(u, self.lexicon)
            if u.visible is not None and not u.cands:
                text = next(t.text for t in plan.texts if any(p is u for p in t.parts))
                if u.whole:
                    retry[id(u)] = self._split(text, u.start, u.end, False, plan.glossary)
                else:
                    retry[id(u)] = [self._unit(text, u.start, u.end, False, False, plan.glossary)]
        if retry:
            for t in plan.texts:
                t.parts = [p for part in t.parts for p in retry.get(id(part), [part])]
            units = [u for parts in retry.values() for u in parts if isinstance(u, _Unit)]
            second = plan.requested
            if wider := self._second_beam(second):
                second = replace(second, beam_size=wider)
            return self._round(plan, units, second)
        return [_with_accelerator(t, _assemble(t, n_best, self.keep_terms)) for t in plan.texts]

    def non_words(self, source: str, output: str, glossary: Glossary | None = None) -> list[str]:
        """The words of `output` (a translation of `source`) that the lexical guard objects to: in no
        dictionary of the lexicon, not copied from the source, not a do-not-translate, glossary or
        translation-memory term (runtime.faithful.lexicon.non_words). Empty without a lexicon."""
        if self.lexicon is None:
            return []
        allowed: Container[str] = self._allowed
        if glossary is not None and glossary.terms:
            extra = {w.lower() for pair in glossary.terms.items() for t in pair for w in WORD.findall(t)}
            allowed = _Either(self._allowed, extra)
        return non_words(source, output, self.lexicon, allowed)

    def _guard(self, u: _Unit, glossary: Glossary | None) -> bool:
        """The lexical guard on a unit's candidates (the model's, best first): when the best holds a word
        the guard objects to, the first candidate without one goes first; when none is left, the best
        stays and a note names the word. A unit passed through or kept as the source is left alone.
        True when none was left for a unit the text layer had not noted otherwise: a wider beam may
        find one (finish sends it to the second round)."""
        if self.lexicon is None or not u.cands or (u.note is not None and u.note.action != "repaired"):
            return False
        source = u.masked.source
        bad = self.non_words(source, u.cands[0][0], glossary)
        if not bad:
            return False
        clean = next(
            (i for i, c in enumerate(u.cands[1:], 1) if not self.non_words(source, c[0], glossary)), None
        )
        if clean is not None:
            u.cands.insert(0, u.cands.pop(clean))
        reason = guard_reason(bad[0], None if clean is None else clean + 1)
        alone = u.note is None
        if u.note is None:
            u.note = SegmentNote("repaired", u.start, u.end, reason)
        else:
            u.note = replace(u.note, reason=f"{u.note.reason}; {reason}")
        return clean is None and alone

    def _second_beam(self, options: DecodingOptions) -> int:
        """The beam of the second round with the lexical guard on: twice the requested one, within the
        model's limit (0: no wider beam: guard off, greedy decoding, or the limit already)."""
        if self.lexicon is None or options.beam_size < 2:
            return 0
        wider = min(GUARD_BEAM_FACTOR * options.beam_size, self.max_beam_size)
        return wider if wider > options.beam_size else 0

    def _wider_beam(self, u: _Unit, hyps: list[Hypothesis], glossary: Glossary | None, beam: int) -> None:
        """A unit sent again by the guard: the wider beam's first candidate without a non-word (as the
        model wrote it, or restored after a lost span) goes before the first round's candidates; else
        the first round's candidates and note stay."""
        assert u.kept is not None
        cands, note = u.kept
        if u.visible is None:
            wide, wide_note = _final_candidates(u, hyps)
        else:
            wide, wide_note = _first_candidates(u, hyps), None
        if wide_note is None or wide_note.action == "repaired":
            source = u.masked.source
            for k, c in enumerate(wide):
                if not self.non_words(source, c[0], glossary):
                    word = self.non_words(source, cands[0][0], glossary)[0]
                    reason = guard_reason(word, k + 1, beam)
                    if wide_note is not None:
                        reason = f"{wide_note.reason}; {reason}"
                    cands = [c, *(o for o in cands if o[0] != c[0])]
                    note = SegmentNote("repaired", u.start, u.end, reason)
                    break
        u.cands, u.note, u.kept = cands, note, None


def _allowed_words(keep_terms: Collection[str], memory: Mapping[str, MemoryEntry]) -> frozenset[str]:
    """Words a translation may hold though the lexicon lacks them (lowercase): those of the
    do-not-translate terms, and Debian's own terms: words of at least two of the translation memory's
    human translations that none of its sources holds (`miniaplicación`, `búfer`, `superusuario`; not a
    name or an English word the translators copied, like `Helo`, nor a one-off typo). Chosen on the
    everyday set: allowing every word of the memory's translations let `¡Helo!` through for `Hello!`."""
    copied = set(WORD.findall("\n".join(memory).lower()))
    targets = Counter(w for e in memory.values() for w in set(WORD.findall(e.target.lower())))
    terms = {w.lower() for t in keep_terms for w in WORD.findall(t)}
    return frozenset(terms | {w for w, n in targets.items() if n >= 2 and w not in copied})


class _Either:
    """Membership in either of two containers (the layer's allowed words and a request's glossary words),
    without copying the big one."""

    def __init__(self, a: Container[str], b: Container[str]) -> None:
        self.a, self.b = a, b

    def __contains__(self, item: object) -> bool:
        return item in self.a or item in self.b


_WORDS = re.compile(r"[^\W\d_]+")


def _name_like(piece: str, span: Span, n_spans: int) -> bool:
    """Whether a capitalised word the model never saw reads as a name: all there is (Openbox), or inside
    a sentence that is not in title case ("for other Blueman components"). A first word or a title-case
    label may well be a rare English word (Terbium, "Decorative Dried", "Hardmask: enabled")."""
    if n_spans == 1 and piece.strip() == span.text:
        return True
    if not piece[: span.start].strip():
        return False
    # Title case: most words after the first capitalised (acronyms and CamelCase names aside).
    words = [w for w in _WORDS.findall(piece)[1:] if not (w.isupper() or w[1:] != w[1:].lower())]
    return len(words) >= 2 and sum(w[0].isupper() for w in words) * 2 < len(words)


def _structure(text: str) -> tuple[int, list[str]]:
    """(sentences, separators without their spaces): what a text sent whole must keep."""
    pieces = segment(text)
    seps = [text[p.start : p.end].strip(" ") for p in pieces if not p.translate]
    return sum(p.translate for p in pieces), [s for s in seps if s]


# A word stuttered: "Guardar Guardar", "Modo de modo", "Siempre siempre" (3+ letters, again at once or
# after one short word, any case).
_STUTTER = re.compile(r"\b(\w{3,})\s+(?:\w{1,3}\s+)?\1\b", re.IGNORECASE)


def _fluent_first(source: str, cands: list[Candidate]) -> list[Candidate]:
    """The candidates with a stuttered word the source does not have last (stable)."""
    if not _STUTTER.search(source):
        cands = sorted(cands, key=lambda c: _STUTTER.search(c[0]) is not None)
    return cands


# Spanish opening marks and the mark that closes each: a question or exclamation opened on one line of
# the output must close on the same line as the source's (the model, sent `Open the file\nSave changes?`
# whole, opened a question on both lines).
_OPENING = {"\u00bf": "?", "\u00a1": "!"}


def _stray_opening(source: str, output: str) -> bool:
    """Whether `output` opens a question or exclamation it does not close, opens one inside another, or
    has a line whose closing marks differ in number from the source's same line (lines compared when
    both have as many). A source that has opening marks itself is left alone."""
    if any(mark in source for mark in _OPENING):
        return False
    for opening, closing in _OPENING.items():
        open_ = False
        for ch in output:
            if ch == opening:
                if open_:
                    return True
                open_ = True
            elif ch == closing:
                open_ = False
        if open_:
            return True
        src_lines, out_lines = source.split("\n"), output.split("\n")
        if len(src_lines) == len(out_lines) and any(
            a.count(closing) != b.count(closing) for a, b in zip(src_lines, out_lines, strict=True)
        ):
            return True
    return False


def _outside_spans(u: _Unit, text: str) -> str:
    """The parts of the source-shaped `text` outside the unit's visible spans (its words, not markup)."""
    words, pos = [], 0
    for span in sorted(u.visible or (), key=lambda s: s.start):
        words.append(text[pos : span.start])
        pos = max(pos, span.end)
    words.append(text[pos:])
    return " ".join(words)


def _copied(u: _Unit, text: str) -> bool:
    """A first-round output that is the source as it was, markup and all, where the source has words:
    visible markup (`<p class="green">Hello!</p>`) can make the model copy its input, which passes
    every check. Such an output goes after the others (and `_note_copy` may say so)."""
    if not u.visible or text != u.masked.source:
        return False
    return _LETTERS.search(_outside_spans(u, text)) is not None


_LETTERS = re.compile(r"[^\W\d_]{2,}")


def _note_copy(u: _Unit, lexicon: Lexicon | None) -> None:
    """A unit whose best candidate is its source copied (`_copied`) says so in its note, where the copy
    is visibly not the target language: the text has markup, and a word outside it is in no dictionary
    of the target language (`<p>Hello!</p>` is noted, `<b>General</b>` is Spanish as it is). Without a
    lexicon, or for a text without markup (a usage line, `Open %s`), a copy is not told from a right
    answer, and is not noted."""
    if lexicon is None or not u.cands or not _copied(u, u.cands[0][0]):
        return
    if u.note is not None and u.note.action == "memory":
        return
    if not any(s.kind == "tag" for s in u.visible or ()):
        return
    words = [w for w in WORD.findall(_outside_spans(u, u.cands[0][0])) if _LETTERS.fullmatch(w)]
    if all(w.lower() in lexicon for w in words):
        return
    reason = "the model gave the text back untranslated"
    if u.note is not None:
        reason = f"{reason}; {u.note.reason}"
    u.note = SegmentNote("passed_through", u.start, u.end, reason)


def _first_candidates(u: _Unit, hyps: list[Hypothesis]) -> list[Candidate]:
    """The first-round outputs that keep every span (and, sent whole, the structure), best first (all
    of them: the lexical guard may look past the best, finish cuts to the requested n-best)."""
    want = _structure(u.masked.source) if u.whole else None
    out: list[Candidate] = []
    for h in hyps:
        text, problem = restore(u.masked, h.text, u.visible)
        if text is None or problem is not None or (want is not None and _structure(text) != want):
            continue
        if _stray_opening(u.masked.source, text):
            continue
        if text not in [c[0] for c in out]:
            out.append((text, h.score, h.tokens))
    return sorted(_fluent_first(u.masked.source, out), key=lambda c: _copied(u, c[0]))


def _final_candidates(u: _Unit, hyps: list[Hypothesis]) -> tuple[list[Candidate], SegmentNote | None]:
    """A fully masked segment's usable translations, best first, and the note on the best one (None when
    it is the model's best hypothesis as written): the next hypothesis, a repair, or the source."""
    m = u.masked
    cands: list[Candidate] = []
    first_problem = None
    used = None
    for j, h in enumerate(hyps):
        text, problem = restore(m, h.text)
        if text is None:
            first_problem = first_problem or problem
            continue
        used = j if used is None else used
        if text not in [c[0] for c in cands]:
            cands.append((text, h.score, h.tokens))
    cands = _fluent_first(m.source, cands)
    if used == 0:
        return cands, None
    if used is not None:
        return cands, SegmentNote("repaired", u.start, u.end, f"{first_problem}; used hypothesis {used + 1}")
    fixed = repair(m, hyps[0].text)
    if fixed is not None and (text := restore(m, fixed)[0]) is not None:
        return [(text, hyps[0].score, hyps[0].tokens)], SegmentNote(
            "repaired", u.start, u.end, f"{first_problem}; put back"
        )
    return [(m.source, 0.0, [])], SegmentNote(
        "passed_through", u.start, u.end, f"{first_problem}; kept the source"
    )


def _with_accelerator(t: _Text, hyps: list[Hypothesis]) -> list[Hypothesis]:
    """The hypotheses with the source's accelerator put back on a letter (runtime.po_text's rule: on the
    first letter when the source had it there, else the same letter elsewhere if there is one), and the
    notes' offsets moved back into the source."""
    if t.accelerator is None:
        return hyps
    at, mark, letter = t.accelerator
    first = on_first_letter(t.text, at)

    def source_offset(i: int) -> int:
        return i + 1 if i > at else i

    out = []
    for h in hyps:
        text = place_accelerator(h.text, mark, letter, first) if h.text.strip() else None
        notes = tuple(replace(n, start=source_offset(n.start), end=source_offset(n.end)) for n in h.notes)
        out.append(replace(h, text=h.text if text is None else text, notes=notes))
    return out


def _assemble(t: _Text, n_best: int, keep: Collection[str] = ()) -> list[Hypothesis]:
    """The text's n-best list: hypothesis k joins each unit's k-th candidate (its last when it has fewer);
    the score is the mean over translated units; the notes go on the best one."""
    units = [p for p in t.parts if isinstance(p, _Unit)]
    translated = [u for u in units if u.index >= 0]
    notes = tuple(sorted((u.note for u in units if u.note is not None), key=lambda n: n.start))
    width = max([len(u.cands) for u in units], default=1)
    out = []
    for k in range(min(n_best, width)):
        pieces, tokens = [], []
        for p in t.parts:
            if isinstance(p, str):
                pieces.append(p)
            else:
                text, _, toks = p.cands[min(k, len(p.cands) - 1)]
                pieces.append(text)
                tokens += toks
        scores = [u.cands[min(k, len(u.cands) - 1)][1] for u in translated]
        score = sum(scores) / len(scores) if scores else 0.0
        text = match_first_case(t.text, "".join(pieces), keep)
        out.append(Hypothesis(text, score, tokens, notes if k == 0 else ()))
    return out
