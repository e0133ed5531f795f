"""Third-party LibreTranslate clients against a real server (the shipped model): libretranslatepy's
.detect() and .translate(source="auto"), deep-translator's LibreTranslator (which sends a whole .txt as one
text), the npm `libretranslate` package under node; and the two reports of issue 34 they exposed:
`format=html` with an attributed tag came back unchanged without a note, and a text of two lines got a
stray `¿` on the first."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error

import pytest

from client.load import free_port
from tests.http_helpers import call, url

libretranslatepy = pytest.importorskip("libretranslatepy")

FRENCH = "Impossible d'ouvrir le fichier : le disque est plein."
NPM_CLIENT = "libretranslate@1.0.1"


@pytest.fixture(scope="module")
def http_server(start_server, shipped_bundle):
    return start_server(shipped_bundle, http_port=free_port())


# ---- libretranslatepy ---------------------------------------------------------------------------------


def test_libretranslatepy_detect_and_auto(http_server):
    lt = libretranslatepy.LibreTranslateAPI(url(http_server))
    detected = lt.detect(FRENCH)
    assert detected[0]["language"] == "fr" and detected[0]["confidence"] > 90
    assert lt.detect("Do you want to save the changes before closing?")[0]["language"] == "en"
    assert lt.translate("Open the file", source="auto", target="es") == "Abrir el archivo"
    with pytest.raises(urllib.error.HTTPError) as e:
        lt.translate(FRENCH, source="auto", target="es")
    assert e.value.code == 400
    assert "French (fr," in json.loads(e.value.read())["error"]


# ---- deep-translator ----------------------------------------------------------------------------------


def test_deep_translator_text_file_and_auto(http_server, tmp_path):
    libre = pytest.importorskip("deep_translator").LibreTranslator
    # deep-translator insists on a key; the server has none and ignores it.
    translator = libre(source="en", target="es", api_key="unused", custom_url=url(http_server))
    assert translator.translate("Open the file") == "Abrir el archivo"
    # A .txt goes as one text: each line is translated as itself (no `¿` carried to the first line).
    path = tmp_path / "ui.txt"
    path.write_text("Open the file\nSave changes?\n", encoding="utf-8")
    first, second = translator.translate_file(str(path)).split("\n")
    # Debian's catalogs give both `¿Guardar los cambios?` and `¿Desea guardar los cambios?`; which one
    # comes is the model's, what this checks is that each line keeps its own `¿ ?`.
    assert first == "Abrir el archivo" and second.startswith("¿") and second.endswith("?")
    assert "guardar" in second.lower()
    # a batch comes back in order, one translation per text (Debian's catalogs say both Eliminar and Borrar)
    saved, deleted = translator.translate_batch(["Save", "Delete"])
    assert saved == "Guardar" and deleted in ("Eliminar", "Borrar")
    auto = libre(source="auto", target="es", api_key="unused", custom_url=url(http_server))
    assert auto.translate("Open the file") == "Abrir el archivo"


def test_two_lines_sent_whole_keep_each_lines_punctuation(http_server):
    for q in ("Open the file\nSave changes?", "Save changes?\nOpen the file"):
        status, _, body = call(http_server, "translate", {"q": q, "source": "en", "target": "es"})
        assert status == 200
        for source_line, line in zip(q.split("\n"), body["translatedText"].split("\n"), strict=True):
            assert line.startswith("¿") == source_line.endswith("?"), body


# ---- format=html ------------------------------------------------------------------------------------


def test_html_with_attributes_is_translated_or_noted(http_server):
    q = '<p class="green">Open the file</p>'
    body = call(http_server, "translate", {"q": q, "source": "en", "target": "es", "format": "html"})[2]
    assert body["translatedText"] == '<p class="green">Abrir el archivo</p>'
    # The model has no translation of "Hello!": whatever comes back, an unchanged text says so.
    q = '<p class="green">Hello!</p>'
    body = call(http_server, "translate", {"q": q, "source": "en", "target": "es", "format": "html"})[2]
    if body["translatedText"] == q:
        assert [n["action"] for n in body["notes"]] == ["passed_through"]
        assert "untranslated" in body["notes"][0]["reason"]
    assert body["translatedText"].startswith('<p class="green">') and body["translatedText"].endswith("</p>")


# ---- the npm client ----------------------------------------------------------------------------------

NODE_SCRIPT = """
const { translate } = require("libretranslate");
(async () => {
  const apiurl = process.argv[2];
  const out = {
    named: await translate({ query: "Open the file", source: "en", target: "es", apiurl }),
    auto: await translate({ query: "Save changes?", target: "es", apiurl }),
  };
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"""


@pytest.fixture(scope="module")
def npm_client(tmp_path_factory):
    """The npm package installed into a temporary folder (its own npm cache there too)."""
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("node and npm are not installed (make system-deps installs Debian's nodejs and npm)")
    root = tmp_path_factory.mktemp("npm-client")
    subprocess.run(
        [
            "npm",
            "install",
            "--no-audit",
            "--no-fund",
            "--ignore-scripts",
            "--cache",
            str(root / ".npm"),
            NPM_CLIENT,
        ],
        cwd=root,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (root / "client.js").write_text(NODE_SCRIPT)
    return root


def test_npm_libretranslate_client(http_server, npm_client):
    out = subprocess.run(
        ["node", "client.js", url(http_server).rstrip("/")],
        cwd=npm_client,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    # Its default source is auto: detected as English, and routed with it.
    assert json.loads(out.stdout) == {"named": "Abrir el archivo", "auto": "¿Guardar cambios?"}
