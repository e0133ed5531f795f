"""The faithful-text layer with the shipped model: the examples of the faithfulness issue give sane output,
through the engine and through gRPC (Translate and TranslateStream, request-level and in-flight
batching), alone or batched, with glossaries, notes and metrics."""

from __future__ import annotations

import re
from collections import Counter

import grpc
import pytest

from client.core import StreamItem, TranslatorClient, TranslatorError
from runtime.faithful.mask import tags_well_formed
from server.engine import Engine

TAGS = re.compile(r"</?[A-Za-z][^>]*>")


@pytest.fixture(scope="module")
def engine(shipped_bundle) -> Engine:
    return Engine(shipped_bundle, intra_op_threads=1)


def keeps(source: str, output: str, *spans: str) -> None:
    for s in spans:
        assert output.count(s) == source.count(s), (s, output)


# (source, check): each check says what "sane" means for that input.
EXAMPLES = [
    ('<a href="%s">Click here</a> to learn more.', lambda s, o: keeps(s, o, '<a href="%s">', "</a>")),
    ("You have %n new message(s)", lambda s, o: keeps(s, o, "%n")),
    ("Click <b>Apply</b> to save {count} changes.", lambda s, o: keeps(s, o, "<b>", "</b>", "{count}")),
    ("Open\tClose", lambda s, o: (keeps(s, o, "\t"), all(o.split("\t")))),
    ("Firefox could not connect to the proxy server.", lambda s, o: keeps(s, o, "Firefox")),
    ("Firefox is already running, but is not responding.", lambda s, o: keeps(s, o, "Firefox")),
    ("Openbox", lambda s, o: o == "Openbox"),
    ("pngquant", lambda s, o: o == "pngquant"),
    ("11", lambda s, o: o == "11"),
    ("22", lambda s, o: o == "22"),
    ("3.3.3", lambda s, o: o == "3.3.3"),
    ("Released in 2011", lambda s, o: keeps(s, o, "2011")),
    ("Copied 100 files", lambda s, o: keeps(s, o, "100")),
    ("Permission denied: %s", lambda s, o: keeps(s, o, "%s")),
    ("Upload complete 🎉", lambda s, o: keeps(s, o, "🎉") and len(o) < 3 * len(s)),
    ("🎉", lambda s, o: o == "🎉"),
    ("ファイルを開く", lambda s, o: o == "ファイルを開く"),
    ("The café is closed — naïve résumé", lambda s, o: keeps(s, o, "naïve", "—")),
    ("Save", lambda s, o: o == "Guardar"),
    ("Open", lambda s, o: o == "Abrir"),
]


@pytest.mark.parametrize(("source", "check"), EXAMPLES, ids=[e[0][:30] for e in EXAMPLES])
def test_issue_examples_give_sane_output(engine, source, check):
    [hyps] = engine.translate_texts([source])
    out = hyps[0].text
    assert check(source, out) is not False, out
    assert not re.search(r"(\b\w+\b)( \1\b){2,}", out), out  # no loop


def test_multi_sentence_texts_keep_every_sentence(engine):
    sentences = [f"Open the file number {i}." for i in range(32)]
    [hyps] = engine.translate_texts([" ".join(sentences)])
    assert hyps[0].text.count(".") == 32
    [hyps] = engine.translate_texts(["Open the file. " * 60])
    translated = hyps[0].text.split(". ")
    assert len(translated) == 61 and translated[-1] == ""  # 60 sentences, the trailing space kept
    assert len(set(translated[:-1])) == 1 and "archivo" in translated[0]  # each one, the same way
    press = "Press Ctrl+S to save the document. The changes will be lost otherwise."
    [hyps] = engine.translate_texts([press])
    assert hyps[0].text.count(".") == 2 and "Ctrl+S" in hyps[0].text


CLAUSES = [
    "when the document is open in the editor",
    "the program saves a backup copy in the folder of the user",
    "so that nothing is lost if the computer stops",
    "and the changes that were not saved can be restored later",
    "which is useful after a power failure",
    "but the backup is deleted when the document is closed",
    "unless the option to keep old copies is selected in the settings",
    "where the number of copies can also be changed",
]


def test_texts_over_the_window_are_split_not_refused(engine):
    long = ", ".join(CLAUSES * 5) + "."  # one sentence, far over the model's window
    assert engine.count_tokens([long])[0] > engine.max_source_tokens
    [hyps] = engine.translate_texts([long])
    out = hyps[0].text
    assert not [n for n in hyps[0].notes if n.action == "passed_through"], hyps[0].notes
    assert 0.7 < len(out) / len(long) < 1.6
    assert out.count("copia") >= 10


def test_tags_stay_well_formed_and_placeholders_ordered(engine):
    texts = [
        "<b><i>Bold italic</i></b> and <u>underlined</u> text",
        "Copied %s of %s files to %s.",
        "%1$s of %2$s downloaded",
    ]
    for src, hyps in zip(texts, engine.translate_texts(texts), strict=True):
        out = hyps[0].text
        assert Counter(TAGS.findall(out)) == Counter(TAGS.findall(src))
        assert tags_well_formed(TAGS.findall(out))
        assert re.findall(r"%\d?\$?s", out) == re.findall(r"%\d?\$?s", src) or "$" in src


def test_alone_equals_batched(engine):
    texts = [e[0] for e in EXAMPLES] + ["Open the file. Save it.\nThen close it."]
    together = [h[0].text for h in engine.translate_texts(texts)]
    alone = [engine.translate_texts([t])[0][0].text for t in texts]
    assert together == alone


def test_glossary_forces_and_keeps_terms(engine):
    gloss = {"proxy server": "servidor intermediario", "file": ""}
    [hyps] = engine.translate_texts(["Could not reach the proxy server."], glossary=gloss)
    assert "servidor intermediario" in hyps[0].text
    [hyps] = engine.translate_texts(["Open the file"], glossary=gloss)
    assert "file" in hyps[0].text


@pytest.mark.parametrize("mode", ["request", "inflight"])
def test_grpc_gives_the_engine_result_with_notes_in_both_batching_modes(
    start_server, shipped_bundle, engine, mode
):
    server = start_server(shipped_bundle, batching_mode=mode)
    texts = ["Open the file. Save it.", "🎉", "Permission denied: %s", "Open\tClose", "Clockwise"]
    want = [h[0].text for h in engine.translate_texts(texts)]
    with TranslatorClient(server.target, timeout=60) as c:
        got = c.translate(texts)
        assert [t.text for t in got] == want
        assert [(n.action, n.reason) for n in got[1].notes] == [("passed_through", "nothing to translate")]
        assert got[4].text == "Sentido horario" and [n.action for n in got[4].notes] == ["memory"]
        stream = list(c.translate_stream([StreamItem(str(i), [t]) for i, t in enumerate(texts)]))
        assert sorted((r.request_id, r.translations[0].text) for r in stream) == sorted(
            (str(i), w) for i, w in enumerate(want)
        )
        glossed = c.translate(["Open the proxy server settings"], glossary={"proxy server": "pasarela"})
        assert "pasarela" in glossed[0].text
        with pytest.raises(TranslatorError) as e:
            c.translate(["x"], glossary={"a": "b", "A": "c"})
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "repeats glossary[0]" in e.value.details
    assert server.sample("translator_text_segments_total", action="passed_through") >= 2
    assert server.sample("translator_text_segments_total", action="memory") >= 2


@pytest.mark.parametrize(
    "source",
    ["Open\ue000the file", "\ue000", "\ue002 x", "Open\x85the\x9bfile", "Save\ufffe", "Open the file\x00"],
)
def test_control_and_private_use_characters_come_back_as_themselves(engine, source):
    # U+E000/U+E001 are the tokenizer's own newline/tab symbols: user text must never turn into them.
    [hyps] = engine.translate_texts([source])
    out = hyps[0].text
    odd = [c for c in source if not c.isprintable() or 0xE000 <= ord(c) <= 0xF8FF or c == "\ufffe"]
    assert [c for c in out if c in odd] == odd, out
    assert "\n" not in out and "\t" not in out
