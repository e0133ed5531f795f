"""Hunspell dictionaries in pure Python: an affix file's rules and a dictionary entry's word forms, for
model/lexicon.py.

The subset of the affix format that Debian's hunspell-es, -fr, -de-de, -it and -pt-br use, and a little
more: flags of one character (`FLAG UTF-8`, or no FLAG line, as it_IT.aff and de_DE.aff have), of two
(`FLAG long`: fr.aff's `L'`, `D'`) or numbers (`FLAG num`: `/101,202`), flag aliases (`AF`), PFX/SFX with
conditions and continuation classes, and the flags that say a form is no word by itself: NEEDAFFIX (a
stem that only counts with an affix, as fr.aff marks most of its stems), ONLYINCOMPOUND and CIRCUMFIX
(de_DE.aff's joining forms), FORBIDDENWORD (pt_BR.dic blocks forms the rules over-generate). ICONV (the
input conversion, fr.aff's ’ -> ') and the compound flags are read for the lexicon's reader, which
applies them to the words it is asked about.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# The affix file's options that name one flag each (the flag a stem or a continuation class carries).
FLAG_OPTIONS = (
    "NEEDAFFIX",
    "ONLYINCOMPOUND",
    "CIRCUMFIX",
    "FORBIDDENWORD",
    "COMPOUNDFLAG",
    "COMPOUNDBEGIN",
    "COMPOUNDMIDDLE",
    "COMPOUNDEND",
    "COMPOUNDPERMITFLAG",
    "COMPOUNDFORBIDFLAG",
)


@dataclass(frozen=True, slots=True)
class Rule:
    strip: str
    add: str
    flags: tuple[str, ...]  # continuation class: flags the derived form carries
    condition: re.Pattern[str]


@dataclass(frozen=True, slots=True)
class Affix:
    prefix: bool
    cross: bool  # may combine with an affix of the other kind
    rules: tuple[Rule, ...]


@dataclass
class AffixFile:
    """The rules of a .aff file and the options the lexicon needs."""

    affixes: dict[str, Affix] = field(default_factory=dict)
    flag_mode: str = "char"  # char (FLAG UTF-8 or none), long (two characters) or num
    aliases: list[tuple[str, ...]] = field(default_factory=list)  # AF: /1 is aliases[0]
    options: dict[str, str] = field(default_factory=dict)  # NEEDAFFIX -> its flag, ...
    compound_min: int = 3  # COMPOUNDMIN, hunspell's default
    iconv: list[tuple[str, str]] = field(default_factory=list)
    # Elided articles and pronouns the prefix rules add (fr.aff's l', qu', jusqu'; it_IT.aff's dell',
    # un'), each with the initials of the words it may stand before ("": any). These rules are not
    # expanded: with them, fr.dic gives 2.4 million forms where it has 0.45 million without (one per
    # particle and word), and the lexicon's reader accepts a particle before a known word instead.
    elision: dict[str, str] = field(default_factory=dict)

    def flags(self, text: str) -> tuple[str, ...]:
        """The flags of a .dic entry or a continuation class, as the FLAG option spells them."""
        if not text:
            return ()
        if self.aliases and text.isdigit():
            return self.aliases[int(text) - 1]
        if self.flag_mode == "long":
            return tuple(text[i : i + 2] for i in range(0, len(text) - 1, 2))
        if self.flag_mode == "num":
            return tuple(f for f in (p.strip() for p in text.split(",")) if f)
        return tuple(text)

    def flag(self, option: str) -> str | None:
        return self.options.get(option)

    def __getitem__(self, flag: str) -> Affix:
        return self.affixes[flag]

    def __contains__(self, flag: object) -> bool:
        return flag in self.affixes

    def get(self, flag: str) -> Affix | None:
        return self.affixes.get(flag)


def _condition(cond: str, prefix: bool) -> re.Pattern[str]:
    """A hunspell condition (`[^aeiou]r`, `.`) as a regex anchored at the stem's start or end."""
    body = "" if cond == "." else re.sub(r"[^\[\]^.\w]", lambda m: re.escape(m.group()), cond)
    return re.compile(f"^(?:{body})" if prefix else f"(?:{body})$")


def _lines(path: Path) -> list[list[str]]:
    text = path.read_text(encoding="utf-8", errors="replace").lstrip("\ufeff")  # pt_BR.aff has a BOM
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def read_affixes(aff: Path) -> AffixFile:
    """The AffixFile of a .aff file. ValueError for a flag type this reader does not know."""
    lines = _lines(aff)
    out = AffixFile()
    for parts in lines:
        key = parts[0]
        if key == "FLAG" and len(parts) > 1:
            mode = parts[1].lower()
            if mode not in ("utf-8", "long", "num"):
                raise ValueError(f"{aff}: FLAG {parts[1]} is not supported (UTF-8, long or num)")
            out.flag_mode = "char" if mode == "utf-8" else mode
        elif key in FLAG_OPTIONS and len(parts) > 1:
            out.options[key] = parts[1]
        elif key == "COMPOUNDMIN" and len(parts) > 1:
            out.compound_min = int(parts[1])
        elif key == "ICONV" and len(parts) == 3:
            out.iconv.append((parts[1], parts[2]))
    # AF lines after the FLAG line is known: their first line is the count, the rest flag sets.
    af = [p for p in lines if p[0] == "AF" and len(p) > 1]
    out.aliases = [out.flags(p[1]) for p in af[1:]] if af and af[0][1].isdigit() else []
    pending: dict[str, tuple[bool, bool, list[Rule]]] = {}
    for parts in lines:
        if len(parts) < 4 or parts[0] not in ("PFX", "SFX"):
            continue
        prefix, flag = parts[0] == "PFX", parts[1]
        if flag not in pending:  # the header line: PFX flag Y|N count
            pending[flag] = (prefix, parts[2] == "Y", [])
            continue
        strip = "" if parts[2] == "0" else parts[2]
        add, _, cont = parts[3].partition("/")
        cond = parts[4] if len(parts) > 4 else "."
        if prefix and ("'" in add or "’" in add):
            _elision(out.elision, add, strip or cond)
            continue
        rule = Rule(strip, "" if add == "0" else add, out.flags(cont), _condition(cond, prefix))
        pending[flag][2].append(rule)
    out.affixes = {flag: Affix(p, cross, tuple(rules)) for flag, (p, cross, rules) in pending.items()}
    return out


def _elision(table: dict[str, str], add: str, cond: str) -> None:
    """Record an elision rule's particle (up to its apostrophe, lowercased) and the initials its
    condition allows: `[aeiouh]`, or a letter the rule strips (`l'A` for a); "" for any."""
    cut = max(add.rfind("'"), add.rfind("’")) + 1
    particle = add[:cut].lower().replace("’", "'")
    if cond.startswith("[") and not cond.startswith("[^") and "]" in cond:
        initials = cond[1 : cond.index("]")].lower()
    elif cond[0] not in ".[":
        initials = cond[0].lower()
    else:
        initials = ""  # any: `.` or a negated class
    if table.get(particle, None) == "" or initials == "":
        table[particle] = ""
    else:
        table[particle] = "".join(sorted(set(table.get(particle, "")) | set(initials)))


def read_stems(dic: Path) -> Iterator[tuple[str, str]]:
    """(stem, flags as written) of each entry of a .dic file: its first line is the entry count; lines
    that start with a tab are comments (de_DE.dic's header), and so are `/ ...` lines (it_IT.dic's);
    `\\/` is a slash of the word itself."""
    with dic.open(encoding="utf-8", errors="replace") as f:
        next(f, None)
        for line in f:
            if not line.strip() or line[0] in " \t":
                continue
            entry = line.split()[0].replace("\\/", "\x00")
            stem, _, flags = entry.partition("/")
            if stem:
                yield stem.replace("\x00", "/"), flags


@dataclass(frozen=True, slots=True)
class Form:
    """A word form and how it was made: the stem's flags, and the continuation class of each affix
    applied (prefix or not), in order."""

    word: str
    root: tuple[str, ...]
    steps: tuple[tuple[bool, tuple[str, ...]], ...] = ()


def _apply(word: str, affix: Affix) -> Iterable[tuple[str, tuple[str, ...]]]:
    for r in affix.rules:
        if affix.prefix:
            if word.startswith(r.strip) and r.condition.search(word):
                yield r.add + word[len(r.strip) :], r.flags
        elif word.endswith(r.strip) and r.condition.search(word):
            yield word[: len(word) - len(r.strip)] + r.add, r.flags


def forms(stem: str, flags: str | tuple[str, ...], aff: AffixFile) -> list[Form]:
    """Every form of one entry, with how it was made: the stem, its suffixed forms (twice: twofold
    suffixes), each of those with the entry's cross-product prefixes and with the prefixes of their
    continuation class, and the prefixed stem with the suffixes of the prefix's continuation class."""
    root = aff.flags(flags) if isinstance(flags, str) else flags
    out = [Form(stem, root)]
    prefixes = [aff[f] for f in root if f in aff and aff[f].prefix]

    def suffixed(word: str, fl: tuple[str, ...], depth: int, before: tuple) -> None:
        for f in fl:
            affix = aff.get(f)
            if affix is None or affix.prefix:
                continue
            for form, cont in _apply(word, affix):
                steps = (*before, (False, cont))
                out.append(Form(form, root, steps))
                if affix.cross:
                    for p in prefixes:
                        if p.cross:
                            out.extend(Form(w, root, (*steps, (True, c))) for w, c in _apply(form, p))
                if cont and depth < 2:
                    suffixed(form, cont, depth + 1, steps)
                    for c in cont:  # a prefix in the continuation class
                        if c in aff and aff[c].prefix:
                            out.extend(Form(w, root, (*steps, (True, pc))) for w, pc in _apply(form, aff[c]))

    suffixed(stem, root, 1, ())
    for p in prefixes:
        for form, cont in _apply(stem, p):
            out.append(Form(form, root, ((True, cont),)))
            if cont:
                suffixed(form, cont, 2, ((True, cont),))
    return out


def expand(stem: str, flags: str | tuple[str, ...], aff: AffixFile) -> set[str]:
    """The forms of one entry that are words by themselves (see `is_word`)."""
    return {f.word for f in forms(stem, flags, aff) if is_word(f, aff)}


def _has(flags: Iterable[str], flag: str | None) -> bool:
    return flag is not None and flag in flags


def _circumfix_ok(form: Form, aff: AffixFile) -> bool:
    """A CIRCUMFIX affix counts only with one of the other kind that has the flag too."""
    mark = aff.flag("CIRCUMFIX")
    kinds = {prefix for prefix, cont in form.steps if _has(cont, mark)}
    return not kinds or kinds == {True, False}


def is_word(form: Form, aff: AffixFile) -> bool:
    """Whether a form is a word by itself: a NEEDAFFIX stem needs an affix, a NEEDAFFIX affix another
    one after it; an ONLYINCOMPOUND stem or affix, or a lone CIRCUMFIX affix, makes no word alone.
    (FORBIDDENWORD is `forbids`'s.)"""
    need, only = aff.flag("NEEDAFFIX"), aff.flag("ONLYINCOMPOUND")
    if _has(form.root, only) or any(_has(cont, only) for _, cont in form.steps):
        return False
    if not form.steps:
        return not _has(form.root, need) and not _has(form.root, aff.flag("FORBIDDENWORD"))
    return not _has(form.steps[-1][1], need) and _circumfix_ok(form, aff)


def forbids(form: Form, aff: AffixFile) -> bool:
    """Whether a form is one the dictionary forbids: an entry or an affixed form with FORBIDDENWORD."""
    mark = aff.flag("FORBIDDENWORD")
    cont = form.steps[-1][1] if form.steps else form.root
    return _has(cont, mark)


def compound_roles(form: Form, aff: AffixFile) -> str:
    """Where a form may stand in a compound: `b` first, `m` inside, `e` last (none: ""). The stem's or
    an affix's COMPOUNDFLAG/BEGIN/MIDDLE/END say which; a suffix on a part other than the last, or a
    prefix on one other than the first, needs COMPOUNDPERMITFLAG, as in hunspell."""
    flags = set(form.root).union(*(cont for _, cont in form.steps))
    anywhere = _has(flags, aff.flag("COMPOUNDFLAG"))
    if not form.word.strip("-") or form.word[0] == "-" or form.word[-1] == "-":
        return ""  # de_DE.aff's hyphenated joining forms: words are split at hyphens before the check
    if _has(flags, aff.flag("COMPOUNDFORBIDFLAG")) or not _circumfix_ok(form, aff):
        return ""
    need = aff.flag("NEEDAFFIX")
    if (_has(form.root, need) and not form.steps) or (form.steps and _has(form.steps[-1][1], need)):
        return ""
    permit = aff.flag("COMPOUNDPERMITFLAG")
    suffixes_ok = all(_has(cont, permit) for prefix, cont in form.steps if not prefix)
    prefixes_ok = all(_has(cont, permit) for prefix, cont in form.steps if prefix)
    roles = ""
    if (anywhere or _has(flags, aff.flag("COMPOUNDBEGIN"))) and suffixes_ok:
        roles += "b"
    if (anywhere or _has(flags, aff.flag("COMPOUNDMIDDLE"))) and suffixes_ok and prefixes_ok:
        roles += "m"
    if (anywhere or _has(flags, aff.flag("COMPOUNDEND"))) and prefixes_ok:
        roles += "e"
    return roles
