"""Checkpoint averaging: the mean of the weights of the last validations, scored like the trainer scores.

    python -m model.average --run-dir runs/en-es-small --last 4 \\
        --tokenizer models/en-es-small/tokenizer.model [--data data] [--out runs/en-es-small/averaged]
    python -m model.average --checkpoints runs/en-es-small/last.pt models/en-es-small ... (any mix)

A checkpoint is a snapshot (`--keep-snapshots N` in model.train writes run-dir/snapshots/step-*.safetensors
at every validation), a `last.pt` training state, or a released model directory. Every checkpoint and
their average go through the trainer's own validation (`model.train.Validation`: valid loss, greedy
BLEU / chrF on the same novel valid pairs, which is the checkpoint criterion, and on all valid pairs, the
common UI strings), so the numbers compare with the `step ...:` lines of train.log. `--out` writes the
average as a release directory (fp16 safetensors, config, tokenizer, training.json: with `--run-dir`, the
run's curve and settings from its last.pt, and a 'best' record for the average); whether it ships is the
release procedure's decision (`make release RELEASE=...`: it must beat the current release on valid).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from model.languages import DEFAULT_LANGUAGE
from model.model import Transformer, TransformerConfig
from model.tokenizer import Tokenizer
from model.train import SNAPSHOTS, Validation, describe_scores, save_release


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
    config = load_config(paths[0])
    validation = Validation.load(args.data, tokenizer, 128, 3000, args.valid_bleu_sentences)
    states = [load_weights(p) for p in paths]
    model = Transformer(config).eval()
    cpu = torch.device("cpu")
    results = []
    for path, state in zip(paths, states, strict=True):
        model.load_state_dict(state, strict=False)
        results.append({"checkpoint": str(path), **validation.measure(model, tokenizer, cpu)})
        print(f"{path}: {describe_scores(results[-1])}", flush=True)
    model.load_state_dict(average(states), strict=False)
    averaged = validation.measure(model, tokenizer, cpu)
    best = max(results, key=lambda r: r["valid_bleu"])
    print(
        f"average of {len(paths)}: {describe_scores(averaged)}\n"
        f"best single checkpoint: novel BLEU {best['valid_bleu']:.2f} ({best['checkpoint']}); "
        f"{len(validation.bleu_sets['novel'])} novel valid pairs, {time.time() - started:.0f} s"
    )
    if args.out is not None:
        save_release(model, args.out, tokenizer, release_record(paths, averaged, results, args.run_dir))
        print(f"wrote {args.out}")
    return 0


def release_record(
    paths: list[Path], averaged: dict[str, Any], results: list[dict[str, Any]], run_dir: Path | None
) -> dict[str, Any]:
    """training.json of the averaged release: the run's curve and settings (from run-dir/last.pt) with a
    'best' record for the average, at the step of the newest averaged snapshot."""
    record: dict[str, Any] = {"averaged": [str(p) for p in paths], **averaged}
    metrics: dict[str, Any] = {"best": record, "checkpoints": results}
    if run_dir is not None and (run_dir / "last.pt").is_file():
        state = torch.load(run_dir / "last.pt", map_location="cpu", weights_only=False)
        steps = [int(p.stem.split("-")[1]) for p in paths if p.stem.startswith("step-")]
        newest = next(
            (r for r in state["history"] if steps and r["step"] == max(steps)), state["history"][-1]
        )
        record |= {k: newest[k] for k in ("step", "epoch", "train_seconds", "threads") if k in newest}
        record.update(averaged)
        metrics |= {
            "history": state["history"],
            "train_config": state["train_config"],
            "parameters": sum(v.numel() for v in state["model"].values()),
            "device": "cpu",
            "hardware": state.get("hardware", ""),
            "threads": newest.get("threads"),
            "train_pairs": state.get("train_pairs"),
            "target_language": state.get("target_language", DEFAULT_LANGUAGE),
        }
    return metrics


if __name__ == "__main__":
    sys.exit(main())
