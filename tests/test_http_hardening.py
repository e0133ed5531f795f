"""Hostile clients against the HTTP port and the health service (issue 33): client input is a 400 or a
403 with a message, never a 500 or a traceback; credentials are checked before a body is read, by one
rule on both transports; the page carries security headers; malformed HTTP costs one log line; health
Watch streams are capped; the event loop's error log is rate-limited; <script> is not translated.

Over the fake engine (milliseconds) except the <script> test, which needs the real text layer."""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import logging
import re
import socket
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client.load import free_port
from proto.gen.translator.v1 import translator_pb2 as pb
from proto.gen.translator.v1 import translator_pb2_grpc as pb_grpc
from tests.http_helpers import call

TOKEN = "tok-123"
Q = {"q": "a b", "source": "en", "target": "es"}


@pytest.fixture()
def http(start_fake_server):
    def start(**overrides):
        return start_fake_server(None, http_port=free_port(), **overrides)

    return start


def raw(server, data: bytes, timeout: float = 10.0, half_close: bool = False) -> bytes:
    """Send `data` on a fresh connection to the HTTP port; everything the server answers until it closes
    (or `timeout`)."""
    with socket.create_connection(("127.0.0.1", server.server.http_port), timeout=timeout) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        chunks = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def post(path: str, body: bytes, content_type: str, extra: str = "") -> bytes:
    head = (
        f"POST /{path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
    )
    return head.encode() + body


def status_and_json(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    try:
        return status, json.loads(body)
    except ValueError:
        return status, {"raw": body[:200].decode(errors="replace")}


def tracebacks(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def multipart(boundary: str, parts: str, end: bool = True) -> bytes:
    return (parts + (f"--{boundary}--\r\n" if end else "")).encode()


FIELDS = 'Content-Disposition: form-data; name="{}"\r\n\r\n{}\r\n'


def form_parts(boundary: str, fields: dict[str, str]) -> str:
    return "".join(f"--{boundary}\r\n" + FIELDS.format(k, v) for k, v in fields.items())


JSON = "application/json"
DEEP = b'{"q": ' + b"[" * 100_000 + b"]" * 100_000 + b', "source": "en", "target": "es"}'
HOSTILE_BODIES = [
    # (what, body, content type, the words the message must hold)
    ("lone surrogate in q", b'{"q": "a \\ud800 b", "source": "en", "target": "es"}', JSON, "'q'"),
    ("lone surrogate in a list", b'{"q": ["x", "\\udfff"], "source": "en", "target": "es"}', JSON, "'q'"),
    (
        "alternatives Infinity",
        b'{"q": "a", "source": "en", "target": "es", "alternatives": Infinity}',
        "application/json",
        "alternatives",
    ),
    (
        "alternatives 1e400",
        b'{"q": "a", "source": "en", "target": "es", "alternatives": 1e400}',
        "application/json",
        "alternatives",
    ),
    (
        "timeout_ms Infinity",
        b'{"q": "a", "source": "en", "target": "es", "timeout_ms": Infinity}',
        "application/json",
        "timeout_ms",
    ),
    (
        "timeout_ms 1e400",
        b'{"q": "a", "source": "en", "target": "es", "timeout_ms": 1e400}',
        "application/json",
        "timeout_ms",
    ),
    (
        "timeout_ms 10**30",
        b'{"q": "a", "source": "en", "target": "es", "timeout_ms": 1' + b"0" * 30 + b"}",
        "application/json",
        "timeout_ms",
    ),
    (
        "timeout_ms -Infinity as form",
        b"q=a&source=en&target=es&timeout_ms=-Infinity",
        "application/x-www-form-urlencoded",
        "timeout_ms",
    ),
    ("100k-deep JSON", DEEP, "application/json", "nested too deeply"),
    ("JSON not UTF-8", b'{"q": "\xff\xfe"}', "application/json", "not valid JSON"),
    (
        "multipart without its closing boundary",
        multipart("BB", form_parts("BB", Q), end=False),
        "multipart/form-data; boundary=BB",
        "form",
    ),
    ("multipart without boundary=", multipart("BB", form_parts("BB", Q)), "multipart/form-data", "form"),
    (
        "multipart part header over 8190 bytes",
        b'--BB\r\nContent-Disposition: form-data; name="q"\r\nX-Long: '
        + b"x" * 9000
        + b"\r\n\r\na\r\n--BB--\r\n",
        "multipart/form-data; boundary=BB",
        "form",
    ),
    (
        "multipart with an unknown charset",
        b'--BB\r\nContent-Disposition: form-data; name="q"\r\n'
        b"Content-Type: text/plain; charset=nope\r\n\r\na\r\n--BB--\r\n",
        "multipart/form-data; boundary=BB",
        "",
    ),
]


def test_hostile_bodies_are_400s_with_a_message_never_500s_or_tracebacks(http, caplog):
    server = http()
    for what, body, content_type, words in HOSTILE_BODIES:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            status, answer = status_and_json(raw(server, post("translate", body, content_type)))
        assert status == 400, (what, status, answer)
        assert words in answer.get("error", ""), (what, answer)
        assert not tracebacks(caplog), (what, tracebacks(caplog))
    assert server.total("translator_requests_total", code="INTERNAL") == 0
    assert server.total("translator_requests_total", code="INVALID_ARGUMENT", transport="http") == len(
        HOSTILE_BODIES
    )
    assert call(server, "translate", Q)[:3:2] == (200, {"translatedText": "b a"})  # still serving


def test_an_exception_from_client_input_reaching_the_transport_is_a_400(http, caplog, monkeypatch):
    """The last line of defence: a ValueError that no check caught (the catalog code's int() of a
    5000-digit nplurals was one) is the client's 400, with one warning line and no traceback."""
    server = http()

    async def digits(*args, **kwargs):
        return int("9" * 5000)  # ValueError: Exceeds the limit (4300 digits) for integer string conversion

    monkeypatch.setattr(server.server.http, "_translate", digits)
    with caplog.at_level(logging.INFO):
        status, _, body = call(server, "translate", Q)
    assert status == 400 and "Invalid request" in body["error"] and "4300" in body["error"], body
    assert not [r for r in caplog.records if r.exc_info]
    assert server.total("translator_requests_total", code="INVALID_ARGUMENT", transport="http") == 1


def test_a_lone_surrogate_in_api_key_or_token_is_a_403(http, caplog):
    server = http(auth_token=TOKEN)
    body = b'{"q": "a", "source": "en", "target": "es", "api_key": "\\ud800"}'
    with caplog.at_level(logging.INFO):
        status, answer = status_and_json(raw(server, post("translate", body, "application/json")))
        assert (status, answer) == (403, {"error": "Invalid API key"})
        bad_header = "Authorization: Bearer \xed\xa0\x80\r\n"
        answer = raw(server, post("translate", b"{}", "application/json", bad_header))
        assert status_and_json(answer)[0] == 403
    assert not tracebacks(caplog)


def test_wrong_credentials_are_refused_before_the_body_is_read(http):
    """The headers announce 4 MB that never come: a wrong token is answered at once, not after the
    body (which a client could make the server parse, up to 4 MiB, before its 403)."""
    server = http(auth_token=TOKEN, http_body_timeout_s=30)
    for extra, path in (("Authorization: Bearer wrong\r\n", "translate"), ("", "translate?api_key=wrong")):
        head = (
            f"POST /{path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: 4000000\r\n{extra}\r\n"
        )
        start = time.monotonic()
        answer = raw(server, head.encode(), timeout=5)
        assert status_and_json(answer) == (403, {"error": "Invalid API key"}), answer[:300]
        assert time.monotonic() - start < 3


def test_one_token_rule_for_both_transports(http):
    """Blanks around a presented token are dropped, by gRPC as by HTTP (gRPC refused `Bearer tok `
    while HTTP accepted it)."""
    server = http(auth_token=TOKEN)
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        for value in (f"Bearer {TOKEN} ", f"Bearer  {TOKEN}  ", f"bearer {TOKEN}"):
            request = pb.TranslateRequest(texts=["a b"])
            r = stub.Translate(request, metadata=[("authorization", value)], timeout=10)
            assert r.translations[0].hypotheses[0].text == "b a"
        with pytest.raises(grpc.RpcError) as e:
            wrong = [("authorization", f"Bearer {TOKEN}x ")]
            stub.Translate(pb.TranslateRequest(texts=["a b"]), metadata=wrong)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    for headers, body in (
        ({"Authorization": f"Bearer {TOKEN} "}, Q),
        ({}, {**Q, "api_key": f" {TOKEN} "}),
    ):
        assert call(server, "translate", body, headers=headers)[0] == 200
    assert call(server, "translate", {**Q, "api_key": f"{TOKEN} x"})[0] == 403


def test_the_page_and_every_answer_carry_security_headers(http):
    server = http()
    status, headers, html = call(server, "")
    assert status == 200
    csp = headers["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["frame-ancestors"] == "'none'" and directives["default-src"] == "'none'"
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    for tag, directive in (("script", "script-src"), ("style", "style-src")):
        (inline,) = re.findall(rf"<{tag}>(.*?)</{tag}>", html, re.DOTALL)
        digest = base64.b64encode(hashlib.sha256(inline.encode()).digest()).decode()
        assert directives[directive] == f"'sha256-{digest}'"
    assert ' style="' not in html and " onclick=" not in html  # inline attributes would need unsafe-inline
    for path in ("", "health", "languages", "nowhere"):
        h = call(server, path)[1]
        assert h["X-Content-Type-Options"] == "nosniff" and h["Referrer-Policy"] == "no-referrer", path
        assert "frame-ancestors 'none'" in h["Content-Security-Policy"], path


MALFORMED = [
    b"GET / HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n",
    b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"GET / HTTP/9.9x\r\n\r\n",
    b"POST /translate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
]


def test_malformed_http_is_a_400_and_one_quiet_log_line(http, caplog):
    server = http()
    for data in MALFORMED:
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            status, answer = status_and_json(raw(server, data))
        assert status == 400 and answer["error"].startswith("Invalid request: malformed HTTP request"), answer
        assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING], data[:40]
        assert sum(len(r.getMessage()) + len(str(getattr(r, "fields", ""))) for r in caplog.records) < 1000
    counted = server.total("translator_requests_total", rpc="malformed", code="INVALID_ARGUMENT")
    assert counted == len(MALFORMED)


def test_health_watch_streams_are_capped(http):
    server = http(max_health_watches=3)
    channels = [grpc.insecure_channel(server.target) for _ in range(4)]
    try:
        streams = []
        for channel in channels[:3]:
            stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=30)
            assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
            streams.append(stream)
        extra = health_pb2_grpc.HealthStub(channels[3]).Watch(health_pb2.HealthCheckRequest(), timeout=30)
        with pytest.raises(grpc.RpcError) as e:
            next(extra)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max-health-watches" in e.value.details()
        check = health_pb2_grpc.HealthStub(channels[3]).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert check.status == health_pb2.HealthCheckResponse.SERVING  # Check is never refused
        streams[0].cancel()
        deadline = time.monotonic() + 10
        while server.server.health.watches >= 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        again = health_pb2_grpc.HealthStub(channels[3]).Watch(health_pb2.HealthCheckRequest(), timeout=30)
        assert next(again).status == health_pb2.HealthCheckResponse.SERVING
        again.cancel()
    finally:
        for channel in channels:
            channel.close()


def test_streams_per_grpc_connection_are_capped(http):
    """Past grpc_max_streams_per_connection a connection's next call waits for a free stream (HTTP/2
    flow control), while other connections are served."""
    server = http(grpc_max_streams_per_connection=2)
    own = [("grpc.use_local_subchannel_pool", 1)]  # two TCP connections, not one shared subchannel
    with grpc.insecure_channel(server.target, own) as one, grpc.insecure_channel(server.target, own) as other:
        stub = health_pb2_grpc.HealthStub(one)
        streams = [stub.Watch(health_pb2.HealthCheckRequest(), timeout=30) for _ in range(2)]
        for stream in streams:
            next(stream)
        third = stub.Watch(health_pb2.HealthCheckRequest(), timeout=1.5)
        with pytest.raises(grpc.RpcError) as e:
            next(third)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        check = health_pb2_grpc.HealthStub(other).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        for stream in streams:
            stream.cancel()


def test_event_loop_errors_are_logged_once_per_interval_with_a_count(caplog):
    from server.logs import LoopErrorLimiter

    limiter = LoopErrorLimiter(every_s=0.3)
    emfile = OSError(errno.EMFILE, "Too many open files")
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        for _ in range(10_000):
            limiter(None, {"message": "socket.accept() out of system resource", "exception": emfile})
        limiter(None, {"message": "something else", "exception": ValueError("x")})
        time.sleep(0.35)
        limiter(None, {"message": "socket.accept() out of system resource", "exception": emfile})
    records = [r for r in caplog.records if r.name == "asyncio"]
    assert [(r.getMessage(), r.fields["left_out"]) for r in records] == [
        ("socket.accept() out of system resource", 0),
        ("something else", 0),
        ("socket.accept() out of system resource", 9_999),
    ]
    assert records[0].exc_info is None and records[1].exc_info is not None  # OSError: one line
    # out of descriptors at accept(): asyncio retries, the server goes on: a warning; anything else: error
    assert [r.levelno for r in records] == [logging.WARNING, logging.ERROR, logging.WARNING]


def test_the_server_installs_the_rate_limited_loop_error_handler(http, server_loop):
    from server.logs import LoopErrorLimiter

    http()
    assert isinstance(server_loop.loop.get_exception_handler(), LoopErrorLimiter)


# ---- format=html with the real text layer -------------------------------------------------------------


def test_script_and_style_are_never_translated():
    from runtime.faithful.spans import find_spans

    text = '<p>Open the file</p><script type="module">const s = "Open the file";\nalert(s)</script>' + (
        "<style>p { content: 'Save' }</style> <b>Save</b>"
    )
    kept = [(s.kind, s.text) for s in find_spans(text) if s.kind == "glossary"]
    assert kept == [
        ("glossary", '<script type="module">const s = "Open the file";\nalert(s)</script>'),
        ("glossary", "<style>p { content: 'Save' }</style>"),
    ]


def test_html_script_content_comes_back_untouched(start_server, shipped_bundle):
    server = start_server(shipped_bundle, http_port=free_port())
    script = '<script>var label = "Open the file"; // Save the document\n</script>'
    status, _, body = call(
        server,
        "translate",
        {"q": f"<p>Open the file</p>{script}<p>Save</p>", "source": "en", "target": "es", "format": "html"},
    )
    assert status == 200
    assert script in body["translatedText"] and "Abrir" in body["translatedText"], body


def test_a_configured_token_with_blanks_around_it_is_refused():
    """Presented tokens lose their blanks (one rule, server/auth.py): a configured one with some could
    never match, so the configuration says so."""
    from server.config import load_config

    with pytest.raises(ValueError, match="auth_token .* must not start or end with a space or tab"):
        load_config([], env={"TRANSLATOR_AUTH_TOKEN": "tok "})
    assert load_config([], env={"TRANSLATOR_AUTH_TOKEN": "tok"}).auth_token == "tok"
