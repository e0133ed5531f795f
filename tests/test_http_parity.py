"""Issue 34's parity with LibreTranslate over the fake engine: CORS (--http-cors-origins), the text
layer's notes in /translate's JSON, /suggest as upstream answers it with suggestions off, and the
front-end settings upstream front ends read."""

from __future__ import annotations

from dataclasses import replace

import pytest

from client.load import free_port
from runtime.decoding import DecodingOptions
from server.config import load_config
from server.contract import Hypothesis, Prepared, SegmentNote
from server.http_limits import HttpLimits, parse_origins
from tests import test_http_fake, test_memory
from tests.fake_engine import FakeEngine
from tests.http_helpers import call

# The fixture of tests/test_http_fake.py: http(engine=None, **config) -> a fake-engine server with HTTP.
http = test_http_fake.http
TOKEN = "tok-parity"
Q = {"source": "en", "target": "es"}
PREFLIGHT = {"Origin": "https://app.example.org", "Access-Control-Request-Method": "POST"}


# ---- CORS -------------------------------------------------------------------------------------------


def test_cors_is_off_by_default(http):
    server = http()
    status, headers, _ = call(server, "translate", {"q": "a b", **Q}, headers={"Origin": "https://x.org"})
    assert status == 200 and "Access-Control-Allow-Origin" not in headers
    status, headers, _ = call(server, "translate", headers=PREFLIGHT, method="OPTIONS")
    assert status == 405 and "Access-Control-Allow-Origin" not in headers


def test_cors_any_origin_answers_preflights_before_authentication(http):
    server = http(http_cors_origins="*", auth_token=TOKEN)
    # A preflight carries no credentials: answered before the token is asked for, on any path.
    for path in ("translate", "translate_file", "languages"):
        status, headers, body = call(server, path, headers=PREFLIGHT, method="OPTIONS")
        assert (status, body) == (204, "")
        assert headers["Access-Control-Allow-Origin"] == "*"
        assert headers["Access-Control-Allow-Methods"] == "GET, POST"
        assert headers["Access-Control-Allow-Headers"] == "Content-Type, Authorization"
        assert headers["Access-Control-Max-Age"] == "3600"
    # Every answer to a browser can be read by it, errors too (a wrong key, a 429's Retry-After).
    origin = {"Origin": "https://anything.example"}
    status, headers, _ = call(server, "translate", {"q": "a", **Q}, headers=origin)
    assert status == 403 and headers["Access-Control-Allow-Origin"] == "*"
    assert headers["Access-Control-Expose-Headers"] == "Retry-After"
    auth = {**origin, "Authorization": f"Bearer {TOKEN}"}
    status, headers, body = call(server, "translate", {"q": "a b", **Q}, headers=auth)
    assert (status, body, headers["Access-Control-Allow-Origin"]) == (200, {"translatedText": "b a"}, "*")
    assert "Origin" not in headers.get("Vary", "")
    # No Origin (curl, Weblate): no CORS headers.
    assert "Access-Control-Allow-Origin" not in call(server, "languages")[1]


def test_cors_origin_list_echoes_allowed_origins_only(http):
    server = http(http_cors_origins="https://app.example.org, http://localhost:8080")
    for origin in ("https://app.example.org", "http://localhost:8080", "HTTPS://APP.example.org"):
        status, headers, _ = call(server, "translate", {"q": "a b", **Q}, headers={"Origin": origin})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == origin
        assert "Origin" in headers["Vary"]
        status, headers, _ = call(
            server, "translate", headers={**PREFLIGHT, "Origin": origin}, method="OPTIONS"
        )
        assert status == 204 and headers["Access-Control-Allow-Origin"] == origin
    for origin in ("https://evil.example", "https://app.example.org.evil.example", "null"):
        status, headers, _ = call(server, "translate", {"q": "a b", **Q}, headers={"Origin": origin})
        assert status == 200 and "Access-Control-Allow-Origin" not in headers
        assert "Origin" in headers["Vary"]  # caches keep answers to other origins apart
        status, headers, body = call(
            server, "translate", headers={**PREFLIGHT, "Origin": origin}, method="OPTIONS"
        )
        assert (status, body) == (403, {"error": "Origin not allowed"})
        assert "Access-Control-Allow-Origin" not in headers


def test_cors_origins_setting_is_validated_and_parsed():
    env = {"TRANSLATOR_HTTP_CORS_ORIGINS": " https://a.example , http://b.example:8080,"}
    config = load_config([], env)
    assert HttpLimits.from_config(config).cors_origins == ("https://a.example", "http://b.example:8080")
    assert load_config(["--http-cors-origins", "*"], {}).http_cors_origins == "*"
    assert parse_origins("") == () and parse_origins("*, https://a.example") == ("*",)
    for bad in (
        "https://a.example/",
        "a.example",
        "https://a.example/path",
        "ftp://a.example",
        "https://*.x",
    ):
        with pytest.raises(
            ValueError, match=r"http_cors_origins \(--http-cors-origins / TRANSLATOR_HTTP_CORS"
        ):
            load_config(["--http-cors-origins", bad], {})


# ---- notes --------------------------------------------------------------------------------------------


class NotingEngine(FakeEngine):
    """FakeEngine whose texts starting with "memo" carry a memory note and those with a "%" a repair
    note, as the text layer (server/engine/faithful.py) puts them on the best hypothesis."""

    def finish(self, prepared, results):
        out = super().finish(prepared, results)
        for text, hyps in zip(prepared.segments, out, strict=True):
            notes = []
            if text.startswith("memo"):
                notes.append(
                    SegmentNote("memory", 0, len(text), "translation memory: as 3 packages translate it")
                )
            if "%" in text:
                notes.append(SegmentNote("repaired", 0, len(text), "lost %s; used hypothesis 2"))
            if hyps and notes:
                hyps[0] = replace(hyps[0], notes=tuple(notes))
        return out


def test_translate_carries_the_texts_notes(http):
    server = http(NotingEngine(step_s=0))
    # No notes: exactly LibreTranslate's answer.
    assert call(server, "translate", {"q": "a b", **Q})[2] == {"translatedText": "b a"}
    memo = {
        "action": "memory",
        "start": 0,
        "end": 6,
        "reason": "translation memory: as 3 packages translate it",
    }
    assert call(server, "translate", {"q": "memo x", **Q})[2] == {"translatedText": "x memo", "notes": [memo]}
    body = call(server, "translate", {"q": ["a b", "memo x", "x %s"], **Q, "alternatives": 1})[2]
    assert body["notes"] == [
        [],
        [memo],
        [{"action": "repaired", "start": 0, "end": 4, "reason": "lost %s; used hypothesis 2"}],
    ]
    assert body["alternatives"] == [["b a (1)"], ["x memo (1)"], ["%s x (1)"]]


# ---- /suggest and /frontend/settings -----------------------------------------------------------------


def test_suggest_is_refused_as_upstream_does_with_suggestions_off(http):
    server = http(auth_token=TOKEN)
    for body in ({"q": "a", "s": "b", **Q}, b""):  # a POST with any body, or none
        status, _, answer = call(server, "suggest", body)
        assert (status, answer) == (403, {"error": "Suggestions are disabled on this server."})
    assert call(server, "suggest")[0] == 405  # GET: a POST route, as upstream's


def test_frontend_settings_name_the_timeout_and_no_suggestions(http):
    settings = call(http(), "frontend/settings")[2]
    assert (settings["frontendTimeout"], settings["suggestions"]) == (250, False)


# ---- alternatives for texts from the translation memory ------------------------------------------------

# The fixture of tests/test_memory.py: a text layer with a small memory.
layer = test_memory.layer
NBEST = DecodingOptions(beam_size=3, num_hypotheses=3)


def test_a_memory_text_gets_the_models_alternatives_when_n_best_is_asked(layer):
    first = layer.prepare(["Modem", "Copy %s to %s", "Copy the file"], NBEST)
    assert first.segments == ["Modem", "Copy %s to %s", "Copy the file"]  # the memory's texts too
    out = layer.finish(
        first,
        [
            [Hypothesis("Módem", -0.1, [1]), Hypothesis("Modelo", -0.4, [2]), Hypothesis("Modem", -0.9, [3])],
            # an alternative that loses a placeholder is no alternative
            [Hypothesis("Copiar %s a %s", -0.2, [4]), Hypothesis("Copiar %s", -0.3, [5])],
            [Hypothesis("Copiar el archivo", -0.5, [7])],
        ],
    )
    assert not isinstance(out, Prepared)
    # The memory's translation stays first, with its note; the model's (without it) follow.
    assert [h.text for h in out[0]] == ["Módem", "Modelo", "Modem"]
    assert [n.action for n in out[0][0].notes] == ["memory"]
    assert [h.text for h in out[1]] == ["Copiar %s en %s", "Copiar %s a %s"]
    # One-best: the memory's text never reaches the model.
    assert layer.prepare(["Modem", "Copy the file"], replace(NBEST, num_hypotheses=1)).segments == [
        "Copy the file"
    ]


def test_http_alternatives_for_a_text_from_the_memory(start_server, shipped_bundle):
    server = start_server(shipped_bundle, http_port=free_port())
    body = call(server, "translate", {"q": "Save", **Q, "alternatives": 2})[2]
    assert body["translatedText"] == "Guardar" and body["notes"][0]["action"] == "memory"
    assert body["alternatives"] and "Guardar" not in body["alternatives"]
