"""The translation memory: for each source string of the training split, the translation Debian's
packages agree on, for the serving text layer to return as it is (runtime/faithful/memory.py).

    python -m model.memory --data data --out models/en-es-small/memory.jsonl.gz
    # options: --min-packages 1, --min-share 0.5

Rule: among the translations of a source (``data/train.jsonl``, one row per distinct pair with the
packages that ship it), the one shipped by the most packages is kept when it is shipped by at least
``--min-packages``, by more packages than any other translation, and by at least ``--min-share`` of all
packages that translate that source. Chosen on the valid split (its 1,780 texts whose source is in
train; text layer output elsewhere), BLEU / chrF:

    no memory                     60.96 / 75.61
    min 1 package, share >= 0.5   62.14 / 78.07   244,575 entries (kept)
    min 2 packages                61.98 / 76.79    13,626 entries
    min 3 packages                61.32 / 76.01

Only the training split is read: valid and test sources are not in the memory unless train has them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

from tqdm import tqdm

from model.dictionaries import software_packages
from runtime.faithful.memory import MEMORY_FILE, write_memory

MIN_PACKAGES = 1
MIN_SHARE = 0.5


def read_pairs(jsonl: Path) -> Iterator[tuple[str, str, int]]:
    """(source, target, software packages shipping the pair) for every row of a split's jsonl.

    A pair only the bilingual dictionaries give is no translation a program ships: it is left out."""
    with jsonl.open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            packages = software_packages(row.get("packages") or [row.get("package", "")])
            if packages:
                yield row["source"], row["target"], len(packages)


def select(
    pairs: Iterable[tuple[str, str, int]], min_packages: int = MIN_PACKAGES, min_share: float = MIN_SHARE
) -> list[tuple[str, str, int]]:
    """(source, target, packages) for every source whose most shipped translation passes the rule."""
    by_source: dict[str, Counter] = defaultdict(Counter)
    for source, target, packages in pairs:
        if source.strip() and target.strip():
            by_source[source][target] += packages
    kept = []
    for source, targets in by_source.items():
        (target, n), *rest = targets.most_common(2)
        runner_up = rest[0][1] if rest else 0
        if n >= min_packages and n > runner_up and n >= min_share * sum(targets.values()):
            kept.append((source, target, n))
    return kept


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--out", type=Path, default=Path("models/en-es-small") / MEMORY_FILE)
    parser.add_argument("--min-packages", type=int, default=MIN_PACKAGES)
    parser.add_argument("--min-share", type=float, default=MIN_SHARE)
    args = parser.parse_args(argv)
    jsonl = args.data / "train.jsonl"
    if not jsonl.is_file():
        raise SystemExit(f"{jsonl} is missing: run `make corpus` first")
    pairs = list(tqdm(read_pairs(jsonl), desc="train pairs", unit="pair", mininterval=2, file=sys.stderr))
    kept = select(pairs, args.min_packages, args.min_share)
    header = {
        "command": f"python -m model.memory --data {args.data} --min-packages {args.min_packages} "
        f"--min-share {args.min_share}",
        "rule": "the translation most packages ship, by more than any other and by >= min_share of them",
        "min_packages": args.min_packages,
        "min_share": args.min_share,
    }
    n = write_memory(args.out, kept, header)
    sources = len({p[0] for p in pairs})
    print(
        f"{args.out}: {n:,} sources of {sources:,} in {len(pairs):,} train pairs "
        f"({args.out.stat().st_size / 1e6:.1f} MB)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
