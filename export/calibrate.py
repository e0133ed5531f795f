"""Activation ranges for the int8 variant's static activation scales, measured on the valid split.

    python -m export.calibrate --checkpoint models/en-es-small --data data [--n 1000] [--seed 20241126]

writes `<checkpoint>/int8_ranges.json`: for the input of every linear layer (and of the tied output
projection), the largest |value| each channel took over `--n` valid pairs, teacher-forced (the model
reads the reference translation, as in training; padding positions are left out). `python -m export`
reads the file and gives every int8 GEMM a fixed per-channel activation scale instead of quantizing each
row at run time (export/int8.py says why that is faster and stays batch-invariant).

The file names the weights it was measured with (sha256): a retrained model needs a new one, and the
export falls back to run-time per-row scales (and says so) when the file is missing or stale.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from export.int8 import OUTPUT_PROJECTION  # the tied projection (F.linear on embed.weight): no module
from export.verify import pad_batch
from model.model import Transformer
from model.tokenizer import MODEL_FILE, Tokenizer
from runtime.bundle import sha256_file
from runtime.splits import read_split

RANGES_FILE = "int8_ranges.json"
FORMAT_VERSION = 1
DEFAULT_SENTENCES = 1000
DEFAULT_SEED = 20241126
MAX_TOKENS = 128  # longer pairs are skipped, as training skips them


def _reads_source(module_name: str) -> bool:
    """Whether a linear layer reads source positions (encoder layers, cross-attention K/V) or target ones."""
    return module_name.startswith("encoder_layers.") or module_name.endswith("cross_attn.kv")


def measure_ranges(
    model: Transformer, pairs: list[tuple[list[int], list[int]]], batch_size: int = 32
) -> dict[str, np.ndarray]:
    """Per-channel max |input| of every nn.Linear (by module name) and of the output projection, over
    teacher-forced passes of (source ids, target ids) pairs; padding positions excluded."""
    cfg = model.config
    model = model.eval()
    ranges: dict[str, np.ndarray] = {}
    masks: dict[str, torch.Tensor] = {}

    def record(name: str, x: torch.Tensor, side: str) -> None:
        keep = masks[side]  # (B, T) True on real positions
        a = x.detach().abs()[keep]  # (N, C): the real positions' rows
        if a.numel() == 0:
            return
        m = a.amax(dim=0).double().numpy()
        ranges[name] = m if name not in ranges else np.maximum(ranges[name], m)

    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            side = "src" if _reads_source(name) else "tgt"
            hook = lambda _m, inp, name=name, side=side: record(name, inp[0], side)  # noqa: E731
            hooks.append(module.register_forward_pre_hook(hook))
    logits = model._logits

    def logits_recorded(x: torch.Tensor) -> torch.Tensor:
        record(OUTPUT_PROJECTION, x, "tgt")
        return logits(x)

    model._logits = logits_recorded  # type: ignore[method-assign]  # the tied projection is no module
    try:
        with torch.no_grad():
            for i in range(0, len(pairs), batch_size):
                chunk = pairs[i : i + batch_size]
                src = torch.from_numpy(pad_batch([s for s, _ in chunk], cfg.pad_id))  # (B, S)
                # BOS + target: the decoder's input (B, T)
                tgt = torch.from_numpy(pad_batch([[cfg.bos_id, *t] for _, t in chunk], cfg.pad_id))
                masks["src"], masks["tgt"] = src != cfg.pad_id, tgt != cfg.pad_id
                memory, src_pad_mask = model.encode(src)  # (B, S, D)
                model.decode(tgt, memory, src_pad_mask)  # (B, T, V), read by the hooks only
    finally:
        for h in hooks:
            h.remove()
        del model._logits
    return ranges


def valid_pairs(tokenizer: Tokenizer, data_dir: Path, n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """n (source ids, target ids) pairs drawn with random.Random(seed) from the valid split."""
    split = [(en, tgt) for en, tgt in read_split(data_dir, "valid") if en.strip() and tgt.strip()]
    picked = random.Random(seed).sample(range(len(split)), min(n, len(split)))
    out = []
    for i in sorted(picked):
        s, t = tokenizer.encode(split[i][0]), tokenizer.encode(split[i][1])
        if 0 < len(s) <= MAX_TOKENS and 0 < len(t) < MAX_TOKENS:
            out.append((s, t))
    return out


def write_ranges(
    checkpoint: Path, data_dir: Path, n: int = DEFAULT_SENTENCES, seed: int = DEFAULT_SEED
) -> Path:
    """Measure the checkpoint's activation ranges on data_dir's valid split into <checkpoint>/RANGES_FILE."""
    from model.train import load_release

    started = time.perf_counter()
    model = load_release(checkpoint)
    tokenizer = Tokenizer(checkpoint / MODEL_FILE)
    pairs = valid_pairs(tokenizer, data_dir, n, seed)
    if not pairs:
        raise ValueError(f"{data_dir}: no valid pairs to measure activation ranges on")
    ranges = measure_ranges(model, pairs)
    report: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "what": "per-channel max |input| of each linear layer, teacher-forced on valid pairs",
        "weights_sha256": sha256_file(checkpoint / "model.safetensors"),
        "split": "valid",
        "data": str(data_dir),
        "pairs": len(pairs),
        "seed": seed,
        "source_tokens": sum(len(s) for s, _ in pairs),
        "target_tokens": sum(len(t) + 1 for _, t in pairs),
        # 4 significant digits: the scale is a range, not a weight; the file stays ~100 KB
        "ranges": {k: [float(f"{v:.4g}") for v in ranges[k]] for k in sorted(ranges)},
    }
    out = checkpoint / RANGES_FILE
    out.write_text(json.dumps(report, separators=(",", ":")) + "\n", encoding="utf-8")
    print(
        f"{out}: {len(ranges)} layers' input ranges from {len(pairs)} valid pairs "
        f"({report['source_tokens']} source, {report['target_tokens']} target tokens) "
        f"in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
    )
    return out


def load_ranges(checkpoint: Path) -> tuple[dict[str, np.ndarray] | None, str]:
    """The checkpoint's ranges when its file exists and names these weights; else (None, why not)."""
    path = checkpoint / RANGES_FILE
    if not path.is_file():
        return None, f"no {RANGES_FILE} in {checkpoint} (python -m export.calibrate writes it)"
    report = json.loads(path.read_text(encoding="utf-8"))
    if report.get("format_version") != FORMAT_VERSION:
        return None, f"{path}: format {report.get('format_version')}, expected {FORMAT_VERSION}"
    if report.get("weights_sha256") != sha256_file(checkpoint / "model.safetensors"):
        return None, f"{path} was measured on other weights (stale: run python -m export.calibrate again)"
    return {k: np.asarray(v, dtype=np.float64) for k, v in report["ranges"].items()}, str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m export.calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, required=True, help="model directory (save_release)")
    ap.add_argument("--data", type=Path, required=True, help="corpus directory with the valid split")
    ap.add_argument("--n", type=int, default=DEFAULT_SENTENCES, help="valid pairs to measure on")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error("--n must be at least 1")
    if not (args.checkpoint / "model.safetensors").is_file():
        ap.error(f"{args.checkpoint} has no model.safetensors (need a save_release model directory)")
    if not (args.data / "valid.en").is_file():
        ap.error(f"{args.data} has no valid split: run `make corpus` (DATA=...) first")
    write_ranges(args.checkpoint, args.data, args.n, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
