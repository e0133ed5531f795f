"""Shared English/Spanish SentencePiece tokenizer that keeps placeholders and markup intact.

One vocabulary for both languages: software strings copy a lot from source to target (placeholders,
product names, numbers, markup), and a shared vocabulary lets the source embedding, target embedding
and output projection be one tied matrix, which matters at 8k x 256.

Exact round trip, ``decode(encode(x)) == x``, is a contract:
  * identity normalisation (no NFKC), extra whitespace kept, byte fallback for unseen characters;
  * ``\\n`` and ``\\t`` are mapped to private-use characters that are single user-defined pieces;
  * frequent printf/Qt/brace/Python placeholders and markup tags are user-defined pieces, so the model
    sees (and emits) them as atoms.

    python -m model.tokenizer --data data/ --out runs/tokenizer/ [--vocab-size 8000]
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from runtime.tokenizer import (  # noqa: F401 - re-exported: the training side's one import
    BOS_ID,
    EOS_ID,
    MARKUP_TAGS,
    MODEL_FILE,
    NEWLINE,
    PAD_ID,
    PLACEHOLDER_PATTERN,
    TAB,
    UNK_ID,
    Tokenizer,
    _to_pieces_text,
    find_placeholders,
    is_markup,
)

BASE_SYMBOLS = (
    ["%s", "%d", "%u", "%i", "%f", "%c", "%x", "%%", "%ld", "%lu", "{}", "<br/>", "<br />"]
    + [f"%{n}" for n in range(1, 10)]
    + [f"%{n}$s" for n in range(1, 10)]
    + [f"%{n}$d" for n in range(1, 5)]
    + [f"{{{n}}}" for n in range(10)]
    + [f"<{tag}>" for tag in ("b", "i", "u", "p", "br", "em", "strong", "tt", "qt", "html", "body")]
    + [f"</{tag}>" for tag in ("b", "i", "u", "p", "em", "strong", "tt", "qt", "html", "body", "span", "a")]
)


def protected_symbols(texts: Iterable[str], min_count: int = 30, limit: int = 300) -> list[str]:
    """The base symbols plus placeholders/markup seen at least `min_count` times in `texts`.

    Tag-like words such as ``<file>`` are left out unless they are real markup: they are usage
    metavariables that translators translate (``<fichero>``).
    """
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(find_placeholders(text))
    symbols = list(BASE_SYMBOLS)
    for token, count in counts.most_common():
        if count < min_count or len(symbols) >= limit:
            break
        if token.startswith("<") and not is_markup(token):
            continue
        if token not in symbols and " " not in token.strip():
            symbols.append(token)
    return symbols


def train_tokenizer(
    texts: list[str],
    out_dir: Path,
    vocab_size: int = 8000,
    model_type: str = "unigram",
    max_sentences: int = 2_000_000,
    symbols: list[str] | None = None,
) -> Tokenizer:
    """Train the shared SentencePiece model on `texts` (both languages) into out_dir/tokenizer.model."""
    out_dir.mkdir(parents=True, exist_ok=True)
    symbols = protected_symbols(texts) if symbols is None else symbols
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("".join(_to_pieces_text(t) + "\n" for t in texts if t), encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(corpus),
            model_prefix=str(out_dir / "tokenizer"),
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=0.9999,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            byte_fallback=True,
            split_digits=True,
            user_defined_symbols=[NEWLINE, TAB, *symbols],
            pad_id=PAD_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            input_sentence_size=max_sentences,
            shuffle_input_sentence=True,
            max_sentence_length=8192,
            num_threads=2,
            minloglevel=2,
        )
    (out_dir / "tokenizer.vocab").unlink(missing_ok=True)  # the .model holds everything
    return Tokenizer(out_dir / MODEL_FILE)


def main(argv: list[str] | None = None) -> None:
    from model.corpus import read_split
    from model.multilingual import tags_of

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="a new directory, e.g. runs/tokenizer (never models/: see make tokenizer)",
    )
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--model-type", choices=["unigram", "bpe"], default="unigram")
    args = parser.parse_args(argv)
    pairs = read_split(args.data, "train")
    texts = [t for pair in pairs for t in pair]
    tags = tags_of(args.data)  # a multilingual corpus: each target-language tag is one piece
    symbols = protected_symbols(texts) + tags if tags else None
    tokenizer = train_tokenizer(texts, args.out, args.vocab_size, args.model_type, symbols=symbols)
    sample = texts[:20000]
    n_tokens = sum(len(ids) for ids in tokenizer.encode_batch(sample))
    exact = sum(
        tokenizer.decode(ids) == t for ids, t in zip(tokenizer.encode_batch(sample), sample, strict=True)
    )
    print(
        f"tokenizer: {tokenizer.vocab_size} pieces -> {args.out / MODEL_FILE}; "
        f"{n_tokens / len(sample):.1f} tokens/segment, round trip exact on {exact}/{len(sample)} segments"
    )


if __name__ == "__main__":
    main()
