"""The Spanish lexicon (runtime/faithful/lexicon.py, built by model/lexicon.py from Debian's hunspell-es)
and the non-words of a translation: what the text layer's lexical guard and bench.evaluate count."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from model.affixes import expand, read_affixes
from model.lexicon import build
from runtime.faithful.lexicon import (
    LEXICON_FILE,
    Lexicon,
    non_word_rate,
    non_words,
    read_lexicon,
    with_enclitics,
    write_lexicon,
)

SHIPPED = Path(__file__).resolve().parent.parent / "models" / "en-es-small" / LEXICON_FILE
# The invented words of issue 30, read in real outputs of the shipped model.
INVENTED = [
    "Hanllo",
    "Desmuto",
    "meteorono",
    "Paragoten",
    "Teclastrocos",
    "Contactonos",
    "cableableableableados",
    "víruses",
]


@pytest.fixture(scope="module")
def lexicon() -> Lexicon:
    return read_lexicon(SHIPPED)


def test_the_shipped_lexicon_is_small_and_says_what_it_is():
    assert SHIPPED.stat().st_size < 3_000_000  # committed with the model
    with gzip.open(SHIPPED, "rt", encoding="utf-8") as f:
        header = json.loads(f.readline())
    assert header["format"] == "lexicon/1" and header["command"] == "python -m model.lexicon"
    assert header["words"] > 500_000 and header["hosts"] > 100_000


def test_inflected_forms_are_known_in_any_case(lexicon):
    for word in ["guardados", "Archivos", "configuraciones", "abrió", "pudieron", "CARPETA", "rápidamente"]:
        assert word in lexicon, word


def test_enclitic_pronouns_are_known_with_the_accent_their_stress_needs(lexicon):
    # in the affix data, and rebuilt by the rule where it has none (vuélvelo, muéstramelo, vámonos)
    for word in ["dámelo", "guardarlos", "hazlo", "siéntate", "guardándolos", "vuélvelo", "muéstramelo",
                 "guardémonos", "sentaos", "vámonos", "oírlo", "pídeselo", "Ábralo"]:  # fmt: skip
        assert word in lexicon, word
    assert lexicon.enclitic_host("vuélvelo") == "vuelve"
    # a missing or misplaced accent, a pronoun after a noun or a finite indicative form: not words
    for word in ["vuelvelo", "guardarmelo", "vuélvélo", "contactonos", "mesala", "dámemela"]:
        assert word not in lexicon, word


def test_the_accent_rule():
    assert with_enclitics("vuelve", "lo") == "vuélvelo"
    assert with_enclitics("da", "me") == "dame"
    assert with_enclitics("da", "melo") == "dámelo"
    assert with_enclitics("guardar", "lo") == "guardarlo"
    assert with_enclitics("guardar", "melo") == "guardármelo"
    assert with_enclitics("está", "te") == "estate"  # the stress falls on the penultimate again
    assert with_enclitics("oír", "lo") == "oírlo"  # hiatus: the accent stays
    assert with_enclitics("guardemos", "nos") == "guardémonos"  # the s goes before nos
    assert with_enclitics("sentad", "os") == "sentaos"  # the d goes before os


def test_the_invented_words_of_the_issue_are_not_known(lexicon):
    assert [w for w in INVENTED if w in lexicon] == []


def test_copied_words_spans_numbers_and_acronyms_are_not_counted(lexicon):
    assert non_words("Hello", "Hanllo", lexicon) == ["Hanllo"]
    # copied from the source (any case), inside a placeholder, URL, path or tag, with digits, acronyms
    source = "Open Guake with %s from https://example.org/Desmuto in /usr/share/xfoo"
    output = "Abra guake con %s desde https://example.org/Desmuto en /usr/share/xfoo <Teclastrocos/> x86 EAU"
    assert non_words(source, output, lexicon) == []
    assert non_words("Mute", "Desmuto el sonido", lexicon) == ["Desmuto"]
    assert non_words("Mute", "Desmuto", lexicon, allowed={"desmuto"}) == []  # a glossary or memory term
    assert non_words("e-mail", "Envíe un e-mail", lexicon) == []  # each part copied or known
    rate = non_word_rate([("Hello", "Hanllo"), ("Hello", "Hola"), ("Virus", "víruses")], lexicon)
    assert (rate["n"], rate["count"], rate["percent"], rate["examples"]) == (
        3,
        2,
        66.67,
        ["Hanllo", "víruses"],
    )


AFF = """SET UTF-8
FLAG UTF-8
PFX d Y 1
PFX d 0 des .
SFX S Y 2
SFX S 0 s [aeiou]
SFX S 0 es [^aeiou]
SFX R Y 3
SFX R ar o ar
SFX R ar a ar
SFX R ar ando/À ar
SFX À Y 2
SFX À 0 lo o
SFX À 0 la o
"""


def test_the_builder_expands_affixes_and_writes_a_file_the_reader_loads(tmp_path):
    (tmp_path / "es_XX.aff").write_text(AFF, encoding="utf-8")
    (tmp_path / "es_XX.dic").write_text("3\ncasa/S\nguardar/RdS\nMadrid\n", encoding="utf-8")
    affixes = read_affixes(tmp_path / "es_XX.aff")
    assert expand("casa", "S", affixes) == {"casa", "casas"}
    # a suffix with its condition, a twofold suffix (the continuation class adds the enclitics), and the
    # cross-product prefix on every suffixed form
    assert {"guardo", "guarda", "guardando", "guardandolo", "desguardo", "desguardar"} <= expand(
        "guardar", "RdS", affixes
    )
    built = build(tmp_path)
    words, hosts, dics = built.words, built.hosts, built.dictionaries
    assert "madrid" in words and "guardarlo" not in words and dics == [str(tmp_path / "es_XX.dic")]
    assert {"guardar", "guarda", "guardando"} <= hosts and "casa" not in hosts  # verb forms only
    path = tmp_path / LEXICON_FILE
    size = write_lexicon(path, words | {"guárdalo"}, hosts, {"command": "test"})
    assert size == path.stat().st_size
    lexicon = read_lexicon(path)
    # guárdalo is left out of the file (the rule rebuilds it from the host guarda) and still known
    assert "guárdalo" not in gzip.decompress(path.read_bytes()).decode() and "Guárdalo" in lexicon
    assert "MADRID" in lexicon and "casas" in lexicon and "casalo" not in lexicon
    before = path.read_bytes()
    write_lexicon(path, words | {"guárdalo"}, hosts, {"command": "test"})
    assert path.read_bytes() == before  # the same words, the same bytes (the file is committed)


def test_a_file_that_is_not_a_lexicon_is_refused(tmp_path):
    bad = tmp_path / "lexicon.txt.gz"
    bad.write_bytes(gzip.compress(b'{"format": "other"}\nhola\n'))
    with pytest.raises(ValueError, match="not a lexicon"):
        read_lexicon(bad)


def test_the_shipped_bundle_carries_the_lexicon_and_the_engine_loads_it(shipped_bundle):
    from server.app import default_engine_factory
    from server.config import ServerConfig

    manifest = json.loads((shipped_bundle / "manifest.json").read_text())
    assert manifest["lexicon"] == LEXICON_FILE and LEXICON_FILE in manifest["files"]
    engine = default_engine_factory(shipped_bundle, ServerConfig(threads=1, memory=False))
    assert engine.lexicon is not None and "Hanllo" not in engine.lexicon and "dámelo" in engine.lexicon
    off = default_engine_factory(shipped_bundle, ServerConfig(threads=1, memory=False, lexical_guard=False))
    assert off.lexicon is None and off.text_layer.lexicon is None


# French-like: two-character flags, a stem that needs an affix, elision prefixes, ICONV.
FR_AFF = """SET UTF-8
FLAG long
NEEDAFFIX ()
ICONV 1
ICONV ’ '
SFX S. Y 2
SFX S. 0 0/L'D' .
SFX S. 0 s/D' .
PFX L' Y 2
PFX L' 0 l' [aeiouh]
PFX L' a l'A a
PFX D' Y 1
PFX D' 0 d' .
"""


def test_long_flags_needaffix_elision_and_iconv(tmp_path):
    aff = tmp_path / "fr.aff"
    aff.write_text(FR_AFF, encoding="utf-8")
    (tmp_path / "fr.dic").write_text("2\napplication/S.()\nfichier/S.()\n", encoding="utf-8")
    rules = read_affixes(aff)
    assert rules.flags("S.()L'") == ("S.", "()", "L'") and rules.iconv == [("’", "'")]
    # the NEEDAFFIX stem counts through its (empty) suffix only; the elision rules are not expanded
    assert expand("application", "S.()", rules) == {"application", "applications"}
    assert expand("cadeau", "()", rules) == set()
    assert rules.elision == {"l'": "aehiou", "d'": ""}
    built = build(tmp_path, "fr")
    path = tmp_path / LEXICON_FILE
    write_lexicon(
        path, built.words, built.hosts, {"command": "test"}, iconv=built.iconv, elision=built.elision
    )
    lexicon = read_lexicon(path)
    for word in ["l'application", "L’Application", "d'applications", "fichiers", "l'applications"]:
        assert word in lexicon, word
    for word in ["l'fichier", "l'applicaton", "applicaton", "x'application", "l'"]:
        assert word not in lexicon, word
    assert non_words("Open the application", "Ouvrez l'application", lexicon) == ["Ouvrez"]


NUM_AFF = """SET UTF-8
FLAG num
AF 2
AF 101,202
AF 101
SFX 101 Y 1
SFX 101 0 s .
PFX 202 Y 1
PFX 202 0 re .
"""


def test_numeric_flags_and_aliases(tmp_path):
    aff = tmp_path / "xx.aff"
    aff.write_text(NUM_AFF, encoding="utf-8")
    rules = read_affixes(aff)
    assert rules.flags("101,202") == ("101", "202") and rules.flags("1") == ("101", "202")
    assert expand("load", "1", rules) == {"load", "loads", "reload", "reloads"}
    assert expand("save", "2", rules) == {"save", "saves"}


DE_AFF = """SET UTF-8
COMPOUNDBEGIN x
COMPOUNDMIDDLE y
COMPOUNDEND z
ONLYINCOMPOUND o
COMPOUNDPERMITFLAG c
NEEDAFFIX h
COMPOUNDMIN 2
SFX N Y 1
SFX N 0 n .
SFX j Y 1
SFX j 0 0/xoc .
SFX e Y 1
SFX e 0 0/yoc .
"""


def test_german_compounds_split_into_known_parts(tmp_path):
    (tmp_path / "de_DE.aff").write_text(DE_AFF, encoding="utf-8")
    dic = "5\nDatei/Nj\ndatei/Nozm\nName/N\nname/Nozm\nverwaltungs/he\n"
    (tmp_path / "de_DE.dic").write_text(dic, encoding="utf-8")
    built = build(tmp_path, "de")
    assert {"datei", "name", "namen"} <= built.words and "verwaltungs" not in built.words
    assert built.parts["datei"] == "be" and built.parts["verwaltungs"] == "m"
    path = tmp_path / LEXICON_FILE
    write_lexicon(path, built.words, built.hosts, {"command": "test"}, built.parts, compound_min=3)
    lexicon = read_lexicon(path)
    for word in ["Dateiname", "Dateinamen", "Dateiverwaltungsname", "Datei"]:
        assert word in lexicon, word
    assert lexicon.compound("dateiverwaltungsname") == ("datei", "verwaltungs", "name")
    # an invented word, a middle part at the end, a part no word may begin with
    for word in ["Dateinahme", "Dateiverwaltungs", "Verwaltungsdatei", "Namedatei"]:
        assert word not in lexicon, word


def test_tails_and_hyphenated_forms_are_rebuilt_exactly(tmp_path):
    words = {
        "guardare",
        "guardarlo",
        "guardarla",
        "guardarne",
        "guardarmi",
        "scuola",
        "dá-las",
        "dá-lo",
        "las",
    }
    path = tmp_path / LEXICON_FILE
    write_lexicon(path, words, (), {"command": "test"}, tails=("lo", "la", "ne", "mi"), hyphenated=True)
    text = gzip.decompress(path.read_bytes()).decode()
    assert "guardarlo" not in text and "dá-las" not in text  # rebuilt by the reader
    lexicon = read_lexicon(path)
    assert all(w in lexicon for w in words)
    for word in ["scuolo", "guardarvi", "guardar", "dá", "las-dá-ne"]:
        assert word not in lexicon, word
