"""The first five minutes: the everyday inputs a new user types first, judged the way a reader would.

    python -m bench.everyday --bundle bundles/en-es-small [--json out.json] [--no-memory] [--show-failures]

The set, ``bench/data/everyday.jsonl``, is written by hand (not taken from the corpus or any Debian
catalog): greetings, politeness, modern app strings (sign in/up/out, like, share, follow, unmute, cart),
short plain sentences and short texts of two or three sentences. Each item lists every translation a
professional would accept: tú and usted (and the plural forms where the source may address several
people), Spain and Latin America (ordenador/computadora, móvil/celular, coche/carro/auto).
``bench/data/everyday-fr.jsonl`` has the same items with French references, written by hand the same
way (tu and vous, the infinitive of UI commands beside the imperative, common synonyms), and
``everyday-de.jsonl`` with German ones (du and Sie, the infinitive of UI commands beside the imperative);
``set_for`` finds a language's set. ``bench/data/everyday-dev.jsonl`` (192 other items, Spanish,
written the same way, no source shared with the evaluation set) is for choosing settings, so that the
evaluation set only reports: ``--set bench/data/everyday-dev.jsonl``. Case-folding makes ß and ss one,
and Sie and sie.

Every source goes through the serving engine's text layer with the bundle's decoding defaults, as the
service translates it (``bench.evaluate.translate_onnx(..., text_layer=True)``: segmentation, masking,
the translation memory). An output is accepted when, normalised (``normalise``: Unicode NFC, case-folded,
curly and angle quotes made straight, whitespace collapsed, the space French typography puts before
``! ? : ;`` and ``»`` and after ``«`` removed, opening ``¡``/``¿`` and final ``. ! ? …`` removed), it
equals one of the item's normalised accepted translations: a wrong word, accent, comma or
register mix is a miss, a missing final stop is not. Scores are per category and overall; the report also
counts how many of the sources occur verbatim (normalised) among the training sources, ``data/train.en``,
when the corpus is there (printed, not filtered: a first-five-minutes input may well be a common string).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.evaluate import translate_onnx, write_report
from runtime.bundle import load_manifest, sha256_file
from runtime.faithful.lexicon import LEXICON_FILE, non_word_rate, read_lexicon

DEFAULT_SET = Path(__file__).resolve().parent / "data" / "everyday.jsonl"  # Spanish references


def set_for(code: str) -> Path | None:
    """The everyday set with references in language `code`: everyday.jsonl for Spanish, the first one
    written, everyday-<code>.jsonl for the others; None while a language has none."""
    path = DEFAULT_SET if code == "es" else DEFAULT_SET.with_name(f"everyday-{code}.jsonl")
    return path if path.exists() else None


CATEGORIES = ("greeting", "politeness", "app", "sentence", "multi")
RULE = (
    "accepted = the output equals one of the item's accepted translations after normalisation (NFC, "
    "case-folded, quotes unified, whitespace collapsed, no space before ! ? : ; » or after «, opening ¡¿ "
    "and final . ! ? … removed)"
)

# Curly, low and angle quotes read the same as straight ones: a professional uses either.
_QUOTES = str.maketrans(
    {"\u201c": '"', "\u201d": '"', "\u201e": '"', "\u00ab": '"', "\u00bb": '"',
     "\u2018": "'", "\u2019": "'", "\u201a": "'"}
)  # fmt: skip
# French typography's space (often a no-break one, U+00A0 or U+202F) before ! ? : ; and » and after «:
# "Bonjour !" and "Bonjour!", "« Fichier »" and "«Fichier»" read the same.
_FRENCH_SPACES = re.compile(r"\s+(?=[!?:;\u00bb])|(?<=\u00ab)\s+")


@dataclass(frozen=True)
class Item:
    id: str
    category: str
    source: str
    accepted: tuple[str, ...]


# --------------------------------------------------------------------------------------------
# The set and the judge


def normalise(text: str) -> str:
    """The form outputs and accepted translations are compared in (see the module docstring)."""
    text = _FRENCH_SPACES.sub("", unicodedata.normalize("NFC", text)).translate(_QUOTES)
    text = unicodedata.normalize("NFC", " ".join(text.split()).casefold())
    return text.lstrip("¡¿ ").rstrip(".!?… ")


def judge(output: str, accepted: Iterable[str]) -> bool:
    """Whether `output` is one of the `accepted` translations, both normalised."""
    return normalise(output) in {normalise(a) for a in accepted}


def load_items(path: Path = DEFAULT_SET) -> list[Item]:
    """The set's items, in file order; a malformed line raises ValueError naming it."""
    items = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            item = Item(row["id"], row["category"], row["source"], tuple(row["accepted"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{number}: not an item ({e})") from e
        if item.category not in CATEGORIES or not item.accepted:
            raise ValueError(f"{path}:{number}: unknown category or no accepted translation ({item.id})")
        items.append(item)
    return items


def select(items: Sequence[Item], per_category: int) -> list[Item]:
    """The first `per_category` items of each category, in file order (0: all of them)."""
    if per_category <= 0:
        return list(items)
    taken: dict[str, int] = {}
    chosen = []
    for item in items:
        if taken.get(item.category, 0) < per_category:
            taken[item.category] = taken.get(item.category, 0) + 1
            chosen.append(item)
    return chosen


def training_overlap(items: Sequence[Item], data: Path) -> dict | None:
    """How many sources occur verbatim (normalised) among the training sources; None without data/."""
    train = data / "train.en"
    if not train.exists():
        return None
    wanted = {normalise(item.source): item.id for item in items}
    found = set()
    with train.open(encoding="utf-8") as handle:
        for line in handle:
            key = normalise(line)
            if key in wanted:
                found.add(wanted[key])
    ids = [item.id for item in items if item.id in found]
    return {"train": str(train), "n": len(items), "in_train": len(ids), "ids": ids}


def _share(accepted: int, n: int) -> dict:
    return {"n": n, "accepted": accepted, "percent": round(100.0 * accepted / n, 1) if n else None}


def score(items: Sequence[Item], outputs: Sequence[str]) -> dict:
    """Per-item verdicts, the accepted share per category (in CATEGORIES order) and overall."""
    rows = [
        {"id": item.id, "category": item.category, "source": item.source, "output": output,
         "accepted": judge(output, item.accepted)}
        for item, output in zip(items, outputs, strict=True)
    ]  # fmt: skip
    categories = {}
    for category in CATEGORIES:
        verdicts = [row["accepted"] for row in rows if row["category"] == category]
        if verdicts:
            categories[category] = _share(sum(verdicts), len(verdicts))
    overall = _share(sum(row["accepted"] for row in rows), len(rows))
    return {"overall": overall, "categories": categories, "items": rows}


# --------------------------------------------------------------------------------------------
# Running


def everyday_non_words(bundle: Path, items: Sequence[Item], outputs: Sequence[str]) -> dict | None:
    """Non-word rates (runtime.faithful.lexicon) of the outputs and, beside them, of each item's first
    accepted translation (the human side); None for a bundle without a lexicon."""
    path = bundle / LEXICON_FILE
    if not path.is_file():
        return None
    lexicon = read_lexicon(path)
    sources = [item.source for item in items]
    return {
        "outputs": non_word_rate(list(zip(sources, outputs, strict=True)), lexicon),
        "accepted": non_word_rate([(item.source, item.accepted[0]) for item in items], lexicon),
    }


def decoding_defaults(bundle: Path, variant: str) -> dict:
    """The bundle's decoding defaults, filled in as ``server.engine.Engine`` fills them (its
    default_options): what a request without options gets from the service."""
    decoding = load_manifest(bundle, variant)["decoding"]
    return {
        "beam_size": int(decoding.get("beam_size", 4)),
        "length_penalty": float(decoding.get("length_penalty", 0.6)),
        "repetition_penalty": float(decoding.get("repetition_penalty", 1.0)),
        "no_repeat_ngram_size": int(decoding.get("no_repeat_ngram_size", 0)),
    }


def run(
    bundle: Path,
    items: Sequence[Item],
    *,
    variant: str = "fp32",
    memory: bool = True,
    data: Path | None = None,
    batch_size: int = 32,
    device: str = "auto",
    threads: int = 0,
    set_path: Path = DEFAULT_SET,
) -> dict:
    """Translate every source as the service does and score the outputs: the report (JSON-ready)."""
    options = decoding_defaults(bundle, variant)
    started = time.perf_counter()
    translation = translate_onnx(
        bundle, variant, [item.source for item in items], options["beam_size"], options["length_penalty"],
        batch_size, device, threads, options["repetition_penalty"], options["no_repeat_ngram_size"],
        text_layer=True, memory=memory,
    )  # fmt: skip
    report = {
        "set": {"path": str(set_path), "sha256": sha256_file(set_path), "items": len(items)},
        "rule": RULE,
        "engine": translation.info,
        "seconds": round(translation.seconds, 2),
        **score(items, translation.hypotheses),
        "overlap": training_overlap(items, data) if data is not None else None,
        "non_words": everyday_non_words(bundle, items, translation.hypotheses),
    }
    report["total_seconds"] = round(time.perf_counter() - started, 2)
    return report


# --------------------------------------------------------------------------------------------
# Report


def _percent(share: dict) -> str:
    return "n/a" if share["percent"] is None else f"{share['percent']:.1f}%"


def failures(report: dict) -> list[dict]:
    """The items whose output was not accepted, in set order."""
    return [row for row in report["items"] if not row["accepted"]]


def print_report(report: dict, show_failures: bool = False) -> None:
    engine = report["engine"]
    print(
        f"\nfirst five minutes: {report['set']['items']} everyday inputs, {engine.get('name')} "
        f"{engine.get('variant')} + text layer{'' if engine.get('memory') else ' (no memory)'}, "
        f"beam {engine.get('beam')}"
    )
    print(f"\n{'category':<12}  {'items':>5}  {'accepted':>8}  {'share':>6}")
    for category, share in [*report["categories"].items(), ("all", report["overall"])]:
        print(f"{category:<12}  {share['n']:>5}  {share['accepted']:>8}  {_percent(share):>6}")
    overlap = report["overlap"]
    if overlap is not None:
        where = overlap["train"]
        print(f"\n{overlap['in_train']} of {overlap['n']} sources occur verbatim (normalised) in {where}")
    missed = failures(report)
    if show_failures and missed:
        print(f"\nnot accepted ({len(missed)}):")
        for row in missed:
            print(f"  [{row['category']}] {row['source']!r} -> {row['output']!r}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundle", type=Path, default=Path("bundles/en-es-small"), help="exported bundle")
    parser.add_argument("--variant", default="fp32", help="bundle variant (fp32, int8, ...)")
    parser.add_argument("--set", type=Path, default=DEFAULT_SET, help="the items (JSON lines)")
    parser.add_argument("--data", type=Path, default=Path("data"), help="corpus, for the overlap with train")
    parser.add_argument(
        "--no-memory", action="store_true", help="leave the bundle's translation memory out (the model alone)"
    )
    parser.add_argument("--limit", type=int, default=0, help="first N items of each category (0 = all)")
    parser.add_argument("--batch-size", type=int, default=32, help="texts per engine call")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0 = library default)")
    parser.add_argument("--show-failures", action="store_true", help="list every output not accepted")
    parser.add_argument("--json", type=Path, help="write the report (scores and every output) here")
    args = parser.parse_args(argv)
    items = select(load_items(args.set), args.limit)
    report = run(
        args.bundle, items, variant=args.variant, memory=not args.no_memory, data=args.data,
        batch_size=args.batch_size, device=args.device, threads=args.threads, set_path=args.set,
    )  # fmt: skip
    report["command"] = sys.argv if argv is None else ["python", "-m", "bench.everyday", *argv]
    print_report(report, args.show_failures)
    if args.json:
        write_report(args.json, report)
    overall = report["overall"]
    print(
        f"first five minutes: {overall['accepted']}/{overall['n']} accepted ({_percent(overall)}), "
        + ", ".join(f"{c} {_percent(s)}" for c, s in report["categories"].items())
        + f"; {report['total_seconds']} s"
    )
    return report


if __name__ == "__main__":
    main()
