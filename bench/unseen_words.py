"""Where the model loses to Apertium, is it words it never saw? Splits each package of an evaluation
(`bench.evaluate --json`, e.g. the model card's models/en-es-small/eval.json) into the pairs whose source
holds a word the training sources never contain (`source_words.txt`, inflections allowed: the text
layer's own test, `runtime.faithful.terms.is_known_word`) and the rest, and scores both parts with chrF,
model against Apertium.

    python -m bench.unseen_words models/en-es-small/eval.json [--words models/en-es-small/source_words.txt]
        [--examples 12] [--json out.json]

A rule-based system with a dictionary knows `Barium`; a model trained only on software catalogs has
never seen it and can only guess (`Cromio` for `Chromium`). That gap is the data's, not the decoder's.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from sacrebleu.metrics import CHRF

from runtime.faithful.terms import is_known_word, read_term_list

WORD = re.compile(r"[^\W\d_]{3,}")  # as source_words.txt counts words: letters only, 3 or more
SYSTEMS = ("model", "apertium")


def unseen_words(source: str, known: set[str]) -> list[str]:
    """The words of `source` that the training sources never hold (in any inflection)."""
    return [w for w in WORD.findall(source) if not is_known_word(w, known)]


def chrf(segments: list[dict[str, Any]], system: str) -> float | None:
    if not segments:
        return None
    refs = [[s["reference"] for s in segments]]
    return round(CHRF().corpus_score([s[system] for s in segments], refs).score, 1)


def split_by_package(segments: list[dict[str, Any]], known: set[str]) -> dict[str, dict[str, Any]]:
    """Per package: pairs, and for the pairs with and without an unseen word their count and chrF per
    system, plus the unseen words found (in order of first appearance)."""
    out: dict[str, dict[str, Any]] = {}
    for package in sorted({s["package"] for s in segments}):
        mine = [s for s in segments if s["package"] == package]
        words = {s["index"]: unseen_words(s["source"], known) for s in mine}
        parts = {
            "seen": [s for s in mine if not words[s["index"]]],
            "unseen": [s for s in mine if words[s["index"]]],
        }
        row: dict[str, Any] = {"pairs": len(mine)}
        for part, segs in parts.items():
            row[part] = {"pairs": len(segs)} | {sys: chrf(segs, sys) for sys in SYSTEMS}
        row["words"] = list(dict.fromkeys(w for s in mine for w in words[s["index"]]))
        out[package] = row
    return out


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.unseen_words", description=__doc__.split("\n\n")[0])
    p.add_argument("eval_json", type=Path, help="a bench.evaluate report with segments and Apertium")
    p.add_argument("--words", type=Path, default=Path("models/en-es-small/source_words.txt"))
    p.add_argument("--examples", type=int, default=12, help="unseen words shown per package")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    report = json.loads(args.eval_json.read_text(encoding="utf-8"))
    segments = report.get("segments") or []
    if not segments or any(sys not in segments[0] for sys in SYSTEMS):
        p.error(f"{args.eval_json}: needs segments with model and apertium outputs (bench.evaluate --json)")
    known = set(read_term_list(args.words))
    table = split_by_package(segments, known)
    print(f"{len(segments)} {report.get('split', '')} pairs of {args.eval_json}; chrF model / Apertium\n")
    print(
        "| package | pairs | all words seen: pairs | model | Apertium "
        "| a word never seen: pairs | model | Apertium |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for package, row in table.items():
        s, u = row["seen"], row["unseen"]
        print(
            f"| {package} | {row['pairs']} | {s['pairs']} | {_fmt(s['model'])} | {_fmt(s['apertium'])} | "
            f"{u['pairs']} | {_fmt(u['model'])} | {_fmt(u['apertium'])} |"
        )
    print()
    for package, row in table.items():
        if row["words"]:
            shown = ", ".join(row["words"][: args.examples])
            more = len(row["words"]) - args.examples
            print(f"{package}: {shown}" + (f" (+{more} more)" if more > 0 else ""))
    if args.json:
        args.json.write_text(json.dumps(table, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
