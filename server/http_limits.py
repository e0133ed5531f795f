"""Every limit of the HTTP port in one place: `HttpLimits`, and the connection protocol that enforces the
ones aiohttp has no knob for.

aiohttp (3.14) itself bounds the request line and each header (max_line_size / max_field_size), the number
of headers (max_headers), the body (client_max_size) and idle keep-alive connections
(keepalive_timeout); `HttpLimits` sets all of them. What it lacks, `GuardedConnection` adds:

- a header timeout: a connection must deliver a complete request head within `header_timeout_s` of
  opening, or of the first byte of its next request. A probe held 900 silent or byte-by-byte connections
  open for 100 s, and 20,000 of them used up the process's file descriptors, after which gRPC calls
  failed too;
- a connection cap: past `max_connections` (never more than half the open-file limit, so gRPC, the
  metrics port and the model keep descriptors), a new connection gets a 503 and is closed at once;
- malformed requests (a bad request line or header, an oversized header) answer 400 `{"error": ...}`
  and log one line without a traceback, counted like any other 400, instead of aiohttp's ERROR traceback
  (~800 B each: a client could grow the log at will).

The body timeout is applied where bodies are read (server/http_api.py read_params). docs/service.md,
"Limits and hardening", lists every limit with its flag.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

log = logging.getLogger("server.requests")
CLIENT_FAULTS = (HttpProcessingError, RequestPayloadError)  # bytes the client sent that do not parse


def open_files_limit() -> int:
    """The process's soft RLIMIT_NOFILE (a large number when unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def parse_origins(value: str) -> tuple[str, ...]:
    """--http-cors-origins as HttpLimits.cors_origins: the comma-separated origins, lowercase, blanks and
    empty items dropped ("*" stays alone: any origin)."""
    origins = tuple(dict.fromkeys(o.strip().lower() for o in value.split(",") if o.strip()))
    return ("*",) if "*" in origins else origins


@dataclass(frozen=True)
class HttpLimits:
    """The HTTP port's limits; the first four are settings (server/config.py: --http-header-timeout-s,
    --http-keepalive-timeout-s, --http-body-timeout-s, --http-max-connections), max_body_bytes is
    --max-message-bytes, cors_origins and queue_wait_s are --http-cors-origins and --http-queue-wait-s,
    the rest are fixed."""

    header_timeout_s: float = 10.0  # request line + headers, from the connection or the request's first byte
    keepalive_timeout_s: float = 15.0  # an idle connection between requests
    body_timeout_s: float = 30.0  # the whole body, once the headers are in (408 past it)
    max_connections: int = 1000  # open connections (also capped at half the open-file limit)
    max_body_bytes: int = 4 * 1024 * 1024  # 413 past it
    max_line_bytes: int = 8190  # request line, and each header line (aiohttp's default, stated here)
    max_headers: int = 128
    # Connections the kernel completes before the server accepts them. Past it, Linux drops a client's
    # handshake ACK and repeats its SYN-ACK 1, 2, 4 s later: under a burst (1,000 connections at once)
    # the client believes itself connected seconds before the server sees it.
    backlog: int = 1024
    # After an answer sent before the body was read (403, 408, 413), how long the rest of the body is
    # read and dropped so that the client sees the answer; then the connection is closed.
    lingering_s: float = 2.0
    # Browser origins allowed to call the API (CORS; --http-cors-origins): () = CORS off, ("*",) = any,
    # else exact origins, lowercase (browsers send scheme and host lowercase).
    cors_origins: tuple[str, ...] = ()
    cors_max_age_s: int = 3600  # how long a browser may reuse a preflight's answer
    # How long a request waits for room in a full queue or for a loading model (--http-queue-wait-s)
    # before its 429 / 503: LibreTranslate clients (Weblate) turn a service off for 30 min on either.
    queue_wait_s: float = 30.0

    @classmethod
    def from_config(cls, config: Any) -> HttpLimits:
        return cls(
            header_timeout_s=config.http_header_timeout_s,
            keepalive_timeout_s=config.http_keepalive_timeout_s,
            body_timeout_s=config.http_body_timeout_s,
            max_connections=config.http_max_connections,
            max_body_bytes=config.max_message_bytes,
            cors_origins=parse_origins(config.http_cors_origins),
            queue_wait_s=config.http_queue_wait_s,
        )

    def cors_origin(self, origin: str | None) -> str | None:
        """The Access-Control-Allow-Origin for a request's Origin: "*", the origin itself, or None (CORS
        off, no Origin, or an origin not in the list)."""
        if not self.cors_origins or not origin:
            return None
        if self.cors_origins == ("*",):
            return "*"
        return origin if origin.lower() in self.cors_origins else None

    @property
    def connection_cap(self) -> int:
        """max_connections, but never more than half the open-file limit (each connection is one)."""
        return max(1, min(self.max_connections, open_files_limit() // 2))

    @property
    def accept_backlog(self) -> int:
        """backlog, but never more than a quarter of the open-file limit: asyncio accepts up to a
        backlog's worth of connections in one go, and a refused one holds its descriptor until the loop
        comes round again, so cap + backlog must leave room (a quarter) for everything else."""
        return max(16, min(self.backlog, open_files_limit() // 4))

    def handler_kwargs(self) -> dict[str, Any]:
        """aiohttp's own per-connection knobs (RequestHandler's keyword arguments)."""
        return {
            "keepalive_timeout": self.keepalive_timeout_s,
            "max_line_size": self.max_line_bytes,
            "max_field_size": self.max_line_bytes,
            "max_headers": self.max_headers,
            "lingering_time": self.lingering_s,
            "access_log": None,
        }


def _json_response_bytes(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class ConnectionGuard:
    """The protocol factory of the HTTP port: counts open connections and makes each a
    GuardedConnection. `on_malformed(message)` is called for each malformed request (metrics)."""

    def __init__(self, server: web.Server, limits: HttpLimits, on_malformed: Any = None) -> None:
        self.server = server
        self.limits = limits
        self.cap = limits.connection_cap
        self.open = 0  # connections admitted and not yet closed
        self.refused = 0
        self.on_malformed = on_malformed
        self.busy = _json_response_bytes(
            503, "Service Unavailable", f"too many open connections ({self.cap}): retry later"
        )

    def __call__(self) -> GuardedConnection:
        loop = asyncio.get_running_loop()
        return GuardedConnection(self.server, guard=self, loop=loop, **self.limits.handler_kwargs())


class GuardedConnection(RequestHandler):
    """aiohttp's connection protocol with the connection cap, the header timeout and quiet 400s."""

    def __init__(self, manager: web.Server, *, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._admitted = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_count = 0  # request heads parsed when the timer was armed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        if guard.open >= guard.cap:
            # Accept-and-close keeps the listening socket's backlog moving and costs no descriptor
            # beyond this moment; the 503 tells a well-behaved client why.
            guard.refused += 1
            transport.write(guard.busy)  # type: ignore[attr-defined]
            transport.close()
            return
        guard.open += 1
        self._admitted = True
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._guard.open -= 1
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:  # a request head is complete
            self._cancel_head_timer()
        elif data and self._head_timer is None and not self._request_in_progress and not self._messages:
            self._arm_head_timer()  # the first bytes of the next request: its head has header_timeout_s

    def _arm_head_timer(self) -> None:
        self._head_count = self._request_count
        self._head_timer = self._loop.call_later(self._guard.limits.header_timeout_s, self._head_deadline)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_deadline(self) -> None:
        self._head_timer = None
        if self._request_count == self._head_count and not self._request_in_progress:
            log.debug("closing an HTTP connection: no complete request head in time")
            self.force_close()

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        """aiohttp logs with a traceback whatever escapes a connection, the client's own bad bytes too:
        after an answer sent before the body was read, the lingering read of the rest re-raises a body
        the parser refused (bad chunking, a Content-Encoding that does not decode). That is one debug
        line; anything else keeps its traceback."""
        cause = kwargs.get("exc_info")
        for _ in range(8):  # down the chain of causes (bounded: a chain may loop)
            if not isinstance(cause, BaseException) or isinstance(cause, CLIENT_FAULTS):
                break
            cause = cause.__cause__ or cause.__context__
        if isinstance(cause, CLIENT_FAULTS):
            log.debug("dropped an HTTP connection: %s", cause)
            return
        super().log_exception(*args, **kwargs)

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        # A request the parser refused: the client's fault, one line and no traceback.
        reason = exc.message if isinstance(exc.message, str) and exc.message else type(exc).__name__
        text = f"Invalid request: malformed HTTP request ({reason})"[:300]
        log.info(
            "request",
            extra={
                "fields": {
                    "rpc": "malformed",
                    "transport": "http",
                    "status": "INVALID_ARGUMENT",
                    "http_status": 400,
                    "error": text,
                }
            },
        )
        if self._guard.on_malformed is not None:
            self._guard.on_malformed(text)
        response = web.json_response({"error": text}, status=400)
        response.force_close()
        return response
