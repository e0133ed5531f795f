"""The Italian first-five-minutes set (bench/data/everyday-it.jsonl): the Spanish set's items with Italian
references written by hand, checked the way tests/test_everyday.py checks the French and German sets: the
same items, no English left as it is, the source's numbers and names kept, and tu, Lei (and voi), the UI
imperative beside the infinitive and the noun, typical wrong outputs and a register mix judged as they
should be."""

import json
import re

import pytest

from bench import everyday
from bench.everyday import judge
from tests.test_everyday import _KEPT, _NAMES, DEFAULT_SET, read_rows

ITALIAN_SET = DEFAULT_SET.with_name("everyday-it.jsonl")


@pytest.fixture(scope="module")
def it_rows() -> list[dict]:
    return read_rows(ITALIAN_SET)


@pytest.fixture(scope="module")
def by_source(it_rows) -> dict[str, list[str]]:
    return {row["source"]: row["accepted"] for row in it_rows}


def test_the_set_is_written_one_json_line_per_item_keys_in_order(it_rows):
    """Its items, ids, sources and "Online" as the only reference equal to its source are checked with
    the other languages' sets (tests/test_everyday.py, TRANSLATED_SETS)."""
    assert everyday.set_for("it") == ITALIAN_SET
    # written as the other sets are: one json.dumps(..., ensure_ascii=False) line per item, keys in order
    assert ITALIAN_SET.read_text(encoding="utf-8") == "".join(
        json.dumps(row, ensure_ascii=False) + "\n" for row in it_rows
    )
    assert all(list(row) == ["id", "category", "source", "accepted"] for row in it_rows)


def test_every_italian_reference_keeps_the_source_s_numbers_placeholders_and_names(it_rows):
    checked, lost = 0, []
    for row in it_rows:
        kept = _KEPT.findall(row["source"])
        kept += [name for name in _NAMES if re.search(rf"\b{name}\b", row["source"])]
        checked += bool(kept)
        lost += [(row["id"], token, a) for a in row["accepted"] for token in kept if token not in a]
    assert lost == []
    assert checked >= 15  # 8 characters, 12 others, 3 messages, 10:45, Anna, Google, Laura, QR, ...


# tu forms, and the capitalised Lei forms written in the middle of a sentence (a sentence may start with
# "Le" or "La" as an article, never with "Suo" or "Sua")
_TU = re.compile(r"\b(?:tu|ti|te|tuo|tua|tuoi|tue)\b", re.IGNORECASE)
_LEI = re.compile(r"(?<![.!?] )(?<!^)\b(?:Lei|Suo|Sua|Suoi|Sue)\b")


def test_no_italian_text_mixes_tu_and_lei(it_rows):
    mixed = [
        (row["id"], a)
        for row in it_rows
        if row["category"] == "multi"
        for a in row["accepted"]
        if _TU.search(a) and _LEI.search(a)
    ]
    assert mixed == []
    assert _TU.search("Grazie per il tuo ordine.") and _LEI.search("Grazie per il Suo ordine.")


def test_the_italian_set_takes_tu_lei_and_voi_and_the_ui_imperative(by_source):
    hello, how = by_source["Hello!"], by_source["How are you?"]
    assert judge("Ciao!", hello) and judge("Salve!", hello) and not judge("Pronto!", hello)
    assert judge("Come stai?", how) and judge("Come sta?", how) and judge("Come state?", how)
    assert judge("Come va?", how)
    accepted = [
        ("Sign in", "Accedi"), ("Sign in", "Accedere"), ("Sign in", "Effettua l'accesso"),
        ("Sign in", "Acceda"), ("Log in", "Login"), ("Log out", "Esci"), ("Log out", "Disconnetti"),
        ("Sign up", "Iscriviti"), ("Sign up", "Registrati"), ("Sign up", "Registrazione"),
        ("Like", "Mi piace"), ("Unlike", "Togli «Mi piace»"), ("Share", "Condividi"), ("Follow", "Segui"),
        ("Unmute", "Riattiva audio"), ("Add to cart", "Aggiungi al carrello"), ("Online", "In linea"),
        ("Good morning", "Buongiorno"), ("Thank you very much", "Grazie mille"),
        ("Thank you very much", "Molte grazie"), ("Yes, please.", "Sì, grazie."),
        ("What's your name?", "Qual è il tuo nome?"),
        ("Last seen today at 10:45", "Ultimo accesso oggi alle 10:45"),
        ("The train leaves at half past eight.", "Il treno parte alle otto e mezza."),
    ]  # fmt: skip
    assert [pair for pair in accepted if not judge(pair[1], by_source[pair[0]])] == []
    rejected = [
        ("Good morning", "Buon mattino"), ("Thank you very much", "Grazie molto molto"), ("Sign up", "Firma"),
        ("Like", "Come"), ("Unlike", "Non mi piace"), ("Unmute", "Smuta"),
        ("Add to cart", "Aggiungi alla carta"), ("Report", "Rapporto"), ("Yes, please.", "Si, per favore"),
        ("What's your name?", "Qual'è il tuo nome?"), ("I live in Madrid.", "Vivo in Madrid"),
        ("I'm twenty-five years old.", "Sono venticinque anni"),
        ("The train leaves at half past eight.", "Il treno parte alle sette e mezza."),
        ("My mother makes the best paella.", "La mia madre fa la migliore paella"),
        ("Dinner is ready. Come to the table!", "La cena è pronta. Vieni al tavolo!"),
        ("The shop is around the corner. You can't miss it.",
         "Il negozio è dietro l'angolo. Non puoi perderlo."),
    ]  # fmt: skip
    assert [pair for pair in rejected if judge(pair[1], by_source[pair[0]])] == []
    # a register mix across the sentences of a text is a miss; "Ciao" goes with tu (and voi), not with Lei
    hi = by_source["Hi! How are you?"]
    assert judge("Ciao! Come stai?", hi) and judge("Salve! Come sta?", hi)
    assert not judge("Ciao! Come sta?", hi)
    table, order = (
        by_source["Your table is ready. Please follow me."],
        by_source["Thank you for your order. We will send you an email when it ships."],
    )
    assert judge("Il Suo tavolo è pronto. Prego, mi segua.", table)
    assert judge("Il tuo tavolo è pronto. Seguimi, per favore.", table)
    assert not judge("Il Suo tavolo è pronto. Seguimi, per favore.", table)
    assert judge("Grazie per il tuo ordine. Ti invieremo un'email quando verrà spedito.", order)
    assert judge("Grazie per il Suo ordine. Le invieremo un’email quando verrà spedito.", order)
    assert not judge("Grazie per il Suo ordine. Ti invieremo un'email quando verrà spedito.", order)
