"""The opt-in documentation source (model/extra_docs.py): which PO entries count, which pages and source
packages are held out, what reaches train, that a damaged download is refused and that the default corpus
does not change. No network: in-memory tarballs, fabricated Sources/Contents excerpts, file:// URLs."""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import tarfile
from pathlib import Path

import polib
import pytest

from model import corpus
from model import extra_catalogs as extra
from model import extra_docs as docs
from model.corpus import Pair
from model.extra_catalogs import IndexEntry, parse_package_index
from model.extra_docs import (
    HeldOut,
    SourceEntry,
    doc_po_pattern,
    fetch_verified,
    held_out,
    markup_reason,
    page_reason,
    parse_man_contents,
    parse_sources,
    po_pairs,
    read_source_package,
    source_reason,
)
from model.languages import language
from tests.test_corpus import _family_in
from tests.test_extra_catalogs import _build, fake_debian  # noqa: F401 - a fixture

ES = language("es")
VALID_FAM = _family_in("valid")


def po_text(entries: list[polib.POEntry]) -> bytes:
    po = polib.POFile()
    po.metadata = {"Content-Type": "text/plain; charset=UTF-8", "Language": "es"}
    for entry in entries:
        po.append(entry)
    return str(po).encode("utf-8")


def tarball(path: Path, members: dict[str, bytes]) -> Path:
    """A .tar.xz built in memory and written once: what a source package's tarball holds."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue())
    return path


GUIDE_PO = po_text(
    [
        polib.POEntry(msgid="Install the base\nsystem.", msgstr="Instale el sistema\nbase."),
        polib.POEntry(msgid="Boot the installer.", msgstr="Arranque el instalador.", flags=["fuzzy"]),
        polib.POEntry(msgid="Old paragraph.", msgstr="Párrafo antiguo.", obsolete=True),
        polib.POEntry(msgid="Not done yet.", msgstr=""),
        polib.POEntry(msgid="# apt-get install foo", msgstr="# apt-get install foo", flags=["no-wrap"]),
        polib.POEntry(
            msgid="Run <command>apt</command> now.", msgstr="Ejecute <command>apt</command> ahora."
        ),
        polib.POEntry(msgid="Run <command>apt</command> later.", msgstr="Ejecute apt más tarde."),
        polib.POEntry(msgid="Use \\fBls\\fR to list.", msgstr="Use \\fBls\\fR para listar."),
        polib.POEntry(msgid="See B<dpkg>(1) E<lt>here.", msgstr="Vea B<dpkg>(1) E<lt>aquí."),
        polib.POEntry(
            msgid="one file", msgid_plural="%d files", msgstr_plural={0: "un archivo", 1: "%d archivos"}
        ),
    ]
)


def test_po_entries_skip_fuzzy_obsolete_untranslated_header_and_markup():
    pairs, dropped = po_pairs(GUIDE_PO, "installation-guide", "1", "extra-docs:installation-guide:po/es/x.po")
    assert [(p.source, p.target) for p in pairs] == [
        ("Install the base system.", "Instale el sistema base."),  # line breaks are filled text
        ("Run <command>apt</command> now.", "Ejecute <command>apt</command> ahora."),
        ("one file", "un archivo"),  # a plural entry gives its singular only
    ]
    assert pairs[0].origin == "extra-docs:installation-guide:po/es/x.po"
    assert pairs[0].package == "installation-guide"
    assert dropped == {
        "fuzzy": 1,
        "obsolete": 1,
        "untranslated": 1,
        "verbatim block": 1,
        "markup differs": 1,
        "roff escape": 1,
        "POD markup": 1,
    }


def test_markup_rules():
    assert markup_reason("<a>x</a> &debian;", "&debian; <a>y</a>") is None  # order may change
    assert markup_reason("Use &debian;.", "Use Debian.") == "markup differs"
    assert markup_reason("a \\- b", "a \\- b") == "roff escape"


def test_doc_po_pattern_reads_documentation_only():
    guide = doc_po_pattern(("po",), ES)
    assert guide.match("installation-guide-1/po/es/install.po")
    assert guide.match("debian-reference-2.100/po/es.po")
    assert not guide.match("installation-guide-1/po/fr/install.po")
    assert not guide.match("installation-guide-1/po/es/install.pot")
    man = doc_po_pattern(("man/po",), ES)
    assert man.match("dpkg-1.21/man/po/es.po")
    assert not man.match("dpkg-1.21/po/es.po")  # the program's own messages are no documentation
    assert not man.match("dpkg-1.21/debian/po/es.po")  # nor are debconf templates
    assert doc_po_pattern(("",), ES).match("debian-handbook-11/es-ES/book.po")  # publican's spelling


def test_po_files_come_out_of_an_in_memory_tarball(tmp_path, monkeypatch):
    path = tarball(
        tmp_path / "guide_1.tar.xz",
        {
            "guide-1/po/es/install.po": GUIDE_PO,
            "guide-1/po/fr/install.po": GUIDE_PO,
            "guide-1/po/es.pot": GUIDE_PO,
            "guide-1/help/es/es.po": GUIDE_PO,
        },
    )
    entry = SourceEntry("1", "pool/main/g/guide", (("guide_1.tar.xz", 1, "0"),), ("guide",))
    monkeypatch.setitem(docs.DOC_SOURCES, "guide", ("po",))
    pairs, dropped, excluded, read = read_source_package("guide", entry, [path], ES)
    assert read == 1 and not excluded
    assert {p.origin for p in pairs} == {"extra-docs:guide:po/es/install.po"}
    assert len(pairs) == 3 and dropped["fuzzy"] == 1


SOURCES = """\
Package: installation-guide
Binary: installation-guide-amd64, installation-guide-arm64
Version: 20230508
Directory: pool/main/i/installation-guide
Checksums-Sha256:
 aaaa 2875 installation-guide_20230508.dsc
 bbbb 4157020 installation-guide_20230508.tar.xz

Package: manpages-l10n
Binary: manpages-es,
 manpages-fr
Version: 4.18.1-1
Directory: pool/main/m/manpages-l10n
Checksums-Sha256:
 cccc 3713 manpages-l10n_4.18.1-1.dsc
 dddd 151397532 manpages-l10n_4.18.1.orig.tar.gz

Package: ignored
Version: 1
"""


def test_sources_records():
    found = parse_sources(SOURCES, ["installation-guide", "manpages-l10n", "absent"])
    assert set(found) == {"installation-guide", "manpages-l10n"}
    assert found["manpages-l10n"].binaries == ("manpages-es", "manpages-fr")
    assert found["installation-guide"].files[1] == ("installation-guide_20230508.tar.xz", 4157020, "bbbb")
    assert found["installation-guide"].directory == "pool/main/i/installation-guide"


CONTENTS = f"""\
usr/share/man/man1/ls.1.gz                          utils/coreutils
usr/share/man/man1/heldout.1.gz                     utils/heldout
usr/share/man/man1/heldout-helper.1.gz              utils/heldout-helper
usr/share/man/man8/{VALID_FAM}-tool.8.gz            admin/{VALID_FAM}-tool
usr/share/man/man1/both.1.gz                        utils/coreutils,utils/heldout
usr/share/man/es/man1/ls.1.gz                       doc/manpages-es
usr/share/doc/coreutils/README                      utils/coreutils
"""

INDEX = {
    "coreutils": IndexEntry("coreutils", "9.1", 1),
    "heldout": IndexEntry("heldout", "1", 1),
    "heldout-helper": IndexEntry("heldout-src", "1", 1),
    "otherbin": IndexEntry("heldout-src", "1", 1),
}


def _held(valid_family: str = VALID_FAM) -> HeldOut:
    ranked = ["coreutils", *(f"filler{i}" for i in range(149)), "heldout", "otherbin"]
    splits = {"train": [], "valid": [Pair("a", "b", f"{valid_family}-data", "1", "x")], "test": []}
    return held_out(ranked, 150, INDEX, splits)


def test_man_pages_map_to_packages_and_held_out_pages_are_dropped():
    pages = parse_man_contents(CONTENTS.splitlines())
    assert pages["man1/ls.1"] == {"coreutils"} and "man1/es" not in str(pages)  # English pages only
    held = _held()
    assert held.names == {"heldout", "otherbin"} and held.sources == {"heldout", "heldout-src"}
    reason = lambda name: page_reason(f"po/es/{name}.po", pages, INDEX, held)  # noqa: E731
    assert reason("man1/ls.1") is None  # coreutils is ranked first: its page may be trained on
    assert reason("man1/heldout.1") == "ranked past the top"
    assert reason("man1/heldout-helper.1") == "source of a package ranked past the top"
    assert reason(f"man8/{VALID_FAM}-tool.8") == "family of valid/test"
    assert reason("man1/both.1") == "ranked past the top"  # any package shipping the page counts
    assert reason("man1/nowhere.1") == "page in no package"


def test_a_source_package_of_a_held_out_family_is_excluded():
    held = _held()
    entry = SourceEntry("1", "d", (), ("heldout-doc",))
    assert source_reason("docsrc", entry, held) == "family of a package ranked past the top"
    entry = SourceEntry("1", "d", (), (f"{VALID_FAM}-manual",))
    assert source_reason("manual", entry, held) == "family of valid/test"
    assert (
        source_reason("installation-guide", SourceEntry("1", "d", (), ("installation-guide-amd64",)), held)
        is None
    )


def test_manpages_tarball_pages_are_filtered_and_counted(tmp_path):
    page = po_text([polib.POEntry(msgid="List directory contents.", msgstr="Lista el contenido.")])
    path = tarball(
        tmp_path / "manpages-l10n_4.18.1.orig.tar.gz",
        {
            "manpages-l10n-4.18.1/po/es/man1/ls.1.po": page,
            "manpages-l10n-4.18.1/po/es/man1/heldout.1.po": page,
            "manpages-l10n-4.18.1/po/es/man1/nowhere.1.po": page,
        },
    )
    pages, held = parse_man_contents(CONTENTS.splitlines()), _held()
    entry = SourceEntry("4.18.1-1", "d", (), ("manpages-es",))
    pairs, _dropped, excluded, read = read_source_package(
        "manpages-l10n", entry, [path], ES, lambda p: page_reason(p, pages, INDEX, held)
    )
    assert read == 1 and excluded == {"ranked past the top": 1, "page in no package": 1}
    assert [(p.source, p.origin) for p in pairs] == [
        ("List directory contents.", "extra-docs:manpages-l10n:po/es/man1/ls.1.po")
    ]


def test_a_download_whose_sha256_differs_is_refused(tmp_path):
    served = tmp_path / "mirror" / "guide_1.tar.xz"
    served.parent.mkdir()
    served.write_bytes(b"the real tarball")
    good = hashlib.sha256(b"the real tarball").hexdigest()
    cache = tmp_path / "cache"
    cache.mkdir()
    assert fetch_verified(served.as_uri(), cache / "guide_1.tar.xz", good).read_bytes() == b"the real tarball"
    (cache / "guide_1.tar.xz").write_bytes(b"tampered")  # a damaged cached copy
    with pytest.raises(RuntimeError, match="sha256"):
        fetch_verified(served.as_uri(), cache / "guide_1.tar.xz", good)
    assert not (cache / "guide_1.tar.xz").exists()  # deleted, so that the next run fetches it again
    with pytest.raises(RuntimeError, match="sha256"):
        fetch_verified(served.as_uri(), cache / "other.tar.xz", "0" * 64)


def test_the_sources_index_is_checked_against_inrelease(tmp_path, monkeypatch):
    text = SOURCES.encode()
    mirror = tmp_path / "mirror" / "dists" / "bookworm" / "main" / "source"
    mirror.mkdir(parents=True)
    (mirror / "Sources.xz").write_bytes(lzma.compress(text))
    digest = hashlib.sha256((mirror / "Sources.xz").read_bytes()).hexdigest()
    lists = tmp_path / "lists"
    lists.mkdir()
    release = lists / "deb.debian.org_debian_dists_bookworm_InRelease"
    monkeypatch.setattr("model.debs.APT_LISTS", lists)
    release.write_text(f"SHA256:\n {'f' * 64} 10 main/source/Sources.xz\n")
    with pytest.raises(RuntimeError, match="InRelease"):
        docs.read_sources(tmp_path / "c1", ["manpages-l10n"], (tmp_path / "mirror").as_uri())
    release.write_text(f"SHA256:\n {digest} 10 main/source/Sources.xz\n")
    found, sha = docs.read_sources(tmp_path / "c2", ["manpages-l10n"], (tmp_path / "mirror").as_uri())
    assert sha == digest and list(found) == ["manpages-l10n"]


@pytest.fixture()
def docs_debian(fake_debian, tmp_path, monkeypatch):  # noqa: F811 - the imported fixture
    """test_extra_catalogs' ranked packages (one in a train family, one in a valid family, as .deb files)
    and one documentation source package as a tarball, with Debian's indexes replaced by fabricated ones."""
    guide = tarball(
        tmp_path / "guide_1.tar.xz",
        {
            "guide-1/po/es/a.po": po_text(
                [
                    polib.POEntry(msgid="Save", msgstr="Guardar"),  # in train already
                    polib.POEntry(msgid="Close the window.", msgstr="Cierre la ventana."),  # valid's source
                    polib.POEntry(msgid="Partition the disk.", msgstr="Particione el disco."),
                ]
            )
        },
    )
    entry = SourceEntry("1", "pool/main/g/guide", (("guide_1.tar.xz", 1, "0"),), ("guide",))
    monkeypatch.setitem(docs.DOC_SOURCES, "guide", ("po",))
    monkeypatch.setattr(docs, "read_sources", lambda cache, wanted: ({"guide": entry}, "1" * 64))
    monkeypatch.setattr(docs, "read_package_index", lambda: parse_package_index(""))
    monkeypatch.setattr(docs, "download_sources", lambda entries, cache, cap: ({"guide": [guide]}, {}))
    return fake_debian


def _train(out: Path) -> list[tuple[str, ...]]:
    """The train split's rows: (English, Spanish, provenance) a line."""
    files = [(out / f"train.{suffix}").read_text().splitlines() for suffix in ("en", "es", "jsonl")]
    return list(zip(*files, strict=True))


def test_default_corpus_is_unchanged_and_the_flag_adds_train_pairs_only(docs_debian, tmp_path, monkeypatch):
    package_list, debs_dir = docs_debian
    plain = _build(tmp_path / "plain", package_list, debs_dir)
    with_docs = _build(tmp_path / "docs", package_list, debs_dir, extra_docs=True)
    assert "extra_docs" not in plain and "extra-docs" not in plain["sources"]
    assert [with_docs["sha256"][s] for s in ("valid", "test")] == [
        plain["sha256"][s] for s in ("valid", "test")
    ]
    before, after = _train(tmp_path / "plain"), _train(tmp_path / "docs")
    assert after[:-1] == before  # train's own rows stay as they were, the new pair comes last
    added = json.loads(after[-1][2])
    assert (added["source"], added["package"], added["origin"]) == (
        "Partition the disk.",
        "guide",
        "extra-docs:guide:po/es/a.po",
    )
    record = with_docs["extra_docs"]
    assert (record["already_in_train"], record["source_in_valid_or_test"]) == (1, 1)
    assert record["per_source"]["guide"]["pairs_added_to_train"] == 1
    assert record["pairs_added_to_train"] == with_docs["counts"]["train"] - plain["counts"]["train"] == 1

    # The command line without the flag builds the default corpus and never reads the documentation.
    def no_docs(*args, **kwargs):
        raise AssertionError("the default build read the documentation")

    monkeypatch.setattr(docs, "add_extra_docs", no_docs)
    monkeypatch.setattr(extra, "add_extra_catalogs", no_docs)
    corpus.main(["--out", str(tmp_path / "cli"), "--packages", str(package_list), "--cache", str(debs_dir)])
    cli = json.loads((tmp_path / "cli" / "manifest.json").read_text())
    assert cli["sha256"] == plain["sha256"] and "extra_docs" not in cli
