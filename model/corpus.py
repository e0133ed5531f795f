"""Build the parallel corpus from English to one target language (es, fr, de, it, pt_BR) from Debian packages.

Three sources, all human-translated and reachable from any Debian 12 machine (the Spanish names below;
model/languages.py has every language's):
  1. gettext catalogs (``*/es/LC_MESSAGES/*.mo``, ``es_ES`` too) inside the packages ranked in
     ``shared/data/debian-l10n-packages.tsv``;
  2. LibreOffice help (``libreoffice-help-es`` vs ``libreoffice-help-en-us``), paragraphs aligned by
     their HTML ``id``;
  3. bilingual dictionaries (Apertium's ``apertium-eng-spa``, FreeDict's ``dict-freedict-eng-spa``):
     words and phrases, training split only (model/dictionaries.py; ``--no-dictionaries`` leaves them out).

Packages are fetched with ``apt-get download`` (cached) and read with ``dpkg-deb --fsys-tarfile``
without installing anything. Pairs are cleaned, deduplicated and split by package family into
train/valid/test, with provenance and a manifest. Train keeps every pair; held-out pairs whose source
never occurs in train are labelled ``novel``. Every language is split by the same hash of the package
family, so the same families are held out in every language. The manifest also records the Language
code and the Plural-Forms most of the language's catalogs declare.

    python -m model.corpus --out data/ [--top 150]             # Spanish: data/{split}.en, {split}.es
    python -m model.corpus --lang fr --out runs/data-fr/       # {split}.en, {split}.fr
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import struct
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from html.parser import HTMLParser
from pathlib import Path

from tqdm import tqdm

from model.debs import (  # noqa: F401 - cached_deb: re-exported
    cached_deb,
    deb_version,
    download_packages,
    iter_deb_members,
)
from model.dictionaries import (
    DICTIONARY_CAP_PAIRS,
    apertium_pairs,
    common_word_pairs,
    dictionary_variants,
    english_word_counts,
    freedict_pairs,
    member_pattern,
)
from model.languages import (
    DEFAULT_LANGUAGE,
    ENGLISH_HELP,
    LANGUAGES,
    Language,
    catalog_header,
    header_votes,
    language,
    language_summary,
    read_package_list,  # noqa: F401 - re-exported (bench/faithful_set.py)
)
from runtime.bundle import sha256_file
from runtime.catalog import ACCELERATOR_MARKERS, CREDIT_MSGIDS
from runtime.splits import escape_line, read_split, source_sentences, unescape_line  # noqa: F401 - re-exported
from runtime.tokenizer import PLACEHOLDER_PATTERN

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PACKAGE_LIST = REPO_ROOT.parent / "shared" / "data" / "debian-l10n-packages.tsv"
MAX_CHARS = 250
SPLIT_SALT = "translator-split-v1"
# Percent of package families per split (by hash of the family name).
VALID_PERCENT = 5
TEST_PERCENT = 5
SPLITS = ("train", "valid", "test")
# LibreOffice (UI catalogs + help) is a third of all pairs; were it held out, training would lose its
# largest domain, so it is pinned to train and the hash decides every other family.
# The dictionaries (families "apertium" and "dict") are no software package: training data only.
PINNED_TRAIN_FAMILIES = frozenset({"libreoffice", "apertium", "dict"})


# --------------------------------------------------------------------------------------------
# .mo parsing


@dataclass(frozen=True)
class CatalogEntry:
    """One gettext message: context, singular/plural source and the translations."""

    msgid: str
    msgstr: tuple[str, ...]
    msgctxt: str | None = None
    msgid_plural: str | None = None


def _charset(header: str) -> str:
    match = re.search(r"charset=([\w.-]+)", header)
    charset = match.group(1) if match else "utf-8"
    return "utf-8" if charset.upper() == "CHARSET" else charset


def parse_mo(data: bytes) -> list[CatalogEntry]:
    """Parse a compiled gettext catalog, keeping message contexts and plural forms."""
    return read_mo(data)[1]


def read_mo(data: bytes) -> tuple[dict[str, str], list[CatalogEntry]]:
    """A compiled gettext catalog's header fields (``Language``, ``Plural-Forms``, ...) and entries.

    The stdlib ``gettext`` module folds plurals into ``(msgid, n)`` keys and drops ``msgid_plural``,
    so the binary layout is read directly: magic, N, and two tables of (length, offset).
    """
    if len(data) < 20:
        raise ValueError("not a .mo file: too short")
    magic = struct.unpack("<I", data[:4])[0]
    if magic == 0x950412DE:
        endian = "<"
    elif magic == 0xDE120495:
        endian = ">"
    else:
        raise ValueError(f"not a .mo file: bad magic {magic:#x}")
    _revision, count, orig_offset, trans_offset = struct.unpack(endian + "4I", data[4:20])

    def strings(table_offset: int) -> Iterator[bytes]:
        for i in range(count):
            length, offset = struct.unpack_from(endian + "2I", data, table_offset + 8 * i)
            yield data[offset : offset + length]

    raw = list(zip(strings(orig_offset), strings(trans_offset), strict=True))
    charset = "utf-8"
    header: dict[str, str] = {}
    for orig, trans in raw:
        if orig == b"":
            charset = _charset(trans.decode("ascii", "replace"))
            header = catalog_header(trans.decode("utf-8", "replace"))
    entries = []
    for orig, trans in raw:
        if orig == b"":
            continue  # the header
        orig_text = orig.decode(charset, "replace")
        context = None
        if "\x04" in orig_text:
            context, orig_text = orig_text.split("\x04", 1)
        singular, _, plural = orig_text.partition("\x00")
        entries.append(
            CatalogEntry(
                msgid=singular,
                msgstr=tuple(trans.decode(charset, "replace").split("\x00")),
                msgctxt=context,
                msgid_plural=plural or None,
            )
        )
    return header, entries


def catalog_pairs(entries: Iterable[CatalogEntry]) -> Iterator[tuple[str, str]]:
    """(English, target) pairs of a catalog: singular -> msgstr[0], plural -> msgstr[1].

    msgstr[1] is the form of 2, 3, ... under the two-form rule most catalogs of every target language
    declare. Known defect: the 8-9 catalogs per language (none in German) with a CLDR three-form rule,
    `(n == 0 || n == 1) ? 0 : n != 0 && n % 1000000 == 0 ? 1 : 2`, keep the form of 2 in msgstr[2] and
    the form of a million in msgstr[1], which translators fill carelessly (thunar's French `%d files` ->
    ` %d fichier`). The fix, picking the forms the catalog's own rule gives 1 and 2, changes every
    language's splits and so the shipped model cards' test samples: it waits for the next corpus release."""
    for entry in entries:
        if entry.msgstr and entry.msgstr[0]:
            yield entry.msgid, entry.msgstr[0]
        if entry.msgid_plural and len(entry.msgstr) > 1 and entry.msgstr[1]:
            yield entry.msgid_plural, entry.msgstr[1]


# --------------------------------------------------------------------------------------------
# LibreOffice help alignment


class _ParagraphsById(HTMLParser):
    """Collects the text of every element whose id looks like a help paragraph or heading."""

    ID_PATTERN = re.compile(r"^(par|hd)_id")

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: dict[str, str] = {}
        self._stack: list[tuple[str, str, list[str]]] = []  # (tag, id, text parts)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element_id = dict(attrs).get("id") or ""
        if self.ID_PATTERN.match(element_id) and tag in ("p", "h1", "h2", "h3", "h4", "h5", "h6", "td"):
            self._stack.append((tag, element_id, []))

    def handle_endtag(self, tag: str) -> None:
        if self._stack and self._stack[-1][0] == tag:
            _, element_id, parts = self._stack.pop()
            text = " ".join("".join(parts).split())
            if text:
                self.paragraphs.setdefault(element_id, text)

    def handle_data(self, data: str) -> None:
        if self._stack:
            self._stack[-1][2].append(data)


def help_paragraphs(page: str) -> dict[str, str]:
    parser = _ParagraphsById()
    parser.feed(page)
    return parser.paragraphs


def align_help_pages(english: dict[str, str], target: dict[str, str]) -> Iterator[tuple[str, str, str]]:
    """Yield (page, en, target) for every paragraph id present on both sides of the same page."""
    for page, en_page in english.items():
        target_page = target.get(page)
        if target_page is None:
            continue
        en_paragraphs, target_paragraphs = help_paragraphs(en_page), help_paragraphs(target_page)
        for element_id, en_text in en_paragraphs.items():
            target_text = target_paragraphs.get(element_id)
            if target_text:
                yield page, en_text, target_text


# --------------------------------------------------------------------------------------------
# Cleaning

_ACCELERATOR_CHARS = ACCELERATOR_MARKERS
_CREDIT_MSGIDS = CREDIT_MSGIDS
# Desktop-file keyword lists: "word;word;word;"
_KEYWORD_LIST = re.compile(r"^[^;.!?]{1,40}(?:;[^;.!?]{0,40}){2,};?$")


def strip_accelerators(source: str, target: str) -> tuple[str, str]:
    """Remove menu accelerator markers (GTK ``_File``, Qt ``&File``, LibreOffice ``~File``).

    A marker counts when it precedes a letter or digit. It is removed from a side only when the
    source carries exactly one such marker, so identifiers like ``file_name`` or ``a_b_c`` survive.
    The model is thus trained on accelerator-free text and never invents them.
    """
    for mark in _ACCELERATOR_CHARS:
        pattern = re.compile(re.escape(mark) + r"(?=\w)")
        source_hits = pattern.findall(source)
        if len(source_hits) != 1:
            continue
        if mark == "&" and re.search(r"&\w+;", source):
            continue  # an HTML entity, not an accelerator
        if mark == "_" and _is_identifier_underscore(source, target):
            continue
        target_hits = pattern.findall(target)
        if len(target_hits) > 1:
            continue
        source = pattern.sub("", source, count=1)
        target = pattern.sub("", target, count=1)
    return source, target


def _is_identifier_underscore(source: str, target: str) -> bool:
    """True when the ``_`` belongs to an identifier (``NO_PROXY``, ``file_name``, ``a_b_c``): the word
    is upper-case, has several underscores, or is copied verbatim into the translation."""
    word = re.search(r"\w*_\w+", source)
    if word is None:
        return False
    text = word.group(0)
    copied = re.search(rf"(?<!\w){re.escape(text)}(?!\w)", target) is not None
    return text.count("_") > 1 or text.upper() == text or copied


def normalise_whitespace(text: str) -> str:
    """Strip the ends and collapse runs of spaces/tabs; newlines inside a message are kept."""
    lines = [" ".join(line.split()) for line in text.strip().split("\n")]
    return "\n".join(lines)


def is_pure_placeholder(text: str) -> bool:
    return not re.search(r"[^\W\d_]", PLACEHOLDER_PATTERN.sub("", text))


def drop_reason(source: str, target: str) -> str | None:
    """Why a pair is dropped, or None to keep it. Input is already whitespace-normalised."""
    if not source or not target:
        return "empty"
    if len(source) > MAX_CHARS or len(target) > MAX_CHARS:
        return "too long"
    if source.lower().strip(" :") in _CREDIT_MSGIDS or "translator" in source.lower() and len(source) < 40:
        return "translator credit"
    if "@" in target and re.search(r"[\w.+-]+@[\w-]+\.[\w.]+", target) and "<" in target:
        return "translator credit"  # "Name <email>" lists
    if _KEYWORD_LIST.match(source) or _KEYWORD_LIST.match(target):
        return "keyword list"
    if source == target:
        return "source == target"
    shorter, longer = sorted((len(source), len(target)))
    if longer > 30 and longer > 3 * shorter:
        return "length ratio"  # misaligned or partial translation
    if is_pure_placeholder(source):
        return "pure placeholder"
    if not re.search(r"[^\W\d_]", target):
        return "no letters in target"
    if "\ufffd" in source or "\ufffd" in target:
        return "bad encoding"
    return None


def clean_pair(source: str, target: str) -> tuple[str, str] | str:
    """Return the cleaned pair, or the reason it was dropped."""
    source, target = strip_accelerators(source, target)
    source, target = normalise_whitespace(source), normalise_whitespace(target)
    reason = drop_reason(source, target)
    return reason if reason else (source, target)


def normalised_source(text: str) -> str:
    """Key for leakage checks: case-folded, letters and digits only."""
    return " ".join(re.findall(r"\w+", text.casefold()))


# --------------------------------------------------------------------------------------------
# Splitting by package family


def package_family(package: str) -> str:
    """Related packages share vocabulary and must land in one split.

    The family is the first dash-separated word with trailing version digits removed:
    ``libgtk-3-common``/``libgtk2.0-common``/``libgtk-4-common`` -> ``libgtk``, ``postgresql-15`` and
    ``postgresql-client-15`` -> ``postgresql``, ``wesnoth-1.16-*`` -> ``wesnoth``, ``libreoffice-l10n-es``
    and ``libreoffice-help-es`` -> ``libreoffice``; ``cpp`` joins ``gcc``; ``calligra*`` is one family.
    """
    head = package.split("-", 1)[0]
    head = re.sub(r"[\d.]+$", "", head) or head
    if head.startswith("calligra"):
        return "calligra"  # one office suite: calligra, calligrasheets, calligraplan
    return {"cpp": "gcc", "gtk": "libgtk"}.get(head, head)


def split_of(family: str) -> str:
    if family in PINNED_TRAIN_FAMILIES:
        return "train"
    bucket = int(hashlib.sha256(f"{SPLIT_SALT}:{family}".encode()).hexdigest(), 16) % 100
    if bucket < TEST_PERCENT:
        return "test"
    if bucket < TEST_PERCENT + VALID_PERCENT:
        return "valid"
    return "train"


# --------------------------------------------------------------------------------------------
# Reading packages (model/debs.py fetches them)


# The Spanish catalogs' paths (bench/faithful_set.py reads them); any language's: language(code).mo_pattern().
_MO_PATH = LANGUAGES[DEFAULT_LANGUAGE].mo_pattern()


@dataclass
class Pair:
    source: str
    target: str
    package: str
    version: str
    origin: str  # catalog file or help page
    # Every package of the split that ships this exact pair (dedupe keeps one copy): how common a string
    # is across Debian, for the common-UI-strings evaluation and for weighting frequent strings.
    packages: tuple[str, ...] = ()
    # Held-out splits only: True when the pair's normalised source never occurs in train.
    novel: bool | None = None


def read_catalog_package(
    package: str, deb: Path, lang: Language, pattern: re.Pattern[str] | None = None, origin_prefix: str = ""
) -> tuple[list[Pair], Counter, Counter]:
    """The package's cleaned pairs, drop reasons, and its catalogs' votes for Plural-Forms and Language.
    `pattern`: which catalogs to read (default: the language's, anywhere); `origin_prefix` goes before
    each pair's catalog name (model/extra_catalogs.py marks its source that way)."""
    version = deb_version(deb)
    pairs, dropped, votes = [], Counter(), Counter()
    for path, data in iter_deb_members(deb, pattern or lang.mo_pattern()):
        try:
            header, entries = read_mo(data)
        except (ValueError, struct.error):
            dropped["unreadable catalog"] += 1
            continue
        votes.update(header_votes(header))
        origin = origin_prefix + Path(path).name
        for source, target in catalog_pairs(entries):
            cleaned = clean_pair(source, target)
            if isinstance(cleaned, str):
                dropped[cleaned] += 1
            else:
                pairs.append(Pair(cleaned[0], cleaned[1], package, version, origin))
    return pairs, dropped, votes


def help_page_pattern(help_code: str) -> re.Pattern[str]:
    """The help pages of one language and of English: ``.../help/pt-BR/text/...html``."""
    return re.compile(rf"/help/(?:{re.escape(help_code)}|{ENGLISH_HELP})/text/.+\.html$")


def read_help_packages(target_deb: Path, en_deb: Path, lang: Language) -> tuple[list[Pair], Counter]:
    pages_pattern = help_page_pattern(lang.help_code)

    def pages(deb: Path, code: str) -> dict[str, str]:
        prefix = f"/help/{code}/"
        return {
            path.split(prefix, 1)[1]: data.decode("utf-8", "replace")
            for path, data in iter_deb_members(deb, pages_pattern)
            if prefix in path
        }

    version = deb_version(target_deb)
    pairs, dropped = [], Counter()
    english, target = pages(en_deb, ENGLISH_HELP), pages(target_deb, lang.help_code)
    for page, en_text, target_text in align_help_pages(english, target):
        cleaned = clean_pair(en_text, target_text)
        if isinstance(cleaned, str):
            dropped[cleaned] += 1
        else:
            pairs.append(Pair(cleaned[0], cleaned[1], lang.help_package, version, page))
    return pairs, dropped


def read_dictionary_package(
    package: str, deb: Path, scratch: Path, lang: Language
) -> tuple[list[Pair], Counter]:
    """Word and phrase pairs of a bilingual dictionary package (model/dictionaries.py), cleaned like
    catalog pairs; the origin names the dictionary and the part of speech."""
    version = deb_version(deb)
    dictionary = next(d for d in lang.dictionaries if d.package == package)
    members = dict(iter_deb_members(deb, member_pattern(dictionary)))
    if dictionary.kind == "apertium":
        entries = (
            apertium_pairs(next(iter(members.values())), scratch, dictionary.file) if members else iter(())
        )
    else:
        files = {("index" if path.endswith(".index") else "dict"): data for path, data in members.items()}
        entries = (
            freedict_pairs(files["index"].decode("utf-8"), files["dict"]) if len(files) == 2 else iter(())
        )
    pairs, dropped = [], Counter()
    for en, translation, pos in entries:
        for source, target in dictionary_variants(en, translation):
            cleaned = clean_pair(source, target)
            if isinstance(cleaned, str):
                dropped[cleaned] += 1
            else:
                origin = f"{package}:{pos}" if pos else package
                pairs.append(Pair(cleaned[0], cleaned[1], package, version, origin))
    return pairs, dropped


def _read_job(job: tuple[str, ...]) -> tuple[list[Pair], Counter, Counter]:
    """(kind, language code, ...): runs in a worker process, so the job is plain strings."""
    kind, lang = job[0], language(job[1])
    if kind == "help":
        return (*read_help_packages(Path(job[2]), Path(job[3]), lang), Counter())
    if kind == "dictionary":
        return (*read_dictionary_package(job[2], Path(job[3]), Path(job[4]), lang), Counter())
    return read_catalog_package(job[2], Path(job[3]), lang)


# --------------------------------------------------------------------------------------------
# Assembly


def cap_dictionaries(pairs: list[Pair], dictionary_packages: Iterable[str]) -> tuple[list[Pair], dict]:
    """Cut each dictionary larger than DICTIONARY_CAP_PAIRS down to its pairs of the commonest words, as
    counted in the training split's catalogs (model/dictionaries.py: common_word_pairs). Returns the
    pairs and, per capped dictionary, how many it had and kept (for the manifest)."""
    packages = set(dictionary_packages)
    by_package: dict[str, list[Pair]] = defaultdict(list)
    for pair in pairs:
        if pair.package in packages:
            by_package[pair.package].append(pair)
    oversized = {p: found for p, found in by_package.items() if len(found) > DICTIONARY_CAP_PAIRS}
    if not oversized:
        return pairs, {}
    counts = english_word_counts(
        p.source
        for p in pairs
        if p.package not in packages and split_of(package_family(p.package)) == "train"
    )
    kept: dict[str, set[int]] = {}
    for package, found in oversized.items():
        kept[package] = {
            id(found[i]) for i in common_word_pairs([p.source for p in found], counts, DICTIONARY_CAP_PAIRS)
        }
    capped = [p for p in pairs if p.package not in kept or id(p) in kept[p.package]]
    report = {
        p: {
            "pairs": len(found),
            "kept": len(kept[p]),
            "rule": f"the {DICTIONARY_CAP_PAIRS} pairs of the words commonest in the training catalogs",
        }
        for p, found in oversized.items()
    }
    return capped, report


def dedupe(pairs: Iterable[Pair]) -> list[Pair]:
    """One copy of each (source, target), the first seen, listing every package that ships it."""
    first: dict[tuple[str, str], Pair] = {}
    packages: dict[tuple[str, str], dict[str, None]] = defaultdict(dict)
    for pair in pairs:
        key = (pair.source, pair.target)
        first.setdefault(key, pair)
        packages[key][pair.package] = None
    return [
        Pair(p.source, p.target, p.package, p.version, p.origin, tuple(packages[key]), p.novel)
        for key, p in first.items()
    ]


def split_pairs(pairs: list[Pair]) -> dict[str, list[Pair]]:
    """Split by package family, dedupe within each split, and label held-out pairs as novel or not.

    Train keeps every pair: the commonest strings (Save, File, Delete) occur in held-out packages too, and
    removing them from train left the model without them. Leakage is handled on the held-out side instead:
    a valid/test pair is `novel` when its normalised source never occurs in train, so scores are reported
    on all pairs and on the novel ones. Valid drops pairs whose source occurs in test (held-out side only).
    """
    by_split: dict[str, list[Pair]] = {name: [] for name in SPLITS}
    for pair in pairs:
        by_split[split_of(package_family(pair.package))].append(pair)
    splits = {name: dedupe(by_split[name]) for name in SPLITS}
    test_sources = {normalised_source(p.source) for p in splits["test"]}
    splits["valid"] = [p for p in splits["valid"] if normalised_source(p.source) not in test_sources]
    train_sources = {normalised_source(p.source) for p in splits["train"]}
    for name in ("valid", "test"):
        for pair in splits[name]:
            pair.novel = normalised_source(pair.source) not in train_sources
    return splits


def read_novel(data_dir: Path, split: str) -> list[bool]:
    """Per line of a held-out split: whether its source is novel (never in train). From {split}.jsonl."""
    with (data_dir / f"{split}.jsonl").open(encoding="utf-8") as handle:
        return [bool(json.loads(line).get("novel")) for line in handle]


def write_splits(
    out: Path, splits: dict[str, list[Pair]], target: str = DEFAULT_LANGUAGE
) -> dict[str, dict[str, str]]:
    """Write ``{split}.en``/``{split}.<target>`` (``.es``, ``.pt_BR``; one segment a line, newlines escaped
    as the two characters backslash-n) and ``{split}.jsonl`` with provenance. Returns sha256 per file."""
    out.mkdir(parents=True, exist_ok=True)
    checksums: dict[str, dict[str, str]] = {}
    for name, pairs in splits.items():
        files = {"en": out / f"{name}.en", target: out / f"{name}.{target}", "jsonl": out / f"{name}.jsonl"}
        with (
            files["en"].open("w", encoding="utf-8") as en,
            files[target].open("w", encoding="utf-8") as translated,
            files["jsonl"].open("w", encoding="utf-8") as meta,
        ):
            for pair in pairs:
                en.write(escape_line(pair.source) + "\n")
                translated.write(escape_line(pair.target) + "\n")
                meta.write(json.dumps(asdict(pair), ensure_ascii=False) + "\n")
        checksums[name] = {key: sha256_file(path) for key, path in files.items()}
    return checksums


def build(
    out: Path,
    package_list: Path,
    top: int,
    cache_dir: Path,
    workers: int = 2,
    dictionaries: bool = True,
    lang: str = DEFAULT_LANGUAGE,
    extra_catalogs: bool = False,
    max_extra_packages: int | None = None,
    max_extra_bytes: int | None = None,
    extra_docs: bool = False,
    max_docs_bytes: int | None = None,
    extra_qt: bool = False,
) -> dict:
    """Build the corpus into `out` and return its manifest. `extra_catalogs` (opt-in) adds the catalogs of
    Debian packages outside the ranked list to train only (model/extra_catalogs.py); without it the
    corpus is byte for byte the one the shipped models' cards were computed on. `extra_docs` (opt-in) adds
    Debian's translated documentation, and `extra_qt` (opt-in) the Qt catalogs of packages outside the
    ranked list, train only (model/extra_docs.py, model/extra_qt.py)."""
    started = time.time()
    target = language(lang)
    packages = read_package_list(package_list, top, target.code)
    help_packages = target.help_packages
    dictionary_packages = target.dictionary_packages if dictionaries else ()
    debs = download_packages(packages + [*help_packages, *dictionary_packages], cache_dir)
    jobs: list[tuple[str, ...]] = [("mo", target.code, p, str(debs[p])) for p in packages if p in debs]
    if all(p in debs for p in help_packages):
        jobs.insert(0, ("help", target.code, *(str(debs[p]) for p in help_packages)))
    jobs += [
        ("dictionary", target.code, p, str(debs[p]), str(out / "cache"))
        for p in dictionary_packages
        if p in debs
    ]
    all_pairs: list[Pair] = []
    dropped: Counter = Counter()
    votes: Counter = Counter()  # the catalogs' Plural-Forms and Language headers
    versions = {p: debs[p].name.split("_")[1].replace("%3a", ":") for p in debs}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        progress = tqdm(
            pool.map(_read_job, jobs), total=len(jobs), desc=f"reading packages ({target.code})", unit="pkg"
        )
        for pairs, reasons, headers in progress:
            all_pairs.extend(pairs)
            dropped.update(reasons)
            votes.update(headers)
            progress.set_postfix(pairs=len(all_pairs))
    raw = len(all_pairs)
    all_pairs, capped_dictionaries = cap_dictionaries(all_pairs, dictionary_packages)
    splits = split_pairs(all_pairs)
    extra_record = None
    if extra_catalogs:
        # Imported here: the default build never touches the Contents index or the extra packages.
        from model import extra_catalogs as extra

        splits, extra_record = extra.add_extra_catalogs(
            splits,
            target,
            package_list,
            cache_dir,
            max_packages=max_extra_packages or extra.DEFAULT_MAX_PACKAGES,
            max_bytes=max_extra_bytes or extra.DEFAULT_MAX_BYTES,
            workers=workers,
        )
    docs_record = None
    if extra_docs:
        from model import extra_docs as docs

        splits, docs_record = docs.add_extra_docs(
            splits, target, package_list, top, cache_dir, max_bytes=max_docs_bytes or docs.DEFAULT_MAX_BYTES
        )
    qt_record = None
    if extra_qt:
        from model import extra_qt as qt

        splits, qt_record = qt.add_extra_qt(splits, target, package_list, cache_dir, workers=workers)
    novel = {name: sum(bool(p.novel) for p in splits[name]) for name in ("valid", "test")}
    checksums = write_splits(out, splits, target.code)
    per_package: dict[str, Counter] = defaultdict(Counter)
    for name, pairs in splits.items():
        for pair in pairs:
            per_package[pair.package][name] += 1
    manifest = {
        "language": language_summary(target, votes),
        "sources": f"Debian 12 gettext catalogs ({', '.join(target.catalog_dirs)}) and LibreOffice help "
        f"({target.help_code} vs {ENGLISH_HELP})"
        + (f"; dictionaries {', '.join(dictionary_packages)} (train only)" if dictionary_packages else ""),
        "top_packages": top,
        "missing_packages": sorted(set(packages + [*help_packages, *dictionary_packages]) - set(debs)),
        "split_rule": f"sha256('{SPLIT_SALT}:' + family) % 100: <{TEST_PERCENT} test, "
        f"<{TEST_PERCENT + VALID_PERCENT} valid, else train; "
        f"pinned to train: {sorted(PINNED_TRAIN_FAMILIES)}",
        "pairs_after_cleaning": raw,
        "capped_dictionaries": capped_dictionaries,
        "pairs_after_dedupe": sum(len(pairs) for pairs in splits.values()),
        "dedupe": "within each split; train keeps every pair, held-out pairs are labelled novel or not",
        "novel": novel,
        "dropped": dict(dropped.most_common()),
        "counts": {name: len(pairs) for name, pairs in splits.items()},
        "families": {
            name: sorted({package_family(p.package) for p in pairs}) for name, pairs in splits.items()
        },
        "packages": {p: {"version": versions.get(p, ""), **per_package[p]} for p in sorted(per_package)},
        "sha256": checksums,
        "seconds": round(time.time() - started, 1),
    }
    if extra_record is not None:
        # Only with the flag: the default manifest keeps its keys and bytes.
        manifest["sources"] += f"; {extra_record['source']}"
        manifest["extra_catalogs"] = extra_record
    if docs_record is not None:
        manifest["sources"] += f"; {docs_record['source']}"
        manifest["extra_docs"] = docs_record
    if qt_record is not None:
        manifest["sources"] += f"; {qt_record['source']}"
        manifest["extra_qt"] = qt_record
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest


def _language_code(code: str) -> str:
    """--lang: a code of the table (pt-BR too), or a usage error naming the choices."""
    try:
        return language(code).code
    except KeyError as error:
        raise argparse.ArgumentTypeError(error.args[0]) from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("data"))
    parser.add_argument(
        "--lang",
        default=DEFAULT_LANGUAGE,
        type=_language_code,
        help=f"target language: {', '.join(LANGUAGES)} (default es)",
    )
    parser.add_argument(
        "--packages", type=Path, default=DEFAULT_PACKAGE_LIST, help="ranked package list (TSV)"
    )
    parser.add_argument("--top", type=int, default=150, help="how many of the ranked packages to use")
    parser.add_argument("--cache", type=Path, default=None, help="where .deb downloads are kept")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--no-dictionaries", action="store_true", help="leave out the bilingual dictionaries (catalogs only)"
    )
    parser.add_argument(
        "--extra-catalogs",
        action="store_true",
        help="also train on the catalogs of Debian 12 packages outside the ranked list (train only; "
        "model/extra_catalogs.py)",
    )
    parser.add_argument(
        "--max-extra-packages", type=int, default=None, help="--extra-catalogs: at most N packages"
    )
    parser.add_argument(
        "--max-extra-bytes", type=int, default=None, help="--extra-catalogs: at most N .deb bytes"
    )
    parser.add_argument(
        "--extra-docs",
        action="store_true",
        help="also train on Debian's translated documentation, PO files of source packages (train only; "
        "model/extra_docs.py)",
    )
    parser.add_argument(
        "--max-docs-bytes", type=int, default=None, help="--extra-docs: at most N bytes of source packages"
    )
    parser.add_argument(
        "--extra-qt",
        action="store_true",
        help="also train on the Qt catalogs (.qm) of Debian 12 packages outside the ranked list (train "
        "only; model/extra_qt.py)",
    )
    args = parser.parse_args(argv)
    cache = args.cache or args.out / "cache" / "debs"
    manifest = build(
        args.out,
        args.packages,
        args.top,
        cache.resolve(),
        args.workers,
        dictionaries=not args.no_dictionaries,
        lang=args.lang,
        extra_catalogs=args.extra_catalogs,
        max_extra_packages=args.max_extra_packages,
        max_extra_bytes=args.max_extra_bytes,
        extra_docs=args.extra_docs,
        max_docs_bytes=args.max_docs_bytes,
        extra_qt=args.extra_qt,
    )
    counts, record = manifest["counts"], manifest["language"]
    print(
        f"corpus ({record['code']}): {manifest['pairs_after_dedupe']} unique pairs -> "
        f"train {counts['train']}, "
        f"valid {counts['valid']} ({manifest['novel']['valid']} novel), "
        f"test {counts['test']} ({manifest['novel']['test']} novel) "
        f"in {manifest['seconds']} s; manifest: {args.out / 'manifest.json'}"
    )
    print(f"families: valid {manifest['families']['valid']}\n          test {manifest['families']['test']}")
    print(
        f"catalogs: {record['catalogs']}, Language {record['gettext_language']} "
        f"({record['gettext_language_catalogs']}), Plural-Forms {record['plural_forms']} "
        f"({record['plural_forms_catalogs']}); missing packages: {manifest['missing_packages'] or 'none'}"
    )


if __name__ == "__main__":
    main()
