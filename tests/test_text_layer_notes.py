"""What the text layer (server/engine/faithful.py) tells the user, without a model: the notes of a
translation that is not the model's best hypothesis as written (Translation.notes over gRPC, a
translator comment in a .po file), and the message of a text over the length limit. tests/test_faithful.py
checks the guarantees themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.decoding import DecodingOptions
from runtime.faithful.lexicon import Lexicon
from runtime.faithful.memory import MemoryEntry
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
        ("repaired", 0, 28, "lost %s; used hypothesis 2")
    ]


def test_a_text_over_the_limit_is_refused_with_what_to_do(layer):
    with pytest.raises(InputTooLongError) as e:
        layer.prepare(["ok", "x" * 20_001], BEAM2)
    assert str(e.value) == (
        "texts[1] has 20001 characters, over the limit of 20000 (max_text_chars); send long documents in "
        "several texts (e.g. one per paragraph)"
    )


# ---- the lexical guard (runtime/faithful/lexicon.py): a word in no dictionary gives way ----------------

SPANISH = Lexicon(["hola", "mundo", "abrir", "con", "en", "el", "archivo", "de", "la", "carpeta"])


@pytest.fixture(scope="module")
def guarded() -> TextLayer:
    # a word of two of Debian's own translations is allowed, a name they copy is not
    memory = {
        "Mute": MemoryEntry("Desmutear", 3),
        "Mute all": MemoryEntry("Desmutear todo", 1),
        "Helo": MemoryEntry("Helo", 2),
        "Helo 2": MemoryEntry("Helo 2", 1),
    }
    return TextLayer(
        Tokenizer(TOKENIZER), max_source_tokens=24, keep_terms={"GNOME"}, memory=memory, lexicon=SPANISH
    )


def test_the_guard_takes_the_next_hypothesis_without_a_non_word(guarded, layer):
    first = guarded.prepare(["Hello world"], BEAM2)
    hyps = [Hypothesis("Hanllo mundo", -0.5, [5]), Hypothesis("Hola mundo", -0.7, [6])]
    [[best]] = guarded.finish(first, [hyps])
    assert (best.text, best.score) == ("Hola mundo", -0.7)
    assert [(n.action, n.start, n.end, n.reason) for n in best.notes] == [
        ("repaired", 0, 11, "'Hanllo' is in no dictionary; used hypothesis 2")
    ]
    # a layer without a lexicon (a bundle without one, or the guard off) keeps the model's best
    first = layer.prepare(["Hello world"], BEAM2)
    [[best]] = layer.finish(first, [hyps])
    assert best.text == "Hanllo mundo" and best.notes == ()


def test_when_every_hypothesis_has_a_non_word_the_best_stays_with_a_note(guarded):
    first = guarded.prepare(["Hello world"], BEAM2)
    hyps = [Hypothesis("Hanllo mundo", -0.5, [5]), Hypothesis("Hola mundito", -0.7, [6])]
    [[best]] = guarded.finish(first, [hyps])
    assert best.text == "Hanllo mundo"
    assert [n.reason for n in best.notes] == [
        "'Hanllo' is in no dictionary; no hypothesis without such a word"
    ]


def test_copied_words_spans_and_terms_are_no_reason_to_give_way(guarded):
    # a word copied from the source, a do-not-translate term, a placeholder (first round: spans visible)
    first = guarded.prepare(["Open Guake with %s in GNOME"], BEAM2)
    hyps = [
        Hypothesis("Abrir Guake con %s en GNOME", -0.5, [5]),
        Hypothesis("Abrir con %s en GNOME", -0.7, [6]),
    ]
    [[best]] = guarded.finish(first, [hyps])
    assert best.text.startswith("Abrir Guake con %s") and best.notes == ()
    # a word of the translation memory's human translations, and a request's glossary target
    first = guarded.prepare(["Mute the sound"], BEAM2, glossary={"sound": "sonidito"})
    hyps = [Hypothesis("Desmutear el %1", -0.5, [5]), Hypothesis("Hola", -0.7, [6])]
    [[best]] = guarded.finish(first, [hyps])
    assert best.text == "Desmutear el sonidito" and best.notes == ()
    assert guarded.non_words("Mute", "Desmutear el Hanllo") == ["Hanllo"]
    assert guarded.non_words("Hello", "¡Helo!") == ["Helo"]


def test_when_none_is_left_a_beam_twice_as_wide_is_tried_once(guarded):
    wide = TextLayer(Tokenizer(TOKENIZER), max_source_tokens=24, lexicon=SPANISH, max_beam_size=4)
    hyps = [Hypothesis("Hanllo mundo", -0.5, [5]), Hypothesis("Hola mundito", -0.7, [6])]
    for clean in (True, False):
        first = wide.prepare(["Hello world"], BEAM2)
        second = wide.finish(first, [hyps])
        assert isinstance(second, Prepared) and second.segments == ["Hello world"]
        assert (second.options.beam_size, second.options.num_hypotheses) == (4, 4)
        wider = [*hyps, Hypothesis("Hanllo mundial", -0.9, [7]), Hypothesis("Hola mundo", -1.0, [8])]
        [[best]] = wide.finish(second, [wider if clean else hyps])
        if clean:  # the wider beam's clean hypothesis goes first
            assert (best.text, best.score) == ("Hola mundo", -1.0)
            assert [n.reason for n in best.notes] == [
                "'Hanllo' is in no dictionary; used hypothesis 4 of a beam of 4"
            ]
        else:  # nothing better: the first round's best, noted
            assert best.text == "Hanllo mundo"
            assert [n.reason for n in best.notes] == [
                "'Hanllo' is in no dictionary; no hypothesis without such a word"
            ]
    # greedy decoding is never widened (the guard only reorders what it has)
    [[best]] = wide.finish(wide.prepare(["Hello world"], DecodingOptions(beam_size=1)), [hyps[:1]])
    assert best.text == "Hanllo mundo" and len(best.notes) == 1


def _copying(layer: TextLayer, text: str) -> Hypothesis:
    step = layer.prepare([text], DecodingOptions(beam_size=1))
    while isinstance(step, Prepared):
        step = layer.finish(step, [[Hypothesis(s, 0.0, [])] for s in step.segments])
    return step[0][0]


def test_a_copied_markup_text_is_noted_only_when_it_is_not_the_target_language(guarded, layer):
    # <p>Hello!</p> given back as it is: "Hello" is no Spanish word, so the text says it was not translated
    copied = _copying(guarded, '<p class="green">Hello!</p>')
    assert copied.text == '<p class="green">Hello!</p>'
    assert [(n.action, n.reason) for n in copied.notes] == [
        ("passed_through", "the model gave the text back untranslated")
    ]
    # Spanish as it is (a right answer), text without markup (a usage line), no lexicon: no such note
    for lay, text in ((guarded, "<b>Hola mundo</b>"), (guarded, "wait [pid ...]"), (layer, "<p>Hello!</p>")):
        assert not any("gave the text back" in n.reason for n in _copying(lay, text).notes), text
