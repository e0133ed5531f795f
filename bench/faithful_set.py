"""The held-out faithfulness set: how it is built (``python -m bench.faithful build``); the checker that
labels it is ``bench.faithful_check``.

Held-out packages (ranked past the training top 150, outside its package families, plus ``--extra``),
their Spanish catalogs read and cleaned as the corpus does, sources labelled (``categorize``), a balanced
draw, then the hand-written cases; the full description is ``bench.faithful``'s (``--help``).
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from unittest import mock

from tqdm import tqdm

from bench.faithful_check import _EMAIL, CATEGORIES, HANDWRITTEN, categorize

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SET = REPO_ROOT / "bench" / "data" / "faithful.jsonl"
DEFAULT_CACHE = REPO_ROOT / "data" / "cache" / "debs-heldout"
DEFAULT_TRAIN_DATA = REPO_ROOT / "data"
TRAINED_TOP = 150  # model.corpus's default --top: packages ranked 1..150 are training data
MAX_SOURCE_CHARS = 400
DEFAULT_CAP = 80
DEFAULT_EVERY = 7
# Rare categories: brace (meld), tabs (make, psmisc), shell variables (man-db).
DEFAULT_EXTRA = ("meld", "make", "psmisc", "man-db")
DEFAULT_SEED = 20240607


# --------------------------------------------------------------------------------------------
# Building the set


def package_ranks(package_list: Path) -> dict[str, int]:
    """Rank (1-based) of every package of the TSV, ``libreoffice-l10n-LANG`` expanded as the corpus does."""
    from model.corpus import read_package_list

    return {name: rank for rank, name in enumerate(read_package_list(package_list, 10**9), start=1)}


def heldout_packages(
    package_list: Path, every: int, extra: Sequence[str] = (), first_rank: int = TRAINED_TOP + 1
) -> list[tuple[int, str]]:
    """(rank, package): every `every`-th package from `first_rank` on whose family no top-150 package
    shares, plus `extra` (which must be ranked past the training top too)."""
    from model.corpus import package_family

    ranks = package_ranks(package_list)
    trained = {package_family(p) for p, r in ranks.items() if r <= TRAINED_TOP}
    eligible = [
        (r, p) for p, r in sorted(ranks.items(), key=lambda kv: kv[1])
        if r >= first_rank and package_family(p) not in trained
    ]  # fmt: skip
    chosen = dict((p, r) for r, p in eligible[::every])
    for package in extra:
        if package not in ranks or ranks[package] <= TRAINED_TOP:
            raise SystemExit(f"--extra {package}: not ranked past {TRAINED_TOP} in {package_list}")
        chosen.setdefault(package, ranks[package])
    return sorted((r, p) for p, r in chosen.items())


def clean_heldout_pair(source: str, target: str) -> tuple[str, str] | str:
    """model.corpus.clean_pair with sources up to MAX_SOURCE_CHARS; a message with a tab inside keeps its
    whitespace (clean_pair collapses tabs) and only loses its accelerator, then passes the same filters."""
    from model import corpus

    with mock.patch.object(corpus, "MAX_CHARS", MAX_SOURCE_CHARS):
        if "\t" in source.strip():
            source, target = corpus.strip_accelerators(source, target)
        else:
            cleaned = corpus.clean_pair(source, target)
            if cleaned != "translator credit":
                return cleaned
            source, target = corpus.strip_accelerators(source, target)
            source, target = corpus.normalise_whitespace(source), corpus.normalise_whitespace(target)
        reason = corpus.drop_reason(source, target)
        emails = _EMAIL.findall(target)
        if reason == "translator credit" and emails and all(e in source for e in emails):
            # "Report bugs to <bug-make@gnu.org>": an address the message itself carries, not a credit list
            # (the corpus' credit rule looks for "@" in the target only); the other filters still apply
            reason = corpus.drop_reason(source, target.replace("@", " at "))
        return reason or (source, target)


def read_heldout_catalogs(package: str, deb: Path) -> list[tuple[str, str]]:
    """Cleaned (source, target) pairs of a package's Spanish catalogs (the corpus' reader)."""
    from model import corpus

    pairs = []
    for _path, data in corpus.iter_deb_members(deb, corpus._MO_PATH):
        try:
            entries = corpus.parse_mo(data)
        except ValueError:
            continue
        for source, target in corpus.catalog_pairs(entries):
            cleaned = clean_heldout_pair(source, target)
            if not isinstance(cleaned, str):
                pairs.append(cleaned)
    return pairs


def training_sources(data_dir: Path) -> set[str] | None:
    """Normalised sources of the training split (None if ``data_dir/train.en`` is missing)."""
    from model.corpus import normalised_source, read_split

    if not (data_dir / "train.en").exists():
        return None
    return {normalised_source(source) for source, _ in read_split(data_dir, "train")}


def _round_robin(items: list[dict]) -> Iterable[dict]:
    queues: dict[str, list[dict]] = defaultdict(list)
    for item in items:
        queues[item["package"]].append(item)
    lists = list(queues.values())
    for i in range(max((len(q) for q in lists), default=0)):
        for queue in lists:
            if i < len(queue):
                yield queue[i]


def select_balanced(candidates: list[dict], cap: int, seed: int = DEFAULT_SEED) -> list[dict]:
    """A balanced draw: categories rarest first, each filled round-robin over packages (seeded order) with
    items none of whose categories is full yet; half of ``multi_sentence`` goes to texts with newlines."""
    pool = list(candidates)
    random.Random(seed).shuffle(pool)
    available = Counter(kind for item in pool for kind in item["kinds"])
    counts: Counter = Counter()
    chosen: list[dict] = []
    taken: set[int] = set()
    passes = [(kind, None, cap) for kind in sorted(CATEGORIES, key=lambda k: (available[k], k))]
    at = next(i for i, p in enumerate(passes) if p[0] == "multi_sentence")
    passes.insert(at, ("multi_sentence", "\n", cap // 2))
    for kind, must_contain, limit in passes:
        wanted = [item for item in pool if kind in item["kinds"]]
        if must_contain:
            wanted = [item for item in wanted if must_contain in item["source"]]
        for item in _round_robin(wanted):
            if counts[kind] >= limit:
                break
            if id(item) in taken or any(counts[k] >= cap for k in item["kinds"]):
                continue
            taken.add(id(item))
            chosen.append(item)
            counts.update(item["kinds"])
    return chosen


def _sentences(words: str) -> str:
    return " ".join(f"{w}." for w in words.split(";"))


HANDWRITTEN_SOURCES: tuple[str, ...] = (
    '<a href="%s">Click here</a> to learn more.',
    "You have %n new message(s)",
    "Click <b>Apply</b> to save {count} changes.",
    "Open\tClose",
    "Firefox could not connect to the proxy server.",
    "Firefox is already running, but is not responding.",
    "Openbox",
    "pngquant",
    "11",
    "22",
    "3.3.3",
    "Released in 2011",
    "Copied 100 files",
    "Permission denied: %s",
    "Upload complete 🎉",
    "🎉",
    "ファイルを開く",
    "The café is closed — naïve résumé",
    "Press Ctrl+S to save the document. The changes will be lost otherwise.",
    _sentences(
        "Open the file;Save the file;Close the window;Print the page;Copy the text;Paste the text;"
        "Delete the folder;Rename the folder;Move the file;Search the disk;Sort the list;Clear the history;"
        "Stop the download;Start the download;Pause the music;Play the video;Mute the sound;Lock the screen;"
        "Restart the computer;Update the system;Install the package;Remove the package;Check the spelling;"
        "Zoom in;Zoom out;Undo the change;Redo the change;Select all;Import the contacts;Export the contacts;"
        "Connect to the network;Try again later"
    ),
    "Open the file. " * 60,
    "Usage: backup [OPTIONS] SOURCE DEST\n\nCopies SOURCE to DEST and keeps the last 5 versions. Existing "
    "files are never overwritten.\n\nUse --dry-run to see what would be copied first. Report bugs to "
    "backup-bugs@example.org.",
    "The following items will be removed:\n- Temporary files\n- Browser cache\n- Old log files",
    "Text in <b><i>bold italics</i></b> is important.",
    "%1$s of %2$s",
    "Settings are stored in ${HOME}/.config.",
    "Send your questions to help@example.org.",
    "See https://example.com/search?q=translate&lang=es for details.",
    "Run the browser with --no-sandbox to disable the sandbox.",
    "Save",
    "Open",
    "File",
    "Settings",
    "New",
)


def handwritten_items() -> list[dict]:
    return [
        {
            "source": s,
            "target": None,
            "package": HANDWRITTEN,
            "rank": None,
            "kinds": categorize(s),
            "seen_in_train": None,
        }
        for s in HANDWRITTEN_SOURCES
    ]


def add_build_arguments(b: argparse.ArgumentParser) -> None:
    """The options of ``python -m bench.faithful build``."""
    from model.corpus import DEFAULT_PACKAGE_LIST

    b.add_argument("--packages", type=Path, default=DEFAULT_PACKAGE_LIST, help="ranked package list (TSV)")
    b.add_argument("--every", type=int, default=DEFAULT_EVERY, help="every Nth eligible package from #151")
    b.add_argument("--extra", nargs="*", default=list(DEFAULT_EXTRA), help="more packages ranked past 150")
    b.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where .deb downloads are kept")
    b.add_argument("--train-data", type=Path, default=DEFAULT_TRAIN_DATA, help="corpus dir with train.en")
    b.add_argument("--cap", type=int, default=DEFAULT_CAP, help="most items per category")
    b.add_argument("--seed", type=int, default=DEFAULT_SEED)
    b.add_argument("--out", type=Path, default=DEFAULT_SET)


def build(args: argparse.Namespace) -> None:
    from model.corpus import download_packages, normalised_source

    chosen = heldout_packages(args.packages, args.every, args.extra)
    print(f"held-out packages ({len(chosen)}): " + ", ".join(f"{p} (#{r})" for r, p in chosen))
    debs = download_packages([p for _, p in chosen], args.cache.resolve())
    train = training_sources(args.train_data)
    seen: set[str] = set()
    candidates: list[dict] = []
    pairs_per_package: dict[str, int] = {}
    for rank, package in tqdm(chosen, desc="reading catalogs", unit="pkg"):
        if package not in debs:
            continue
        pairs = read_heldout_catalogs(package, debs[package])
        pairs_per_package[package] = len(pairs)
        for source, target in pairs:
            key = normalised_source(source) + ("\t" if "\t" in source else "")
            if key in seen or len(source) > MAX_SOURCE_CHARS:
                continue
            seen.add(key)
            kinds = categorize(source)
            if kinds:
                candidates.append(
                    {
                        "source": source,
                        "target": target,
                        "package": package,
                        "rank": rank,
                        "kinds": kinds,
                        "seen_in_train": None if train is None else normalised_source(source) in train,
                    }
                )
    selected = select_balanced(candidates, args.cap, args.seed)
    selected.sort(key=lambda item: (item["rank"], item["source"]))
    items = selected + handwritten_items()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as handle:
        for item in items:
            handle.write(json.dumps(item, ensure_ascii=False) + "\n")
    available = Counter(k for c in candidates for k in c["kinds"])
    counts = Counter(k for item in selected for k in item["kinds"])
    print(f"\n{len(candidates)} candidate sources with a category; selected {len(selected)} (cap {args.cap})")
    print(f"{'category':<16} {'selected':>8} {'available':>9}")
    for kind in CATEGORIES:
        print(f"{kind:<16} {counts[kind]:>8} {available[kind]:>9}")
    by_package = Counter(item["package"] for item in selected)
    print(
        "\npackages: "
        + ", ".join(f"{p} #{r}: {by_package[p]}/{pairs_per_package.get(p, 0)}" for r, p in chosen)
    )
    if train is not None:
        print(f"seen in train (normalised source): {sum(bool(i['seen_in_train']) for i in selected)}")
    print(f"\nwrote {len(items)} items ({len(selected)} catalog, {len(items) - len(selected)} hand-written) "
          f"to {args.out} ({args.out.stat().st_size / 1024:.0f} KiB)")  # fmt: skip
