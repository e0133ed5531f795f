"""`python -m client po`: gettext catalogs filled by a real server with the shipped model, every output
checked with the real `msgfmt -c`: a real held-out catalog (krdc, KDE) and a hand-written one with every
kind of entry; fuzzy marks, plurals, contexts, accelerators, placeholders, untouched translations,
interrupt and resume (texts sent counted with a wrapper of TranslatorClient.translate_stream),
stdin/stdout, directories, exit codes. Plus the accelerator rules and the line map, without a server."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import polib
import pytest

from client import po as po_cli
from client.core import SegmentNote, TranslatorClient
from runtime.po_catalog import has_translation, render
from runtime.po_text import candidates, catalog_markers, gettext_count, place_accelerator, strip_accelerator
from tests.conftest import REPO_ROOT, free_port

DATA = REPO_ROOT / "tests" / "data" / "po"
APP = DATA / "app.po"
KRDC_POT = DATA / "real" / "krdc.pot"
KRDC_REF = DATA / "real" / "krdc.es.po"
CREDITS = {"translator-credits", "Your names", "Your emails"}
# Placeholders, tags, entities and URLs that must come back exactly once.
KEPT = re.compile(
    r"%\(\w+\)[sd]|%\d\$s|%'?\d*(?:\.\d+)?[sdf]|%%|%\d|\{\w+\}|\$\w+|</?\w+>|&\w+;|https?://\S+[\w/]"
)
needs_msgfmt = pytest.mark.skipif(shutil.which("msgfmt") is None, reason="msgfmt (GNU gettext) not installed")


def key(e: polib.POEntry) -> tuple[str | None, str]:
    return e.msgctxt, e.msgid


def pairs(e: polib.POEntry) -> list[tuple[str, str]]:
    if e.msgid_plural:
        return [(e.msgid, e.msgstr_plural[0]), (e.msgid_plural, e.msgstr_plural[1])]
    return [(e.msgid, e.msgstr)]


def msgfmt(path: Path, accel: str) -> tuple[int, str]:
    cmd = ["msgfmt", "-c", "--use-fuzzy", f"--check-accelerators={accel}", "-o", os.devnull, str(path)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stderr


def run_po(capsys, server, *args, stdin: str | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    capsys.readouterr()
    rc = po_cli.main([*map(str, args), "--target", server.target, "--beam-size", "1", "--no-progress"])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture()
def sent(monkeypatch) -> list[str]:
    """Every text sent over TranslateStream by the tests that use it."""
    texts: list[str] = []
    real = TranslatorClient.translate_stream

    def spy(self, items, timeout=None):
        def record():
            for item in items:
                texts.extend(item.texts)
                yield item

        return real(self, record(), timeout)

    monkeypatch.setattr(TranslatorClient, "translate_stream", spy)
    return texts


def template_of(po_path: Path, out: Path) -> Path:
    """A .pot of a .po: translations blanked, no obsolete entries, a template's header."""
    po = polib.pofile(str(po_path))
    pot = polib.POFile(wrapwidth=78)
    pot.metadata = dict(po.metadata) | {"Language": "", "Content-Type": "text/plain; charset=CHARSET"}
    for e in po:
        if not e.obsolete:
            e.msgstr = ""
            e.msgstr_plural = {0: "", 1: ""} if e.msgid_plural else {}
            e.flags = [f for f in e.flags if f != "fuzzy"]
            e.previous_msgid = None
            pot.append(e)
    pot.save(str(out))
    return out


# ---- a real held-out catalog ----------------------------------------------------------------------


@needs_msgfmt
def test_real_catalog_is_filled_clean_and_faithful(shipped_server, tmp_path, capsys, sent):
    out = tmp_path / "krdc.po"
    rc, _, err = run_po(capsys, shipped_server, KRDC_POT, "-o", out)
    assert rc == 0, err
    assert msgfmt(out, "&") == (0, "")
    po = polib.pofile(str(out))
    assert po.metadata["Language"] == "es"
    assert po.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"
    assert po.metadata["Content-Type"] == "text/plain; charset=UTF-8"
    entries = [e for e in po if not e.obsolete and e.msgid not in CREDITS]
    filled = [e for e in entries if all(t for _, t in pairs(e))]
    assert len(filled) >= 0.95 * len(entries), err
    assert all(e.fuzzy for e in filled)
    for e in filled:
        for source, target in pairs(e):
            assert Counter(KEPT.findall(source)) == Counter(KEPT.findall(target)), (source, target)
            if gettext_count(source, "&") == 1:
                assert gettext_count(target, "&") == 1 and re.search(r"&\w", target), (source, target)
    plurals = [e for e in po if e.msgid_plural]
    assert len(plurals) == 5 and all(e.msgstr_plural[0] and "%1" in e.msgstr_plural[1] for e in plurals)
    ref = polib.pofile(str(KRDC_REF))
    assert [key(e) for e in po] == [key(e) for e in ref]  # contexts and order kept
    assert len(sent) == len(set(sent))  # identical texts are sent once
    assert not any("&" in t and re.search(r"&[A-Za-z]", t) and "AT&T" not in t for t in sent)
    sacrebleu = pytest.importorskip("sacrebleu")
    refs = {key(e): e for e in ref}
    hyps = [t for e in filled for _, t in pairs(e)]
    gold = [t for e in filled for _, t in pairs(refs[key(e)])]
    assert sacrebleu.corpus_chrf(hyps, [gold]).score >= 50


# ---- every kind of entry ------------------------------------------------------------------------


@needs_msgfmt
def test_hand_written_catalog(shipped_server, tmp_path, capsys, sent):
    out = tmp_path / "es.po"
    rc, _, err = run_po(capsys, shipped_server, APP, "-o", out)
    assert rc == 0, err
    assert msgfmt(out, "_") == (0, "")
    before = {key(e): e for e in polib.pofile(str(APP))}
    po = polib.pofile(str(out))
    after = {key(e): e for e in po}
    assert list(after) == list(before)  # nothing added, dropped or reordered
    # Untouched: human translations, fuzzy ones, obsolete ones, credits.
    for k in [(None, "_File"), (None, "Open"), (None, "Open the file"), (None, "Close the window")]:
        assert str(after[k]) == str(before[k])
    assert after[(None, "Open the file")].previous_msgid == "Open file"
    assert [str(e) for e in po.obsolete_entries()] == [str(e) for e in before.values() if e.obsolete]
    assert after[(None, "translator-credits")].msgstr == ""
    assert not {"Open the file", "Close the window", "File", "Old string", "translator-credits"} & set(sent)
    # Filled: fuzzy, comments, references and flags kept.
    filled = [e for e in po if not e.obsolete and not has_translation(before[key(e)]) and has_translation(e)]
    assert len(filled) == 33, err
    for e in filled:
        b = before[key(e)]
        assert e.fuzzy and all(t for _, t in pairs(e))
        assert (e.comment, e.tcomment, e.occurrences) == (b.comment, b.tcomment, b.occurrences)
        assert [f for f in e.flags if f != "fuzzy"] == b.flags
        for source, target in pairs(e):
            assert Counter(KEPT.findall(source)) == Counter(KEPT.findall(target)), (source, target)
            assert re.findall(r"%[sd]", source) == re.findall(r"%[sd]", target)  # printf order
            assert target.startswith("\n") == source.startswith("\n")
            assert target.endswith("\n") == source.endswith("\n")
    # Accelerators: stripped before translation, exactly one back on a letter.
    for msgid, mark in [("_Save", "_"), ("Save _As…", "_"), ("Re_move", "_"), ("Show _hidden files", "_")]:
        assert msgid not in sent and msgid.replace(mark, "") in sent
    for msgid, mark in [("_Quit", "_"), ("E_xit", "_"), ("&Print", "&"), ("Sa&ve all", "&"), ("&Close", "&")]:
        target = after[(None, msgid)].msgstr
        assert gettext_count(target, mark) == 1 and re.search(re.escape(mark) + r"\w", target), target
    for msgid in ["~Paste", "~Delete", "Select ~All"]:
        target = after[(None, msgid)].msgstr
        assert target.count("~") == 1 and re.search(r"~\w", target), target
    assert after[(None, "Tom &amp; Jerry")].msgstr.count("&") == 1  # the entity, no accelerator added
    assert gettext_count(after[(None, "Copy && Paste")].msgstr, "&") == 0
    assert "file_name" in after[(None, "Invalid value for file_name")].msgstr
    assert "%(file_name)s" in after[(None, "%(file_name)s is missing")].msgstr
    # Plurals, contexts, header.
    for msgid, placeholder in [("%d file deleted", "%d"), ("One item selected", "%(n)d")]:
        forms = after[(None, msgid)].msgstr_plural
        assert sorted(forms) == [0, 1] and forms[0] and placeholder in forms[1]
    assert after[("menu", "Print")].msgstr and after[("noun", "Print")].msgstr
    assert after[("file dialog title", "Open")].msgstr and after[(None, "Open")].msgstr == "Abrir"
    assert po.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"
    assert po.metadata["Last-Translator"] == "Ana Pérez <ana@example.org>"
    # The multi-line help entry comes back whole: every line, options kept.
    help_entry = next(e for e in filled if e.msgid.startswith("Usage:"))
    source_lines, target_lines = help_entry.msgid.split("\n"), help_entry.msgstr.split("\n")
    assert len(target_lines) == len(source_lines)
    assert all(bool(s.strip()) == bool(t.strip()) for s, t in zip(source_lines, target_lines, strict=True))
    assert "--output=FILE" in help_entry.msgstr and "--verbose" in help_entry.msgstr


@needs_msgfmt
def test_fuzzy_all_and_no_fuzzy(shipped_server, tmp_path, capsys, sent):
    out = tmp_path / "es.po"
    rc, _, err = run_po(capsys, shipped_server, APP, "-o", out, "--fuzzy", "--no-fuzzy")
    assert rc == 0, err
    assert msgfmt(out, "_") == (0, "")
    after = {key(e): e for e in polib.pofile(str(out))}
    assert {"Open the file", "Close the window"} <= set(sent) and "File" not in sent
    for msgid in ["Open the file", "Close the window"]:
        e = after[(None, msgid)]
        assert e.msgstr and not e.fuzzy and e.previous_msgid is None
    assert not any(e.fuzzy for e in after.values())
    assert after[(None, "_File")].msgstr == "_Archivo"
    sent.clear()
    out.unlink()
    rc, _, err = run_po(capsys, shipped_server, APP, "-o", out, "--all")
    assert rc == 0, err
    assert {"File", "Open", "Open the file"} <= set(sent)
    assert msgfmt(out, "_") == (0, "")
    po = polib.pofile(str(out))
    assert all(e.fuzzy for e in po if e.msgid and not e.obsolete and e.msgid != "translator-credits")


@needs_msgfmt
def test_rejected_translations_are_left_out_with_a_comment(shipped_server, tmp_path, capsys, monkeypatch):
    """A translation msgfmt -c rejects, one with a segment the service kept untranslated and one with an
    extra accelerator marker are not written; the entry says why, and a rerun tries again."""
    real = TranslatorClient.translate_stream

    def spoiled(self, items, timeout=None):
        for r in real(self, items, timeout):
            for t in r.translations:
                h = t.hypotheses[0]
                if re.search(r"%s: %s", h.text):
                    h.text = h.text.replace("%s: ", "")  # loses a %s: msgfmt -c rejects it
                elif h.text.startswith("$HOME"):
                    t.notes.append(SegmentNote("passed_through", 0, 16, "lost %1; kept the source"))
                elif "todo" in h.text and "Guardar" in h.text:
                    h.text += " & más"  # a second & marker
            yield r

    monkeypatch.setattr(TranslatorClient, "translate_stream", spoiled)
    out = tmp_path / "es.po"
    rc, _, err = run_po(capsys, shipped_server, APP, "-o", out)
    assert rc == 0, err
    assert msgfmt(out, "_") == (0, "")
    after = {e.msgid: e for e in polib.pofile(str(out))}
    expected = {
        "Could not open %s: %s": "machine translation left out: msgfmt -c: number of format specifications",
        "$HOME is not set": "machine translation left out: kept untranslated by the service: '$HOME is not",
        "Sa&ve all": "machine translation left out: accelerator: '&' not exactly once",
    }
    for msgid, comment in expected.items():
        assert after[msgid].msgstr == "" and not after[msgid].fuzzy, msgid
        assert " ".join(after[msgid].tcomment.split()).startswith(comment), after[msgid].tcomment
        assert f"{msgid[:20]}" in err
    assert "3 left untranslated" in err
    monkeypatch.setattr(TranslatorClient, "translate_stream", real)
    rc, _, err = run_po(capsys, shipped_server, APP, "-o", out)
    assert rc == 0 and "3 filled" in err, err
    after = {e.msgid: e for e in polib.pofile(str(out))}
    assert all(after[m].msgstr and not after[m].tcomment for m in expected)


# ---- resuming ----------------------------------------------------------------------------------------


@needs_msgfmt
def test_interrupt_then_rerun_sends_only_missing_entries(shipped_server, tmp_path, capsys, monkeypatch):
    real = TranslatorClient.translate_stream

    def interrupted(self, items, timeout=None):  # Ctrl-C after two stream results
        for i, r in enumerate(real(self, items, timeout)):
            if i == 2:
                raise KeyboardInterrupt
            yield r

    monkeypatch.setattr(TranslatorClient, "translate_stream", interrupted)
    out = tmp_path / "krdc.po"
    args = (KRDC_POT, "-o", out, "--batch-size", "4", "--parallel", "1", "--save-every", "1")
    rc, _, err = run_po(capsys, shipped_server, *args)
    assert rc == 130 and "interrupted" in err, err
    assert msgfmt(out, "&") == (0, "")
    partial = {key(e): e for e in polib.pofile(str(out))}
    done = {k for k, e in partial.items() if has_translation(e)}
    assert 4 <= len(done) <= 8

    texts: list[str] = []

    def spy(self, items, timeout=None):
        def record():
            for item in items:
                texts.extend(item.texts)
                yield item

        return real(self, record(), timeout)

    monkeypatch.setattr(TranslatorClient, "translate_stream", spy)
    rc, _, err = run_po(capsys, shipped_server, *args)
    assert rc == 0 and f"{len(done)} kept from the existing output" in err, err
    missing = [e for e in polib.pofile(str(KRDC_POT)) if key(e) not in done and e.msgid not in CREDITS]
    want = {strip_accelerator(t, "&")[0] for e in missing for t in (e.msgid, e.msgid_plural) if t}
    assert sorted(texts) == sorted(want)
    final = {key(e): e for e in polib.pofile(str(out))}
    assert all(str(final[k]) == str(partial[k]) for k in done)
    # Every entry is filled or left out with a comment (the model may keep an odd one untranslated).
    filled = sum(has_translation(e) for e in final.values())
    left = sum("machine translation left out" in (e.tcomment or "") for e in final.values())
    assert filled + left == 58 and left <= 2, (filled, left)

    # A truncated output (entries lost) gets just those entries again.
    po = polib.pofile(str(out))
    blanked = [e for e in po if e.msgid and not e.msgid_plural and has_translation(e)][10:15]
    for e in blanked:
        e.msgstr = ""
    po.save(str(out))
    texts.clear()
    rc, _, err = run_po(capsys, shipped_server, *args)
    assert rc == 0, err
    assert sorted(texts) == sorted({strip_accelerator(e.msgid, "&")[0] for e in blanked})


# ---- stdin/stdout, directories, exit codes -----------------------------------------------------------


@needs_msgfmt
def test_stdin_to_stdout_through_python_m_client(shipped_server, tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "client", "po", "-", "--target", shipped_server.target, "--beam-size", "1"],
        input=KRDC_POT.read_text(),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    filled = int(re.search(r"(\d+) filled", p.stderr).group(1))
    left = re.search(r"(\d+) left untranslated", p.stderr)
    assert filled + (int(left.group(1)) if left else 0) == 58 and filled >= 56, p.stderr
    out = tmp_path / "out.po"
    out.write_text(p.stdout)
    assert msgfmt(out, "&") == (0, "")
    assert sum(has_translation(e) for e in polib.pofile(str(out))) == 58


@needs_msgfmt
def test_directory_of_templates(shipped_server, tmp_path, capsys):
    src = tmp_path / "po"
    src.mkdir()
    template_of(APP, src / "app.pot")
    shutil.copy(KRDC_POT, src / "krdc.pot")
    shutil.copy(KRDC_REF, src / "fr.po")  # another language's catalog: not an input when .pot exist
    out = tmp_path / "es"
    rc, _, err = run_po(capsys, shipped_server, src, "-o", out)
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["app.po", "krdc.po"]
    assert msgfmt(out / "app.po", "_") == (0, "") and msgfmt(out / "krdc.po", "&") == (0, "")
    app = {e.msgid: e for e in polib.pofile(str(out / "app.po"))}
    assert app["_Save"].msgstr.count("_") == 1 and app["Open"].msgstr
    assert polib.pofile(str(out / "app.po")).metadata["Language"] == "es"


@needs_msgfmt
def test_exit_codes(shipped_server, tmp_path, capsys):
    def run(*args, target=shipped_server.target):
        capsys.readouterr()
        rc = po_cli.main([*map(str, args), "--target", target, "--no-progress", "--wait-s", "0"])
        return rc, capsys.readouterr().err

    assert run(tmp_path / "missing.pot", "-o", tmp_path / "x.po")[0] == 2
    assert run(APP, KRDC_POT, "-o", APP)[0] == 2  # several inputs need a directory
    assert run(APP, "--accelerator", "x", "-o", tmp_path / "x.po")[0] == 2
    unrelated = tmp_path / "other.po"
    shutil.copy(KRDC_REF, unrelated)
    rc, err = run(APP, "-o", unrelated)
    assert rc == 2 and "not a translation of this input" in err
    assert unrelated.read_bytes() == KRDC_REF.read_bytes()
    broken = tmp_path / "broken.pot"
    broken.write_text('msgid "a"\nmsgstr "b"\nmsgid\n')
    assert run(broken, "-o", tmp_path / "x.po")[0] == 1
    rc, err = run(APP, "-o", tmp_path / "x.po", "--retries", "0", target=f"127.0.0.1:{free_port()}")
    assert rc == 3 and "cannot reach" in err
    assert not (tmp_path / "x.po").exists()


# ---- without a server -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "markers", "stripped", "accel"),
    [
        ("_Save", "_", "Save", ("_", "S", True)),
        ("Save _As…", "_", "Save As…", ("_", "A", False)),
        ("Re_move", "_", "Remove", ("_", "m", False)),
        ("Show hidde_n files", "_", "Show hidden files", ("_", "n", False)),
        ("_OK", "_", "OK", ("_", "O", True)),
        ("Invalid file_name", "_", "Invalid file_name", None),
        ("Set NO_PROXY", "_", "Set NO_PROXY", None),
        ("x86_64 only", "_", "x86_64 only", None),
        ("%(file_name)s is missing", "_", "%(file_name)s is missing", None),
        ("__init__ failed", "_", "__init__ failed", None),
        ("&File", "&", "File", ("&", "F", True)),
        ("Sa&ve all", "&", "Save all", ("&", "v", False)),
        ("Tom &amp; Jerry", "&", "Tom &amp; Jerry", None),
        ("Copy && Paste", "&", "Copy && Paste", None),
        ("AT&T Laboratories", "&", "AT&T Laboratories", None),
        ("See https://x.org/?a=1&b=2", "&", "See https://x.org/?a=1&b=2", None),
        ("~Paste", "~", "Paste", ("~", "P", True)),
        ("Open ~/.config", "~", "Open ~/.config", None),
        ("_Open &recent", "_&", "Open &recent", ("_", "O", True)),
    ],
)
def test_accelerators_are_found_and_stripped(text, markers, stripped, accel):
    assert strip_accelerator(text, markers) == (stripped, accel)


@pytest.mark.parametrize(
    ("text", "mark", "letter", "first", "expected"),
    [
        ("Guardar", "_", "S", True, "_Guardar"),
        ("Guardar como…", "_", "A", True, "_Guardar como…"),
        # The source's marker on its first letter: the translation's on its own first letter.
        ("Carpeta de destino:", "_", "D", True, "_Carpeta de destino:"),
        # Off the first letter in the source, off it in the translation: the source's letter at a word
        # start (three letters or more first), else another word's start, else the letter inside a word.
        ("Carpeta de destino:", "_", "D", False, "Carpeta de _destino:"),
        ("Todos los archivos", "_", "A", False, "Todos los _archivos"),
        ("Cortar", "_", "t", False, "Cor_tar"),
        ("Guardar como…", "_", "A", False, "Guardar _como…"),
        ("Buscar siguiente", "_", "N", False, "Buscar _siguiente"),
        ("Abrir", "_", "x", False, "A_brir"),
        ("¿Guardar cambios?", "&", "S", True, "¿&Guardar cambios?"),
        ("%s archivos", "_", "F", True, "%s _archivos"),
        ("<b>Nombre</b>", "_", "N", True, "<b>_Nombre</b>"),
        ("%1 de %2", "&", "O", True, "%1 &de %2"),
        ("%s", "_", "S", True, None),
        ("100", "~", "O", True, "~100"),
        ("Y", "_", "Y", False, "_Y"),  # no other letter: the first after all
    ],
)
def test_accelerator_goes_back_on_a_letter(text, mark, letter, first, expected):
    assert place_accelerator(text, mark, letter, first) == expected


def test_catalog_convention():
    gtk = ["_Open", "_Save", "Save _As", "Tom &amp; Jerry", "file_name"]
    assert catalog_markers(gtk) == "_"
    assert catalog_markers(gtk, declared="&") == "&_"
    assert catalog_markers(["&File", "&Edit", "&View", "R&D", "Q&A"]) == "&"
    assert catalog_markers(["Open ~/.config", "see file_name", "100%"]) == ""
    assert candidates("a & b &c", "&") == [6]
    assert gettext_count("Tom && &Jerry", "&") == 1


def test_render_matches_polib_and_maps_lines():
    po = polib.pofile(str(APP))
    text, starts, entries = render(po)
    assert text == str(po) + ("" if str(po).endswith("\n") else "\n")
    lines = text.split("\n")
    for start, e in zip(starts[1:], entries[1:], strict=True):
        block = "\n".join(lines[start - 1 : start + 12])
        assert e.msgid.split("\n")[0][:30] in block.replace('"\n"', "")
