"""Build an inference bundle from a released model directory (config.json + model.safetensors +
tokenizer.model, as written by model/train.py `save_release`). See export/__main__.py for the CLI and
runtime/bundle.py for the layout."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
import torch

from export import cache_graphs, calibrate, fused_step, int8, precision, verify
from export import onnx_export as ox
from model.model import Transformer
from model.tokenizer import MODEL_FILE, Tokenizer
from model.train import load_release
from runtime.bundle import (
    FORMAT_VERSION,
    GRAPHS,
    MANIFEST,
    OPTIONAL_GRAPHS,
    TOKENIZER,
    file_entry,
    sha256_file,
)
from runtime.faithful.dictionary import DICTIONARY_FILE
from runtime.faithful.lexicon import LEXICON_FILE
from runtime.faithful.memory import MEMORY_FILE

VARIANTS = ("fp32", "int8", "fp16")
SOURCE_WORDS = "source_words.txt"  # the training sources' words (model/keep_terms.py), likewise
KEEP_TERMS = "keep_terms.txt"  # the do-not-translate list (model/keep_terms.py), copied when the model has it
FP32_TOLERANCE = 1e-4

FALLBACK_SENTENCES = [
    "Open the file.",
    "Could not save the document %s because the disk is full.",
    "Are you sure you want to delete {0} items?",
    "Settings",
    "Do you want to check your settings and try again?",
    "The connection to the server was lost. Reconnecting in %d seconds...",
    "<b>Warning:</b> this action cannot be undone.",
    "Click here to download the latest version of the application from the website.",
]


def parity_sources(tokenizer: Tokenizer, data_dir: Path | None, n: int, max_tokens: int) -> list[list[int]]:
    """Token ids of n real source sentences (data/test.en if present, else a built-in list)."""
    texts: list[str] = []
    if data_dir is not None and (data_dir / "test.en").exists():
        from model.corpus import read_split

        texts = [en for en, _ in read_split(data_dir, "test")[: 20 * n] if en.strip()]
    texts = texts or FALLBACK_SENTENCES
    out = []
    for text in texts:
        ids = tokenizer.encode(text.strip())
        if 0 < len(ids) <= min(max_tokens, 64):
            out.append(ids)
        if len(out) >= n:
            break
    return out


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _step(label: str, fn: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    _log(f"  {label} ...")
    result = fn()
    _log(f"  {label}: {time.perf_counter() - t0:.1f} s")
    return result


def export_bundle(
    checkpoint: Path,
    out: Path,
    *,
    variants: tuple[str, ...] = ("fp32", "int8"),
    name: str | None = None,
    version: str | None = None,
    source_language: str = "en",
    target_language: str | None = None,
    max_source_tokens: int = 256,
    max_beam_size: int = 8,
    max_length_cap: int = 256,
    beam_size: int = 4,
    num_hypotheses: int = 1,
    length_penalty: float = 0.6,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    optimize: bool = False,
    data_dir: Path | None = None,
    parity_sentences: int = 16,
    threads: int = 1,
    model: Transformer | None = None,
    fused_attention: str | None = None,
) -> dict[str, Any]:
    """Export `checkpoint` to the bundle directory `out` (replaced atomically). Returns the manifest.

    `model` may be given to skip loading (tests); it must match the checkpoint's weights.
    `fused_attention` ("split" or "mha", see export/fused_step.py): the decoder step written with ONNX
    Runtime's contrib MultiHeadAttention (same graph interface) instead of the traced one.
    Raises RuntimeError if the fp32 parity check fails (max |log-prob difference| > 1e-4).
    """
    started = time.perf_counter()
    variants = tuple(dict.fromkeys(("fp32", *variants)))
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; choose from {VARIANTS}")
    for f in ("config.json", "model.safetensors", MODEL_FILE):
        if not (checkpoint / f).is_file():
            raise FileNotFoundError(f"{checkpoint / f} not found (need a save_release model directory)")
    model = load_release(checkpoint) if model is None else model.eval()
    cfg = model.config
    tokenizer = Tokenizer(checkpoint / MODEL_FILE)
    if tokenizer.vocab_size != cfg.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} pieces, model vocab_size is {cfg.vocab_size}")
    if max_source_tokens > cfg.max_positions or max_length_cap > cfg.max_positions:
        raise ValueError(
            f"max_source_tokens {max_source_tokens} and max_length_cap {max_length_cap} must be <= "
            f"max_positions {cfg.max_positions}"
        )
    if not 1 <= beam_size <= max_beam_size or not 1 <= num_hypotheses <= beam_size:
        raise ValueError("need 1 <= num_hypotheses <= beam_size <= max_beam_size")
    weights_sha = sha256_file(checkpoint / "model.safetensors")
    name = name or checkpoint.resolve().name
    version = version or f"{dt.datetime.now(dt.UTC):%Y%m%d}-{weights_sha[:8]}"
    training_json = {}
    if (checkpoint / "training.json").is_file():
        training_json = json.loads((checkpoint / "training.json").read_text())
    training = training_json.get("best", {})
    # The pair is the model's: the target language its corpus had (model.train records it), Spanish for
    # the releases from before the record.
    target_language = target_language or training_json.get("target_language", "es")

    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    stage.chmod(0o755)
    try:
        manifest = _build(
            model, tokenizer, checkpoint, stage, variants, optimize, data_dir,
            parity_sentences, threads, max_source_tokens, fused_attention,
        )  # fmt: skip
        lists = (
            ("keep_terms", KEEP_TERMS),
            ("source_words", SOURCE_WORDS),
            ("memory", MEMORY_FILE),
            ("lexicon", LEXICON_FILE),
            ("dictionary_terms", DICTIONARY_FILE),
        )
        for key, file in lists:
            if (checkpoint / file).is_file():  # listed under "files" (sha256) like every file of the stage
                shutil.copyfile(checkpoint / file, stage / file)
                manifest[key] = file
        manifest = {
            "format_version": FORMAT_VERSION,
            "name": name,
            "version": version,
            "source_language": source_language,
            "target_language": target_language,
            # What the server routes to this bundle (runtime.bundle.manifest_pairs).
            "pairs": [[source_language, target_language]],
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "vocab_size": cfg.vocab_size,
            "special_ids": {"pad": cfg.pad_id, "bos": cfg.bos_id, "eos": cfg.eos_id, "unk": Tokenizer.unk_id},
            "dims": {
                "d_model": cfg.d_model,
                "n_heads": cfg.n_heads,
                "head_dim": cfg.d_model // cfg.n_heads,
                "d_ff": cfg.d_ff,
                "n_encoder_layers": cfg.n_encoder_layers,
                "n_decoder_layers": cfg.n_decoder_layers,
                "max_positions": cfg.max_positions,
                "norm_first": cfg.norm_first,  # for the record: the graphs' inputs and outputs are the same
            },
            "max_source_tokens": max_source_tokens,
            "max_beam_size": max_beam_size,
            "max_length_cap": max_length_cap,
            "decoding": {
                "beam_size": beam_size,
                "num_hypotheses": num_hypotheses,
                "length_penalty": length_penalty,
                "repetition_penalty": repetition_penalty,
                "no_repeat_ngram_size": no_repeat_ngram_size,
                "max_length_ratio": 1.5,
                "max_length_extra": 10,
            },
            "opset": ox.OPSET,
            "onnx_version": onnx.__version__,
            "onnxruntime_version": ort.__version__,
            "torch_version": torch.__version__,
            "source_checkpoint": {
                "dir": str(checkpoint),
                "weights_sha256": weights_sha,
                "training": training,
            },
            "tokenizer": TOKENIZER,
            **manifest,
        }
        manifest["files"] = {
            rel: file_entry(stage, rel)
            for rel in sorted(str(p.relative_to(stage)) for p in stage.rglob("*") if p.is_file())
        }
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        if out.exists():
            trash = out.with_name(f".{out.name}.old")
            shutil.rmtree(trash, ignore_errors=True)
            out.rename(trash)
            stage.rename(out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    manifest["export_seconds"] = round(time.perf_counter() - started, 1)
    return manifest


def _build(
    model: Transformer,
    tokenizer: Tokenizer,
    checkpoint: Path,
    stage: Path,
    variants: tuple[str, ...],
    optimize: bool,
    data_dir: Path | None,
    parity_sentences: int,
    threads: int,
    max_source_tokens: int,
    fused_attention: str | None = None,
) -> dict[str, Any]:
    n_layers = model.config.n_decoder_layers
    shutil.copyfile(checkpoint / MODEL_FILE, stage / TOKENIZER)
    sources = parity_sources(tokenizer, data_dir, parity_sentences, max_source_tokens)
    raw = stage / ".raw"
    raw.mkdir()
    _log(f"exporting {checkpoint} ({model.num_parameters() / 1e6:.2f}M parameters) -> variants {variants}")
    _step("fp32 encoder (torch.onnx.export)", lambda: ox.export_encoder(model, raw / "encoder.onnx"))
    if fused_attention:
        _step(
            "fp32 decoder step (fused attention, onnx.helper)",
            lambda: fused_step.export_fused_decoder(model, raw / "decoder.onnx", fused_attention),
        )
    else:
        _step("fp32 decoder step (torch.onnx.export)", lambda: ox.export_decoder(model, raw / "decoder.onnx"))
    info: dict[str, Any] = {"variants": {}, "graphs": {}, "parity": {}, "node_counts": {}, "optimizer": {}}
    int8_description = int8.DESCRIPTION
    if fused_attention:  # for the record: which decoder step graph the bundle has
        info["decoder_step"] = f"{fused_step.DESCRIPTION} (self-attention: {fused_attention})"
    try:
        for variant in variants:
            vdir = stage / variant
            vdir.mkdir()
            enc, dec = vdir / "encoder.onnx", vdir / "decoder.onnx"
            if variant == "fp32":
                if optimize:
                    for g, dst in (("encoder", enc), ("decoder", dec)):
                        stats = _step(
                            f"optimize {g}",
                            lambda g=g, dst=dst: precision.optimize_graph(raw / f"{g}.onnx", dst, model),
                        )
                        info["optimizer"][g] = {k: v for k, v in stats.items() if v}
                else:
                    shutil.copyfile(raw / "encoder.onnx", enc)
                    shutil.copyfile(raw / "decoder.onnx", dec)
                elem = onnx.TensorProto.FLOAT
            elif variant == "int8":
                ranges, where = calibrate.load_ranges(checkpoint)
                static = ranges is not None
                int8_description = int8.DESCRIPTION_STATIC if static else int8.DESCRIPTION
                info["int8_activation_scales"] = where if static else f"per row at run time: {where}"
                _log(f"  int8 activation scales: {info['int8_activation_scales']}")
                for g, dst in (("encoder", enc), ("decoder", dec)):
                    _step(
                        f"int8 {g}",
                        lambda g=g, dst=dst, r=ranges: int8.quantize_int8(raw / f"{g}.onnx", dst, r),
                    )
                elem = onnx.TensorProto.FLOAT
            else:
                for g, dst in (("encoder", enc), ("decoder", dec)):
                    _step(f"fp16 {g}", lambda g=g, dst=dst: precision.convert_fp16(raw / f"{g}.onnx", dst))
                elem = onnx.TensorProto.FLOAT16
            cache_graphs.make_cache_graph(vdir / "cache.onnx", 2 * n_layers, elem)
            cache_graphs.make_kv_rows_graph(vdir / "kv_rows.onnx", 2 * n_layers, elem)
            cache_graphs.make_kv_step_graph(vdir / "kv_step.onnx", 2 * n_layers, elem)
            for path in (enc, dec, *(vdir / f"{g}.onnx" for g in ("cache", *OPTIONAL_GRAPHS))):
                verify.check_graph(path)
            info["variants"][variant] = {g: f"{variant}/{g}.onnx" for g in (*GRAPHS, *OPTIONAL_GRAPHS)}
            info["variants"][variant]["precision"] = {
                "fp32": "float32",
                "int8": int8_description,
                "fp16": "float16 weights and K/V cache; float32 ids, bias, scores, log-softmax and top-k",
            }[variant]
            info["node_counts"][variant] = {
                g: verify.node_count(vdir / f"{g}.onnx") for g in ("encoder", "decoder")
            }
            try:
                p = _step(
                    f"{variant} parity vs PyTorch",
                    lambda enc=enc, dec=dec: verify.parity(model, enc, dec, sources, threads),
                )
            except Exception as e:  # noqa: BLE001 - e.g. fp16 kernels missing on the CPU provider
                if variant == "fp32":
                    raise
                p = {"skipped": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            info["parity"][variant] = p
            _log(f"  {variant} parity: {json.dumps(p)}")
            if variant == "fp32" and p["step_logprob_max_abs"] > FP32_TOLERANCE:
                diff = p["step_logprob_max_abs"]
                raise RuntimeError(
                    f"fp32 parity failed: max |log-prob difference| {diff:.3g} > {FP32_TOLERANCE}"
                )
            if variant == "fp32":
                info["graphs"] = {g: ox.graph_io(vdir / f"{g}.onnx") for g in GRAPHS}
    finally:
        shutil.rmtree(raw, ignore_errors=True)
    return info


def summary_line(manifest: dict[str, Any], out: Path) -> str:
    files = manifest["files"]
    total = sum(e["bytes"] for e in files.values())
    sizes = ", ".join(
        f"{rel} {e['bytes'] / 1e6:.1f} MB"
        for rel, e in files.items()
        if rel.endswith(("encoder.onnx", "decoder.onnx"))
    )
    par = manifest["parity"]
    parity = "; ".join(
        f"{v}: skipped" if "skipped" in p
        else f"{v}: {p['step_logprob_max_abs']:.2e} max|dlogp|, top1 {p['top1_agreement']:.3f}"
        for v, p in par.items()
    )  # fmt: skip
    return (
        f"bundle {out}: {len(files) + 1} files, {total / 1e6:.1f} MB ({sizes}); parity {parity}; "
        f"{manifest.get('export_seconds', 0)} s"
    )
