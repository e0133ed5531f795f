"""/translate_file for every served pair (issue 31): a file is routed like /translate, and a catalog
filled for a target language gets that language's Language and Plural-Forms (runtime/languages.py), still
clean for the real `msgfmt -c`. The store is tests/test_routing.py's: copies of the tiny random bundle
whose manifests name other pairs."""

from __future__ import annotations

import logging
import subprocess
import urllib.parse
from pathlib import Path

import polib
import pytest

from client.load import free_port
from runtime.languages import target_language
from runtime.po_catalog import plural_header
from tests.http_helpers import call, upload
from tests.test_routing import MODELS, SERVED, make_store, models_of

CATALOG = (
    'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n'
    '"Language: fr\\n"\n"Plural-Forms: nplurals=2; plural=(n > 1);\\n"\n\n'
    'msgid "Open the file"\nmsgstr ""\n\n'
    'msgid "one file"\nmsgid_plural "%d files"\nmsgstr[0] ""\nmsgstr[1] ""\n\n'
    'msgid "Done"\nmsgstr "Fait"\n'
)


@pytest.fixture(scope="module")
def files_server(tiny_bundle, tmp_path_factory, start_server):
    store = make_store(tiny_bundle, tmp_path_factory.mktemp("store"), MODELS)
    server = start_server(store, threads=1, http_port=free_port(), warmup=False)
    yield server
    server.stop(1)


def downloaded(server, body: dict) -> str:
    status, _, text = call(server, urllib.parse.urlparse(body["translatedFileUrl"]).path.lstrip("/"))
    assert status == 200, text
    return text


@pytest.mark.parametrize(
    ("target", "model", "code"), [("de", "tiny-en-de", "de"), ("pt", "tiny-en-pt", "pt_BR")]
)
def test_a_catalog_gets_each_targets_header_and_passes_msgfmt(
    files_server, caplog, tmp_path: Path, target: str, model: str, code: str
):
    caplog.set_level(logging.INFO, logger="server.requests")
    status, _, body = upload(files_server, "app.po", CATALOG, target=target)
    assert status == 200, body
    assert models_of(caplog, "TranslateFile") == [model]
    text = downloaded(files_server, body)
    language = target_language(code)
    md = polib.pofile(text).metadata
    # The catalog named another language (fr): it is headed for the target, with the target's rule.
    assert md["Language"] == language.gettext_language
    assert md["Plural-Forms"] == plural_header(language.plural_forms)
    (tmp_path / "out.po").write_text(text, encoding="utf-8")
    check = subprocess.run(
        ["msgfmt", "-c", "--use-fuzzy", "-o", "/dev/null", str(tmp_path / "out.po")], capture_output=True
    )
    assert check.returncode == 0, check.stderr.decode()


def test_a_text_file_is_named_for_its_target(files_server):
    status, _, body = upload(files_server, "notes.txt", "Open the file\n", target="pt-BR")
    assert status == 200, body
    assert body["translatedFileUrl"].endswith("/notes.pt-BR.txt")


def test_an_unsupported_target_names_the_served_pairs(files_server):
    status, _, body = upload(files_server, "app.po", CATALOG, target="fr")
    assert (status, body["error"]) == (400, f"fr is not supported as target: the models translate {SERVED}")


def test_a_catalogs_own_plural_forms_are_bounded_or_replaced(files_server):
    """A catalog already of the target keeps its own rule, bounded as runtime/po_catalog.py bounds any
    (a number of forms no language has is a 400); another language's rule is replaced by the target's."""
    huge = CATALOG.replace("nplurals=2; plural=(n > 1);", "nplurals=20000; plural=n;")
    german = huge.replace("Language: fr", "Language: de")
    status, _, body = upload(files_server, "app.po", german, target="de")
    assert status == 400 and "nplurals=20000: German has 2 plural forms" in body["error"], body
    status, _, body = upload(files_server, "app.po", huge, target="de")
    assert status == 200, body
    md = polib.pofile(downloaded(files_server, body)).metadata
    assert (md["Language"], md["Plural-Forms"]) == ("de", "nplurals=2; plural=(n != 1);")
