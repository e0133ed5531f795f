"""Choose the decoding defaults on the VALID split and write them to the model's decoding.json.

    python -m bench.tune_decoding --model models/en-es-small --data data [--bundle bundles/en-es-small]

For each GNMT length penalty alpha (beam 4), `bench.evaluate` scores a sample of valid (never test);
the default is the smallest alpha within `--tolerance` BLEU of the best, so the tie goes to the plainer
search. With `--bundle` (the serving engine; the torch reference search has no guards), the decoding
guards are chosen next, one after the other with the same rule, each on top of the choices before it:
`no_repeat_ngram_size` (plainest first: 0 = off, then larger n, the weaker ban) and then
`repetition_penalty` (plainest first: 1.0 = off, then the smaller penalty). The result, with every
setting's BLEU / chrF / brevity penalty / common-string acceptance / common strings with a repeated
word, goes to decoding.json, which the export copies into every bundle (the server's defaults); the
guards are written to its "defaults" only when they were tuned.
"""

# ruff: noqa: E501 - argparse help strings kept whole
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections.abc import Callable, Hashable
from pathlib import Path

from bench import evaluate

ALPHAS = (0.6, 1.0, 1.4, 2.0)
NGRAM_SIZES = (0, 3, 4)
REPETITION_PENALTIES = (1.0, 1.1, 1.2)


def brevity_penalty(bleu_detail: str) -> float:
    match = re.search(r"BP = ([\d.]+)", bleu_detail)
    return float(match.group(1)) if match else float("nan")


def choose_plainest(
    bleu_by_setting: dict, tolerance: float, plainness: Callable[[Hashable], Hashable] = lambda v: v
):
    """The plainest setting (smallest `plainness` key) whose BLEU is within `tolerance` of the best."""
    best = max(bleu_by_setting.values())
    return min((s for s, bleu in bleu_by_setting.items() if bleu >= best - tolerance), key=plainness)


def choose(bleu_by_alpha: dict[float, float], tolerance: float) -> float:
    """The smallest alpha whose BLEU is within `tolerance` of the best."""
    return choose_plainest(bleu_by_alpha, tolerance)


def ngram_plainness(n: int) -> tuple[bool, int]:
    """0 (off) is plainest, then the larger n (it bans less)."""
    return (n > 0, -n)


def score(backend: list[str], args: argparse.Namespace, out: Path, alpha: float, extra: list[str]) -> dict:
    """One bench.evaluate run on the valid sample -> the numbers the choice and the report keep."""
    evaluate.main(
        [*backend, "--data", str(args.data), "--split", "valid", "--n", str(args.n),
         "--beam", str(args.beam), "--length-penalty", str(alpha), "--examples", "0", "--json", str(out), *extra,
         *(["--text-layer"] if getattr(args, "text_layer", False) else [])]
    )  # fmt: skip
    model = json.loads(out.read_text())["systems"]["model"]
    return {
        "bleu": model["bleu"],
        "chrf": model["chrf"],
        "novel_bleu": model["novel"]["bleu"],
        "brevity_penalty": brevity_penalty(model["bleu_detail"]),
        "repeated_word_percent": model["repeated_word"]["percent"],
        "common_accepted_percent": model["common_strings"]["accepted_percent"],
        "common_repeated_word": model["common_strings"]["repeated_word"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", type=Path, required=True, help="release directory (decoding.json is written)"
    )
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument(
        "--bundle",
        type=Path,
        help="score through the serving engine (faster; needed to tune the guards) instead of torch",
    )
    parser.add_argument(
        "--text-layer",
        action="store_true",
        help="score through the engine's text layer, as the service translates (--bundle only)",
    )
    parser.add_argument("--n", type=int, default=500, help="valid pairs to score")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alphas", type=float, nargs="+", default=list(ALPHAS))
    parser.add_argument(
        "--ngram-sizes", type=int, nargs="+", default=list(NGRAM_SIZES),
        help="no_repeat_ngram_size candidates (0 = off; --bundle only; just 0: not tuned)",
    )  # fmt: skip
    parser.add_argument(
        "--repetition-penalties", type=float, nargs="+", default=list(REPETITION_PENALTIES),
        help="repetition_penalty candidates (1.0 = off; --bundle only; just 1.0: not tuned)",
    )  # fmt: skip
    parser.add_argument(
        "--tolerance", type=float, default=0.2, help="BLEU within which the plainer setting wins"
    )
    args = parser.parse_args(argv)
    if args.text_layer and not args.bundle:
        parser.error("--text-layer needs --bundle (the text layer is the serving engine's)")
    if any(n < 0 for n in args.ngram_sizes) or any(p < 1.0 for p in args.repetition_penalties):
        parser.error("--ngram-sizes must be >= 0 and --repetition-penalties >= 1.0")
    backend = ["--bundle", str(args.bundle)] if args.bundle else ["--model", str(args.model)]
    ngrams, penalties = sorted(set(args.ngram_sizes) | {0}), sorted(set(args.repetition_penalties) | {1.0})
    tune_ngram = bool(args.bundle) and len(ngrams) > 1
    tune_penalty = bool(args.bundle) and len(penalties) > 1
    rows: dict[float, dict] = {}
    by_ngram: dict[int, dict] = {}
    by_penalty: dict[float, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for alpha in args.alphas:
            rows[alpha] = score(backend, args, Path(tmp) / f"{alpha}.json", alpha, [])
        chosen = choose({a: r["bleu"] for a, r in rows.items()}, args.tolerance)
        ngram, penalty = 0, 1.0
        if tune_ngram:
            for n in ngrams:
                extra = ["--no-repeat-ngram-size", str(n)]
                by_ngram[n] = (
                    rows[chosen]
                    if n == 0
                    else score(backend, args, Path(tmp) / f"ngram{n}.json", chosen, extra)
                )
            ngram = choose_plainest(
                {n: r["bleu"] for n, r in by_ngram.items()}, args.tolerance, ngram_plainness
            )
        if tune_penalty:
            for p in penalties:
                extra = ["--no-repeat-ngram-size", str(ngram), "--repetition-penalty", str(p)]
                out = Path(tmp) / f"penalty{p}.json"
                by_penalty[p] = (
                    by_ngram.get(ngram, rows[chosen])
                    if p == 1.0
                    else score(backend, args, out, chosen, extra)
                )
            penalty = choose_plainest({p: r["bleu"] for p, r in by_penalty.items()}, args.tolerance)
    if not args.bundle:
        print("decoding guards not tuned: they need --bundle (the torch reference search has none)")
    defaults: dict = {"beam_size": args.beam, "num_hypotheses": 1, "length_penalty": chosen}
    tuning: dict = {
        "split": "valid",
        "sample": f"{args.n} pairs, seed {evaluate.DEFAULT_SEED} (bench.evaluate --split valid)",
        "text_layer": bool(args.text_layer),
        "rule": f"smallest alpha within {args.tolerance} BLEU of the best",
        "command": "python -m bench.tune_decoding " + " ".join(argv if argv is not None else sys.argv[1:]),
        "bleu_by_alpha": {str(a): r["bleu"] for a, r in rows.items()},
        "by_alpha": {str(a): r for a, r in rows.items()},
    }
    if tune_ngram:
        defaults["no_repeat_ngram_size"] = ngram
        tuning["no_repeat_ngram_size_rule"] = (
            f"at the chosen alpha: 0 (off), else the largest n, within {args.tolerance} BLEU of the best"
        )
        tuning["by_no_repeat_ngram_size"] = {str(n): r for n, r in by_ngram.items()}
    if tune_penalty:
        defaults["repetition_penalty"] = penalty
        tuning["repetition_penalty_rule"] = (
            f"at the chosen alpha and n-gram size: the smallest penalty within {args.tolerance} BLEU of the best"
        )
        tuning["by_repetition_penalty"] = {str(p): r for p, r in by_penalty.items()}
    decoding = {"defaults": defaults, "tuning": tuning}
    (args.model / "decoding.json").write_text(json.dumps(decoding, indent=2) + "\n")
    for name, table in (
        ("alpha", rows),
        ("no_repeat_ngram_size", by_ngram),
        ("repetition_penalty", by_penalty),
    ):
        for value, row in table.items():
            print(f"{name} {value}: " + ", ".join(f"{k} {v}" for k, v in row.items()))
    chosen_text = ", ".join(
        f"{k} {v}" for k, v in defaults.items() if k not in ("beam_size", "num_hypotheses")
    )
    print(f"chosen {chosen_text} -> {args.model / 'decoding.json'}")


if __name__ == "__main__":
    main()
