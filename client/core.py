"""Client library for the Translator gRPC service: sync (TranslatorClient) and asyncio
(AsyncTranslatorClient), with per-call timeouts, retries with exponential backoff on UNAVAILABLE
(and, optionally, RESOURCE_EXHAUSTED after the server's `retry-after-ms` hint), TLS and bearer tokens,
a bounded wait for the server to be ready (`wait_until_serving`) and request splitting within the
server's limits (`split_batches`, `TranslatorClient.batches`).

    from client import TranslatorClient
    with TranslatorClient("localhost:50051") as c:
        print(c.translate(["Open the file"])[0].text)
"""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.gen.translator.v1 import translator_pb2 as pb
from proto.gen.translator.v1 import translator_pb2_grpc as pb_grpc

DEFAULT_TARGET = "localhost:50051"
RETRY_AFTER_KEY = "retry-after-ms"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# gRPC's own RESOURCE_EXHAUSTED for a message over a size limit ("Received message larger than max
# (N vs. M)" from the server, "Sent message larger than max" from this side): retrying cannot help.
TOO_LARGE_MARKER = "message larger than max"


@dataclass
class Hypothesis:
    text: str
    score: float | None = None


@dataclass
class SegmentNote:
    """A segment the server's text layer passed through or repaired (see docs/service.md)."""

    action: str  # "passed_through" | "repaired" | "memory"
    start: int  # [start, end) in the source text
    end: int
    reason: str


@dataclass
class Translation:
    hypotheses: list[Hypothesis]
    notes: list[SegmentNote] = field(default_factory=list)

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
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int | None = None
    glossary: Mapping[str, str] | None = None
    literal_markers: bool = False  # `_ & ~` are plain characters, not menu accelerators (TranslateRequest)
    source_language: str = ""  # the pair (BCP-47; "" = en -> es): items of one stream may mix pairs
    target_language: str = ""


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

    @property
    def message_too_large(self) -> bool:
        """The request (or response) is over a message size limit: a permanent error, unlike a full
        queue, which answers RESOURCE_EXHAUSTED too."""
        return self.code == grpc.StatusCode.RESOURCE_EXHAUSTED and TOO_LARGE_MARKER in self.details.lower()


class TLSError(TranslatorError):
    """The TLS handshake failed, or the server closed the connection right after it: certificates or
    settings that retrying does not fix, so it is raised at once. The code stays gRPC's (UNAVAILABLE);
    `problem` is one of the keys of PROBLEMS and the message starts with its explanation."""

    PROBLEMS = {
        "untrusted": "the server's certificate could not be verified",
        "hostname": "the server's certificate does not name the host it was reached by",
        "not_tls": "the server does not use TLS",
        "needs_tls": "the server uses TLS but this client does not",
        "client_cert": "the server refused the client certificate (none given, or not signed by its CA)",
        "handshake": "the TLS handshake failed",
    }

    def __init__(self, problem: str, error: TranslatorError) -> None:
        self.problem = problem
        super().__init__(error.code, f"{self.PROBLEMS[problem]} ({error.details})", 0, error.target)


def tls_problem(details: str) -> str | None:
    """The TLS failure that a gRPC UNAVAILABLE message names, or None."""
    d = details.lower()
    if "wrong_version_number" in d:
        return "not_tls"
    if "hostname verification" in d or "no match found for server name" in d:
        return "hostname"
    if "handshake failed" in d:
        # Whatever the reason (unknown issuer, bad signature, expired), a certificate named in a
        # failed handshake on this side is the server's, which this side could not verify.
        return "untrusted" if "certificate" in d or "bad_signature" in d else "handshake"
    return None


def _host_port(target: str) -> tuple[str, int] | None:
    for prefix in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if target.startswith(prefix):
            target = target[len(prefix) :]
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or "/" in host:
        return None
    return host.strip("[]"), int(port)


def probe_tls(
    target: str,
    *,
    tls: bool,
    ca_cert: str | Path | None = None,
    client_cert: str | Path | None = None,
    client_key: str | Path | None = None,
    server_name: str | None = None,
    timeout: float = 3.0,
) -> str | None:
    """Why a server closed the connection without a word ("Socket closed"), or None if not for TLS.

    With tls: a TLS 1.3 server that refuses the client certificate completes the handshake and then
    closes the connection, so a handshake followed by an HTTP/2 preface that gets no answer means
    "client_cert". Without tls: a server that completes a TLS handshake wants TLS ("needs_tls")."""
    address = _host_port(target)
    if address is None:
        return None
    host, port = address
    if tls:
        ctx = ssl.create_default_context(cafile=str(ca_cert) if ca_cert else None)
        if client_cert:
            ctx.load_cert_chain(str(client_cert), str(client_key) if client_key else None)
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            ctx.wrap_socket(raw, server_hostname=server_name or host) as conn,
        ):
            if not tls:
                return "needs_tls"
            conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
            try:
                return None if conn.recv(1) else "client_cert"
            except (ConnectionResetError, ssl.SSLError):
                return "client_cert"
            except TimeoutError:
                return None
    except ssl.SSLCertVerificationError:
        return "untrusted" if tls else None
    except (OSError, ValueError):
        return None


def split_batches(
    texts: Sequence[str], max_texts: int, max_bytes: int = 0, fixed_bytes: int = 0
) -> list[list[str]]:
    """Consecutive batches of `texts`, in order: at most `max_texts` texts each (0 = no limit) and, when
    max_bytes > 0, at most `max_bytes` bytes as a serialized TranslateRequest, `fixed_bytes` being the
    rest of the request (its options). A text that cannot fit alone raises TranslatorError
    (INVALID_ARGUMENT) before anything is sent."""
    batches: list[list[str]] = []
    batch: list[str] = []
    size = fixed_bytes
    for i, text in enumerate(texts):
        cost = pb.TranslateRequest(texts=[text]).ByteSize() if max_bytes > 0 else 0
        if max_bytes > 0 and fixed_bytes + cost > max_bytes:
            raise TranslatorError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"text {i + 1} is {len(text.encode('utf-8'))} bytes, more than the {max_bytes} bytes "
                "the server accepts in one request",
            )
        if batch and (
            (max_texts > 0 and len(batch) >= max_texts) or (max_bytes > 0 and size + cost > max_bytes)
        ):
            batches.append(batch)
            batch, size = [], fixed_bytes
        batch.append(text)
        size += cost
    if batch:
        batches.append(batch)
    return batches


class NotServingError(TranslatorError):
    """wait_until_serving ran out of time: code DEADLINE_EXCEEDED; `last` is the last answer seen."""

    def __init__(self, timeout: float, last: str, target: str = "") -> None:
        self.last = last
        super().__init__(
            grpc.StatusCode.DEADLINE_EXCEEDED, f"not SERVING after {timeout:g}s ({last})", 0, target
        )


_STATUS_BY_VALUE = {s.value[0]: s for s in grpc.StatusCode}


def decoding_options(
    beam_size: int = 0,
    num_hypotheses: int = 0,
    max_length: int = 0,
    length_penalty: float | None = None,
    return_scores: bool = False,
    repetition_penalty: float | None = None,
    no_repeat_ngram_size: int | None = None,
) -> pb.DecodingOptions:
    """Protobuf options; 0 / None = the model's default."""
    opts = pb.DecodingOptions(
        beam_size=beam_size, num_hypotheses=num_hypotheses, max_length=max_length, return_scores=return_scores
    )
    if length_penalty is not None:
        opts.length_penalty = length_penalty
    if repetition_penalty is not None:
        opts.repetition_penalty = repetition_penalty
    if no_repeat_ngram_size is not None:
        opts.no_repeat_ngram_size = no_repeat_ngram_size
    return opts


def translate_request(
    texts: Sequence[str],
    glossary: Mapping[str, str] | None = None,
    literal_markers: bool = False,
    source_language: str = "",
    target_language: str = "",
    **options,
) -> pb.TranslateRequest:
    """A TranslateRequest; `options` are decoding_options()'s keywords; the pair "" = en -> es."""
    return pb.TranslateRequest(
        texts=list(texts),
        options=decoding_options(**options),
        glossary=glossary_entries(glossary),
        literal_markers=literal_markers,
        source_language=source_language,
        target_language=target_language,
    )


def glossary_entries(glossary: Mapping[str, str] | None) -> list[pb.GlossaryEntry]:
    """{English term: required Spanish, or "" to keep the term} -> protobuf entries."""
    return [pb.GlossaryEntry(source=k, target=v) for k, v in (glossary or {}).items()]


_NOTE_ACTIONS = {
    pb.SegmentNote.ACTION_PASSED_THROUGH: "passed_through",
    pb.SegmentNote.ACTION_REPAIRED: "repaired",
    pb.SegmentNote.ACTION_MEMORY: "memory",
}


def _translations(msgs: Iterable[pb.Translation]) -> list[Translation]:
    return [
        Translation(
            [Hypothesis(h.text, h.score if h.HasField("score") else None) for h in t.hypotheses],
            [SegmentNote(_NOTE_ACTIONS.get(n.action, "unknown"), n.start, n.end, n.reason) for n in t.notes],
        )
        for t in msgs
    ]


def _stream_request(item: StreamItem) -> pb.TranslateStreamRequest:
    return pb.TranslateStreamRequest(
        request_id=item.request_id,
        texts=list(item.texts),
        timeout_ms=item.timeout_ms,
        options=decoding_options(
            item.beam_size,
            item.num_hypotheses,
            item.max_length,
            item.length_penalty,
            item.return_scores,
            item.repetition_penalty,
            item.no_repeat_ngram_size,
        ),
        glossary=glossary_entries(item.glossary),
        literal_markers=item.literal_markers,
        source_language=item.source_language,
        target_language=item.target_language,
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
        max_reconnect_backoff: float = 1.0,
    ) -> None:
        """
        target: host:port. timeout: default per-call deadline in seconds (None: none), covering retries.
        retries: extra attempts after UNAVAILABLE (and RESOURCE_EXHAUSTED if retry_resource_exhausted;
        never after a message over the size limit or a TLS failure, which raise at once).
        backoff / max_backoff: first and largest wait between attempts (doubling, with jitter).
        tls: use TLS (implied by ca_cert/client_cert); ca_cert: PEM roots (default: system roots);
        client_cert/client_key: PEM for mutual TLS; server_name: override the TLS host name check.
        token: bearer token sent as `authorization: Bearer <token>`.
        max_reconnect_backoff: longest pause, in seconds, between connection attempts to a server that
        is down (gRPC's default grows to 2 minutes, so a server that just started would go unnoticed).
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
            ("grpc.initial_reconnect_backoff_ms", int(min(250, max_reconnect_backoff * 1000))),
            ("grpc.max_reconnect_backoff_ms", int(max_reconnect_backoff * 1000)),
        ]
        if server_name:
            self._options.append(("grpc.ssl_target_name_override", server_name))
        self._credentials = None
        self._tls = dict(
            tls=bool(tls or ca_cert or client_cert),
            ca_cert=ca_cert,
            client_cert=client_cert,
            client_key=client_key,
            server_name=server_name,
        )
        self._limits: pb.Limits | None = None
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
        if attempt >= self.retries or error.message_too_large or isinstance(error, TLSError):
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

    def _tls_error(self, error: TranslatorError, probe: bool = True) -> TranslatorError:
        """`error` as a TLSError when it is a TLS failure (which gRPC reports as UNAVAILABLE). A bare
        "Socket closed" is looked into with a TLS handshake of our own when `probe` (blocking)."""
        if error.code != grpc.StatusCode.UNAVAILABLE or isinstance(error, TLSError):
            return error
        problem = tls_problem(error.details)
        if problem is None and probe and "socket closed" in error.details.lower():
            problem = probe_tls(self.target, **self._tls)
        return TLSError(problem, error) if problem else error

    def _batches(self, texts: Sequence[str], batch_size: int, options: pb.DecodingOptions) -> list[list[str]]:
        limits = self._limits or pb.Limits()
        max_texts = min(batch_size, limits.max_texts_per_request or batch_size)
        max_bytes = min(limits.max_request_bytes or MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES)
        fixed = pb.TranslateRequest(options=options).ByteSize()
        return split_batches(texts, max_texts, max_bytes, fixed)


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
                error = self._tls_error(TranslatorError.from_rpc_error(e, self.target), probe=False)
                delay = self._retry_delay(error, attempt, deadline)
                if delay is None:
                    raise self._tls_error(error) from None
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
        repetition_penalty: float | None = None,
        no_repeat_ngram_size: int | None = None,
        glossary: Mapping[str, str] | None = None,
        literal_markers: bool = False,
        source_language: str = "",
        target_language: str = "",
    ) -> list[Translation]:
        """One Translation per text, in order; options left at 0/None take the model's defaults.
        glossary: {English term: required Spanish translation, or "" to keep the term as it is}.
        literal_markers: `_ & ~` are plain characters (by default a label's menu accelerator moves to
        the translation: `_OK` -> `_Aceptar`).
        source_language / target_language: the pair (BCP-47, e.g. "en" -> "pt-BR"; "" = en -> es)."""
        options = dict(beam_size=beam_size, num_hypotheses=num_hypotheses, max_length=max_length)
        options |= dict(length_penalty=length_penalty, return_scores=return_scores)
        options |= dict(repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)
        request = translate_request(
            texts, glossary, literal_markers, source_language, target_language, **options
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

    def model_info(
        self, timeout: float | None = None, *, source_language: str = "", target_language: str = ""
    ) -> pb.GetModelInfoResponse:
        """The model serving the pair ("" = the default model): name, pairs, limits, defaults."""
        request = pb.GetModelInfoRequest(source_language=source_language, target_language=target_language)
        info = self._call(self.stub.GetModelInfo, request, timeout)
        self._limits = info.limits
        return info

    def list_models(self, timeout: float | None = None) -> list[pb.GetModelInfoResponse]:
        """Every loaded model with its pairs, the default first."""
        return list(self._call(self.stub.ListModels, pb.ListModelsRequest(), timeout).models)

    def batches(
        self, texts: Sequence[str], batch_size: int = 16, timeout: float | None = None, **options
    ) -> list[list[str]]:
        """`texts` split into consecutive requests the server accepts: at most `batch_size` texts each,
        capped by the server's limits (GetModelInfo, asked once per client): texts per request and
        request bytes. `options`: those of translate(), which count towards the bytes. A text too
        large to send alone raises TranslatorError (INVALID_ARGUMENT) before anything is sent."""
        if texts and self._limits is None:
            self.model_info(timeout)
        return self._batches(texts, batch_size, decoding_options(**options))

    def health(self, service: str = "", timeout: float | None = 5.0) -> str:
        """ "SERVING", "NOT_SERVING", ... of the standard health service (no retries)."""
        try:
            r = self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as e:
            raise TranslatorError.from_rpc_error(e, self.target) from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)

    def wait_until_serving(
        self, timeout: float = 60.0, interval: float = 0.2, on_waiting: Callable[[], None] | None = None
    ) -> None:
        """Poll the health service until SERVING (connection refused and NOT_SERVING: the server is
        starting or loading its model). `on_waiting()` is called once, at the first answer that is not
        SERVING. Returns at once too when the server has no health service or wants credentials for
        it (the next call will tell). Raises TLSError at once on a TLS failure (waiting cannot fix
        it), NotServingError (a TranslatorError with code DEADLINE_EXCEEDED) after `timeout` s."""
        end = time.monotonic() + timeout
        last, waiting, probed = "no answer", False, False
        while True:
            try:
                last = self.health(timeout=max(0.1, min(2.0, end - time.monotonic())))
                if last == "SERVING":
                    return
            except TranslatorError as e:
                if e.code in _NOT_WAITED_FOR:
                    return
                error = self._tls_error(e, probe=not probed)
                probed = probed or "socket closed" in e.details.lower()
                if isinstance(error, TLSError):
                    raise error from None
                if e.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                last = f"{e.code.name}: {e.details}"
            if time.monotonic() + interval >= end:
                raise NotServingError(timeout, last, self.target)
            if not waiting and on_waiting is not None:
                on_waiting()
            waiting = True
            time.sleep(interval)


_NOT_WAITED_FOR = (
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
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
                error = self._tls_error(TranslatorError.from_rpc_error(e, self.target), probe=False)
                delay = self._retry_delay(error, attempt, deadline)
                if delay is None:
                    if "socket closed" in error.details.lower():  # the probe blocks: not on the loop
                        error = await asyncio.to_thread(self._tls_error, error)
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
        repetition_penalty: float | None = None,
        no_repeat_ngram_size: int | None = None,
        glossary: Mapping[str, str] | None = None,
        literal_markers: bool = False,
        source_language: str = "",
        target_language: str = "",
    ) -> list[Translation]:
        """As TranslatorClient.translate."""
        options = dict(beam_size=beam_size, num_hypotheses=num_hypotheses, max_length=max_length)
        options |= dict(length_penalty=length_penalty, return_scores=return_scores)
        options |= dict(repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)
        request = translate_request(
            texts, glossary, literal_markers, source_language, target_language, **options
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

    async def model_info(
        self, timeout: float | None = None, *, source_language: str = "", target_language: str = ""
    ) -> pb.GetModelInfoResponse:
        """As TranslatorClient.model_info."""
        request = pb.GetModelInfoRequest(source_language=source_language, target_language=target_language)
        info = await self._call(self.stub.GetModelInfo, request, timeout)
        self._limits = info.limits
        return info

    async def list_models(self, timeout: float | None = None) -> list[pb.GetModelInfoResponse]:
        """As TranslatorClient.list_models."""
        return list((await self._call(self.stub.ListModels, pb.ListModelsRequest(), timeout)).models)

    async def batches(
        self, texts: Sequence[str], batch_size: int = 16, timeout: float | None = None, **options
    ) -> list[list[str]]:
        """As TranslatorClient.batches."""
        if texts and self._limits is None:
            await self.model_info(timeout)
        return self._batches(texts, batch_size, decoding_options(**options))

    async def health(self, service: str = "", timeout: float | None = 5.0) -> str:
        try:
            r = await self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as e:
            raise TranslatorError.from_rpc_error(e, self.target) from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
