"""Bilingual dictionaries as training pairs: the bidix walk, FreeDict's dictd format, provenance rules."""

import gzip
import shutil
import subprocess
from itertools import zip_longest

import pytest

from model.common_strings import common_strings
from model.corpus import Pair, cap_dictionaries, split_of, split_pairs
from model.dictionaries import (
    apertium_pairs,
    clean_lemma,
    common_word_pairs,
    dictionary_variants,
    english_word_counts,
    freedict_pairs,
    software_packages,
    states_on_cycles,
    walk_bidix,
)
from model.memory import read_pairs


def att(*arcs: tuple[int, int, str, str]) -> str:
    return "\n".join(f"{a}\t{b}\t{i}\t{o}\t0.000000" for a, b, i, o in arcs)


def word_arcs(start: int, first: int, pairs: list[tuple[str, str]], tags: list[str]) -> list:
    """Arcs spelling `pairs` symbol by symbol from `start`, then `tags` on both sides."""
    arcs, state = [], start
    for i, (a, b) in enumerate(pairs):
        nxt = first + i
        arcs.append((state, nxt, a, b))
        state = nxt
    for j, tag in enumerate(tags):
        nxt = first + len(pairs) + j
        arcs.append((state, nxt, tag, tag))
        state = nxt
    return arcs


def test_walk_bidix_reads_lemmas_up_to_the_first_tag_and_skips_cycles():
    # hi -> hola<ij>: the Spanish side is longer, padded with ε on the English side
    hola = word_arcs(0, 1, [("h", "h"), ("i", "o"), ("ε", "l"), ("ε", "a")], ["<ij>", "<sg>"])
    # a multiword entry with a blank, and a second sense of the same word
    good = word_arcs(0, 20, list(zip_longest("good morning", "buenos días", fillvalue="ε")), ["<ij>"])
    # a number pattern: a digit loop (state 40 -> 40) that must not be followed
    number = [(0, 40, "1", "1"), (40, 40, "2", "2"), (40, 41, "<num>", "<num>")]
    # after the tags, a loop copying any tag (as <*> compiles): never reached past both first tags
    loop = [(6, 6, "<pl>", "<pl>")]
    listing = att(*hola, *good, *number, *loop)
    entries = set(walk_bidix(listing + "\n6\t0.000000\n"))
    assert ("hi", "hola", "ij") in entries
    assert ("good morning", "buenos días", "ij") in entries
    assert not any(e[2] == "num" for e in entries)


def test_states_on_cycles():
    graph = {0: [1, 3], 1: [2], 2: [1], 3: [3], 4: [5], 5: []}
    assert states_on_cycles(graph) == {1, 2, 3}


def test_lemmas_and_variants():
    assert clean_lemma("dar# las gracias por") == "dar las gracias por"
    assert clean_lemma("thank# for") == "thank for"
    assert list(dictionary_variants("good morning", "buenos días")) == [
        ("good morning", "buenos días"),
        ("Good morning", "Buenos días"),
    ]
    assert list(dictionary_variants("Russia", "Rusia")) == [("Russia", "Rusia")]


def dictd(articles: dict[str, str]) -> tuple[str, bytes]:
    """A dictd index and .dict.dz holding `articles` (headword -> article text)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def b64(n: int) -> str:
        digits = ""
        while True:
            digits = alphabet[n % 64] + digits
            n //= 64
            if n == 0:
                return digits

    body, lines = b"", []
    for head, text in articles.items():
        data = text.encode("utf-8")
        lines.append(f"{head}\t{b64(len(body))}\t{b64(len(data))}")
        body += data
    return "\n".join(lines) + "\n", gzip.compress(body)


def test_freedict_pairs_split_senses():
    index, dz = dictd({
        "00databaseinfo": "info",
        "cup": "cup /kʌp/\ntaza, copa\n",
        "weather": "weather\n1. tiempo 2. clima\n",
        "see": "see\nver (verbo)\n",
    })  # fmt: skip
    pairs = set(freedict_pairs(index, dz))
    assert {
        ("cup", "taza", ""),
        ("cup", "copa", ""),
        ("weather", "tiempo", ""),
        ("weather", "clima", ""),
    } <= pairs
    assert not any(head.startswith("00database") for head, _, _ in pairs)
    assert not any("(" in es for _, es, _ in pairs)  # a sense with a note is not a clean translation


def test_freedict_tei_articles_keep_the_words_and_skip_the_notes():
    """FreeDict's eng-deu (generated from TEI): grammar marks after the words, notes and cross-references."""
    index, dz = dictd({
        "eel ladder": (
            "eel ladder /ˈiːl lˈadə/\nAalleiter <fem>, Aaltreppe <fem>, Aalpass <masc>\n"
            "         Note: Wasserbau\n see: {eel ladders}\n\n         Note: water engineering\n"
        ),
        "amphiumas": "amphiumas\nAalmolche <pl>, Fischmolche <pl> [zool.]\n   Synonyms: {congo eels}\n",
        "apply": "apply\nanlegen <v, trans>; auftragen <v, trans>\n   Synonym: {put on}\n",
        "stolen": "stolen\nrobadas al sueño <f>\n",  # eng-spa's one stray mark: that sense stays out
    })  # fmt: skip
    pairs = {(head, target) for head, target, _ in freedict_pairs(index, dz)}
    assert pairs == {
        ("eel ladder", "Aalleiter"),
        ("eel ladder", "Aaltreppe"),
        ("eel ladder", "Aalpass"),
        ("amphiumas", "Aalmolche"),  # "Fischmolche [zool.]": a domain label drops the sense
        ("apply", "anlegen"),
        ("apply", "auftragen"),
    }


def test_dictionaries_stay_in_train_and_out_of_memory_and_common_strings(tmp_path):
    assert split_of("apertium") == split_of("dict") == "train"
    assert software_packages(["apertium-eng-spa", "gedit", "dict-freedict-eng-spa"]) == ["gedit"]
    rows = [
        {"source": "Hello", "target": "Hola", "packages": ["apertium-eng-spa"]},
        {"source": "Save", "target": "Guardar", "packages": ["gedit", "apertium-eng-spa"]},
    ]
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    assert list(read_pairs(jsonl)) == [("Save", "Guardar", 1)]
    rows += [{"source": "Save", "target": "Guardar", "packages": ["kate"]}]
    assert [c.source for c in common_strings(rows)] == ["Save"]
    # a dictionary pair whose source a held-out pair has makes that held-out pair not novel
    splits = split_pairs([
        Pair("Cup", "Taza", "apertium-eng-spa", "1", "apertium-eng-spa:n"),
        Pair("Cup", "Taza", "kalzium", "1", "kalzium.mo"),
    ])  # fmt: skip
    assert [p.novel for p in splits[split_of("kalzium")]] == [False]


def test_an_oversized_dictionary_keeps_the_pairs_of_common_words():
    counts = english_word_counts(["Open the file", "Save the file", "Open", "Open a cup"])
    assert counts["open"] == 3 and counts["file"] == 2 and counts["cup"] == 1
    sources = [
        "gorse",  # a word the catalogs never use
        "open",  # offen
        "open",  # öffnen
        "open",  # eröffnen: past the senses kept per entry
        "file",
        "open file",  # a phrase: its rarest word's count over 2 squared
        "cup",
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("model.dictionaries.SENSES_PER_ENTRY", 2)
        assert common_word_pairs(sources, counts, cap=len(sources)) == list(range(len(sources)))
        # kept in dictionary order: open (3), file (2), open's second sense (3/2), cup (1)
        assert common_word_pairs(sources, counts, cap=4) == [1, 2, 4, 6]


def test_cap_dictionaries_counts_only_training_catalogs_and_leaves_small_dictionaries(monkeypatch):
    monkeypatch.setattr("model.corpus.DICTIONARY_CAP_PAIRS", 1)
    held_out = next(f for f in ("kalzium", "grub", "pidgin", "digikam") if split_of(f) != "train")
    pairs = [
        Pair("Open", "Öffnen", "gedit", "1", "gedit.mo"),
        Pair("Gorse", "Stechginster", held_out, "1", "x.mo"),  # held out: its words are not counted
        Pair("gorse", "Stechginster", "dict-freedict-eng-deu", "1", "dict-freedict-eng-deu"),
        Pair("open", "offen", "dict-freedict-eng-deu", "1", "dict-freedict-eng-deu"),
        Pair("cup", "Taza", "apertium-eng-spa", "1", "apertium-eng-spa:n"),
    ]
    kept, report = cap_dictionaries(pairs, ["dict-freedict-eng-deu", "apertium-eng-spa"])
    assert [p.source for p in kept] == ["Open", "Gorse", "open", "cup"]
    assert report["dict-freedict-eng-deu"]["pairs"] == 2 and report["dict-freedict-eng-deu"]["kept"] == 1
    assert "apertium-eng-spa" not in report


@pytest.mark.skipif(shutil.which("lt-print") is None or shutil.which("lt-comp") is None, reason="lttoolbox")
def test_apertium_pairs_from_a_compiled_dictionary(tmp_path):
    """A real bilingual .dix compiled by lttoolbox, read back through lt-print."""
    dix = tmp_path / "test.dix"
    dix.write_text(
        """<?xml version="1.0" encoding="UTF-8"?>
<dictionary>
  <alphabet/>
  <sdefs><sdef n="n"/><sdef n="ij"/><sdef n="num"/><sdef n="sg"/></sdefs>
  <section id="main" type="standard">
    <e><p><l>cup<s n="n"/></l><r>taza<s n="n"/></r></p></e>
    <e><p><l>good<b/>morning<s n="ij"/></l><r>buenos<b/>días<s n="ij"/></r></p></e>
    <e><p><l>cow<s n="n"/></l><r>vaca<s n="n"/></r></p></e>
  </section>
</dictionary>
""",
        encoding="utf-8",
    )
    compiled = tmp_path / "test.bin"
    subprocess.run(["lt-comp", "lr", str(dix), str(compiled)], check=True, capture_output=True, timeout=60)
    pairs = set(apertium_pairs(compiled.read_bytes(), tmp_path / "scratch"))
    assert pairs == {("cup", "taza", "n"), ("good morning", "buenos días", "ij"), ("cow", "vaca", "n")}
