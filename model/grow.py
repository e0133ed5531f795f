"""Grow a released model to other layer counts in rounds: the recipe of the Spanish 6+2 release.

    python -m model.grow --from models/en-es-small --data runs/data-es-extra --run-dir runs/en-es-grow \\
        --encoder-layers 6 --decoder-layers 2 --rounds 8000,8000,4000 [--last 4] -- [model.train settings]

Round 1 starts from the release `--from` with the new layer counts (model/depth.py fills the added
layers), re-warms the learning rate and cools it down to 0 over the round's steps; every later round
starts from the mean of the previous round's last `--last` validation snapshots (model.average) and does
the same. Each round is `run-dir/round-N` (a model.train run with its own release/ and averaged/), so
the recipe resumes where it stopped: a finished round (its `averaged/` written) is skipped, a stopped
one resumes exactly. Prints the better of the last round's trainer pick and mean (model.pick, on valid);
with `--against MODEL --choice FILE` it also writes that path to FILE only if it beats MODEL on valid
(else an empty FILE): what `make grow` releases.
The settings after `--` go to every round's model.train (the Makefile passes its TRAIN_SETTINGS and
--bf16-native); `--init-from`, `--cooldown`, `--resume` and the layer counts are the recipe's own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from model import average, pick, train

RECIPE_FLAGS = ("--init-from", "--cooldown", "--resume", "--encoder-layers", "--decoder-layers", "--run-dir")


def rounds_of(text: str) -> list[int]:
    """`8000,8000,4000` -> [8000, 8000, 4000]: each round's cooldown steps, all positive."""
    try:
        rounds = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rounds takes step counts like 8000,4000, got {text!r}") from None
    if not rounds or min(rounds) <= 0:
        raise argparse.ArgumentTypeError(f"--rounds needs positive step counts, got {text!r}")
    return rounds


def round_dir(run_dir: Path, n: int) -> Path:
    return run_dir / f"round-{n}"


def grow(
    start: Path,
    data: Path,
    run_dir: Path,
    rounds: list[int],
    encoder_layers: int,
    decoder_layers: int,
    last: int,
    settings: list[str],
    rewarm: int = 200,
) -> Path:
    """Run the rounds (skipping finished ones) and return the better of the last round's candidates."""
    tokenizer = start / "tokenizer.model"
    source = start
    for n, steps in enumerate(rounds, start=1):
        here = round_dir(run_dir, n)
        averaged = here / "averaged"
        if (averaged / "training.json").exists():
            print(f"round {n}/{len(rounds)}: done ({averaged})", file=sys.stderr)
            source = averaged
            continue
        print(f"round {n}/{len(rounds)}: from {source}, cooldown over {steps} steps", file=sys.stderr)
        argv = [
            "--data", str(data), "--tokenizer", str(tokenizer), "--run-dir", str(here),
            "--release-dir", str(here / "release"), "--init-from", str(source), "--rewarm", str(rewarm),
            "--cooldown", str(steps), *settings,
        ]  # fmt: skip
        if n == 1:
            argv += ["--encoder-layers", str(encoder_layers), "--decoder-layers", str(decoder_layers)]
        if (here / "last.pt").exists():
            argv.append("--resume")
        train.main(argv)  # sets this process's torch threads, which the averaging keeps
        code = average.main(
            ["--run-dir", str(here), "--last", str(last), "--tokenizer", str(tokenizer), "--data", str(data)]
            + ["--out", str(averaged)]
        )
        if code:
            raise SystemExit(f"model.grow: averaging round {n} failed ({code})")
        source = averaged
    final = round_dir(run_dir, len(rounds))
    winner, lines = pick.pick([final / "release", final / "averaged"])
    for line in lines:
        print(line, file=sys.stderr)
    return winner


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    settings: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, settings = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--from", dest="start", type=Path, required=True, help="the release to grow")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--encoder-layers", type=int, required=True)
    parser.add_argument("--decoder-layers", type=int, required=True)
    parser.add_argument("--rounds", type=rounds_of, default=rounds_of("8000,8000,4000"))
    parser.add_argument("--last", type=int, default=4, help="snapshots averaged at the end of each round")
    parser.add_argument("--rewarm", type=int, default=200)
    parser.add_argument(
        "--against", type=Path, help="the shipped model: --choice names the winner only if it beats this"
    )
    parser.add_argument("--choice", type=Path, help="write the path to ship here (empty: nothing ships)")
    args = parser.parse_args(argv)
    clash = [f for f in settings if f.split("=", 1)[0] in RECIPE_FLAGS]
    if clash:
        parser.error(f"{', '.join(clash)}: set by the recipe itself, not among the training settings")
    if not (args.start / "training.json").is_file():
        parser.error(f"--from {args.start}: no released model there (training.json)")
    winner = grow(
        args.start, args.data, args.run_dir, args.rounds, args.encoder_layers, args.decoder_layers, args.last,
        settings, args.rewarm,
    )  # fmt: skip
    ship: Path | None = winner
    if args.against is not None:
        best, lines = pick.pick([args.against, winner])
        for line in lines:
            print(line, file=sys.stderr)
        ship = winner if best == winner else None
        if ship is None:
            print(f"{winner} does not beat {args.against} on valid: nothing ships", file=sys.stderr)
    if args.choice is not None:
        args.choice.parent.mkdir(parents=True, exist_ok=True)
        args.choice.write_text(f"{ship}\n" if ship else "", encoding="utf-8")
    print(winner)
    return 0


if __name__ == "__main__":
    sys.exit(main())
