"""Tokenizer: exact round trip on placeholder-heavy text, placeholders as single pieces, special ids.

Runs on the shipped models/en-es-small/tokenizer.model (skipped if absent) and on a tiny tokenizer trained
here. Byte fallback alone needs 256 pieces, plus 4 specials, newline/tab and the ~70 base symbols and the
characters of the corpus, so the tiny vocabulary is 512 rather than 300 (SentencePiece refuses < ~410).
"""

import random
import shutil
from pathlib import Path

import pytest
import sentencepiece as spm

from model.tokenizer import (
    BASE_SYMBOLS,
    BOS_ID,
    EOS_ID,
    MODEL_FILE,
    NEWLINE,
    PAD_ID,
    TAB,
    UNK_ID,
    Tokenizer,
    find_placeholders,
    protected_symbols,
    train_tokenizer,
)

SHIPPED = Path(__file__).resolve().parent.parent / "models" / "en-es-small" / MODEL_FILE

ROUND_TRIP = [
    "Open %s",
    "Copying %1$s to %2$s (%3$d of %4$d)",
    "Delete %1 from %2?",
    "Hello {name}, you have {0} new messages and {1:>5} drafts {}",
    "%(count)d files in %(folder)s, %.2f%% done, %lu bytes, %-10s|",
    "First line\nSecond line\n",
    "\nLeading newline",
    "Column\tTabbed\t\tdouble tab",
    '<b>bold</b> and <i>italic</i><br/>next <a href="https://example.org/x?a=1&amp;b=2">link</a>',
    "Tom &amp; Jerry &lt;3 &gt; &#169; &nbsp;",
    "  leading spaces",
    "trailing spaces  ",
    "double  spaces   inside    here",
    " ",
    "   ",
    "",
    "Configuración avanzada: ¿Desea añadir el género «ñandú»? Ça, über, Ørsted",
    "Emoji 😀🎉 and ✓ check ✗ — “quotes” … €",
    "日本語のテキスト 中文 한국어",
    "Mixed %s\n\t{0} <b>%1</b>  ¡Olé! 😀\n",
    "$HOME and ${XDG_CONFIG_HOME}/app",
    "C:\\Program Files\\App\\n is not a newline",
    "\u00a0non-breaking\u00a0space and zero\u200bwidth",
]
SINGLE_PIECES = ["%s", "%1$s", "%1", "%d", "{0}", "<b>", "</b>", "\n", "\t", "<br/>", "%%"]


def check_round_trip(tokenizer: Tokenizer) -> None:
    failures = [text for text in ROUND_TRIP if tokenizer.decode(tokenizer.encode(text)) != text]
    assert not failures
    batch = tokenizer.decode_batch(tokenizer.encode_batch(ROUND_TRIP))
    assert batch == ROUND_TRIP


def check_single_pieces(tokenizer: Tokenizer, symbols: list[str]) -> None:
    for symbol in symbols:
        piece = symbol.replace("\n", NEWLINE).replace("\t", TAB)
        for context in (symbol, f"a {symbol} b", f"x{symbol}y", f"Open{symbol}"):
            assert piece in tokenizer.pieces(context), (symbol, context, tokenizer.pieces(context))
        ids = tokenizer.encode(f"Copy {symbol} now")
        assert tokenizer.sp.piece_to_id(piece) in ids


def check_special_ids(tokenizer: Tokenizer) -> None:
    sp = tokenizer.sp
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id) == (0, 1, 2, 3)
    assert (sp.pad_id(), sp.bos_id(), sp.eos_id(), sp.unk_id()) == (PAD_ID, BOS_ID, EOS_ID, UNK_ID)
    assert [sp.id_to_piece(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]
    assert sp.piece_to_id(NEWLINE) == 4 and sp.piece_to_id(TAB) == 5
    # no ordinary text ever encodes to a special id, even with unseen characters (byte fallback)
    ids = [i for text in ROUND_TRIP for i in tokenizer.encode(text)]
    assert not {PAD_ID, BOS_ID, EOS_ID, UNK_ID} & set(ids)
    assert tokenizer.decode([BOS_ID, *tokenizer.encode("Open %s"), EOS_ID]) == "Open %s"


# --------------------------------------------------------------------------------------------
# The shipped tokenizer


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Tokenizer:
    if not SHIPPED.exists():
        pytest.skip(f"{SHIPPED} not built (python -m model.tokenizer --data data --out models/en-es-small)")
    copy = tmp_path_factory.mktemp("shipped") / MODEL_FILE  # the trainer may rewrite the release dir
    shutil.copyfile(SHIPPED, copy)
    return Tokenizer(copy)


def test_shipped_round_trip(shipped):
    check_round_trip(shipped)


def test_shipped_single_pieces(shipped):
    check_single_pieces(shipped, [*SINGLE_PIECES, "{name}", "%(name)s", "&amp;"])


def test_shipped_special_ids(shipped):
    check_special_ids(shipped)


# --------------------------------------------------------------------------------------------
# A tiny tokenizer trained here


def make_train_texts(n: int = 400, seed: int = 0) -> list[str]:
    """A few hundred deterministic lines: pseudo-words (enough variety to fill the vocabulary) in
    software-string templates with placeholders, markup, newlines and tabs."""
    rng = random.Random(seed)
    syllables = (
        "ab ar ci con de do el en es fi ga in la li ma mo na ne or pa po que ra re ri sa se ta te "
        "ti to un va ve zo ño ción tr str th sh ing er ed"
    ).split()
    words = sorted({"".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(600)})
    templates = [
        "Open {w} {w}",
        "Copying %1$s to %2$s {w}",
        "Delete %1?\n{W} {w}.",
        "<b>{W}:</b> {0} {w}, {name} {w}\t({n}%)",
        "Save %(name)s as %s in %d {w} &amp; {w}",
        "{W} {w} {w} {w}.",
    ]
    texts = []
    for _ in range(n):
        text = rng.choice(templates).replace("{n}", str(rng.randint(0, 99)))
        while "{w}" in text or "{W}" in text:
            text = text.replace("{w}", rng.choice(words), 1).replace("{W}", rng.choice(words).capitalize(), 1)
        texts.append(text)
    return texts


TRAIN_TEXTS = make_train_texts()


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def tiny(request, tmp_path_factory) -> Tokenizer:
    out = tmp_path_factory.mktemp(f"tiny-{request.param}")
    return train_tokenizer(TRAIN_TEXTS, out, vocab_size=512, model_type=request.param)


def test_tiny_vocab_and_files(tiny):
    assert tiny.vocab_size == 512
    assert (tiny.model_path.parent / MODEL_FILE).exists()
    assert not (tiny.model_path.parent / "tokenizer.vocab").exists()


def test_tiny_round_trip(tiny):
    check_round_trip(tiny)


def test_tiny_single_pieces(tiny):
    # {name}, %(name)s and &amp; occur ~65 times each in TRAIN_TEXTS (>= min_count 30): protected too.
    check_single_pieces(tiny, [*SINGLE_PIECES, "{name}", "%(name)s", "&amp;"])


def test_tiny_special_ids(tiny):
    check_special_ids(tiny)


def test_protected_symbols():
    symbols = protected_symbols(TRAIN_TEXTS)
    assert symbols[: len(BASE_SYMBOLS)] == BASE_SYMBOLS
    assert {"{name}", "%(name)s", "&amp;", "%2$s"} <= set(symbols)
    assert len(symbols) == len(set(symbols))
    # tag-like usage metavariables are left to the translator; real markup is kept
    usage = ["Usage: cp <file> <dir>"] * 50 + ["<span>x</span>"] * 50
    usage_symbols = protected_symbols(usage)
    assert "<file>" not in usage_symbols and "<dir>" not in usage_symbols
    assert "<span>" in usage_symbols


def test_find_placeholders():
    text = "Copy %1$s to {dest} (%d%%) <b>now</b> &amp; %(n)s, %2 and $HOME"
    assert find_placeholders(text) == [
        "%1$s",
        "{dest}",
        "%d",
        "%%",
        "<b>",
        "</b>",
        "&amp;",
        "%(n)s",
        "%2",
        "$HOME",
    ]
    assert find_placeholders("No placeholders here.") == []


def test_rejects_model_with_other_special_ids(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TRAIN_TEXTS) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(tmp_path / "plain"), vocab_size=100, minloglevel=2
    )  # SentencePiece defaults: unk 0, bos 1, eos 2, no pad
    with pytest.raises(ValueError, match="pad/bos/eos"):
        Tokenizer(tmp_path / "plain.model")
