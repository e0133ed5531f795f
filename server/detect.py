"""Language identification for the HTTP API's /detect and `source=auto`.

The identifier is py3langid (langid.py's naive Bayes over byte n-grams; its model ships inside the PyPI
wheel, 4.6 MB, nothing is downloaded at run time). Chosen by `python -m bench.detect` on the corpora's
valid splits against lingua (a little more accurate on one-word strings, a 96 MB wheel, 3.5 s to load
and 40x slower per call) and langdetect (less accurate, 100x slower): docs/service.md, "Language
detection".

Short UI strings are often no language at all ("OK", "Total", "Krita"), so `source=auto` does not trust
a weak guess: a text routes with the served source language unless the identifier names another language
with at least SURE confidence (`choose_source`). French input is refused, not translated as English;
"Save" is not refused because its likeliest language happens to be Breton at 2%.

Loading takes about 1.5 s (the model is xz-compressed) and a call is pure Python over the text's bytes,
so both run in a thread of their own, never on the event loop; each text is read up to DETECT_CHARS.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runtime.faithful.segment import MAX_TEXT_CHARS
from server.languages import Pair, bcp47, name_of, resolve_code, show_pairs
from server.translate import INVALID, Failure, TranslationCore

# What the identifier may answer: the languages LibreTranslate's own models cover (what its clients can
# name as a source), as py3langid spells them ("no" is Norwegian Bokmål, LibreTranslate's "nb"). A
# narrower set is more accurate on short strings (bench.detect: 140 languages vs these), and a text in a
# language outside it is still refused, under the nearest name in it.
CANDIDATES = (
    "ar az bg bn ca cs da de el en eo es et eu fa fi fr ga gl he hi hu id it ja ko ky lt lv ms nl no pl "
    "pt ro ru sk sl sq sr sv th tl tr uk ur vi zh"
).split()
# A guess of a language the server does not translate from refuses the text only at this confidence
# (percent) or more; below it the text routes with the served source (bench.detect measures both errors).
SURE = 30.0
# Characters of a text the identifier reads: its accuracy is flat past a few dozen words, and the cost is
# linear (a 20,000-character text took 14 ms, all in Python).
DETECT_CHARS = 1000
RANKED = 3  # candidates /detect lists per text, best first (LibreTranslate lists several too)


@dataclass(frozen=True)
class Guess:
    """A language and the identifier's confidence in it, in percent (LibreTranslate's /detect items)."""

    language: str
    confidence: float

    def as_json(self) -> dict[str, Any]:
        return {"confidence": self.confidence, "language": self.language}


class LanguageIdentifier:
    """py3langid over CANDIDATES, loaded on first use; `await rank_many(texts)` off the event loop."""

    def __init__(self, languages: Sequence[str] = CANDIDATES) -> None:
        self.languages = list(languages)
        self._model: Any = None
        self._lock = threading.Lock()
        # One thread: a call holds the GIL for its whole Python loop anyway, and this keeps the work of
        # many /detect requests in line instead of in asyncio's default executor (which exit waits for).
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="detect")

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                from py3langid.langid import MODEL_FILE
                from py3langid.langid import LanguageIdentifier as Model

                model = Model.from_model_file(MODEL_FILE, norm_probs=True)
                model.set_languages(self.languages)
                self._model = model
        return self._model

    def rank(self, text: str) -> list[Guess]:
        """Every candidate language of `text`, likeliest first (blocking: call it from a thread)."""
        ranked = self._load().rank(text[:DETECT_CHARS])
        return [Guess(code, round(100 * p, 2)) for code, p in ranked]

    async def rank_many(self, texts: Sequence[str]) -> list[list[Guess]]:
        """`rank` of each text, in the identifier's thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: [self.rank(t) for t in texts])

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class Choice:
    """What `source=auto` does with a text: route with `source` (a served code), or refuse it
    (`source` is None) because it is `detected`, a language the server does not translate from."""

    source: str | None
    detected: Guess


def choose_source(ranked: Sequence[Guess], served: Sequence[str], sure: float = SURE) -> Choice:
    """The served source language a text ranked by the identifier (every candidate, best first) routes
    with.

    The likeliest language when it is served (pt names pt_BR: server.languages.resolve_code); else a
    refusal when the identifier is at least `sure` of it; else, too unsure to refuse, the served source
    it ranks highest, with the identifier's confidence in it."""
    if not served:
        raise ValueError("choose_source needs at least one served source language")
    if ranked and resolve_code(ranked[0].language, served) is None and ranked[0].confidence >= sure:
        return Choice(None, ranked[0])
    for guess in ranked:
        if (code := resolve_code(guess.language, served)) is not None:
            return Choice(code, Guess(bcp47(code), guess.confidence))
    return Choice(served[0], Guess(bcp47(served[0]), 0.0))


class SourceRefused(ValueError):
    """`source=auto` found a text in a language the server does not translate (to the target asked)."""


def auto_source(
    rankings: Sequence[Sequence[Guess]], served: Sequence[str], pairs: str
) -> tuple[str, list[Guess]]:
    """The one served source that every text of a request routes with, and what to report for each
    (LibreTranslate's detectedLanguage). SourceRefused, with a message naming the text, what it was
    detected as and the served pairs (`pairs`), when a text is surely in another language, or when the
    texts are in two served languages (one request is translated by one model)."""
    if not rankings:  # nothing to detect (an empty file): the first served source, unsure
        return served[0], []
    choices = [choose_source(r, served) for r in rankings]
    for i, c in enumerate(choices):
        if c.source is None:
            which = f"q[{i}]" if len(choices) > 1 else "the text"
            raise SourceRefused(
                f"source=auto: {which} is {describe(c.detected)}, not a language this server translates "
                f"from: {pairs}. Send a text in a served source language, or name the source"
            )
    sources = list(dict.fromkeys(c.source for c in choices if c.source is not None))
    if len(sources) > 1:
        shown = ", ".join(bcp47(s) for s in sources)
        raise SourceRefused(
            f"source=auto: the texts are in several languages ({shown}); send one language per request"
        )
    return sources[0], [c.detected for c in choices]


def describe(guess: Guess) -> str:
    """A detected language as messages name it: "French (fr, 97%)"."""
    return f"{name_of(guess.language)} ({guess.language}, {guess.confidence:.0f}% sure)"


def check_texts(core: TranslationCore, texts: Sequence[str]) -> None:
    """The limits of a Translate request, before the identifier reads a text: the text count
    (TranslationCore.validate_texts) and each text's length (MAX_TEXT_CHARS, the text layer's), with
    their messages. Failure(INVALID) names the first one broken."""
    core.validate_texts(texts)
    for i, text in enumerate(texts):
        if len(text) > MAX_TEXT_CHARS:
            raise Failure(
                INVALID,
                f"texts[{i}] has {len(text)} characters, over the limit of {MAX_TEXT_CHARS} "
                "(max_text_chars); send long documents in several texts (e.g. one per paragraph)",
            )


def sources_for(core: TranslationCore, target: str) -> tuple[list[str], str]:
    """The served source languages that translate to `target`, and the target as served (routed by
    TranslationCore.route, the one routing rule); Failure(INVALID) naming the served pairs when none."""
    sources, served_target = [], ""
    for source in dict.fromkeys(s for s, _ in core.pairs):
        try:
            _, (src, served_target) = core.route(source, target)
        except Failure:
            continue
        sources.append(src)
    if not sources:
        raise Failure(
            INVALID, f"{target} is not supported as target: the server translates {show_pairs(core.pairs)}"
        )
    return sources, served_target


async def route_auto(
    core: TranslationCore, identifier: LanguageIdentifier, texts: Sequence[str], target: str
) -> tuple[Pair, list[Guess]]:
    """`source=auto` for these texts: the pair they are translated with and each text's detected
    language (LibreTranslate's detectedLanguage); Failure(INVALID) when a text is surely in a language
    the server does not translate to `target` from (auto_source)."""
    sources, served_target = sources_for(core, target)
    rankings = await identifier.rank_many(texts)
    try:
        source, detected = auto_source(rankings, sources, show_pairs(core.pairs))
    except SourceRefused as e:
        raise Failure(INVALID, str(e)) from None
    return (source, served_target), detected


def joined_sample(texts: Sequence[str]) -> str:
    """Texts of one document (a file's entries or lines) as one text for the identifier: joined by
    line breaks up to DETECT_CHARS (a catalog of 50,000 entries is never joined whole)."""
    out, size = [], 0
    for text in texts:
        if size >= DETECT_CHARS:
            break
        out.append(text)
        size += len(text) + 1
    return "\n".join(out)
