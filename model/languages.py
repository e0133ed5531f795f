"""The target languages of the corpus: one table of per-language data, and the package-list reading.

Everything the corpus builder does differently per language is a field of ``LANGUAGES``: which locale
directories of a package count as the language's catalogs, how Debian spells the language in package
names, how LibreOffice spells it in help paths, and which bilingual dictionaries Debian has. The code
that uses the table (model/corpus.py, model/dictionaries.py) has no per-language branches.

Which locale directories count (``*/<dir>/LC_MESSAGES/*.mo``): the bare language and its "home" region,
which translation teams use for the same text (``fr`` and ``fr_FR``, ``de`` and ``de_DE``). Other
regions are left out because they are written differently, and one corpus should teach one way of
writing: ``de_CH`` has no ß, ``fr_CA`` and ``es_MX``/``es_AR`` use other words (``courriel``,
``computadora``). Brazilian Portuguese is the other way round: only ``pt_BR`` counts, since bare ``pt``
is European Portuguese (``ficheiro``/``ecrã`` where Brazil writes ``arquivo``/``tela``).

Plural forms and the gettext ``Language`` code are not in this table: they come from the headers of the
catalogs themselves (model/corpus.py records them in the manifest, ``python -m model.languages`` writes
them to runtime/languages.json for runtime/languages.py).

    python -m model.languages --manifests runs/data-*/manifest.json data/manifest.json
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from runtime.languages import DATA_FILE, PluralForms, normalise_code, parse_plural_forms
from runtime.splits import target_language

ENGLISH_HELP = "en-US"  # LibreOffice's English help, the source side of every language's help pairs
ENGLISH_HELP_PACKAGE = "libreoffice-help-en-us"
# The ranked package list names per-language packages with this placeholder: libreoffice-l10n-LANG.
PACKAGE_PLACEHOLDER = "-LANG"


@dataclass(frozen=True)
class Dictionary:
    """A bilingual dictionary package: its format and the file inside it that holds the dictionary.

    ``kind`` is ``apertium`` (``file`` is the compiled bilingual dictionary, ``eng-spa.autobil.bin``)
    or ``freedict`` (``file`` is the dictd database's name, ``freedict-eng-spa``: ``.index`` and
    ``.dict.dz``)."""

    kind: str
    package: str
    file: str


@dataclass(frozen=True)
class Language:
    """What the corpus builder needs to know about one target language."""

    code: str  # POSIX/gettext spelling: es, pt_BR; also the suffix of the target split files
    name: str
    catalog_dirs: tuple[str, ...]  # locale directories whose .mo catalogs count (see the module doc)
    debian: str  # how Debian's language-pack names spell it: libreoffice-l10n-pt-br
    help_code: str  # how LibreOffice's help paths spell it: /help/pt-BR/text/...
    dictionaries: tuple[Dictionary, ...] = ()
    apertium: str = ""  # Debian's Apertium mode for English to it (the evaluation's peer); "" = none
    # The spelling dictionary model/lexicon.py expands into the lexical guard's word list: Debian's
    # hunspell package, and which of its .dic files count (glob patterns of their names, as
    # catalog_dirs: the language and its home region; symbolic links to one file count once).
    hunspell: str = ""
    hunspell_dicts: tuple[str, ...] = ()
    # Endings the dictionary adds to whole verb paradigms (Italian enclitic pronouns: guardar+lo,
    # guardando+gliela): the lexicon file writes a stem that takes every one of them once, marked,
    # instead of one word per ending (hunspell-it's 3.1 million forms are 2.6 million such words).
    lexicon_tails: tuple[str, ...] = ()
    # Whether its model ships the text layer's dictionary terms (model/dictionary_terms.py): decided on
    # its valid split (session 48: Spanish and Brazilian Portuguese gain; German, French, Italian do not).
    dictionary_terms: bool = False

    @property
    def help_package(self) -> str:
        return f"libreoffice-help-{self.debian}"

    @property
    def help_packages(self) -> tuple[str, str]:
        """(target help, English help): the target first, it names the pairs' package."""
        return (self.help_package, ENGLISH_HELP_PACKAGE)

    @property
    def dictionary_packages(self) -> tuple[str, ...]:
        return tuple(d.package for d in self.dictionaries)

    def mo_pattern(self) -> re.Pattern[str]:
        """Matches the paths of this language's compiled catalogs inside a package."""
        dirs = "|".join(re.escape(d) for d in self.catalog_dirs)
        return re.compile(rf"/(?:{dirs})/LC_MESSAGES/[^/]+\.mo$")

    def package_name(self, listed: str) -> str:
        """A ranked package's real name: ``libreoffice-l10n-LANG`` -> ``libreoffice-l10n-pt-br``."""
        return listed.replace(PACKAGE_PLACEHOLDER, f"-{self.debian}")


def _freedict(code: str) -> Dictionary:
    return Dictionary("freedict", f"dict-freedict-eng-{code}", f"freedict-eng-{code}")


# Debian 12 has an English Apertium pair only for Spanish among these languages (`apt-cache search
# apertium`: eng-spa, eng-cat, en-gl, ... but no eng-fra/deu/ita/por); FreeDict has all five.
# dict-freedict-eng-por is FreeDict's one English-Portuguese dictionary; its words (not its spelling of
# them, which rarely differs between Brazil and Portugal for dictionary lemmas) serve pt_BR.
# French spelling: hunspell-fr-classical (what the hunspell-fr package installs first), the traditional
# spelling plus the reformed forms in wide use (événement and évènement), since the catalogs write the
# traditional one: chaîne 2,384 times in runs/data-fr/train.fr against chaine 42, boîte 2,482 against
# boite 34, apparaît 512 against apparait 11. hunspell-fr-revised (1990 reform only) would reject
# chaîne; -comprehensive would accept either spelling of every word.
# The pronouns (and pronoun pairs) it_IT.aff attaches to an infinitive or a gerund: every one of them
# follows guardar- and guardando- there.
_ITALIAN_ENCLITICS = tuple(
    "ci cisi cela cele celi celo cene gli glici gliela gliele glieli glielo gliene glisi la le leci lesi "
    "li lo mela mele meli melo mene mi mici misi ne sela sele seli selo sene si tela tele teli telo tene "
    "ti tici tisi vela vele veli velo vene vi vici visi".split()
)
# The endings pt_BR.aff adds to a stem of many nouns and adjectives (gender, number, diminutive,
# augmentative, superlative: pejorad-a, -inhas, -ões, -íssimos).
_PORTUGUESE_DERIVATIONS = tuple(
    "a as o os inha inhas inho inhos ona onas ão ões íssima íssimas íssimo íssimos amente zinha zinhas "
    "zinho zinhos zona zonas zão zões or ora oras ores "
    # and those of a verb of the first conjugation: frontar, fronto, frontávamos, frontássemos
    "ada adas ado ados ai ais am amos ando ar ara aram aras ardes arei areis arem aremos ares aria ariam "
    "arias armos ará arás arão aríamos aríeis asse assem asses aste astes ava avam avas e ei eis em emos "
    "es ou á áramos áreis ásseis ássemos ávamos áveis ante antes".split()
)
LANGUAGES: dict[str, Language] = {
    lang.code: lang
    for lang in (
        Language(
            "es",
            "Spanish",
            ("es", "es_ES"),
            "es",
            "es",
            (Dictionary("apertium", "apertium-eng-spa", "eng-spa.autobil.bin"), _freedict("spa")),
            apertium="eng-spa",  # the mode apertium-eng-spa installs (no en-es in Debian 12)
            hunspell="hunspell-es",
            hunspell_dicts=("es_*",),  # all of them, as the shipped lexicon was built: links to es_ES.dic
            dictionary_terms=True,
        ),
        Language(
            "fr",
            "French",
            ("fr", "fr_FR"),
            "fr",
            "fr",
            (_freedict("fra"),),
            hunspell="hunspell-fr-classical",
            hunspell_dicts=("fr", "fr_FR"),
        ),
        Language(
            "de",
            "German",
            ("de", "de_DE"),
            "de",
            "de",
            (_freedict("deu"),),
            hunspell="hunspell-de-de",
            hunspell_dicts=("de", "de_DE"),
        ),
        Language(
            "it",
            "Italian",
            ("it", "it_IT"),
            "it",
            "it",
            (_freedict("ita"),),
            hunspell="hunspell-it",
            hunspell_dicts=("it", "it_IT"),
            lexicon_tails=_ITALIAN_ENCLITICS,
        ),
        Language(
            "pt_BR",
            "Brazilian Portuguese",
            ("pt_BR",),
            "pt-br",
            "pt-BR",
            (_freedict("por"),),
            hunspell="hunspell-pt-br",
            hunspell_dicts=("pt_BR",),
            lexicon_tails=_PORTUGUESE_DERIVATIONS,
            dictionary_terms=True,
        ),
    )
}
DEFAULT_LANGUAGE = "es"
# Every dictionary of every language: a pair from one of these is a word, not a string a program ships.
ALL_DICTIONARY_PACKAGES = frozenset(p for lang in LANGUAGES.values() for p in lang.dictionary_packages)


def corpus_language(data: Path) -> Language:
    """The target language of the corpus in `data` (runtime.splits.target_language: its manifest's)."""
    return language(target_language(data))


def manifest_language(manifest: dict) -> Language:
    """The target language of a corpus manifest (model.corpus; older Spanish manifests do not say)."""
    return language(manifest.get("language", {}).get("code", DEFAULT_LANGUAGE))


def language(code: str) -> Language:
    """The table entry of a language code (``pt_BR``, ``pt-BR`` and ``pt-br`` are one language)."""
    key = normalise_code(code)
    if key not in LANGUAGES:
        raise KeyError(f"unknown target language {code!r}: one of {', '.join(LANGUAGES)}")
    return LANGUAGES[key]


def read_package_list(path: Path, top: int, lang: str = DEFAULT_LANGUAGE) -> list[str]:
    """The first `top` packages of the ranked list, language packs named for `lang`.

    The rank is the list's, the same for every language, so the packages past `top` (kept out of
    training for unseen tests and evaluations) are the same in every language."""
    target = language(lang)
    names = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        names.append(target.package_name(line.split("\t")[0]))
    return names[:top]


# --------------------------------------------------------------------------------------------
# Plural forms and the Language code, as the catalogs declare them


def catalog_header(text: str) -> dict[str, str]:
    """The fields of a catalog's header entry (the msgstr of msgid "")."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            fields[key.strip()] = value.strip()
    return fields


def header_votes(header: dict[str, str]) -> Counter:
    """One catalog's vote: its Plural-Forms (in canonical spelling) and its Language code.

    A Plural-Forms that gettext could not evaluate counts as unreadable; a missing or placeholder field
    (``Language: ``, ``nplurals=INTEGER``, both left by ``msginit`` templates) counts as missing."""
    votes: Counter = Counter()
    plural = header.get("Plural-Forms", "")
    if plural and "INTEGER" not in plural:
        try:
            votes["Plural-Forms", parse_plural_forms(plural).header] += 1
        except ValueError:
            votes["Plural-Forms", "(unreadable)"] += 1
    else:
        votes["Plural-Forms", "(missing)"] += 1
    code = header.get("Language", "")
    votes["Language", code if code else "(missing)"] += 1
    return votes


def _majority(votes: dict[str, int]) -> tuple[str | None, int]:
    readable = {k: v for k, v in votes.items() if not k.startswith("(")}
    if not readable:
        return None, 0
    best = max(sorted(readable), key=lambda k: readable[k])
    return best, readable[best]


def plural_groups(votes: dict[str, int]) -> dict[str, int]:
    """Catalog counts per plural rule, spellings that compute the same forms counted as one rule
    (``plural=(n != 1)``, ``plural=n != 1``, ``plural=n == 1 ? 0 : 1``), named by their commonest
    spelling. Unreadable and missing headers are left out."""
    groups: dict[tuple, Counter] = {}
    for header, count in votes.items():
        if header.startswith("("):
            continue
        forms = parse_plural_forms(header)
        groups.setdefault(forms.signature(), Counter())[header] += count
    named = {spellings.most_common(1)[0][0]: sum(spellings.values()) for spellings in groups.values()}
    return dict(sorted(named.items(), key=lambda item: (-item[1], item[0])))


def language_summary(lang: Language, votes: Counter) -> dict:
    """The manifest's `language` record: the table's data and what the catalogs declared."""
    plural_votes = {k[1]: v for k, v in votes.items() if k[0] == "Plural-Forms"}
    code_votes = {k[1]: v for k, v in votes.items() if k[0] == "Language"}
    groups = plural_groups(plural_votes)
    plural, agreeing = _majority(groups)
    code, code_count = _majority(code_votes)
    forms: PluralForms | None = parse_plural_forms(plural) if plural else None
    return {
        "code": lang.code,
        "name": lang.name,
        "catalog_dirs": list(lang.catalog_dirs),
        "help": f"{lang.help_package} ({lang.help_code}) vs {ENGLISH_HELP_PACKAGE} ({ENGLISH_HELP})",
        "dictionaries": list(lang.dictionary_packages),
        "catalogs": sum(code_votes.values()),
        "gettext_language": code,
        "gettext_language_catalogs": code_count,
        "plural_forms": forms.header if forms else None,
        "nplurals": forms.nplurals if forms else None,
        "plural": forms.plural if forms else None,
        "plural_forms_catalogs": agreeing,
        "plural_forms_rules": groups,
        "plural_forms_unread": {k: v for k, v in plural_votes.items() if k.startswith("(")},
        "language_codes": dict(Counter(code_votes).most_common(8)),
    }


# --------------------------------------------------------------------------------------------
# runtime/languages.json from the corpus manifests


def runtime_table(manifests: list[Path]) -> dict:
    """The data file runtime/languages.py reads: per language, the Language code and Plural-Forms most of
    its catalogs declare, with how many catalogs that is, taken from each corpus's manifest."""
    languages = {}
    for path in manifests:
        record = json.loads(path.read_text(encoding="utf-8")).get("language")
        if not record or not record.get("plural_forms"):
            raise SystemExit(f"{path}: no language record with plural forms (built before issue 31?)")
        languages[record["code"]] = {
            "language": record["gettext_language"],
            "plural_forms": record["plural_forms"],
            "catalogs": record["catalogs"],
            "plural_forms_catalogs": record["plural_forms_catalogs"],
            "gettext_language_catalogs": record["gettext_language_catalogs"],
        }
    return {
        "about": "Per target language, the gettext Language code and Plural-Forms header most of its "
        "Debian 12 catalogs declare (top 150 packages of the ranked list), counted by "
        "`python -m model.corpus` and written by `python -m model.languages`.",
        "languages": dict(sorted(languages.items())),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--manifests", type=Path, nargs="+", required=True, help="corpus manifest.json files")
    parser.add_argument("--out", type=Path, default=DATA_FILE)
    args = parser.parse_args(argv)
    table = runtime_table(args.manifests)
    args.out.write_text(json.dumps(table, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    for code, record in table["languages"].items():
        print(
            f"{code}: Language {record['language']}, {record['plural_forms']} "
            f"({record['plural_forms_catalogs']} of {record['catalogs']} catalogs)"
        )
    print(f"wrote {len(table['languages'])} languages to {args.out}")


if __name__ == "__main__":
    main()
