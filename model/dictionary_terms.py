"""The bundle's dictionary terms: the dictionary entries that Debian's software catalogs seldom hold and
that the dictionaries translate one way only (runtime/faithful/dictionary.py says how the text layer uses
them).

    python -m model.dictionary_terms --data runs/data-es-extra --lexicon models/en-es-small/lexicon.txt.gz \\
        --out models/en-es-small/dictionary_terms.tsv
    # options: --max-catalog-sources 10

Read from the corpus's train.jsonl (provenance per pair, model/dictionaries.py):

1. Entries: the pairs that only the bilingual dictionaries give (Apertium's bidix, FreeDict), whose
   source is one to four lowercase English words (the capitalised copies the corpus adds are the same
   entries), whose translation has no word the target language's lexicon lacks (FreeDict's eng-spa writes
   some senses glued: `blocdenotas`, `hastaluego`) and that is not the source itself (a name the model
   copies anyway). An entry with two or more translations (`bank`: banco, orilla) is left to the model.
2. Rare: the entry occurs (as whole words, any case) in fewer than `--max-catalog-sources` sources of the
   software pairs of train. A word the catalogs use often, the model has learnt from them, in their sense
   (`share` is `compartir` there, `dividir` in FreeDict).

`--max-catalog-sources` was chosen on valid (Spanish, 1,000 pairs as the release rule draws them, through
the text layer with the decoding defaults; BLEU / chrF, texts holding a term):

    no dictionary terms        53.48 / 70.66
    fewer than 3 sources       53.48 / 70.69    4 texts
    fewer than 10 (default)    53.66 / 70.83   21 texts
    fewer than 30              53.60 / 70.84   52 texts

On the 192 everyday dev inputs (bench/data/everyday-dev.jsonl) the default gives chrF 54.89 -> 57.45 and
59 -> 63 accepted.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from tqdm import tqdm

from model.dictionaries import software_packages
from runtime.faithful.dictionary import DICTIONARY_FILE, MAX_WORDS, TERM_WORD, write_dictionary_terms
from runtime.faithful.lexicon import WORD, Lexicon, read_lexicon

MAX_CATALOG_SOURCES = 10
_ENTRY = re.compile(rf"[a-z]+(?: [a-z]+){{0,{MAX_WORDS - 1}}}")


def collect(jsonl: Path, lexicon: Lexicon | None, progress: bool = False) -> tuple[dict, list[str]]:
    """(entry -> Counter of its translations, the sources of the software pairs) of a split's jsonl."""
    entries: dict[str, Counter] = defaultdict(Counter)
    catalog_sources = []
    with jsonl.open(encoding="utf-8") as f:
        for line in tqdm(
            f, desc="train pairs", unit="pair", mininterval=2, disable=not progress, file=sys.stderr
        ):
            row = json.loads(line)
            if software_packages(row.get("packages") or [row.get("package", "")]):
                catalog_sources.append(row["source"])
                continue
            source, target = " ".join(row["source"].split()), " ".join(row["target"].split())
            if not _ENTRY.fullmatch(source) or not target or target.lower() == source:
                continue
            if lexicon is not None and not all(w in lexicon for w in WORD.findall(target)):
                continue
            entries[source][target] += 1
    return entries, catalog_sources


def catalog_counts(entries: set[str], sources: list[str]) -> Counter:
    """How many of the sources hold each entry as whole words (any case)."""
    counts: Counter = Counter()
    for text in sources:
        words = [w.lower() for w in TERM_WORD.findall(text)]
        seen = set()
        for n in range(1, MAX_WORDS + 1):
            for i in range(len(words) - n + 1):
                phrase = " ".join(words[i : i + n])
                if phrase in entries:
                    seen.add(phrase)
        counts.update(seen)
    return counts


def select(entries: dict[str, Counter], counts: Counter, max_catalog_sources: int) -> list[tuple[str, str]]:
    """The (entry, translation) pairs of the rule: one translation, in fewer catalog sources than asked."""
    return sorted(
        (source, next(iter(targets)))
        for source, targets in entries.items()
        if len(targets) == 1 and counts[source] < max_catalog_sources
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("data"), help="corpus directory (train.jsonl)")
    parser.add_argument("--lexicon", type=Path, help="the target language's lexicon.txt.gz (model.lexicon)")
    parser.add_argument("--out", type=Path, default=Path("models/en-es-small") / DICTIONARY_FILE)
    parser.add_argument("--max-catalog-sources", type=int, default=MAX_CATALOG_SOURCES)
    args = parser.parse_args(argv)
    jsonl = args.data / "train.jsonl"
    if not jsonl.is_file():
        raise SystemExit(f"{jsonl} is missing: run `make corpus` first")
    started = time.perf_counter()
    lexicon = read_lexicon(args.lexicon) if args.lexicon else None
    entries, sources = collect(jsonl, lexicon, progress=True)
    counts = catalog_counts(set(entries), sources)
    kept = select(entries, counts, args.max_catalog_sources)
    command = f"python -m model.dictionary_terms --data {args.data} --out {args.out}"
    if args.lexicon:
        command += f" --lexicon {args.lexicon}"
    if args.max_catalog_sources != MAX_CATALOG_SOURCES:
        command += f" --max-catalog-sources {args.max_catalog_sources}"
    header = [
        "dictionary terms of the text layer (runtime/faithful/dictionary.py); regenerate with:",
        command,
        f"{len(kept):,} of {len(entries):,} dictionary entries: one translation, in fewer than "
        f"{args.max_catalog_sources} of {len(sources):,} catalog sources",
    ]
    n = write_dictionary_terms(args.out, kept, header)
    ambiguous = sum(len(t) > 1 for t in entries.values())
    print(
        f"{args.out}: {n} terms of {len(entries)} dictionary entries ({ambiguous} with several translations, "
        f"{len(entries) - ambiguous - n} common in the catalogs); {time.perf_counter() - started:.0f} s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
