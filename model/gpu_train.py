"""Train from a pack (model.pack) inside a fixed time budget, on a GPU when there is one.

    python -m model.gpu_train --pack runs/pack-es.tar --config base --minutes 8 --out $OUT/es-base
    python -m model.gpu_train --restore $OUT/es-base --to runs/es-base      # back home: a model directory

Made for the lent GPU machine (docs/gpu.md): one command of at most 10 minutes, 64 MiB carried in and
at most 8 files / 64 MiB (16 MiB each) coming back. So the run

* reads everything from one pack (no corpus directory, no network);
* trains with model.train's pieces (make_batches, collate, label_smoothed_loss, learning_rate,
  Validation, save_release), on CUDA with bf16 autocast, TF32 and fused Adam, large token batches;
* stops itself: the training loop ends `--reserve-s` (or twice the last validation's time, if more)
  before `--minutes`, and the last `--cooldown-fraction` of the training time decays the learning
  rate linearly to 0 (a cooldown, as `model.train --cooldown` ends the CPU runs), so the final weights
  are settled wherever the time budget falls;
* validates like model.train (valid loss, novel/all BLEU and chrF, common UI strings) every
  `--valid-every` steps and at the end, keeps the best weights by novel BLEU (written out after each
  better validation too, so a run killed at the command's limit leaves its best), and writes them as a
  model directory (config.json, training.json with the curve, tokenizer.model) whose weights fit
  what may come back: fp16 safetensors in parts of at most `--part-mib` MiB, or, when fp16 would
  exceed `--return-mib` in all (a base-size model: 48M parameters, 96 MB), int8 with one scale per
  weight row (about half), restored to fp16 by `--restore`; at most 7 files, so that the run's log
  is the eighth file that may come back.

No resumable state comes back: Adam's moments are twice the fp32 weights, which never fit; a later run
continues from the weights with `--init-from` (fresh optimizer, re-warmed), as model.train does.
Presets: small (256/4/1024, 3+3, what ships), base (512/8/2048, 6+6, a teacher), deep-shallow
(512/8/2048, 12+2: deep encoder, shallow decoder, a student that decodes fast; pre-norm), tiny (tests);
`--encoder-layers` / `--decoder-layers` change the depths of any preset (TransformerConfig has both),
`--norm-first` / `--no-norm-first` its LayerNorm placement (pre-norm: x + Sublayer(LN(x)), a final
LayerNorm per stack; post-norm, the paper's: LN(x + Sublayer(x))). A 12-layer post-norm encoder does not
train (12+2 at 256/4/1024 on the H100: diverged at lr 1.5e-3, valid loss 4.63 after 1,320 steps at 7e-4
where 3+3 reached 2.24); pre-norm is the known remedy (Xiong et al. 2020, Wang et al. 2019).
"""

from __future__ import annotations

import argparse
import json
import lzma
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from model.model import Transformer, TransformerConfig, label_smoothed_loss
from model.pack import read_pack
from model.tokenizer import Tokenizer
from model.train import (
    Validation,
    collate,
    describe_scores,
    hardware_name,
    learning_rate,
    load_release,
    make_batches,
    release_metrics,
    repeat_by_counts,
    save_release,
    tokenize_pairs,
    translate,
)
from runtime.splits import escape_line, unescape_line

PRESETS: dict[str, dict[str, int | bool]] = {
    "tiny": {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_encoder_layers": 1, "n_decoder_layers": 1},
    "small": {"d_model": 256, "n_heads": 4, "d_ff": 1024, "n_encoder_layers": 3, "n_decoder_layers": 3},
    "base": {"d_model": 512, "n_heads": 8, "d_ff": 2048, "n_encoder_layers": 6, "n_decoder_layers": 6},
    "deep-shallow": {
        "d_model": 512,
        "n_heads": 8,
        "d_ff": 2048,
        "n_encoder_layers": 12,
        "n_decoder_layers": 2,
        # Pre-norm: a 12-layer post-norm encoder does not train (see the module docstring). The other
        # presets stay post-norm, the paper's and the shipped models' layout, which trains at their depth.
        "norm_first": True,
    },
}
DISTILLED = "distilled.tgt.xz"  # the model's greedy translation of every train source, pack order
WEIGHTS = "model.safetensors"
INT8_WEIGHTS = "model.int8.safetensors"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def model_config(
    preset: str,
    vocab_size: int,
    encoder_layers: int = 0,
    decoder_layers: int = 0,
    norm_first: bool | None = None,
) -> TransformerConfig:
    """A preset's TransformerConfig, with optional depths (0 = the preset's) and LayerNorm placement
    (None = the preset's)."""
    dims = dict(PRESETS[preset])
    dims["n_encoder_layers"] = encoder_layers or dims["n_encoder_layers"]
    dims["n_decoder_layers"] = decoder_layers or dims["n_decoder_layers"]
    if norm_first is not None:
        dims["norm_first"] = norm_first
    return TransformerConfig(vocab_size=vocab_size, **dims)


# ---- the trip back: weights that fit 8 files of 16 MiB, 64 MiB in all ----------------------------------


def quantize_int8(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Matrices as int8 with one fp32 scale per row (symmetric, max |w| / 127); the rest fp16."""
    out: dict[str, torch.Tensor] = {}
    for name, w in state.items():
        w = w.detach().float().cpu()
        if w.dim() == 2 and w.numel() >= 4096:
            scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
            out[name] = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
            out[f"{name}.__scale__"] = scale.contiguous()
        else:
            out[name] = w.to(torch.float16).contiguous()
    return out


def dequantize_int8(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The fp16 weights of a quantize_int8 state."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name.endswith(".__scale__"):
            continue
        scale = state.get(f"{name}.__scale__")
        out[name] = (t.float() * scale[:, None] if scale is not None else t.float()).to(torch.float16)
    return out


def split_file(path: Path, part_bytes: int) -> list[Path]:
    """Cut `path` into path.part-00, -01, ... of at most part_bytes each (the original is removed)."""
    data = path.read_bytes()
    parts = []
    for i in range(0, max(len(data), 1), part_bytes):
        part = path.with_name(f"{path.name}.part-{i // part_bytes:02d}")
        part.write_bytes(data[i : i + part_bytes])
        parts.append(part)
    path.unlink()
    return parts


def fit_for_return(release_dir: Path, part_mib: float, return_mib: float) -> dict[str, Any]:
    """Rewrite release_dir's weights so every file is <= part_mib and all <= return_mib: fp16 (cut
    into parts if needed) or, when fp16 is too large in all, int8 rows. Returns what it did."""
    weights = release_dir / WEIGHTS
    part_bytes = int(part_mib * 2**20)
    others = sum(p.stat().st_size for p in release_dir.iterdir() if p.is_file() and p != weights)
    info: dict[str, Any] = {"precision": "fp16", "fp16_bytes": weights.stat().st_size}
    if weights.stat().st_size + others > return_mib * 2**20:
        state = load_file(str(weights))
        q = release_dir / INT8_WEIGHTS
        save_file(quantize_int8(state), str(q), metadata={"format": "int8-rows"})
        weights.unlink()
        weights, info["precision"] = q, "int8 rows (restore with --restore)"
    info["weights"] = weights.name
    info["bytes"] = weights.stat().st_size
    info["parts"] = (
        [p.name for p in split_file(weights, part_bytes)] if weights.stat().st_size > part_bytes else []
    )
    total = sum(p.stat().st_size for p in release_dir.iterdir() if p.is_file())
    files = sum(1 for p in release_dir.iterdir() if p.is_file())
    info["total_bytes"], info["files"] = total, files
    info["fits"] = total <= return_mib * 2**20 and files <= 7  # the 8th file back: the run's log
    return info  # the caller writes it into training.json ("gpu_train" -> "return")


def restore(src: Path, dst: Path) -> Path:
    """A model directory (fp16 model.safetensors, config.json, training.json, tokenizer.model) from a
    directory written by fit_for_return (parts joined, int8 dequantized)."""
    info = json.loads((src / "training.json").read_text())["gpu_train"]["return"]
    dst.mkdir(parents=True, exist_ok=True)
    name = info["weights"]
    blob = (
        b"".join((src / p).read_bytes() for p in info["parts"])
        if info["parts"]
        else (src / name).read_bytes()
    )
    if len(blob) != info["bytes"]:
        raise SystemExit(f"{src}: weights are {len(blob)} bytes, training.json says {info['bytes']}")
    if name == INT8_WEIGHTS:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / name).write_bytes(blob)
            state = dequantize_int8(load_file(str(Path(tmp) / name)))
        save_file(state, str(dst / WEIGHTS), metadata={"format": "pt"})
    else:
        (dst / WEIGHTS).write_bytes(blob)
    for extra in ("config.json", "training.json", "tokenizer.model"):
        if (src / extra).is_file() and (src / extra).resolve() != (dst / extra).resolve():
            shutil.copyfile(src / extra, dst / extra)
    return dst


# ---- distillation: the teacher's translations as a student's targets -----------------------------------


def distill(
    model: Transformer,
    tokenizer: Tokenizer,
    sources: list[str],
    device: torch.device,
    out: Path,
    deadline: float,
    batch_size: int,
) -> dict[str, Any]:
    """Greedy translations of `sources` (shortest first, model.train.translate in chunks) until
    `deadline`, written to `out` one escaped line each in the sources' order; those not reached stay
    empty (`--targets-from` then keeps the human target)."""
    t0 = time.time()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    done: dict[int, str] = {}
    chunk = batch_size * 16
    for start in range(0, len(order), chunk):
        if time.time() >= deadline:
            break
        idx = order[start : start + chunk]
        for i, hyp in zip(
            idx, translate(model, tokenizer, [sources[i] for i in idx], device, batch_size), strict=True
        ):
            done[i] = hyp
        log(f"distill: {len(done)}/{len(sources)} sources, {len(done) / (time.time() - t0):.0f}/s")
    lines = "".join(escape_line(done.get(i, "")) + "\n" for i in range(len(sources)))
    out.write_bytes(lzma.compress(lines.encode("utf-8"), preset=6))
    seconds = time.time() - t0
    return {"sources": len(sources), "translated": len(done), "seconds": round(seconds, 1),
            "per_s": round(len(done) / max(seconds, 1e-6), 1), "bytes": out.stat().st_size}  # fmt: skip


def with_targets(pairs: list[tuple[str, str]], path: Path) -> list[tuple[str, str]]:
    """`pairs` with the targets of a distilled file (DISTILLED), where it has one (empty: kept)."""
    lines = lzma.decompress(path.read_bytes()).decode("utf-8").split("\n")[:-1]
    if len(lines) != len(pairs):
        raise SystemExit(f"{path}: {len(lines)} lines for {len(pairs)} train pairs (another pack?)")
    return [(s, unescape_line(t) if t else target) for (s, target), t in zip(pairs, lines, strict=True)]


# ---- training ------------------------------------------------------------------------------------------


def init_record(init_from: Path | None) -> dict[str, Any] | None:
    """What a continued run started from, for its training.json and model card: the directory and, when
    that model has a training.json, its own record (a model continued twice nests both)."""
    if init_from is None:
        return None
    previous = init_from / "training.json"
    record: dict[str, Any] = {"path": str(init_from)}
    if previous.exists():
        before = json.loads(previous.read_text())
        keys = ("best", "history", "train_config", "device", "hardware", "gpu_train")
        record |= {k: before[k] for k in keys if k in before}
    return record


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def train(args: argparse.Namespace) -> dict[str, Any]:
    """The whole run; returns the summary written into training.json's "gpu_train"."""
    started = time.time()
    budget_end = started + args.minutes * 60
    device = pick_device(args.device)
    cuda = device.type == "cuda"
    if args.threads:
        torch.set_num_threads(args.threads)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 parts (validation) on the tensor cores
        torch.backends.cudnn.allow_tf32 = True
    bf16 = cuda and not args.no_bf16 and torch.cuda.is_bf16_supported()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    max_tokens = args.max_tokens or (16384 if cuda else 3000)
    max_sentences = args.max_sentences or (512 if cuda else 128)

    work = Path(tempfile.mkdtemp(prefix="gpu-train-"))
    try:
        pack = read_pack(args.pack)
        tok_path = work / "tokenizer.model"
        tok_path.write_bytes(pack.tokenizer_model)
        tokenizer = Tokenizer(tok_path)
        if args.targets_from:
            pack.train = with_targets(pack.train, args.targets_from)
        pairs = pack.train[: args.max_train_pairs] if args.max_train_pairs else pack.train
        pairs = repeat_by_counts(pairs, pack.train_packages, pack.train_dictionary, args.repeat_dictionaries)
        log(f"pack {args.pack}: en->{pack.meta['target_language']}, tokenizing {len(pairs)} train pairs")
        train_set = tokenize_pairs(tokenizer, pairs, args.max_len)
        validation = Validation.from_pairs(
            pack.valid, pack.valid_novel, pack.common, tokenizer, args.max_len, max_tokens,
            args.valid_bleu_sentences,
        )  # fmt: skip

        if args.init_from:
            model = load_release(args.init_from, device)
            config = model.config
        else:
            config = model_config(
                args.config, tokenizer.vocab_size, args.encoder_layers, args.decoder_layers, args.norm_first
            )
            model = Transformer(config).to(device)
        config.dropout = args.dropout
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = args.dropout
        optimizer = torch.optim.Adam(
            model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9, **({"fused": True} if cuda else {})
        )
        hardware = hardware_name(device)
        n_tgt = sum(len(t) + 1 for _, t in train_set)
        log(
            f"model {config.d_model}d {config.n_heads}h ff{config.d_ff} {config.n_encoder_layers}+"
            f"{config.n_decoder_layers} {'pre' if config.norm_first else 'post'}-norm, "
            f"{model.num_parameters() / 1e6:.1f}M parameters on {hardware} "
            f"({'bf16 autocast' if bf16 else 'fp32'}); {len(train_set)} pairs, "
            f"{n_tgt} target tokens an epoch; "
            f"batches <= {max_tokens} tokens, <= {max_sentences} rows; setup {time.time() - started:.0f} s"
        )

        history: list[dict[str, Any]] = []
        best: dict[str, Any] = {"bleu": -1.0, "state": None, "record": None}
        step = epoch = 0
        tokens_seen = 0
        valid_seconds = write_seconds = 0.0
        train_start = time.time()
        cooldown_start: int | None = None
        cooldown = 0
        stop_reason = "epochs"

        def train_deadline() -> float:
            # the final validation and the writing must fit too: keep the larger of the fixed reserve
            # and twice what a validation took so far
            reserve = max(args.reserve_s, 2 * valid_seconds + write_seconds + 15)
            return budget_end - reserve - (args.distill_s if args.distill else 0)

        def validate() -> dict[str, Any]:
            nonlocal valid_seconds
            t0 = time.time()
            scores = validation.measure(model, tokenizer, device)
            valid_seconds = time.time() - t0
            record = {"step": step, "epoch": epoch, **scores}
            record |= {
                "train_seconds": round(time.time() - train_start, 1),
                "decode_seconds": round(valid_seconds, 1),
                "lr": optimizer.param_groups[0]["lr"],
                "target_tokens": tokens_seen,
            }
            history.append(record)
            improved = scores["valid_bleu"] > best["bleu"]
            if improved:
                best.update(
                    bleu=scores["valid_bleu"],
                    record=record,
                    state={k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
                )
            log(f"step {step} epoch {epoch}: {describe_scores(scores)}{' (best)' if improved else ''}")
            model.train()
            return record

        cpu_model = Transformer(config)  # the best weights are written from here, off the GPU

        def write_out(stop_reason: str, train_seconds: float) -> dict[str, Any]:
            """The best weights so far as a model directory that fits the trip back; also after each
            better validation, so that a run killed at the command's limit still leaves its best."""
            nonlocal write_seconds
            t0 = time.time()
            record = best["record"] or history[-1]
            cpu_model.load_state_dict(best["state"] if best["state"] is not None else model.state_dict())
            train_config = {k: v for k, v in vars(args).items() if isinstance(v, int | float | str | bool)}
            train_config |= {"max_tokens": max_tokens, "max_sentences": max_sentences, "bf16": bf16}
            if args.init_from:  # --config did not apply: the continued model's own config.json did
                train_config["config"] = f"{args.init_from}/config.json"
            metrics = release_metrics(
                cpu_model,
                record,
                history,
                train_config,
                str(device),
                hardware,
                len(train_set),
                target_language=pack.meta["target_language"],
            )
            summary = {
                "pack": {k: pack.meta[k] for k in ("language", "target_language", "pairs")},
                "init_from": init_record(args.init_from),
                "steps": step,
                "epochs": epoch,
                "target_tokens": tokens_seen,
                "train_seconds": round(train_seconds, 1),
                "target_tokens_per_s": round(tokens_seen / max(train_seconds, 1e-6)),
                "stop_reason": stop_reason,
                "cooldown": [cooldown_start, cooldown] if cooldown_start is not None else None,
                "best_step": record["step"],
                "peak_gpu_memory_mib": round(torch.cuda.max_memory_allocated(device) / 2**20)
                if cuda
                else None,
            }
            args.out.mkdir(parents=True, exist_ok=True)
            for old in args.out.iterdir():  # an earlier write's parts
                if old.is_file():
                    old.unlink()
            save_release(cpu_model, args.out, tokenizer, metrics)
            summary["return"] = fit_for_return(args.out, args.part_mib, args.return_mib)
            summary["total_seconds"] = round(time.time() - started, 1)
            metrics["gpu_train"] = summary
            (args.out / "training.json").write_text(json.dumps(metrics, indent=2) + "\n")
            write_seconds = time.time() - t0
            return summary

        stop = False
        while epoch < args.epochs and not stop:
            batches = make_batches(
                [(len(s), len(t) + 1) for s, t in train_set], max_tokens, rng, max_sentences
            )
            model.train()
            window_tokens, window_start = 0, time.time()
            for batch in batches:
                src, tgt_in, tgt_out = (
                    t.pin_memory().to(device, non_blocking=True) if cuda else t
                    for t in collate(
                        [train_set[i] for i in batch], config.pad_id, config.bos_id, config.eos_id
                    )
                )
                lr = learning_rate(step + 1, args.lr, args.warmup, 0, 0, cooldown_start or 0, cooldown)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
                    loss_sum, n_tokens = label_smoothed_loss(
                        model(src, tgt_in), tgt_out, config.pad_id, args.label_smoothing
                    )
                optimizer.zero_grad(set_to_none=True)
                # divided by the token budget, as model.train does: every token weighs the same
                (loss_sum.float() / max_tokens).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                optimizer.step()
                step += 1
                n = int(n_tokens)
                tokens_seen += n
                window_tokens += n
                if step % 50 == 0:
                    rate = window_tokens / max(time.time() - window_start, 1e-6)
                    left = train_deadline() - time.time()
                    log(
                        f"step {step} epoch {epoch}: loss {float(loss_sum.detach()) / max(n, 1):.3f} "
                        f"lr {lr:.2e} {rate:,.0f} target tok/s, {left:.0f} s of training left"
                    )
                    window_tokens, window_start = 0, time.time()
                now = time.time()
                elapsed = now - train_start
                planned = train_deadline() - train_start
                if cooldown_start is None and elapsed >= (1 - args.cooldown_fraction) * planned:
                    # the rest of the time at the rate so far: that many steps of linear decay to 0
                    cooldown_start = step
                    cooldown = max(1, int(step * args.cooldown_fraction / (1 - args.cooldown_fraction)))
                    log(f"cooldown: learning rate to 0 over steps {step}-{step + cooldown}")
                if args.valid_every and step % args.valid_every == 0:
                    if validate() is best["record"]:
                        write_out("running", time.time() - train_start)
                if cooldown_start is not None and step >= cooldown_start + cooldown:
                    stop, stop_reason = True, "cooldown finished"
                elif time.time() >= train_deadline():
                    stop, stop_reason = True, "time budget"
                elif args.max_steps and step >= args.max_steps:
                    stop, stop_reason = True, "max steps"
                if stop:
                    break
            else:
                epoch += 1
        train_seconds = time.time() - train_start
        if not history or history[-1]["step"] != step:
            validate()
        summary = write_out(stop_reason, train_seconds)
        if args.distill:
            # the best weights (as written) translate the train sources for a student (sequence-level
            # knowledge distillation), in what time is left
            model.load_state_dict(cpu_model.state_dict())
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
                summary["distill"] = distill(
                    model, tokenizer, [s for s, _ in pack.train], device, args.out / DISTILLED,
                    budget_end - 10, args.distill_batch,
                )  # fmt: skip
            back = summary["return"]
            back["files"] += 1
            back["total_bytes"] += summary["distill"]["bytes"]
            back["fits"] = back["files"] <= 7 and back["total_bytes"] <= args.return_mib * 2**20
            training = json.loads((args.out / "training.json").read_text())
            training["gpu_train"] |= {"distill": summary["distill"], "return": back}
            (args.out / "training.json").write_text(json.dumps(training, indent=2) + "\n")
        return summary | {"best": best["record"]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m model.gpu_train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--pack", type=Path, help="from python -m model.pack")
    p.add_argument("--out", type=Path, help="model directory to write (under $OUT on the GPU machine)")
    p.add_argument("--restore", type=Path, help="a directory this wrote: rebuild a model directory (--to)")
    p.add_argument("--to", type=Path, help="with --restore: the model directory to write")
    p.add_argument("--config", choices=sorted(PRESETS), default="base")
    p.add_argument("--encoder-layers", type=int, default=0, help="0 = the preset's")
    p.add_argument("--decoder-layers", type=int, default=0, help="0 = the preset's")
    p.add_argument(
        "--norm-first",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="pre-norm: x + Sublayer(LN(x)) and a final LayerNorm per stack, which deep models need "
        "(--no-norm-first: post-norm, the paper's); default the preset's: pre-norm for deep-shallow, "
        "post-norm for the others. With --init-from the model's own config wins",
    )
    p.add_argument("--init-from", type=Path, help="start from this released model (its config wins)")
    p.add_argument("--minutes", type=float, default=8.0, help="the whole run, setup and writing included")
    p.add_argument("--reserve-s", type=float, default=45.0, help="kept for the final validation and writing")
    p.add_argument("--cooldown-fraction", type=float, default=0.2, help="last share of training at LR -> 0")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=0, help="per batch; 0 = 16384 on CUDA, 3000 on CPU")
    p.add_argument("--max-sentences", type=int, default=0, help="rows per batch; 0 = 512 CUDA, 128 CPU")
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument(
        "--repeat-dictionaries", type=int, default=1, help="a pair only dictionaries give: N times as often"
    )
    p.add_argument("--lr", type=float, default=7e-4)
    p.add_argument("--warmup", type=int, default=600)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--epochs", type=int, default=1000)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--max-train-pairs", type=int, default=0, help="first N pairs only (smoke runs)")
    p.add_argument("--valid-every", type=int, default=1000, help="steps between validations (0 = end only)")
    p.add_argument("--valid-bleu-sentences", type=int, default=400)
    p.add_argument("--part-mib", type=float, default=15.5, help="largest file written (16 MiB come back)")
    p.add_argument("--return-mib", type=float, default=56.0, help="all files written (64 MiB come back)")
    p.add_argument("--no-bf16", action="store_true", help="fp32 on CUDA too")
    p.add_argument("--distill", action="store_true", help=f"after training, write {DISTILLED} (teacher)")
    p.add_argument("--distill-s", type=float, default=150.0, help="seconds kept for --distill")
    p.add_argument("--distill-batch", type=int, default=256, help="sentences per greedy batch")
    p.add_argument("--targets-from", type=Path, help=f"a teacher's {DISTILLED}: train on its targets")
    p.add_argument("--seed", type=int, default=1234)
    return p


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.restore:
        if not args.to:
            parser.error("--restore needs --to")
        out = restore(args.restore, args.to)
        print(f"restored {args.restore} -> {out} (fp16 {WEIGHTS}, config, training curve, tokenizer)")
        return
    if not args.pack or not args.out:
        parser.error("--pack and --out are required (or --restore DIR --to DIR)")
    s = train(args)
    b, r = s["best"], s["return"]
    print(
        f"done: {s['steps']} steps in {s['train_seconds'] / 60:.1f} min ({s['target_tokens_per_s']:,} target "
        f"tok/s, stopped: {s['stop_reason']}); best step {b['step']}: valid loss {b['valid_loss']:.3f}, "
        f"novel BLEU {b['valid_bleu']:.2f}, common strings {b['common_accepted_percent']}%; "
        f"{args.out}: {r['files']} files, {r['total_bytes'] / 2**20:.1f} MiB, {r['precision']}"
        f"{'' if r['fits'] else ' (DOES NOT FIT what may come back)'}; {s['total_seconds']:.0f} s in all"
    )


if __name__ == "__main__":
    main()
