"""The translation path every transport calls: validation, glossary, the text layer, the scheduler.

`TranslationCore.translate` is the one copy of what a Translate request does, whatever carried it
(gRPC: server.service, HTTP: server.http_api): check the text count, resolve the decoding options
(runtime.decoding.resolve_options, the one option validator), build the glossary
(runtime.faithful.spans.make_glossary), run the engine's text layer (`prepare`), send each round of
segments through the scheduler (batching, deadlines, queue limits) and rebuild the texts (`finish`).
Errors leave as `Failure` with a transport-neutral `kind`; each transport maps kinds to its own
status codes (gRPC status, HTTP status). Nothing here touches ONNX or a wire format.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from runtime import decoding
from runtime.faithful.spans import InvalidGlossaryError, make_glossary
from server.contract import DecodingOptions, Hypothesis, InvalidOptionsError, Prepared, TranslationEngine
from server.languages import DEFAULT_PAIR, Pair, bcp47, resolve_code, show_pairs
from server.metrics import Metrics
from server.scheduler import (
    EngineFailure,
    InvalidInput,
    Job,
    QueueFullError,
    RequestCancelled,
    Scheduler,
    SchedulerStopped,
)

# What went wrong, for the transports to map: gRPC code / HTTP status.
INVALID = "invalid"  # INVALID_ARGUMENT / 400
OVERLOADED = "overloaded"  # RESOURCE_EXHAUSTED / 429
DEADLINE = "deadline"  # DEADLINE_EXCEEDED / 504
CANCELLED = "cancelled"  # CANCELLED / 499
INTERNAL = "internal"  # INTERNAL / 500
UNAVAILABLE = "unavailable"  # UNAVAILABLE / 503


class Failure(Exception):
    """A request the core could not answer: `kind` (one of the constants above) and a message for the
    caller; `retry_after_ms` for OVERLOADED; for INVALID, `field`: the request field at fault, as a path
    into the gRPC request ("options.beam_size", "texts[1]", "target_language"; empty when none is)."""

    def __init__(self, kind: str, message: str, retry_after_ms: int = 0, field: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after_ms = retry_after_ms
        self.field = field


# The validators' messages start with the path of the field they refuse ("options.beam_size=9 is
# above ...", "texts[1] has 65 source tokens", "glossary[0].source is blank"): that is Failure.field.
_FIELD_PATH = re.compile(r"(?:options|texts|glossary)(?:\[\d+\])?(?:\.[a-z_]+)?")


def invalid_field(e: Exception, default: str) -> Failure:
    """Failure(INVALID) for a validator's error, its field read from the message's leading path."""
    message = str(e)
    path = _FIELD_PATH.match(message)
    return Failure(INVALID, message, field=path.group(0) if path else default)


@dataclass
class Backend:
    """What the transports need once the model is loaded."""

    engine: TranslationEngine
    scheduler: Scheduler
    variant: str
    batching: bool
    batching_mode: str  # off | request | inflight: the scheduler's mode in effect (after any fallback)
    # The language pairs this model serves (its manifest's; runtime.bundle.manifest_pairs); empty = the
    # engine's source_language -> target_language.
    pairs: tuple[Pair, ...] = ()

    @property
    def served(self) -> tuple[Pair, ...]:
        return self.pairs or ((str(self.engine.source_language), str(self.engine.target_language)),)


@dataclass(frozen=True)
class OptionRequest:
    """Decoding options as a client asked for them: 0 / None = the model's default."""

    beam_size: int = 0
    num_hypotheses: int = 0
    max_length: int = 0
    length_penalty: float | None = None
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int | None = None


def resolve(engine: TranslationEngine, request: OptionRequest) -> DecodingOptions:
    """`request` with the bundle's defaults filled in; Failure(INVALID) when runtime.decoding refuses it."""
    try:
        return decoding.resolve_options(
            engine.default_options,
            max_beam_size=engine.max_beam_size,
            max_length_cap=engine.max_length_cap,
            beam_size=request.beam_size,
            num_hypotheses=request.num_hypotheses,
            max_length=request.max_length,
            length_penalty=request.length_penalty,
            repetition_penalty=request.repetition_penalty,
            no_repeat_ngram_size=request.no_repeat_ngram_size,
        )
    except InvalidOptionsError as e:
        raise invalid_field(e, "options") from e


class TranslationCore:
    """The loaded model's translation path, shared by all transports of one server."""

    def __init__(self, metrics: Metrics, *, max_texts: int, max_queue_segments: int = 1024) -> None:
        self.metrics = metrics
        self.max_texts = max_texts
        self.max_queue_segments = max_queue_segments
        self.backends: tuple[Backend, ...] = ()  # every loaded model, in the store's order
        # The pairs the store's manifests declare, known before any model loads: what /languages
        # lists while they load (LibreTranslate clients ask at start; Weblate validates a target).
        self.announced: list[Pair] = []
        self.unavailable_reason = "the model is loading; retry shortly"
        # Until the models are served, or will not be (`cannot_serve`): requests may wait for them
        # (`wait_for_model`) rather than get UNAVAILABLE for a model ready in a second.
        self.loading = True
        self._settled = asyncio.Event()

    @property
    def backend(self) -> Backend | None:
        """The default model: the one serving en->es (what a request naming no pair gets), else the
        first loaded; None while loading."""
        for b in self.backends:
            if DEFAULT_PAIR in b.served:
                return b
        return self.backends[0] if self.backends else None

    @backend.setter
    def backend(self, value: Backend | None) -> None:
        self.backends = () if value is None else (value,)
        if value is not None:
            self._settle()

    def _settle(self) -> None:
        self.loading = False
        self._settled.set()

    def cannot_serve(self, reason: str) -> None:
        """No model is coming (it failed to load) or the server stops: requests without a model get
        UNAVAILABLE with `reason`, those waiting for one at once."""
        self.unavailable_reason = reason
        self._settle()

    async def wait_for_model(self, until: float) -> None:
        """While the models load, wait for them until `until` (time.monotonic()); returns when they
        are served, at `until`, or at once when none is coming (`route` then raises UNAVAILABLE). The
        HTTP transport waits: LibreTranslate clients such as Weblate treat a 503 as an outage."""
        if not self.loading or self.backends:
            return
        start = time.monotonic()
        try:
            async with asyncio.timeout(max(0.0, until - start)):
                await self._settled.wait()
        except TimeoutError:
            pass
        finally:
            self.metrics.model_wait.observe(time.monotonic() - start)

    def set_backends(self, backends: Sequence[Backend]) -> None:
        """Serve these models; a pair served by two of them is a configuration error (ValueError)."""
        seen: dict[Pair, Backend] = {}
        names = [b.engine.name for b in backends]
        if len(set(names)) != len(names):
            # The name labels the model's metrics and names it in ListModels: it must tell them apart.
            raise ValueError(f"two models are named alike ({', '.join(names)}): rename one in its manifest")
        for b in backends:
            for pair in b.served:
                key = (bcp47(pair[0]), bcp47(pair[1]))
                if key in seen:
                    raise ValueError(
                        f"{key[0]}->{key[1]} is served by two models ({seen[key].engine.name} and "
                        f"{b.engine.name}): serve one of them"
                    )
                seen[key] = b
        self.backends = tuple(backends)
        if self.backends:
            self._settle()

    @property
    def pairs(self) -> list[Pair]:
        return [pair for b in self.backends for pair in b.served]

    def require_backend(self) -> Backend:
        backend = self.backend
        if backend is None:
            raise Failure(UNAVAILABLE, self.unavailable_reason)
        return backend

    def route(self, source: str = "", target: str = "") -> tuple[Backend, Pair]:
        """The model that serves `source` -> `target` and the pair as it serves it; Failure(INVALID)
        naming the served pairs when none does. Empty both = the default model; an empty source is
        "en"; an empty target is the source's only target, else "es"."""
        default = self.require_backend()
        if not source and not target:
            return default, default.served[0]
        pairs = self.pairs
        served = f"the model{'s translate' if len(self.backends) > 1 else ' translates'} {show_pairs(pairs)}"
        src = resolve_code(source or DEFAULT_PAIR[0], [s for s, _ in pairs])
        if src is None:
            raise Failure(INVALID, f"{source} is not supported as source: {served}", field="source_language")
        targets = [t for s, t in pairs if s == src]
        if not target and len(set(targets)) == 1:
            target = targets[0]
        tgt = resolve_code(target or DEFAULT_PAIR[1], targets)
        if tgt is None:
            raise Failure(
                INVALID,
                f"{target or DEFAULT_PAIR[1]} is not supported as target: {served}",
                field="target_language",
            )
        return next(b for b in self.backends if (src, tgt) in b.served), (src, tgt)

    def validate_texts(self, texts: Sequence[str]) -> None:
        """Check the text count (lengths are the text layer's: Engine.prepare)."""
        if not texts:
            raise Failure(INVALID, "texts is empty: send at least one text to translate", field="texts")
        if len(texts) > self.max_texts:
            raise Failure(
                INVALID,
                f"too many texts: {len(texts)} in one request, the limit is {self.max_texts}; "
                "split them over several requests",
                field="texts",
            )

    async def translate(
        self,
        texts: Sequence[str],
        options: OptionRequest,
        glossary: Sequence[tuple[str, str]] = (),
        deadline: float | None = None,
        request_id: str = "-",
        stats: dict | None = None,
        accelerators: bool = True,
        source_language: str = "",
        target_language: str = "",
        wait_until: float | None = None,
    ) -> list[list[Hypothesis]]:
        """One n-best list per text (best first, after the text layer); raises Failure.
        `deadline` is time.monotonic() based; `stats` receives the request's counters for the log;
        `accelerators`: the text layer moves menu accelerators (False for files: see server.files);
        `source_language` / `target_language`: the pair, routed by `route` ("" = the default);
        `wait_until` (time.monotonic()): a full queue is waited out in line until then (Scheduler.run)
        instead of failing at once with OVERLOADED."""
        stats = {} if stats is None else stats
        backend, _ = self.route(source_language, target_language)
        if len(self.backends) > 1:
            stats["model"] = backend.engine.name
        start = time.monotonic()
        try:
            return await self._translate(
                backend, texts, options, glossary, deadline, request_id, stats, accelerators, wait_until
            )
        finally:
            # Per model, whatever the outcome: what a flood on one model does to the others' latency.
            self.metrics.model_latency.labels(model=str(backend.engine.name)).observe(
                time.monotonic() - start
            )

    async def _translate(
        self,
        backend: Backend,
        texts: Sequence[str],
        options: OptionRequest,
        glossary: Sequence[tuple[str, str]],
        deadline: float | None,
        request_id: str,
        stats: dict,
        accelerators: bool,
        wait_until: float | None = None,
    ) -> list[list[Hypothesis]]:
        engine = backend.engine
        self.validate_texts(texts)
        engine_options = resolve(engine, options)
        try:
            terms = make_glossary(list(glossary))
        except InvalidGlossaryError as e:
            raise invalid_field(e, "glossary") from e
        try:
            prepared = engine.prepare(list(texts), engine_options, terms, accelerators=accelerators)
        except ValueError as e:  # InputTooLongError: a text over max_text_chars
            raise invalid_field(e, "texts") from None
        stats["texts"] = len(texts)
        stats["segments"] = stats["input_tokens"] = stats["output_tokens"] = 0
        stats["queue_ms"] = stats["decode_ms"] = 0.0
        step: Prepared | list[list[Hypothesis]] = prepared
        while isinstance(step, Prepared):  # the text layer's rounds (a second one re-translates)
            job = await self._run(backend, step, deadline, request_id, stats, wait_until)
            step = engine.finish(step, job.results)
        for hyps in step:
            for note in hyps[0].notes if hyps else ():
                self.metrics.text_segments.labels(action=note.action).inc()
        return step

    async def _run(
        self,
        backend: Backend,
        prepared: Prepared,
        deadline: float | None,
        request_id: str,
        stats: dict,
        wait_until: float | None = None,
    ) -> Job:
        """One round of segments through the scheduler (waiting in line for room until `wait_until`);
        raises Failure."""
        stats["segments"] += len(prepared.segments)
        stats["input_tokens"] += sum(prepared.token_counts)
        if len(prepared.segments) > self.max_queue_segments:
            raise Failure(
                INVALID,
                f"these texts make {len(prepared.segments)} segments, more than the queue holds "
                f"({self.max_queue_segments}); send them over several requests",
            )
        job = Job(
            prepared.segments,
            prepared.token_counts,
            prepared.options,
            deadline=deadline,
            request_id=request_id,
        )
        wait_s = 0.0 if wait_until is None else max(0.0, wait_until - time.monotonic())
        try:
            await backend.scheduler.run(job, wait_s)
        except QueueFullError as e:
            raise Failure(OVERLOADED, str(e), e.retry_after_ms) from None
        except RequestCancelled as e:
            raise Failure(DEADLINE if e.reason == "deadline" else CANCELLED, str(e)) from None
        except InvalidInput as e:
            raise invalid_field(e, "texts") from None
        except EngineFailure as e:
            raise Failure(INTERNAL, str(e)) from None
        except SchedulerStopped as e:
            raise Failure(UNAVAILABLE, str(e)) from None
        finally:
            stats["queue_ms"] = round(stats["queue_ms"] + job.queue_s * 1000, 2)
            stats["decode_ms"] = round(stats["decode_ms"] + job.decode_s * 1000, 2)
        stats["output_tokens"] += job.output_tokens
        return job
