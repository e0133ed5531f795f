"""Language codes: the one place where a code a client sends becomes a code the server serves.

Manifests and clients spell codes in several ways (`pt_BR` from the training side, `pt-BR` in BCP-47,
`pt` from LibreTranslate clients, any case). Every transport resolves through `resolve_code`, so gRPC
and HTTP accept the same spellings and route the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

# The project's one normalisation of a code (gettext's form, pt_BR): routing compares codes by it.
from runtime.languages import normalise_code

Pair = tuple[str, str]

# What an empty pair means: the pair every client before multi-model serving asked for.
DEFAULT_PAIR: Pair = ("en", "es")

# Display names for /languages (LibreTranslate shows a name per code); an unknown code shows its code.
NAMES = {
    "en": "English",
    "es": "Spanish",
    "fr": "French",
    "de": "German",
    "it": "Italian",
    "pt": "Portuguese",
    "pt-BR": "Portuguese (Brazil)",
}


def bcp47(code: str) -> str:
    """`code` as BCP-47 writes it, for display (/languages, messages): "pt_br" -> "pt-BR",
    "ZH-hant" -> "zh-Hant"."""
    parts = [p for p in code.strip().replace("_", "-").split("-") if p]
    if not parts:
        return ""
    out = [parts[0].lower()]
    for p in parts[1:]:
        if len(p) == 2 or (len(p) == 3 and p.isdigit()):
            out.append(p.upper())  # region
        elif len(p) == 4 and p.isalpha():
            out.append(p.title())  # script
        else:
            out.append(p.lower())
    return "-".join(out)


def primary(code: str) -> str:
    """The language subtag: "pt-BR" -> "pt"."""
    return normalise_code(code).partition("_")[0]


def resolve_code(code: str, served: Iterable[str]) -> str | None:
    """The served code that `code` names, or None.

    Case and `_`/`-` do not matter. A bare language ("pt") names the one served variety of it ("pt-BR");
    a variety ("pt-BR") names a bare served language ("pt") when that is all there is. One variety never
    stands for another (pt-PT is not pt-BR), and an ambiguous bare language names none."""
    wanted = normalise_code(code)
    if not wanted:
        return None
    served = list(dict.fromkeys(served))
    for s in served:
        if normalise_code(s) == wanted:
            return s
    lang = primary(wanted)
    same = [s for s in served if primary(s) == lang]
    if wanted == lang:
        return same[0] if len(same) == 1 else None
    bare = [s for s in same if normalise_code(s) == lang]
    return bare[0] if bare else None


def name_of(code: str) -> str:
    return NAMES.get(bcp47(code), NAMES.get(primary(code), code))


def show_pairs(pairs: Iterable[Pair]) -> str:
    """Pairs as error messages list them: "en -> es, en -> de"."""
    return ", ".join(f"{bcp47(s)} -> {bcp47(t)}" for s, t in pairs)
