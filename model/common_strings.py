"""The commonest UI strings of the training side, and how to judge a translation of one.

What a localization team checks first is that `Save`, `Cancel` or `File` come back as the word every
program uses. The list is made from the corpus alone: the sources shipped by the most packages of the
training side, each with the translations that at least two packages give (the accepted answers).
Case and final punctuation are ignored when comparing. Torch-free: used by training (validation),
evaluation and tests.

    python -m model.common_strings --data data        # print the list with its accepted answers
"""

from __future__ import annotations

import argparse
import json
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from model.dictionaries import software_packages

MIN_PACKAGES_PER_ANSWER = 2
_FINAL_PUNCTUATION = ".:!?…;, \u00a0"
_WORD = re.compile(r"[^\W\d_]{3,}")


@dataclass(frozen=True)
class CommonString:
    source: str
    accepted: tuple[str, ...]  # translations given by >= MIN_PACKAGES_PER_ANSWER packages, most given first
    packages: int  # packages of the training side that ship this source


def normalise_answer(text: str) -> str:
    """NFC, case-folded, inner whitespace collapsed, final punctuation removed."""
    text = unicodedata.normalize("NFC", " ".join(text.split()))
    return text.casefold().rstrip(_FINAL_PUNCTUATION)


def common_strings(records: Iterable[dict], n: int = 200) -> list[CommonString]:
    """The `n` sources shipped by the most packages, among those with an answer at least two packages give.

    `records` are rows of ``train.jsonl``: ``source``, ``target`` and ``packages`` (every package of the
    split that ships that exact pair). Sources are grouped exactly as written (accelerators are already
    stripped by the corpus builder); ties are broken by the source text so the list is reproducible.
    """
    if n <= 0:
        return []
    source_packages: dict[str, set[str]] = defaultdict(set)
    answer_packages: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for record in records:
        packages = software_packages(record.get("packages") or [record["package"]])
        if not packages:
            continue  # a dictionary's word pair, not a string a program ships
        source_packages[record["source"]].update(packages)
        answer_packages[record["source"]][normalise_answer(record["target"])].update(packages)
    ranked = sorted(source_packages, key=lambda s: (-len(source_packages[s]), s))
    chosen: list[CommonString] = []
    for source in ranked:
        answers = sorted(answer_packages[source].items(), key=lambda a: (-len(a[1]), a[0]))
        accepted = tuple(text for text, pkgs in answers if len(pkgs) >= MIN_PACKAGES_PER_ANSWER)
        if accepted:
            chosen.append(CommonString(source, accepted, len(source_packages[source])))
        if len(chosen) == n:
            break
    return chosen


def load_common_strings(data_dir: Path, n: int = 200) -> list[CommonString]:
    """The common strings of ``data_dir/train.jsonl`` (see `common_strings`)."""
    with (data_dir / "train.jsonl").open(encoding="utf-8") as handle:
        return common_strings((json.loads(line) for line in handle), n)


def is_accepted(hypothesis: str, item: CommonString) -> bool:
    return normalise_answer(hypothesis) in item.accepted


def repeated_word(hypothesis: str, reference: str) -> str | None:
    """A word (3+ letters) the hypothesis repeats more often than the reference does, or None.

    Catches the degenerate outputs users notice at once (`Guardar Guardar Guardar`, `Archivo de archivo`)
    without flagging repetitions a correct translation has too.
    """
    words = [w.casefold() for w in _WORD.findall(hypothesis)]
    reference_words = [w.casefold() for w in _WORD.findall(reference)]
    for word in dict.fromkeys(words):
        count = words.count(word)
        if count > 1 and count > reference_words.count(word):
            return word
    return None


def score_common_strings(items: Sequence[CommonString], hypotheses: Sequence[str]) -> dict:
    """Accepted share, outputs with a repeated word, and the misses (for reports)."""
    accepted = [is_accepted(h, item) for item, h in zip(items, hypotheses, strict=True)]
    repeats = [repeated_word(h, item.accepted[0]) for item, h in zip(items, hypotheses, strict=True)]
    return {
        "n": len(items),
        "accepted": sum(accepted),
        "accepted_percent": round(100 * sum(accepted) / max(len(items), 1), 1),
        "repeated_word": sum(r is not None for r in repeats),
        "misses": [
            {"source": item.source, "output": h, "accepted": list(item.accepted[:3])}
            for item, h, ok in zip(items, hypotheses, accepted, strict=True)
            if not ok
        ],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args(argv)
    items = load_common_strings(args.data, args.n)
    for item in items:
        print(f"{item.packages:4d}  {item.source!r:40} -> {' | '.join(item.accepted[:4])}")
    print(f"{len(items)} common strings from {args.data / 'train.jsonl'}")


if __name__ == "__main__":
    main()
