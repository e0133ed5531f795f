"""SentencePiece runtime of the shared English/Spanish tokenizer (no training code, no torch).

Exact round trip, ``decode(encode(x)) == x``, is a contract: identity normalisation, whitespace kept, byte
fallback; ``\\n`` and ``\\t`` map to private-use characters that are single pieces; frequent placeholders and
markup tags are user-defined pieces. The model is trained by `model.tokenizer`.
"""

from __future__ import annotations

import re
from pathlib import Path

import sentencepiece as spm

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
NEWLINE, TAB = "\ue000", "\ue001"
MODEL_FILE = "tokenizer.model"

# printf (%s, %1$s, %.2f, %lu), Qt (%1), brace ({0}, {name}), Python (%(name)s), shell ($name)
# placeholders, markup tags and entities.
PLACEHOLDER_PATTERN = re.compile(
    r"%(?:\d+\$)?[-+#0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t|I64|I32)?[diouxXeEfFgGaAcspn%]"
    r"|%\([A-Za-z_][A-Za-z0-9_]*\)[-+#0]*\d*(?:\.\d+)?[diouxXeEfFgGcrs]"
    r"|%\d+"
    r"|\{[A-Za-z0-9_]*(?::[^{}]*)?\}"
    r"|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?"
    r"|</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]{0,60})?/?>"
    r"|&[A-Za-z]+;|&#\d+;"
)
MARKUP_TAGS = {
    "a", "b", "i", "u", "p", "s", "br", "em", "strong", "tt", "code", "span", "div", "qt", "html", "body",
    "head", "big", "small", "sub", "sup", "ul", "ol", "li", "nl", "para", "emphasis", "center", "font",
    "h1", "h2", "h3", "pre", "table", "tr", "td", "th", "hr", "img", "title", "link", "ulink", "literal",
}  # fmt: skip


def find_placeholders(text: str) -> list[str]:
    """Placeholders and markup in order of appearance (used to check they survive translation)."""
    return PLACEHOLDER_PATTERN.findall(text)


def is_markup(token: str) -> bool:
    match = re.match(r"</?([A-Za-z][A-Za-z0-9]*)", token)
    return bool(match) and match.group(1).lower() in MARKUP_TAGS


def _to_pieces_text(text: str) -> str:
    return text.replace("\n", NEWLINE).replace("\t", TAB)


def _from_pieces_text(text: str) -> str:
    return text.replace(NEWLINE, "\n").replace(TAB, "\t")


class Tokenizer:
    """SentencePiece with newline/tab mapping; ids: pad 0, bos 1, eos 2, unk 3."""

    def __init__(self, model_path: str | Path) -> None:
        self.model_path = Path(model_path)
        self.sp = spm.SentencePieceProcessor(model_file=str(self.model_path))
        if (self.sp.pad_id(), self.sp.bos_id(), self.sp.eos_id()) != (PAD_ID, BOS_ID, EOS_ID):
            raise ValueError(f"{model_path}: expected pad/bos/eos ids {PAD_ID}/{BOS_ID}/{EOS_ID}")

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    def encode(self, text: str) -> list[int]:
        """Token ids without BOS/EOS."""
        return self.sp.encode(_to_pieces_text(text))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.sp.encode([_to_pieces_text(t) for t in texts])

    def decode(self, ids: list[int]) -> str:
        return _from_pieces_text(self.sp.decode(list(ids)))

    def decode_batch(self, batch: list[list[int]]) -> list[str]:
        return [_from_pieces_text(t) for t in self.sp.decode([list(ids) for ids in batch])]

    def pieces(self, text: str) -> list[str]:
        return self.sp.encode(_to_pieces_text(text), out_type=str)
