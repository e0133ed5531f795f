"""The LibreTranslate-compatible HTTP API (server/http_api.py) against real servers, with a real
third-party client (libretranslatepy) and plain HTTP: string and list q, html, JSON and form bodies,
alternatives, bad key, overload through the shared scheduler, .po/.pot and text through /translate_file,
health, metrics with the transport label."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import grpc
import polib
import pytest

from client.load import free_port
from proto.gen.translator.v1 import translator_pb2 as pb
from proto.gen.translator.v1 import translator_pb2_grpc as pb_grpc
from tests.http_helpers import call, upload, url

libretranslatepy = pytest.importorskip("libretranslatepy")
LibreTranslateAPI = libretranslatepy.LibreTranslateAPI

TOKEN = "s3cret-token"
POT = """msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\\n"
"X-Accelerator-Marker: _\\n"

#: src/main.c:10
msgid "_Open the file"
msgstr ""

msgctxt "menu"
msgid "Save"
msgstr ""

msgid "%d file"
msgid_plural "%d files"
msgstr[0] ""
msgstr[1] ""

msgid "Already done"
msgstr "Ya hecho"
"""


@pytest.fixture(scope="module")
def http_server(start_server, shipped_bundle):
    return start_server(shipped_bundle, http_port=free_port())


@pytest.fixture(scope="module")
def tiny_http_server(start_server, tiny_bundle):
    """Random weights, a bearer token, request-level batching and a small queue (overload)."""
    return start_server(
        tiny_bundle,
        http_port=free_port(),
        auth_token=TOKEN,
        batching_mode="request",
        max_wait_ms=1,
        max_queue_segments=32,
        max_texts=32,
    )


# ---- the third-party client -------------------------------------------------------------------------


def test_libretranslatepy_translates(http_server):
    lt = LibreTranslateAPI(url(http_server))
    assert lt.translate("Open the file", "en", "es") == "Abrir el archivo"
    assert lt.translate("Save", source="auto", target="es") == "Guardar"
    codes = {lang["code"]: lang for lang in lt.languages()}
    assert codes["en"]["targets"] == ["es"] and "es" in codes


def test_libretranslatepy_error_case(http_server):
    lt = LibreTranslateAPI(url(http_server))
    with pytest.raises(urllib.error.HTTPError) as e:
        lt.translate("Open the file", "fr", "es")
    assert e.value.code == 400
    assert "fr is not supported" in json.loads(e.value.read())["error"]
    with pytest.raises(urllib.error.HTTPError) as e:
        lt.translate("", "en", "es")
    assert e.value.code == 400
    assert json.loads(e.value.read()) == {"error": "Invalid request: missing q parameter"}


def test_libretranslatepy_api_key(tiny_http_server):
    good = LibreTranslateAPI(url(tiny_http_server), api_key=TOKEN)
    assert isinstance(good.translate("Open", "en", "es"), str)
    for key in ("wrong", None):
        with pytest.raises(urllib.error.HTTPError) as e:
            LibreTranslateAPI(url(tiny_http_server), api_key=key).translate("Open", "en", "es")
        assert e.value.code == 403
        assert json.loads(e.value.read()) == {"error": "Invalid API key"}
    # The bearer header works too; /languages and /health need no key (as in LibreTranslate).
    status, _, body = call(
        tiny_http_server,
        "translate",
        {"q": "Open", "source": "en", "target": "es"},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert status == 200 and isinstance(body["translatedText"], str)
    assert call(tiny_http_server, "languages")[0] == 200
    assert (
        tiny_http_server.sample(
            "translator_requests_total", rpc="Translate", code="UNAUTHENTICATED", transport="http"
        )
        == 2
    )


# ---- the API ----------------------------------------------------------------------------------------


def test_list_q_json_and_form(http_server):
    status, _, body = call(
        http_server, "translate", {"q": ["Open the file", "Save"], "source": "en", "target": "es"}
    )
    assert status == 200
    # "Save" is answered from the translation memory: its note comes with it (an extension).
    memory = {
        "action": "memory",
        "start": 0,
        "end": 4,
        "reason": "translation memory: as 55 packages translate it",
    }
    assert body == {"translatedText": ["Abrir el archivo", "Guardar"], "notes": [[], [memory]]}
    # A form body with q repeated is a list too; a single q a string.
    status, _, body = call(
        http_server, "translate", {"q": ["Open the file", "Save"], "source": "en", "target": "es"}, form=True
    )
    assert status == 200 and body["translatedText"] == ["Abrir el archivo", "Guardar"]
    status, _, body = call(http_server, "translate", {"q": "Save", "source": "en", "target": "es"}, form=True)
    assert body == {"translatedText": "Guardar", "notes": [memory]}


def test_html_keeps_tags_and_entities(http_server):
    q = '<p>Click <a href="https://example.org/?a=1&amp;b=2">here</a> to open the file &amp; folder.</p>'
    status, _, body = call(
        http_server, "translate", {"q": q, "source": "en", "target": "es", "format": "html"}
    )
    assert status == 200
    out = body["translatedText"]
    assert out.startswith("<p>") and out.endswith("</p>")
    assert '<a href="https://example.org/?a=1&amp;b=2">' in out and "</a>" in out
    assert out.count("&amp;") == q.count("&amp;")
    status, _, body = call(
        http_server, "translate", {"q": "x", "source": "en", "target": "es", "format": "pdf"}
    )
    assert status == 400 and "format must be text or html" in body["error"]


def test_alternatives_are_the_n_best(http_server):
    status, _, body = call(
        http_server, "translate", {"q": "Delete the file", "source": "en", "target": "es", "alternatives": 3}
    )
    assert status == 200
    assert isinstance(body["translatedText"], str)
    alts = body["alternatives"]
    assert len(alts) == 3 and body["translatedText"] not in alts and len(set(alts)) == 3
    status, _, body = call(
        http_server, "translate", {"q": "x", "source": "en", "target": "es", "alternatives": 8}
    )
    assert status == 400 and "at most 7 alternatives" in body["error"]
    status, _, body = call(
        http_server, "translate", {"q": "x", "source": "en", "target": "es", "alternatives": "two"}
    )
    assert status == 400 and "alternatives must be an integer" in body["error"]


def test_shared_validation_messages(http_server):
    """Limits and their messages come from the shared path, the same as gRPC's."""
    status, _, body = call(http_server, "translate", {"q": ["a"] * 65, "source": "en", "target": "es"})
    assert status == 400 and "too many texts: 65 in one request, the limit is 64" in body["error"]
    status, _, body = call(http_server, "translate", {"q": "a" * 20_001, "source": "en", "target": "es"})
    assert status == 400
    status, _, body = call(http_server, "translate", {"q": [1, 2], "source": "en", "target": "es"})
    assert status == 400 and "list of strings" in body["error"]
    status, _, body = call(http_server, "translate", {"q": "x", "source": "en", "target": "de"})
    assert status == 400 and "de is not supported as target" in body["error"]
    status, _, body = call(http_server, "nowhere")
    assert status == 404 and "error" in body
    req = urllib.request.Request(
        url(http_server, "translate"), data=b"{not json", headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400 and "not valid JSON" in json.loads(e.value.read())["error"]


def test_translate_file_po(http_server):
    status, _, body = upload(http_server, "app.pot", POT)
    assert status == 200, body
    assert body["translatedFileUrl"].endswith("/app.po") and body["filled"] == 3
    with urllib.request.urlopen(url(http_server, body["translatedFileUrl"]), timeout=10) as r:
        assert 'filename="app.po"' in r.headers["Content-Disposition"]
        po = polib.pofile(r.read().decode())
    entries = {(e.msgctxt, e.msgid): e for e in po}
    assert entries[(None, "_Open the file")].msgstr == "_Abrir el archivo"
    assert "fuzzy" in entries[(None, "_Open the file")].flags
    assert entries[("menu", "Save")].msgstr == "Guardar"
    assert entries[(None, "%d file")].msgstr_plural == {0: "%d archivo", 1: "%d archivos"}
    assert entries[(None, "Already done")].msgstr == "Ya hecho"  # kept
    assert po.metadata["Language"] == "es" and "nplurals=2" in po.metadata["Plural-Forms"]


def test_translate_file_text_and_bad_files(http_server):
    status, _, body = upload(http_server, "notes.txt", "Open the file\n\nSave\n")
    assert status == 200 and body["translatedFileUrl"].endswith("/notes.es.txt")
    with urllib.request.urlopen(url(http_server, body["translatedFileUrl"]), timeout=10) as r:
        assert r.read().decode() == "Abrir el archivo\n\nGuardar\n"
    status, _, body = upload(http_server, "doc.pdf", "x")
    assert status == 400 and "unsupported file format" in body["error"]
    status, _, body = upload(http_server, "bad.po", 'msgid "a"\nmsgstr "b"\nfoo bar\n')
    assert status == 400 and "not a readable gettext catalog" in body["error"]


def test_health_and_metrics_transport_label(http_server):
    status, _, body = call(http_server, "health")
    assert status == 200 and body == {"status": "SERVING"}
    call(http_server, "translate", {"q": "Open", "source": "en", "target": "es"})
    assert http_server.sample("translator_requests_total", rpc="Translate", code="OK", transport="http") >= 1
    assert (
        http_server.sample("translator_request_duration_seconds_count", rpc="Translate", transport="http")
        >= 1
    )
    status, _, body = call(http_server, "frontend/settings")
    assert body["filesTranslation"] is True and body["language"]["target"]["code"] == "es"


def test_overload_waits_in_the_shared_queue_instead_of_429(tiny_http_server):
    """gRPC requests fill the scheduler's queue; an HTTP request then waits in line for room (bounded:
    tests/test_http_waiting.py) and is answered once the gRPC ones leave, where it used to get a 429."""
    import threading

    long_opts = pb.DecodingOptions(beam_size=8, max_length=256)
    texts = [f"Open the file number {i} now" for i in range(32)]
    metadata = [("authorization", f"Bearer {TOKEN}")]
    answer: list = []
    with grpc.insecure_channel(tiny_http_server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        running = stub.Translate.future(
            pb.TranslateRequest(texts=texts, options=long_opts), metadata=metadata
        )
        tiny_http_server.wait_in_engine()
        queued = stub.Translate.future(
            pb.TranslateRequest(texts=[t + "!" for t in texts[:30]], options=long_opts), metadata=metadata
        )
        deadline = time.monotonic() + 5
        while tiny_http_server.sample("translator_queue_segments") < 30 and time.monotonic() < deadline:
            time.sleep(0.02)
        body = {"q": ["a b", "c d", "e f"], "source": "en", "target": "es", "api_key": TOKEN}
        waiting = threading.Thread(target=lambda: answer.append(call(tiny_http_server, "translate", body)))
        waiting.start()
        wait_until(lambda: tiny_http_server.sample("translator_queue_waiting_requests") == 1)
        running.cancel()
        queued.cancel()
        waiting.join(60)
    status, _, body = answer[0]
    assert status == 200 and len(body["translatedText"]) == 3, body
    assert tiny_http_server.sample("translator_admissions_total", outcome="admitted") == 1
    assert (
        tiny_http_server.sample(
            "translator_requests_total", rpc="Translate", code="RESOURCE_EXHAUSTED", transport="http"
        )
        == 0
    )


def test_client_hanging_up_cancels_the_request(tiny_http_server):
    """A client that disconnects drops its segments from the scheduler's queue (aiohttp handler
    cancellation), as a cancelled gRPC call does."""
    import socket

    long_opts = pb.DecodingOptions(beam_size=8, max_length=256)
    texts = [f"Open the file number {i} now" for i in range(32)]
    body = json.dumps({"q": ["Word one", "Word two"], "source": "en", "target": "es", "api_key": TOKEN})
    with grpc.insecure_channel(tiny_http_server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        running = stub.Translate.future(
            pb.TranslateRequest(texts=texts, options=long_opts),
            metadata=[("authorization", f"Bearer {TOKEN}")],
        )
        tiny_http_server.wait_in_engine()  # the HTTP request below waits in the queue
        with socket.create_connection(("127.0.0.1", tiny_http_server.server.http_port), timeout=10) as s:
            s.sendall(
                b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
            )
            wait_until(lambda: tiny_http_server.sample("translator_queue_segments") == 2)
        wait_until(
            lambda: (
                tiny_http_server.sample(
                    "translator_requests_total", rpc="Translate", code="CANCELLED", transport="http"
                )
                == 1
            )
        )
        assert tiny_http_server.sample("translator_queue_segments") == 0
        running.cancel()


def wait_until(condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_timeout_ms_is_a_deadline_504(tiny_http_server):
    """timeout_ms (an extension) is a deadline in the shared scheduler: past it, 504."""
    long_opts = pb.DecodingOptions(beam_size=8, max_length=256)
    texts = [f"Close the window number {i} now" for i in range(32)]
    with grpc.insecure_channel(tiny_http_server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        running = stub.Translate.future(
            pb.TranslateRequest(texts=texts, options=long_opts),
            metadata=[("authorization", f"Bearer {TOKEN}")],
        )
        tiny_http_server.wait_in_engine()  # the HTTP request waits in the queue past its deadline
        status, _, body = call(
            tiny_http_server,
            "translate",
            {"q": "Word three", "source": "en", "target": "es", "api_key": TOKEN, "timeout_ms": 200},
        )
        running.cancel()
    assert status == 504 and "deadline" in body["error"]
    assert (
        tiny_http_server.sample(
            "translator_requests_total", rpc="Translate", code="DEADLINE_EXCEEDED", transport="http"
        )
        == 1
    )


def test_https_with_the_grpc_certificate(start_server, tiny_bundle, tmp_path):
    """With TLS on, the HTTP port serves HTTPS with the gRPC server's certificate."""
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    server = start_server(tiny_bundle, http_port=free_port(), tls_cert=str(cert), tls_key=str(key))
    context = ssl.create_default_context(cafile=str(cert))
    base = f"https://127.0.0.1:{server.server.http_port}"
    with urllib.request.urlopen(f"{base}/health", context=context, timeout=10) as r:
        assert json.loads(r.read()) == {"status": "SERVING"}
    req = urllib.request.Request(f"{base}/translate", data=b"q=Open&source=en&target=es")
    with urllib.request.urlopen(req, context=context, timeout=30) as r:
        assert isinstance(json.loads(r.read())["translatedText"], str)
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plain HTTP on a TLS port
        urllib.request.urlopen(f"http://127.0.0.1:{server.server.http_port}/health", timeout=5)
    server.stop()
