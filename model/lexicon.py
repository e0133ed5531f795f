"""The lexicon of a model bundle: every word form of the target language's Debian hunspell dictionary,
for the text layer's lexical guard and the non-word metric (runtime/faithful/lexicon.py reads it).

    python -m model.lexicon --lang fr --out runs/lexicon-fr/lexicon.txt.gz
    # options: --hunspell /usr/share/hunspell (the .dic / .aff files model/languages.py names)

The dictionaries (`make system-deps` installs hunspell-es, -fr-classical, -de-de, -it, -pt-br) hold stems
with affix flags; model/affixes.py expands them with their own affix rules into full forms, lowercased.
Spanish only: forms of verbs (entries ending in -ar/-er/-ir/-ír) that can carry an enclitic pronoun by
their ending are marked, so that the reader can accept the enclitic forms the affix data lacks
(vuélvelo, muéstramelo) without accepting a noun plus a pronoun (Contactonos: `contacto` is no host).
What the other languages' files carry instead: French and Italian elided particles (l', dell') as a rule,
not one form per particle; German compound parts (an approximation, see runtime/faithful/lexicon.py);
Italian enclitic and Portuguese endings written once per stem (exact); Portuguese hyphenated forms
(desprestigiá-las-ia) as their parts.

Checked with `hunspell -d <dic> -l` on 5,000 forms drawn at random from each file (Debian 12), and on the
target side of each valid split (tokens as the guard sees them: no digits, acronyms or single letters):

    lang   words (expanded)  file     hunspell rejects of 5,000   valid tokens unknown: lexicon / hunspell
    es       711,103         1.66 MB  64, all lowercased names    6.41% / 6.31% (data/valid.es)
    fr       450,882         1.10 MB  102, 29 even capitalised    4.76% / 5.11%
    de       350,140 + 55,529 parts
                             0.91 MB  779 lowercased nouns,       11.17% / 12.35%
                                      14 even capitalised
    it     3,136,455         2.56 MB  8                           7.38% / 7.04%
    pt_BR 10,496,319         3.35 MB  24, 9 even capitalised      6.69% / 6.88%

The forms hunspell rejects even capitalised are acronyms and Roman numerals it wants in capitals (bce,
ccclxxvi). The valid shares differ mostly where hunspell -l reports a hyphenated word by its parts. The
German compound rule: of 2,863 one-letter misspellings of valid.de words hunspell accepts, the lexicon
accepts 21 (0.7%; hunspell 18, 0.6%), and 1,368 distinct valid.de words are known through it alone
(Menübefehle, Filterverwaltung). The pt_BR file is still over the 3 MB a committed file should take:
verbs whose flags differ keep their forms one line each (the tails classes are at most 36).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from model.affixes import compound_roles, forbids, forms, is_word, read_affixes, read_stems
from model.languages import DEFAULT_LANGUAGE, LANGUAGES, Language, language
from runtime.faithful.lexicon import LEXICON_FILE, Lexicon, is_enclitic_host, write_lexicon

HUNSPELL_DIR = Path("/usr/share/hunspell")
# The enclitic rule of runtime/faithful/lexicon.py (its pronouns, its accents) is Spanish's: the file of
# another language marks no hosts.
ENCLITIC_LANGUAGES = ("es",)
# Entries whose stem is an infinitive: their generated forms are verb forms.
_INFINITIVE = re.compile(r"(?:ar|er|ir|ír)$")
# Verb forms the dictionary lists as entries of their own, without affix flags (ir's), that take
# pronouns the affix data does not add: vámonos.
IRREGULAR_HOSTS = ("vamos",)
# The shortest compound part the reader accepts. de_DE.aff says 2 (for Öl, Ei), but two-letter parts
# (ab, an, ei, öl, um, ...) let too many misspellings split into words: measured in the module doc.
COMPOUND_MIN = 3


@dataclass
class Built:
    """What `build` read: the words (lowercased), the enclitic hosts among them (Spanish), the compound
    parts with their roles (`b`, `m`, `e`; `o`: no word by itself), the ICONV pairs, and the dictionaries
    read."""

    words: set[str] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    parts: dict[str, str] = field(default_factory=dict)
    iconv: list[tuple[str, str]] = field(default_factory=list)
    elision: dict[str, str] = field(default_factory=dict)
    dictionaries: list[str] = field(default_factory=list)


def dictionaries(hunspell_dir: Path, lang: Language) -> list[Path]:
    """The .dic files of a language in `hunspell_dir` that have their .aff, symbolic links counted once."""
    found = {p.resolve() for pattern in lang.hunspell_dicts for p in hunspell_dir.glob(f"{pattern}.dic")}
    return sorted(p for p in found if p.with_suffix(".aff").exists())


def build(hunspell_dir: Path, lang: str = DEFAULT_LANGUAGE) -> Built:
    """Every word form of a language's dictionaries (lowercased), the verb forms among them that can carry
    an enclitic pronoun (Spanish), and the compound parts (where the affix file has compound flags)."""
    target = language(lang)
    dics = dictionaries(hunspell_dir, target)
    if not dics:
        raise SystemExit(
            f"no {target.name} hunspell dictionary ({', '.join(target.hunspell_dicts)}.dic) in "
            f"{hunspell_dir}: apt-get install {target.hunspell or '(none known)'} (make system-deps)"
        )
    out = Built(dictionaries=[str(d) for d in dics])
    enclitics = target.code in ENCLITIC_LANGUAGES
    for dic in dics:
        aff = read_affixes(dic.with_suffix(".aff"))
        out.iconv += [pair for pair in aff.iconv if pair not in out.iconv]
        for particle, initials in aff.elision.items():
            known = out.elision.get(particle, initials)
            out.elision[particle] = "" if "" in (known, initials) else "".join(sorted({*known, *initials}))
        words: set[str] = set()
        forbidden: set[str] = set()  # before lowercasing: a forbidden form is one spelling
        for stem, flags in read_stems(dic):
            made = forms(stem, flags, aff)
            entry = {f.word for f in made if is_word(f, aff)}
            words |= entry
            forbidden.update(f.word for f in made if forbids(f, aff))
            for f in made:
                roles = compound_roles(f, aff)
                if roles and len(f.word) >= COMPOUND_MIN:
                    low = f.word.lower()
                    out.parts[low] = "".join(sorted(set(out.parts.get(low, "") + roles)))
            if enclitics and _INFINITIVE.search(stem) and flags:
                out.hosts.update(w for w in (x.lower() for x in entry) if is_enclitic_host(w))
        out.words |= {w.lower() for w in words - forbidden}
    if enclitics:
        out.hosts.update(h for h in IRREGULAR_HOSTS if h in out.words)
        # A verb form that is itself a host plus pronouns (dame, guárdala) is an enclitic form, not a
        # host: as a host it would accept a second round of pronouns (dámemela).
        rule = Lexicon((), out.hosts)
        out.hosts = {h for h in out.hosts if rule.enclitic_host(h) is None}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lang", default=DEFAULT_LANGUAGE, help=f"target language: {', '.join(LANGUAGES)}")
    parser.add_argument("--hunspell", type=Path, default=HUNSPELL_DIR, help="folder of the .dic / .aff files")
    parser.add_argument("--out", type=Path, help="default: models/en-LANG-small/" + LEXICON_FILE)
    args = parser.parse_args(argv)
    target = language(args.lang)
    out = args.out or Path(f"models/en-{target.code}-small") / LEXICON_FILE
    started = time.perf_counter()
    built = build(args.hunspell, target.code)
    header: dict = {
        "command": "python -m model.lexicon",
        "dictionaries": [Path(d).name for d in built.dictionaries],
    }
    if target.code == DEFAULT_LANGUAGE:  # the shipped Spanish file's header, word for word
        header["rule"] = (
            "every form of hunspell-es expanded with its affix rules, lowercased; hosts: verb forms "
            "that may carry enclitic pronouns"
        )
    else:
        header["language"] = target.code
        header["rule"] = f"every form of {target.hunspell} expanded with its affix rules, lowercased" + (
            f"; compounds: a word that splits into 2 or 3 parts of at least {COMPOUND_MIN} letters, "
            "the first marked b, a middle one m, the last e; elision: a particle before a known word "
            "that begins with one of its initials (any when none)"
            if built.parts
            else ""
        )
    size = write_lexicon(
        out,
        built.words,
        built.hosts,
        header,
        built.parts,
        built.iconv,
        COMPOUND_MIN,
        built.elision,
        target.lexicon_tails,
        hyphenated=target.code != DEFAULT_LANGUAGE,  # the shipped Spanish file stays as it was built
    )
    print(
        f"{target.code}: {len(built.words):,} words ({len(built.hosts):,} enclitic hosts, "
        f"{len(built.parts):,} compound parts) from {', '.join(header['dictionaries'])} -> {out} "
        f"({size:,} bytes) in {time.perf_counter() - started:.0f} s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
