"""model/extra_qt.py: Qt catalogs (.qm) of packages outside the ranked list, train only. Offline: the
.qm files are written here in Qt's binary format, packed into real .deb files with dpkg-deb, and
Debian's indexes and apt are replaced by fabricated ones."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from translate.storage.qm import QM_MAGIC_NUMBER

from bench.model_card import corpus_command
from model import corpus, extra_catalogs
from model import extra_qt as qt
from model.extra_catalogs import parse_package_index
from model.languages import language
from tests.test_extra_catalogs import _build, ranked_debs, ranked_list
from tests.test_languages import make_deb

ES, PT_BR = language("es"), language("pt_BR")


def build_qm(messages: list[tuple[str | None, list[str]]]) -> bytes:
    """A .qm file as lrelease writes it: per message its translations (UTF-16BE; several for a
    numerus message), the source text (UTF-8; None: stripped, as lrelease may do), a context, the end."""
    body = b""
    for source, forms in messages:
        for form in forms:
            data = form.encode("utf-16-be")
            body += b"\x03" + struct.pack(">l", len(data)) + data
        if source is not None:
            data = source.encode("utf-8")
            body += b"\x06" + struct.pack(">L", len(data)) + data
        body += b"\x07" + struct.pack(">L", 4) + b"Main" + b"\x01"
    return struct.pack(">4L", *QM_MAGIC_NUMBER) + b"\x69" + struct.pack(">L", len(body)) + body


def test_pattern_takes_the_languages_qt_catalogs_only():
    pattern = qt.qm_pattern(ES)
    for path in (
        "usr/share/jami/translations/lrc_es.qm",
        "usr/share/lxqt/translations/lxqt-panel/dom/dom_es.qm",
        "usr/share/app/translations/es.qm",
        "usr/share/app/i18n/app.es_ES.qm",
        "./usr/share/qt5/translations/qtbase_es.qm",
    ):
        assert pattern.match(path), path
    for path in (
        "usr/share/jami/translations/lrc_es_MX.qm",  # a regional variant, left out as for gettext
        "usr/share/app/translations/app_des.qm",
        "usr/share/app/translations/app_pt_BR.qm",
        "usr/lib/app/app_es.qm",  # only usr/share
        "usr/share/app/app_es.ts",
    ):
        assert not pattern.match(path), path
    assert qt.qm_pattern(PT_BR).match("usr/share/app/translations/app_pt_BR.qm")
    assert not qt.qm_pattern(PT_BR).match("usr/share/app/translations/app_pt.qm")


def test_contents_map_packages_to_their_catalogs():
    lines = [
        "usr/share/jami/translations/lrc_es.qm                comm/jami",
        "usr/share/jami/translations/lrc_fr.qm                comm/jami",
        "usr/share/shared/translations/common_es.qm           x11/one,x11/two",
        "usr/share/locale/es/LC_MESSAGES/gettext.mo           utils/gettextonly",
    ]
    assert qt.parse_qm_contents(lines, ES) == {
        "jami": {"usr/share/jami/translations/lrc_es.qm"},
        "one": {"usr/share/shared/translations/common_es.qm"},
        "two": {"usr/share/shared/translations/common_es.qm"},
    }


def test_messages_decode_utf8_sources_and_keep_numerus_forms_apart():
    data = build_qm([("Save as…", ["Guardar como…"]), ("%n file(s)", ["%n archivo", "%n archivos"])])
    assert list(qt.qm_messages(data)) == [
        ("Save as…", ["Guardar como…"]),
        ("%n file(s)", ["%n archivo", "%n archivos"]),
    ]
    with pytest.raises(ValueError, match="no source"):
        list(qt.qm_messages(build_qm([(None, ["Guardar"])])))
    with pytest.raises(ValueError):
        list(qt.qm_messages(b"not a qm file at all"))


def test_package_pairs_are_cleaned_with_provenance(tmp_path):
    deb = make_deb(
        tmp_path,
        "qtapp",
        {
            "usr/share/qtapp/translations/qtapp_es.qm": build_qm(
                [
                    ("&Open file", ["&Abrir archivo"]),  # the accelerator goes, as for gettext
                    ("Missed call", ["Llamada perdida"]),
                    ("%n file(s)", ["%n archivo", "%n archivos"]),  # plural: skipped
                    ("OK", ["OK"]),  # source == target: dropped
                ]
            ),
            "usr/share/qtapp/translations/stripped_es.qm": build_qm([(None, ["Guardar"])]),
            "usr/share/qtapp/translations/qtapp_fr.qm": build_qm([("Missed call", ["Appel manqué"])]),
        },
    )
    pairs, dropped = qt.read_qm_package(("es", "qtapp", str(deb)))
    assert [(p.source, p.target, p.package, p.version, p.origin) for p in pairs] == [
        ("Open file", "Abrir archivo", "qtapp", "1.0-1", "extra-qt:qtapp_es.qm"),
        ("Missed call", "Llamada perdida", "qtapp", "1.0-1", "extra-qt:qtapp_es.qm"),
    ]
    assert dropped == {"plural": 1, "source == target": 1, "no source texts": 1}


@pytest.fixture()
def fake_debian_qt(tmp_path, monkeypatch):
    """One ranked package in a train family and one in a valid family (gettext), and Qt packages: one
    outside the list, one of the valid family's (held out by family), as real .deb files."""
    from tests.test_extra_catalogs import VALID_FAM

    debs_dir = tmp_path / "debs"
    debs = ranked_debs(debs_dir)
    ranked = list(debs)
    qm = build_qm(
        [
            ("Save", ["Guardar"]),  # in train already
            ("Close the window", ["Cierra la ventana"]),  # valid's source
            ("Start video call", ["Iniciar videollamada"]),
        ]
    )
    qtapp = make_deb(debs_dir, "qtapp", {"usr/share/qtapp/translations/qtapp_es.qm": qm})
    sibling = f"{VALID_FAM}-qt"
    contents = "".join(f"usr/share/locale/es/LC_MESSAGES/{p}.mo utils/{p}\n" for p in ranked)
    contents += "usr/share/qtapp/translations/qtapp_es.qm comm/qtapp\n"
    contents += f"usr/share/{sibling}/translations/x_es.qm x11/{sibling}\n"
    index = "\n\n".join(f"Package: {p}\nVersion: 1.0\nSize: 100" for p in [*ranked, "qtapp", sibling])
    fetched: list[list[str]] = []

    def download(packages, cache, desc=""):
        fetched.append(list(packages))
        return {"qtapp": qtapp}

    monkeypatch.setattr(corpus, "download_packages", lambda packages, cache: {p: debs[p] for p in debs})
    monkeypatch.setattr(qt, "fetch_contents", lambda cache: {"main/Contents-all.gz": "0" * 64})
    monkeypatch.setattr(qt, "contents_lines", lambda cache: contents.splitlines())
    monkeypatch.setattr(extra_catalogs, "read_package_index", lambda: parse_package_index(index))
    monkeypatch.setattr(qt, "download_packages", download)
    return ranked_list(tmp_path, ranked), debs_dir, fetched


def test_the_flag_adds_qt_pairs_to_train_only(fake_debian_qt, tmp_path, monkeypatch):
    package_list, debs_dir, fetched = fake_debian_qt
    plain = _build(tmp_path / "plain", package_list, debs_dir)
    with_qt = _build(tmp_path / "qt", package_list, debs_dir, extra_qt=True)
    assert fetched == [["qtapp"]]  # the valid family's Qt package is never fetched
    for name in ("valid", "test"):
        assert with_qt["sha256"][name] == plain["sha256"][name]
    before = (tmp_path / "plain" / "train.jsonl").read_text().splitlines()
    after = (tmp_path / "qt" / "train.jsonl").read_text().splitlines()
    assert after[: len(before)] == before and len(after) == len(before) + 1
    added = json.loads(after[-1])
    assert (added["source"], added["target"], added["package"], added["origin"]) == (
        "Start video call",
        "Iniciar videollamada",
        "qtapp",
        "extra-qt:qtapp_es.qm",
    )
    record = with_qt["extra_qt"]
    assert record["packages"] == {"qtapp": 3} and record["excluded"] == {"family of a ranked package": 1}
    counts = ("already_in_train", "source_in_valid_or_test", "pairs_added_to_train")
    assert [record[name] for name in counts] == [1, 1, 1]
    assert "extra-qt" in with_qt["sources"] and "extra_qt" not in plain

    # Without the flag the Qt step never runs.
    def no_qt(*args, **kwargs):
        raise AssertionError("the default build read the Qt catalogs")

    monkeypatch.setattr(qt, "add_extra_qt", no_qt)
    monkeypatch.setattr(extra_catalogs, "add_extra_catalogs", no_qt)
    corpus.main(["--out", str(tmp_path / "cli"), "--packages", str(package_list), "--cache", str(debs_dir)])
    assert json.loads((tmp_path / "cli" / "manifest.json").read_text())["sha256"] == plain["sha256"]


def test_the_model_cards_corpus_command_names_every_opt_in_source():
    plain = {"sources": "catalogs"}
    assert corpus_command(plain, "es", Path("data")) == "python -m model.corpus --lang es --out data"
    manifest = {
        "extra_catalogs": {"limits": {"max_packages": 2000, "max_bytes": 1200000000}},
        "extra_docs": {"limits": {"max_bytes": 1500000000}},
        "extra_qt": {"limits": {"max_packages": 400, "max_bytes": 1500000000}},
    }
    assert corpus_command(manifest, "pt_BR", Path("runs/d")) == (
        "python -m model.corpus --lang pt_BR --out runs/d --extra-catalogs --max-extra-packages 2000 "
        "--max-extra-bytes 1200000000 --extra-docs --max-docs-bytes 1500000000 --extra-qt"
    )
