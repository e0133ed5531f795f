"""Choose the decoding defaults on the VALID split and write them to the model's decoding.json.

    python -m bench.tune_decoding --model models/en-es-small --data data [--bundle bundles/en-es-small]

For each GNMT length penalty alpha (beam 4), `bench.evaluate` scores a sample of valid (never test);
the default is the smallest alpha within `--tolerance` BLEU of the best, so the tie goes to the plainer
search. The result, with every alpha's BLEU / chrF / brevity penalty / common-string acceptance, goes
to decoding.json, which the export copies into every bundle (the server's defaults).
"""

# ruff: noqa: E501 - argparse help strings kept whole
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

from bench import evaluate

ALPHAS = (0.6, 1.0, 1.4, 2.0)


def brevity_penalty(bleu_detail: str) -> float:
    match = re.search(r"BP = ([\d.]+)", bleu_detail)
    return float(match.group(1)) if match else float("nan")


def choose(bleu_by_alpha: dict[float, float], tolerance: float) -> float:
    """The smallest alpha whose BLEU is within `tolerance` of the best."""
    best = max(bleu_by_alpha.values())
    return min(alpha for alpha, bleu in bleu_by_alpha.items() if bleu >= best - tolerance)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", type=Path, required=True, help="release directory (decoding.json is written)"
    )
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument(
        "--bundle", type=Path, help="score through the serving engine (faster) instead of torch"
    )
    parser.add_argument("--n", type=int, default=500, help="valid pairs to score")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alphas", type=float, nargs="+", default=list(ALPHAS))
    parser.add_argument(
        "--tolerance", type=float, default=0.2, help="BLEU within which the smaller alpha wins"
    )
    args = parser.parse_args(argv)
    backend = ["--bundle", str(args.bundle)] if args.bundle else ["--model", str(args.model)]
    rows: dict[float, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for alpha in args.alphas:
            out = Path(tmp) / f"{alpha}.json"
            evaluate.main(
                [*backend, "--data", str(args.data), "--split", "valid", "--n", str(args.n),
                 "--beam", str(args.beam), "--length-penalty", str(alpha), "--examples", "0", "--json", str(out)]
            )  # fmt: skip
            model = json.loads(out.read_text())["systems"]["model"]
            rows[alpha] = {
                "bleu": model["bleu"],
                "chrf": model["chrf"],
                "novel_bleu": model["novel"]["bleu"],
                "brevity_penalty": brevity_penalty(model["bleu_detail"]),
                "common_accepted_percent": model["common_strings"]["accepted_percent"],
            }
    chosen = choose({a: r["bleu"] for a, r in rows.items()}, args.tolerance)
    decoding = {
        "defaults": {"beam_size": args.beam, "num_hypotheses": 1, "length_penalty": chosen},
        "tuning": {
            "split": "valid",
            "sample": f"{args.n} pairs, seed {evaluate.DEFAULT_SEED} (bench.evaluate --split valid)",
            "rule": f"smallest alpha within {args.tolerance} BLEU of the best",
            "command": "python -m bench.tune_decoding "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            "bleu_by_alpha": {str(a): r["bleu"] for a, r in rows.items()},
            "by_alpha": {str(a): r for a, r in rows.items()},
        },
    }
    (args.model / "decoding.json").write_text(json.dumps(decoding, indent=2) + "\n")
    for alpha, row in rows.items():
        print(f"alpha {alpha}: " + ", ".join(f"{k} {v}" for k, v in row.items()))
    print(f"chosen length_penalty {chosen} -> {args.model / 'decoding.json'}")


if __name__ == "__main__":
    main()
