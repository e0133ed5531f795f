"""The HTTP API (server/http_api.py) over the fake engine: exact answers, statuses, headers, metrics and
log lines, in milliseconds. tests/test_http_api.py drives the same API with the real model and a
third-party client."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from client.load import free_port
from runtime.faithful.segment import MAX_TEXT_CHARS
from tests.conftest import RunningServer
from tests.fake_engine import FakeEngine, GatedEngine
from tests.http_helpers import call, upload

TOKEN = "tok-123"


def http_lines(caplog) -> list[dict]:
    return [r.fields for r in caplog.records if getattr(r, "fields", {}).get("transport") == "http"]


@pytest.fixture()
def http(start_fake_server):
    """http(engine=None, **config) -> a fake-engine server with the HTTP API on a free port."""

    def start(engine=None, **overrides) -> RunningServer:
        return start_fake_server(engine, http_port=free_port(), **overrides)

    return start


def test_translate_answers_as_libretranslate_does(http):
    server = http()
    q = {"source": "en", "target": "es"}
    assert call(server, "translate", {"q": "Open the file", **q})[2] == {"translatedText": "file the Open"}
    assert call(server, "translate", {"q": ["a b", "c d"], **q})[2] == {"translatedText": ["b a", "d c"]}
    # source=auto: the identifier's language and confidence (tests/test_detect.py has the rule).
    status, _, body = call(server, "translate", {"q": "a b", "source": "auto", "target": "es"}, form=True)
    assert (status, body["translatedText"], body["detectedLanguage"]["language"]) == (200, "b a", "en")
    body = call(server, "translate", {"q": ["a b", "c"], "source": "AUTO", "target": "ES"})[2]
    assert [d["language"] for d in body["detectedLanguage"]] == ["en", "en"]
    # The query string counts too (under the body).
    assert call(server, "translate?source=en&target=es", {"q": "x y"}, form=True)[2] == {
        "translatedText": "y x"
    }
    assert server.total("translator_requests_total", rpc="Translate", code="OK", transport="http") == 5


def test_alternatives_use_a_beam_of_at_least_the_default(http):
    engine = FakeEngine(step_s=0)
    server = http(engine, batching_mode="request", max_wait_ms=0)
    body = call(server, "translate", {"q": "a b", "source": "en", "target": "es", "alternatives": 1})[2]
    assert body == {"translatedText": "b a", "alternatives": ["b a (1)"]}
    body = call(server, "translate", {"q": ["a b"], "source": "en", "target": "es", "alternatives": "6"})[2]
    assert body["alternatives"] == [[f"b a ({k})" for k in range(1, 7)]]
    assert [(o.beam_size, o.num_hypotheses) for _, o in engine.batches] == [(4, 2), (7, 7)]
    body = call(server, "translate", {"q": "a b", "source": "en", "target": "es", "alternatives": 0})[2]
    assert body == {"translatedText": "b a"}
    status, _, body = call(server, "translate", {"q": "a", "source": "en", "target": "es", "alternatives": 8})
    assert (status, body["error"]) == (
        400,
        "Invalid request: alternatives=8 needs a beam of 9, the model's maximum beam is 8 (at most 7 "
        "alternatives)",
    )


Q = {"q": "a", "source": "en", "target": "es"}
BAD_REQUESTS = [
    ({"source": "en", "target": "es"}, "Invalid request: missing q parameter"),
    ({**Q, "q": ""}, "Invalid request: missing q parameter"),
    ({"q": "a", "target": "es"}, "Invalid request: missing source parameter"),
    ({"q": "a", "source": "en"}, "Invalid request: missing target parameter"),
    ({**Q, "source": "fr"}, "fr is not supported as source: the model translates en -> es"),
    ({**Q, "target": "de"}, "de is not supported as target: the model translates en -> es"),
    ({**Q, "q": [1]}, "Invalid request: q must be a string or a list of strings"),
    ({**Q, "format": "md"}, "Invalid request: format must be text or html, got 'md'"),
    ({**Q, "alternatives": -1}, "Invalid request: alternatives must be an integer >= 0, got -1"),
    ({**Q, "alternatives": True}, "Invalid request: alternatives must be an integer >= 0, got True"),
    ({**Q, "timeout_ms": "soon"}, "Invalid request: timeout_ms must be an integer >= 0, got 'soon'"),
    (
        {**Q, "q": ["a"] * 5},
        "too many texts: 5 in one request, the limit is 4; split them over several requests",
    ),
    ([Q], "Invalid request: the JSON body must be an object"),
]


def test_bad_requests_are_400_with_the_message(http, caplog):
    server = http(max_texts=4)
    for n, (body, message) in enumerate(BAD_REQUESTS, 1):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="server.requests"):
            status, _, answer = call(server, "translate", body, headers={"x-request-id": f"bad-{n}"})
        assert (status, answer) == (400, {"error": message})
        (line,) = http_lines(caplog)
        assert (line["id"], line["rpc"], line["status"], line["http_status"], line["error"]) == (
            f"bad-{n}",
            "Translate",
            "INVALID_ARGUMENT",
            400,
            message,
        )
        assert server.total("translator_requests_total", code="INVALID_ARGUMENT", transport="http") == n
        assert server.total("translator_request_duration_seconds_count", transport="http") == n
    assert server.total("translator_requests_in_flight") == 0


def test_the_request_log_line(http, caplog):
    server = http()
    with caplog.at_level(logging.INFO, logger="server.requests"):
        call(
            server,
            "translate",
            {"q": ["a b c", "d"], "source": "en", "target": "es"},
            headers={"x-request-id": "r" * 80},
        )
        call(server, "translate", {"q": "a", "source": "en", "target": "es"})
    first, second = http_lines(caplog)
    assert (first["id"], first["status"], first["http_status"], first["texts"], first["segments"]) == (
        "r" * 64,
        "OK",
        200,
        2,
        2,
    )  # fmt: skip
    assert (
        (first["input_tokens"], first["output_tokens"]) == (4, 4)
        and first["ms"] >= 0
        and "error" not in first
    )
    assert len(second["id"]) == 16 and int(second["id"], 16) >= 0


def test_api_key_in_body_query_or_bearer_header(http):
    server = http(auth_token=TOKEN)
    q = {"q": "a b", "source": "en", "target": "es"}
    assert call(server, "translate", {**q, "api_key": TOKEN})[0] == 200
    assert call(server, f"translate?api_key={TOKEN}", q, form=True)[0] == 200
    assert call(server, "translate", q, headers={"Authorization": f"bearer  {TOKEN}"})[0] == 200
    for headers, body in (
        ({}, q),
        ({}, {**q, "api_key": TOKEN + "x"}),
        ({"Authorization": f"Basic {TOKEN}"}, q),
        ({"Authorization": f"Bearer {TOKEN}"}, {**q, "api_key": "wrong"}),  # the api_key given counts
    ):
        assert call(server, "translate", body, headers=headers)[:3:2] == (403, {"error": "Invalid API key"})
    assert server.total("translator_requests_total", code="UNAUTHENTICATED", transport="http") == 4
    assert (
        call(server, "languages")[0]
        == call(server, "health")[0]
        == call(server, "frontend/settings")[0]
        == 200
    )


def test_settings_and_languages_describe_the_model(http):
    server = http(auth_token=TOKEN)
    assert call(server, "frontend/settings")[2] == {
        "apiKeys": True,
        "keyRequired": True,
        "charLimit": MAX_TEXT_CHARS,
        "filesTranslation": True,
        "supportedFilesFormat": [".po", ".pot", ".txt"],
        "maxAlternatives": 7,
        "frontendTimeout": 250,
        "suggestions": False,
        "language": {
            "source": {"code": "en", "name": "English"},
            "target": {"code": "es", "name": "Spanish"},
        },
    }
    assert call(server, "languages")[2] == [
        {"code": "en", "name": "English", "targets": ["es"]},
        {"code": "es", "name": "Spanish", "targets": []},
    ]
    settings = call(http(), "frontend/settings")[2]
    assert (settings["apiKeys"], settings["keyRequired"]) == (False, False)


def test_a_model_pair_without_a_display_name_shows_its_code(http):
    engine = FakeEngine(step_s=0)
    engine.source_language, engine.target_language = "en", "gl"
    server = http(engine)
    assert call(server, "languages")[2][1] == {"code": "gl", "name": "gl", "targets": []}
    assert call(server, "frontend/settings")[2]["language"]["target"] == {"code": "gl", "name": "gl"}
    assert call(server, "translate", {"q": "a b", "source": "en", "target": "gl"})[2] == {
        "translatedText": "b a"
    }


def test_while_the_model_loads_past_the_wait_bound_everything_answers_503(loading_http_server):
    """A model still loading when a request's wait bound ends: 503 (tests/test_http_waiting.py: one
    that loads within it is waited for)."""
    server, gate = loading_http_server(http_queue_wait_s=0.2)
    assert call(server, "health")[:3:2] == (503, {"status": "NOT_SERVING"})
    status, _, body = call(server, "translate", {"q": "a", "source": "en", "target": "es"})
    assert (status, body) == (503, {"error": "the model is loading; retry shortly"})
    assert call(server, "languages")[2][0]["code"] == "en"  # LibreTranslate's clients ask at start
    assert call(server, "frontend/settings")[2]["maxAlternatives"] == 0
    assert server.total("translator_requests_total", code="UNAVAILABLE", transport="http") == 1
    gate.set()
    server.wait_ready(30)
    assert call(server, "health")[:3:2] == (200, {"status": "SERVING"})


def test_while_the_models_load_languages_lists_the_pairs_their_manifests_declare(
    loading_http_server, tmp_path
):
    """Not the default pair alone: a client that asks at start (Weblate validating a target) gets
    the pairs the server is about to serve."""
    bundle = tmp_path / "two-pairs"
    bundle.mkdir()
    (bundle / "manifest.json").write_text('{"pairs": [["en", "es"], ["en", "pt_BR"]]}\n')
    server, gate = loading_http_server(bundle)
    assert call(server, "health")[:3:2] == (503, {"status": "NOT_SERVING"})
    loading = call(server, "languages")[2]
    assert loading[0] == {"code": "en", "name": "English", "targets": ["es", "pt-BR"]}, loading
    gate.set()
    server.wait_ready(30)
    assert call(server, "languages")[2] == loading


def test_engine_failure_is_500_and_queue_full_is_429_with_retry_after(http):
    engine = GatedEngine(step_s=0, fail_on="boom")
    # http_queue_wait_s=0: a full queue is a 429 at once (tests/test_http_waiting.py: the waiting).
    server = http(
        engine,
        batching_mode="request",
        max_wait_ms=0,
        max_queue_segments=40,
        max_texts=40,
        http_queue_wait_s=0,
    )
    status, _, body = call(server, "translate", {"q": "boom", "source": "en", "target": "es"})
    assert (status, body) == (500, {"error": "translation failed: fake engine failure on 'boom'"})
    assert server.total("translator_requests_total", code="INTERNAL", transport="http") == 1
    engine.gate.clear()
    results: list = []
    q = {"source": "en", "target": "es", "timeout_ms": 20_000}
    held = threading.Thread(target=lambda: results.append(call(server, "translate", {"q": "a", **q})))
    held.start()
    assert engine.waiting.wait(10)
    queued = threading.Thread(
        target=lambda: results.append(call(server, "translate", {"q": ["w"] * 30, **q}))
    )
    queued.start()
    end = time.monotonic() + 10
    while server.total("translator_queue_segments") < 30 and time.monotonic() < end:
        time.sleep(0.01)
    status, headers, body = call(server, "translate", {"q": ["x"] * 11, **q})
    # Nothing measured yet: 50 ms per queued segment, 1.5 s, rounded up to whole seconds.
    assert (status, headers["Retry-After"]) == (429, "2")
    assert body == {"error": "server busy: 30 segments queued (capacity 40); retry in about 1500 ms"}
    engine.gate.set()
    held.join(30)
    queued.join(30)
    assert sorted(r[0] for r in results) == [200, 200]
    assert server.total("translator_requests_total", code="RESOURCE_EXHAUSTED", transport="http") == 1


def test_timeout_ms_is_a_deadline(http):
    engine = GatedEngine(step_s=0)
    server = http(engine)
    engine.gate.clear()
    t0 = time.monotonic()
    timer = threading.Timer(1.0, engine.gate.set)  # the worker acts on the deadline at the next step
    timer.start()
    status, _, body = call(
        server, "translate", {"q": "a b", "source": "en", "target": "es", "timeout_ms": 150}
    )
    timer.cancel()
    engine.gate.set()
    assert (status, body) == (504, {"error": "deadline exceeded"}) and time.monotonic() - t0 < 0.9
    assert server.total("translator_requests_total", code="DEADLINE_EXCEEDED", transport="http") == 1


def test_routes_methods_and_body_size_errors_keep_the_json_shape(http):
    server = http(max_message_bytes=1000)
    assert call(server, "nowhere")[:3:2] == (404, {"error": "Not Found"})
    assert call(server, "translate")[:3:2] == (405, {"error": "Method Not Allowed"})
    status, _, body = call(server, "translate", {"q": "a" * 2000, "source": "en", "target": "es"})
    assert (status, body) == (413, {"error": "Request Entity Too Large"})
    page = call(server, "")
    assert page[0] == 200 and page[1]["Cache-Control"] == "no-cache" and "<html" in page[2].lower()


def test_translated_files_are_kept_for_download(http, monkeypatch):
    server = http()
    status, _, body = upload(server, "notes.txt", "Open the file\r\n\n  Save it  \n")
    assert (status, body["filled"], body["leftOut"]) == (200, 2, [])
    link = urllib.parse.urlparse(body["translatedFileUrl"])
    assert link.path.endswith("/notes.es.txt") and link.netloc == ""  # relative: never from the Host header
    status, headers, text = call(server, link.path.lstrip("/"))
    assert (status, text) == (200, "file the Open\r\n\n  it Save  \n")
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    disposition = "attachment; filename=\"notes.es.txt\"; filename*=UTF-8''notes.es.txt"
    assert headers["Content-Disposition"] == disposition
    assert server.total("translator_requests_total", rpc="TranslateFile", code="OK", transport="http") == 1
    assert call(server, "download_file/nope/notes.es.txt")[:3:2] == (
        404,
        {"error": "Invalid request: no such file (files are kept 15 minutes)"},
    )
    status, _, body = upload(server, "app.pot", 'msgid ""\nmsgstr ""\n\nmsgid "Open it"\nmsgstr ""\n')
    assert (status, body["filled"]) == (200, 1)
    status, headers, text = call(server, urllib.parse.urlparse(body["translatedFileUrl"]).path.lstrip("/"))
    assert (
        headers["Content-Type"] == "text/x-gettext-translation; charset=utf-8" and 'msgstr "it Open"' in text
    )
    # Files are kept for their time, never evicted by newer ones: a full store refuses the new file.
    store = server.server.http.files
    monkeypatch.setattr(store, "max_bytes", store.used + 2 * (1024 + 3) + 10)
    answers = [upload(server, f"f{i}.txt", "a b") for i in range(3)]
    assert [a[0] for a in answers] == [200, 200, 503]
    paths = [urllib.parse.urlparse(a[2]["translatedFileUrl"]).path for a in answers[:2]]
    assert [call(server, p.lstrip("/"))[0] for p in paths] == [200, 200]
    monkeypatch.setattr(store, "max_bytes", 1 << 30)
    monkeypatch.setattr(store, "ttl_s", -1.0)
    expired = urllib.parse.urlparse(upload(server, "late.txt", "a b")[2]["translatedFileUrl"]).path
    assert call(server, expired.lstrip("/"))[0] == 404


def test_a_file_upload_needs_a_file_and_a_known_format(http):
    server = http()
    status, _, body = call(server, "translate_file", {"source": "en", "target": "es"}, form=True)
    assert (status, body) == (
        400,
        {"error": "Invalid request: missing file parameter (a multipart file upload)"},
    )
    status, _, body = upload(server, "notes.md", "x")
    assert (status, body) == (400, {"error": "unsupported file format '.md': send one of .po, .pot, .txt"})
    status, _, body = upload(server, "notes.txt", "x", target="fr")
    assert (status, body["error"]) == (400, "fr is not supported as target: the model translates en -> es")
    assert server.total("translator_requests_total", rpc="TranslateFile", code="INVALID_ARGUMENT") == 3


def test_an_unexpected_error_is_500_and_logged_with_its_traceback(http, caplog):
    class Broken(FakeEngine):
        def prepare(self, texts, options, glossary=None, **kwargs):
            raise RuntimeError("prepare exploded")

    server = http(Broken(step_s=0))
    with caplog.at_level(logging.INFO, logger="server.requests"):
        status, _, body = call(server, "translate", {"q": "a", "source": "en", "target": "es"})
    assert (status, body) == (500, {"error": "internal error: prepare exploded"})
    (crash,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert crash.getMessage() == "unexpected error in HTTP Translate" and crash.exc_info
    (line,) = http_lines(caplog)
    assert (line["status"], line["http_status"], line["error"]) == (
        "INTERNAL",
        500,
        "internal error: prepare exploded",
    )
    assert server.total("translator_requests_total", code="INTERNAL", transport="http") == 1
    assert server.total("translator_requests_in_flight") == 0


def test_https_asks_for_a_client_certificate_when_a_client_ca_is_set(http, tmp_path):
    """TRANSLATOR_TLS_CLIENT_CA holds for the HTTP API as for gRPC: no certificate signed by it, no
    answer."""
    import ssl

    from tests.test_service import make_pki

    pki = make_pki(tmp_path)
    server = http(
        tls_cert=str(pki["server_pem"]),
        tls_key=str(pki["server_key"]),
        tls_client_ca=str(pki["ca_pem"]),
    )
    health = f"https://localhost:{server.server.http_port}/health"
    context = ssl.create_default_context(cafile=str(pki["ca_pem"]))
    with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
        urllib.request.urlopen(health, context=context, timeout=10).read()
    context.load_cert_chain(str(pki["client_pem"]), str(pki["client_key"]))
    with urllib.request.urlopen(health, context=context, timeout=10) as r:
        assert json.loads(r.read()) == {"status": "SERVING"}


def test_a_file_requests_log_line_counts_its_segments_and_tokens(http, caplog):
    """The file's texts go through several translate calls; the one log line sums their counters."""
    server = http()
    with caplog.at_level(logging.INFO, logger="server.requests"):
        status, _, body = upload(server, "notes.txt", "Open the file\n\nSave it now\n")
    assert (status, body["filled"]) == (200, 2)
    (line,) = http_lines(caplog)
    assert (line["rpc"], line["texts"], line["segments"]) == ("TranslateFile", 2, 2)
    assert (line["input_tokens"], line["output_tokens"]) == (6, 6)  # the fake engine: one token a word
    assert line["queue_ms"] >= 0 and line["decode_ms"] >= 0
