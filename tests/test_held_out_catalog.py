"""bench.held_out_catalog: a test-split package's catalog, filled by a shipped model and checked with the
real `msgfmt -c`. The packages are real .deb files built here with dpkg-deb around catalogs compiled by
msgfmt: a cut of krdc's Spanish human translation (tests/data/po/real/) and a French one written here.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import polib
import pytest

from bench import held_out_catalog
from bench.held_out_catalog import build, read

KRDC_REF = Path(__file__).parent / "data" / "po" / "real" / "krdc.es.po"
FRENCH = """msgid ""
msgstr ""
"Project-Id-Version: demo\\n"
"Language: fr\\n"
"Content-Type: text/plain; charset=UTF-8\\n"
"Plural-Forms: nplurals=2; plural=(n > 1);\\n"

msgid "Open File"
msgstr "Ouvrir le fichier"

#, c-format
msgid "%d file"
msgid_plural "%d files"
msgstr[0] "%d fichier"
msgstr[1] "%d fichiers"

msgctxt "menu"
msgid "_Quit"
msgstr "_Quitter"
"""


def krdc_cut(keep) -> polib.POFile:
    """krdc's human Spanish catalog with only the entries `keep` takes."""
    po = polib.pofile(str(KRDC_REF))
    for e in [e for e in po if not keep(e)]:
        po.remove(e)
    return po


def make_package(cache: Path, name: str, catalogs: dict[str, polib.POFile]) -> None:
    """A real .deb holding each catalog compiled by msgfmt at usr/share/locale/<dir>/LC_MESSAGES/."""
    root = cache.parent / "trees" / name
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1.0-1\nArchitecture: all\nMaintainer: Test <t@example.org>\n"
        "Description: held-out catalog test\n",
        encoding="utf-8",
    )
    for where, po in catalogs.items():
        mo = root / "usr" / "share" / "locale" / where
        mo.parent.mkdir(parents=True, exist_ok=True)
        src = cache.parent / f"{name}.po"
        po.save(str(src))
        subprocess.run(["msgfmt", "-o", str(mo), str(src)], check=True)
    cache.mkdir(parents=True, exist_ok=True)
    deb = cache / f"{name}_1.0-1_all.deb"
    subprocess.run(["dpkg-deb", "-Zgzip", "--root-owner-group", "--build", str(root), str(deb)], check=True)


def make_corpus(tmp_path: Path, language: dict | None, packages: dict[str, tuple[str, dict]]) -> Path:
    """A corpus directory as model.corpus leaves it, as far as this bench reads it: manifest.json (the
    split of each package) and the cached .deb files."""
    data = tmp_path / "data"
    manifest = {"packages": {n: {"version": "1.0-1", split: 5} for n, (split, _) in packages.items()}}
    if language is not None:
        manifest["language"] = language
    for name, (_, catalogs) in packages.items():
        make_package(data / "cache" / "debs", name, catalogs)
    (data / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return data


def msgfmt_check(path: Path) -> subprocess.CompletedProcess:
    cmd = ["msgfmt", "-c", "--use-fuzzy", "--check-accelerators=&", "-o", "/dev/null", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True)


def test_build_keeps_plurals_contexts_and_accelerators_first(tmp_path):
    plain = {"Bottom", "Bookmarks", "Broadband"}
    po = krdc_cut(lambda e: e.msgid_plural or e.msgctxt or e.msgid in plain)
    po.save(str(tmp_path / "cut.po"))
    subprocess.run(["msgfmt", "-o", str(tmp_path / "cut.mo"), str(tmp_path / "cut.po")], check=True)
    catalog = read(tmp_path / "cut.mo")
    special = sum(1 for e in catalog if e.msgid and (e.msgid_plural or e.msgctxt))
    pot, ref = build(catalog, limit=special + 1)
    assert len(pot) == len(ref) == special + 1
    assert sum(e.msgctxt is None and e.msgid in plain for e in pot) == 1  # one plain one, after the others
    assert pot.metadata["Plural-Forms"] == "nplurals=INTEGER; plural=EXPRESSION;" and pot.metadata_is_fuzzy
    assert all(not e.msgstr and not any(e.msgstr_plural.values()) for e in pot)
    year = next(e for e in ref if e.msgid == "A year ago")
    assert year.msgstr_plural[1] == "Hace %1 años" and "kde-format" in year.flags  # the .mo lost the flags


def test_a_test_split_catalog_filled_by_the_shipped_spanish_model(shipped_bundle, tmp_path):
    names = {"&Session", "Color &depth:", "&Width:", "Bottom", "Your names"}
    picked = krdc_cut(lambda e: e.msgid_plural or e.msgid in names or e.msgctxt == "General Config")
    data = make_corpus(
        tmp_path,
        None,  # a Spanish corpus from before manifests named their language
        {
            "hoc-test-krdc": ("test", {"es/LC_MESSAGES/krdc.mo": picked}),
            # more entries, no plural entry: not the one to pick
            "hoc-test-flat": ("test", {"es/LC_MESSAGES/flat.mo": krdc_cut(lambda e: not e.msgid_plural)}),
            # plural entries and the most entries, but trained on
            "hoc-train-krdc": ("train", {"es/LC_MESSAGES/krdc.mo": krdc_cut(lambda e: True)}),
        },
    )
    keep = tmp_path / "keep"
    report = held_out_catalog.main(
        ["--data", str(data), "--bundle", str(shipped_bundle), "--threads", "1", "--limit", "10",
         "--keep", str(keep), "--json", str(tmp_path / "report.json")]
    )  # fmt: skip
    assert report == json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert report["package"] == "hoc-test-krdc"
    assert report["catalog"] == "usr/share/locale/es/LC_MESSAGES/krdc.mo"
    assert report["catalog_entries"] == 11 and report["entries"] == 10  # --limit: the plain entry dropped
    assert report["plural_entries"] == 5 and report["context_entries"] == 2
    assert report["accelerator_entries"] == 3 and report["translator_credits"] == 1
    assert report["filled"] + len(report["left_out"]) + report["translator_credits"] == report["entries"]
    assert report["filled"] == report["score"]["filled"] and report["filled"] >= 8
    assert report["msgfmt"] == {
        "command": "msgfmt -c --use-fuzzy --check-accelerators=&",
        "clean": True,
        "errors": [],
    }
    assert report["language"] == "es" and report["plural_forms"] == "nplurals=2; plural=(n != 1);"
    assert 0 < report["chrf"] <= 100 and 0 <= report["bleu"] <= 100
    machine = keep / "krdc.es.machine.po"
    assert msgfmt_check(machine).returncode == 0, msgfmt_check(machine).stderr
    written = polib.pofile(str(machine))
    assert written.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"
    plurals = [e for e in written if e.msgid_plural and e.msgstr_plural.get(0)]
    assert len(plurals) == report["plural_entries_filled"]
    assert all(len(e.msgstr_plural) == 2 for e in plurals)
    assert {p.name for p in keep.iterdir()} == {"krdc.mo", "krdc.pot", "krdc.es.po", "krdc.es.machine.po"}
    card = "\n".join(held_out_catalog.card_lines(report))
    assert "## Held-out catalog (hoc-test-krdc, 10 entries" in card and "| clean |" in card


def test_a_french_catalog_gets_french_plural_forms(shipped_store, tmp_path):
    bundle = shipped_store / "en-fr-small"
    if not bundle.exists():
        pytest.skip("no French model shipped")
    french = polib.pofile(FRENCH)
    data = make_corpus(
        tmp_path, {"code": "fr"}, {"hoc-test-fr": ("test", {"fr/LC_MESSAGES/demo.mo": french})}
    )
    report = held_out_catalog.main(["--data", str(data), "--bundle", str(bundle), "--threads", "1"])
    assert report["language"] == "fr" and report["plural_forms"] == "nplurals=2; plural=(n > 1);"
    assert report["plural_forms"] == report["plural_forms_expected"] and report["msgfmt"]["clean"]
    assert report["entries"] == 3 and report["plural_entries"] == 1
    assert report["filled"] + len(report["left_out"]) == 3
    # the Spanish bundle for a French corpus is an error, not a card
    with pytest.raises(SystemExit, match="translates into es"):
        held_out_catalog.main(["--data", str(data), "--bundle", str(shipped_store / "en-es-small")])


def test_a_corpus_without_held_out_catalogs_is_reported_not_measured(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"packages": {"hoc-absent": {"test": 3}}}), "utf-8")
    report = held_out_catalog.main(["--data", str(data), "--bundle", str(tmp_path / "none")])
    assert "hoc-absent: no .deb" in report["skipped"]
    assert "not measured, no Spanish catalog" in "\n".join(held_out_catalog.card_lines(report))
