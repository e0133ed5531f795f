"""gRPC transport: Translator handlers, request validation and status codes.

Handlers never touch ONNX: they validate, hand segments to the scheduler and turn results and errors
into protobuf messages and gRPC status codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc

from proto.gen.translator.v1 import translator_pb2 as pb
from proto.gen.translator.v1 import translator_pb2_grpc as pb_grpc
from runtime import decoding
from runtime.faithful.segment import MAX_TEXT_CHARS
from runtime.faithful.spans import MAX_GLOSSARY_ENTRIES, InvalidGlossaryError, make_glossary
from server.contract import DecodingOptions, Hypothesis, InvalidOptionsError, Prepared, TranslationEngine
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

log = logging.getLogger("server.requests")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Translator"].full_name  # "translator.v1.Translator"
RETRY_AFTER_KEY = "retry-after-ms"
REQUEST_ID_KEY = "x-request-id"


class RpcFailure(Exception):
    """An error answer: gRPC status code, message and trailing metadata."""

    def __init__(self, code: grpc.StatusCode, message: str, trailers: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailers = tuple(trailers)


def invalid(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, message)


@dataclass
class Backend:
    """What the handlers need once the model is loaded."""

    engine: TranslationEngine
    scheduler: Scheduler
    variant: str
    batching: bool
    batching_mode: str  # off | request | inflight: the scheduler's mode in effect (after any fallback)


# ---- validation ----------------------------------------------------------------------------------


def resolve_options(opts: pb.DecodingOptions, engine: TranslationEngine) -> tuple[DecodingOptions, bool]:
    """Proto options -> (DecodingOptions with the bundle's defaults filled in, return_scores);
    validated by runtime.decoding.resolve_options, the one place option rules live."""
    try:
        options = decoding.resolve_options(
            engine.default_options,
            max_beam_size=engine.max_beam_size,
            max_length_cap=engine.max_length_cap,
            beam_size=opts.beam_size,
            num_hypotheses=opts.num_hypotheses,
            max_length=opts.max_length,
            length_penalty=opts.length_penalty if opts.HasField("length_penalty") else None,
            repetition_penalty=opts.repetition_penalty if opts.HasField("repetition_penalty") else None,
            no_repeat_ngram_size=(
                opts.no_repeat_ngram_size if opts.HasField("no_repeat_ngram_size") else None
            ),
        )
    except InvalidOptionsError as e:
        raise invalid(str(e)) from e
    return options, bool(opts.return_scores)


def validate_texts(texts: Sequence[str], max_texts: int) -> None:
    """Check the text count (lengths are the text layer's: Engine.prepare)."""
    if not texts:
        raise invalid("texts is empty: send at least one text to translate")
    if len(texts) > max_texts:
        raise invalid(
            f"too many texts: {len(texts)} in one request, the limit is {max_texts}; "
            "split them over several requests"
        )


def glossary_of(entries: Sequence[pb.GlossaryEntry]) -> dict[str, str]:
    """Proto glossary -> {term: target or "" (keep)}, validated by runtime.faithful.spans.make_glossary."""
    try:
        return make_glossary([(e.source, e.target) for e in entries])
    except InvalidGlossaryError as e:
        raise invalid(str(e)) from e


_ACTIONS = {
    "passed_through": pb.SegmentNote.ACTION_PASSED_THROUGH,
    "repaired": pb.SegmentNote.ACTION_REPAIRED,
}


def to_translations(results: Sequence[list[Hypothesis]], return_scores: bool) -> list[pb.Translation]:
    """The texts' n-best lists (after the text layer) -> protobuf translations."""
    out = []
    for hyps in results:
        t = pb.Translation()
        for h in hyps:
            if return_scores:
                t.hypotheses.add(text=h.text, score=float(h.score))
            else:
                t.hypotheses.add(text=h.text)
        for n in hyps[0].notes if hyps else ():
            t.notes.add(action=_ACTIONS[n.action], start=n.start, end=n.end, reason=n.reason)
        out.append(t)
    return out


def options_to_proto(options: DecodingOptions) -> pb.DecodingOptions:
    return pb.DecodingOptions(
        beam_size=options.beam_size,
        num_hypotheses=options.num_hypotheses,
        max_length=options.max_length,
        length_penalty=options.length_penalty,
        repetition_penalty=options.repetition_penalty,
        no_repeat_ngram_size=options.no_repeat_ngram_size,
    )


# ---- handlers ------------------------------------------------------------------------------------


def _code_name(code: grpc.StatusCode) -> str:
    return code.name


def _deadline(context: grpc.aio.ServicerContext, extra_timeout_ms: int = 0) -> float | None:
    now = time.monotonic()
    deadline = None
    remaining = context.time_remaining()
    if remaining is not None:
        deadline = now + max(0.0, remaining)
    if extra_timeout_ms > 0:
        item = now + extra_timeout_ms / 1000.0
        deadline = item if deadline is None else min(deadline, item)
    return deadline


def _request_id(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_KEY and value:
            return str(value)[:64]
    return uuid.uuid4().hex[:16]


def _cancel_code(context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0.001:
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.CANCELLED


class TranslatorService(pb_grpc.TranslatorServicer):
    def __init__(
        self,
        metrics: Metrics,
        *,
        max_texts: int,
        max_message_bytes: int,
        max_stream_inflight: int,
        max_queue_segments: int = 1024,
    ) -> None:
        self.metrics = metrics
        self.max_texts = max_texts
        self.max_queue_segments = max_queue_segments
        self.max_message_bytes = max_message_bytes
        self.max_stream_inflight = max_stream_inflight
        self.backend: Backend | None = None
        self.unavailable_reason = "the model is loading; retry shortly"

    def _backend(self) -> Backend:
        if self.backend is None:
            raise RpcFailure(grpc.StatusCode.UNAVAILABLE, self.unavailable_reason)
        return self.backend

    async def _translate(
        self,
        texts: Sequence[str],
        options: pb.DecodingOptions,
        glossary: Sequence[pb.GlossaryEntry],
        deadline: float | None,
        request_id: str,
        stats: dict,
    ) -> list[pb.Translation]:
        """Validate, run the text layer and the scheduler, convert; raises RpcFailure."""
        backend = self._backend()
        engine = backend.engine
        validate_texts(texts, self.max_texts)
        engine_options, return_scores = resolve_options(options, engine)
        terms = glossary_of(glossary)
        try:
            prepared = engine.prepare(list(texts), engine_options, terms)
        except ValueError as e:  # InputTooLongError: a text over max_text_chars
            raise invalid(str(e)) from None
        stats["texts"] = len(texts)
        stats["segments"] = stats["input_tokens"] = stats["output_tokens"] = 0
        stats["queue_ms"] = stats["decode_ms"] = 0.0
        step: Prepared | list[list[Hypothesis]] = prepared
        while isinstance(step, Prepared):  # the text layer's rounds (a second one re-translates)
            job = await self._run(backend, step, deadline, request_id, stats)
            step = engine.finish(step, job.results)
        results = step
        for hyps in results:
            for note in hyps[0].notes:
                self.metrics.text_segments.labels(action=note.action).inc()
        return to_translations(results, return_scores)

    async def _run(
        self, backend: Backend, prepared: Prepared, deadline: float | None, request_id: str, stats: dict
    ) -> Job:
        """One round of segments through the scheduler; raises RpcFailure."""
        stats["segments"] += len(prepared.segments)
        stats["input_tokens"] += sum(prepared.token_counts)
        if len(prepared.segments) > self.max_queue_segments:
            raise invalid(
                f"these texts make {len(prepared.segments)} segments, more than the queue holds "
                f"({self.max_queue_segments}); send them over several requests"
            )
        job = Job(
            prepared.segments,
            prepared.token_counts,
            prepared.options,
            deadline=deadline,
            request_id=request_id,
        )
        try:
            await backend.scheduler.run(job)
        except QueueFullError as e:
            raise RpcFailure(
                grpc.StatusCode.RESOURCE_EXHAUSTED, str(e), [(RETRY_AFTER_KEY, str(e.retry_after_ms))]
            ) from None
        except RequestCancelled as e:
            code = grpc.StatusCode.DEADLINE_EXCEEDED if e.reason == "deadline" else grpc.StatusCode.CANCELLED
            raise RpcFailure(code, str(e)) from None
        except InvalidInput as e:
            raise invalid(str(e)) from None
        except EngineFailure as e:
            raise RpcFailure(grpc.StatusCode.INTERNAL, str(e)) from None
        except SchedulerStopped as e:
            raise RpcFailure(grpc.StatusCode.UNAVAILABLE, str(e)) from None
        finally:
            stats["queue_ms"] = round(stats["queue_ms"] + job.queue_s * 1000, 2)
            stats["decode_ms"] = round(stats["decode_ms"] + job.decode_s * 1000, 2)
        stats["output_tokens"] += job.output_tokens
        return job

    def _record(
        self,
        rpc: str,
        request_id: str,
        code: grpc.StatusCode,
        start: float,
        stats: dict,
        message: str = "",
        item: bool = False,
    ) -> None:
        elapsed = time.monotonic() - start
        if item:
            self.metrics.stream_items.labels(code=_code_name(code)).inc()
        else:
            self.metrics.requests.labels(rpc=rpc, code=_code_name(code)).inc()
        if rpc in ("Translate", "TranslateStream"):
            self.metrics.request_latency.labels(rpc=rpc).observe(elapsed)
        fields = {"id": request_id, "rpc": rpc, "status": _code_name(code), "ms": round(elapsed * 1000, 2)}
        fields.update(stats)
        if message and code != grpc.StatusCode.OK:
            fields["error"] = message
        log.info("request", extra={"fields": fields})

    async def Translate(self, request: pb.TranslateRequest, context: grpc.aio.ServicerContext):
        start = time.monotonic()
        request_id = _request_id(context)
        stats: dict = {"segments": len(request.texts)}
        self.metrics.in_flight.inc()
        try:
            translations = await self._translate(
                request.texts, request.options, request.glossary, _deadline(context), request_id, stats
            )
        except RpcFailure as f:
            self.metrics.in_flight.dec()
            self._record("Translate", request_id, f.code, start, stats, f.message)
            await context.abort(f.code, f.message, trailing_metadata=f.trailers)
        except asyncio.CancelledError:
            self.metrics.in_flight.dec()
            self._record("Translate", request_id, _cancel_code(context), start, stats, "cancelled by client")
            raise
        except Exception as e:
            self.metrics.in_flight.dec()
            log.exception("unexpected error in Translate")
            self._record("Translate", request_id, grpc.StatusCode.INTERNAL, start, stats, repr(e))
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {e}")
        self.metrics.in_flight.dec()
        self._record("Translate", request_id, grpc.StatusCode.OK, start, stats)
        return pb.TranslateResponse(translations=translations)

    async def _stream_item(
        self, req: pb.TranslateStreamRequest, context: grpc.aio.ServicerContext, call_id: str
    ) -> pb.TranslateStreamResponse:
        start = time.monotonic()
        stats: dict = {"segments": len(req.texts), "call": call_id}
        item_id = req.request_id or "-"
        if req.timeout_ms < 0:
            failure: RpcFailure | None = invalid(f"timeout_ms must be >= 0, got {req.timeout_ms}")
        else:
            failure = None
        self.metrics.in_flight.inc()
        try:
            if failure is not None:
                raise failure
            translations = await self._translate(
                req.texts, req.options, req.glossary, _deadline(context, req.timeout_ms), item_id, stats
            )
        except RpcFailure as f:
            self._record("TranslateStream", item_id, f.code, start, stats, f.message, item=True)
            retry = next((int(v) for k, v in f.trailers if k == RETRY_AFTER_KEY), 0)
            return pb.TranslateStreamResponse(
                request_id=req.request_id,
                status=pb.ItemStatus(code=f.code.value[0], message=f.message, retry_after_ms=retry),
            )
        except asyncio.CancelledError:
            self._record(
                "TranslateStream", item_id, _cancel_code(context), start, stats, "stream cancelled", item=True
            )
            raise
        except Exception as e:
            log.exception("unexpected error in TranslateStream item")
            self._record(
                "TranslateStream", item_id, grpc.StatusCode.INTERNAL, start, stats, repr(e), item=True
            )
            return pb.TranslateStreamResponse(
                request_id=req.request_id,
                status=pb.ItemStatus(code=grpc.StatusCode.INTERNAL.value[0], message=f"internal error: {e}"),
            )
        finally:
            self.metrics.in_flight.dec()
        self._record("TranslateStream", item_id, grpc.StatusCode.OK, start, stats, item=True)
        return pb.TranslateStreamResponse(
            request_id=req.request_id, translations=translations, status=pb.ItemStatus(code=0)
        )

    async def TranslateStream(
        self, request_iterator: AsyncIterator[pb.TranslateStreamRequest], context: grpc.aio.ServicerContext
    ):
        start = time.monotonic()
        call_id = _request_id(context)
        out: asyncio.Queue = asyncio.Queue()
        slots = asyncio.Semaphore(self.max_stream_inflight)
        tasks: set[asyncio.Task] = set()
        done_reading = object()
        counts = {"items": 0}

        async def item(req: pb.TranslateStreamRequest) -> None:
            await out.put(await self._stream_item(req, context, call_id))

        async def reader() -> None:
            try:
                async for req in request_iterator:
                    await slots.acquire()  # flow control: stop reading while too many are unanswered
                    counts["items"] += 1
                    task = asyncio.create_task(item(req))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                while tasks:
                    await asyncio.gather(*list(tasks), return_exceptions=True)
                await out.put(done_reading)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the request stream broke
                await out.put(e)

        reader_task = asyncio.create_task(reader())
        code, message = grpc.StatusCode.OK, ""
        try:
            while True:
                msg = await out.get()
                if msg is done_reading:
                    break
                if isinstance(msg, Exception):
                    code, message = grpc.StatusCode.CANCELLED, f"request stream failed: {msg}"
                    break
                yield msg
                slots.release()
        except asyncio.CancelledError:
            code, message = _cancel_code(context), "cancelled by client"
            raise
        except BaseException as e:
            code, message = grpc.StatusCode.INTERNAL, repr(e)
            raise
        finally:
            reader_task.cancel()
            for task in list(tasks):
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(reader_task, *list(tasks), return_exceptions=True)
            self.metrics.requests.labels(rpc="TranslateStream", code=_code_name(code)).inc()
            fields = {
                "id": call_id,
                "rpc": "TranslateStream",
                "status": _code_name(code),
                "items": counts["items"],
                "ms": round((time.monotonic() - start) * 1000, 2),
            }
            if message:
                fields["error"] = message
            log.info("stream", extra={"fields": fields})

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext):
        start = time.monotonic()
        request_id = _request_id(context)
        try:
            backend = self._backend()
        except RpcFailure as f:
            self._record("GetModelInfo", request_id, f.code, start, {}, f.message)
            await context.abort(f.code, f.message)
        e = backend.engine
        response = pb.GetModelInfoResponse(
            name=e.name,
            version=e.version,
            source_language=e.source_language,
            target_language=e.target_language,
            limits=pb.Limits(
                max_texts_per_request=self.max_texts,
                max_source_tokens=e.max_source_tokens,
                max_beam_size=e.max_beam_size,
                max_length=e.max_length_cap,
                max_request_bytes=self.max_message_bytes,
                max_text_chars=MAX_TEXT_CHARS,
                max_glossary_entries=MAX_GLOSSARY_ENTRIES,
            ),
            default_options=options_to_proto(e.default_options),
            execution_providers=list(e.providers),
            variant=backend.variant,
            batching=backend.batching,
            batching_mode=backend.batching_mode,
        )
        self._record("GetModelInfo", request_id, grpc.StatusCode.OK, start, {})
        return response
