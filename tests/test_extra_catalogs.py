"""The opt-in extra catalogs (model/extra_catalogs.py): which packages count, what reaches train, and that
the default corpus does not change. No network: a fabricated Contents excerpt, package index and ranked
list, and tiny .deb files built with dpkg-deb."""

from __future__ import annotations

import json
from pathlib import Path

import polib
import pytest

from model import corpus
from model import extra_catalogs as extra
from model.corpus import Pair
from model.extra_catalogs import (
    IndexEntry,
    bounded,
    merge_into_train,
    parse_contents,
    parse_package_index,
    ranked_names,
    read_extra_package,
    select_candidates,
)
from model.languages import language
from tests.test_corpus import _family_in
from tests.test_languages import make_deb

ES = language("es")


TRAIN_FAM, VALID_FAM = _family_in("train"), _family_in("valid")


def ranked_list(tmp_path: Path, names: list[str]) -> Path:
    path = tmp_path / "ranked.tsv"
    path.write_text("# ranked\n" + "".join(f"{name}\t{1000 - i}\n" for i, name in enumerate(names)))
    return path


def build_mo(path: Path, pairs: list[tuple[str, str]]) -> None:
    po = polib.POFile()
    po.metadata = {"Content-Type": "text/plain; charset=UTF-8", "Plural-Forms": "nplurals=2; plural=n != 1;"}
    for msgid, msgstr in pairs:
        po.append(polib.POEntry(msgid=msgid, msgstr=msgstr))
    path.parent.mkdir(parents=True, exist_ok=True)
    po.save_as_mofile(str(path))


def build_deb(out: Path, package: str, files: dict[str, list[tuple[str, str]]]) -> Path:
    """A real binary package `package_1.0_all.deb` holding one .mo per path of `files`."""
    catalogs = {}
    for path, pairs in files.items():
        build_mo(out / f"{package}-mo" / path, pairs)
        catalogs[path] = (out / f"{package}-mo" / path).read_bytes()
    return make_deb(out, package, catalogs, version="1.0")


CONTENTS = """\
usr/bin/newapp                                             utils/newapp
usr/share/locale/es/LC_MESSAGES/newapp.mo                  utils/newapp
usr/share/locale/es_ES/LC_MESSAGES/newapp-extra.mo         utils/newapp
usr/share/locale/es_MX/LC_MESSAGES/newapp.mo               utils/newapp
usr/share/locale/fr/LC_MESSAGES/other.mo                   utils/frenchonly
usr/share/help/es/newapp/index.page                        utils/newapp
usr/share/locale/es/LC_MESSAGES/heldout.mo                 utils/heldout,utils/heldout-data
usr/share/locale/es/LC_MESSAGES/heldout-plugins.mo         utils/heldout-plugins
usr/share/locale/es/LC_MESSAGES/toppkg.mo                  utils/toppkg
usr/share/locale/de/LC_MESSAGES/toppkg.mo                  utils/toppkg
usr/share/locale/es/LC_MESSAGES/toppkg.mo                  localization/langpack-es
usr/share/locale/es/LC_MESSAGES/mate-thing.mo              x11/mate-thing
usr/share/locale/es/LC_MESSAGES/ghost.mo                   utils/ghost
"""

INDEX = """\
Package: newapp
Version: 2.0-1
Size: 1000

Package: heldout
Version: 1.0-1
Size: 10

Package: heldout-data
Source: heldout (1.0-1)
Version: 1.0-1
Size: 10

Package: heldout-plugins
Source: heldout
Version: 1.0-1
Size: 10

Package: toppkg
Version: 3.0
Size: 10

Package: langpack-es
Version: 1
Size: 10

Package: mate-thing
Source: mate-thing
Version: 1
Size: 10

Package: mate-panel-common
Source: mate-panel
Version: 1
Size: 10

Package: frenchonly
Version: 1
Size: 10
"""


def test_contents_keep_the_languages_locale_catalogs_only():
    catalogs, domains = parse_contents(CONTENTS.splitlines(), ES)
    assert catalogs["newapp"] == {
        "usr/share/locale/es/LC_MESSAGES/newapp.mo",
        "usr/share/locale/es_ES/LC_MESSAGES/newapp-extra.mo",
    }  # not es_MX, not the help page
    assert "frenchonly" not in catalogs
    assert catalogs["heldout"] == catalogs["heldout-data"]  # a file two packages ship
    assert domains["toppkg"] == {"toppkg"}  # any language counts for the domain rule
    assert domains["frenchonly"] == {"other"}


def test_package_index_sources():
    index = parse_package_index(INDEX)
    assert index["heldout-data"] == IndexEntry("heldout", "1.0-1", 10)  # "(version)" dropped
    assert index["newapp"].source == "newapp"  # no Source: its own
    assert index["newapp"].size == 1000


def test_ranked_packages_of_any_rank_and_their_siblings_are_excluded(tmp_path):
    # toppkg is ranked first, heldout 201st (held out of training in every language), mate-panel-common
    # stands for a ranked family; the rest of the list is filler.
    names = ["toppkg", *(f"filler{i}" for i in range(199)), "heldout", "mate-panel-common"]
    ranked = ranked_names(ranked_list(tmp_path, names), ES)
    assert "heldout" in ranked and len(ranked) == 202
    catalogs, domains = parse_contents(CONTENTS.splitlines(), ES)
    chosen, counts, why = select_candidates(catalogs, domains, parse_package_index(INDEX), ranked)
    assert chosen == ["newapp"]
    assert why == {
        "toppkg": "ranked package",
        "heldout": "ranked package",
        "heldout-data": "source of a ranked package",
        "heldout-plugins": "source of a ranked package",
        "mate-thing": "family of a ranked package",
        "langpack-es": "ships a ranked catalog domain",
        "ghost": "not in the package index",
    }
    assert counts == {
        "ranked package": 2,
        "source of a ranked package": 2,
        "family of a ranked package": 1,
        "ships a ranked catalog domain": 1,
        "not in the package index": 1,
    }


def test_bounded_by_count_and_bytes():
    catalogs = {"a": {"1", "2"}, "b": {"1"}, "c": {"1"}, "d": {"1"}}
    index = {p: IndexEntry(p, "1", size) for p, size in zip("abcd", (50, 60, 10, 20), strict=True)}
    assert bounded(list(catalogs), catalogs, index, 10, 100) == (["a", "c", "d"], 80)  # b does not fit
    assert bounded(list(catalogs), catalogs, index, 2, 1000) == (["a", "c"], 60)  # most catalogs first


def test_extra_package_reads_locale_catalogs_with_provenance(tmp_path):
    deb = build_deb(
        tmp_path,
        "newapp",
        {
            "usr/share/locale/es/LC_MESSAGES/newapp.mo": [("_Open the door", "_Abrir la puerta"), ("x", "x")],
            "usr/share/locale/es_MX/LC_MESSAGES/newapp.mo": [("Computer", "Computadora")],
            "usr/share/help/es/LC_MESSAGES/guide.mo": [("Help page", "Página de ayuda")],
        },
    )
    pairs, dropped = read_extra_package(("es", "newapp", str(deb)))
    assert [(p.source, p.target, p.package, p.version, p.origin) for p in pairs] == [
        ("Open the door", "Abrir la puerta", "newapp", "1.0", "extra-catalogs:newapp.mo")
    ]  # cleaned like the ranked catalogs: accelerator gone, source == target dropped
    assert dropped == {"source == target": 1}


def _pair(source: str, target: str, package: str) -> Pair:
    return Pair(source, target, package, "1", "x.mo", (package,))


def test_merge_adds_to_train_only_and_leaves_held_out_splits_alone():
    splits = {
        "train": [_pair("Open", "Abrir", "toppkg")],
        "valid": [_pair("Secret test sentence", "Frase secreta", "v")],
        "test": [],
    }
    new = [
        _pair("Open", "Abrir", "newapp"),  # already in train
        _pair("secret test sentence!", "Otra", "newapp"),  # its source is in valid
        _pair("Brand new", "Nuevo", "newapp"),
        _pair("Brand new", "Nuevo", "other"),  # the same pair twice
        _pair("OPEN", "ABRIR", "other"),  # a new pair, not a new source
    ]
    merged, counts = merge_into_train(splits, new)
    assert merged["valid"] is splits["valid"] and merged["test"] is splits["test"]
    assert merged["train"][0] is splits["train"][0]
    assert merged["train"][0].packages == ("toppkg",)  # train's rows keep their package lists
    assert [(p.source, p.packages) for p in merged["train"][1:]] == [
        ("Brand new", ("newapp", "other")),
        ("OPEN", ("other",)),
    ]
    assert counts == {
        "pairs_after_cleaning": 5,
        "pairs_after_dedupe": 4,
        "already_in_train": 1,
        "source_in_valid_or_test": 1,
        "pairs_added_to_train": 2,
        "new_sources": 1,
        "pairs_with_new_source": 1,
    }


def ranked_debs(debs_dir: Path) -> dict[str, Path]:
    """Two ranked packages as .deb files: one in a train family (`Open the file`, `Save`), one in a
    valid family (`Close the window`)."""
    ranked = {
        f"{TRAIN_FAM}-data": [("Open the file", "Abrir el archivo"), ("Save", "Guardar")],
        f"{VALID_FAM}-data": [("Close the window", "Cerrar la ventana")],
    }
    return {
        name: build_deb(debs_dir, name, {f"usr/share/locale/es/LC_MESSAGES/{name}.mo": pairs})
        for name, pairs in ranked.items()
    }


@pytest.fixture()
def fake_debian(tmp_path, monkeypatch):
    """Two ranked packages (one in a train family, one in a valid family) and one outside the list, as
    .deb files, with Debian's indexes and apt replaced by the fabricated ones."""
    debs_dir = tmp_path / "debs"
    debs = ranked_debs(debs_dir)
    ranked = list(debs)
    outsider = build_deb(
        debs_dir,
        "newapp",
        {
            "usr/share/locale/es/LC_MESSAGES/newapp.mo": [
                ("Save", "Guardar"),  # in train already
                ("Close the window", "Cierra la ventana"),  # valid's source
                ("Rename the layer", "Renombrar la capa"),
            ]
        },
    )
    package_list = ranked_list(tmp_path, ranked)
    contents = "".join(f"usr/share/locale/es/LC_MESSAGES/{p}.mo utils/{p}\n" for p in [*ranked, "newapp"])
    index = "\n\n".join(f"Package: {p}\nVersion: 1.0\nSize: 100" for p in [*ranked, "newapp"])
    monkeypatch.setattr(corpus, "download_packages", lambda packages, cache: {p: debs[p] for p in debs})
    monkeypatch.setattr(extra, "fetch_contents", lambda cache: {"main/Contents-all.gz": "0" * 64})
    monkeypatch.setattr(extra, "contents_lines", lambda cache: contents.splitlines())
    monkeypatch.setattr(extra, "read_package_index", lambda: parse_package_index(index))
    monkeypatch.setattr(extra, "download", lambda packages, cache: {"newapp": outsider})
    return package_list, debs_dir


def _build(out: Path, package_list: Path, cache: Path, **flags) -> dict:
    return corpus.build(out, package_list, 150, cache, workers=1, dictionaries=False, lang="es", **flags)


def test_default_corpus_is_unchanged_and_the_flag_adds_train_pairs_only(fake_debian, tmp_path, monkeypatch):
    package_list, debs_dir = fake_debian
    plain = _build(tmp_path / "plain", package_list, debs_dir)
    with_extra = _build(tmp_path / "extra", package_list, debs_dir, extra_catalogs=True)
    assert "extra_catalogs" not in plain and "extra-catalogs" not in plain["sources"]
    for name in ("valid", "test"):
        assert with_extra["sha256"][name] == plain["sha256"][name]
    for suffix in ("en", "es", "jsonl"):
        before = (tmp_path / "plain" / f"train.{suffix}").read_text().splitlines()
        after = (tmp_path / "extra" / f"train.{suffix}").read_text().splitlines()
        assert after[: len(before)] == before and len(after) == len(before) + 1
    added = json.loads((tmp_path / "extra" / "train.jsonl").read_text().splitlines()[-1])
    assert (added["source"], added["package"], added["origin"]) == (
        "Rename the layer",
        "newapp",
        "extra-catalogs:newapp.mo",
    )
    record = with_extra["extra_catalogs"]
    assert record["packages"] == ["newapp"] and record["excluded"] == {"ranked package": 2}
    assert (record["already_in_train"], record["source_in_valid_or_test"]) == (1, 1)
    assert record["pairs_added_to_train"] == with_extra["counts"]["train"] - plain["counts"]["train"] == 1

    # The command line without the flag builds the default corpus and never reads the extra sources.
    def no_extra(*args, **kwargs):
        raise AssertionError("the default build read the extra catalogs")

    monkeypatch.setattr(extra, "add_extra_catalogs", no_extra)
    corpus.main(["--out", str(tmp_path / "cli"), "--packages", str(package_list), "--cache", str(debs_dir)])
    cli = json.loads((tmp_path / "cli" / "manifest.json").read_text())
    assert cli["sha256"] == plain["sha256"] and "extra_catalogs" not in cli
