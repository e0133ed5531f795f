"""Opt-in training data: the Qt translation catalogs (``.qm``) of Debian 12 packages outside the ranked list.

Qt programs (LXQt, Jami, MuseScore, Shotcut, Stellarium, ...) do not ship gettext catalogs but Qt's
compiled ``.qm`` files, and the ranked list counts gettext catalogs only, so none of these packages is in
it. A ``.qm`` file holds each message's English source text beside its translation (unless ``lrelease``
stripped the sources, as GCompris does: such a file is skipped). This module adds their pairs to the
TRAINING split only (``python -m model.corpus --extra-qt``), under the rules model/extra_catalogs.py keeps
for gettext catalogs:

  * candidates are the binary packages whose files, in Debian's Contents index for bookworm main
    (checked against apt's signed ``InRelease``), include a ``.qm`` file of the language under
    ``usr/share/``: named ``<lang>.qm`` or ``<anything>[_.-]<lang>.qm`` for one of the language's
    catalog directories (``es``, ``es_ES``; ``pt_BR``), so regional variants (``es_MX``) are left out as
    they are for gettext;
  * excluded exactly as for extra catalogs (``extra_catalogs.select_candidates``): a ranked package (any
    rank), one built from the same source package as a ranked one, one of the same family as a ranked
    one (which keeps the valid and test families out), one shipping a gettext domain a ranked package
    ships;
  * plural (numerus) messages are skipped, since a ``.qm`` file keeps only the one source text for all
    forms; the rest are cleaned as catalog pairs (model/corpus.py's ``clean_pair``: accelerators,
    whitespace, credits, length) and merged with ``extra_catalogs.merge_into_train``: pairs already in
    train and pairs whose normalised source occurs in valid or test are dropped.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

from model.corpus import Pair, clean_pair
from model.debs import deb_version, download_packages, iter_deb_members
from model.extra_catalogs import (
    choose_packages,
    contents_lines,
    fetch_contents,
    merge_into_train,
    parse_contents,
    read_packages,
)
from model.languages import Language, language

SOURCE_NAME = "extra-qt"
DEFAULT_MAX_PACKAGES = 400
DEFAULT_MAX_BYTES = 1_500_000_000  # what one opt-in run may download (cached debs count too)


def qm_pattern(lang: Language) -> re.Pattern[str]:
    """The language's Qt catalogs under ``usr/share/`` (Contents paths have no leading ``./``)."""
    codes = "|".join(re.escape(d) for d in lang.catalog_dirs)
    return re.compile(rf"^(?:\./)?usr/share/(?:[^/]+/)*(?:[^/]*[_.-])?(?:{codes})\.qm$")


def parse_qm_contents(lines: Iterable[str], lang: Language) -> dict[str, set[str]]:
    """From Contents lines (``path   section/pkg,section/pkg``): per package, its Qt catalogs of `lang`."""
    wanted = qm_pattern(lang)
    catalogs: dict[str, set[str]] = defaultdict(set)
    for line in lines:
        if ".qm" not in line:
            continue
        parts = line.rstrip("\n").rsplit(None, 1)
        if len(parts) != 2 or not wanted.match(parts[0]):
            continue
        for owner in parts[1].split(","):
            catalogs[owner.rsplit("/", 1)[-1]].add(parts[0])
    return dict(catalogs)


def source_text(raw: str) -> str:
    """translate-toolkit decodes a ``.qm`` source text as Latin-1; lrelease writes UTF-8 (Qt 5 and 6), so
    the bytes are decoded again as UTF-8 when they are valid UTF-8."""
    data = raw.encode("iso-8859-1", errors="replace")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def qm_messages(data: bytes) -> Iterator[tuple[str, list[str]]]:
    """(source, translations) of one ``.qm`` file; ValueError when it is unreadable or has no sources."""
    from translate.storage import qm  # translate-toolkit; only this opt-in step needs it

    with contextlib.redirect_stdout(io.StringIO()):  # the parser prints sections it does not know
        store = qm.qmfile.parsestring(data)
    for unit in store.units:
        target = unit.target
        forms = list(getattr(target, "strings", [target])) if target is not None else []
        yield source_text(str(unit.source)), [str(f) for f in forms]


def read_qm_package(job: tuple[str, str, str]) -> tuple[list[Pair], Counter]:
    """(language code, package, deb) -> the package's cleaned pairs and drop reasons; a worker's job."""
    code, package, deb = job
    lang = language(code)
    version = deb_version(Path(deb))
    pairs: list[Pair] = []
    dropped: Counter = Counter()
    for path, data in iter_deb_members(Path(deb), qm_pattern(lang)):
        try:
            messages = list(qm_messages(data))
        except (ValueError, UnicodeDecodeError) as error:
            dropped["no source texts" if "no source" in str(error) else "unreadable catalog"] += 1
            continue
        origin = f"{SOURCE_NAME}:{Path(path).name}"
        for source, forms in messages:
            if len(forms) != 1:
                dropped["plural" if forms else "empty"] += 1
                continue
            cleaned = clean_pair(source, forms[0])
            if isinstance(cleaned, str):
                dropped[cleaned] += 1
            else:
                pairs.append(Pair(cleaned[0], cleaned[1], package, version, origin))
    return pairs, dropped


def add_extra_qt(
    splits: dict[str, list[Pair]],
    lang: Language,
    package_list: Path,
    cache_dir: Path,
    max_packages: int = DEFAULT_MAX_PACKAGES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    workers: int = 2,
) -> tuple[dict[str, list[Pair]], dict]:
    """The whole opt-in step for model/corpus.py: find, fetch, read, clean and merge; and its manifest
    record (sources, rules, exclusion counts, the packages, pair counts)."""
    contents_cache = cache_dir.parent / "contents"
    contents_sha256 = fetch_contents(contents_cache)
    catalogs = parse_qm_contents(contents_lines(contents_cache), lang)
    _gettext, domains = parse_contents(contents_lines(contents_cache), lang)
    candidates, excluded, chosen = choose_packages(
        catalogs, domains, package_list, lang, max_packages, max_bytes, "extra Qt catalogs"
    )
    debs = download_packages(chosen, cache_dir, desc="apt-get download (Qt)")
    jobs = [(lang.code, p, str(debs[p])) for p in chosen if p in debs]
    extra, dropped = read_packages(read_qm_package, jobs, workers, "reading Qt")
    splits, counts = merge_into_train(splits, extra)
    used = sorted(p for p in chosen if p in debs)
    per_package = Counter(p.package for p in extra)
    print(
        f"extra Qt catalogs ({lang.code}): {len(used)} packages, {len(extra)} pairs after cleaning, "
        f"{counts['pairs_added_to_train']} added to train ({counts['new_sources']} new sources)",
        file=sys.stderr,
    )
    record = {
        "source": f"{SOURCE_NAME}: Qt catalogs (.qm, {'/'.join(lang.catalog_dirs)}) of Debian 12 main "
        "packages outside the ranked list; train only",
        "contents_sha256": contents_sha256,
        "rules": "excluded: ranked package (any rank), same source package as a ranked one, same family "
        "as a ranked one, ships a gettext domain a ranked package ships; plural messages and files "
        "without source texts skipped; pairs already in train or whose normalised source is in "
        "valid/test are dropped",
        "packages_with_catalogs": len(catalogs),
        "excluded": dict(excluded.most_common()),
        "candidates": len(candidates),
        "limits": {"max_packages": max_packages, "max_bytes": max_bytes},
        "packages_fetched": len(used),
        "packages_sha256": hashlib.sha256("\n".join(used).encode()).hexdigest(),
        "packages": {p: per_package[p] for p in used},
        "dropped": dict(dropped.most_common()),
        **counts,
    }
    return splits, record
