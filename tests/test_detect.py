"""Language identification (server/detect.py) and what the HTTP API does with it: POST /detect as
LibreTranslate answers it, and `source=auto` on /translate and /translate_file routing with the detected
language or refusing a text in a language the server does not translate from. The identifier is the real
one (py3langid's model from its wheel); the servers run the fake engine (tests/fake_engine.py reverses
words), so these take milliseconds; tests/test_http_clients.py drives the real model with real clients."""

from __future__ import annotations

import pytest

from client.load import free_port
from runtime.faithful.segment import MAX_TEXT_CHARS
from server.detect import (
    CANDIDATES,
    DETECT_CHARS,
    RANKED,
    SURE,
    Guess,
    LanguageIdentifier,
    SourceRefused,
    auto_source,
    choose_source,
    joined_sample,
)
from tests.conftest import RunningServer
from tests.http_helpers import call, upload

TOKEN = "detect-token"
FRENCH = "Impossible d'ouvrir le fichier : le disque est plein."
GERMAN = "Die Datei konnte nicht geöffnet werden, weil der Datenträger voll ist."
ENGLISH = "The file could not be opened because the disk is full."


@pytest.fixture(scope="module")
def identifier() -> LanguageIdentifier:
    ident = LanguageIdentifier()
    yield ident
    ident.close()


@pytest.fixture()
def http(start_fake_server):
    def start(**overrides) -> RunningServer:
        return start_fake_server(None, http_port=free_port(), **overrides)

    return start


# ---- the identifier and the rule ---------------------------------------------------------------------


def test_identifier_names_whole_sentences(identifier):
    for text, lang in (
        (FRENCH, "fr"),
        (GERMAN, "de"),
        (ENGLISH, "en"),
        ("Guardar los cambios antes de salir", "es"),
    ):
        ranked = identifier.rank(text)
        assert ranked[0].language == lang, (text, ranked[:3])
        assert ranked[0].confidence > 90
        assert [g.language for g in ranked] == sorted(
            {g.language for g in ranked}, key=[g.language for g in ranked].index
        )
        assert {g.language for g in ranked} == set(CANDIDATES)
        assert abs(sum(g.confidence for g in ranked) - 100) < 1


def test_identifier_reads_a_bounded_prefix(identifier):
    # Past DETECT_CHARS the text is not read: French after English padding does not change the answer.
    padded = ("x " * DETECT_CHARS) + FRENCH * 50
    english = identifier.rank(ENGLISH + " " + padded)
    assert english == identifier.rank((ENGLISH + " " + padded)[:DETECT_CHARS])


def test_choose_source_routes_refuses_or_falls_back():
    served = ["en"]
    assert choose_source([Guess("en", 80.0), Guess("fr", 10.0)], served).source == "en"
    refused = choose_source([Guess("fr", 97.0), Guess("en", 2.0)], served)
    assert refused.source is None and refused.detected == Guess("fr", 97.0)
    # Too unsure to refuse: the served source, with the identifier's confidence in it.
    unsure = choose_source([Guess("br", SURE - 1), Guess("en", 3.0)], served)
    assert unsure.source == "en" and unsure.detected == Guess("en", 3.0)
    # A bare code names the one served variety (pt -> pt_BR), reported in BCP-47.
    pt = choose_source([Guess("pt", 90.0)], ["en", "pt_BR"])
    assert pt.source == "pt_BR" and pt.detected == Guess("pt-BR", 90.0)


def test_auto_source_names_the_text_and_the_served_pairs():
    en, fr = [Guess("en", 90.0)], [Guess("fr", 99.0)]
    assert auto_source([en, en], ["en"], "en -> es") == ("en", [Guess("en", 90.0)] * 2)
    with pytest.raises(SourceRefused, match=r"q\[1\] is French \(fr, 99% sure\).*en -> es"):
        auto_source([en, fr], ["en"], "en -> es")
    with pytest.raises(SourceRefused, match="several languages"):
        auto_source([en, fr], ["en", "fr"], "en -> es, fr -> es")
    assert auto_source([], ["en"], "en -> es") == ("en", [])


def test_joined_sample_is_bounded():
    texts = ["Open the file"] * 10_000
    assert len(joined_sample(texts)) < DETECT_CHARS + len(texts[0]) + 1
    assert joined_sample(["a", "b"]) == "a\nb"


# ---- POST /detect ------------------------------------------------------------------------------------


def test_detect_answers_as_libretranslate(http):
    server = http()
    status, _, body = call(server, "detect", {"q": FRENCH})
    assert status == 200 and len(body) == RANKED
    assert body[0]["language"] == "fr" and 90 < body[0]["confidence"] <= 100
    assert [set(item) for item in body] == [{"confidence", "language"}] * RANKED
    # A form, as libretranslatepy sends it; a list q gets a list per text.
    assert call(server, "detect", {"q": GERMAN}, form=True)[2][0]["language"] == "de"
    status, _, body = call(server, "detect", {"q": [ENGLISH, FRENCH]})
    assert status == 200 and [b[0]["language"] for b in body] == ["en", "fr"]
    assert server.total("translator_requests_total", rpc="Detect", code="OK", transport="http") == 3


def test_detect_bad_input_is_a_400_with_the_translate_limits(http):
    server = http(max_texts=4)
    for body, message in (
        ({}, "Invalid request: missing q parameter"),
        ({"q": ""}, "Invalid request: missing q parameter"),
        ({"q": []}, "Invalid request: missing q parameter"),
        ({"q": 5}, "Invalid request: q must be a string or a list of strings"),
        ({"q": ["a", {"b": 1}]}, "Invalid request: q must be a string or a list of strings"),
    ):
        assert call(server, "detect", body)[:3:2] == (400, {"error": message}), body
    status, _, body = call(server, "detect", {"q": ["x"] * 5})
    assert status == 400 and "too many texts: 5 in one request, the limit is 4" in body["error"]
    status, _, body = call(server, "detect", {"q": ["ok", "x" * (MAX_TEXT_CHARS + 1)]})
    assert status == 400 and f"texts[1] has {MAX_TEXT_CHARS + 1} characters" in body["error"]


def test_detect_api_key_as_translate(http):
    server = http(auth_token=TOKEN)
    assert call(server, "detect", {"q": ENGLISH})[:3:2] == (403, {"error": "Invalid API key"})
    assert call(server, "detect", {"q": ENGLISH, "api_key": "wrong"})[0] == 403
    assert call(server, "detect", {"q": ENGLISH, "api_key": TOKEN})[0] == 200
    assert call(server, f"detect?api_key={TOKEN}", {"q": ENGLISH}, form=True)[0] == 200
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert call(server, "detect", {"q": ENGLISH}, headers=headers)[2][0]["language"] == "en"


def test_detect_answers_while_the_model_loads(loading_http_server):
    """/detect needs no model: it answers while one loads (health 503)."""
    server, _ = loading_http_server()
    assert call(server, "health")[0] == 503
    assert call(server, "detect", {"q": FRENCH})[2][0]["language"] == "fr"


# ---- source=auto -------------------------------------------------------------------------------------


def test_auto_routes_english_and_reports_what_was_detected(http):
    server = http()
    status, _, body = call(server, "translate", {"q": ENGLISH, "source": "auto", "target": "es"})
    assert status == 200 and body["translatedText"] == " ".join(reversed(ENGLISH.split()))
    assert body["detectedLanguage"]["language"] == "en" and body["detectedLanguage"]["confidence"] > 90
    # A one-word UI string is no language to the identifier: routed with the served source, and the
    # confidence says how unsure it was.
    status, _, body = call(server, "translate", {"q": ["Save", ENGLISH], "source": "auto", "target": "es"})
    assert status == 200 and [d["language"] for d in body["detectedLanguage"]] == ["en", "en"]
    assert body["detectedLanguage"][0]["confidence"] < body["detectedLanguage"][1]["confidence"]


def test_auto_refuses_a_language_the_server_does_not_translate(http):
    server = http()
    status, _, body = call(server, "translate", {"q": FRENCH, "source": "auto", "target": "es"})
    assert status == 400
    assert body["error"].startswith("source=auto: the text is French (fr, ")
    assert "en -> es" in body["error"]
    status, _, body = call(server, "translate", {"q": [ENGLISH, GERMAN], "source": "auto", "target": "es"})
    assert status == 400 and "q[1] is German (de, " in body["error"]
    # The target is still checked first, naming the served pairs.
    status, _, body = call(server, "translate", {"q": ENGLISH, "source": "auto", "target": "fr"})
    assert (status, body["error"]) == (400, "fr is not supported as target: the server translates en -> es")
    assert server.engine.batches == []  # nothing refused was translated


def test_auto_on_translate_file(http):
    server = http()
    status, _, body = upload(server, "notes.txt", f"{ENGLISH}\n\nOpen the file\n", source="auto")
    assert status == 200 and body["filled"] == 2
    assert body["detectedLanguage"]["language"] == "en"
    status, _, body = upload(server, "notes.txt", f"{FRENCH}\nEnregistrer les modifications\n", source="auto")
    assert status == 400 and body["error"].startswith("source=auto: the text is French (fr, ")
    # An empty file has nothing to detect: the served source.
    assert upload(server, "empty.txt", "", source="auto")[0] == 200
