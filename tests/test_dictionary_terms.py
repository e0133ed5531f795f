"""Dictionary terms: which entries model/dictionary_terms.py keeps, how runtime/faithful/dictionary.py finds
them in a text, and how the text layer writes them (server/engine/faithful.py), the shipped bundle too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model.dictionary_terms import main as terms_main
from runtime.decoding import DecodingOptions
from runtime.faithful.dictionary import DictionaryTerms, read_dictionary_terms, write_dictionary_terms
from runtime.faithful.lexicon import Lexicon
from runtime.faithful.memory import MemoryEntry
from runtime.tokenizer import Tokenizer
from server.contract import Hypothesis, Prepared
from server.engine.faithful import TextLayer

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "models" / "en-es-small" / "tokenizer.model"
BEAM2 = DecodingOptions(beam_size=2, num_hypotheses=1)
TERMS = DictionaryTerms(
    {"pharmacy": "farmacia", "good morning": "buenos días", "morning": "mañana", "friday": "viernes"}
)


def found(text: str) -> list[tuple[str, str]]:
    return [(text[a:b], target) for a, b, target in TERMS.find(text)]


def test_terms_are_found_longest_first_as_whole_plain_words():
    assert found("Good morning, where is the pharmacy?") == [
        ("Good morning", "Buenos días"),
        ("pharmacy", "farmacia"),
    ]
    # capitalised at the start of a text or sentence only; elsewhere as the dictionary writes it
    assert found("Happy Friday! Pharmacy closed") == [("Friday", "viernes"), ("Pharmacy", "Farmacia")]
    assert found("this morning") == [("morning", "mañana")]
    # not in capitals, camel case or a title-cased phrase; not inside hyphenated or apostrophised words
    assert found("PHARMACY pHarmacy Good Morning") == [("Morning", "mañana")]
    assert found("pharmacy-style morning's pharmacy_x") == []
    assert DictionaryTerms({"caf": "café", "na": "no"}).find("Let's meet at the café, naïve") == []
    assert found("good  morning") == [("morning", "mañana")]  # a phrase's words one space apart
    assert DictionaryTerms({}).find("pharmacy") == [] and len(TERMS) == 4


def test_the_file_round_trips_and_a_bad_line_is_named(tmp_path):
    a, b = tmp_path / "a.tsv", tmp_path / "b.tsv"
    rows = [("pharmacy", "farmacia"), ("Good  Morning", "buenos días")]
    assert write_dictionary_terms(a, rows, ["made by a test"]) == 2
    write_dictionary_terms(b, list(reversed(rows)), ["made by a test"])
    assert a.read_bytes() == b.read_bytes()
    assert a.read_text().splitlines() == [
        "# made by a test",
        "good morning\tbuenos días",
        "pharmacy\tfarmacia",
    ]
    assert read_dictionary_terms(a).entries == {"good morning": "buenos días", "pharmacy": "farmacia"}
    bad = tmp_path / "bad.tsv"
    bad.write_text("# comment\npharmacy farmacia\n")
    with pytest.raises(ValueError, match=r"bad.tsv:2: want `phrase<TAB>translation`"):
        read_dictionary_terms(bad)


def test_the_command_keeps_rare_unambiguous_dictionary_entries(tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    data.mkdir()
    apertium, freedict = ["apertium-eng-spa"], ["dict-freedict-eng-spa"]
    rows = [
        {"source": "pharmacy", "target": "farmacia", "packages": apertium},  # kept
        {"source": "Pharmacy", "target": "Farmacia", "packages": apertium},  # the capitalised copy
        {"source": "good morning", "target": "buenos días", "packages": freedict},  # kept
        {"source": "bank", "target": "banco", "packages": apertium},  # two translations: left out
        {"source": "bank", "target": "orilla", "packages": freedict},
        {"source": "save", "target": "salvar", "packages": freedict},  # common in the catalogs
        {"source": "notepad", "target": "blocdenotas", "packages": freedict},  # not a word
        {"source": "madrid", "target": "madrid", "packages": freedict},  # the source itself
        {"source": "Open Office", "target": "Abrir oficina", "packages": apertium},  # no lowercase entry
    ]
    rows += [{"source": f"Save file {i}", "target": "Guardar", "packages": ["gedit"]} for i in range(10)]
    rows += [{"source": "Ask the pharmacy", "target": "Pregunte", "packages": ["gedit"]}]  # 1 < 10
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    words = ["farmacia", "buenos", "días", "banco", "orilla", "salvar", "madrid", "abrir", "oficina"]
    monkeypatch.setattr("model.dictionary_terms.read_lexicon", lambda _path: Lexicon(words, ()))
    out = tmp_path / "model" / "dictionary_terms.tsv"
    terms_main(["--data", str(data), "--lexicon", "lexicon.txt.gz", "--out", str(out)])
    assert read_dictionary_terms(out).entries == {"pharmacy": "farmacia", "good morning": "buenos días"}
    assert "2 terms of 4 dictionary entries (1 with several translations, 1 common" in capsys.readouterr().err
    assert "--lexicon lexicon.txt.gz" in out.read_text().splitlines()[1]
    terms_main(["--data", str(data), "--out", str(out), "--max-catalog-sources", "1"])  # no lexicon
    assert read_dictionary_terms(out).entries == {"good morning": "buenos días", "notepad": "blocdenotas"}


@pytest.fixture(scope="module")
def layer() -> TextLayer:
    memory = {"Pharmacy": MemoryEntry("Farmacias", 3)}
    return TextLayer(Tokenizer(TOKENIZER), 24, keep_terms={"GNOME"}, memory=memory, dictionary=TERMS)


def test_the_text_layer_writes_the_dictionary_translation_in_the_terms_place(layer):
    first = layer.prepare(["I'm looking for a pharmacy.", "Good morning"], BEAM2)
    assert first.segments == ["I'm looking for a %1."]  # "Good morning" alone: nothing left to translate
    out = layer.finish(first, [[Hypothesis("Estoy buscando una %1.", -0.4, [5])]])
    assert not isinstance(out, Prepared)
    assert [hyps[0].text for hyps in out] == ["Estoy buscando una farmacia.", "Buenos días"]
    # no note: a translation, a word of it or all of it the dictionary's (not the source kept)
    assert out[0][0].notes == () and out[1][0].notes == ()


def test_the_memory_the_glossary_and_the_option_come_first(layer):
    # the human translation of the whole text wins over the dictionary's word
    first = layer.prepare(["Pharmacy"], BEAM2)
    assert first.segments == [] and layer.finish(first, [])[0][0].text == "Farmacias"
    # a request's glossary term wins over the dictionary's
    first = layer.prepare(["Find a pharmacy"], BEAM2, glossary={"pharmacy": "botica"})
    out = layer.finish(first, [[Hypothesis("Buscar una %1", -0.3, [4])]])
    assert out[0][0].text == "Buscar una botica"
    plain = TextLayer(Tokenizer(TOKENIZER), 24)
    assert plain.prepare(["Find a pharmacy"], BEAM2).segments == ["Find a pharmacy"]


def test_the_shipped_bundle_has_them_unless_told_not_to(shipped_bundle):
    from server.app import default_engine_factory
    from server.config import ServerConfig
    from server.engine import Engine

    engine = Engine(shipped_bundle, intra_op_threads=1)
    assert engine.dictionary_terms is not None and len(engine.dictionary_terms) > 10_000
    [[headache]] = engine.translate_texts(["I have a headache."])
    assert "dolor de cabeza" in headache.text
    off = default_engine_factory(shipped_bundle, ServerConfig(dictionary_terms=False, threads=1))
    assert off.dictionary_terms is None
    assert off.prepare(["I have a headache."], off.default_options).segments == ["I have a headache."]
