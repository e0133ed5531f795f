"""bench.unseen_words: the split of an evaluation's packages by words the training sources never hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import unseen_words


def segment(i: int, package: str, source: str, reference: str, model: str, apertium: str) -> dict:
    return {"index": i, "package": package, "source": source, "reference": reference, "model": model,
            "apertium": apertium}  # fmt: skip


SEGMENTS = [
    segment(0, "chem", "Barium", "Bario", "Barium", "Bario"),
    segment(1, "chem", "Open files", "Abrir archivos", "Abrir archivos", "Archivos abiertos"),
    segment(2, "chem", "Opened the file", "Se abrió el archivo", "Se abrió el archivo", "Abrió el archivo"),
    segment(3, "ui", "Save", "Guardar", "Guardar", "Salvar"),
]
KNOWN = {"open", "file", "save", "the"}


def test_pairs_split_on_words_never_seen_in_any_inflection():
    assert unseen_words.unseen_words("Opened the files of Barium", KNOWN) == ["Barium"]
    table = unseen_words.split_by_package(SEGMENTS, KNOWN)
    assert table["chem"]["pairs"] == 3 and table["chem"]["words"] == ["Barium"]
    assert table["chem"]["unseen"]["pairs"] == 1 and table["chem"]["seen"]["pairs"] == 2
    # Barium -> Barium against Bario: Apertium's dictionary wins on the unseen part only.
    assert table["chem"]["unseen"]["apertium"] == 100.0 > table["chem"]["unseen"]["model"]
    assert table["chem"]["seen"]["model"] == 100.0 > table["chem"]["seen"]["apertium"]
    assert table["ui"]["unseen"] == {"pairs": 0, "model": None, "apertium": None}


def test_the_command_prints_the_table_and_writes_json(tmp_path: Path, capsys):
    report, words, out = tmp_path / "eval.json", tmp_path / "words.txt", tmp_path / "out.json"
    report.write_text(json.dumps({"split": "test", "segments": SEGMENTS}))
    words.write_text("# words\n" + "\n".join(sorted(KNOWN)) + "\n")
    assert unseen_words.main([str(report), "--words", str(words), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| chem | 3 | 2 | 100.0 |" in printed and "chem: Barium" in printed
    assert json.loads(out.read_text())["ui"]["seen"]["pairs"] == 1
    report.write_text(json.dumps({"segments": [{"index": 0, "package": "x", "source": "a"}]}))
    with pytest.raises(SystemExit) as e:
        unseen_words.main([str(report), "--words", str(words)])
    assert e.value.code == 2 and "needs segments with model and apertium" in capsys.readouterr().err


def test_the_model_card_explains_a_package_behind_apertium(tmp_path: Path):
    from bench.model_card import _unseen_words_note

    (tmp_path / "source_words.txt").write_text("\n".join(sorted(KNOWN)) + "\n")
    by_package = {"chem": {"model": {"chrf": 60.0}, "apertium": {"chrf": 70.0}},
                  "ui": {"model": {"chrf": 90.0}, "apertium": {"chrf": 10.0}}}  # fmt: skip
    (note,) = _unseen_words_note(tmp_path, {"by_package": by_package, "segments": SEGMENTS})[1:]
    assert note.startswith("chem: 1 of 3 pairs hold a word no training source contains (`Barium`, ...)")
    assert _unseen_words_note(tmp_path / "none", {"by_package": by_package, "segments": SEGMENTS}) == []
