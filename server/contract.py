"""The engine contract: what the scheduler and the transports may ask of a translation engine.

The three rooms of the server meet here. `server.engine` implements these protocols over ONNX Runtime;
the scheduler (`server.scheduler`) and the gRPC service (`server.service`) are typed against them and
never import the engine, so they run against any object that satisfies them (the scheduler's tests use a
small fake engine). Data types and errors that cross the boundary live here too, so each side imports
them from one place. Prose and the bit-identity rules: docs/engine-contract.md.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from runtime.bundle import BundleError
from runtime.decoding import DecodingOptions, InvalidOptionsError

__all__ = [
    "BatchItem",
    "BundleError",
    "DecodingOptions",
    "Finished",
    "Hypothesis",
    "InFlightBatch",
    "InputTooLongError",
    "InvalidOptionsError",
    "Prepared",
    "SegmentNote",
    "TranslationEngine",
]


class InputTooLongError(ValueError):
    """A segment is over max_source_tokens; the message names it. Split long text before translating."""


@dataclass(frozen=True)
class SegmentNote:
    """A segment of a text that the text layer passed through, repaired or took from the translation
    memory (proto SegmentNote)."""

    action: str  # "passed_through" | "repaired" | "memory"
    start: int  # [start, end) of the segment in the source text
    end: int
    reason: str


@dataclass
class Hypothesis:
    text: str  # detokenized, with the source's leading/trailing whitespace restored
    score: float  # length-normalised log-probability (0.0 for pass-through segments)
    tokens: list[int]  # target ids without BOS/EOS
    notes: tuple[SegmentNote, ...] = ()  # text layer: segments passed through or repaired


@dataclass
class Prepared:
    """Texts after the engine's text layer, before decoding: the segments the scheduler batches and
    decodes with `options`; `plan` (the engine's own, opaque) rebuilds the texts in `finish`."""

    segments: list[str]
    token_counts: list[int]
    options: DecodingOptions
    plan: Any


@dataclass
class BatchItem:
    """A text to admit into an in-flight batch; `key` (hashable, unique in the batch) names it."""

    key: Hashable
    text: str
    options: DecodingOptions


@dataclass
class Finished:
    """An in-flight item that left the batch: its n-best list, or the error that refused it
    (InvalidOptionsError / InputTooLongError, both ValueErrors)."""

    key: Any
    hypotheses: list[Hypothesis] | None = None
    error: Exception | None = None


@runtime_checkable
class InFlightBatch(Protocol):
    """Step-level continuous batching, driven by one scheduler thread: admit, step, drop.

    Each item's result is the one `TranslationEngine.translate([text], options)` gives it alone, bit for
    bit, whatever joins or leaves around it."""

    def __len__(self) -> int: ...

    @property
    def rows(self) -> int:
        """Decoder rows in use (beam size summed over running items)."""
        ...

    @property
    def keys(self) -> list[Any]: ...

    def cost(self, source_tokens: int, options: DecodingOptions) -> int:
        """KV-cache bound of an item: beam x (source + generation budget)."""
        ...

    def admit(self, items: Sequence[BatchItem]) -> list[Finished]:
        """Encode and join `items` at the next step; returns those already done (blank, refused)."""
        ...

    def step(self) -> list[Finished]:
        """One decoding step of every running item; returns the items that finished."""
        ...

    def drop(self, keys: Sequence[Any]) -> int:
        """Remove cancelled or expired items at this step boundary; returns how many left."""
        ...


@runtime_checkable
class TranslationEngine(Protocol):
    """A loaded model: identity, limits, defaults, request-level translation and in-flight batches."""

    name: str
    version: str
    source_language: str
    target_language: str
    max_source_tokens: int  # longest accepted segment, in source tokens
    max_beam_size: int
    max_length_cap: int  # absolute cap on generated tokens
    default_options: DecodingOptions  # the bundle's decoding defaults
    providers: list[str]  # execution providers the sessions really use
    memory_entries: int  # texts the text layer answers from the translation memory (0: none)

    @property
    def supports_inflight(self) -> bool:
        """Whether `running_batch()` works with this model."""
        ...

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Source tokens per text as `translate` would feed them (0 for blank texts)."""
        ...

    def too_long(self, n_tokens: int, segment: str = "segment") -> InputTooLongError | None:
        """The error for a segment of `n_tokens` source tokens, or None within the limit."""
        ...

    def check_options(self, options: DecodingOptions) -> None:
        """InvalidOptionsError unless this model can run `options`."""
        ...

    def max_output_length(self, src_len: int, options: DecodingOptions) -> int: ...

    def warmup(self) -> None: ...

    def prepare(
        self,
        texts: Sequence[str],
        options: DecodingOptions,
        glossary: Mapping[str, str] | None = None,
        *,
        accelerators: bool = True,
    ) -> Prepared:
        """The text layer before decoding: segments to translate; InputTooLongError for an over-long
        text, ValueError for a bad glossary. accelerators: take a text's menu accelerator (`_Save`) out
        and put it back on the translation (False: the caller handled them, or texts are not labels)."""
        ...

    def finish(
        self, prepared: Prepared, results: Sequence[list[Hypothesis] | None]
    ) -> list[list[Hypothesis]] | Prepared:
        """The text layer after decoding: one n-best list per text from the segments' n-best lists, or
        the next round's Prepared (segments to decode before calling finish again)."""
        ...

    def translate(
        self,
        texts: list[str],
        options: DecodingOptions | None = None,
        cancelled: Callable[[], Sequence[bool]] | None = None,
    ) -> list[list[Hypothesis] | None]:
        """One n-best list per text (best first), or None for a row `cancelled()` dropped mid-way."""
        ...

    def running_batch(self) -> InFlightBatch:
        """A new in-flight batch over this engine; BundleError if the bundle is too old for it."""
        ...
