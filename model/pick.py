"""Which release ships: the candidate release directories compared on the trainer's own validation.

    python -m model.pick runs/en-fr-small/release runs/en-fr-small/averaged   # prints the winner's path

Each candidate's training.json holds a 'best' record made by model.train.Validation on the same valid
pairs (the run's best step in release/, the mean of the last snapshots in averaged/). The winner has the
higher greedy BLEU on the novel valid pairs, the checkpoint criterion of training; a tie (within
TIE_BLEU) goes to the lower valid loss. Averaging is no sure gain: for French, the mean of steps
5,000-6,500 (cooldown included) scored 34.82 against 34.88 for step 6,500 alone, and its loss was worse.
The choice is made on valid only; the test split is for the model card.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TIE_BLEU = 0.05  # BLEU points: the score is rounded to two decimals


def best_record(release_dir: Path) -> dict:
    """The 'best' validation record of a release directory's training.json."""
    record = json.loads((release_dir / "training.json").read_text()).get("best") or {}
    if "valid_bleu" not in record or "valid_loss" not in record:
        raise ValueError(f"{release_dir}/training.json has no best record with valid_bleu and valid_loss")
    return record


def pick(candidates: list[Path]) -> tuple[Path, list[str]]:
    """The winning directory and a line per candidate saying how it scored."""
    scored = [(path, best_record(path)) for path in candidates]
    top = max(r["valid_bleu"] for _, r in scored)
    tied = [(path, r) for path, r in scored if top - r["valid_bleu"] <= TIE_BLEU]
    winner = min(tied, key=lambda item: item[1]["valid_loss"])[0]
    lines = [
        f"{'*' if path == winner else ' '} {path}: novel valid BLEU {r['valid_bleu']:.2f}, "
        f"valid loss {r['valid_loss']:.4f}"
        + (f", all valid BLEU {r['valid_bleu_all']:.2f}" if "valid_bleu_all" in r else "")
        for path, r in scored
    ]
    return winner, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("candidates", nargs="+", type=Path, help="release directories (training.json)")
    args = parser.parse_args(argv)
    try:
        winner, lines = pick(args.candidates)
    except (OSError, ValueError) as error:
        print(f"model.pick: {error}", file=sys.stderr)
        return 2
    for line in lines:
        print(line, file=sys.stderr)
    print(winner)
    return 0


if __name__ == "__main__":
    sys.exit(main())
