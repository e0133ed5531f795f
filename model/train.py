"""Train the Transformer on the corpus with teacher forcing.

Label-smoothed cross-entropy, Adam (0.9, 0.98, 1e-9) with linear warm-up then inverse-square-root
decay, batches by token count over length-sorted buckets, gradient clipping, periodic validation
(loss, BLEU and chrF with sacrebleu), best-checkpoint keeping, resume, fixed seeds.

    python -m model.train --data data --tokenizer models/en-es-small/tokenizer.model \\
        --run-dir runs/en-es-small --release-dir runs/en-es-small/release --config small --hours 2

Training never writes into models/: `make release` promotes a run's weights there.

`--run-dir` keeps the full training state (`last.pt`, with optimizer; resumable, not committed),
written every `--save-every` steps, at each validation and on SIGTERM/SIGINT, so a run can be stopped at
any moment and continued with `--resume` (same batch order, no batch seen twice).
`--release-dir` receives the best weights so far as fp16 safetensors + config.json + metrics: the
model that ships. `--init-from DIR` starts from a released model instead of random weights (fresh
optimizer, learning-rate schedule continued from the release's step, re-warmed over `--rewarm` steps).

Validation: loss on 4,000 valid pairs, greedy BLEU/chrF on novel valid pairs (sources never in train: the
checkpoint criterion) and on all valid pairs, and accepted share on the commonest UI strings of train.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sacrebleu
import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from model.common_strings import load_common_strings, score_common_strings
from model.corpus import read_novel, read_split
from model.decode import greedy_decode, max_output_length
from model.depth import DECODER_MAP, ENCODER_MAP, deepen
from model.dictionaries import pair_provenance
from model.languages import DEFAULT_LANGUAGE
from model.model import Transformer, TransformerConfig, label_smoothed_loss
from model.tokenizer import Tokenizer
from runtime.machine import read_cpuinfo
from runtime.splits import target_language as corpus_target


@dataclass
class TrainConfig:
    config: str = "small"
    max_tokens: int = 3000  # per batch, padded target (and source) tokens
    max_sentences: int = 128  # rows per batch (0 = no cap); see make_batches
    max_len: int = 128  # drop longer training segments (in tokens)
    lr: float = 1e-3  # peak learning rate, reached at the end of warm-up
    warmup: int = 1000
    label_smoothing: float = 0.1
    clip: float = 1.0
    dropout: float = 0.1
    epochs: int = 100
    hours: float = 0.0  # wall-clock budget; 0 = no limit
    max_steps: int = 0  # 0 = no limit
    patience: int = 16  # stop once the last N validations beat the earlier best loss by < min_delta (0 = off)
    min_delta: float = 0.005  # valid loss; about the spread between neighbouring validations
    valid_every: int = 500
    valid_bleu_sentences: int = 500
    save_every: int = 100  # steps between last.pt checkpoints (besides validation)
    keep_snapshots: int = 0  # keep the weights of the last N validations in run-dir/snapshots (model.average)
    rewarm: int = 100  # with --init-from: steps to ramp the learning rate back up (fresh Adam moments)
    cooldown: int = 0  # steps of linear decay to 0 from where it starts, then the run ends (0 = none)
    repeat_frequent: int = 1  # 1: a pair shipped by n packages is seen 1 + floor(log2 n) times an epoch
    repeat_dictionaries: int = 1  # a pair only bilingual dictionaries give is seen N times as often
    seed: int = 1234
    threads: int = 0  # 0 = torch default
    norm_first: bool = False  # pre-norm (TransformerConfig.norm_first); --init-from/--resume keep theirs
    encoder_layers: int = 0  # 0 = the preset's (or the --init-from model's); see model/depth.py
    decoder_layers: int = 0
    encoder_map: str = ENCODER_MAP  # how --init-from fills other layer counts (model/depth.py)
    decoder_map: str = DECODER_MAP
    bf16: bool = False  # bf16 autocast for the training steps (validation stays fp32)
    bf16_native: bool = False  # bf16 only where it pays off: a GPU, or a CPU with AVX512-BF16 or AMX


# --help lines of the TrainConfig fields whose names do not say it all.
OPTION_HELP = {
    "hours": "stop after this many hours of wall-clock time, checkpointed (0 = no limit)",
    "max_steps": "stop at this optimizer step; the count goes on from an --init-from release's step "
    "(0 = no limit)",
    "cooldown": "end the run with a linear decay of the learning rate to 0 over N steps from now",
    "patience": "stop once none of the last N validations lowered the best valid loss by --min-delta",
    "keep_snapshots": "keep the weights of the last N validations in run-dir/snapshots (make average)",
    "max_tokens": "padded tokens per batch",
    "max_sentences": "rows per batch (0 = no cap)",
    "rewarm": "with --init-from: steps to ramp the learning rate back up",
    "threads": "torch threads (0 = torch's default)",
    "encoder_layers": "encoder layers (0 = the preset's, or the --init-from model's: other counts copy its "
    "layers as --encoder-map says, model/depth.py)",
    "decoder_layers": "decoder layers (0 = the preset's or the --init-from model's; see --encoder-layers)",
    "repeat_dictionaries": "a pair only bilingual dictionaries give is seen N times as often an epoch "
    "(pharmacy -> farmacia: words the catalogs lack)",
    "encoder_map": "with --init-from and another --encoder-layers: repeat, stack or spread (model/depth.py)",
    "decoder_map": "with --init-from and another --decoder-layers: repeat, stack or spread",
    "bf16": "bf16 autocast for the training forward and backward passes (weights, optimizer and "
    "validation stay fp32): 1.7x faster steps on a CPU with AVX512-BF16 or AMX, slower on one without "
    "(it is emulated there); model.gpu_train's default on CUDA",
    "bf16_native": "--bf16 where it pays off (a GPU, or a CPU with AVX512-BF16 or AMX), fp32 elsewhere, "
    "where emulated bf16 steps take about twice as long (make grow's default)",
    "norm_first": "pre-norm: x + Sublayer(LN(x)) and a final LayerNorm per stack (Xiong et al. 2020), "
    "for deep models, which post-norm fails to train; default post-norm, as the paper and the shipped "
    "models. An --init-from release or a --resume run keeps its own model's",
}


def learning_rate(
    step: int,
    peak: float,
    warmup: int,
    start_step: int = 0,
    rewarm: int = 0,
    cooldown_start: int = 0,
    cooldown: int = 0,
) -> float:
    """Linear warm-up to `peak`, then decay with 1/sqrt(step) (the paper's schedule, peak-normalised).

    A run continued from a release at `start_step` ramps linearly back to the schedule over `rewarm` steps:
    its Adam moments start at zero, and a full-size first update would undo part of the release.

    A cooldown ends a run: from `cooldown_start` the rate falls linearly to 0 over `cooldown` steps (the
    "decay" of warmup-stable-decay schedules): the inverse-square-root tail alone never settles."""
    step = max(step, 1)
    if cooldown and step > cooldown_start:
        left = max(0.0, 1.0 - (step - cooldown_start) / cooldown)
        rate = learning_rate(cooldown_start, peak, warmup) * left
    else:
        rate = peak * min(step / warmup, math.sqrt(warmup / step))
    # The re-warm ramp multiplies whatever the schedule says, so a cooldown may start with the run
    # (a fine-tune from a release: --init-from with --cooldown N decays from the release's rate).
    if rewarm and step <= start_step + rewarm:
        rate *= max(step - start_step, 1) / rewarm
    return rate


def loss_windows(history: list[dict], patience: int) -> tuple[float, float] | None:
    """(best valid loss before the last `patience` validations, best among them); None when there are
    not more than `patience` validations (or patience <= 0). The validations of the model a grown one
    started from (OTHER_DEPTH_RUN) do not count: a 6+2 model from a 3+3 one stopped 500 steps short,
    none of its losses being below the 3+3 model's."""
    losses = [r["valid_loss"] for r in history if r.get("run") != OTHER_DEPTH_RUN]
    if patience <= 0 or len(losses) <= patience:
        return None
    return min(losses[:-patience]), min(losses[-patience:])


def converged(history: list[dict], patience: int, min_delta: float) -> bool:
    """The convergence rule: none of the last `patience` validations lowered the best valid loss of
    the ones before by `min_delta` or more.

    On valid loss, not BLEU: 400-sentence BLEU swings by +-1.5 between neighbouring checkpoints, the loss
    over all valid pairs by about 0.005. Judged on the history only, so a resumed run gives the same
    answer."""
    windows = loss_windows(history, patience)
    return windows is not None and windows[1] > windows[0] - min_delta


def make_batches(
    lengths: list[tuple[int, int]], max_tokens: int, rng: random.Random, max_sentences: int = 0
) -> list[list[int]]:
    """Group example indices of similar length so that padded tokens per batch stay <= max_tokens and
    (when max_sentences > 0) rows per batch <= max_sentences.

    The row cap matters for short segments: without it the one- and two-word UI strings (a third of the
    corpus is under 6 tokens) fill a handful of batches of ~1,500 rows, so "stop after one word" is
    learned on ~1% of the steps and forgotten in between (the model said `Guardar Guardar Guardar`)."""
    order = sorted(range(len(lengths)), key=lambda i: (max(lengths[i]), rng.random()))
    batches, current, longest = [], [], 0
    for i in order:
        longest_if_added = max(longest, *lengths[i])
        full = max_sentences > 0 and len(current) >= max_sentences
        if current and (full or longest_if_added * (len(current) + 1) > max_tokens):
            batches.append(current)
            current, longest_if_added = [], max(lengths[i])
        current.append(i)
        longest = longest_if_added
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def collate(
    examples: list[tuple[list[int], list[int]]], pad_id: int, bos_id: int, eos_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """src (B,S), tgt_in = BOS + y (B,T), tgt_out = y + EOS (B,T): targets shifted by one."""
    src_len = max(len(s) for s, _ in examples)
    tgt_len = max(len(t) for _, t in examples) + 1
    src = torch.full((len(examples), src_len), pad_id, dtype=torch.long)
    tgt_in = torch.full((len(examples), tgt_len), pad_id, dtype=torch.long)
    tgt_out = torch.full((len(examples), tgt_len), pad_id, dtype=torch.long)
    for row, (s, t) in enumerate(examples):
        src[row, : len(s)] = torch.tensor(s)
        tgt_in[row, : len(t) + 1] = torch.tensor([bos_id, *t])
        tgt_out[row, : len(t) + 1] = torch.tensor([*t, eos_id])
    return src, tgt_in, tgt_out


def translate(
    model: Transformer, tokenizer: Tokenizer, texts: list[str], device: torch.device, batch_size: int = 64
) -> list[str]:
    """Greedy translations, batched by length (validation only; the server uses the ONNX engine)."""
    model.eval()
    encoded = tokenizer.encode_batch(texts)
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
    outputs: list[str] = [""] * len(texts)
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            ids = [encoded[i][: model.config.max_positions - 2] for i in idx]
            src = torch.full((len(ids), max(map(len, ids))), tokenizer.pad_id, dtype=torch.long)
            for row, seq in enumerate(ids):
                src[row, : len(seq)] = torch.tensor(seq)
            max_len = torch.tensor([max_output_length(len(seq)) for seq in ids])
            hyps = greedy_decode(model, src.to(device), max_len.to(device))
            for i, hyp in zip(idx, tokenizer.decode_batch(hyps), strict=True):
                outputs[i] = hyp
    return outputs


def evaluate_loss(
    model: Transformer, batches: list[list[tuple[list[int], list[int]]]], device: torch.device
) -> float:
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for examples in batches:
            src, tgt_in, tgt_out = (t.to(device) for t in collate(examples, 0, 1, 2))
            loss_sum, n = label_smoothed_loss(model(src, tgt_in), tgt_out, 0, 0.0)
            total += float(loss_sum)
            count += int(n)
    return total / max(count, 1)


@dataclass
class Validation:
    """What every validation measures, built once from the corpus (the same pairs every time): loss on
    4,000 valid pairs, greedy BLEU/chrF on `bleu_sentences` novel valid pairs (the checkpoint criterion)
    and on as many of all valid pairs, and the commonest UI strings of train."""

    batches: list[list[tuple[list[int], list[int]]]]
    bleu_sets: dict[str, list[tuple[str, str]]]
    common: list[Any]

    @classmethod
    def load(
        cls, data: Path, tokenizer: Tokenizer, max_len: int, max_tokens: int, bleu_sentences: int
    ) -> Validation:
        common = load_common_strings(data) if (data / "train.jsonl").exists() else []
        pairs, novel = read_split(data, "valid"), read_novel(data, "valid")
        return cls.from_pairs(pairs, novel, common, tokenizer, max_len, max_tokens, bleu_sentences)

    @classmethod
    def from_pairs(
        cls,
        pairs: list[tuple[str, str]],
        novel_flags: list[bool],
        common: list[Any],
        tokenizer: Tokenizer,
        max_len: int,
        max_tokens: int,
        bleu_sentences: int,
    ) -> Validation:
        """The same sets from valid pairs already read (model.gpu_train reads them from a pack)."""
        novel = [p for p, is_novel in zip(pairs, novel_flags, strict=True) if is_novel]
        sample = random.Random(0).sample(pairs, min(len(pairs), 4000))
        valid = tokenize_pairs(tokenizer, sample, max_len)
        lengths = [(len(s), len(t) + 1) for s, t in valid]
        batches = [[valid[i] for i in b] for b in make_batches(lengths, max_tokens, random.Random(0))]
        bleu_sets = {"novel": novel_valid_sample(novel, bleu_sentences), "all": sample[:bleu_sentences]}
        return cls(batches, bleu_sets, common)

    def measure(self, model: Transformer, tokenizer: Tokenizer, device: torch.device) -> dict[str, Any]:
        """valid_loss, valid_bleu / valid_chrf (novel: the criterion), valid_bleu_all / valid_chrf_all,
        common_accepted_percent and common_repeated_word."""
        out: dict[str, Any] = {"valid_loss": round(evaluate_loss(model, self.batches, device), 4)}
        for name, pairs in self.bleu_sets.items():
            hyps = translate(model, tokenizer, [p[0] for p in pairs], device)
            refs = [[p[1] for p in pairs]]
            suffix = "" if name == "novel" else f"_{name}"
            out[f"valid_bleu{suffix}"] = round(sacrebleu.corpus_bleu(hyps, refs).score, 2)
            out[f"valid_chrf{suffix}"] = round(sacrebleu.corpus_chrf(hyps, refs).score, 2)
        common = score_common_strings(
            self.common, translate(model, tokenizer, [c.source for c in self.common], device)
        )
        out["common_accepted_percent"] = common["accepted_percent"]
        out["common_repeated_word"] = common["repeated_word"]
        return out


def describe_scores(r: dict[str, Any]) -> str:
    """A validation's scores as train.log prints them."""
    return (
        f"valid loss {r['valid_loss']:.3f}, novel BLEU {r['valid_bleu']:.2f} chrF {r['valid_chrf']:.2f}, "
        f"all BLEU {r['valid_bleu_all']:.2f}, common strings {r['common_accepted_percent']}% "
        f"({r['common_repeated_word']} repeated)"
    )


# History label of the validations a model grown to other layer counts (model/depth.py) inherits from the
# model it grew from: another model, so the convergence rule does not weigh its losses.
OTHER_DEPTH_RUN = "other-depth"
OLD_SPLIT_RUNS = ("old-split", "init")  # history labels of rows on an earlier split ("init": the old name)


def inherited_run(row: dict) -> str:
    """The label of a validation row an --init-from run inherits from its release: "old-split" for rows
    validated on an earlier split of the corpus (not comparable), OTHER_DEPTH_RUN for those of the model a
    grown one started from, else "parent": the lineage's own rows, on the valid split the continuation
    keeps."""
    if row.get("run") == OTHER_DEPTH_RUN:
        return OTHER_DEPTH_RUN  # still another model's, however many continuations later
    return "old-split" if row.get("run") in OLD_SPLIT_RUNS else "parent"


def save_release(model: Transformer, release_dir: Path, tokenizer: Tokenizer, metrics: dict) -> None:
    """Best weights as fp16 safetensors plus config and tokenizer: a self-contained model directory."""
    release_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(release_dir / "model.safetensors"), metadata={"format": "pt"})
    (release_dir / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
    if tokenizer.model_path.resolve() != (release_dir / "tokenizer.model").resolve():
        shutil.copyfile(tokenizer.model_path, release_dir / "tokenizer.model")
    (release_dir / "training.json").write_text(json.dumps(metrics, indent=2) + "\n")


def release_metrics(
    model: Transformer,
    record: dict,
    history: list[dict],
    train_config: dict,
    device: str,
    hardware: str,
    train_pairs: int | None,
    target_language: str = DEFAULT_LANGUAGE,
) -> dict:
    """training.json of a release: the validation it was chosen on, the curve, settings and hardware, and
    the corpus's target language (the export labels the bundle's pair with it)."""
    return {
        "best": record,
        "history": history,
        "train_config": train_config,
        "parameters": model.num_parameters(),
        "device": device,
        "hardware": hardware,
        "threads": record.get("threads", torch.get_num_threads()),
        "train_pairs": train_pairs,
        "target_language": target_language,
    }  # fmt: skip


SNAPSHOTS = "snapshots"


def novel_valid_sample(valid_novel: list[tuple[str, str]], n: int) -> list[tuple[str, str]]:
    """The novel valid pairs the checkpoint criterion is measured on (the same n pairs every time)."""
    return random.Random(0).sample(valid_novel, min(len(valid_novel), n))


def save_snapshot(model: Transformer, snapshot_dir: Path, step: int, keep: int) -> None:
    """fp32 weights of this validation step as snapshot_dir/step-NNNNNNN.safetensors; only the newest
    `keep` are kept (model.average averages them)."""
    snapshot_dir.mkdir(parents=True, exist_ok=True)
    (snapshot_dir / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(snapshot_dir / f"step-{step:07d}.safetensors"), metadata={"step": str(step)})
    for old in sorted(snapshot_dir.glob("step-*.safetensors"))[:-keep]:
        old.unlink()


def load_release(model_dir: Path, device: str | torch.device = "cpu") -> Transformer:
    """Load a released model directory (config.json + model.safetensors) in fp32 for inference."""
    config = TransformerConfig.from_dict(json.loads((model_dir / "config.json").read_text()))
    config.dropout = 0.0
    model = Transformer(config)
    state = {k: v.float() for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    model.load_state_dict(state, strict=False)
    return model.to(device).eval()


def repeat_frequent(
    pairs: list[tuple[str, str]], jsonl: Path, dictionaries: int = 1, by_packages: bool = True
) -> list[tuple[str, str]]:
    """Each pair 1 + floor(log2 n) times, n = packages of the split that ship it (from train.jsonl), and a
    pair that only bilingual dictionaries give (model.dictionaries) `dictionaries` times as often.

    Dedupe keeps one copy of `Cancel -> Cancelar` although 82 packages ship it; the commonest UI strings
    then weigh as much as any help sentence, and the model's greedy answer for them stayed unstable
    (70-92% accepted between validations). Weighting by log of the package count adds 18k pairs (+3.9%
    target characters) to 261k. The dictionaries' word pairs (52k of Spanish's 552k) are seen once an
    epoch, too seldom for a small model to learn `pharmacy -> farmacia` (issue 30's everyday inputs):
    `--repeat-dictionaries` weighs them up. `by_packages=False`: every pair once, dictionaries aside.
    Pairs beyond the jsonl (or without one) count once."""
    if not jsonl.exists():
        return pairs
    counts, dictionary_only = pair_provenance(jsonl)
    if not by_packages:
        counts = [1] * len(counts)
    return repeat_by_counts(pairs, counts, dictionary_only, dictionaries)


def repeat_by_counts(
    pairs: list[tuple[str, str]],
    counts: list[int],
    dictionary_only: list[bool] | None = None,
    dictionaries: int = 1,
) -> list[tuple[str, str]]:
    """Each pair 1 + floor(log2 n) times for its package count n (pairs beyond `counts` once), times
    `dictionaries` for a pair flagged in `dictionary_only`."""
    flags = list(dictionary_only or [])
    flags += [False] * (len(pairs) - len(flags))
    counts = counts + [1] * (len(pairs) - len(counts))
    repeated = []
    for pair, n, only in zip(pairs, counts, flags, strict=False):
        repeated.extend([pair] * ((1 + int(math.log2(max(n, 1)))) * (dictionaries if only else 1)))
    return repeated


def release_last(run_dir: Path, release_dir: Path, tokenizer: Tokenizer) -> None:
    """Release the weights of run_dir/last.pt, with its latest validation as the 'best' record.

    The trainer releases on novel-valid BLEU alone; this is for choosing a checkpoint on the whole
    validation record (BLEU, chrF, common UI strings), as the model card reports it."""
    state = torch.load(run_dir / "last.pt", map_location="cpu", weights_only=False)
    config = TransformerConfig.from_dict(state["model_config"])
    model = Transformer(config)
    model.load_state_dict(state["model"])
    history = state["history"]
    if not history or history[-1]["step"] != state["step"]:
        raise SystemExit(
            f"{run_dir / 'last.pt'} was saved between validations (step {state['step']}); "
            "release a checkpoint written by a validation"
        )
    hardware = state.get("hardware") or hardware_name(torch.device("cpu"))
    metrics = release_metrics(
        model,
        history[-1],
        history,
        state["train_config"],
        "cpu",
        hardware,
        state.get("train_pairs"),
        state.get("target_language", DEFAULT_LANGUAGE),
    )
    save_release(model, release_dir, tokenizer, metrics)
    print(f"released step {state['step']} of {run_dir / 'last.pt'} -> {release_dir}")


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX): where --bf16 pays off."""
    flags = read_cpuinfo()[1]
    return "avx512_bf16" in flags or "amx_bf16" in flags


def hardware_name(device: torch.device) -> str:
    """What trained the model, for the model card: the GPU's name, else the CPU model and core count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = read_cpuinfo()[0] or platform.processor() or "CPU"
    return f"{cpu}, {os.cpu_count()} cores"


def tokenize_pairs(
    tokenizer: Tokenizer, pairs: list[tuple[str, str]], max_len: int
) -> list[tuple[list[int], list[int]]]:
    """Token ids of (source, target) pairs, dropping those longer than `max_len` tokens."""
    src = tokenizer.encode_batch([p[0] for p in pairs])
    tgt = tokenizer.encode_batch([p[1] for p in pairs])
    return [(s, t) for s, t in zip(src, tgt, strict=True) if len(s) <= max_len and len(t) < max_len]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--release-dir", type=Path, required=True)
    parser.add_argument("--resume", action="store_true", help="continue from run-dir/last.pt")
    parser.add_argument("--init-from", type=Path, help="start from this released model's weights")
    parser.add_argument(
        "--release-last",
        action="store_true",
        help="write run-dir/last.pt as the release (its latest validation as 'best') and exit",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--max-train-pairs", type=int, default=0, help="use only the first N pairs (smoke runs)"
    )
    for name, value in vars(TrainConfig()).items():
        flag = f"--{name.replace('_', '-')}"
        if isinstance(value, bool):
            parser.add_argument(flag, action="store_true", help=OPTION_HELP.get(name))
        else:
            parser.add_argument(flag, type=type(value), default=value, help=OPTION_HELP.get(name))
    args = parser.parse_args(argv)
    cfg = TrainConfig(**{k: getattr(args, k) for k in vars(TrainConfig())})
    if args.release_last:
        release_last(args.run_dir, args.release_dir, Tokenizer(args.tokenizer))
        return

    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else "cpu"
        if args.device == "auto"
        else args.device
    )
    if cfg.bf16_native and not cfg.bf16:
        cfg.bf16 = device.type != "cpu" or cpu_has_bf16()
        chosen = "bf16" if cfg.bf16 else "fp32 (no native bf16 on this CPU)"
        print(f"--bf16-native: {chosen}", file=sys.stderr)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)

    tokenizer = Tokenizer(args.tokenizer)
    target_language = corpus_target(args.data)  # a language code, or mul (model.multilingual)
    train_pairs = read_split(args.data, "train")
    if args.max_train_pairs:
        train_pairs = train_pairs[: args.max_train_pairs]
    if cfg.repeat_frequent or cfg.repeat_dictionaries != 1:
        train_pairs = repeat_frequent(
            train_pairs, args.data / "train.jsonl", cfg.repeat_dictionaries, bool(cfg.repeat_frequent)
        )
    print(f"tokenizing {len(train_pairs)} train pairs and the valid sets", file=sys.stderr)

    train = tokenize_pairs(tokenizer, train_pairs, cfg.max_len)
    validation = Validation.load(args.data, tokenizer, cfg.max_len, cfg.max_tokens, cfg.valid_bleu_sentences)

    last_path = args.run_dir / "last.pt"
    state = (
        torch.load(last_path, map_location=device, weights_only=False)
        if args.resume and last_path.exists()
        else None
    )
    config_factory = {"small": TransformerConfig.small, "base": TransformerConfig.base}[cfg.config]
    config = config_factory(tokenizer.vocab_size)
    config.norm_first = cfg.norm_first
    # A run that goes on keeps its model's architecture (post- or pre-norm), whatever the flags say; a
    # new one (from a preset or a release) takes the layer counts asked for.
    if state is not None:
        config = TransformerConfig.from_dict(state["model_config"])
    else:
        if args.init_from:
            config = TransformerConfig.from_dict(json.loads((args.init_from / "config.json").read_text()))
        config.n_encoder_layers = cfg.encoder_layers or config.n_encoder_layers
        config.n_decoder_layers = cfg.decoder_layers or config.n_decoder_layers
    config.dropout = cfg.dropout
    cfg.norm_first = config.norm_first  # the run's settings record the model it trains
    model = Transformer(config).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9)
    step, epoch, best_bleu, history, elapsed_before = 0, 0, -1.0, [], 0.0
    cooldown_start: int | None = None
    start_step, epoch_step, epoch_rng = 0, 0, rng.getstate()
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, epoch, best_bleu = state["step"], state["epoch"], state["best_bleu"]
        history, elapsed_before = state["history"], state.get("train_seconds", 0.0)
        start_step, epoch_step = state.get("start_step", 0), state.get("epoch_step", 0)
        cooldown_start = state.get("cooldown_start")
        if cooldown_start is not None and not cfg.cooldown:
            cfg.cooldown = state["train_config"]["cooldown"]  # a cooldown under way goes on
        epoch_rng = state.get("epoch_rng", state["rng"])
        before = state.get("train_config", {})
        if any(
            before.get(k, getattr(TrainConfig, k)) != getattr(cfg, k)
            for k in ("max_tokens", "max_sentences", "max_len", "repeat_frequent", "repeat_dictionaries")
        ):
            # another batching: the saved batch index means nothing any more; start a new epoch
            print(f"batching changed since {last_path}: starting a new epoch", file=sys.stderr)
            epoch, epoch_step, epoch_rng = epoch + 1, 0, state["rng"]
        torch.set_rng_state(state["torch_rng"])
        print(
            f"resumed from {last_path} at step {step} (epoch {epoch}, batch {epoch_step}), "
            f"best BLEU {best_bleu:.2f}",
            file=sys.stderr,
        )
    elif args.init_from:
        released = load_release(args.init_from, device)
        c = released.config
        grown = (c.n_encoder_layers, c.n_decoder_layers) != (config.n_encoder_layers, config.n_decoder_layers)
        if grown:
            released = deepen(
                released, config.n_encoder_layers, config.n_decoder_layers, cfg.encoder_map, cfg.decoder_map
            )
            print(
                f"layers {c.n_encoder_layers}+{c.n_decoder_layers} -> {config.n_encoder_layers}+"
                f"{config.n_decoder_layers}: encoder {cfg.encoder_map}, decoder {cfg.decoder_map}",
                file=sys.stderr,
            )
        model.load_state_dict(released.state_dict())
        release_info = json.loads((args.init_from / "training.json").read_text())
        step = start_step = release_info["best"]["step"]
        history = [
            dict(r, run=OTHER_DEPTH_RUN if grown else inherited_run(r))
            for r in release_info.get("history", [])
        ]
        elapsed_before = release_info["best"].get("train_seconds", 0.0)
        print(f"initialised from {args.init_from} (step {step}); fresh optimizer", file=sys.stderr)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.cooldown and cooldown_start is None:
        cooldown_start = step
        print(f"cooldown: learning rate to 0 over steps {step}-{step + cfg.cooldown}", file=sys.stderr)

    n_tgt_tokens = sum(len(t) + 1 for _, t in train)
    if cfg.bf16 and device.type == "cpu" and not cpu_has_bf16():
        print("--bf16: this CPU has neither AVX512-BF16 nor AMX: bf16 is emulated, slower", file=sys.stderr)
    print(
        f"model: {config.d_model}d {config.n_heads}h ff{config.d_ff} {config.n_encoder_layers}+"
        f"{config.n_decoder_layers} layers {'pre' if config.norm_first else 'post'}-norm, "
        f"{model.num_parameters() / 1e6:.2f}M parameters, device {device}"
        f"{', bf16 autocast' if cfg.bf16 else ''}, "
        f"{torch.get_num_threads()} threads; {len(train)} train pairs, {n_tgt_tokens} target tokens/epoch; "
        f"{len(validation.common)} common UI strings tracked",
        file=sys.stderr,
    )
    started = time.time()
    hardware = hardware_name(device)  # read once: checkpoints and releases record it
    deadline = started + cfg.hours * 3600 if cfg.hours else math.inf

    def checkpoint(train_seconds: float) -> None:
        """Everything needed to continue exactly here; written to a temporary file, then renamed."""
        tmp = last_path.with_suffix(".tmp")
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step,
                "epoch": epoch,
                "epoch_step": epoch_step,
                "epoch_rng": epoch_rng,
                "start_step": start_step,
                "cooldown_start": cooldown_start,
                "best_bleu": best_bleu,
                "history": history,
                "rng": rng.getstate(),
                "torch_rng": torch.get_rng_state(),
                "train_seconds": train_seconds,
                "train_config": vars(cfg),
                "model_config": config.to_dict(),
                "hardware": hardware,
                "train_pairs": len(train),
                "target_language": target_language,
            },
            tmp,
        )
        tmp.replace(last_path)

    def validate() -> dict:
        nonlocal best_bleu
        t0 = time.time()
        scores = validation.measure(model, tokenizer, device)
        bleu = scores["valid_bleu"]
        record = {"step": step, "epoch": epoch, **scores}
        record |= {
            "train_seconds": round(elapsed_before + time.time() - started, 1),
            "decode_seconds": round(time.time() - t0, 1),
            "threads": torch.get_num_threads(),
            "lr": optimizer.param_groups[0]["lr"],  # of the step just taken
        }
        history.append(record)
        improved = bleu > best_bleu
        if improved:
            best_bleu = bleu
            metrics = release_metrics(
                model, record, history, vars(cfg), str(device), hardware, len(train), target_language
            )
            save_release(model, args.release_dir, tokenizer, metrics)
        checkpoint(record["train_seconds"])
        if cfg.keep_snapshots:
            save_snapshot(model, args.run_dir / SNAPSHOTS, step, cfg.keep_snapshots)
        tqdm.write(
            f"step {step} epoch {epoch}: {describe_scores(scores)}{' (best, saved)' if improved else ''}",
            file=sys.stderr,
        )
        model.train()
        return record

    stopping = {"signal": None}

    def request_stop(signum: int, _frame: object) -> None:
        stopping["signal"] = signum  # finish the current step, checkpoint, exit

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    def finished() -> bool:
        """Whether the run is at its end: --max-steps, or a cooldown that is over. Checked before the
        first step too, so running a finished stage again (make model after an interruption) trains
        nothing."""
        over = cooldown_start is not None and cfg.cooldown and step >= cooldown_start + cfg.cooldown
        return bool(cfg.max_steps and step >= cfg.max_steps) or bool(over)

    stop = finished()
    while epoch < cfg.epochs and not stop:
        rng.setstate(epoch_rng)
        batches = make_batches(
            [(len(s), len(t) + 1) for s, t in train], cfg.max_tokens, rng, cfg.max_sentences
        )
        # A resumed epoch's bar starts where the epoch stopped, not at 0.
        progress = tqdm(
            batches[epoch_step:], desc=f"epoch {epoch}", unit="batch", mininterval=10, file=sys.stderr,
            initial=epoch_step, total=len(batches),
        )  # fmt: skip
        model.train()
        window_tokens, window_start = 0, time.time()
        for batch in progress:
            src, tgt_in, tgt_out = (t.to(device) for t in collate([train[i] for i in batch], 0, 1, 2))
            lr = learning_rate(
                step + 1, cfg.lr, cfg.warmup, start_step, cfg.rewarm if start_step else 0,
                cooldown_start or 0, cfg.cooldown,
            )  # fmt: skip
            for group in optimizer.param_groups:
                group["lr"] = lr
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
                loss_sum, n_tokens = label_smoothed_loss(model(src, tgt_in), tgt_out, 0, cfg.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            # Divided by the token budget, not by this batch's tokens: every token weighs the same, so
            # the many small batches of short strings (see make_batches) do not outweigh long text.
            (loss_sum / cfg.max_tokens).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            optimizer.step()
            step += 1
            epoch_step += 1
            window_tokens += int(n_tokens)
            if step % 20 == 0:
                rate = window_tokens / max(time.time() - window_start, 1e-6)
                progress.set_postfix(
                    loss=f"{float(loss_sum.detach() / n_tokens):.3f}", lr=f"{lr:.2e}", tok_s=f"{rate:.0f}"
                )
                window_tokens, window_start = 0, time.time()
            if step % cfg.valid_every == 0:
                validate()
                # A cooldown ends the run itself: the rule would cut it short on the parent's
                # validations (session 49: a continuation stopped 1,000 steps before its end).
                if cooldown_start is None and converged(history, cfg.patience, cfg.min_delta):
                    best = min(history, key=lambda r: r["valid_loss"])
                    tqdm.write(
                        f"converged at step {step}: no validation of the last {cfg.patience} lowered the "
                        f"valid loss by {cfg.min_delta} (best {best['valid_loss']:.3f} at step "
                        f"{best['step']})",
                        file=sys.stderr,
                    )
                    stop = True
                    break
            elif step % cfg.save_every == 0:
                checkpoint(elapsed_before + time.time() - started)
            if stopping["signal"] is not None:
                checkpoint(elapsed_before + time.time() - started)
                print(
                    f"stopped by signal {stopping['signal']} at step {step}; resume with --resume",
                    file=sys.stderr,
                )
                # As a process killed by the signal would: a recipe (make model) stops here instead of
                # going on to its next stage with a run that has not reached its end.
                raise SystemExit(128 + stopping["signal"])
            if cooldown_start is not None and step >= cooldown_start + cfg.cooldown:
                tqdm.write(f"cooldown finished at step {step}", file=sys.stderr)
            if time.time() > deadline or finished():
                stop = True
                break
        else:
            epoch, epoch_step, epoch_rng = epoch + 1, 0, rng.getstate()
    # the last step may just have been validated (a multiple of valid_every): not twice
    final = history[-1] if history and history[-1]["step"] == step else validate()
    run = [r for r in history if "run" not in r]  # this run's validations (inherited rows are labelled)
    best = max(run or history, key=lambda r: r["valid_bleu"])
    print(
        f"done: {step} steps, {epoch} epochs, {final['train_seconds'] / 60:.1f} min; best novel valid BLEU "
        f"{best['valid_bleu']} chrF {best['valid_chrf']} at step {best['step']} -> {args.release_dir}"
    )


if __name__ == "__main__":
    main()
