"""GET /spec (server/openapi.py): a valid OpenAPI 3 document (openapi-spec-validator) that covers every
route the HTTP API serves and states the limits the server runs with."""

from __future__ import annotations

import pytest

from client.load import free_port
from runtime.faithful.segment import MAX_TEXT_CHARS
from server.detect import RANKED
from server.files import SUFFIXES
from tests.http_helpers import call

openapi_spec_validator = pytest.importorskip("openapi_spec_validator")


@pytest.fixture()
def http(start_fake_server):
    def start(**overrides):
        return start_fake_server(None, http_port=free_port(), **overrides)

    return start


def test_spec_is_valid_openapi_3_with_a_title(http):
    server = http()
    status, headers, spec = call(server, "spec")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    openapi_spec_validator.validate(spec)  # raises on an invalid document
    assert spec["openapi"].startswith("3.")
    assert spec["info"]["title"]  # what Dialect checks before it adds a server


def test_spec_covers_every_route(http):
    server = http()
    spec = call(server, "spec")[2]
    served = {
        (route.method.lower(), route.resource.canonical)
        for route in server.server.http.app.router.routes()
        if route.method not in ("HEAD", "OPTIONS")
    }
    documented = {(method, path) for path, ops in spec["paths"].items() for method in ops}
    assert served == documented


def test_spec_states_the_limits_the_server_runs_with(http):
    server = http(max_texts=7, max_message_bytes=123_456)
    spec = call(server, "spec")[2]
    schemas = spec["components"]["schemas"]
    q = schemas["TranslateRequest"]["properties"]["q"]["oneOf"]
    assert q[0]["maxLength"] == MAX_TEXT_CHARS == call(server, "frontend/settings")[2]["charLimit"]
    assert q[1]["maxItems"] == 7
    assert "123456 bytes" in spec["info"]["description"]
    settings = call(server, "frontend/settings")[2]
    alternatives = schemas["TranslateRequest"]["properties"]["alternatives"]
    assert alternatives["maximum"] == settings["maxAlternatives"]
    assert all(s in schemas["FileRequest"]["properties"]["file"]["description"] for s in SUFFIXES)
    assert str(RANKED) in schemas["Detections"]["description"]
    assert "security" not in spec["paths"]["/translate"]["post"]


def test_spec_says_when_a_key_is_required(http):
    server = http(auth_token="k")
    spec = call(server, "spec")[2]  # the document itself needs no key, as in LibreTranslate
    openapi_spec_validator.validate(spec)
    for path in ("/translate", "/detect", "/translate_file"):
        assert spec["paths"][path]["post"]["security"] == [{"bearer": []}, {"apiKeyQuery": []}]
    assert "security" not in spec["paths"]["/languages"]["get"]
