"""Checkpoint averaging: the mean of the weights of the last validations, scored like the trainer scores.

    python -m model.average --run-dir runs/en-es-small --last 4 \\
        --tokenizer models/en-es-small/tokenizer.model [--data data] [--out runs/en-es-small/averaged]
    python -m model.average --checkpoints runs/en-es-small/last.pt models/en-es-small ... (any mix)

A checkpoint is a snapshot (`--keep-snapshots N` in model.train writes run-dir/snapshots/step-*.safetensors
at every validation), a `last.pt` training state, or a released model directory. Every checkpoint and
their average are scored with the trainer's checkpoint criterion: greedy BLEU / chrF on the same novel
valid pairs (`--valid-bleu-sentences`, default as in training runs), so the numbers compare with the
`step ...: novel BLEU` lines of train.log. `--out` writes the average as a release directory (fp16
safetensors, config, tokenizer, training.json with the scores and the averaged checkpoints); whether it
ships is the release procedure's decision (it must beat the current release on this criterion).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import sacrebleu
import torch
from safetensors.torch import load_file

from model.corpus import read_novel, read_split
from model.model import Transformer, TransformerConfig
from model.tokenizer import Tokenizer
from model.train import SNAPSHOTS, novel_valid_sample, save_release, translate


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """fp32 state dict of a snapshot (.safetensors), a training state (.pt) or a release directory."""
    if path.is_dir():
        path = path / "model.safetensors"
    if path.suffix == ".pt":
        state = torch.load(path, map_location="cpu", weights_only=False)["model"]
    else:
        state = load_file(str(path))
    return {k: v.float() for k, v in state.items()}


def load_config(path: Path) -> TransformerConfig:
    """The model config of a checkpoint: config.json beside a snapshot or in a release, or in last.pt."""
    if path.suffix == ".pt":
        return TransformerConfig.from_dict(
            torch.load(path, map_location="cpu", weights_only=False)["model_config"]
        )
    return TransformerConfig.from_dict(
        json.loads(((path if path.is_dir() else path.parent) / "config.json").read_text())
    )


def average(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Element-wise mean of state dicts with the same keys and shapes."""
    if not states:
        raise ValueError("nothing to average")
    keys = set(states[0])
    for s in states[1:]:
        if set(s) != keys:
            raise ValueError(f"checkpoints differ in their parameters: {sorted(keys ^ set(s))[:5]}")
    return {k: torch.stack([s[k] for s in states]).mean(dim=0) for k in states[0]}


def score(model: Transformer, tokenizer: Tokenizer, pairs: list[tuple[str, str]]) -> dict[str, float]:
    """Greedy novel valid BLEU / chrF, as model.train's validation computes them."""
    hyps = translate(model, tokenizer, [p[0] for p in pairs], torch.device("cpu"))
    refs = [[p[1] for p in pairs]]
    return {
        "valid_bleu": round(sacrebleu.corpus_bleu(hyps, refs).score, 2),
        "valid_chrf": round(sacrebleu.corpus_chrf(hyps, refs).score, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoints", type=Path, nargs="*", default=[], help="checkpoints to average")
    parser.add_argument("--run-dir", type=Path, help="average the newest --last snapshots of this run")
    parser.add_argument("--last", type=int, default=4)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--valid-bleu-sentences", type=int, default=400)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the average here as a release directory")
    args = parser.parse_args(argv)
    paths = list(args.checkpoints)
    if args.run_dir is not None:
        paths += sorted((args.run_dir / SNAPSHOTS).glob("step-*.safetensors"))[-args.last :]
    if len(paths) < 2:
        parser.error("need at least two checkpoints (--checkpoints, or --run-dir with --keep-snapshots runs)")
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.time()
    tokenizer = Tokenizer(args.tokenizer)
    valid = read_split(args.data, "valid")
    novel = [p for p, n in zip(valid, read_novel(args.data, "valid"), strict=True) if n]
    pairs = novel_valid_sample(novel, args.valid_bleu_sentences)
    states = [load_weights(p) for p in paths]
    config = load_config(paths[0])
    config.dropout = 0.0
    model = Transformer(config).eval()
    results = []
    for path, state in zip(paths, states, strict=True):
        model.load_state_dict(state, strict=False)
        results.append({"checkpoint": str(path), **score(model, tokenizer, pairs)})
        print(
            f"{path}: novel valid BLEU {results[-1]['valid_bleu']:.2f}, chrF {results[-1]['valid_chrf']:.2f}"
        )
    model.load_state_dict(average(states), strict=False)
    averaged = score(model, tokenizer, pairs)
    best = max(results, key=lambda r: r["valid_bleu"])
    print(
        f"average of {len(paths)}: novel valid BLEU {averaged['valid_bleu']:.2f}, "
        f"chrF {averaged['valid_chrf']:.2f} "
        f"(best single: {best['valid_bleu']:.2f}, {best['checkpoint']}; {len(pairs)} pairs, "
        f"{time.time() - started:.0f} s)"
    )
    if args.out is not None:
        metrics = {"best": {**averaged, "averaged": [str(p) for p in paths]}, "checkpoints": results}
        save_release(model, args.out, tokenizer, metrics)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
