"""Export a released model to a self-contained ONNX bundle that the server loads without torch.

    python -m export --checkpoint models/en-es-small --out bundles/en-es-small [--variants fp32,int8,fp16]

Writes ONNX graphs (encoder, KV-cached decoder step with in-graph top-k, cache update) per variant,
tokenizer.model and manifest.json (with the sha256 of every file), checks every graph with
onnx.checker and the fp32 graphs against PyTorch (max |log-prob difference| <= 1e-4, else it fails).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from export import fused_step
from export.build import VARIANTS, export_bundle, summary_line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", type=Path, required=True, help="model directory from save_release")
    parser.add_argument("--out", type=Path, required=True, help="bundle directory (replaced)")
    parser.add_argument(
        "--variants", default="fp32,int8", help=f"comma-separated subset of {','.join(VARIANTS)}"
    )
    parser.add_argument("--name", default=None, help="model name (default: checkpoint directory name)")
    parser.add_argument("--version", default=None, help="model version (default: date + weights sha256)")
    parser.add_argument("--source-language", default="en")
    parser.add_argument(
        "--target-language",
        default=None,
        help="the bundle's target language (default: training.json's target_language, else es)",
    )
    parser.add_argument("--max-source-tokens", type=int, default=256)
    parser.add_argument("--max-beam-size", type=int, default=8)
    parser.add_argument("--max-length-cap", type=int, default=256)
    # Decoding defaults: flags win, then the checkpoint's decoding.json (tuned on the valid split and
    # shipped with the model), then these.
    parser.add_argument("--beam-size", type=int, default=None, help="default decoding beam (4)")
    parser.add_argument("--num-hypotheses", type=int, default=None, help="default n-best size (1)")
    parser.add_argument("--length-penalty", type=float, default=None, help="default GNMT alpha (0.6)")
    parser.add_argument(
        "--repetition-penalty", type=float, default=None, help="default repetition penalty (1 = off)"
    )
    parser.add_argument(
        "--no-repeat-ngram-size", type=int, default=None, help="default no-repeat n-gram size (0 = off)"
    )
    parser.add_argument(
        "--optimize", action="store_true", help="apply onnxruntime.transformers optimizer (fp32)"
    )
    parser.add_argument(
        "--fused-attention",
        nargs="?",
        const="split",
        choices=fused_step.SELF_ATTENTION,
        help="decoder step with ONNX Runtime's contrib MultiHeadAttention (cross-attention; self-attention "
        "too with 'mha'; default 'split'): fewer nodes, same interface (export/fused_step.py)",
    )
    parser.add_argument("--data", type=Path, default=Path("data"), help="corpus dir with test.en for parity")
    parser.add_argument("--parity-sentences", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="ORT threads for the parity runs")
    args = parser.parse_args(argv)
    decoding = {
        "beam_size": 4,
        "num_hypotheses": 1,
        "length_penalty": 0.6,
        "repetition_penalty": 1.0,
        "no_repeat_ngram_size": 0,
    }
    decoding_file = args.checkpoint / "decoding.json"
    if decoding_file.exists():
        decoding.update(json.loads(decoding_file.read_text()).get("defaults", {}))
    for key in decoding:
        if getattr(args, key) is None:
            setattr(args, key, decoding[key])
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    try:
        manifest = export_bundle(
            args.checkpoint,
            args.out,
            variants=variants,
            name=args.name,
            version=args.version,
            source_language=args.source_language,
            target_language=args.target_language,
            max_source_tokens=args.max_source_tokens,
            max_beam_size=args.max_beam_size,
            max_length_cap=args.max_length_cap,
            beam_size=args.beam_size,
            num_hypotheses=args.num_hypotheses,
            length_penalty=args.length_penalty,
            repetition_penalty=args.repetition_penalty,
            no_repeat_ngram_size=args.no_repeat_ngram_size,
            optimize=args.optimize,
            data_dir=args.data,
            parity_sentences=args.parity_sentences,
            threads=args.threads,
            fused_attention=args.fused_attention,
        )
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"export failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"node_counts": manifest["node_counts"], "parity": manifest["parity"]}, indent=1))
    print(summary_line(manifest, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
