"""Convert a released model directory to a CTranslate2 model with the same weights (a baseline to
benchmark the ONNX engine against, and a cross-check of the engine's numerics).

    python -m export.ctranslate2_spec --model models/en-es-small --out /tmp/ct2-en-es-small [--verify 64]

The mapping onto `ctranslate2.specs.TransformerSpec` (exact: log-probabilities agree to ~1e-6 in float32):

  * `TransformerSpec.from_config((n_enc, n_dec), heads, pre_norm=config.norm_first, activation=RELU)`:
    the paper's post-norm layout, no final encoder/decoder LayerNorm; or pre-norm, whose final LayerNorms
    encoder_ln / decoder_ln -> `encoder.layer_norm` / `decoder.layer_norm`. A CTranslate2 sublayer's
    `layer_norm` is applied after its residual add (post-norm) or to its input (pre-norm), as ours, so
    encoder ln1 -> `self_attention.layer_norm`, ln2 -> `ffn.layer_norm`; decoder ln1 ->
    `self_attention.layer_norm`, ln2 -> `attention.layer_norm` (cross), ln3 -> `ffn.layer_norm`. LayerNorm
    epsilon goes in `config.layer_norm_epsilon` (CTranslate2's default differs from PyTorch's 1e-5).
  * Attention: fused self-attention QKV -> `self_attention.linear[0]`, `out` -> `linear[1]`; cross-attention
    Q -> `attention.linear[0]`, fused KV -> `attention.linear[1]`, `out` -> `linear[2]`. Same row order
    (q | k | v, heads contiguous) as our Linear weights.
  * Embeddings: one tied matrix for encoder embeddings, decoder embeddings and the output projection
    (`decoder.projection`, no bias); `scale_embeddings=True` multiplies by sqrt(d_model) as we do.
  * Positions: our own interleaved sin/cos table, from position 0, as `position_encodings.encodings`
    (CTranslate2's built-in table is laid out as [sin | cos] and starts at position 1).
  * Vocabulary: the SentencePiece pieces in id order, with id 0 (<pad>) renamed <blank> as CTranslate2
    (OpenNMT) expects; <s>=1, </s>=2, <unk>=3 are already CTranslate2's bos/eos/unk tokens, so ids line
    up one to one and `CT2Translator` maps ids <-> pieces by index.
  * Decoding options to match the reference decoders: `min_decoding_length=0` (CTranslate2's default 1
    forbids an immediate EOS), `max_input_length=0` (no silent truncation), `beam_size=1` for greedy;
    `max_decoding_length` is one value per call, so per-sentence limits are applied by truncating
    greedy outputs (greedy decoding is prefix-consistent, so this is exact).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from model.decode import greedy_decode, max_output_length
from model.model import Transformer, sinusoidal_positions

PAD_PIECE = "<blank>"


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).contiguous().numpy()


def _set_linear(spec, linear: torch.nn.Linear) -> None:
    spec.weight = _np(linear.weight)
    spec.bias = _np(linear.bias)


def _set_layer_norm(spec, ln: torch.nn.LayerNorm) -> None:
    spec.gamma = _np(ln.weight)
    spec.beta = _np(ln.bias)


def vocabulary_pieces(tokenizer_model: str | Path) -> list[str]:
    """SentencePiece pieces in id order, specials renamed for CTranslate2; checks that ids line up."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_model))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    expected = {0: "<pad>", 1: "<s>", 2: "</s>", 3: "<unk>"}
    for i, piece in expected.items():
        if pieces[i] != piece:
            raise ValueError(f"{tokenizer_model}: id {i} is {pieces[i]!r}, expected {piece!r}")
    if len(set(pieces)) != len(pieces):
        raise ValueError(f"{tokenizer_model}: duplicate pieces, ids would not round-trip")
    pieces[0] = PAD_PIECE
    return pieces


def build_spec(model: Transformer, pieces: list[str]):
    """A `ctranslate2.specs.TransformerSpec` holding exactly the weights of `model` (float32)."""
    import ctranslate2

    cfg = model.config
    if len(pieces) != cfg.vocab_size:
        raise ValueError(f"vocabulary has {len(pieces)} pieces, the model {cfg.vocab_size}")
    if (cfg.pad_id, cfg.bos_id, cfg.eos_id) != (0, 1, 2):
        raise ValueError("expected pad/bos/eos ids 0/1/2")
    spec = ctranslate2.specs.TransformerSpec.from_config(
        (cfg.n_encoder_layers, cfg.n_decoder_layers),
        cfg.n_heads,
        pre_norm=cfg.norm_first,
        activation=ctranslate2.specs.Activation.RELU,
    )
    spec.config.layer_norm_epsilon = cfg.layer_norm_eps
    spec.config.bos_token, spec.config.eos_token, spec.config.unk_token = pieces[1], pieces[2], pieces[3]
    spec.config.decoder_start_token = pieces[cfg.bos_id]
    spec.config.add_source_bos = False
    spec.config.add_source_eos = False

    embed = _np(model.embed.weight)  # (V, D), tied everywhere
    pe = _np(sinusoidal_positions(cfg.max_positions, cfg.d_model))  # (P, D), interleaved, from 0

    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = embed
    enc.scale_embeddings = True
    enc.position_encodings.encodings = pe
    for layer_spec, layer in zip(enc.layer, model.encoder_layers, strict=True):
        _set_linear(layer_spec.self_attention.linear[0], layer.self_attn.qkv)
        _set_linear(layer_spec.self_attention.linear[1], layer.self_attn.out)
        _set_layer_norm(layer_spec.self_attention.layer_norm, layer.ln1)
        _set_linear(layer_spec.ffn.linear_0, layer.ffn.fc1)
        _set_linear(layer_spec.ffn.linear_1, layer.ffn.fc2)
        _set_layer_norm(layer_spec.ffn.layer_norm, layer.ln2)
    if cfg.norm_first:
        _set_layer_norm(enc.layer_norm, model.encoder_ln)

    dec.embeddings.weight = embed
    dec.scale_embeddings = True
    dec.position_encodings.encodings = pe
    dec.projection.weight = embed
    for layer_spec, layer in zip(dec.layer, model.decoder_layers, strict=True):
        _set_linear(layer_spec.self_attention.linear[0], layer.self_attn.qkv)
        _set_linear(layer_spec.self_attention.linear[1], layer.self_attn.out)
        _set_layer_norm(layer_spec.self_attention.layer_norm, layer.ln1)
        _set_linear(layer_spec.attention.linear[0], layer.cross_attn.q)
        _set_linear(layer_spec.attention.linear[1], layer.cross_attn.kv)
        _set_linear(layer_spec.attention.linear[2], layer.cross_attn.out)
        _set_layer_norm(layer_spec.attention.layer_norm, layer.ln2)
        _set_linear(layer_spec.ffn.linear_0, layer.ffn.fc1)
        _set_linear(layer_spec.ffn.linear_1, layer.ffn.fc2)
        _set_layer_norm(layer_spec.ffn.layer_norm, layer.ln3)
    if cfg.norm_first:
        _set_layer_norm(dec.layer_norm, model.decoder_ln)

    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.validate()
    return spec


def convert_model(
    model: Transformer, pieces: list[str], out_dir: str | Path, quantization: str | None = None
) -> Path:
    """Write `model` as a CTranslate2 model directory (quantization: None/float32 or int8, ...)."""
    out_dir = Path(out_dir)
    spec = build_spec(model, pieces)
    spec.optimize(quantization=None if quantization in (None, "float32") else quantization)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    spec.save(str(out_dir))
    return out_dir


def convert(model_dir: str | Path, out_dir: str | Path, quantization: str | None = None) -> Path:
    """Convert a released model directory (config.json, model.safetensors, tokenizer.model)."""
    from model.train import load_release

    model_dir = Path(model_dir)
    model = load_release(model_dir)
    out = convert_model(model, vocabulary_pieces(model_dir / "tokenizer.model"), out_dir, quantization)
    (out / "source_model.json").write_text(
        json.dumps({"model_dir": str(model_dir), "config": model.config.to_dict()}, indent=2) + "\n"
    )
    return out


@dataclass
class CT2Hypothesis:
    tokens: list[int]  # without BOS/EOS
    score: float


class CT2Translator:
    """`ctranslate2.Translator` with our token ids in and out (the vocabulary is the id list itself)."""

    def __init__(
        self,
        ct2_dir: str | Path,
        compute_type: str = "float32",
        intra_threads: int = 0,
        inter_threads: int = 1,
    ) -> None:
        import ctranslate2

        self.path = Path(ct2_dir)
        self.translator = ctranslate2.Translator(
            str(self.path),
            device="cpu",
            compute_type=compute_type,
            intra_threads=intra_threads,
            inter_threads=inter_threads,
        )
        vocab_file = self.path / "shared_vocabulary.json"
        self.pieces: list[str] = json.loads(vocab_file.read_text(encoding="utf-8"))
        self.piece_id = {p: i for i, p in enumerate(self.pieces)}
        self.eos_piece = self.pieces[2]

    def _ids(self, tokens: list[str]) -> list[int]:
        return [self.piece_id[t] for t in tokens]

    def translate_ids(
        self,
        src: list[list[int]],
        beam_size: int = 1,
        max_len: int | list[int] | None = None,
        length_penalty: float = 0.6,
        num_hypotheses: int = 1,
    ) -> list[list[CT2Hypothesis]]:
        """Translate a batch of source id lists (no BOS/EOS). max_len: generated tokens, EOS excluded,
        per sentence or for all; default max_output_length(len(src)). Greedy outputs are truncated to
        each sentence's own limit (exact); for beam search the batch maximum is used."""
        if max_len is None:
            limits = [max_output_length(len(s)) for s in src]
        elif isinstance(max_len, int):
            limits = [max_len] * len(src)
        else:
            limits = list(max_len)
        results = self.translator.translate_batch(
            [[self.pieces[i] for i in s] for s in src],
            beam_size=beam_size,
            num_hypotheses=num_hypotheses,
            length_penalty=length_penalty if beam_size > 1 else 0.0,
            max_decoding_length=max(limits, default=1),
            min_decoding_length=0,
            max_input_length=0,
            return_scores=True,
        )
        out = []
        for res, limit in zip(results, limits, strict=True):
            hyps = []
            for toks, score in zip(res.hypotheses, res.scores, strict=True):
                ids = self._ids(toks)
                if beam_size == 1:
                    ids = ids[:limit]
                hyps.append(CT2Hypothesis(ids, float(score)))
            out.append(hyps)
        return out

    def score_ids(self, src: list[list[int]], tgt: list[list[int]]) -> list[list[float]]:
        """Teacher-forced log-probabilities of each target token, EOS appended (len(tgt) + 1 each)."""
        results = self.translator.score_batch(
            [[self.pieces[i] for i in s] for s in src],
            [[self.pieces[i] for i in t] for t in tgt],
            max_input_length=0,
        )
        return [list(r.log_probs) for r in results]


@torch.no_grad()
def torch_token_log_probs(
    model: Transformer, src: list[list[int]], tgt: list[list[int]]
) -> list[list[float]]:
    """Teacher-forced log-probabilities of tgt + EOS under the PyTorch model (one sentence at a time)."""
    cfg = model.config
    out = []
    for s, t in zip(src, tgt, strict=True):
        src_t = torch.tensor([s], dtype=torch.long)
        tgt_in = torch.tensor([[cfg.bos_id, *t]], dtype=torch.long)
        gold = torch.tensor([*t, cfg.eos_id], dtype=torch.long)
        logits = model(src_t, tgt_in)[0]  # (T, V)
        lp = torch.log_softmax(logits.float(), dim=-1).gather(1, gold[:, None])[:, 0]
        out.append(lp.tolist())
    return out


def pad_batch(src: list[list[int]], pad_id: int = 0) -> torch.Tensor:
    width = max((len(s) for s in src), default=0) or 1
    t = torch.full((len(src), width), pad_id, dtype=torch.long)
    for row, s in enumerate(src):
        t[row, : len(s)] = torch.tensor(s, dtype=torch.long)
    return t


def verify(model: Transformer, ct2: CT2Translator, src: list[list[int]], batch_size: int = 16) -> dict:
    """Greedy outputs (torch reference vs CTranslate2) and teacher-forced log-probs on `src`."""
    model.eval()
    mismatches, max_diff, n_tokens, first_mismatch = 0, 0.0, 0, None
    for start in range(0, len(src), batch_size):
        chunk = src[start : start + batch_size]
        limits = [max_output_length(len(s)) for s in chunk]
        ref = greedy_decode(model, pad_batch(chunk, model.config.pad_id), torch.tensor(limits))
        got = [h[0].tokens for h in ct2.translate_ids(chunk, beam_size=1, max_len=limits)]
        for i, (r, g) in enumerate(zip(ref, got, strict=True)):
            if r != g:
                mismatches += 1
                if first_mismatch is None:
                    first_mismatch = {"index": start + i, "torch": r, "ctranslate2": g}
        ct2_lp = ct2.score_ids(chunk, ref)
        torch_lp = torch_token_log_probs(model, chunk, ref)
        for a, b in zip(ct2_lp, torch_lp, strict=True):
            if len(a) != len(b):
                raise AssertionError(f"score length {len(a)} != {len(b)}")
            n_tokens += len(a)
            max_diff = max([max_diff, *(abs(x - y) for x, y in zip(a, b, strict=True))])
    return {
        "sentences": len(src),
        "greedy_mismatches": mismatches,
        "first_mismatch": first_mismatch,
        "scored_tokens": n_tokens,
        "max_abs_logprob_diff": max_diff,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True, help="released model directory")
    parser.add_argument("--out", type=Path, help="CTranslate2 model directory to write (default: a temp dir)")
    parser.add_argument("--quantization", default=None, help="e.g. int8 (default: float32 weights)")
    parser.add_argument("--verify", type=int, default=32, help="check N test sentences (0: skip)")
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    from model.corpus import read_split
    from model.tokenizer import Tokenizer
    from model.train import load_release

    # The release directory may be rewritten by a running training job: work from a snapshot.
    with tempfile.TemporaryDirectory(prefix="ct2-src-") as tmp:
        snapshot = Path(tmp) / "model"
        shutil.copytree(args.model, snapshot)
        out = args.out or Path(tempfile.mkdtemp(prefix="ct2-"))
        t0 = time.perf_counter()
        convert(snapshot, out, args.quantization)
        print(f"wrote {out} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        if args.verify:
            torch.set_num_threads(args.threads)
            import random

            pairs = read_split(args.data, "test")
            sample = random.Random(0).sample(pairs, min(args.verify, len(pairs)))
            tok = Tokenizer(snapshot / "tokenizer.model")
            model = load_release(snapshot)
            src = [ids[: model.config.max_positions - 2] for ids in tok.encode_batch([p[0] for p in sample])]
            ct2 = CT2Translator(out, compute_type=args.quantization or "float32", intra_threads=args.threads)
            report = verify(model, ct2, src)
            print(json.dumps(report, indent=2))
            ok = report["greedy_mismatches"] == 0 and (
                args.quantization not in (None, "float32") or report["max_abs_logprob_diff"] < 1e-3
            )
            if not ok and math.isfinite(report["max_abs_logprob_diff"]):
                sys.exit(1)


if __name__ == "__main__":
    main()
