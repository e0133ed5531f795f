"""The commonest UI strings of the training side and how a translation of one is judged."""

from model.common_strings import (
    CommonString,
    common_strings,
    is_accepted,
    normalise_answer,
    repeated_word,
    score_common_strings,
)


def record(source: str, target: str, *packages: str) -> dict:
    return {"source": source, "target": target, "package": packages[0], "packages": list(packages)}


def test_ranked_by_packages_with_answers_two_packages_give():
    records = [
        record("Save", "Guardar", "a", "b", "c"),
        record("Save", "Salvar", "d"),  # one package only: not an accepted answer
        record("Open", "Abrir", "a", "b"),
        record("Open", "Abre", "c", "d"),
        record("Quit", "Salir", "a", "b", "c", "d", "e"),
        record("Rare", "Raro", "a"),  # no answer two packages give: never chosen
        record("Close", "Cerrar.", "a"),
        record("Close", "cerrar", "b"),  # same answer once case and final punctuation are ignored
    ]
    items = common_strings(records, n=10)
    assert [i.source for i in items] == ["Quit", "Open", "Save", "Close"]  # ties by source text
    assert items[1] == CommonString("Open", ("abre", "abrir"), 4)
    assert items[2].accepted == ("guardar",) and items[2].packages == 4
    assert items[3].accepted == ("cerrar",)
    assert [i.source for i in common_strings(records, n=2)] == ["Quit", "Open"]
    assert common_strings(records, n=0) == []  # --common 0: none, not all


def test_acceptance_ignores_case_final_punctuation_and_unicode_form():
    item = CommonString("Add", ("añadir",), 5)
    assert is_accepted("Añadir", item) and is_accepted("AÑADIR.", item)
    assert is_accepted("An\u0303adir", item)  # decomposed ñ
    assert not is_accepted("Añadir archivo", item) and not is_accepted("¿Añadir", item)
    assert normalise_answer("  Guardar   como… ") == "guardar como"


def test_repeated_word_flags_degenerate_outputs_only():
    assert repeated_word("Guardar Guardar Guardar", "Guardar") == "guardar"
    assert repeated_word("Archivo de archivo", "Archivo") == "archivo"
    assert repeated_word("Nueva nueva", "Nuevo") == "nueva"
    assert repeated_word("No se pudo abrir el archivo", "No se pudo abrir el archivo") is None
    # a repetition the reference has too is not a defect; short words (de, el, la) never count
    assert repeated_word("Copia de la copia", "Copia de la copia") is None
    assert repeated_word("de la de la", "x") is None


def test_score_common_strings_counts_accepted_and_repeats():
    items = [CommonString("Save", ("guardar",), 9), CommonString("File", ("archivo", "fichero"), 8)]
    scores = score_common_strings(items, ["Guardar", "Archivo de archivo"])
    assert scores["accepted"] == 1 and scores["accepted_percent"] == 50.0
    assert scores["repeated_word"] == 1
    assert scores["misses"] == [
        {"source": "File", "output": "Archivo de archivo", "accepted": ["archivo", "fichero"]}
    ]
