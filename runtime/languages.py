"""Target languages at run time: the gettext ``Language`` code and ``Plural-Forms`` of each (torch-free).

Filling a catalog for a target language needs its plural rule (how many ``msgstr[i]`` an entry with
``msgid_plural`` has, and which one a count selects) and the code its header's ``Language:`` names.
Both come from data, not from a table typed by hand: ``runtime/languages.json`` records, per language,
the rule and the code that most of its Debian catalogs declare (``python -m model.corpus`` counts the
headers of every catalog it reads, ``python -m model.languages`` writes the file from the manifests).

Why the catalogs and not gettext's own table: Debian ships gettext's plural table only compiled into
``msginit`` (no file to read), and the catalogs are what the translators of these very packages agreed
on. tests/test_languages.py checks that the two agree wherever ``msginit`` is installed.
"""

from __future__ import annotations

import gettext
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA_FILE = Path(__file__).with_name("languages.json")
_PLURAL_FORMS = re.compile(r"^\s*nplurals\s*=\s*(\d+)\s*;\s*plural\s*=\s*(.+?)\s*;?\s*$", re.S)
# Counts a rule is tried on to tell rules apart and to check it names no form past nplurals: every count
# up to 1000 (the rules of these languages look at n % 10, n % 100 and n > 1) and the millions that
# newer French, Spanish and Italian rules single out (``n % 1000000 == 0``).
_SAMPLE_COUNTS = (*range(1001), 10**6, 10**6 + 1, 2 * 10**6, 10**9)


def normalise_code(code: str) -> str:
    """``pt-BR``, ``pt-br`` and ``pt_BR`` -> ``pt_BR``; ``ES`` -> ``es``."""
    language, _, region = code.strip().replace("-", "_").partition("_")
    return f"{language.lower()}_{region.upper()}" if region else language.lower()


@cache
def _compiled(plural: str):  # noqa: ANN202 - gettext's compiled rule: int -> int
    return gettext.c2py(plural)


@dataclass(frozen=True)
class PluralForms:
    """A gettext plural rule: the number of forms and the C expression that picks one for a count."""

    nplurals: int
    plural: str

    @property
    def header(self) -> str:
        """The ``Plural-Forms`` header value, in one spelling: ``nplurals=2; plural=(n != 1);``."""
        return f"nplurals={self.nplurals}; plural={self.plural};"

    def index(self, n: int) -> int:
        """Which ``msgstr[i]`` a count selects."""
        return int(_compiled(self.plural)(n))

    def signature(self) -> tuple[int, tuple[int, ...]]:
        """What the rule computes (equal for ``(n != 1)``, ``n != 1`` and ``n == 1 ? 0 : 1``)."""
        return self.nplurals, tuple(self.index(n) for n in _SAMPLE_COUNTS)


def parse_plural_forms(header: str) -> PluralForms:
    """Parse a ``Plural-Forms`` value; ValueError when gettext cannot evaluate it or it picks a form
    past ``nplurals``."""
    match = _PLURAL_FORMS.match(header)
    if match is None:
        raise ValueError(f"not a Plural-Forms header: {header!r}")
    forms = PluralForms(int(match.group(1)), " ".join(match.group(2).split()))
    if forms.nplurals < 1:
        raise ValueError(f"nplurals must be at least 1: {header!r}")
    try:
        highest = max(forms.index(n) for n in _SAMPLE_COUNTS)
    except (ValueError, SyntaxError, RecursionError, ZeroDivisionError) as error:
        raise ValueError(f"gettext cannot evaluate {header!r}: {error}") from error
    if highest >= forms.nplurals:
        raise ValueError(f"{header!r} selects form {highest} of {forms.nplurals}")
    return forms


@dataclass(frozen=True)
class TargetLanguage:
    code: str  # as the corpus and the service name it: es, pt_BR
    gettext_language: str  # what a catalog's "Language:" header says
    plural_forms: PluralForms


@cache
def _table() -> dict[str, dict]:
    return json.loads(DATA_FILE.read_text(encoding="utf-8"))["languages"]


def known_languages() -> tuple[str, ...]:
    return tuple(_table())


def target_language(code: str) -> TargetLanguage:
    """The Language code and plural rule of a target language; KeyError for one without data."""
    key = normalise_code(code)
    record = _table().get(key)
    if record is None:
        raise KeyError(f"no plural forms for {code!r}: {DATA_FILE.name} has {', '.join(_table())}")
    return TargetLanguage(key, record["language"], parse_plural_forms(record["plural_forms"]))


def plural_forms(code: str) -> PluralForms:
    return target_language(code).plural_forms


def gettext_language(code: str) -> str:
    return target_language(code).gettext_language
