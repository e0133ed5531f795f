"""Opt-in training data: Debian's translated documentation, read from the PO files of source packages.

Debian translates much of its documentation with po4a, publican or Sphinx: manuals (debian-reference,
maint-guide, developers-reference, debian-handbook, the installation guide), the manual pages of
manpages-l10n (one PO file per page) and of single programs (dpkg, debconf, util-linux, ...). Those PO
files pair each English paragraph with its human translation. This module adds them to the TRAINING
split only (``python -m model.corpus --extra-docs``), as model/extra_catalogs.py does for catalogs:

  * the source packages' files come from bookworm's ``Sources.xz`` (checked against the sha256 in apt's
    signed ``InRelease``); each download is checked against the sha256 ``Sources`` gives, and the PO
    files are read straight out of the tarballs (nothing is extracted to disk);
  * held out, as in the rest of the corpus: a source package one of whose binaries is ranked past
    `top` in the ranked list, shares its source or family with such a package, or belongs to a family of
    the target corpus's valid or test split; for manpages-l10n each page is judged by the binary
    package that ships the English page in bookworm (Debian's Contents index), and a page that maps to
    no package is dropped;
  * only documentation PO files are read (``DOC_SOURCES`` names their directory per package): never
    program catalogs, debconf templates, package descriptions (DDTP) or GNOME/Mallard help;
  * fuzzy, obsolete and untranslated entries and PO headers are skipped; a plural entry gives its
    singular only. Documentation is filled text, so line breaks become spaces, and verbatim blocks
    (po4a's ``no-wrap`` entries: screens, program listings) are dropped. Markup is kept only where the
    service can protect it: tags and entities (runtime/tokenizer.py's placeholders) must be the same on
    both sides; roff escapes (``\\fB``) and POD codes (``B<...>``, ``E<lt>``) are dropped. Then pairs are
    cleaned exactly as catalog pairs (model/corpus.py's ``clean_pair``, so its 250-character limit too)
    and merged with model/extra_catalogs.py's ``merge_into_train``: pairs already in train and pairs
    whose normalised source occurs in valid or test are dropped.
"""

from __future__ import annotations

import lzma
import re
import sys
import tarfile
import urllib.error
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import polib
from tqdm import tqdm

from model.corpus import Pair, clean_pair, package_family
from model.debs import MIRROR, download_once, fetch_release_file
from model.extra_catalogs import (
    IndexEntry,
    contents_lines,
    fetch_contents,
    merge_into_train,
    ranked_names,
    read_package_index,
)
from model.languages import Language
from runtime.bundle import sha256_file
from runtime.tokenizer import PLACEHOLDER_PATTERN

SOURCE_NAME = "extra-docs"
SOURCES_INDEX = "main/source/Sources.xz"
DEFAULT_MAX_BYTES = 1_500_000_000  # what one opt-in run may download (cached files count too)
DOWNLOAD_TIMEOUT_S = 600
PER_PAGE_SOURCE = "manpages-l10n"  # a translation project: each page is judged by the package it documents
# Where each source package keeps its documentation PO files, relative to the top directory of its
# tarballs: ``<dir>/<lang>.po`` or ``<dir>/<lang>/**.po`` ("" = the top directory itself).
DOC_SOURCES: dict[str, tuple[str, ...]] = {
    "manpages-l10n": ("po",),
    "debian-reference": ("po",),
    "maint-guide": ("po4a/po", "po"),
    "developers-reference": ("source/locales", "po"),
    "debian-handbook": ("",),
    "installation-guide": ("po",),
    "dpkg": ("man/po",),
    "debconf": ("doc/man/po4a/po",),
    "debhelper": ("man/po4a/po",),
    "util-linux": ("po-man",),
    "aptitude": ("doc/po4a/po",),
    "apt": ("doc/po",),
    "man-db": ("man/po4a/po",),
}
_ROFF_ESCAPE = re.compile(r"\\[fe(*&\-|^%0sn]")
_POD_CODE = re.compile(r"\b[BCEFILSXZ]<")
_MAN_PAGE = re.compile(r"^(?:\./)?usr/share/man/(man\w+)/([^/]+)\.gz$")


def doc_po_pattern(roots: Iterable[str], lang: Language) -> re.Pattern[str]:
    """A tarball member under `roots` that is the language's PO file or lies in its language directory.
    publican spells the language ``es-ES``, po4a and Sphinx ``es``/``es_ES``/``pt_BR``."""
    spellings = {d for d in lang.catalog_dirs} | {d.replace("_", "-") for d in lang.catalog_dirs}
    codes = "|".join(re.escape(s) for s in sorted(spellings))
    dirs = "|".join(re.escape(r + "/") if r else "" for r in roots)
    return re.compile(rf"^[^/]+/(?:{dirs})(?:{codes})(?:\.po|/(?:[^/]+/)*[^/]+\.po)$")


# --------------------------------------------------------------------------------------------
# Sources index and downloads


@dataclass(frozen=True)
class SourceEntry:
    version: str
    directory: str
    files: tuple[tuple[str, int, str], ...]  # (name, size, sha256)
    binaries: tuple[str, ...]


def parse_sources(text: str, wanted: Iterable[str]) -> dict[str, SourceEntry]:
    """``Sources`` records of the `wanted` source packages (the first record of a name wins)."""
    wanted = set(wanted)
    found: dict[str, SourceEntry] = {}
    for record in text.split("\n\n"):
        fields: dict[str, list[str]] = {}
        key = ""
        for line in record.splitlines():
            if line[:1].isspace() and key:
                fields[key].append(line.strip())
            else:
                key, _, value = line.partition(":")
                fields[key] = [value.strip()] if value.strip() else []
        name = " ".join(fields.get("Package", []))
        if name not in wanted or name in found:
            continue
        files = tuple(
            (parts[2], int(parts[1]), parts[0])
            for line in fields.get("Checksums-Sha256", [])
            if len(parts := line.split()) == 3
        )
        binaries = tuple(b.strip() for b in " ".join(fields.get("Binary", [])).split(",") if b.strip())
        found[name] = SourceEntry(
            " ".join(fields.get("Version", [])), " ".join(fields.get("Directory", [])), files, binaries
        )
    return found


def read_sources(
    cache: Path, wanted: Iterable[str], mirror: str = MIRROR
) -> tuple[dict[str, SourceEntry], str]:
    """bookworm main's Sources (checked against InRelease) -> the wanted packages' records, its sha256."""
    digest = fetch_release_file(SOURCES_INDEX, cache, mirror)
    with lzma.open(
        cache / SOURCES_INDEX.rsplit("/", 1)[-1], "rt", encoding="utf-8", errors="replace"
    ) as handle:
        return parse_sources(handle.read(), wanted), digest


def fetch_verified(url: str, path: Path, sha256: str) -> Path:
    """`url` into `path` (unless cached), refused unless its sha256 is the one Sources gives: a damaged or
    substituted file is deleted and the run stops. An HTTP error (the mirror lacks it) propagates."""
    download_once(url, path, DOWNLOAD_TIMEOUT_S)
    digest = sha256_file(path)
    if digest != sha256:
        path.unlink()
        raise RuntimeError(f"{path.name}: sha256 {digest} is not the {sha256} that Sources gives")
    return path


def download_sources(
    entries: dict[str, SourceEntry], cache: Path, max_bytes: int, mirror: str = MIRROR
) -> tuple[dict[str, list[Path]], dict[str, str]]:
    """Every file of each source package (.dsc and tarballs), in DOC_SOURCES order, within `max_bytes`.
    Returns the packages' files and, for those left out, why (over the cap, the mirror lacks a file)."""
    cache.mkdir(parents=True, exist_ok=True)
    fetched: dict[str, list[Path]] = {}
    missing: dict[str, str] = {}
    total = 0
    for name in tqdm(list(entries), desc="source packages", unit="pkg"):
        entry = entries[name]
        size = sum(s for _, s, _ in entry.files)
        if total + size > max_bytes:
            missing[name] = "over the size cap"
            continue
        try:
            fetched[name] = [
                fetch_verified(f"{mirror}/{entry.directory}/{file}", cache / file, sha256)
                for file, _, sha256 in entry.files
            ]
            total += size
        except urllib.error.HTTPError as error:
            missing[name] = f"not on the mirror (HTTP {error.code})"
    return fetched, missing


def tarball_members(path: Path, wanted: re.Pattern[str]) -> Iterator[tuple[str, bytes]]:
    """(member name, content) of the regular files matching `wanted`, streamed out of a tarball."""
    with tarfile.open(path, mode="r|*") as archive:
        for member in archive:
            if member.isfile() and wanted.match(member.name):
                handle = archive.extractfile(member)
                if handle is not None:
                    yield member.name, handle.read()


# --------------------------------------------------------------------------------------------
# Held-out material


@dataclass(frozen=True)
class HeldOut:
    names: frozenset[str]  # ranked past `top`
    sources: frozenset[str]  # their source packages
    families: frozenset[str]  # their families
    split_families: frozenset[str]  # the families of the target corpus's valid and test splits


def held_out(
    ranked: list[str], top: int, index: dict[str, IndexEntry], splits: dict[str, list[Pair]]
) -> HeldOut:
    names = frozenset(ranked[top:])
    return HeldOut(
        names,
        frozenset(index[p].source if p in index else p for p in names),
        frozenset(package_family(p) for p in names),
        frozenset(package_family(p.package) for split in ("valid", "test") for p in splits[split]),
    )


def held_out_reason(package: str, source: str, held: HeldOut) -> str | None:
    """Why a binary package (built from `source`) is held-out material, or None."""
    if package in held.names:
        return "ranked past the top"
    if source in held.sources or package in held.sources:
        return "source of a package ranked past the top"
    if package_family(package) in held.families:
        return "family of a package ranked past the top"
    if package_family(package) in held.split_families:
        return "family of valid/test"
    return None


def source_reason(name: str, entry: SourceEntry, held: HeldOut) -> str | None:
    """A documentation source package is held out when it or any of its binaries is."""
    for package in (name, *entry.binaries):
        if reason := held_out_reason(package, name, held):
            return reason
    return None


def parse_man_contents(lines: Iterable[str]) -> dict[str, set[str]]:
    """Contents lines -> ``man1/ls.1`` (English pages only, under usr/share/man/manN) -> its packages."""
    pages: dict[str, set[str]] = defaultdict(set)
    for line in lines:
        if not line.startswith(("usr/share/man/man", "./usr/share/man/man")):
            continue  # most of the index: skip before splitting
        parts = line.rstrip("\n").rsplit(None, 1)
        if len(parts) == 2 and (match := _MAN_PAGE.match(parts[0])):
            page = f"{match.group(1)}/{match.group(2)}"
            pages[page].update(owner.rsplit("/", 1)[-1] for owner in parts[1].split(","))
    return dict(pages)


def page_reason(
    po_path: str, man_pages: dict[str, set[str]], index: dict[str, IndexEntry], held: HeldOut
) -> str | None:
    """A manpages-l10n PO file (``.../po/es/man1/ls.1.po``) is dropped when its page maps to no package
    or any package shipping the English page is held out."""
    section, name = po_path.rsplit("/", 2)[-2:]
    owners = man_pages.get(f"{section}/{name.removesuffix('.po')}")
    if not owners:
        return "page in no package"
    for package in sorted(owners):
        source = index[package].source if package in index else package
        if reason := held_out_reason(package, source, held):
            return reason
    return None


# --------------------------------------------------------------------------------------------
# PO files


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        match = re.search(rb"charset=([\w.-]+)", data)
        return data.decode(match.group(1).decode() if match else "latin-1", "replace")


def markup_reason(source: str, target: str) -> str | None:
    """Roff escapes and POD codes are dropped (the service cannot protect them); tags and entities must
    be the same on both sides."""
    if _ROFF_ESCAPE.search(source) or _ROFF_ESCAPE.search(target):
        return "roff escape"
    if _POD_CODE.search(source) or _POD_CODE.search(target):
        return "POD markup"
    if sorted(PLACEHOLDER_PATTERN.findall(source)) != sorted(PLACEHOLDER_PATTERN.findall(target)):
        return "markup differs"
    return None


def po_pairs(data: bytes, package: str, version: str, origin: str) -> tuple[list[Pair], Counter]:
    """A documentation PO file's cleaned pairs and why the others were dropped."""
    pairs, dropped = [], Counter()
    try:
        po = polib.pofile(_decode(data))
    except (OSError, ValueError):
        dropped["unreadable PO file"] += 1
        return pairs, dropped
    for entry in po:
        if entry.obsolete:
            dropped["obsolete"] += 1
        elif "fuzzy" in entry.flags:
            dropped["fuzzy"] += 1
        elif not entry.msgid:
            continue  # a header that polib did not take as the metadata
        elif not (entry.msgstr_plural.get(0) if entry.msgid_plural else entry.msgstr):
            dropped["untranslated"] += 1
        elif "no-wrap" in entry.flags:
            dropped["verbatim block"] += 1
        else:
            translation = entry.msgstr_plural[0] if entry.msgid_plural else entry.msgstr
            source, target = " ".join(entry.msgid.split()), " ".join(translation.split())
            reason = markup_reason(source, target)
            cleaned = reason or clean_pair(source, target)
            if isinstance(cleaned, str):
                dropped[cleaned] += 1
            else:
                pairs.append(Pair(cleaned[0], cleaned[1], package, version, origin))
    return pairs, dropped


def read_source_package(
    name: str,
    entry: SourceEntry,
    files: list[Path],
    lang: Language,
    page_filter: Callable[[str], str | None] | None = None,
) -> tuple[list[Pair], Counter, Counter, int]:
    """The pairs of one source package's documentation PO files, the drop reasons, the pages
    `page_filter` excluded (by reason) and how many PO files were read."""
    wanted = doc_po_pattern(DOC_SOURCES[name], lang)
    pairs: list[Pair] = []
    dropped, excluded = Counter(), Counter()
    read = 0
    for tarball in (f for f in files if ".tar." in f.name and not f.name.endswith(".asc")):
        for member, data in tarball_members(tarball, wanted):
            path = member.split("/", 1)[1]
            if page_filter is not None and (reason := page_filter(path)):
                excluded[reason] += 1
                continue
            found, reasons = po_pairs(data, name, entry.version, f"{SOURCE_NAME}:{name}:{path}")
            pairs.extend(found)
            dropped.update(reasons)
            read += 1
    return pairs, dropped, excluded, read


# --------------------------------------------------------------------------------------------
# The opt-in step


def add_extra_docs(
    splits: dict[str, list[Pair]],
    lang: Language,
    package_list: Path,
    top: int,
    cache_dir: Path,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[dict[str, list[Pair]], dict]:
    """The whole opt-in step for model/corpus.py: find, fetch, read, clean and merge; and its manifest
    record. `cache_dir` is the corpus's package cache: sources go beside it (``../sources``)."""
    sources_cache, contents_cache = cache_dir.parent / "sources", cache_dir.parent / "contents"
    entries, sources_sha256 = read_sources(sources_cache, DOC_SOURCES)
    entries = {name: entries[name] for name in DOC_SOURCES if name in entries}
    index = read_package_index()
    held = held_out(ranked_names(package_list, lang), top, index, splits)
    reasons = {name: r for name, entry in entries.items() if (r := source_reason(name, entry, held))}
    files, missing = download_sources(
        {n: e for n, e in entries.items() if n not in reasons}, sources_cache, max_bytes
    )
    contents_sha256: dict[str, str] = {}
    man_pages: dict[str, set[str]] = {}
    if PER_PAGE_SOURCE in files:
        # The Contents index is only needed to map manpages-l10n's pages to the packages they document.
        contents_sha256 = fetch_contents(contents_cache)
        man_pages = parse_man_contents(contents_lines(contents_cache))
    extra: list[Pair] = []
    dropped: Counter = Counter()
    per_source: dict[str, dict] = {}
    for name in tqdm(list(files), desc=f"reading docs ({lang.code})", unit="pkg"):
        page_filter = (
            (lambda path: page_reason(path, man_pages, index, held)) if name == PER_PAGE_SOURCE else None
        )
        pairs, reasons_dropped, excluded, read = read_source_package(
            name, entries[name], files[name], lang, page_filter
        )
        extra.extend(pairs)
        dropped.update(reasons_dropped)
        per_source[name] = {
            "version": entries[name].version,
            "po_files": read,
            "pairs_after_cleaning": len(pairs),
        }
        if excluded:
            per_source[name]["excluded_pages"] = dict(excluded.most_common())
    splits, counts = merge_into_train(splits, extra)
    added = Counter(
        p.package for p in splits["train"][len(splits["train"]) - counts["pairs_added_to_train"] :]
    )
    for name, record in per_source.items():
        record["pairs_added_to_train"] = added.get(name, 0)
    record = {
        "source": f"{SOURCE_NAME}: documentation PO files (po4a, publican, Sphinx) of Debian 12 source "
        "packages; train only",
        "sources_sha256": {SOURCES_INDEX: sources_sha256},
        "contents_sha256": contents_sha256,
        "files_sha256": {
            p.name: sha for n in files for p, (_, _, sha) in zip(files[n], entries[n].files, strict=True)
        },
        "rules": f"held out: a source package (or, for {PER_PAGE_SOURCE}, the package shipping the English "
        f"page) ranked past {top}, sharing a source or family with one, or of a valid/test family; pages in "
        "no package are dropped; fuzzy, obsolete, untranslated and verbatim entries are skipped; roff "
        "escapes and POD codes dropped, tags and entities must match; pairs already in train or whose "
        "normalised source is in valid/test are dropped",
        "excluded_sources": reasons,
        "unavailable_sources": missing,
        "not_in_sources_index": sorted(set(DOC_SOURCES) - set(entries)),
        "limits": {"max_bytes": max_bytes},
        "per_source": per_source,
        "dropped": dict(dropped.most_common()),
        **counts,
    }
    print(
        f"extra docs ({lang.code}): {len(files)} source packages read, {len(reasons)} held out, "
        f"{len(missing)} unavailable; {counts['pairs_added_to_train']} pairs added to train",
        file=sys.stderr,
    )
    return splits, record
