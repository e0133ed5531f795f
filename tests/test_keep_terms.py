"""The do-not-translate list (model/keep_terms.py): selection rules on a synthetic corpus, the shipped
models/en-es-small/keep_terms.txt, and its copy into an exported bundle."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from model import keep_terms as kt
from runtime.splits import escape_line
from tests.conftest import REPO_ROOT, make_tiny_checkpoint

SHIPPED = REPO_ROOT / "models" / "en-es-small" / kt.KEEP_TERMS_FILE

# Pairs as the corpus would have them; each line is one (English, Spanish) pair.
CORPUS = [
    # A program name copied in every pair: kept.
    *[(f"Open the file with Frobnicator {i}.", f"Abra el archivo con Frobnicator {i}.") for i in range(4)],
    # A lowercase program name, always copied: kept.
    *[(f"Run frobctl to reset the device {i}.", f"Ejecute frobctl para restablecer el dispositivo {i}.")
      for i in range(4)],  # fmt: skip
    # Copied in only two pairs: below --min-count 3.
    ("Zyxware is ready.", "Zyxware está listo."),
    ("Restart Zyxware now.", "Reinicie Zyxware ahora."),
    # A word the translations translate: no candidate.
    *[(f"Widget {i} is broken.", f"El componente {i} está roto.") for i in range(4)],
    # Copied when capitalised, but "gleam" is an English word that is translated (rule 4a).
    *[(f"GLEAM mode {i}", f"Modo GLEAM {i}") for i in range(3)],
    *[(f"The colours gleam {i}.", f"Los colores brillan {i}.") for i in range(3)],
    # "Zental" is copied, but both languages use "zental" as an ordinary word (rule 4b).
    *[(f"Zental {i}", f"Zental {i}") for i in range(1)],
    *[(f"Zental view {i}", f"Vista Zental {i}") for i in range(3)],
    *[(f"a zental thing {i}", f"una cosa zental {i}") for i in range(3)],
    *[(f"a round thing {i}", f"una cosa zental y redonda {i}") for i in range(3)],
    # A lowercase term whose inflection is translated (rule 4c): "hook" -> "gancho".
    *[(f"Run the hooks {i}.", f"Ejecute los hooks {i}.") for i in range(3)],
    *[(f"Add a hook {i}.", f"Añada un gancho {i}.") for i in range(3)],
    # A word Spanish writes the same (rule 4d): copied but never listed.
    *[(f"Normal size {i}", f"Tamaño Normal {i}") for i in range(4)],
    # Placeholders, markup, URLs, paths, options, numbers and single letters give no term.
    *[(f"Saved %s in {{0}} <b>X</b> http://example.org/Foo /usr/bin/bar --baz 2.0 {i}",
       f"Guardado %s en {{0}} <b>X</b> http://example.org/Foo /usr/bin/bar --baz 2.0 {i}") for i in range(4)],
]  # fmt: skip


def write_corpus(data: Path, pairs: list[tuple[str, str]]) -> Path:
    data.mkdir(parents=True, exist_ok=True)
    (data / "train.en").write_text("".join(escape_line(en) + "\n" for en, _ in pairs), encoding="utf-8")
    (data / "train.es").write_text("".join(escape_line(es) + "\n" for _, es in pairs), encoding="utf-8")
    return data


@pytest.fixture(scope="module")
def stats() -> dict[str, kt.TermStats]:
    return kt.collect(CORPUS)


def kept_terms(stats: dict[str, kt.TermStats], **kwargs) -> set[str]:
    return {s.term for s in kt.select(stats, **kwargs)[0]}


def test_source_terms_are_clean_whole_words():
    text = (
        "Open «Firefox», GNOME's panel (GTK+), x86_64 and C++ via /usr/bin/grep --help f(x) %s {0} <b>KDE</b>"
    )
    assert kt.source_terms(text) == {
        "Open", "Firefox", "GNOME", "panel", "GTK+", "x86_64", "and", "C++", "via", "KDE",
    }  # fmt: skip
    assert "Firefox" in kt.target_tokens("Use Firefox/Thunderbird")


def test_copied_name_is_kept(stats):
    kept = kept_terms(stats)
    assert {"Frobnicator", "frobctl"} <= kept
    assert stats["Frobnicator"].count == stats["Frobnicator"].copied == 4


def test_translated_word_is_not_kept(stats):
    assert stats["Widget"].copy_share == 0
    assert "Widget" not in kept_terms(stats)


def test_english_word_translated_in_lowercase_is_rejected(stats):
    assert stats["GLEAM"].copy_share == 1
    kept, words = kt.select(stats)
    assert "GLEAM" not in {s.term for s in kept}
    assert "English word" in dict((s.term, why) for s, why in words)["GLEAM"]


def test_word_shared_by_both_languages_is_rejected(stats):
    assert stats["Zental"].copy_share == 1
    reason = kt.word_reason(stats["Zental"])
    assert reason is not None and "both languages" in reason
    assert "zental" not in kept_terms(stats)


def test_lowercase_term_with_translated_inflection_is_rejected(stats):
    assert stats["hooks"].copy_share == 1
    assert "'hook' is translated" in kt.word_reason(stats["hooks"])


def test_stop_words_are_never_kept(stats):
    assert stats["Normal"].copy_share == 1
    assert kt.word_reason(stats["Normal"]) == "stop word"
    assert "Normal" not in kept_terms(stats)


def test_a_lowercase_word_of_the_target_language_is_rejected_with_its_lexicon(stats, tmp_path):
    """Rule 4e: `frobctl` is kept until the target language's lexicon knows it as a word; then it is one
    (French copies `invasion` because French writes it so, not because it is a name)."""
    from runtime.faithful.lexicon import read_lexicon, write_lexicon

    path = tmp_path / "lexicon.txt.gz"
    write_lexicon(path, {"frobctl", "frobnicator", "casa"}, set(), {"command": "test"})
    lexicon = read_lexicon(path)
    assert kt.word_reason(stats["frobctl"]) is None
    assert kt.word_reason(stats["frobctl"], lexicon) == "lowercase, a word of the target language"
    # Only plain lowercase words: a capitalised program name the lexicon lists in lowercase stays kept.
    assert kt.word_reason(stats["Frobnicator"], lexicon) is None
    kept, _ = kt.select(stats, lexicon=lexicon)
    assert [s.term for s in kept] == ["Frobnicator"]


def test_placeholders_numbers_paths_and_short_tokens_give_no_term(stats):
    kept = kept_terms(stats)
    for noise in ("s", "0", "b", "X", "Foo", "example", "usr", "bin", "bar", "baz", "2.0", "http"):
        assert noise not in kept
    assert not kt.shape_ok("2.0") and not kt.shape_ok("X") and not kt.shape_ok("a54da2a0e231")
    assert not kt.shape_ok("file.html") and kt.shape_ok("Qt5") and kt.shape_ok("GTK+")


def test_min_count_and_min_copy(stats):
    assert stats["Zyxware"].count == 2
    assert "Zyxware" not in kept_terms(stats)
    assert "Zyxware" in kept_terms(stats, min_count=2)
    assert "Frobnicator" not in kept_terms(stats, min_count=5)


def test_cli_writes_a_readable_sorted_file(tmp_path, capsys):
    data = write_corpus(tmp_path / "data", CORPUS)
    out = tmp_path / "model" / "keep_terms.txt"
    kt.main(["--data", str(data), "--out", str(out)])
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# terms copied unchanged by the human translations; regenerate with: ")
    terms = kt.read_keep_terms(out)
    assert set(terms) == {"Frobnicator", "frobctl"}
    assert "Zyxware" not in terms and "GLEAM" not in terms and "Normal" not in terms
    rows = [line.split("\t") for line in lines if line and not line.startswith("#")]
    assert all(len(r) == 3 and int(r[1]) >= int(r[2]) for r in rows)
    assert [int(r[1]) for r in rows] == sorted((int(r[1]) for r in rows), reverse=True)
    assert "kept 2" in capsys.readouterr().out


def test_reader_skips_comments_and_blank_lines(tmp_path):
    path = tmp_path / "k.txt"
    path.write_text("# header\n\nGNOME\t10\t9\n  \nsystemd\n# more\nGTK+\t3\t3\n", encoding="utf-8")
    assert kt.read_keep_terms(path) == ["GNOME", "systemd", "GTK+"]


# ---- the shipped list ----------------------------------------------------------------------------------

ORDINARY_WORDS = [
    "no", "error", "Error", "ERROR", "normal", "Normal", "general", "total", "local", "manual", "color",
    "Color", "video", "radio", "control", "Control", "the", "The", "with", "WITH", "SELECT", "Open", "File",
    "Save", "cursor", "terminal", "base", "Writer", "HEAD", "Oh",
]  # fmt: skip


@pytest.mark.skipif(not SHIPPED.is_file(), reason=f"{SHIPPED} not generated (make keep-terms)")
def test_shipped_list_parses_and_is_clean():
    lines = SHIPPED.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# terms copied unchanged by the human translations; regenerate with:")
    terms = kt.read_keep_terms(SHIPPED)
    assert len(terms) > 1000 and len(set(terms)) == len(terms)
    for name in ("LibreOffice", "GNOME", "KDE", "GIMP", "Firefox", "Inkscape", "GTK+", "C++", "systemd",
                 "pngquant", "x86_64", "PostgreSQL"):  # fmt: skip
        assert name in terms, name
    assert terms[0] == "LibreOffice"  # the most frequent
    for word in ORDINARY_WORDS:
        assert word not in terms, word
    for term in terms:
        assert len(term) >= 2 and not any(c.isspace() for c in term) and any(c.isalpha() for c in term), term
        assert kt.shape_ok(term) and term.lower() not in kt.STOP_WORDS, term


# ---- export -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_list", [True, False])
def test_export_copies_the_list_into_the_bundle(tmp_path, monkeypatch, with_list):
    """export_bundle copies the checkpoint's keep_terms.txt, checksums it and names it in the manifest
    (the ONNX graphs are stubbed out: only the bundle's files and manifest are under test)."""
    from export import build
    from runtime.bundle import TOKENIZER, load_manifest

    checkpoint = make_tiny_checkpoint(tmp_path / "tiny")
    if with_list:
        (checkpoint / "keep_terms.txt").write_text("# list\nGNOME\t5\t5\nKDE\t3\t3\n", encoding="utf-8")

    def fake_build(model, tokenizer, checkpoint, stage, *args):
        shutil.copyfile(checkpoint / "tokenizer.model", stage / TOKENIZER)
        return {"variants": {}, "graphs": {}, "parity": {}}

    monkeypatch.setattr(build, "_build", fake_build)
    bundle = tmp_path / "bundle"
    build.export_bundle(checkpoint, bundle, variants=("fp32",))
    manifest = load_manifest(bundle)  # verifies the sha256 of every listed file
    on_disk = json.loads((bundle / "manifest.json").read_text())
    assert manifest == on_disk
    if with_list:
        assert manifest["keep_terms"] == "keep_terms.txt" and "keep_terms.txt" in manifest["files"]
        assert kt.read_keep_terms(bundle / manifest["keep_terms"]) == ["GNOME", "KDE"]
    else:
        assert "keep_terms" not in manifest and not (bundle / "keep_terms.txt").exists()


@pytest.mark.parametrize(
    "model", sorted(p.parent.name for p in (REPO_ROOT / "models").glob(f"*/{kt.KEEP_TERMS_FILE}"))
)
def test_no_shipped_list_keeps_a_plain_word_of_its_language(model):
    """Rule 4e on every shipped model with a lexicon (the French list held invasion, religion, quotient)."""
    from runtime.faithful.lexicon import LEXICON_FILE, read_lexicon

    directory = REPO_ROOT / "models" / model
    if not (directory / LEXICON_FILE).is_file():
        pytest.skip(f"{model} has no lexicon")
    lexicon = read_lexicon(directory / LEXICON_FILE)
    terms = kt.read_keep_terms(directory / kt.KEEP_TERMS_FILE)
    words = [t for t in terms if t.islower() and t.isalpha() and t in lexicon]
    assert not words, words[:20]
