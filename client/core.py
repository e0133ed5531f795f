"""Client library for the Translator gRPC service: sync (TranslatorClient) and asyncio
(AsyncTranslatorClient), with per-call timeouts, retries with exponential backoff on UNAVAILABLE
(and, optionally, RESOURCE_EXHAUSTED after the server's `retry-after-ms` hint), TLS and bearer tokens.

    from client import TranslatorClient
    with TranslatorClient("localhost:50051") as c:
        print(c.translate(["Open the file"])[0].text)
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.gen.translator.v1 import translator_pb2 as pb
from proto.gen.translator.v1 import translator_pb2_grpc as pb_grpc

DEFAULT_TARGET = "localhost:50051"
RETRY_AFTER_KEY = "retry-after-ms"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass
class Hypothesis:
    text: str
    score: float | None = None


@dataclass
class Translation:
    hypotheses: list[Hypothesis]

    @property
    def text(self) -> str:
        """The best hypothesis."""
        return self.hypotheses[0].text if self.hypotheses else ""


@dataclass
class StreamItem:
    """One request of a TranslateStream call."""

    request_id: str
    texts: Sequence[str]
    beam_size: int = 0
    num_hypotheses: int = 0
    max_length: int = 0
    length_penalty: float | None = None
    return_scores: bool = False
    timeout_ms: int = 0


@dataclass
class StreamResult:
    request_id: str
    translations: list[Translation] = field(default_factory=list)
    code: grpc.StatusCode = grpc.StatusCode.OK
    message: str = ""
    retry_after_ms: int = 0

    @property
    def ok(self) -> bool:
        return self.code == grpc.StatusCode.OK


class TranslatorError(Exception):
    """A failed call: gRPC status code, the server's message and its retry hint (if any)."""

    def __init__(
        self, code: grpc.StatusCode, details: str, retry_after_ms: int = 0, target: str = ""
    ) -> None:
        self.code = code
        self.details = details
        self.retry_after_ms = retry_after_ms
        self.target = target
        super().__init__(f"{code.name}: {details}")

    @classmethod
    def from_rpc_error(cls, e: grpc.RpcError, target: str = "") -> TranslatorError:
        code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
        details = (e.details() if hasattr(e, "details") else str(e)) or ""
        retry = 0
        try:
            for key, value in e.trailing_metadata() or ():
                if key == RETRY_AFTER_KEY:
                    retry = int(value)
        except Exception:
            pass
        return cls(code or grpc.StatusCode.UNKNOWN, details, retry, target)


_STATUS_BY_VALUE = {s.value[0]: s for s in grpc.StatusCode}


def decoding_options(
    beam_size: int = 0,
    num_hypotheses: int = 0,
    max_length: int = 0,
    length_penalty: float | None = None,
    return_scores: bool = False,
) -> pb.DecodingOptions:
    """Protobuf options; 0 / None = the model's default."""
    opts = pb.DecodingOptions(
        beam_size=beam_size, num_hypotheses=num_hypotheses, max_length=max_length, return_scores=return_scores
    )
    if length_penalty is not None:
        opts.length_penalty = length_penalty
    return opts


def _translations(msgs: Iterable[pb.Translation]) -> list[Translation]:
    return [
        Translation([Hypothesis(h.text, h.score if h.HasField("score") else None) for h in t.hypotheses])
        for t in msgs
    ]


def _stream_request(item: StreamItem) -> pb.TranslateStreamRequest:
    return pb.TranslateStreamRequest(
        request_id=item.request_id,
        texts=list(item.texts),
        timeout_ms=item.timeout_ms,
        options=decoding_options(
            item.beam_size, item.num_hypotheses, item.max_length, item.length_penalty, item.return_scores
        ),
    )


def _stream_result(msg: pb.TranslateStreamResponse) -> StreamResult:
    code = _STATUS_BY_VALUE.get(msg.status.code, grpc.StatusCode.UNKNOWN)
    return StreamResult(
        msg.request_id, _translations(msg.translations), code, msg.status.message, msg.status.retry_after_ms
    )


def _read(path: str | Path | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


class _Base:
    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout: float | None = 30.0,
        retries: int = 3,
        backoff: float = 0.1,
        max_backoff: float = 5.0,
        retry_resource_exhausted: bool = False,
        tls: bool = False,
        ca_cert: str | Path | None = None,
        client_cert: str | Path | None = None,
        client_key: str | Path | None = None,
        server_name: str | None = None,
        token: str | None = None,
    ) -> None:
        """
        target: host:port. timeout: default per-call deadline in seconds (None: none), covering retries.
        retries: extra attempts after UNAVAILABLE (and RESOURCE_EXHAUSTED if retry_resource_exhausted).
        backoff / max_backoff: first and largest wait between attempts (doubling, with jitter).
        tls: use TLS (implied by ca_cert/client_cert); ca_cert: PEM roots (default: system roots);
        client_cert/client_key: PEM for mutual TLS; server_name: override the TLS host name check.
        token: bearer token sent as `authorization: Bearer <token>`.
        """
        self.target = target
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.retry_resource_exhausted = retry_resource_exhausted
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self._options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        if server_name:
            self._options.append(("grpc.ssl_target_name_override", server_name))
        self._credentials = None
        if tls or ca_cert or client_cert:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(ca_cert),
                private_key=_read(client_key),
                certificate_chain=_read(client_cert),
            )

    def _deadline(self, timeout: float | None) -> float | None:
        t = self.timeout if timeout is None else timeout
        return None if t is None or t <= 0 else time.monotonic() + t

    @staticmethod
    def _remaining(deadline: float | None) -> float | None:
        return None if deadline is None else max(0.001, deadline - time.monotonic())

    def _retry_delay(self, error: TranslatorError, attempt: int, deadline: float | None) -> float | None:
        """Seconds to wait before retrying, or None to give up."""
        if attempt >= self.retries:
            return None
        if error.code == grpc.StatusCode.UNAVAILABLE:
            delay = min(self.max_backoff, self.backoff * 2**attempt) * random.uniform(0.5, 1.0)
        elif error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and self.retry_resource_exhausted:
            delay = min(self.max_backoff, (error.retry_after_ms or 100) / 1000.0) * random.uniform(1.0, 1.5)
        else:
            return None
        if deadline is not None and time.monotonic() + delay >= deadline:
            return None
        return delay


class TranslatorClient(_Base):
    """Blocking client. Methods raise TranslatorError."""

    def __init__(self, target: str = DEFAULT_TARGET, **kwargs) -> None:
        super().__init__(target, **kwargs)
        if self._credentials is not None:
            self.channel = grpc.secure_channel(target, self._credentials, options=self._options)
        else:
            self.channel = grpc.insecure_channel(target, options=self._options)
        self.stub = pb_grpc.TranslatorStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)

    def __enter__(self) -> TranslatorClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def _call(self, method, request, timeout: float | None):
        deadline = self._deadline(timeout)
        attempt = 0
        while True:
            try:
                return method(request, timeout=self._remaining(deadline), metadata=self._metadata)
            except grpc.RpcError as e:
                error = TranslatorError.from_rpc_error(e, self.target)
                delay = self._retry_delay(error, attempt, deadline)
                if delay is None:
                    raise error from None
                time.sleep(delay)
                attempt += 1

    def translate(
        self,
        texts: Sequence[str],
        *,
        beam_size: int = 0,
        num_hypotheses: int = 0,
        max_length: int = 0,
        length_penalty: float | None = None,
        return_scores: bool = False,
        timeout: float | None = None,
    ) -> list[Translation]:
        """One Translation per text, in order; options left at 0/None take the model's defaults."""
        request = pb.TranslateRequest(
            texts=list(texts),
            options=decoding_options(beam_size, num_hypotheses, max_length, length_penalty, return_scores),
        )
        return _translations(self._call(self.stub.Translate, request, timeout).translations)

    def translate_text(self, text: str, **kwargs) -> str:
        return self.translate([text], **kwargs)[0].text

    def translate_stream(
        self, items: Iterable[StreamItem], timeout: float | None = None
    ) -> Iterator[StreamResult]:
        """Send many requests over one call; yields results as they finish (any order). Not retried."""
        deadline = self._deadline(timeout)
        try:
            responses = self.stub.TranslateStream(
                (_stream_request(i) for i in items),
                timeout=self._remaining(deadline),
                metadata=self._metadata,
            )
            for msg in responses:
                yield _stream_result(msg)
        except grpc.RpcError as e:
            raise TranslatorError.from_rpc_error(e, self.target) from None

    def model_info(self, timeout: float | None = None) -> pb.GetModelInfoResponse:
        return self._call(self.stub.GetModelInfo, pb.GetModelInfoRequest(), timeout)

    def health(self, service: str = "", timeout: float | None = 5.0) -> str:
        """ "SERVING", "NOT_SERVING", ... of the standard health service (no retries)."""
        try:
            r = self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as e:
            raise TranslatorError.from_rpc_error(e, self.target) from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)

    def wait_until_serving(self, timeout: float = 60.0, interval: float = 0.2) -> None:
        """Poll health until SERVING; TranslatorError(DEADLINE_EXCEEDED) after `timeout` seconds."""
        end = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < end:
            try:
                last = self.health(timeout=max(0.1, min(2.0, end - time.monotonic())))
                if last == "SERVING":
                    return
            except TranslatorError as e:
                last = str(e)
            time.sleep(interval)
        raise TranslatorError(
            grpc.StatusCode.DEADLINE_EXCEEDED, f"not SERVING after {timeout}s ({last})", 0, self.target
        )


class AsyncTranslatorClient(_Base):
    """asyncio client (grpc.aio); create and use it inside a running event loop."""

    def __init__(self, target: str = DEFAULT_TARGET, **kwargs) -> None:
        super().__init__(target, **kwargs)
        if self._credentials is not None:
            self.channel = grpc.aio.secure_channel(target, self._credentials, options=self._options)
        else:
            self.channel = grpc.aio.insecure_channel(target, options=self._options)
        self.stub = pb_grpc.TranslatorStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)

    async def __aenter__(self) -> AsyncTranslatorClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def _call(self, method, request, timeout: float | None):
        deadline = self._deadline(timeout)
        attempt = 0
        while True:
            try:
                return await method(request, timeout=self._remaining(deadline), metadata=self._metadata)
            except grpc.RpcError as e:
                error = TranslatorError.from_rpc_error(e, self.target)
                delay = self._retry_delay(error, attempt, deadline)
                if delay is None:
                    raise error from None
                await asyncio.sleep(delay)
                attempt += 1

    async def translate(
        self,
        texts: Sequence[str],
        *,
        beam_size: int = 0,
        num_hypotheses: int = 0,
        max_length: int = 0,
        length_penalty: float | None = None,
        return_scores: bool = False,
        timeout: float | None = None,
    ) -> list[Translation]:
        request = pb.TranslateRequest(
            texts=list(texts),
            options=decoding_options(beam_size, num_hypotheses, max_length, length_penalty, return_scores),
        )
        return _translations((await self._call(self.stub.Translate, request, timeout)).translations)

    async def translate_text(self, text: str, **kwargs) -> str:
        return (await self.translate([text], **kwargs))[0].text

    async def translate_stream(
        self, items: Iterable[StreamItem] | AsyncIterable[StreamItem], timeout: float | None = None
    ) -> AsyncIterator[StreamResult]:
        deadline = self._deadline(timeout)

        async def requests():
            if isinstance(items, AsyncIterable):
                async for item in items:
                    yield _stream_request(item)
            else:
                for item in items:
                    yield _stream_request(item)

        try:
            call = self.stub.TranslateStream(
                requests(), timeout=self._remaining(deadline), metadata=self._metadata
            )
            async for msg in call:
                yield _stream_result(msg)
        except grpc.RpcError as e:
            raise TranslatorError.from_rpc_error(e, self.target) from None

    async def model_info(self, timeout: float | None = None) -> pb.GetModelInfoResponse:
        return await self._call(self.stub.GetModelInfo, pb.GetModelInfoRequest(), timeout)

    async def health(self, service: str = "", timeout: float | None = 5.0) -> str:
        try:
            r = await self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as e:
            raise TranslatorError.from_rpc_error(e, self.target) from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
