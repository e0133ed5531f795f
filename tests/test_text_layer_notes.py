"""What the text layer (server/engine/faithful.py) tells the user, without a model: the notes of a
translation that is not the model's best hypothesis as written (Translation.notes over gRPC, a
translator comment in a .po file), and the message of a text over the length limit. tests/test_faithful.py
checks the guarantees themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.decoding import DecodingOptions
from runtime.tokenizer import Tokenizer
from server.contract import Hypothesis, InputTooLongError, Prepared
from server.engine.faithful import TextLayer

TOKENIZER = Path(__file__).resolve().parent.parent / "models" / "en-es-small" / "tokenizer.model"
BEAM2 = DecodingOptions(beam_size=2, num_hypotheses=1)


@pytest.fixture(scope="module")
def layer() -> TextLayer:
    return TextLayer(Tokenizer(TOKENIZER), max_source_tokens=24, keep_terms={"GNOME"})


def second_round(layer: TextLayer, text: str) -> Prepared:
    """`text` sent whole, its best hypotheses losing every span: the masked second round."""
    first = layer.prepare([text], BEAM2)
    assert first.options.num_hypotheses == 2  # the n-best widened to the beam for a text with spans
    second = layer.finish(first, [[Hypothesis("Copiar a la carpeta.", -1.0, [5])] * 2])
    assert isinstance(second, Prepared)
    return second


def test_the_next_hypothesis_is_used_and_the_note_says_why(layer):
    second = second_round(layer, "Copy %s to the GNOME folder.")
    assert second.segments == ["Copy %1 to the %2 folder."]
    hyps = [
        Hypothesis("Copiar a la carpeta %2.", -1.0, [5]),
        Hypothesis("Copiar %1 a la carpeta %2.", -1.2, [6]),
    ]
    [[best]] = layer.finish(second, [hyps])
    assert best.text == "Copiar %s a la carpeta GNOME." and best.score == -1.2
    assert [(n.action, n.start, n.end, n.reason) for n in best.notes] == [
        ("repaired", 0, 28, "lost %1; used hypothesis 2")
    ]


def test_a_text_over_the_limit_is_refused_with_what_to_do(layer):
    with pytest.raises(InputTooLongError) as e:
        layer.prepare(["ok", "x" * 20_001], BEAM2)
    assert str(e.value) == (
        "texts[1] has 20001 characters, over the limit of 20000 (max_text_chars); send long documents in "
        "several texts (e.g. one per paragraph)"
    )
