"""Train the Transformer on the corpus with teacher forcing.

Label-smoothed cross-entropy, Adam (0.9, 0.98, 1e-9) with linear warm-up then inverse-square-root
decay, batches by token count over length-sorted buckets, gradient clipping, periodic validation
(loss, BLEU and chrF with sacrebleu), best-checkpoint keeping, resume, fixed seeds.

    python -m model.train --data data --tokenizer models/en-es-small/tokenizer.model \\
        --run-dir runs/en-es-small --release-dir models/en-es-small --config small --hours 2

`--run-dir` keeps the full training state (`last.pt`, with optimizer; resumable, not committed).
`--release-dir` receives the best weights so far as fp16 safetensors + config.json + metrics: the
model that ships.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import sacrebleu
import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from model.corpus import read_split
from model.decode import greedy_decode, max_output_length
from model.model import Transformer, TransformerConfig, label_smoothed_loss
from model.tokenizer import Tokenizer


@dataclass
class TrainConfig:
    config: str = "small"
    max_tokens: int = 3000  # per batch, padded target (and source) tokens
    max_len: int = 128  # drop longer training segments (in tokens)
    lr: float = 1e-3  # peak learning rate, reached at the end of warm-up
    warmup: int = 1000
    label_smoothing: float = 0.1
    clip: float = 1.0
    dropout: float = 0.1
    epochs: int = 100
    hours: float = 0.0  # wall-clock budget; 0 = no limit
    max_steps: int = 0  # 0 = no limit
    valid_every: int = 500
    valid_bleu_sentences: int = 500
    seed: int = 1234
    threads: int = 0  # 0 = torch default


def learning_rate(step: int, peak: float, warmup: int) -> float:
    """Linear warm-up to `peak`, then decay with 1/sqrt(step) (the paper's schedule, peak-normalised)."""
    step = max(step, 1)
    return peak * min(step / warmup, math.sqrt(warmup / step))


def make_batches(lengths: list[tuple[int, int]], max_tokens: int, rng: random.Random) -> list[list[int]]:
    """Group example indices of similar length so that padded tokens per batch stay <= max_tokens."""
    order = sorted(range(len(lengths)), key=lambda i: (max(lengths[i]), rng.random()))
    batches, current, longest = [], [], 0
    for i in order:
        longest_if_added = max(longest, *lengths[i])
        if current and longest_if_added * (len(current) + 1) > max_tokens:
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


def save_release(model: Transformer, release_dir: Path, tokenizer: Tokenizer, metrics: dict) -> None:
    """Best weights as fp16 safetensors plus config and tokenizer: a self-contained model directory."""
    release_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(release_dir / "model.safetensors"), metadata={"format": "pt"})
    (release_dir / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
    if tokenizer.model_path.resolve() != (release_dir / "tokenizer.model").resolve():
        shutil.copyfile(tokenizer.model_path, release_dir / "tokenizer.model")
    (release_dir / "training.json").write_text(json.dumps(metrics, indent=2) + "\n")


def load_release(model_dir: Path, device: str | torch.device = "cpu") -> Transformer:
    """Load a released model directory (config.json + model.safetensors) in fp32 for inference."""
    config = TransformerConfig.from_dict(json.loads((model_dir / "config.json").read_text()))
    config.dropout = 0.0
    model = Transformer(config)
    state = {k: v.float() for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    model.load_state_dict(state, strict=False)
    return model.to(device).eval()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--release-dir", type=Path, required=True)
    parser.add_argument("--resume", action="store_true", help="continue from run-dir/last.pt")
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--max-train-pairs", type=int, default=0, help="use only the first N pairs (smoke runs)"
    )
    for name, value in vars(TrainConfig()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args(argv)
    cfg = TrainConfig(**{k: getattr(args, k) for k in vars(TrainConfig())})

    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else "cpu"
        if args.device == "auto"
        else args.device
    )
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)

    tokenizer = Tokenizer(args.tokenizer)
    train_pairs = read_split(args.data, "train")
    valid_pairs = read_split(args.data, "valid")
    if args.max_train_pairs:
        train_pairs = train_pairs[: args.max_train_pairs]
    print(f"tokenizing {len(train_pairs)} train and {len(valid_pairs)} valid pairs", file=sys.stderr)

    def tokenized(pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        src = tokenizer.encode_batch([p[0] for p in pairs])
        tgt = tokenizer.encode_batch([p[1] for p in pairs])
        return [
            (s, t) for s, t in zip(src, tgt, strict=True) if len(s) <= cfg.max_len and len(t) < cfg.max_len
        ]

    train = tokenized(train_pairs)
    valid_sample = random.Random(0).sample(valid_pairs, min(len(valid_pairs), 4000))
    valid = tokenized(valid_sample)
    valid_batches = [
        [valid[i] for i in b]
        for b in make_batches([(len(s), len(t) + 1) for s, t in valid], cfg.max_tokens, random.Random(0))
    ]
    bleu_pairs = valid_sample[: cfg.valid_bleu_sentences]

    config_factory = {"small": TransformerConfig.small, "base": TransformerConfig.base}[cfg.config]
    config = config_factory(tokenizer.vocab_size)
    config.dropout = cfg.dropout
    model = Transformer(config).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9)
    step, epoch, best_bleu, history, elapsed_before = 0, 0, -1.0, [], 0.0
    last_path = args.run_dir / "last.pt"
    if args.resume and last_path.exists():
        state = torch.load(last_path, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, epoch, best_bleu = state["step"], state["epoch"], state["best_bleu"]
        history, elapsed_before = state["history"], state.get("train_seconds", 0.0)
        rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        print(
            f"resumed from {last_path} at step {step}, epoch {epoch}, best BLEU {best_bleu:.2f}",
            file=sys.stderr,
        )
    args.run_dir.mkdir(parents=True, exist_ok=True)

    n_tgt_tokens = sum(len(t) + 1 for _, t in train)
    print(
        f"model: {config.d_model}d {config.n_heads}h ff{config.d_ff} {config.n_encoder_layers}+"
        f"{config.n_decoder_layers} layers, {model.num_parameters() / 1e6:.2f}M parameters, device {device}, "
        f"{torch.get_num_threads()} threads; {len(train)} train pairs, {n_tgt_tokens} target tokens/epoch",
        file=sys.stderr,
    )
    started = time.time()
    deadline = started + cfg.hours * 3600 if cfg.hours else math.inf

    def validate() -> dict:
        nonlocal best_bleu
        valid_loss = evaluate_loss(model, valid_batches, device)
        t0 = time.time()
        hyps = translate(model, tokenizer, [p[0] for p in bleu_pairs], device)
        refs = [p[1] for p in bleu_pairs]
        bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
        chrf = sacrebleu.corpus_chrf(hyps, [refs]).score
        record = {
            "step": step,
            "epoch": epoch,
            "valid_loss": round(valid_loss, 4),
            "valid_bleu": round(bleu, 2),
            "valid_chrf": round(chrf, 2),
            "train_seconds": round(elapsed_before + time.time() - started, 1),
            "decode_seconds": round(time.time() - t0, 1),
        }
        history.append(record)
        improved = bleu > best_bleu
        if improved:
            best_bleu = bleu
            save_release(
                model,
                args.release_dir,
                tokenizer,
                {
                    "best": record,
                    "history": history,
                    "train_config": vars(cfg),
                    "parameters": model.num_parameters(),
                    "device": str(device),
                    "threads": torch.get_num_threads(),
                    "train_pairs": len(train),
                },
            )
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step,
                "epoch": epoch,
                "best_bleu": best_bleu,
                "history": history,
                "rng": rng.getstate(),
                "torch_rng": torch.get_rng_state(),
                "train_seconds": record["train_seconds"],
                "train_config": vars(cfg),
                "model_config": config.to_dict(),
            },
            last_path,
        )
        tqdm.write(
            f"step {step} epoch {epoch}: valid loss {valid_loss:.3f}, BLEU {bleu:.2f}, chrF {chrf:.2f}"
            f"{' (best, saved)' if improved else ''}; example: {hyps[1]!r}",
            file=sys.stderr,
        )
        model.train()
        return record

    stop = False
    while epoch < cfg.epochs and not stop:
        batches = make_batches([(len(s), len(t) + 1) for s, t in train], cfg.max_tokens, rng)
        skip = step % len(batches) if args.resume and history and step else 0  # mid-epoch resume
        progress = tqdm(batches[skip:], desc=f"epoch {epoch}", unit="batch", mininterval=10, file=sys.stderr)
        model.train()
        window_tokens, window_start = 0, time.time()
        for batch in progress:
            src, tgt_in, tgt_out = (t.to(device) for t in collate([train[i] for i in batch], 0, 1, 2))
            lr = learning_rate(step + 1, cfg.lr, cfg.warmup)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum, n_tokens = label_smoothed_loss(model(src, tgt_in), tgt_out, 0, cfg.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            (loss_sum / n_tokens).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            optimizer.step()
            step += 1
            window_tokens += int(n_tokens)
            if step % 20 == 0:
                rate = window_tokens / max(time.time() - window_start, 1e-6)
                progress.set_postfix(
                    loss=f"{float(loss_sum.detach() / n_tokens):.3f}", lr=f"{lr:.2e}", tok_s=f"{rate:.0f}"
                )
                window_tokens, window_start = 0, time.time()
            if step % cfg.valid_every == 0:
                validate()
            if time.time() > deadline or (cfg.max_steps and step >= cfg.max_steps):
                stop = True
                break
        else:
            epoch += 1
    final = validate()
    best = max(history, key=lambda r: r["valid_bleu"])
    print(
        f"done: {step} steps, {epoch} epochs, {final['train_seconds'] / 60:.1f} min; best valid BLEU "
        f"{best['valid_bleu']} chrF {best['valid_chrf']} at step {best['step']} -> {args.release_dir}"
    )


if __name__ == "__main__":
    main()
