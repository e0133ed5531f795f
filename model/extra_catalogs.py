"""Opt-in training data: the gettext catalogs of Debian 12 packages that are not in the ranked list at all.

The corpus reads the catalogs of the top 150 packages of the ranked list; the packages ranked past 150
are held out everywhere. Debian main has many more packages with catalogs of each language, and this
module adds theirs to the TRAINING split only (``python -m model.corpus --extra-catalogs``), keeping
clear of the held-out material:

  * candidates are the binary packages whose files, in Debian's Contents index for bookworm main
    (checked against the sha256 in apt's signed ``InRelease``), include
    ``usr/share/locale/<catalog dir>/LC_MESSAGES/*.mo`` for the language;
  * excluded: a package of the ranked list (any rank), a package built from the same source package
    as a ranked one (a ``-data`` or ``-l10n`` split of a held-out package), a package of the same
    family as a ranked one (model/corpus.py: ``package_family``, which decides the splits: a ``mate-*``
    package in train would leak the test family ``mate``), and a package shipping a catalog domain
    that a ranked package ships in any language (language packs and copies of ranked catalogs);
  * only ``usr/share/locale/`` catalogs are read: no help pages (``/usr/share/help/``), no package
    descriptions (DDTP's Translation files are never fetched);
  * the pairs are cleaned exactly as the ranked catalogs' pairs; a pair already in train is dropped
    (train's rows, and their package lists, stay as they were) and so is a pair whose normalised source
    occurs in valid or test, so the held-out splits and their novel labels do not change.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from model.corpus import Pair, dedupe, normalised_source, package_family, read_catalog_package
from model.debs import MIRROR, download_packages, fetch_release_file
from model.languages import Language, language, read_package_list

SOURCE_NAME = "extra-catalogs"
CONTENTS_FILES = ("main/Contents-all.gz", "main/Contents-amd64.gz")
DEFAULT_MAX_PACKAGES = 400
DEFAULT_MAX_BYTES = 2_000_000_000  # what one opt-in run may download (cached debs count too)
SUBPROCESS_TIMEOUT_S = 600
# Any gettext catalog path, any language: a ranked package's domains (``gimp20.mo``) wherever they lie.
_ANY_CATALOG = re.compile(r"/LC_MESSAGES/([^/]+)\.mo$")


def locale_pattern(lang: Language) -> re.Pattern[str]:
    """The language's catalogs under ``usr/share/locale/`` only (Contents paths have no leading ``./``)."""
    dirs = "|".join(re.escape(d) for d in lang.catalog_dirs)
    return re.compile(rf"^(?:\./)?usr/share/locale/(?:{dirs})/LC_MESSAGES/[^/]+\.mo$")


# --------------------------------------------------------------------------------------------
# Debian's indexes


def parse_contents(lines: Iterable[str], lang: Language) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """From Contents lines (``path   section/pkg,section/pkg``): per package, its catalogs of `lang` under
    usr/share/locale, and the catalog domains it ships in any language (for the duplicate rule)."""
    wanted = locale_pattern(lang)
    catalogs: dict[str, set[str]] = defaultdict(set)
    domains: dict[str, set[str]] = defaultdict(set)
    for line in lines:
        if "LC_MESSAGES/" not in line:
            continue  # most of the 45 MB: skip them before splitting
        parts = line.rstrip("\n").rsplit(None, 1)
        if len(parts) != 2:
            continue
        path, owners = parts
        domain = _ANY_CATALOG.search(path)
        if domain is None:
            continue
        packages = [owner.rsplit("/", 1)[-1] for owner in owners.split(",")]
        for package in packages:
            domains[package].add(domain.group(1))
            if wanted.match(path):
                catalogs[package].add(path)
    return dict(catalogs), dict(domains)


@dataclass(frozen=True)
class IndexEntry:
    source: str
    version: str
    size: int


def parse_package_index(text: str) -> dict[str, IndexEntry]:
    """``apt-cache dumpavail`` records -> package: (source package, version, .deb size). A record without
    ``Source`` is its own source; ``Source: name (version)`` keeps the name. The first record wins."""
    index: dict[str, IndexEntry] = {}
    for record in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in record.splitlines():
            key, sep, value = line.partition(":")
            if sep and not line[:1].isspace():
                fields[key] = value.strip()
        name = fields.get("Package")
        if not name or name in index:
            continue
        source = fields.get("Source", name).split(" ", 1)[0] or name
        index[name] = IndexEntry(source, fields.get("Version", ""), int(fields.get("Size", "0") or 0))
    return index


def read_package_index() -> dict[str, IndexEntry]:
    result = subprocess.run(
        ["apt-cache", "dumpavail"], capture_output=True, text=True, check=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    return parse_package_index(result.stdout)


def fetch_contents(cache: Path, mirror: str = MIRROR) -> dict[str, str]:
    """Download Contents-all/amd64 of bookworm main into `cache` (once) and check them against apt's
    InRelease, so that the candidates come from Debian's own index. Returns name -> sha256."""
    return {name: fetch_release_file(name, cache, mirror) for name in CONTENTS_FILES}


def contents_lines(cache: Path) -> Iterable[str]:
    for name in CONTENTS_FILES:
        with gzip.open(cache / name.rsplit("/", 1)[1], "rt", encoding="utf-8", errors="replace") as handle:
            yield from handle


# --------------------------------------------------------------------------------------------
# Selection


def ranked_names(package_list: Path, lang: Language) -> list[str]:
    """Every package of the ranked list, any rank (the held-out ones too), named for `lang`."""
    return read_package_list(package_list, 10**9, lang.code)


def select_candidates(
    catalogs: dict[str, set[str]],
    domains: dict[str, set[str]],
    index: dict[str, IndexEntry],
    ranked: Iterable[str],
) -> tuple[list[str], Counter, dict[str, str]]:
    """The packages whose catalogs may be trained on, the exclusion counts, and why each one is out.

    Rules, first match counts: ``ranked package`` (any rank), ``source of a ranked package`` (built from
    the same source package), ``family of a ranked package`` (the corpus's split unit), ``ships a ranked
    catalog domain`` (a translation pack or a copy of a ranked package's catalogs), ``not in the package
    index`` (apt could not fetch it)."""
    ranked = set(ranked)
    # A ranked name apt does not know (or a placeholder spelt for another language) still counts as its
    # own source and family, so the rules err on the side of leaving packages out.
    ranked_sources = {index[p].source if p in index else p for p in ranked}
    ranked_families = {package_family(p) for p in ranked}
    ranked_domains = set().union(*(domains.get(p, set()) for p in ranked))
    reasons: dict[str, str] = {}
    chosen = []
    for package in sorted(catalogs):
        if package in ranked:
            reasons[package] = "ranked package"
        elif package in index and index[package].source in ranked_sources:
            reasons[package] = "source of a ranked package"
        elif package_family(package) in ranked_families:
            reasons[package] = "family of a ranked package"
        elif domains.get(package, set()) & ranked_domains:
            reasons[package] = "ships a ranked catalog domain"
        elif package not in index:
            reasons[package] = "not in the package index"
        else:
            chosen.append(package)
    return chosen, Counter(reasons.values()), reasons


def bounded(
    packages: list[str],
    catalogs: dict[str, set[str]],
    index: dict[str, IndexEntry],
    max_packages: int,
    max_bytes: int,
) -> tuple[list[str], int]:
    """The packages to fetch, most catalogs first (then smallest), within both limits; and their bytes."""
    order = sorted(packages, key=lambda p: (-len(catalogs[p]), index[p].size, p))
    kept, total = [], 0
    for package in order:
        if len(kept) >= max_packages:
            break
        if total + index[package].size > max_bytes:
            continue  # a smaller one may still fit
        kept.append(package)
        total += index[package].size
    return sorted(kept), total


def download(packages: list[str], cache_dir: Path) -> dict[str, Path]:
    """The candidates' packages (model.debs.download_packages), with a summary of what came."""
    found = download_packages(packages, cache_dir, desc="apt-get download (extra)")
    size = sum(deb.stat().st_size for deb in found.values())
    print(
        f"extra catalogs: {len(found)} of {len(packages)} packages in {cache_dir} ({size / 1e6:.0f} MB)",
        file=sys.stderr,
    )
    return found


# --------------------------------------------------------------------------------------------
# Reading and adding


def read_extra_package(job: tuple[str, str, str]) -> tuple[list[Pair], Counter]:
    """(language code, package, deb) -> the package's cleaned pairs and drop reasons; a worker's job."""
    code, package, deb = job
    lang = language(code)
    pairs, dropped, _votes = read_catalog_package(
        package, Path(deb), lang, locale_pattern(lang), origin_prefix=f"{SOURCE_NAME}:"
    )
    return pairs, dropped


def read_packages(
    reader: Callable[[tuple[str, str, str]], tuple[list[Pair], Counter]],
    jobs: list[tuple[str, str, str]],
    workers: int,
    desc: str,
) -> tuple[list[Pair], Counter]:
    """`reader` over (language code, package, deb) jobs in `workers` processes, with progress: all the
    pairs, in job order, and the drop reasons summed."""
    extra: list[Pair] = []
    dropped: Counter = Counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        progress = tqdm(pool.map(reader, jobs), total=len(jobs), desc=desc, unit="pkg")
        for pairs, reasons in progress:
            extra.extend(pairs)
            dropped.update(reasons)
            progress.set_postfix(pairs=len(extra))
    return extra, dropped


def merge_into_train(splits: dict[str, list[Pair]], extra: list[Pair]) -> tuple[dict[str, list[Pair]], dict]:
    """Append the extra pairs to train: deduplicated among themselves, without the pairs train has, and
    without those whose normalised source is in valid or test. Valid and test are returned untouched."""
    train = splits["train"]
    in_train = {(p.source, p.target) for p in train}
    train_sources = {normalised_source(p.source) for p in train}
    held_out = {normalised_source(p.source) for name in ("valid", "test") for p in splits[name]}
    unique = dedupe(extra)
    not_in_train = [p for p in unique if (p.source, p.target) not in in_train]
    kept = [p for p in not_in_train if normalised_source(p.source) not in held_out]
    counts = {
        "pairs_after_cleaning": len(extra),
        "pairs_after_dedupe": len(unique),
        "already_in_train": len(unique) - len(not_in_train),
        "source_in_valid_or_test": len(not_in_train) - len(kept),
        "pairs_added_to_train": len(kept),
        "new_sources": len({normalised_source(p.source) for p in kept} - train_sources),
        "pairs_with_new_source": sum(normalised_source(p.source) not in train_sources for p in kept),
    }
    return {**splits, "train": train + kept}, counts


def choose_packages(
    catalogs: dict[str, set[str]],
    domains: dict[str, set[str]],
    package_list: Path,
    lang: Language,
    max_packages: int,
    max_bytes: int,
    label: str,
) -> tuple[list[str], Counter, list[str]]:
    """The candidates among the packages shipping `catalogs` (``select_candidates``' rules), the exclusion
    counts, and the packages to fetch within the limits (``bounded``), with a summary line."""
    index = read_package_index()
    candidates, excluded, _why = select_candidates(catalogs, domains, index, ranked_names(package_list, lang))
    chosen, planned_bytes = bounded(candidates, catalogs, index, max_packages, max_bytes)
    print(
        f"{label} ({lang.code}): {len(catalogs)} packages ship them, {sum(excluded.values())} "
        f"excluded {dict(excluded)}, {len(candidates)} candidates, fetching {len(chosen)} "
        f"({planned_bytes / 1e6:.0f} MB)",
        file=sys.stderr,
    )
    return candidates, excluded, chosen


def add_extra_catalogs(
    splits: dict[str, list[Pair]],
    lang: Language,
    package_list: Path,
    cache_dir: Path,
    max_packages: int = DEFAULT_MAX_PACKAGES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    workers: int = 2,
) -> tuple[dict[str, list[Pair]], dict]:
    """The whole opt-in step for model/corpus.py: find, fetch, read, clean and merge; and its manifest
    record (sources, rules, exclusion counts, the package list's sha256, pair counts)."""
    contents_cache = cache_dir.parent / "contents"
    contents_sha256 = fetch_contents(contents_cache)
    catalogs, domains = parse_contents(contents_lines(contents_cache), lang)
    candidates, excluded, chosen = choose_packages(
        catalogs, domains, package_list, lang, max_packages, max_bytes, "extra catalogs"
    )
    debs = download(chosen, cache_dir)
    jobs = [(lang.code, p, str(debs[p])) for p in chosen if p in debs]
    extra, dropped = read_packages(read_extra_package, jobs, workers, "reading extra")
    splits, counts = merge_into_train(splits, extra)
    used = sorted(debs)
    record = {
        "source": f"{SOURCE_NAME}: gettext catalogs (usr/share/locale/{{{','.join(lang.catalog_dirs)}}}) of "
        f"Debian 12 main packages outside the ranked list; train only",
        "contents_sha256": contents_sha256,
        "rules": "excluded: ranked package (any rank), same source package as a ranked one, same family "
        "as a ranked one, ships a catalog domain a ranked package ships; pairs already in train or "
        "whose normalised source is in valid/test are dropped",
        "packages_with_catalogs": len(catalogs),
        "excluded": dict(excluded.most_common()),
        "candidates": len(candidates),
        "limits": {"max_packages": max_packages, "max_bytes": max_bytes},
        "packages_fetched": len(used),
        "packages_sha256": hashlib.sha256("\n".join(used).encode()).hexdigest(),
        "packages": used,
        "dropped": dict(dropped.most_common()),
        **counts,
    }
    return splits, record
