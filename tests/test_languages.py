"""Target languages of the corpus (issue 31): the language table, which catalogs count per language, the
package-name substitution, plural forms and Language codes read from catalog headers, LibreOffice help
with a region code, a whole synthetic build per language (Spanish byte for byte as before), and
runtime/languages.py."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import polib
import pytest

from model.corpus import (
    _MO_PATH,
    _language_code,
    build,
    help_page_pattern,
    read_catalog_package,
    read_help_packages,
    read_mo,
    split_of,
)
from model.dictionaries import member_pattern, software_packages
from model.languages import (
    ALL_DICTIONARY_PACKAGES,
    LANGUAGES,
    header_votes,
    language,
    language_summary,
    plural_groups,
    read_package_list,
    runtime_table,
)
from runtime import languages as runtime_languages
from runtime.languages import normalise_code, parse_plural_forms

needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb builds the test packages")

# --------------------------------------------------------------------------------------------
# The table


def test_the_table_names_the_five_languages_and_their_packages():
    assert list(LANGUAGES) == ["es", "fr", "de", "it", "pt_BR"]
    pt = language("pt_BR")
    assert language("pt-BR") is pt and language("pt-br") is pt
    assert pt.help_packages == ("libreoffice-help-pt-br", "libreoffice-help-en-us")
    assert pt.help_code == "pt-BR" and pt.catalog_dirs == ("pt_BR",)
    assert language("fr").help_packages == ("libreoffice-help-fr", "libreoffice-help-en-us")
    with pytest.raises(KeyError, match="unknown target language"):
        language("xx")
    assert _language_code("pt-BR") == "pt_BR"  # --lang
    with pytest.raises(argparse.ArgumentTypeError, match="one of es, fr, de, it, pt_BR"):
        _language_code("xx")


def test_dictionaries_per_language_are_data():
    assert language("es").dictionary_packages == ("apertium-eng-spa", "dict-freedict-eng-spa")
    for code, freedict in [("fr", "fra"), ("de", "deu"), ("it", "ita"), ("pt_BR", "por")]:
        assert language(code).dictionary_packages == (f"dict-freedict-eng-{freedict}",)
    apertium, freedict = language("es").dictionaries
    assert member_pattern(apertium).search("./usr/share/apertium/apertium-eng-spa/eng-spa.autobil.bin")
    assert not member_pattern(apertium).search("./usr/share/apertium/apertium-eng-spa/spa-eng.autobil.bin")
    fra = language("fr").dictionaries[0]
    assert member_pattern(fra).search("./usr/share/dictd/freedict-eng-fra.dict.dz")
    assert member_pattern(fra).search("./usr/share/dictd/freedict-eng-fra.index")
    assert not member_pattern(fra).search("./usr/share/dictd/freedict-eng-spa.index")
    # every language's dictionary is a word list, not a program's string, and trains only
    assert software_packages(["dict-freedict-eng-deu", "gedit", "apertium-eng-spa"]) == ["gedit"]
    assert {"dict-freedict-eng-por", "apertium-eng-spa"} <= ALL_DICTIONARY_PACKAGES
    assert split_of("dict") == split_of("apertium") == "train"


@pytest.mark.parametrize(
    ("code", "counted", "not_counted"),
    [
        ("es", ["es", "es_ES"], ["es_MX", "es_AR", "eo", "est"]),
        ("fr", ["fr", "fr_FR"], ["fr_CA", "fr_BE", "fy"]),
        ("de", ["de", "de_DE"], ["de_CH", "de_AT", "dsb"]),
        ("it", ["it", "it_IT"], ["it_CH", "id"]),
        ("pt_BR", ["pt_BR"], ["pt", "pt_PT", "br"]),
    ],
)
def test_mo_path_patterns(code, counted, not_counted):
    pattern = language(code).mo_pattern()
    for directory in counted:
        assert pattern.search(f"./usr/share/locale/{directory}/LC_MESSAGES/app.mo")
    for directory in not_counted:
        assert not pattern.search(f"./usr/share/locale/{directory}/LC_MESSAGES/app.mo"), directory
    assert not pattern.search(f"./usr/share/locale/{counted[0]}/LC_MESSAGES/app.po")
    assert not pattern.search(f"./usr/share/locale/{counted[0]}/app.mo")


def test_spanish_pattern_is_the_one_before_issue_31():
    assert _MO_PATH.pattern == language("es").mo_pattern().pattern
    for path, hit in [
        ("/es/LC_MESSAGES/a.mo", True),
        ("/es_ES/LC_MESSAGES/a.mo", True),
        ("/es_MX/LC_MESSAGES/a.mo", False),
    ]:
        assert bool(_MO_PATH.search(path)) is hit


def test_package_list_substitution_and_the_same_ranks_in_every_language(tmp_path):
    ranked = tmp_path / "ranked.tsv"
    ranked.write_text(
        "# comment\nlibreoffice-l10n-LANG\t100\ngimp-data\t90\n\nkrita-l10n\t80\ntilix-common\t70\n"
    )
    assert read_package_list(ranked, 3) == ["libreoffice-l10n-es", "gimp-data", "krita-l10n"]
    assert read_package_list(ranked, 2, "pt_BR") == ["libreoffice-l10n-pt-br", "gimp-data"]
    assert read_package_list(ranked, 2, "de")[0] == "libreoffice-l10n-de"
    # the packages past `top` are the same in every language: never trained on, in any of them
    unseen = {code: read_package_list(ranked, 10, code)[3:] for code in LANGUAGES}
    assert set(map(tuple, unseen.values())) == {("tilix-common",)}


# --------------------------------------------------------------------------------------------
# Plural forms and Language codes from the catalogs


def make_mo(path: Path, entries: list[polib.POEntry], language: str, plural_forms: str | None) -> Path:
    po = polib.POFile()
    po.metadata = {
        "Project-Id-Version": "test 1.0",
        "Language": language,
        "MIME-Version": "1.0",
        "Content-Type": "text/plain; charset=UTF-8",
        "Content-Transfer-Encoding": "8bit",
    }
    if plural_forms is not None:
        po.metadata["Plural-Forms"] = plural_forms
    for entry in entries:
        po.append(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    po.save_as_mofile(str(path))
    return path


def test_plural_forms_and_language_read_from_mo_headers(tmp_path):
    mo = make_mo(
        tmp_path / "fr.mo",
        [
            polib.POEntry(
                msgid="%d file", msgid_plural="%d files", msgstr_plural={0: "%d fichier", 1: "%d fichiers"}
            )
        ],
        "fr",
        "nplurals=2; plural=(n > 1);",
    )
    header, entries = read_mo(mo.read_bytes())
    assert header["Language"] == "fr" and header["Plural-Forms"] == "nplurals=2; plural=(n > 1);"
    assert entries[0].msgstr == ("%d fichier", "%d fichiers")
    votes = header_votes(header)
    assert votes == {("Plural-Forms", "nplurals=2; plural=(n > 1);"): 1, ("Language", "fr"): 1}
    assert header_votes({"Plural-Forms": "nplurals=INTEGER; plural=EXPRESSION;"})[
        ("Plural-Forms", "(missing)")
    ]
    assert header_votes({"Plural-Forms": "nplurals=2; plural=n >>> 1;"})[("Plural-Forms", "(unreadable)")]
    assert header_votes({})[("Language", "(missing)")] == 1


def test_spellings_of_one_rule_count_as_one_and_the_majority_wins():
    votes = {
        "nplurals=2; plural=(n > 1);": 5,
        "nplurals=2; plural=n>1;": 2,  # the same rule, spelled otherwise
        "nplurals=2; plural=(n != 1);": 6,  # a different rule (0 takes the plural)
        "(missing)": 40,
    }
    assert plural_groups(votes) == {"nplurals=2; plural=(n > 1);": 7, "nplurals=2; plural=(n != 1);": 6}


def test_language_summary_in_the_manifest():
    votes = (
        header_votes({"Language": "pt_BR", "Plural-Forms": "nplurals=2; plural=(n > 1);"})
        + header_votes({"Language": "pt_BR", "Plural-Forms": "nplurals=2; plural=(n > 1)"})
        + header_votes({"Language": "pt-BR", "Plural-Forms": "nplurals=2; plural=(n != 1);"})
        + header_votes({"Language": "", "Plural-Forms": ""})
    )
    record = language_summary(language("pt_BR"), votes)
    assert record["code"] == "pt_BR" and record["catalogs"] == 4
    assert (record["gettext_language"], record["gettext_language_catalogs"]) == ("pt_BR", 2)
    assert record["plural_forms"] == "nplurals=2; plural=(n > 1);" and record["plural_forms_catalogs"] == 2
    assert (record["nplurals"], record["plural"]) == (2, "(n > 1)")
    assert record["plural_forms_unread"] == {"(missing)": 1}


def test_parse_plural_forms():
    french = parse_plural_forms("nplurals=2;   plural=(n > 1)")
    assert french.header == "nplurals=2; plural=(n > 1);"
    assert [french.index(n) for n in (0, 1, 2, 100)] == [0, 0, 1, 1]
    cldr = parse_plural_forms(
        "nplurals=3; plural=(n == 0 || n == 1) ? 0 : n != 0 && n % 1000000 == 0 ? 1 : 2;"
    )
    assert [cldr.index(n) for n in (1, 2, 10**6)] == [0, 2, 1]
    assert (
        parse_plural_forms("nplurals=2; plural=n != 1;").signature()
        == parse_plural_forms("nplurals=2; plural=(n == 1 ? 0 : 1);").signature()
    )
    for bad in [
        "plural=(n != 1);",
        "nplurals=2; plural=n ++ 1;",
        "nplurals=1; plural=(n != 1);",
        "nplurals=0; plural=0;",
    ]:
        with pytest.raises(ValueError):
            parse_plural_forms(bad)


# --------------------------------------------------------------------------------------------
# Packages: catalogs per language, help with a region code, a whole build


def make_deb(cache: Path, package: str, files: dict[str, bytes], version: str = "1.0-1") -> Path:
    root = cache / f"root-{package}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: {version}\nArchitecture: all\nMaintainer: Test <t@example.org>\n"
        "Description: test package\n"
    )
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    deb = cache / f"{package}_{version}_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "-b", str(root), str(deb)],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(root)
    return deb


CATALOGS = {  # locale directory: (Language header, Plural-Forms, translation of "Open file")
    "es": ("es", "nplurals=2; plural=(n != 1);", "Abrir archivo"),
    "es_MX": ("es_MX", "nplurals=2; plural=(n != 1);", "Abrir archivo (MX)"),
    "fr": ("fr", "nplurals=2; plural=(n > 1);", "Ouvrir le fichier"),
    "fr_CA": ("fr_CA", "nplurals=2; plural=(n > 1);", "Ouvrir le fichier (CA)"),
    "pt": ("pt", "nplurals=2; plural=(n != 1);", "Abrir ficheiro"),
    "pt_BR": ("pt_BR", "nplurals=2; plural=(n > 1);", "Abrir arquivo"),
}


def catalog_files(tmp_path: Path, catalogs: dict[str, tuple[str, str, str]]) -> dict[str, bytes]:
    files = {}
    for directory, (code, plural, translation) in catalogs.items():
        entries = [
            polib.POEntry(msgid="Open file", msgstr=translation),
            polib.POEntry(msgid="Quit", msgstr=f"Quit ({directory})"),
        ]
        mo = make_mo(tmp_path / "mo" / directory / "app.mo", entries, code, plural)
        files[f"usr/share/locale/{directory}/LC_MESSAGES/app.mo"] = mo.read_bytes()
    return files


@needs_dpkg
@pytest.mark.parametrize(
    ("code", "expected", "plural"),
    [
        ("es", {"Abrir archivo"}, "nplurals=2; plural=(n != 1);"),
        ("fr", {"Ouvrir le fichier"}, "nplurals=2; plural=(n > 1);"),
        ("pt_BR", {"Abrir arquivo"}, "nplurals=2; plural=(n > 1);"),
        ("de", set(), None),
    ],
)
def test_catalogs_of_a_package_per_language(tmp_path, code, expected, plural):
    deb = make_deb(tmp_path, "app-data", catalog_files(tmp_path, CATALOGS))
    pairs, _dropped, votes = read_catalog_package("app-data", deb, language(code))
    assert {p.target for p in pairs if p.source == "Open file"} == expected
    record = language_summary(language(code), votes)
    assert record["plural_forms"] == plural
    assert record["catalogs"] == len(expected)


HELP_EN = '<html><body><h1 id="hd_id1">Insert Table</h1><p id="par_id2">Inserts a table.</p></body></html>'
HELP_PT = (
    '<html><body><h1 id="hd_id1">Inserir tabela</h1><p id="par_id2">Insere uma tabela.</p></body></html>'
)
HELP_ES = (
    '<html><body><h1 id="hd_id1">Insertar tabla</h1><p id="par_id2">Inserta una tabla.</p></body></html>'
)


def help_debs(cache: Path) -> dict[str, Path]:
    page = "text/swriter/table.html"
    base = "usr/share/libreoffice/help"
    return {
        "en": make_deb(cache, "libreoffice-help-en-us", {f"{base}/en-US/{page}": HELP_EN.encode()}),
        "pt_BR": make_deb(cache, "libreoffice-help-pt-br", {f"{base}/pt-BR/{page}": HELP_PT.encode()}),
        "es": make_deb(cache, "libreoffice-help-es", {f"{base}/es/{page}": HELP_ES.encode()}),
    }


def test_help_page_pattern_with_a_region():
    pattern = help_page_pattern("pt-BR")
    assert pattern.search("./usr/share/libreoffice/help/pt-BR/text/swriter/table.html")
    assert pattern.search("./usr/share/libreoffice/help/en-US/text/swriter/table.html")
    assert not pattern.search("./usr/share/libreoffice/help/pt/text/swriter/table.html")
    assert not pattern.search("./usr/share/libreoffice/help/pt-BR/noscript.html")


@needs_dpkg
def test_help_aligned_for_a_language_code_with_a_region(tmp_path):
    debs = help_debs(tmp_path)
    pairs, dropped = read_help_packages(debs["pt_BR"], debs["en"], language("pt_BR"))
    assert {(p.source, p.target) for p in pairs} == {
        ("Insert Table", "Inserir tabela"),
        ("Inserts a table.", "Insere uma tabela."),
    }
    assert {p.package for p in pairs} == {"libreoffice-help-pt-br"}
    assert {p.origin for p in pairs} == {"text/swriter/table.html"}
    assert not dropped


def synthetic_inputs(tmp_path: Path) -> tuple[Path, Path]:
    """A ranked list and a package cache holding every package a build asks for (so no apt-get)."""
    cache = tmp_path / "cache"
    cache.mkdir(parents=True)
    ranked = tmp_path / "ranked.tsv"
    ranked.write_text("libreoffice-l10n-LANG\t9\napp-data\t8\ngrub-common\t7\nunseen-data\t6\n")
    catalogs = catalog_files(tmp_path, CATALOGS)
    # grub is a test family (tests/test_corpus.py): its pair of the same source is not novel
    make_deb(cache, "app-data", catalogs)
    make_deb(
        cache,
        "grub-common",
        catalog_files(tmp_path, {d: (c, p, t + "!") for d, (c, p, t) in CATALOGS.items()}),
    )
    make_deb(cache, "unseen-data", catalogs)
    for lang in ("es", "pt-br"):
        make_deb(cache, f"libreoffice-l10n-{lang}", catalogs, "4:7.4.7-1")
    help_debs(cache)
    return ranked, cache


def synthetic_build(tmp_path: Path, code: str) -> tuple[Path, dict]:
    ranked, cache = synthetic_inputs(tmp_path)
    out = tmp_path / "out"
    return out, build(out, ranked, 3, cache, workers=1, dictionaries=False, lang=code)


# The sha256 of the files the builder wrote for the Spanish synthetic build before issue 31 (commit
# 34b7fcf, same input): generalising the builder to other languages changed no byte of Spanish.
EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
SPANISH_BEFORE = {
    "train": {
        "en": "767ffecf53bfe8e133d0420b7278e13092cd8419e8af1433caf72391a42e7366",
        "es": "1b8106b351e43a7824182a1ba1f28c90a935e19aa5e3f2b0669d076f46764e90",
        "jsonl": "8d2a1bd89d6ba981434815eacf6eb6eccd398ddaa91e8a733f7f23dacb853890",
    },
    "valid": {"en": EMPTY, "es": EMPTY, "jsonl": EMPTY},
    "test": {
        "en": "88de73a0f4d619f0d09f8dd7775fcf84e20bf27e79a36684d352199c0403130a",
        "es": "da181ac41941b5737cab7b75bf8a8aec231cad85b0954078cf78ad968436152d",
        "jsonl": "f2a3f1567e9b16f5167cbb8cfb491ed93d9ee9b54c497c868ef5a39633918473",
    },
}


@needs_dpkg
def test_synthetic_build_spanish_unchanged_and_brazilian(tmp_path):
    out, manifest = synthetic_build(tmp_path / "es", "es")
    assert manifest["counts"] == {"train": 4, "valid": 0, "test": 2}
    assert (out / "train.es").read_text(encoding="utf-8").splitlines() == [
        "Insertar tabla",
        "Inserta una tabla.",
        "Abrir archivo",
        "Quit (es)",
    ]
    assert manifest["sha256"] == SPANISH_BEFORE
    assert manifest["language"]["plural_forms"] == "nplurals=2; plural=(n != 1);"
    assert manifest["language"]["gettext_language"] == "es"

    out, manifest = synthetic_build(tmp_path / "pt_BR", "pt_BR")
    assert manifest["language"]["code"] == "pt_BR"
    assert not (out / "train.es").exists()
    assert (out / "train.pt_BR").read_text(encoding="utf-8").splitlines() == [
        "Inserir tabela",
        "Insere uma tabela.",
        "Abrir arquivo",
        "Quit (pt_BR)",
    ]
    assert set(manifest["sha256"]["train"]) == {"en", "pt_BR", "jsonl"}
    assert "libreoffice-l10n-pt-br" in manifest["packages"] and "unseen-data" not in manifest["packages"]
    assert manifest["families"]["test"] == ["grub"]  # the same families are held out in every language
    assert (manifest["language"]["gettext_language"], manifest["language"]["plural_forms"]) == (
        "pt_BR",
        "nplurals=2; plural=(n > 1);",
    )
    assert manifest["language"]["catalogs"] == 3  # app-data, grub-common, libreoffice-l10n-pt-br


# --------------------------------------------------------------------------------------------
# runtime/languages.py


def test_normalise_code():
    assert [normalise_code(c) for c in ("pt-BR", "pt-br", "PT_br", "ES", " fr ")] == ["pt_BR"] * 3 + [
        "es",
        "fr",
    ]


def test_runtime_table_from_manifests(tmp_path):
    manifest = tmp_path / "manifest.json"
    record = language_summary(
        language("it"), header_votes({"Language": "it", "Plural-Forms": "nplurals=2; plural=(n != 1);"})
    )
    manifest.write_text(json.dumps({"language": record}))
    table = runtime_table([manifest])
    assert table["languages"]["it"] == {
        "language": "it",
        "plural_forms": "nplurals=2; plural=(n != 1);",
        "catalogs": 1,
        "plural_forms_catalogs": 1,
        "gettext_language_catalogs": 1,
    }


def test_the_bundled_table_covers_every_language():
    assert set(runtime_languages.known_languages()) == set(LANGUAGES)
    for code in LANGUAGES:
        target = runtime_languages.target_language(code)
        assert target.plural_forms.nplurals >= 1 and target.plural_forms.index(1) == 0
        assert normalise_code(target.gettext_language) == code
    assert runtime_languages.plural_forms("pt-BR") == runtime_languages.plural_forms("pt_BR")
    with pytest.raises(KeyError):
        runtime_languages.target_language("xx")


def _msginit_header(code: str, tmp_path: Path) -> dict[str, str]:
    """The header gettext's msginit writes for a new catalog of `code`: its Language and Plural-Forms."""
    pot = tmp_path / "t.pot"
    pot.write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n')
    out = tmp_path / f"{code}.po"
    subprocess.run(
        ["msginit", "--no-translator", f"--locale={code}.UTF-8", "-i", str(pot), "-o", str(out)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return polib.pofile(str(out)).metadata


@pytest.mark.skipif(shutil.which("msginit") is None, reason="gettext's msginit")
@pytest.mark.parametrize("code", list(LANGUAGES))
def test_the_catalogs_agree_with_what_gettext_knows(code, tmp_path):
    """gettext's own table (compiled into msginit) and the catalogs' majority: the same code, and plural
    rules that compute the same forms."""
    header = _msginit_header(code, tmp_path)
    target = runtime_languages.target_language(code)
    assert target.gettext_language == header["Language"]
    assert target.plural_forms.signature() == parse_plural_forms(header["Plural-Forms"]).signature()


def test_read_split_follows_the_corpus_target_language(tmp_path):
    from runtime.splits import read_split, target_language

    (tmp_path / "train.en").write_text("Open\nSave\n", encoding="utf-8")
    (tmp_path / "train.fr").write_text("Ouvrir\nEnregistrer\n", encoding="utf-8")
    (tmp_path / "train.es").write_text("Abrir\nGuardar\n", encoding="utf-8")
    assert target_language(tmp_path) == "es"  # no manifest: a corpus from before --lang
    assert read_split(tmp_path, "train") == [("Open", "Abrir"), ("Save", "Guardar")]
    (tmp_path / "manifest.json").write_text('{"language": {"code": "fr"}}', encoding="utf-8")
    assert read_split(tmp_path, "train") == [("Open", "Ouvrir"), ("Save", "Enregistrer")]
