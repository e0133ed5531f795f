"""/translate_file over the fake engine (server/files.py): what a translator downloading the file gets.
Catalogs are checked by the real msgfmt -c (gettext); the fake "translates" by reversing words, which
is enough to break a c-format string on purpose."""

from __future__ import annotations

import urllib.parse

import polib
import pytest

from client.load import free_port
from tests.fake_engine import FakeEngine
from tests.http_helpers import call, upload

HEADER = 'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'


@pytest.fixture()
def http(start_fake_server):
    return lambda engine=None, **config: start_fake_server(engine, http_port=free_port(), **config)


def download(server, body: dict) -> str:
    status, _, text = call(server, urllib.parse.urlparse(body["translatedFileUrl"]).path.lstrip("/"))
    assert status == 200
    return text


def test_a_catalog_gets_only_entries_msgfmt_accepts(http):
    server = http()
    pot = HEADER + (
        '#, c-format\nmsgid "%d files in %s"\nmsgstr ""\n\n'  # reversed: "%s in files %d", rejected
        'msgid "Open the file"\nmsgstr ""\n\n'
        'msgid "one file"\nmsgid_plural "many files"\nmsgstr[0] ""\nmsgstr[1] ""\n\n'
        'msgid "Done"\nmsgstr "Hecho"\n'
    )
    status, _, body = upload(server, "app.pot", pot)
    assert (status, body["filled"]) == (200, 2)
    (left,) = body["leftOut"]
    assert left.startswith("'%d files in %s': machine translation left out: msgfmt -c: ")
    po = polib.pofile(download(server, body))
    entries = {e.msgid: e for e in po}
    assert entries["%d files in %s"].msgstr == "" and "fuzzy" not in entries["%d files in %s"].flags
    assert entries["%d files in %s"].tcomment.startswith("machine translation left out: msgfmt -c: ")
    assert (entries["Open the file"].msgstr, entries["Open the file"].flags) == ("file the Open", ["fuzzy"])
    assert entries["one file"].msgstr_plural == {0: "file one", 1: "files many"}
    assert entries["Done"].msgstr == "Hecho"  # an existing translation is kept
    md = po.metadata
    assert (md["Language"], md["X-Generator"]) == ("es", "translator HTTP API (/translate_file)")
    assert md["Plural-Forms"] == "nplurals=2; plural=(n != 1);"


def test_entries_the_service_refuses_are_left_out_and_the_rest_filled(http):
    """A text over the model's limit fails its request of texts; each text is then sent alone, so only
    the refused one stays untranslated. Files go through the scheduler in requests of max_texts."""
    engine = FakeEngine(step_s=0)
    server = http(engine, max_texts=4, batching=False)  # one engine batch per request
    long = " ".join(["word"] * 70)  # the fake's limit: 64 tokens
    msgids = [f"entry number {i}" for i in range(9)] + [long]
    pot = HEADER + "".join(f'msgid "{m}"\nmsgstr ""\n\n' for m in msgids)
    status, _, body = upload(server, "big.pot", pot)
    assert (status, body["filled"]) == (200, 9)
    assert body["leftOut"] == [f"{long!r}: machine translation left out: refused by the service (too long?)"]
    entries = {e.msgid: e.msgstr for e in polib.pofile(download(server, body))}
    assert [entries[m] for m in msgids[:9]] == [f"{i} number entry" for i in range(9)]
    assert entries[long] == ""
    # Requests of 4, 4 and 2 texts; the last one is refused (the long text) and sent again text by text.
    assert sorted(len(texts) for texts, _ in engine.batches) == [1, 4, 4]


def test_a_text_file_keeps_lines_the_service_refuses(http):
    server = http()
    long = " ".join(["w"] * 70)
    status, _, body = upload(server, "notes.txt", f"Open it\n{long}\n\nSave it\n")
    assert (status, body["filled"], body["leftOut"]) == (200, 2, [long[:80]])
    assert download(server, body) == f"it Open\n{long}\n\nit Save\n"


@pytest.mark.parametrize(
    ("name", "content", "status", "error"),
    [
        ("notes.txt", b"caf\xe9\n", 400, "notes.txt is not UTF-8 text"),
        ("app.po", b'msgid "a"\nmsgstr "b"\nfoo bar\n', 400, "not a readable gettext catalog"),
        ("boom.txt", b"boom\n", 500, "translation failed: fake engine failure on 'boom'"),
    ],
)
def test_files_that_cannot_be_translated(http, name, content, status, error):
    server = http(FakeEngine(step_s=0, fail_on="boom"))
    got, _, body = upload(server, name, content)
    assert got == status and error in body["error"]
    code = {400: "INVALID_ARGUMENT", 500: "INTERNAL"}[status]
    assert server.total("translator_requests_total", rpc="TranslateFile", code=code, transport="http") == 1
