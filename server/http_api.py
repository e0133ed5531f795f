"""HTTP transport: a LibreTranslate-compatible REST API and the web page, beside gRPC in one process.

aiohttp serves it on the gRPC server's asyncio event loop (grpc.aio), so both transports call the same
`TranslationCore` (server/translate.py: validation, text layer, scheduler) with no thread hop. Routes:
POST /translate, GET /languages, POST /translate_file + GET /download_file/{id}/{name},
GET /frontend/settings, GET /health, and the page at /. Bodies are JSON or forms (urlencoded or
multipart), as LibreTranslate takes them; errors are `{"error": message}` with 400 (bad input),
403 (bad api_key), 429 (overloaded, with Retry-After), 500, 503 (not ready), 504 (deadline).
Handlers never touch ONNX. Documentation: docs/service.md, "HTTP API (LibreTranslate-compatible)".
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import os
import ssl
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from server import translate as core
from server.files import SUFFIXES, translate_file
from server.metrics import Metrics
from server.translate import Failure, OptionRequest, TranslationCore

log = logging.getLogger("server.requests")

WEB_DIR = Path(__file__).with_name("web")
LANGUAGE_NAMES = {"en": "English", "es": "Spanish"}
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
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
FILES_KEPT = 64  # translated files kept for /download_file
FILE_TTL_S = 900.0


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


async def read_params(request: web.Request) -> dict[str, Any]:
    """A JSON object or a form (urlencoded / multipart; a repeated field is a list), over the query."""
    params: dict[str, Any] = dict(request.query)
    if request.method != "POST":
        return params
    if request.content_type == "application/json":
        try:
            body = await request.json()
        except ValueError as e:
            raise HttpError(400, f"Invalid request: the body is not valid JSON ({e})") from None
        if not isinstance(body, dict):
            raise HttpError(400, "Invalid request: the JSON body must be an object")
        params.update(body)
        return params
    form = await request.post()
    for key in set(form.keys()):
        values = form.getall(key)
        params[key] = values if len(values) > 1 else values[0]
    return params


def int_param(params: dict[str, Any], name: str, default: int = 0) -> int:
    value = params.get(name, default)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise HttpError(400, f"Invalid request: {name} must be an integer >= 0, got {value!r}") from None
    if number < 0 or isinstance(value, bool):
        raise HttpError(400, f"Invalid request: {name} must be an integer >= 0, got {value!r}")
    return number


class HttpApi:
    """The aiohttp application over a TranslationCore; `await start(host, port)`, `await stop()`."""

    def __init__(
        self,
        translation: TranslationCore,
        metrics: Metrics,
        *,
        auth_token: str = "",
        max_body_bytes: int = 4 * 1024 * 1024,
        serving: Callable[[], bool] = lambda: True,
        shutdown_grace_s: float = 30.0,
    ) -> None:
        self.core = translation
        self.metrics = metrics
        self.token = auth_token.encode()
        self.serving = serving
        self.shutdown_grace_s = shutdown_grace_s
        self.files: OrderedDict[str, tuple[float, str, bytes]] = OrderedDict()
        self.app = web.Application(client_max_size=max_body_bytes, middlewares=[self._errors])
        self.app.add_routes(
            [
                web.get("/", self.page),
                web.get("/health", self.health),
                web.get("/languages", self.languages),
                web.get("/frontend/settings", self.settings),
                web.post("/translate", self.translate),
                web.post("/translate_file", self.translate_file),
                web.get("/download_file/{id}/{name}", self.download),
            ]
        )
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen on host:port (0 = any free port); return the bound port."""
        # handler_cancellation: a client that hangs up cancels its request, which leaves the queue and the
        # running batch at the next step, as a cancelled gRPC call does. shutdown_timeout: how long
        # requests in flight may finish on stop().
        self.runner = web.AppRunner(
            self.app, access_log=None, handler_cancellation=True, shutdown_timeout=self.shutdown_grace_s
        )
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, ssl_context=ssl_context, reuse_port=False)
        try:
            await site.start()
        except OSError as e:
            await self.stop()
            reason = os.strerror(e.errno) if e.errno else str(e)
            raise OSError(e.errno, f"cannot serve the HTTP API on {host}:{port}: {reason}") from None
        self.port = self.runner.addresses[0][1]
        return self.port

    async def stop(self) -> None:
        """Stop listening; requests in flight get up to shutdown_grace_s to finish."""
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

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

    def _authorize(self, request: web.Request, params: dict[str, Any]) -> None:
        """The bearer token doubles as api_key: in the body/query, or `Authorization: Bearer`."""
        if not self.token:
            return
        presented = str(params.get("api_key") or "")
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        if not presented and scheme.lower() == "bearer":
            presented = value.strip()
        if not presented or not hmac.compare_digest(presented.encode(), self.token):
            raise HttpError(403, "Invalid API key")

    async def _serve(self, rpc: str, request: web.Request, work) -> web.StreamResponse:
        """Run `work(request, params, request_id, stats)` with auth, metrics and the request log line."""
        start = time.monotonic()
        request_id = request.headers.get("x-request-id", "")[:64] or uuid.uuid4().hex[:16]
        stats: dict = {}
        status, message = 500, ""
        self.metrics.in_flight.inc()
        try:
            params = await read_params(request)
            self._authorize(request, params)
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

    def _check_languages(self, params: dict[str, Any]) -> bool:
        """source/target against the model's pair; True when the source was "auto"."""
        engine = self.core.require_backend().engine
        for name in ("source", "target"):
            if not params.get(name):
                raise HttpError(400, f"Invalid request: missing {name} parameter")
        source, target = str(params["source"]).lower(), str(params["target"]).lower()
        pair = f"{engine.source_language} -> {engine.target_language}"
        if source not in ("auto", engine.source_language):
            raise HttpError(400, f"{source} is not supported as source: the model translates {pair}")
        if target != engine.target_language:
            raise HttpError(400, f"{target} is not supported as target: the model translates {pair}")
        return source == "auto"

    # ---- routes -------------------------------------------------------------------------------------

    async def page(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    async def health(self, request: web.Request) -> web.Response:
        serving = self.serving() and self.core.backend is not None
        status = "SERVING" if serving else "NOT_SERVING"
        return web.json_response({"status": status}, status=200 if serving else 503)

    async def languages(self, request: web.Request) -> web.Response:
        backend = self.core.backend
        pair = (backend.engine.source_language, backend.engine.target_language) if backend else ("en", "es")
        return web.json_response(
            [
                {"code": pair[0], "name": LANGUAGE_NAMES.get(pair[0], pair[0]), "targets": [pair[1]]},
                {"code": pair[1], "name": LANGUAGE_NAMES.get(pair[1], pair[1]), "targets": []},
            ]
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
                "language": {
                    "source": {"code": pair[0], "name": LANGUAGE_NAMES.get(pair[0], pair[0])},
                    "target": {"code": pair[1], "name": LANGUAGE_NAMES.get(pair[1], pair[1])},
                },
            }
        )

    async def translate(self, request: web.Request) -> web.StreamResponse:
        return await self._serve("Translate", request, self._translate)

    async def _translate(
        self, request: web.Request, params: dict[str, Any], request_id: str, stats: dict
    ) -> web.Response:
        q = params.get("q")
        if q is None or q == "":
            raise HttpError(400, "Invalid request: missing q parameter")
        batch = isinstance(q, list)
        texts = q if batch else [q]
        if not all(isinstance(t, str) for t in texts):
            raise HttpError(400, "Invalid request: q must be a string or a list of strings")
        fmt = str(params.get("format") or "text")
        if fmt not in ("text", "html"):
            raise HttpError(400, f"Invalid request: format must be text or html, got {fmt!r}")
        auto = self._check_languages(params)
        alternatives = int_param(params, "alternatives")
        timeout_ms = int_param(params, "timeout_ms")  # an extension: a deadline as gRPC clients have
        options = OptionRequest()
        if alternatives:
            engine = self.core.require_backend().engine
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
        results = await self.core.translate(texts, options, (), deadline, request_id, stats)
        best = [hyps[0].text if hyps else "" for hyps in results]
        body: dict[str, Any] = {"translatedText": best if batch else best[0]}
        if alternatives:
            alts = [[h.text for h in hyps[1:]] for hyps in results]
            body["alternatives"] = alts if batch else alts[0]
        if auto:
            detected = {"confidence": 100.0, "language": self.core.require_backend().engine.source_language}
            body["detectedLanguage"] = [detected] * len(texts) if batch else detected
        return web.json_response(body)

    async def translate_file(self, request: web.Request) -> web.StreamResponse:
        return await self._serve("TranslateFile", request, self._translate_file)

    async def _translate_file(
        self, request: web.Request, params: dict[str, Any], request_id: str, stats: dict
    ) -> web.Response:
        upload = params.get("file")
        if not isinstance(upload, web.FileField):
            raise HttpError(400, "Invalid request: missing file parameter (a multipart file upload)")
        self._check_languages(params)
        name = Path(upload.filename or "messages.po").name
        result = await translate_file(self.core, upload.file.read(), name, OptionRequest(), request_id, stats)
        stats.update(filled=result.filled, left_out=len(result.left_out))
        now = time.monotonic()
        while self.files and (len(self.files) >= FILES_KEPT or next(iter(self.files.values()))[0] < now):
            self.files.popitem(last=False)
        file_id = uuid.uuid4().hex
        self.files[file_id] = (now + FILE_TTL_S, result.name, result.text.encode())
        url = f"{request.scheme}://{request.host}/download_file/{file_id}/{result.name}"
        return web.json_response(
            {"translatedFileUrl": url, "filled": result.filled, "leftOut": result.left_out}
        )

    async def download(self, request: web.Request) -> web.Response:
        item = self.files.get(request.match_info["id"])
        if item is None or item[0] < time.monotonic():
            raise HttpError(404, "Invalid request: no such file (files are kept 15 minutes)")
        _, name, data = item
        return web.Response(
            body=data,
            content_type="text/x-gettext-translation" if name.endswith(".po") else "text/plain",
            charset="utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )


def server_ssl_context(cert: str, key: str, client_ca: str = "") -> ssl.SSLContext:
    """HTTPS with the gRPC server's certificate (and client certificates when a CA is set)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
