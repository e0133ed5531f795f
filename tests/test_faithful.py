"""The faithful-text layer without a model: spans, masking, segmentation, and its guarantees whatever the
model writes (property tests: a "model" that drops, repeats, reorders and invents placeholders)."""

from __future__ import annotations

import random
import re
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.decoding import DecodingOptions
from runtime.faithful.mask import mask, repair, restore, sentinel, tags_well_formed
from runtime.faithful.segment import segment, split_to_fit
from runtime.faithful.spans import InvalidGlossaryError, find_spans, make_glossary
from runtime.tokenizer import Tokenizer
from server.contract import Hypothesis, InputTooLongError, Prepared
from server.engine.faithful import TextLayer

TOKENIZER = Path(__file__).resolve().parent.parent / "models" / "en-es-small" / "tokenizer.model"


@pytest.fixture(scope="module")
def layer() -> TextLayer:
    return TextLayer(Tokenizer(TOKENIZER), max_source_tokens=24, keep_terms={"Firefox", "GNOME"})


def kinds(text: str, **kw) -> list[tuple[str, str]]:
    return [(s.kind, s.text) for s in find_spans(text, **kw)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Delete %s?", [("placeholder", "%s")]),
        ("%1$s of %2$d", [("placeholder", "%1$s"), ("placeholder", "%2$d")]),
        ("You have %n new message(s)", [("placeholder", "%n")]),
        ("Page %1 of %2", [("placeholder", "%1"), ("placeholder", "%2")]),
        ("Hello {name}, {0}", [("placeholder", "{name}"), ("placeholder", "{0}")]),
        ("%(count)d files", [("placeholder", "%(count)d")]),
        ("$HOME and ${XDG_DIR}", [("placeholder", "$HOME"), ("placeholder", "${XDG_DIR}")]),
        ('<a href="%s">here</a>', [("tag", '<a href="%s">'), ("tag", "</a>")]),
        ("Fish &amp; chips", [("entity", "&amp;")]),
        ("See https://example.org/a?b=1.", [("url", "https://example.org/a?b=1")]),
        ("Mail bugs@example.org now", [("email", "bugs@example.org")]),
        ("Edit ~/.config/app.conf or /etc/fstab", [("path", "~/.config/app.conf"), ("path", "/etc/fstab")]),
        ("Run with --no-sandbox or -v", [("option", "--no-sandbox"), ("option", "-v")]),
        ("Press Ctrl+Shift+S", [("shortcut", "Ctrl+Shift+S")]),
        ("Released in 2011, version 3.3.3", [("number", "2011"), ("number", "3.3.3")]),
        ("Open LibreOffice on x86_64", [("name", "LibreOffice"), ("name", "x86_64")]),
        ("Upload complete 🎉", [("symbol", "🎉")]),
        ("Open ファイルを開く now", [("foreign", "ファイルを開く")]),
        ("and/or, built-in, e-mail", []),
        ("Firefox is running", [("keep", "Firefox")]),
    ],
)
def test_span_kinds(text, expected):
    assert kinds(text, keep_terms={"Firefox"}) == expected


def test_glossary_spans_win_and_restore_their_target():
    gloss = make_glossary([("proxy server", "servidor intermediario"), ("Firefox", "")])
    from runtime.faithful.spans import Glossary

    spans = find_spans("Firefox: the Proxy Server failed", glossary=Glossary(gloss))
    assert [(s.kind, s.text, s.restore) for s in spans] == [
        ("glossary", "Firefox", "Firefox"),
        ("glossary", "Proxy Server", "servidor intermediario"),
    ]


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([(" ", "x")], "glossary[0].source is blank"),
        ([("File", "Archivo"), ("file", "Fichero")], "repeats glossary[0]"),
        ([("x" * 201, "")], "over 200 characters"),
        ([("t", "")] * 1001, "the limit is 1000"),
    ],
)
def test_bad_glossaries_are_refused_with_a_reason(entries, message):
    with pytest.raises(InvalidGlossaryError, match=re.escape(message)):
        make_glossary(entries)


def test_restore_checks_every_guarantee():
    src = "Copy %s to %s: <b>done</b>"
    m = mask(src, find_spans(src))
    assert m.text == "Copy %1 to %2: %3 done %4"  # spaces inside the tag pair, removed on restore
    assert restore(m, "Copiar %1 a %2: %3 hecho %4") == ("Copiar %s a %s: <b>hecho</b>", None)
    # Named as the source has them, never by the layer's own sentinels.
    assert restore(m, "Copiar %1 a: %3 hecho %4")[1] == "lost %s"
    assert restore(m, "Copiar %1 %1 a %2: %3 hecho %4")[1] == "repeated %s"
    assert restore(m, "Copiar %1 a %2: %3 hecho %4 %7")[1] == "invented a placeholder"
    assert restore(m, "Copiar %2 a %1: %3 hecho %4")[1] == "moved printf placeholders out of order"
    assert restore(m, "Copiar %1 a %2: %4 hecho %3")[1] == "broke the nesting of markup tags"
    assert restore(m, "Copiar %1 a %2 %d: %3 hecho %4")[1] == "invented %d"


def test_restore_keeps_spans_apart_from_words_as_the_source_did():
    for src, out, want in [
        ("Open http://x.org, now", "Abrir %1,ahora", "Abrir http://x.org, ahora"),
        ("Open 42 files", "Abrir %1archivos", "Abrir 42 archivos"),
        ("<b><i>x</i></b>", "%1%2 x %3%4", "<b><i>x</i></b>"),
        ("{n}files", "%1archivos", "{n}archivos"),  # glued in the source: left glued
    ]:
        assert restore(mask(src, find_spans(src)), out) == (want, None)


def test_repair_only_fixes_what_is_safe():
    m = mask("Permission denied: %s", find_spans("Permission denied: %s"))
    assert repair(m, "Permiso denegado:") == "Permiso denegado: %1"
    m = mask("%s: not found", find_spans("%s: not found"))
    assert repair(m, "no encontrado") == "%1: no encontrado"
    m = mask("Copy %s to %s now", find_spans("Copy %s to %s now"))
    assert repair(m, "Copiar %1 ahora") == "Copiar %1 %2 ahora"  # put back near its place in the source
    assert repair(m, "Copiar %1 %1 a %2 ahora") == "Copiar %1 a %2 ahora"


def test_tags_well_formed():
    assert tags_well_formed(["<b>", "<i>", "</i>", "</b>", "<br/>", "<br>"])
    assert not tags_well_formed(["<b>", "<i>", "</b>", "</i>"])
    assert not tags_well_formed(["</b>"])


def test_segment_covers_the_text_and_keeps_structure():
    text = "- One item. Two.\n\n\tOpen\tClose  \nSee http://x.org/a. b"
    pieces = segment(text, find_spans(text))
    assert "".join(text[p.start : p.end] for p in pieces) == text
    assert [text[p.start : p.end] for p in pieces if p.translate] == [
        "One item.",
        "Two.",
        "Open",
        "Close",
        "See http://x.org/a. b",
    ]


def test_split_to_fit_prefers_clause_marks():
    text = "First part of it, second part of it; third part"
    pieces = split_to_fit(text, 0, len(text), lambda s: len(s) <= 20)
    assert "".join(text[p.start : p.end] for p in pieces) == text
    assert [text[p.start : p.end] for p in pieces if p.translate] == [
        "First part of it,",
        "second part of it;",
        "third part",
    ]


def test_over_long_text_is_refused_with_the_limit(layer):
    with pytest.raises(InputTooLongError, match="texts\\[1\\] has 20001 characters, over the limit of 20000"):
        layer.prepare(["ok", "x" * 20_001], DecodingOptions())


def test_long_sentences_are_split_to_the_window(layer):
    text = "This sentence goes on, and on, and on with many words; it never ends, it keeps going and going."
    p = layer.prepare([text], DecodingOptions(beam_size=1))
    assert len(p.segments) > 1 and max(p.token_counts) <= 24


def test_first_round_keeps_spans_visible_and_a_failure_is_masked_in_a_second(layer):
    text = "Copy %s to the GNOME folder. Then close it."
    first = layer.prepare([text], DecodingOptions(beam_size=1))
    assert first.segments == [text]  # whole, placeholders and names visible
    second = layer.finish(first, [[Hypothesis("Copiar a la carpeta. Luego ciérrela.", -1.0, [5])]])
    assert isinstance(second, Prepared)  # %s and GNOME lost: sentence by sentence, all masked
    assert second.segments == ["Copy %1 to the %2 folder.", "Then close it."]
    outputs = [
        [Hypothesis("Copiar %1 a la carpeta %2.", -1.0, [5])],
        [Hypothesis("Luego ciérrela.", -1.0, [6])],
    ]
    [hyps] = layer.finish(second, outputs)
    assert hyps[0].text == "Copiar %s a la carpeta GNOME. Luego ciérrela."


def test_a_whole_text_must_keep_its_sentences_and_lines(layer):
    text = "- Open the file.\n- Save it."
    first = layer.prepare([text], DecodingOptions(beam_size=1))
    assert first.segments == [text]
    second = layer.finish(first, [[Hypothesis("- Abrir el archivo y guardarlo.", -1.0, [5])]])
    assert isinstance(second, Prepared) and second.segments == ["Open the file.", "Save it."]
    [hyps] = layer.finish(
        second, [[Hypothesis("Abrir el archivo.", -1.0, [5])], [Hypothesis("Guardarlo.", -1.0, [6])]]
    )
    assert hyps[0].text == "- Abrir el archivo.\n- Guardarlo."


def test_repeated_segments_are_decoded_once(layer):
    p = layer.prepare(["Open the file. " * 60, "Open the file."], DecodingOptions())
    assert p.segments == ["Open the file."]


# ---- property tests: the guarantees hold whatever the model writes -----------------------------------

WORDS = ["Open", "the", "file", "save", "changes", "to", "folder", "now", "Delete", "all", "items", "with"]
SPANS = [
    "%s", "%d", "%1$s", "%2$d", "%n", "%1", "%2", "{name}", "{0}", "%(count)d", "$HOME", "${VAR}",
    "&amp;", "https://example.org/x?y=1", "me@example.org", "/usr/share/doc", "--verbose", "42", "3.3.3",
    "🎉", "Firefox", "LibreOffice",
]  # fmt: skip
SEPARATORS = [" ", " ", " ", ". ", "? ", ", ", "\n", "\t", "\n\n", ": "]


@st.composite
def texts(draw) -> str:
    parts: list[str] = []
    for _ in range(draw(st.integers(1, 14))):
        choice = draw(st.integers(0, 9))
        if choice < 5:
            parts.append(draw(st.sampled_from(WORDS)))
        elif choice < 8:
            parts.append(draw(st.sampled_from(SPANS)))
        else:
            tag = draw(st.sampled_from(["b", "i", "a"]))
            open_tag = '<a href="%s">' if tag == "a" else f"<{tag}>"
            parts.append(f"{open_tag}{draw(st.sampled_from(WORDS))}</{tag}>")
        parts.append(draw(st.sampled_from(SEPARATORS)))
    return "".join(parts).strip(" ")


def chaotic_model(masked: str, rng: random.Random, n: int) -> list[Hypothesis]:
    """n "translations" of a masked segment: words changed, sentinels kept, dropped, repeated, swapped or
    invented at random."""
    out = []
    for _ in range(n):
        tokens = re.findall(r"%\d+|\{\d+\}|\w+|[^\w\s]|\s+", masked)
        tokens = [t.upper() if t.isalpha() else t for t in tokens]
        sentinels = [i for i, t in enumerate(tokens) if re.fullmatch(r"%\d+|\{\d+\}", t)]
        op = rng.randrange(6)
        if op == 1 and sentinels:
            del tokens[rng.choice(sentinels)]
        elif op == 2 and sentinels:
            tokens.insert(rng.randrange(len(tokens) + 1), tokens[rng.choice(sentinels)])
        elif op == 3 and len(sentinels) > 1:
            a, b = rng.sample(sentinels, 2)
            tokens[a], tokens[b] = tokens[b], tokens[a]
        elif op == 4:
            tokens.insert(rng.randrange(len(tokens) + 1), rng.choice(["%s", "<b>", "%9", "{7}"]))
        out.append(Hypothesis("".join(tokens), -rng.random(), [5]))
    return out


def run_rounds(layer: TextLayer, texts: list[str], options: DecodingOptions, model) -> list[list[Hypothesis]]:
    """prepare -> model -> finish until the text layer is done (at most two rounds); model(segment, n)."""
    step = layer.prepare(texts, options)
    for _ in range(2):
        if not isinstance(step, Prepared):
            break
        step = layer.finish(step, [model(s, step.options.num_hypotheses) for s in step.segments])
    assert not isinstance(step, Prepared), "more than two rounds"
    return step


def protected(text: str, layer: TextLayer) -> Counter:
    return Counter(s.text for s in layer.spans(text))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    texts=st.lists(texts(), min_size=1, max_size=4),
    seed=st.integers(0, 2**32 - 1),
    beam=st.integers(1, 4),
)
def test_every_protected_span_comes_back_exactly_once(layer, texts, seed, beam):
    rng = random.Random(seed)
    options = DecodingOptions(beam_size=beam, num_hypotheses=1)
    out = run_rounds(layer, texts, options, lambda s, n: chaotic_model(s, rng, n))
    assert len(out) == len(texts)
    for src, hyps in zip(texts, out, strict=True):
        assert 1 <= len(hyps) <= options.num_hypotheses
        best = hyps[0].text
        want = protected(src, layer)
        got = Counter({k: v for k, v in protected(best, layer).items() if k in want})
        assert got == want, (src, best)
        src_tags = re.findall(r"</?[a-z]+[^>]*>", src)
        out_tags = re.findall(r"</?[a-z]+[^>]*>", best)
        assert Counter(out_tags) == Counter(src_tags)
        if tags_well_formed(src_tags):
            assert tags_well_formed(out_tags), (src, best)
        assert best.count("\n") == src.count("\n") and best.count("\t") == src.count("\t")
        printf = [p for p in re.findall(r"%[sd]", src)]
        assert re.findall(r"%[sd]", best) == printf  # non-positional printf keeps its order
        for note in hyps[0].notes:
            assert 0 <= note.start < note.end <= len(src)
            assert note.action in ("passed_through", "repaired")


@settings(max_examples=100, deadline=None, derandomize=True)
@given(text=texts())
def test_a_model_that_copies_gives_the_source_back_untouched(layer, text):
    [hyps] = run_rounds(layer, [text], DecodingOptions(beam_size=1), lambda s, n: [Hypothesis(s, 0.0, [])])
    assert hyps[0].text == text
    assert all(n.reason == "nothing to translate" for n in hyps[0].notes)


def test_sentinels_are_single_tokenizer_pieces():
    tok = Tokenizer(TOKENIZER)
    for i in range(19):
        assert len([p for p in tok.pieces(sentinel(i)) if p != "\u2581"]) == 1, sentinel(i)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(text=st.text(max_size=300), seed=st.integers(0, 10**6), glossary=st.booleans())
def test_any_unicode_text_gets_a_translation_and_never_an_error(layer, text, seed, glossary):
    rng = random.Random(seed)

    def shuffling_model(segment: str, n: int) -> list[Hypothesis]:
        chars = list(segment)
        if rng.random() < 0.3:
            rng.shuffle(chars)
        return [Hypothesis("".join(chars), -1.0, [5]), Hypothesis(segment, -2.0, [6])][:n]

    options = DecodingOptions(beam_size=2, num_hypotheses=2)
    gloss = {"file": "archivo"} if glossary else None
    step = layer.prepare([text], options, gloss)
    for _ in range(2):
        if not isinstance(step, Prepared):
            break
        step = layer.finish(step, [shuffling_model(s, step.options.num_hypotheses) for s in step.segments])
    assert not isinstance(step, Prepared)
    [hyps] = step
    assert 1 <= len(hyps) <= 2 and all(isinstance(h.text, str) for h in hyps)
    if not text.strip():
        assert hyps[0].text == text


def test_a_stuttering_hypothesis_goes_after_a_fluent_one(layer):
    first = layer.prepare(["Mode"], DecodingOptions(beam_size=2, num_hypotheses=1))
    [hyps] = layer.finish(first, [[Hypothesis("Modo de modo", -0.1, [5]), Hypothesis("Modo", -0.2, [6])]])
    assert hyps[0].text == "Modo"
    first = layer.prepare(["Bye bye"], DecodingOptions(beam_size=2, num_hypotheses=1))  # the source stutters
    [hyps] = layer.finish(first, [[Hypothesis("Adiós adiós", -0.1, [5]), Hypothesis("Adiós", -0.2, [6])]])
    assert hyps[0].text == "Adiós adiós"


@pytest.mark.parametrize(
    ("source", "texts"),
    [
        ("Delete %s?", ["¿Borrar %s?", "¿Borrar %s?", "¿Eliminar %s?"]),  # first round: %s left visible
        ("Mode", ["Modo", "Modo", "Manera"]),  # nothing to keep visible: the masked round's rules
    ],
)
def test_hypotheses_that_read_the_same_are_listed_once(layer, source, texts):
    """Two hypotheses (different tokens) with the same text: the n-best list has it once."""
    first = layer.prepare([source], DecodingOptions(beam_size=3, num_hypotheses=3))
    [out] = layer.finish(first, [[Hypothesis(t, -0.1 * (i + 1), [5 + i]) for i, t in enumerate(texts)]])
    assert [(h.text, h.score) for h in out] == [(texts[0], -0.1), (texts[2], -0.1 * 3)]


def test_a_long_glossary_term_fits_as_the_one_piece_it_is_sent_as(layer):
    """Fitting a text to the model's window counts a glossary term as its sentinel: the text below is 34
    tokens written out but 7 with the term masked, so it goes whole, the term never cut in two (where
    the glossary would no longer find it)."""
    term = "Zyxwvut Qrstuvw Mnopqrs Ghijklm Abcdefg"
    text = f"Open the {term} settings now."
    assert layer._tokens(text) > 24
    p = layer.prepare([text], DecodingOptions(beam_size=1), {term: "Zyx"})
    assert p.segments == ["Open the %1 settings now."]
    [hyps] = layer.finish(p, [[Hypothesis("Abrir la configuración de %1 ahora.", -1.0, [5])]])
    assert hyps[0].text == "Abrir la configuración de Zyx ahora."


def test_a_span_followed_by_a_digit_gets_a_sentinel_that_does_not_read_into_it(layer):
    m = mask("Size %d5 and %s", find_spans("Size %d5 and %s"))
    assert m.text == "Size {0}5 and %1"  # "%15" would read as sentinel %15
    assert restore(m, "Talla {0}5 y %1") == ("Talla %d5 y %s", None)
    [hyps] = run_rounds(
        layer, ["0\u038600"], DecodingOptions(beam_size=1), lambda s, n: [Hypothesis("0", 0.0, [])]
    )
    assert hyps[0].text == "0\u038600"  # numbers glued to another script's letter are numbers too
