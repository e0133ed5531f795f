"""HTTP transport: a LibreTranslate-compatible REST API and the web page, beside gRPC in one process.

aiohttp serves it on the gRPC server's asyncio event loop (grpc.aio), so both transports call the same
`TranslationCore` (server/translate.py: validation, text layer, scheduler) with no thread hop. Routes:
POST /translate, POST /detect (server/detect.py, also behind source=auto), GET /languages,
POST /translate_file + GET /download_file/{id}/{name}, GET /frontend/settings, POST /suggest (always
403, as LibreTranslate's with suggestions off), GET /spec (OpenAPI 3: server/openapi.py), GET /health,
and the page at /; CORS when --http-cors-origins is set. Bodies are JSON or forms
(urlencoded or multipart), as LibreTranslate takes them; errors are `{"error": message}` with 400
(bad input), 403 (bad api_key), 429 (overloaded, with Retry-After), 500, 503 (not ready), 504 (deadline).
Handlers never touch ONNX. Documentation: docs/service.md, "HTTP API (LibreTranslate-compatible)".
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import math
import os
import re
import ssl
import time
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from server import translate as core
from server.auth import bearer_credentials, token_matches
from server.detect import RANKED, LanguageIdentifier, check_texts, joined_sample, route_auto, sources_for
from server.files import (
    SUFFIXES,
    DownloadStore,
    FileLimits,
    FileTranslator,
    StoreFull,
    content_disposition,
    media_type,
    safe_name,
)
from server.http_limits import ConnectionGuard, HttpLimits
from server.languages import DEFAULT_PAIR, bcp47, name_of
from server.metrics import Metrics
from server.openapi import SpecValues, build_spec, package_version
from server.translate import Failure, OptionRequest, TranslationCore

log = logging.getLogger("server.requests")

WEB_DIR = Path(__file__).with_name("web")
LANGUAGE_NAMES = {"en": "English", "es": "Spanish"}
FRONTEND_TIMEOUT_MS = 250  # /frontend/settings frontendTimeout: server/web/index.html waits as long
STATUS = {  # the shared path's failure kinds as HTTP statuses
    core.INVALID: 400,
    core.OVERLOADED: 429,
    core.CANCELLED: 499,
    core.INTERNAL: 500,
    core.UNAVAILABLE: 503,
    core.DEADLINE: 504,
}
CODE_NAMES = {  # HTTP status -> the gRPC code name of the same meaning (metrics, logs)
    200: "OK",
    400: "INVALID_ARGUMENT",
    403: "UNAUTHENTICATED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    408: "DEADLINE_EXCEEDED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


class HttpError(Exception):
    def __init__(self, status: int, message: str, retry_after_ms: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_ms = retry_after_ms


def from_failure(f: Failure) -> HttpError:
    return HttpError(STATUS[f.kind], f.message, f.retry_after_ms)


def error_response(e: HttpError) -> web.Response:
    headers = {}
    if e.status == 429:
        headers["Retry-After"] = str(max(1, math.ceil(e.retry_after_ms / 1000)))
    return web.json_response({"error": e.message}, status=e.status, headers=headers)


def _unicode_problem(value: Any) -> str | None:
    """Where a parsed body holds a string that is not Unicode text (a lone surrogate, which JSON's
    "\\ud800" and a form's undecodable bytes produce): a description, else None. Iterative: a deep
    structure must not cost a RecursionError here."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as e:
                return f"a lone surrogate U+{ord(item[e.start]):04X} at character {e.start}"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


async def read_params(
    request: web.Request, limits: HttpLimits | None = None, check_text: bool = True
) -> dict[str, Any]:
    """A JSON object or a form (urlencoded / multipart; a repeated field is a list), over the query.

    Whatever the client sent, the outcome is these parameters or an HttpError: 400 naming the part that
    is wrong (not JSON, nested too deep, a multipart body without its boundary or its end, a part header
    too long, text that is not Unicode), 408 when the body does not arrive within body_timeout_s, 413
    when it is larger than max_body_bytes (aiohttp's client_max_size). Never an exception of the parser's
    (those were 500s with a traceback)."""
    limits = limits or HttpLimits()
    params: dict[str, Any] = dict(request.query)
    if request.method == "POST":
        params.update(await _read_body(request, limits))
    if check_text:
        check_unicode(params)
    return params


def check_unicode(params: dict[str, Any]) -> None:
    """400 naming the first parameter that holds a string which is not Unicode text."""
    for name, value in params.items():
        problem = _unicode_problem(value) or _unicode_problem(name)
        if problem:
            raise HttpError(400, f"Invalid request: {str(name)[:40]!r} is not valid Unicode text ({problem})")


async def _read_body(request: web.Request, limits: HttpLimits) -> dict[str, Any]:
    is_json = request.content_type == "application/json"
    what = "JSON" if is_json else "a form (urlencoded or multipart/form-data)"
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            if is_json:
                raw = await request.read()
            else:
                form = await request.post()
    except TimeoutError:
        message = f"Invalid request: the body did not arrive within {limits.body_timeout_s:g} s"
        raise HttpError(408, message) from None
    except web.HTTPException:  # 413 from client_max_size: the middleware answers it
        raise
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception as e:  # the multipart and urlencoded parsers raise ValueError, AssertionError, ...
        raise HttpError(400, f"Invalid request: the body is not valid {what} ({_reason(e)})") from None
    if is_json:
        try:
            body = json.loads(raw)
        except RecursionError:
            raise HttpError(400, "Invalid request: the JSON body is nested too deeply") from None
        except ValueError as e:  # includes a body that is not UTF-8
            raise HttpError(400, f"Invalid request: the body is not valid JSON ({_reason(e)})") from None
        if not isinstance(body, dict):
            raise HttpError(400, "Invalid request: the JSON body must be an object")
        return body
    params: dict[str, Any] = {}
    for key in set(form.keys()):
        values = form.getall(key)
        params[key] = values if len(values) > 1 else values[0]
    return params


def _reason(e: BaseException) -> str:
    """An exception as a short line for a client (no traceback, bounded length)."""
    text = str(e) or type(e).__name__
    return text if len(text) <= 200 else text[:200] + "..."


def note_list(hyps: list[Any]) -> list[dict[str, Any]]:
    """A text's notes (server/contract.py SegmentNote, on its best hypothesis) as JSON: what the gRPC
    API's Translation.notes carry (server/service.py to_translations), the action by its lowercase name
    ("passed_through", "repaired", "memory"), offsets in code points of the source text."""
    return [
        {"action": n.action, "start": n.start, "end": n.end, "reason": n.reason}
        for n in (hyps[0].notes if hyps else ())
    ]


MAX_INT_PARAM = 2**31 - 1  # beyond it a number is no meaningful count or deadline (and 1e400 overflows)


def int_param(params: dict[str, Any], name: str, default: int = 0) -> int:
    """params[name] as an integer 0..MAX_INT_PARAM: an int, an integral finite float (JSON 2.0) or a
    decimal string; anything else (Infinity, 1e400, 2.5, true, "x", a 5000-digit string) is a 400."""
    value = params.get(name, default)
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float):
        number = int(value) if math.isfinite(value) and value.is_integer() else None
    elif isinstance(value, str) and re.fullmatch(r"\s*\+?\d{1,10}\s*", value):
        number = int(value)
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
    if number is None or number < 0:
        raise HttpError(400, f"Invalid request: {name} must be an integer >= 0, got {shown}")
    if number > MAX_INT_PARAM:
        raise HttpError(400, f"Invalid request: {name} must be at most {MAX_INT_PARAM}, got {shown}")
    return number


def q_texts(params: dict[str, Any]) -> tuple[list[str], bool]:
    """q as texts, and whether it was a list (the answer is then a list too); 400 when missing or not
    a string or a list of strings."""
    q = params.get("q")
    if q is None or q == "" or q == []:
        raise HttpError(400, "Invalid request: missing q parameter")
    batch = isinstance(q, list)
    texts = q if batch else [q]
    if not all(isinstance(t, str) for t in texts):
        raise HttpError(400, "Invalid request: q must be a string or a list of strings")
    return texts, batch


class HttpApi:
    """The aiohttp application over a TranslationCore; `await start(host, port)`, `await stop()`."""

    def __init__(
        self,
        translation: TranslationCore,
        metrics: Metrics,
        *,
        auth_token: str = "",
        limits: HttpLimits | None = None,
        serving: Callable[[], bool] = lambda: True,
        shutdown_grace_s: float = 30.0,
        file_limits: FileLimits | None = None,
    ) -> None:
        self.core = translation
        self.metrics = metrics
        self.token = auth_token.encode()
        self.limits = limits or HttpLimits()
        self.serving = serving
        self.shutdown_grace_s = shutdown_grace_s
        self.file_limits = file_limits or FileLimits()
        self.files = DownloadStore(self.file_limits.store_bytes, self.file_limits.ttl_s)
        self.file_work = FileTranslator(translation, self.file_limits, self.limits.queue_wait_s)
        self.identifier = LanguageIdentifier()  # /detect and source=auto (server/detect.py), loaded lazily
        self.app = web.Application(
            client_max_size=self.limits.max_body_bytes, middlewares=[self._preflight, self._errors]
        )
        self.app.on_response_prepare.append(self._security_headers)
        self.app.on_response_prepare.append(self._cors_headers)
        self.app.add_routes(
            [
                web.get("/", self.page),
                web.get("/health", self.health),
                web.get("/languages", self.languages),
                web.get("/frontend/settings", self.settings),
                web.post("/translate", self.translate),
                web.post("/detect", self.detect),
                web.get("/spec", self.spec),
                web.post("/suggest", self.suggest),
                web.post("/translate_file", self.translate_file),
                web.get("/download_file/{id}/{name}", self.download),
            ]
        )
        self.runner: web.AppRunner | None = None
        self.guard: ConnectionGuard | None = None
        self.listener: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen on host:port (0 = any free port); return the bound port."""
        # handler_cancellation: a client that hangs up cancels its request, which leaves the queue and the
        # running batch at the next step, as a cancelled gRPC call does. shutdown_timeout: how long
        # requests in flight may finish on stop().
        self.runner = web.AppRunner(
            self.app,
            handler_cancellation=True,
            shutdown_timeout=self.shutdown_grace_s,
            **self.limits.handler_kwargs(),
        )
        await self.runner.setup()
        # The port is opened here rather than by a web.TCPSite: its protocol factory is the
        # ConnectionGuard (server/http_limits.py: connection cap, header timeout), which aiohttp's sites
        # do not let one choose. The runner still shuts every connection down on stop().
        self.guard = ConnectionGuard(self.runner.server, self.limits, self._count_malformed)
        loop = asyncio.get_running_loop()
        # With TLS the protocol only sees a connection once its handshake is done: a client that never
        # finishes one is bounded by the same header timeout (asyncio's default is 60 s).
        tls = {"ssl_handshake_timeout": self.limits.header_timeout_s} if ssl_context is not None else {}
        try:
            self.listener = await loop.create_server(
                self.guard,
                host,
                port,
                ssl=ssl_context,
                backlog=self.limits.accept_backlog,
                reuse_address=True,
                reuse_port=False,
                **tls,
            )
        except OSError as e:
            await self.stop()
            reason = os.strerror(e.errno) if e.errno else str(e)
            raise OSError(e.errno, f"cannot serve the HTTP API on {host}:{port}: {reason}") from None
        self.port = self.listener.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        """Stop listening; requests in flight get up to shutdown_grace_s to finish."""
        if self.listener is not None:
            self.listener.close()  # no new connections; the runner ends the open ones
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        self.listener = None
        # After the grace period: kill the msgfmt of any file still being checked (a cancelled request
        # kills its own) so that no file work outlives the stop.
        self.file_work.close()
        self.identifier.close()

    # ---- plumbing ----------------------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except HttpError as e:
            return error_response(e)
        except web.HTTPException as e:  # 404, 405, 413 from aiohttp itself: LibreTranslate's shape
            if e.status < 400:
                raise
            return web.json_response({"error": e.reason}, status=e.status)

    @web.middleware
    async def _preflight(self, request: web.Request, handler) -> web.StreamResponse:
        """A CORS preflight (OPTIONS with Origin and Access-Control-Request-Method), answered before any
        route or credential check: browsers send it without credentials. CORS off: it goes on to the
        router (405, as before); an origin not in the list: 403, which the browser reports as a CORS
        failure."""
        if not (
            request.method == "OPTIONS"
            and self.limits.cors_origins
            and "Origin" in request.headers
            and "Access-Control-Request-Method" in request.headers
        ):
            return await handler(request)
        if self.limits.cors_origin(request.headers["Origin"]) is None:
            return web.json_response({"error": "Origin not allowed"}, status=403)
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Methods": "GET, POST",
                "Access-Control-Allow-Headers": "Content-Type, Authorization",
                "Access-Control-Max-Age": str(self.limits.cors_max_age_s),
            },
        )

    async def _cors_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        """Access-Control-Allow-Origin on every answer to an allowed Origin (errors included: a browser
        client must be able to read a 429 or 403 too). With a list of origins every answer depends on
        the request's Origin, allowed or not, so every answer says so to caches (Vary: Origin): a cached
        answer without the header must not be served to an allowed origin, nor one with it to another."""
        if self.limits.cors_origins and self.limits.cors_origins != ("*",):
            response.headers.add("Vary", "Origin")
        allowed = self.limits.cors_origin(request.headers.get("Origin"))
        if allowed is None:
            return
        response.headers["Access-Control-Allow-Origin"] = allowed
        response.headers["Access-Control-Expose-Headers"] = "Retry-After"  # 429's and 503's wait

    def _count_malformed(self, message: str) -> None:
        """A request aiohttp's parser refused (server/http_limits.py): counted as the 400 it got."""
        self.metrics.requests.labels(rpc="malformed", code="INVALID_ARGUMENT", transport="http").inc()

    @staticmethod
    async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
        """On every answer: no MIME sniffing, no referrer, no framing. The page sets its own CSP."""
        response.headers.setdefault("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["X-Frame-Options"] = "DENY"  # frame-ancestors for browsers without CSP 2

    async def _authorized_params(self, request: web.Request) -> dict[str, Any]:
        """The request's parameters, once its credentials pass. The bearer token doubles as api_key: in
        the query or the body, or `Authorization: Bearer`; one rule for all (server/auth.py
        token_matches), and every credential given must be the token.

        Credentials in the header or the query are checked before the body is read: a wrong one costs
        no body parsing. Only a request with none there has its (bounded) body read for an api_key."""
        if not self.token:
            return await read_params(request, self.limits)
        presented: list[Any] = []
        header = bearer_credentials(request.headers.get("Authorization", ""))
        if header is not None:
            presented.append(header)
        presented.extend(request.query.getall("api_key", []))
        presented = [p for p in presented if p not in ("", b"")]
        self._check_credentials(presented)
        params = await read_params(request, self.limits, check_text=False)
        body_key = params.get("api_key")
        if body_key not in (None, "") and body_key not in presented:
            presented.append(body_key)
        if not presented:
            raise HttpError(403, "Invalid API key")
        self._check_credentials(presented)  # before the text checks: a stranger learns nothing from a 400
        check_unicode(params)
        return params

    def _check_credentials(self, presented: list[Any]) -> None:
        if any(not isinstance(p, str | bytes) or not token_matches(p, self.token) for p in presented):
            raise HttpError(403, "Invalid API key")

    async def _serve(self, rpc: str, request: web.Request, work) -> web.StreamResponse:
        """Run `work(request, params, request_id, stats)` with auth, metrics and the request log line."""
        start = time.monotonic()
        request_id = request.headers.get("x-request-id", "")[:64] or uuid.uuid4().hex[:16]
        stats: dict = {}
        status, message = 500, ""
        self.metrics.in_flight.inc()
        try:
            params = await self._authorized_params(request)
            response = await work(request, params, request_id, stats)
            status = response.status
            return response
        except Failure as f:
            e = from_failure(f)
            status, message = e.status, e.message
            return error_response(e)
        except HttpError as e:
            status, message = e.status, e.message
            return error_response(e)
        except web.HTTPException as e:
            status, message = e.status, e.reason
            raise
        except asyncio.CancelledError:  # the client hung up (handler_cancellation)
            status, message = 499, "cancelled by client"
            raise
        except (ValueError, OverflowError, RecursionError) as e:
            # What client input makes Python's own parsing raise (int() of a 5000-digit string, a float
            # past 1e308, nesting past the recursion limit) where no check above caught it: the
            # client's 400, not a 500 with a traceback. The line names where it came from, so the
            # missing check can still be added where it belongs.
            status, message = 400, f"Invalid request: {_reason(e)}"
            frame = e.__traceback__
            while frame is not None and frame.tb_next is not None:
                frame = frame.tb_next
            where = f"{frame.tb_frame.f_code.co_filename}:{frame.tb_lineno}" if frame else "?"
            log.warning("client input raised %s at %s", type(e).__name__, where)
            return error_response(HttpError(400, message))
        except Exception as e:
            log.exception("unexpected error in HTTP %s", rpc)
            message = f"internal error: {e}"
            return error_response(HttpError(500, message))
        finally:
            self.metrics.in_flight.dec()
            elapsed = time.monotonic() - start
            code = CODE_NAMES.get(status, "UNKNOWN")
            self.metrics.requests.labels(rpc=rpc, code=code, transport="http").inc()
            self.metrics.request_latency.labels(rpc=rpc, transport="http").observe(elapsed)
            fields = {"id": request_id, "rpc": rpc, "transport": "http", "status": code}
            fields["http_status"] = status
            fields.update(stats, ms=round(elapsed * 1000, 2))
            if message:
                fields["error"] = message
            log.info("request", extra={"fields": fields})

    async def _wait_for_model(self, timeout_ms: int = 0) -> float:
        """Wait for capacity rather than answer 429/503 at once (docs/service.md "Waiting for
        capacity"): LibreTranslate clients such as Weblate turn a service off for 30 minutes on either.
        Returns until when the request may wait in line for room in a full queue (wait_until of
        TranslationCore.translate); until then, or its timeout_ms if sooner, it waits for a model
        still loading."""
        wait_until = time.monotonic() + self.limits.queue_wait_s
        until = min(wait_until, time.monotonic() + timeout_ms / 1000) if timeout_ms else wait_until
        await self.core.wait_for_model(until)
        return wait_until

    def _check_languages(self, params: dict[str, Any]) -> tuple[bool, tuple[str, str]]:
        """source/target routed by the shared path (server/translate.py route: the served pairs, codes
        as LibreTranslate clients send them, pt-BR / pt_BR / pt alike): whether the source was "auto",
        and the served pair. With "auto" the pair's source is empty: it is the texts' language
        (server/detect.py route_auto), and only the target is checked here."""
        for name in ("source", "target"):
            if not params.get(name):
                raise HttpError(400, f"Invalid request: missing {name} parameter")
        source, target = str(params["source"]).lower(), str(params["target"])
        if source == "auto":
            return True, ("", sources_for(self.core, target)[1])
        return False, self.core.route(source, target)[1]

    # ---- routes -------------------------------------------------------------------------------------

    async def page(self, request: web.Request) -> web.StreamResponse:
        html = (WEB_DIR / "index.html").read_bytes()
        headers = {"Cache-Control": "no-cache", "Content-Security-Policy": page_policy(html)}
        return web.Response(body=html, content_type="text/html", charset="utf-8", headers=headers)

    async def health(self, request: web.Request) -> web.Response:
        serving = self.serving() and self.core.backend is not None
        status = "SERVING" if serving else "NOT_SERVING"
        return web.json_response({"status": status}, status=200 if serving else 503)

    async def languages(self, request: web.Request) -> web.Response:
        # LibreTranslate's format, from the loaded models' pairs (while they load, the pairs their
        # manifests declare): each code once, with its real targets.
        served = self.core.pairs or self.core.announced
        pairs = [(bcp47(s), bcp47(t)) for s, t in served] or [DEFAULT_PAIR]
        codes = list(dict.fromkeys(code for pair in pairs for code in pair))
        return web.json_response(
            [{"code": c, "name": name_of(c), "targets": [t for s, t in pairs if s == c]} for c in codes]
        )

    async def settings(self, request: web.Request) -> web.Response:
        from runtime.faithful.segment import MAX_TEXT_CHARS

        backend = self.core.backend
        engine = backend.engine if backend else None
        pair = (engine.source_language, engine.target_language) if engine else ("en", "es")
        return web.json_response(
            {
                "apiKeys": bool(self.token),
                "keyRequired": bool(self.token),
                "charLimit": MAX_TEXT_CHARS,
                "filesTranslation": True,
                "supportedFilesFormat": list(SUFFIXES),
                "maxAlternatives": (engine.max_beam_size - 1) if engine else 0,
                # LibreTranslate front ends translate this many ms after the last key (our page's delay).
                "frontendTimeout": FRONTEND_TIMEOUT_MS,
                "suggestions": False,
                "language": {
                    "source": {"code": pair[0], "name": LANGUAGE_NAMES.get(pair[0], pair[0])},
                    "target": {"code": pair[1], "name": LANGUAGE_NAMES.get(pair[1], pair[1])},
                },
            }
        )

    async def translate(self, request: web.Request) -> web.StreamResponse:
        return await self._serve("Translate", request, self._translate)

    async def suggest(self, request: web.Request) -> web.Response:
        """LibreTranslate's answer when suggestions are off (they always are here: nothing would review
        them), so its clients show their usual message; the body is never read."""
        return web.json_response({"error": "Suggestions are disabled on this server."}, status=403)

    async def detect(self, request: web.Request) -> web.StreamResponse:
        return await self._serve("Detect", request, self._detect)

    async def _detect(
        self, request: web.Request, params: dict[str, Any], request_id: str, stats: dict
    ) -> web.Response:
        """LibreTranslate's /detect: the likeliest languages of q, best first, as
        [{"confidence": 0-100, "language": code}]; a list q gets one such list per text. Bounded as
        /translate is (texts per request, characters per text); needs no model, so it answers while
        one loads."""
        texts, batch = q_texts(params)
        check_texts(self.core, texts)
        rankings = await self.identifier.rank_many(texts)
        stats["texts"] = len(texts)
        answers = [[guess.as_json() for guess in ranked[:RANKED]] for ranked in rankings]
        return web.json_response(answers if batch else answers[0])

    async def spec(self, request: web.Request) -> web.Response:
        """The API as an OpenAPI 3 document, from the limits and settings this server runs with."""
        from runtime.faithful.segment import MAX_TEXT_CHARS

        backend = self.core.backend
        values = SpecValues(
            version=package_version(),
            max_texts=self.core.max_texts,
            max_text_chars=MAX_TEXT_CHARS,
            max_body_bytes=self.limits.max_body_bytes,
            file_suffixes=tuple(SUFFIXES),
            max_alternatives=(backend.engine.max_beam_size - 1) if backend else 0,
            detect_ranked=RANKED,
            frontend_timeout_ms=FRONTEND_TIMEOUT_MS,
            key_required=bool(self.token),
        )
        return web.json_response(build_spec(values))

    async def _translate(
        self, request: web.Request, params: dict[str, Any], request_id: str, stats: dict
    ) -> web.Response:
        texts, batch = q_texts(params)
        fmt = str(params.get("format") or "text")
        if fmt not in ("text", "html"):
            raise HttpError(400, f"Invalid request: format must be text or html, got {fmt!r}")
        wait_until = await self._wait_for_model(int_param(params, "timeout_ms"))
        auto, pair = self._check_languages(params)
        if auto:  # the count is checked before the identifier reads the texts; lengths by the engine
            self.core.validate_texts(texts)
            pair, detected = await route_auto(self.core, self.identifier, texts, pair[1])
        alternatives = int_param(params, "alternatives")
        timeout_ms = int_param(params, "timeout_ms")  # an extension: a deadline as gRPC clients have
        options = OptionRequest()
        if alternatives:
            engine = self.core.route(*pair)[0].engine
            n = alternatives + 1
            if n > engine.max_beam_size:
                raise HttpError(
                    400,
                    f"Invalid request: alternatives={alternatives} needs a beam of {n}, "
                    f"the model's maximum beam is {engine.max_beam_size} (at most "
                    f"{engine.max_beam_size - 1} alternatives)",
                )
            options = OptionRequest(beam_size=max(n, engine.default_options.beam_size), num_hypotheses=n)
        deadline = time.monotonic() + timeout_ms / 1000 if timeout_ms else None
        # format=html goes through the same path: the text layer keeps tags and entities as spans.
        results = await self.core.translate(
            texts,
            options,
            (),
            deadline,
            request_id,
            stats,
            source_language=pair[0],
            target_language=pair[1],
            wait_until=wait_until,
        )
        best = [hyps[0].text if hyps else "" for hyps in results]
        body: dict[str, Any] = {"translatedText": best if batch else best[0]}
        if alternatives:
            alts = [[h.text for h in hyps[1:]] for hyps in results]
            body["alternatives"] = alts if batch else alts[0]
        notes = [note_list(hyps) for hyps in results]
        if any(notes):  # only then: answers without notes stay exactly LibreTranslate's
            body["notes"] = notes if batch else notes[0]
        if auto:
            shown = [guess.as_json() for guess in detected]
            body["detectedLanguage"] = shown if batch else shown[0]
        return web.json_response(body)

    async def translate_file(self, request: web.Request) -> web.StreamResponse:
        return await self._serve("TranslateFile", request, self._translate_file)

    async def _translate_file(
        self, request: web.Request, params: dict[str, Any], request_id: str, stats: dict
    ) -> web.Response:
        upload = params.get("file")
        if not isinstance(upload, web.FileField):
            raise HttpError(400, "Invalid request: missing file parameter (a multipart file upload)")
        # Routed like /translate (an unserved pair is a 400 naming the served ones): the file is
        # translated by that pair's model and a catalog gets the target's Language and Plural-Forms.
        await self._wait_for_model()
        auto, pair = self._check_languages(params)
        found: list[dict[str, Any]] = []  # source=auto: the file's detected language

        async def detect_source(texts: list[str]) -> str:
            (source, _), guesses = await route_auto(
                self.core, self.identifier, [joined_sample(texts)] if texts else [], pair[1]
            )
            found.extend(guess.as_json() for guess in guesses)
            return source

        name = safe_name(upload.filename)
        if not name:
            raise HttpError(400, f"Invalid request: the file's name {upload.filename!r} has no usable name")
        try:
            self.files.require_room()  # a full store refuses before the work, not after it
            data = upload.file.read()
            result = await self.file_work.translate(
                data, name, OptionRequest(), request_id, stats, pair, detect_source if auto else None
            )
            stats.update(filled=result.filled, left_out=len(result.left_out))
            file_id = self.files.put(result.name, result.text.encode())
        except StoreFull as e:
            return self._store_full(e)
        path = f"/download_file/{file_id}/{urllib.parse.quote(result.name, safe='')}"
        # Relative unless a public URL is configured: never built from the client's Host header.
        url = self.file_limits.public_url.rstrip("/") + path
        body = {"translatedFileUrl": url, "filled": result.filled, "leftOut": result.left_out}
        if found:  # an extension, as on /translate
            body["detectedLanguage"] = found[0]
        return web.json_response(body)

    def _store_full(self, e: StoreFull) -> web.Response:
        seconds = max(1, math.ceil(e.retry_after_s))
        response = error_response(
            HttpError(
                503,
                "the translated files kept for download fill the server's store: "
                f"retry in {seconds} s (files are kept {self._kept()})",
            )
        )
        response.headers["Retry-After"] = str(seconds)
        return response

    def _kept(self) -> str:
        ttl = self.file_limits.ttl_s
        return f"{ttl / 60:g} minutes" if ttl >= 60 and ttl % 60 == 0 else f"{ttl:g} s"

    async def download(self, request: web.Request) -> web.Response:
        item = self.files.get(request.match_info["id"])
        if item is None:
            raise HttpError(404, f"Invalid request: no such file (files are kept {self._kept()})")
        name, data = item
        return web.Response(
            body=data,
            content_type=media_type(name),
            charset="utf-8",
            headers={"Content-Disposition": content_disposition(name)},
        )


_INLINE = re.compile(rb"<(script|style)>(.*?)</\1>", re.DOTALL)


def page_policy(html: bytes) -> str:
    """The page's Content-Security-Policy: its own inline script and stylesheet by their sha256 (computed
    from the bytes served, so an edit of the page cannot fall out of step with it) and nothing else;
    fetches to its own origin only; never framed (the page holds an API-key field)."""
    hashes: dict[bytes, list[str]] = {b"script": [], b"style": []}
    for m in _INLINE.finditer(html):
        digest = base64.b64encode(hashlib.sha256(m.group(2)).digest()).decode()
        hashes[m.group(1)].append(f"'sha256-{digest}'")
    return "; ".join(
        [
            "default-src 'none'",
            "script-src " + (" ".join(hashes[b"script"]) or "'none'"),
            "style-src " + (" ".join(hashes[b"style"]) or "'none'"),
            "connect-src 'self'",
            "img-src 'self' data:",
            "form-action 'self'",
            "base-uri 'none'",
            "frame-ancestors 'none'",
        ]
    )


def server_ssl_context(cert: str, key: str, client_ca: str = "") -> ssl.SSLContext:
    """HTTPS with the gRPC server's certificate (and client certificates when a CA is set)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
