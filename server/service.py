"""gRPC transport: Translator handlers, request validation and status codes.

Handlers never touch ONNX: they turn protobuf requests into calls of the shared translation path
(server/translate.py: validation, text layer, scheduler; the HTTP transport calls it too) and its
results and errors into protobuf messages and gRPC status codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import grpc
from google.protobuf import duration_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

from proto.gen.translator.v1 import translator_pb2 as pb
from proto.gen.translator.v1 import translator_pb2_grpc as pb_grpc
from runtime.faithful.segment import MAX_TEXT_CHARS
from runtime.faithful.spans import MAX_GLOSSARY_ENTRIES
from server import translate as core
from server.contract import DecodingOptions, Hypothesis
from server.metrics import Metrics
from server.scheduler import DEADLINE_SLACK_S
from server.translate import Backend, Failure, OptionRequest, TranslationCore

log = logging.getLogger("server.requests")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Translator"].full_name  # "translator.v1.Translator"
RETRY_AFTER_KEY = "retry-after-ms"
STATUS_DETAILS_KEY = "grpc-status-details-bin"  # google.rpc.Status, grpcio-status's key
REQUEST_ID_KEY = "x-request-id"


class RpcFailure(Exception):
    """An error answer: gRPC status code, message and trailing metadata.

    `details` (google.rpc messages: RetryInfo, BadRequest) travel as Google's API design guide has it, in
    a google.rpc.Status in the `grpc-status-details-bin` trailer (grpc_status.rpc_status.from_call reads
    them), beside the plain `retry-after-ms` trailer older clients read."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        trailers: Sequence[tuple[str, str]] = (),
        details: Sequence[Message] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailers = tuple(trailers)
        self.details = tuple(details)

    def metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        """The trailing metadata of the answer: the plain trailers, then the google.rpc.Status."""
        if not self.details:
            return self.trailers
        status = status_pb2.Status(code=self.code.value[0], message=self.message)
        for detail in self.details:
            status.details.add().Pack(detail)
        return (*self.trailers, (STATUS_DETAILS_KEY, status.SerializeToString()))


def invalid(message: str, field: str = "") -> RpcFailure:
    """INVALID_ARGUMENT; with the field at fault as a google.rpc.BadRequest field violation."""
    violations = [error_details_pb2.BadRequest.FieldViolation(field=field, description=message)]
    details = [error_details_pb2.BadRequest(field_violations=violations)] if field else []
    return RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, message, details=details)


@dataclass(frozen=True)
class Undecodable:
    """A request message whose bytes are not a valid protobuf of its type (answered INVALID_ARGUMENT,
    without the traceback and UNKNOWN that grpcio gives a raising deserializer)."""

    message_type: str
    error: str

    def failure(self) -> RpcFailure:
        return invalid(
            f"the request is not a valid {self.message_type} protobuf ({self.error}); "
            "send a message built from proto/translator/v1/translator.proto"
        )


def _lenient(message: type) -> Callable[[bytes], object]:
    def parse(data: bytes) -> object:
        try:
            return message.FromString(data)
        except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError, RuntimeWarning, ...
            return Undecodable(message.DESCRIPTOR.full_name, str(e) or type(e).__name__)

    return parse


def add_to_server(servicer: TranslatorService, server: grpc.aio.Server) -> None:
    """Register the service like the generated add_TranslatorServicer_to_server, with request parsers
    that turn undecodable bytes into an Undecodable the handlers answer with INVALID_ARGUMENT."""
    handlers = {
        "Translate": grpc.unary_unary_rpc_method_handler(
            servicer.Translate,
            request_deserializer=_lenient(pb.TranslateRequest),
            response_serializer=pb.TranslateResponse.SerializeToString,
        ),
        "TranslateStream": grpc.stream_stream_rpc_method_handler(
            servicer.TranslateStream,
            request_deserializer=_lenient(pb.TranslateStreamRequest),
            response_serializer=pb.TranslateStreamResponse.SerializeToString,
        ),
        "GetModelInfo": grpc.unary_unary_rpc_method_handler(
            servicer.GetModelInfo,
            request_deserializer=_lenient(pb.GetModelInfoRequest),
            response_serializer=pb.GetModelInfoResponse.SerializeToString,
        ),
        "ListModels": grpc.unary_unary_rpc_method_handler(
            servicer.ListModels,
            request_deserializer=_lenient(pb.ListModelsRequest),
            response_serializer=pb.ListModelsResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


# The shared path's failure kinds (server/translate.py) as gRPC status codes.
CODES = {
    core.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    core.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    core.DEADLINE: grpc.StatusCode.DEADLINE_EXCEEDED,
    core.CANCELLED: grpc.StatusCode.CANCELLED,
    core.INTERNAL: grpc.StatusCode.INTERNAL,
    core.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
}


def retry_later(code: grpc.StatusCode, message: str, retry_after_ms: int) -> RpcFailure:
    """RESOURCE_EXHAUSTED or UNAVAILABLE with the wait both ways: `retry-after-ms` and RetryInfo."""
    delay = duration_pb2.Duration()
    delay.FromMilliseconds(retry_after_ms)
    retry = error_details_pb2.RetryInfo(retry_delay=delay)
    return RpcFailure(code, message, [(RETRY_AFTER_KEY, str(retry_after_ms))], [retry])


def rpc_failure(f: Failure) -> RpcFailure:
    if f.kind == core.OVERLOADED:
        return retry_later(CODES[f.kind], f.message, f.retry_after_ms)
    if f.kind == core.INVALID:
        return invalid(f.message, f.field)
    return RpcFailure(CODES[f.kind], f.message)


# ---- proto <-> shared path -----------------------------------------------------------------------


def option_request(opts: pb.DecodingOptions) -> OptionRequest:
    """Proto options -> the shared path's request (validated there, by runtime.decoding)."""
    return OptionRequest(
        beam_size=opts.beam_size,
        num_hypotheses=opts.num_hypotheses,
        max_length=opts.max_length,
        length_penalty=opts.length_penalty if opts.HasField("length_penalty") else None,
        repetition_penalty=opts.repetition_penalty if opts.HasField("repetition_penalty") else None,
        no_repeat_ngram_size=opts.no_repeat_ngram_size if opts.HasField("no_repeat_ngram_size") else None,
    )


_ACTIONS = {
    "passed_through": pb.SegmentNote.ACTION_PASSED_THROUGH,
    "repaired": pb.SegmentNote.ACTION_REPAIRED,
    "memory": pb.SegmentNote.ACTION_MEMORY,
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
    """A cancelled call's status: DEADLINE_EXCEEDED when it ended within DEADLINE_SLACK_S of its deadline
    (the client's deadline passes first; the scheduler counts its dropped segments the same way)."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= DEADLINE_SLACK_S:
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
        translation: TranslationCore | None = None,
    ) -> None:
        self.metrics = metrics
        self.core = translation or TranslationCore(
            metrics, max_texts=max_texts, max_queue_segments=max_queue_segments
        )
        self.max_message_bytes = max_message_bytes
        self.max_stream_inflight = max_stream_inflight
        self.draining = False  # set when the server stops taking calls: streams refuse new items

    def _ended(self) -> str:
        """Why a call ended with a cancellation: the client, or the end of the shutdown grace period."""
        return "cut at the end of the shutdown grace period" if self.draining else "cancelled by client"

    # The loaded model and why there is none live in the shared core (the HTTP transport reads them too).
    @property
    def backend(self) -> Backend | None:
        return self.core.backend

    @backend.setter
    def backend(self, value: Backend | None) -> None:
        self.core.backend = value

    @property
    def unavailable_reason(self) -> str:
        return self.core.unavailable_reason

    @unavailable_reason.setter
    def unavailable_reason(self, value: str) -> None:
        self.core.unavailable_reason = value

    @property
    def max_texts(self) -> int:
        return self.core.max_texts

    def _backend(self) -> Backend:
        try:
            return self.core.require_backend()
        except Failure as f:
            raise rpc_failure(f) from None

    async def _translate(
        self,
        texts: Sequence[str],
        options: pb.DecodingOptions,
        glossary: Sequence[pb.GlossaryEntry],
        deadline: float | None,
        request_id: str,
        stats: dict,
        literal_markers: bool = False,
        pair: tuple[str, str] = ("", ""),
    ) -> list[pb.Translation]:
        """The shared path (server/translate.py) with proto in and out; raises RpcFailure."""
        try:
            results = await self.core.translate(
                texts,
                option_request(options),
                [(e.source, e.target) for e in glossary],
                deadline,
                request_id,
                stats,
                accelerators=not literal_markers,
                source_language=pair[0],
                target_language=pair[1],
            )
        except Failure as f:
            raise rpc_failure(f) from None
        return to_translations(results, bool(options.return_scores))

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
            self.metrics.requests.labels(rpc=rpc, code=_code_name(code), transport="grpc").inc()
        if rpc in ("Translate", "TranslateStream"):
            self.metrics.request_latency.labels(rpc=rpc, transport="grpc").observe(elapsed)
        fields = {"id": request_id, "rpc": rpc, "status": _code_name(code), "ms": round(elapsed * 1000, 2)}
        fields.update(stats)
        if message and code != grpc.StatusCode.OK:
            fields["error"] = message
        log.info("request", extra={"fields": fields})

    async def Translate(self, request: pb.TranslateRequest, context: grpc.aio.ServicerContext):
        start = time.monotonic()
        request_id = _request_id(context)
        if isinstance(request, Undecodable):
            f = request.failure()
            self._record("Translate", request_id, f.code, start, {}, f.message)
            await context.abort(f.code, f.message, trailing_metadata=f.metadata())
        stats: dict = {"segments": len(request.texts)}
        self.metrics.in_flight.inc()
        try:
            translations = await self._translate(
                request.texts,
                request.options,
                request.glossary,
                _deadline(context),
                request_id,
                stats,
                request.literal_markers,
                (request.source_language, request.target_language),
            )
        except RpcFailure as f:
            self.metrics.in_flight.dec()
            self._record("Translate", request_id, f.code, start, stats, f.message)
            await context.abort(f.code, f.message, trailing_metadata=f.metadata())
        except asyncio.CancelledError:
            self.metrics.in_flight.dec()
            self._record("Translate", request_id, _cancel_code(context), start, stats, self._ended())
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
        if isinstance(req, Undecodable):  # answered in the stream; the call goes on
            f = req.failure()
            self._record("TranslateStream", "-", f.code, start, {"call": call_id}, f.message, item=True)
            return pb.TranslateStreamResponse(status=pb.ItemStatus(code=f.code.value[0], message=f.message))
        stats: dict = {"segments": len(req.texts), "call": call_id}
        item_id = req.request_id or "-"
        if self.draining:  # a stream opened before the shutdown takes no new work
            failure: RpcFailure | None = retry_later(
                grpc.StatusCode.UNAVAILABLE,
                "the server is shutting down; send this item to another server",
                1000,
            )
        elif req.timeout_ms < 0:
            failure = invalid(f"timeout_ms must be >= 0, got {req.timeout_ms}", "timeout_ms")
        else:
            failure = None
        self.metrics.in_flight.inc()
        try:
            if failure is not None:
                raise failure
            translations = await self._translate(
                req.texts,
                req.options,
                req.glossary,
                _deadline(context, req.timeout_ms),
                item_id,
                stats,
                req.literal_markers,
                (req.source_language, req.target_language),
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
                "TranslateStream", item_id, _cancel_code(context), start, stats, self._ended(), item=True
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
            code, message = _cancel_code(context), self._ended()
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
            self.metrics.requests.labels(rpc="TranslateStream", code=_code_name(code), transport="grpc").inc()
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

    def _model_info(self, backend: Backend) -> pb.GetModelInfoResponse:
        e = backend.engine
        return pb.GetModelInfoResponse(
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
            translation_memory_entries=e.memory_entries,
            pairs=[pb.LanguagePair(source_language=s, target_language=t) for s, t in backend.served],
        )

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext):
        start = time.monotonic()
        request_id = _request_id(context)
        try:
            if isinstance(request, Undecodable):
                raise request.failure()
            try:
                backend, _ = self.core.route(request.source_language, request.target_language)
            except Failure as f:
                raise rpc_failure(f) from None
        except RpcFailure as f:
            self._record("GetModelInfo", request_id, f.code, start, {}, f.message)
            await context.abort(f.code, f.message, trailing_metadata=f.metadata())
        response = self._model_info(backend)
        self._record("GetModelInfo", request_id, grpc.StatusCode.OK, start, {})
        return response

    async def ListModels(self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext):
        start = time.monotonic()
        request_id = _request_id(context)
        try:
            if isinstance(request, Undecodable):
                raise request.failure()
            default = self._backend()
        except RpcFailure as f:
            self._record("ListModels", request_id, f.code, start, {}, f.message)
            await context.abort(f.code, f.message, trailing_metadata=f.metadata())
        others = [b for b in self.core.backends if b is not default]
        response = pb.ListModelsResponse(models=[self._model_info(b) for b in (default, *others)])
        self._record("ListModels", request_id, grpc.StatusCode.OK, start, {})
        return response
