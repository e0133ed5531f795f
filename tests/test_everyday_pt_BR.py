"""The Brazilian Portuguese first-five-minutes set (bench/data/everyday-pt_BR.jsonl): the Spanish set's items
with Brazilian Portuguese references written by hand, checked the way tests/test_everyday.py checks the French
and German sets: the same items, no English left as it is, the source's numbers and names kept, and você,
o senhor / a senhora (and vocês), the UI infinitive beside the imperative, Brazilian rather than European
usage, typical wrong outputs and a register mix judged as they should be."""

import json
import re

import pytest

from bench import everyday
from bench.everyday import judge
from tests.test_everyday import _KEPT, _NAMES, DEFAULT_SET, read_rows

PT_BR_SET = DEFAULT_SET.with_name("everyday-pt_BR.jsonl")
# Brazilian Portuguese writes Madri (Madrid is accepted beside it), as Spain becomes Espanha: every other
# name of the set is kept as it is.
_PT_BR_NAMES = tuple(name for name in _NAMES if name != "Madrid")


@pytest.fixture(scope="module")
def pt_rows() -> list[dict]:
    return read_rows(PT_BR_SET)


@pytest.fixture(scope="module")
def by_source(pt_rows) -> dict[str, list[str]]:
    return {row["source"]: row["accepted"] for row in pt_rows}


def test_the_set_is_written_one_json_line_per_item_keys_in_order(pt_rows):
    """Its items, ids, sources and "Online" as the only reference equal to its source are checked with
    the other languages' sets (tests/test_everyday.py, TRANSLATED_SETS)."""
    assert everyday.set_for("pt_BR") == PT_BR_SET
    # written as the other sets are: one json.dumps(..., ensure_ascii=False) line per item, keys in order
    assert PT_BR_SET.read_text(encoding="utf-8") == "".join(
        json.dumps(row, ensure_ascii=False) + "\n" for row in pt_rows
    )
    assert all(list(row) == ["id", "category", "source", "accepted"] for row in pt_rows)


def test_every_brazilian_reference_keeps_the_source_s_numbers_placeholders_and_names(pt_rows, by_source):
    checked, lost = 0, []
    for row in pt_rows:
        kept = _KEPT.findall(row["source"])
        kept += [name for name in _PT_BR_NAMES if re.search(rf"\b{name}\b", row["source"])]
        checked += bool(kept)
        lost += [(row["id"], token, a) for a in row["accepted"] for token in kept if token not in a]
    assert lost == []
    assert checked >= 14  # 8 characters, 12 others, 3 messages, 10:45, Anna, Google, Laura, QR, ...
    madrid = by_source["I live in Madrid."]
    assert judge("Moro em Madri.", madrid) and judge("Eu moro em Madrid.", madrid)
    assert all(re.search(r"\bMadri(d)?\b", a) for a in madrid)


# European Portuguese words and forms where Brazil has its own, and tu forms (Brazil says você; the clitic
# "te" goes with você in Brazil and is not a tu form)
_EUROPEAN = re.compile(
    r"\b(?:ecrã|telemóvel|utilizador|palavra-passe|autocarro|comboio|pequeno-almoço|casa de banho|partilh\w*"
    r"|câmara|cupão|stock|aplicação|registo|definições|guardad[ao]s?|sítio)\b"
    r"|\b(?:estou|está|estamos|estão|estava|continuar|continue) a \w+(?:ar|er|ir)\b",
    re.IGNORECASE,
)
_TU = re.compile(r"\b(?:tu|teu|tua|teus|tuas|contigo|estás|podes|queres|tens|dormiste)\b", re.IGNORECASE)


def test_no_brazilian_reference_is_european_portuguese_or_takes_tu(pt_rows):
    european = [(row["id"], a) for row in pt_rows for a in row["accepted"] if _EUROPEAN.search(a)]
    tu = [(row["id"], a) for row in pt_rows for a in row["accepted"] if _TU.search(a)]
    assert european == [] and tu == []
    assert _EUROPEAN.search("Partilhar ecrã") and _EUROPEAN.search("Está a chover.")
    assert not _EUROPEAN.search("Estou a caminho") and _TU.search("Obrigado pelo teu pedido.")


def test_the_brazilian_set_takes_voce_o_senhor_and_the_ui_infinitive(by_source):
    hello, how = by_source["Hello!"], by_source["How are you?"]
    assert judge("Olá!", hello) and judge("Oi!", hello) and not judge("Alô!", hello)
    assert judge("Como vai?", how) and judge("Como você está?", how) and judge("Tudo bem?", how)
    assert judge("Como o senhor está?", how) and judge("Como vocês estão?", how)
    accepted = [
        ("Sign in", "Entrar"), ("Sign in", "Fazer login"), ("Sign in", "Faça login"), ("Log in", "Login"),
        ("Log in", "Iniciar sessão"), ("Log out", "Sair"), ("Sign out", "Fazer logout"),
        ("Sign up", "Cadastrar-se"), ("Sign up", "Cadastre-se"), ("Sign up", "Inscrever-se"),
        ("Like", "Curtir"), ("Unlike", "Descurtir"), ("Share", "Compartilhar"), ("Follow", "Seguir"),
        ("Unmute", "Ativar som"), ("Add to cart", "Adicionar ao carrinho"), ("Online", "On-line"),
        ("Share screen", "Compartilhar tela"), ("Enter your email", "Digite seu e-mail"),
        ("Incorrect username or password.", "Usuário ou senha incorretos."),
        ("Get it on Google Play", "Baixe no Google Play"), ("Loading...", "Carregando..."),
        ("Good morning", "Bom dia"), ("Thank you very much", "Muito obrigado"),
        ("Thank you very much", "Muito obrigada"), ("Welcome to Spain!", "Bem-vinda à Espanha!"),
        ("My phone is broken.", "Meu celular quebrou."), ("It's raining.", "Está chovendo."),
        ("Last seen today at 10:45", "Visto por último hoje às 10:45"),
        ("The train leaves at half past eight.", "O trem sai às oito e meia."),
    ]  # fmt: skip
    assert [pair for pair in accepted if not judge(pair[1], by_source[pair[0]])] == []
    rejected = [
        # word by word
        ("Good morning", "Boa manhã"), ("Thank you very much", "Obrigado muito muito"), ("Like", "Como"),
        ("Sign up", "Assinar"), ("Unmute", "Silenciar"), ("Add to cart", "Adicionar ao carro"),
        ("What time is it?", "Que hora é?"), ("Is this seat free?", "Este assento é grátis?"),
        ("I can't find my glasses.", "Não posso encontrar os meus óculos."),
        ("My son goes to school by bike.", "Meu filho vai para a escola por bicicleta."),
        ("My sister is a doctor.", "Minha irmã é um médico."), ("My name is John.", "Meu nome é João."),
        ("The train leaves at half past eight.", "O trem sai às sete e meia."),
        ("Welcome to Spain!", "Bem-vindo a Espanha!"), ("I'm sorry.", "Eu sou desculpa."),
        # European Portuguese where the set is Brazilian
        ("Share screen", "Partilhar ecrã"), ("Share screen", "Compartilhar ecrã"),
        ("Loading...", "A carregar..."), ("Sign out", "Terminar sessão"),
        ("My phone is broken.", "O meu telemóvel está avariado."),
        ("Incorrect username or password.", "Nome de utilizador ou palavra-passe incorretos"),
        ("It's raining.", "Está a chover."), ("Breakfast is ready.", "O pequeno-almoço está pronto."),
        ("The bus is late again.", "O autocarro está atrasado outra vez."),
    ]  # fmt: skip
    assert [pair for pair in rejected if judge(pair[1], by_source[pair[0]])] == []
    # a register mix across the sentences of a text is a miss, and so is the European tu
    hi, table, order = (
        by_source["Hi! How are you?"],
        by_source["Your table is ready. Please follow me."],
        by_source["Thank you for your order. We will send you an email when it ships."],
    )
    assert judge("Oi! Tudo bem?", hi) and judge("Olá, como vai?", hi) and not judge("Olá! Como estás?", hi)
    assert judge("Sua mesa está pronta. Por favor, me acompanhe.", table)
    assert judge("A mesa de vocês está pronta. Me acompanhem, por favor.", table)
    assert not judge("A mesa de vocês está pronta. Me acompanhe, por favor.", table)
    assert not judge("A tua mesa está pronta. Por favor, acompanha-me.", table)
    assert judge("Obrigado pelo seu pedido. Enviaremos um e-mail para você quando for enviado.", order)
    assert judge("Obrigada pelo pedido. Vamos te enviar um e-mail quando ele for enviado.", order)
    assert not judge("Obrigado pelo teu pedido. Enviaremos um e-mail para você quando for enviado.", order)
    assert not judge("Obrigado pela sua encomenda. Vamos enviar-te um e-mail quando for expedida.", order)
