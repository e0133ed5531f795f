"""The faithful-text layer of the engine: texts -> model segments before decoding, n-best lists -> texts
after, with every protected span kept (runtime.faithful does the string work; this adds the tokenizer).

`prepare` cuts each text into segments (sentences and lines; sentences longer than the model's window are
split at a clause mark or a space), masks each segment's protected spans, and lists the distinct masked
segments the model must translate, with their token counts; the scheduler batches those like any other
segments (request-level and in-flight alike), so a long text costs what its sentences cost. `finish` takes
one n-best list per segment and rebuilds each text: per segment the first hypothesis that restores
cleanly, else the best one deliberately repaired, else the source segment untranslated; separators
(spaces, line breaks, tabs, bullets) are copied from the source. See docs/service.md, "Faithful text".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

from runtime.decoding import DecodingOptions
from runtime.faithful.mask import Masked, mask, repair, restore
from runtime.faithful.segment import MAX_TEXT_CHARS, Piece, segment, split_to_fit
from runtime.faithful.spans import Glossary, find_spans
from runtime.faithful.terms import is_known_word
from runtime.tokenizer import Tokenizer
from server.contract import Hypothesis, InputTooLongError, Prepared, SegmentNote

__all__ = ["TextLayer"]


@dataclass
class _Text:
    """How one text is rebuilt: literal separators and masked segments (indices into Prepared.segments)."""

    text: str
    parts: list[tuple[Piece, Masked | None, int]] = field(default_factory=list)  # (piece, masked, index)


@dataclass
class _Plan:
    """Prepared.plan: the requested options and how to rebuild each text. Prepared.segments are the
    distinct masked segments in first-appearance order; Prepared.options widen the n-best list to the beam
    when a segment has protected spans (candidates to fall back on)."""

    requested: DecodingOptions
    texts: list[_Text]


# Longest segment given to the model whole, in source tokens: about the longest training segments (the
# corpus keeps pairs up to 250 characters); a longer sentence is split at clause marks, where the model
# translates far better than past anything it was trained on.
SEGMENT_TOKENS = 96


class TextLayer:
    """Segmentation, protection and restoration around a tokenizer and the model's window."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_source_tokens: int,
        keep_terms: Collection[str] = (),
        source_words: Collection[str] = (),
    ) -> None:
        self.tokenizer = tokenizer
        self.max_source_tokens = max_source_tokens
        self.keep_terms = frozenset(keep_terms)
        self.source_words = frozenset(source_words)
        self._byte_piece = lru_cache(maxsize=8192)(self._is_rare)
        self._unknown = lru_cache(maxsize=65536)(self._is_unknown) if self.source_words else None

    def _is_unknown(self, word: str) -> bool:
        """Whether the model never saw `word` in any inflection (runtime.faithful.terms)."""
        return not is_known_word(word, self.source_words)

    def _is_rare(self, ch: str) -> bool:
        """Whether the tokenizer can only spell `ch` with byte pieces (the model has hardly seen it)."""
        sp = self.tokenizer.sp
        ids = [i for i in sp.encode(ch) if sp.id_to_piece(i) != "\u2581"]
        return bool(ids) and all(sp.is_byte(i) for i in ids)

    def spans(self, text: str, glossary: Glossary | None = None) -> list:
        return find_spans(
            text,
            keep_terms=self.keep_terms,
            glossary=glossary,
            rare_char=self._byte_piece,
            unknown_word=self._unknown,
        )

    def _masked(self, text: str, glossary: Glossary | None) -> Masked:
        return mask(text, self.spans(text, glossary))

    def _fits(self, glossary: Glossary | None):
        limit = min(self.max_source_tokens, SEGMENT_TOKENS)

        def fits(piece: str) -> bool:
            return len(self.tokenizer.encode(self._masked(piece, glossary).text)) <= limit

        return fits

    def prepare(
        self, texts: Sequence[str], options: DecodingOptions, glossary: Mapping[str, str] | None = None
    ) -> Prepared:
        """Segment and mask `texts`; InputTooLongError names a text over MAX_TEXT_CHARS."""
        gloss = Glossary(dict(glossary)) if glossary else None
        index: dict[str, int] = {}
        segments: list[str] = []
        plans: list[_Text] = []
        spans_seen = False
        for i, text in enumerate(texts):
            if len(text) > MAX_TEXT_CHARS:
                raise InputTooLongError(
                    f"texts[{i}] has {len(text)} characters, over the limit of {MAX_TEXT_CHARS} "
                    "(max_text_chars); send long documents in several texts (e.g. one per paragraph)"
                )
            plan = _Text(text)
            fits = self._fits(gloss)
            for piece in segment(text, self.spans(text, gloss)):
                if not piece.translate:
                    plan.parts.append((piece, None, -1))
                    continue
                for sub in split_to_fit(text, piece.start, piece.end, fits):
                    if not sub.translate:
                        plan.parts.append((sub, None, -1))
                        continue
                    m = self._masked(text[sub.start : sub.end], gloss)
                    spans_seen = spans_seen or bool(m.spans)
                    if not m.translatable:
                        plan.parts.append((sub, m, -1))
                        continue
                    if m.text not in index:
                        index[m.text] = len(segments)
                        segments.append(m.text)
                    plan.parts.append((sub, m, index[m.text]))
            plans.append(plan)
        counts = [len(self.tokenizer.encode(s)) for s in segments]
        run = options
        if spans_seen and options.beam_size > 1:
            run = replace(options, num_hypotheses=options.beam_size)  # candidates to fall back on
        return Prepared(segments, counts, run, _Plan(options, plans))

    def finish(
        self, prepared: Prepared, results: Sequence[list[Hypothesis] | None]
    ) -> list[list[Hypothesis]]:
        """One n-best list per text (at most the requested size, never empty), rebuilt from the segments'
        n-best lists (one per Prepared.segments entry)."""
        n_best = prepared.plan.requested.num_hypotheses
        out = []
        for plan in prepared.plan.texts:
            choices: list[list[tuple[str, float, list[int]]]] = []  # per translated part: candidates
            notes: list[SegmentNote] = []
            for piece, m, idx in plan.parts:
                if m is None or idx < 0:
                    continue
                hyps = results[idx]
                assert hyps is not None, "finish() needs every segment's n-best list"
                cands, note = _candidates(m, hyps, n_best)
                if note is not None:
                    notes.append(SegmentNote(note[0], piece.start, piece.end, note[1]))
                choices.append(cands)
            for piece, m, idx in plan.parts:
                if m is not None and idx < 0:
                    notes.append(
                        SegmentNote("passed_through", piece.start, piece.end, "nothing to translate")
                    )
            notes.sort(key=lambda n: n.start)
            width = max([len(c) for c in choices], default=1)
            hyps_out = []
            for k in range(min(n_best, width)):
                texts_k, score, tokens = [], 0.0, []
                it = iter(choices)
                for piece, m, idx in plan.parts:
                    if m is None:
                        texts_k.append(plan.text[piece.start : piece.end])
                    elif idx < 0:
                        texts_k.append(m.source)
                    else:
                        cands = next(it)
                        text, s, toks = cands[min(k, len(cands) - 1)]
                        texts_k.append(text)
                        score += s
                        tokens += toks
                score = score / len(choices) if choices else 0.0
                hyps_out.append(Hypothesis("".join(texts_k), score, tokens, tuple(notes) if k == 0 else ()))
            out.append(hyps_out)
        return out


def _candidates(
    m: Masked, hyps: list[Hypothesis], n_best: int
) -> tuple[list[tuple[str, float, list[int]]], tuple[str, str] | None]:
    """A segment's usable translations, best first, and the note on the best one (None when it is the
    model's best hypothesis as written)."""
    cands: list[tuple[str, float, list[int]]] = []
    first_problem = None
    used = None
    for j, h in enumerate(hyps):
        text, problem = restore(m, h.text)
        if text is None:
            first_problem = first_problem or problem
            continue
        if used is None:
            used = j
        if text not in [c[0] for c in cands]:
            cands.append((text, h.score, h.tokens))
        if len(cands) >= n_best:
            break
    if used == 0:
        return cands, None
    if used is not None:
        return cands, ("repaired", f"{first_problem}; used hypothesis {used + 1}")
    fixed = repair(m, hyps[0].text)
    if fixed is not None:
        text, _ = restore(m, fixed)
        assert text is not None
        return [(text, hyps[0].score, hyps[0].tokens)], ("repaired", f"{first_problem}; put back")
    return [(m.source, 0.0, [])], ("passed_through", f"{first_problem}; kept the source")
