"""Text-layer rules chosen on valid: a space after a tag glued to a word (for the model only), quoted words
the model never saw kept as they are, and the first letter in the case of the source's."""

from __future__ import annotations

import pytest

from runtime.faithful.casing import match_first_case
from runtime.faithful.mask import mask, restore
from runtime.faithful.spans import find_spans
from server.engine import Engine


def tags(text: str):
    return [s for s in find_spans(text) if s.kind == "tag"]


def test_an_opening_tag_glued_to_a_word_gets_a_space_and_loses_it_again():
    source = "<b>Warning:</b> disk full"
    m = mask(source, [], tags(source))
    assert m.text == "<b> Warning:</b> disk full" and m.padded == (("<b>", "after"),)
    want = "<b>Advertencia:</b> disco lleno"
    assert restore(m, "<b> Advertencia:</b> disco lleno", tags(source)) == (want, None)
    # The model may glue it itself: nothing to take away then.
    assert restore(m, want, tags(source))[0] == want


@pytest.mark.parametrize(
    "source",
    [
        "<b> Warning:</b> disk full",  # the source has the space already
        "<b>'%1'</b> was modified",  # punctuation after the tag: the word keeps its usual piece
        "<b>Note:</b> <b>Warning</b>",  # a tag twice: which one got the space would be a guess
        "Disk full</b>",  # a closing tag
    ],
)
def test_other_tags_stay_as_they_are(source):
    m = mask(source, [], tags(source))
    assert m.text == source and m.padded == ()


def test_a_line_break_tag_glued_to_a_word_gets_a_space_too():
    source = "Disk full.<br/>Free some space"
    m = mask(source, [], tags(source))
    assert m.text == "Disk full.<br/> Free some space"
    got = restore(m, "Disco lleno.<br/> Libere espacio", tags(source))[0]
    assert got == "Disco lleno.<br/>Libere espacio"


def test_a_backslash_in_a_padded_tag_is_kept():
    source = r'<a href="C:\docs">Open</a>'
    m = mask(source, [], tags(source))
    assert restore(m, r'<a href="C:\docs"> Abrir</a>', tags(source))[0] == r'<a href="C:\docs">Abrir</a>'


def test_the_shipped_model_translates_a_word_right_after_a_tag(shipped_bundle):
    """Without the space after the tag the model reads the glued word in fragments and leaves it in
    English (`<h3>Protocol:</h3>`, `<b>Step 2:</b>`, checked with the rule off). The rule is chosen on
    valid; single texts can lose by it (the 3+3 model: `<b>Warning:</b> disk full` -> `<b>Advertir:</b>`,
    a verb, where the unpadded input gave `Advertencia:`). The 6+2 release translates the glued word but
    puts a stray `Es` before it here (`<b>Es Paso 2:</b>`; `<i>Step 2:</i>` and `<b>Step 3:</b>` come
    out clean), so the check is on the word itself."""
    engine = Engine(shipped_bundle, intra_op_threads=1)
    texts = ["<h3>Protocol:</h3>", "<title>Level</title>", "<b>Step 2:</b> Check the certificate."]
    got = [hyps[0].text for hyps in engine.translate_texts(texts)]
    assert got[0] == "<h3>Protocolo:</h3>" and got[1] == "<title>Nivel</title>"  # the glued tags kept
    assert got[2].startswith("<b>") and "Paso 2:</b> " in got[2] and "Step" not in got[2], got[2]


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ('Could not find "otioconvert" script', ["otioconvert"]),
        # A known word between straight quotes is a literal too (runtime.faithful.code; on valid the
        # references keep 40 of 45 such words): 'heavy' is kept, its quotes with it.
        ("Greek 'barys' for 'heavy'.", ["barys", "heavy"]),
        ("Config File «libkleopatrarc»", ["libkleopatrarc"]),
        ("Khmel'nyts'ky", []),  # apostrophes inside a name, not quotes
        ("the 'otioconvert'-based tool", ["otioconvert"]),
        ("x'otioconvert'y", []),  # glued to words: not quotes
    ],
)
def test_a_quoted_word_the_model_never_saw_is_kept(text, kept):
    known = {
        "could",
        "not",
        "find",
        "script",
        "greek",
        "for",
        "heavy",
        "config",
        "file",
        "the",
        "based",
        "tool",
    }
    spans = find_spans(text, unknown_word=lambda w: w.lower() not in known)
    assert [s.text.strip("\"'«»") for s in spans if s.kind in ("quoted", "code")] == kept


def test_the_shipped_model_keeps_a_quoted_command(shipped_bundle):
    engine = Engine(shipped_bundle, intra_op_threads=1)
    (got,) = engine.translate_texts(['The version of "xfreerdp" you are using is too old.'])
    assert '"xfreerdp"' in got[0].text or "«xfreerdp»" in got[0].text, got[0].text


@pytest.mark.parametrize(
    ("source", "output", "want"),
    [
        ("Empty slot", "ranura vacía", "Ranura vacía"),
        ("<para>An error occurred.</para>", "<para>un error.</para>", "<para>Un error.</para>"),
        ('"Mounted Camera" driver', "controlador «x»", "Controlador «x»"),
        ("open file", "abrir archivo", "abrir archivo"),  # the source is lowercase
        ("Run systemd", "systemd se ejecuta", "systemd se ejecuta"),  # a do-not-translate term
        ("Sync iPod", "iPod sinc", "iPod sinc"),  # a capital inside: a name
        ("X86 build", "x86 compilación", "x86 compilación"),  # a digit: an identifier
        ("Save", "", ""),
    ],
)
def test_the_first_letter_takes_the_sources_case(source, output, want):
    assert match_first_case(source, output, keep={"systemd"}) == want


def test_the_text_layer_capitalises_what_the_model_started_in_lowercase(shipped_bundle):
    engine = Engine(shipped_bundle, intra_op_threads=1)
    (got,) = engine.translate_texts(['<b>Homepage:</b> <a href="%1">%1</a>'])
    assert got[0].text.startswith("<b>P"), got[0].text  # the model writes `página`
