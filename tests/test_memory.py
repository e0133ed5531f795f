"""The translation memory: how model/memory.py picks Debian's agreed translation, its file, and how the
text layer answers with it (server/engine/faithful.py), through the shipped bundle and over gRPC."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from model.memory import main as memory_main
from model.memory import select
from runtime.decoding import DecodingOptions
from runtime.faithful.memory import MemoryEntry, read_memory, write_memory
from runtime.tokenizer import Tokenizer
from server.contract import Hypothesis, Prepared
from server.engine.faithful import TextLayer

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "models" / "en-es-small" / "tokenizer.model"
# One-best: with an n-best list asked for, a text in the memory also goes to the model, for its
# alternatives (tests/test_http_parity.py).
BEAM2 = DecodingOptions(beam_size=2, num_hypotheses=1)


def test_the_translation_most_packages_ship_is_kept_when_they_agree():
    pairs = [
        ("Cancel", "Cancelar", 80), ("Cancel", "Anular", 3),  # clear majority
        ("Grid", "Rejilla", 2), ("Grid", "Cuadrícula", 2),  # a tie: no agreement
        ("Snap", "Ajustar", 2), ("Snap", "Acoplar", 1), ("Snap", "Adherir", 2),  # plurality under half
        ("Max", "Máx", 1),  # one package is enough
        ("Blank", " ", 3),  # an empty translation is no translation
    ]  # fmt: skip
    assert sorted(select(pairs)) == [("Cancel", "Cancelar", 80), ("Max", "Máx", 1)]
    assert sorted(select(pairs, min_packages=2)) == [("Cancel", "Cancelar", 80)]
    assert ("Snap", "Ajustar", 2) not in select(pairs, min_share=0.0)  # still tied with Adherir
    assert ("Grid", "Rejilla", 2) not in select(pairs, min_share=0.0)


def test_the_memory_file_round_trips_and_is_the_same_bytes_every_time(tmp_path):
    entries = [
        ("Tab\there", "Tabulador\taquí", 2),
        ("Save", "Guardar", 40),
        ("Line\nbreak", "Salto\nde línea", 1),
    ]
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"
    assert write_memory(a, entries, {"command": "test"}) == 3
    write_memory(b, list(reversed(entries)), {"command": "test"})
    assert a.read_bytes() == b.read_bytes()
    memory = read_memory(a)
    assert memory == {
        "Save": MemoryEntry("Guardar", 40),
        "Tab\there": MemoryEntry("Tabulador\taquí", 2),
        "Line\nbreak": MemoryEntry("Salto\nde línea", 1),
    }
    other = tmp_path / "other.jsonl.gz"
    with gzip.open(other, "wt") as f:
        f.write('{"format": "something else"}\n')
    with pytest.raises(ValueError, match="not a translation memory"):
        read_memory(other)


def test_the_command_builds_the_memory_from_the_train_split(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    rows = [
        {"source": "Save", "target": "Guardar", "packages": ["a", "b", "c"]},
        {"source": "Save", "target": "Salvar", "packages": ["d"]},
        {"source": "Quit", "target": "Salir", "packages": ["a"]},
    ]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "model" / "memory.jsonl.gz"
    memory_main(["--data", str(data), "--out", str(out)])
    assert read_memory(out) == {"Save": MemoryEntry("Guardar", 3), "Quit": MemoryEntry("Salir", 1)}
    assert "2 sources of 2 in 3 train pairs" in capsys.readouterr().err


@pytest.fixture(scope="module")
def layer() -> TextLayer:
    memory = {
        "Modem": MemoryEntry("Módem", 5),
        "Save": MemoryEntry("Guardar", 40),
        "Copy %s to %s": MemoryEntry("Copiar %s en %s", 2),
        "Released in 2011": MemoryEntry("Publicado en el año once", 1),  # a translator's liberty
        "Open the GNOME menu": MemoryEntry("Abrir el menú de GNOME", 3),
    }
    return TextLayer(Tokenizer(TOKENIZER), max_source_tokens=24, keep_terms={"GNOME"}, memory=memory)


def test_a_text_in_the_memory_never_reaches_the_model_and_says_where_it_came_from(layer):
    texts = ["Modem", "  Save\n", "_Save", "Copy %s to %s", "Copy the file"]
    first = layer.prepare(texts, BEAM2)
    assert first.segments == ["Copy the file"]  # the only one for the model
    out = layer.finish(first, [[Hypothesis("Copiar el archivo", -0.5, [7])]])
    assert not isinstance(out, Prepared)
    texts_out = [hyps[0].text for hyps in out]
    assert texts_out == ["Módem", "  Guardar\n", "_Guardar", "Copiar %s en %s", "Copiar el archivo"]
    assert [len(hyps) for hyps in out] == [1, 1, 1, 1, 1]  # one human translation, no n-best
    notes = [[(n.action, n.start, n.end, n.reason) for n in hyps[0].notes] for hyps in out]
    assert notes[0] == [("memory", 0, 5, "translation memory: as 5 packages translate it")]
    assert notes[1] == [("memory", 2, 6, "translation memory: as 40 packages translate it")]
    assert notes[2] == [("memory", 0, 5, "translation memory: as 40 packages translate it")]  # source offsets
    assert notes[4] == []


def test_the_memory_gives_way_to_the_glossary_and_to_protected_spans(layer):
    # a request's glossary term inside: the glossary's translation wins
    first = layer.prepare(["Modem"], BEAM2, glossary={"Modem": "Módem USB"})
    assert layer.finish(first, [])[0][0].text == "Módem USB"
    first = layer.prepare(["Copy %s to %s"], BEAM2, glossary={"Copy": "Duplicar"})
    assert first.segments == ["%1 %s to %s"]  # to the model, the term masked
    # the human translation rewrote the year 2011: the model keeps it verbatim instead
    first = layer.prepare(["Released in 2011", "Open the GNOME menu"], BEAM2)
    assert first.segments == ["Released in 2011"]
    [released, gnome] = layer.finish(first, [[Hypothesis("Publicado en 2011", -0.3, [4])]])
    assert released[0].text == "Publicado en 2011" and released[0].notes == ()
    assert gnome[0].text == "Abrir el menú de GNOME"
    # a text that merely contains a memory entry is translated by the model
    assert layer.prepare(["Modem settings"], BEAM2).segments == ["Modem settings"]


def test_the_shipped_bundle_answers_from_its_memory_unless_told_not_to(shipped_bundle):
    from server.app import default_engine_factory
    from server.config import ServerConfig
    from server.engine import Engine

    engine = Engine(shipped_bundle, intra_op_threads=1)
    assert len(engine.memory) > 100_000
    [[clockwise], [ok]] = engine.translate_texts(["Clockwise", "_OK"])
    assert clockwise.text == "Sentido horario" and [n.action for n in clockwise.notes] == ["memory"]
    assert ok.text == "_Aceptar"
    off = default_engine_factory(shipped_bundle, ServerConfig(memory=False, threads=1))
    assert off.memory == {} and off.prepare(["Clockwise"], off.default_options).segments == ["Clockwise"]


def test_the_server_says_how_big_its_memory_is_and_marks_what_it_answered(shipped_server, client_for):
    client = client_for(shipped_server)
    assert client.model_info().translation_memory_entries > 100_000
    [clockwise] = client.translate(["Clockwise"])
    assert clockwise.text == "Sentido horario"
    assert [(n.action, n.start, n.end) for n in clockwise.notes] == [("memory", 0, 9)]
