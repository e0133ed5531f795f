"""A model with other layer counts, warm-started from a trained one (issue 30: a deep encoder with a
shallow decoder, Kasai et al. 2021, at about today's serving cost).

Training such a model from scratch takes 7-9 hours on the 2-core CPU; starting from a released model
whose layers already translate, it only has to learn what changed. Every layer of the new stacks is a
copy of one layer of the old stack (same width, heads and FFN size); embeddings and the final norms are
copied as they are. Which old layer each new one copies is a map:

* ``repeat``: each old layer twice (or n times) in a row, [0, 0, 1, 1, 2, 2] for 6 from 3 (a layer of
  a post-norm stack moves its input a little, so applying it twice stays close to applying it once);
* ``stack``: the old stack again on top of itself, [0, 1, 2, 0, 1, 2] (progressive stacking, Gong et
  al. 2019);
* ``spread``: evenly spaced, keeping the first and the last, [0, 2] for 2 from 3 (a shallower stack
  keeps the layer that feeds the output projection).

`python -m model.depth --from models/en-es-small --encoder-layers 6 --decoder-layers 2 --data D`
prints the valid loss of every map before any training, so a run starts from the best one.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace
from pathlib import Path

import torch

from model.model import Transformer, TransformerConfig

MAPS = ("repeat", "stack", "spread")
# The maps model.train uses by default: the lowest valid loss before training for Spanish 3+3 -> 6+2.
ENCODER_MAP, DECODER_MAP = "stack", "spread"
_LAYER = re.compile(r"^(encoder_layers|decoder_layers)\.(\d+)\.(.+)$")


def layer_map(kind: str, n_old: int, n_new: int) -> list[int]:
    """Which old layer each of n_new layers copies (see the module docstring)."""
    if kind == "repeat":
        return [i * n_old // n_new for i in range(n_new)]
    if kind == "stack":
        return [i % n_old for i in range(n_new)]
    if kind == "spread":
        if n_new == 1:
            return [n_old - 1]
        return [round(i * (n_old - 1) / (n_new - 1)) for i in range(n_new)]
    raise ValueError(f"unknown layer map {kind!r}: one of {', '.join(MAPS)}")


def deepen(
    old: Transformer,
    n_encoder: int,
    n_decoder: int,
    encoder_map: str = ENCODER_MAP,
    decoder_map: str = DECODER_MAP,
) -> Transformer:
    """A new Transformer with n_encoder + n_decoder layers whose every parameter is a copy of one of
    `old`'s (layers per the maps). Same width, heads, FFN, vocabulary and norm placement."""
    config: TransformerConfig = replace(old.config, n_encoder_layers=n_encoder, n_decoder_layers=n_decoder)
    new = Transformer(config)
    maps = {
        "encoder_layers": layer_map(encoder_map, old.config.n_encoder_layers, n_encoder),
        "decoder_layers": layer_map(decoder_map, old.config.n_decoder_layers, n_decoder),
    }
    source = old.state_dict()
    state = {}
    for name in new.state_dict():
        m = _LAYER.match(name)
        key = f"{m[1]}.{maps[m[1]][int(m[2])]}.{m[3]}" if m else name
        state[name] = source[key].detach().clone()
    new.load_state_dict(state)
    return new


def main(argv: list[str] | None = None) -> None:
    from model.tokenizer import Tokenizer
    from model.train import Validation, evaluate_loss, load_release  # training code: only for this report

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="source", type=Path, required=True, help="released model directory")
    p.add_argument("--encoder-layers", type=int, required=True)
    p.add_argument("--decoder-layers", type=int, required=True)
    p.add_argument("--data", type=Path, required=True, help="corpus directory (its valid split)")
    p.add_argument("--max-tokens", type=int, default=3000)
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    old = load_release(args.source)
    tokenizer = Tokenizer(args.source / "tokenizer.model")
    validation = Validation.load(args.data, tokenizer, 128, args.max_tokens, 0)
    with torch.no_grad():
        print(
            f"{args.source} as it is: valid loss {evaluate_loss(old, validation.batches, cpu):.4f}",
            flush=True,
        )
        for enc in MAPS:
            for dec in MAPS:
                new = deepen(old, args.encoder_layers, args.decoder_layers, enc, dec).eval()
                loss = evaluate_loss(new, validation.batches, cpu)
                print(
                    f"encoder {enc:6s} {layer_map(enc, old.config.n_encoder_layers, args.encoder_layers)} "
                    f"decoder {dec:6s} {layer_map(dec, old.config.n_decoder_layers, args.decoder_layers)}: "
                    f"valid loss {loss:.4f}",
                    flush=True,
                )


if __name__ == "__main__":
    sys.exit(main())
