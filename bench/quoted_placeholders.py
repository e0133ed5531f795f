"""How a placeholder alone between quotes (`Create "%1" in %2`) should come back, measured on valid.

Two rules through the service's text layer (``Engine.translate_texts``): the quoted placeholder is a
code literal that keeps the source's quotes, or only the placeholder is protected and the quotes are the
model's (what runtime.faithful.code does). Prints BLEU/chrF of each on the valid texts that hold such a
span, and a few examples. Reproduce: ``python -m bench.quoted_placeholders --data data --bundle
bundles/en-es-small`` (``--data runs/data-fr --bundle bundles/en-fr-small`` for French).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import sacrebleu

import runtime.faithful.code as code
from bench.evaluate import default_length_penalty, translate_onnx
from runtime.tokenizer import PLACEHOLDER_PATTERN

# The straight or curly pairs runtime.faithful.code reads (GNU `...' quoting is not in question here).
_QUOTED = code._QUOTED
_MODEL_QUOTES = code.is_code


def _source_quotes(inner: str, gnu: bool = False) -> bool:
    """The other rule: a quoted placeholder is a literal, quotes and all."""
    return (not gnu and PLACEHOLDER_PATTERN.fullmatch(inner.strip()) is not None) or _MODEL_QUOTES(inner, gnu)


def quoted_placeholder_pairs(path: Path) -> tuple[list[str], list[str]]:
    sources, references = [], []
    with path.open(encoding="utf-8") as f:
        for line in f:
            pair = json.loads(line)
            spans = (m.group(2).strip() for m in _QUOTED.finditer(pair["source"]))
            if any(PLACEHOLDER_PATTERN.fullmatch(s) for s in spans):
                sources.append(pair["source"])
                references.append(pair["target"])
    return sources, references


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="corpus directory with valid.jsonl")
    parser.add_argument("--bundle", type=Path, required=True, help="exported bundle (bundles/en-xx-small)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--examples", type=int, default=5)
    args = parser.parse_args(argv)
    sources, references = quoted_placeholder_pairs(args.data / "valid.jsonl")
    penalty = default_length_penalty(None, args.bundle)
    outputs = {}
    for name, rule in (("source's quotes", _source_quotes), ("model's quotes", _MODEL_QUOTES)):
        code.is_code = rule  # _quoted looks the rule up at call time
        try:
            hyps = translate_onnx(
                args.bundle, "fp32", sources, args.beam, penalty, 16, "cpu", args.threads, text_layer=True
            ).hypotheses
        finally:
            code.is_code = _MODEL_QUOTES
        outputs[name] = hyps
        bleu = sacrebleu.corpus_bleu(hyps, [references]).score
        chrf = sacrebleu.corpus_chrf(hyps, [references]).score
        print(f"{args.data} valid, {len(sources)} texts with a quoted placeholder, {name}: "
              f"BLEU {bleu:.2f} chrF {chrf:.2f}", flush=True)  # fmt: skip
    for i in range(min(args.examples, len(sources))):
        print(f"  {sources[i]!r}\n    reference: {references[i]!r}")
        for name, hyps in outputs.items():
            print(f"    {name}: {hyps[i]!r}")
    changed = sum(a != b for a, b in zip(*outputs.values(), strict=True))
    print(f"summary: {changed} of {len(sources)} outputs differ between the rules")


if __name__ == "__main__":
    main()
