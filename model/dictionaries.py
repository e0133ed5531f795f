"""Bilingual dictionaries Debian ships, as word and phrase pairs for training.

The gettext catalogs teach software strings; they hold almost no everyday words or greetings (`Good
morning`, `cup`, `weather`), so the model composed such words from subword pieces (`Hanllo`,
`meteorono`). Two kinds of Debian package hold human-made bilingual dictionaries; which ones each target
language has (package and file names) is data in model/languages.py. For Spanish:

  1. ``apertium-eng-spa``: the Apertium pair's compiled bilingual dictionary (``eng-spa.autobil.bin``),
     about 30,000 lemma pairs with their part of speech, multiword entries included (``good morning`` ->
     ``buenos días``, ``thank you very much`` -> ``muchas gracias``). It is a finite-state transducer; its
     paths are read with ``lt-print`` (Debian's ``lttoolbox-dev``) and walked here up to the first tag.
  2. ``dict-freedict-eng-spa``: FreeDict's English-Spanish dictionary (dictd format, ~5,900 headwords).

Each entry becomes a pair as written (lower case, the lemma) and once more with a capital first letter,
as UI labels are written (``Goodbye`` -> ``Adiós``). Both sources go to the training split only: they
are no package family of the held-out packages, and the valid and test splits stay Debian's catalogs.
French, German, Italian and Brazilian Portuguese have a FreeDict dictionary and no English Apertium pair.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

from model.languages import ALL_DICTIONARY_PACKAGES, Dictionary

# Parts of speech kept from the bidix: open classes, interjections (greetings), prepositions and
# conjunctive adverbs. Proper nouns (np) are mostly names copied as they are; numbers (num) are rules.
APERTIUM_POS = frozenset({"n", "adj", "vblex", "adv", "ij", "pr", "cnjadv", "cnjsub", "cnjcoo", "np"})
LT_PRINT_TIMEOUT_S = 120
_MAX_LEMMA = 60  # characters: longer paths are not lemmas
_TAG = re.compile(r"^<[^>]+>$")


def require_lt_print() -> str:
    path = shutil.which("lt-print")
    if path is None:
        raise SystemExit(
            "lt-print is missing: it reads Apertium's compiled dictionary. "
            "Install Debian's lttoolbox-dev (`make system-deps` or `apt-get install lttoolbox-dev`)."
        )
    return path


def walk_bidix(att: str) -> Iterator[tuple[str, str, str]]:
    """(English lemma, target lemma, part of speech) for every path of an ``lt-print`` listing.

    The listing is AT&T text: ``from to input output weight`` per arc, sections split by ``--``, ``ε``
    for the empty symbol, ``<tag>`` symbols after the lemma. A path is followed until both sides have
    reached their first tag; what follows (more tags, and the loops that copy them) is not needed.
    States on a cycle are never entered: lemmas are a tree of letters, while the cycles are patterns
    (numbers, web and e-mail addresses) that are not words and would branch without end.
    """
    for section in att.split("\n--\n"):
        arcs: dict[int, list[tuple[int, str, str]]] = defaultdict(list)
        for line in section.splitlines():
            fields = line.split("\t")
            if len(fields) >= 4:
                arcs[int(fields[0])].append((int(fields[1]), fields[2], fields[3]))
        cyclic = states_on_cycles({state: [t for t, _, _ in out] for state, out in arcs.items()})
        seen: set[tuple[str, str, str]] = set()
        # (state, English so far, target so far, English tag, target tag, steps after the English tag)
        stack: list[tuple[int, str, str, str, str, int]] = [(0, "", "", "", "", 0)]
        while stack:
            state, en, es, en_tag, es_tag, after = stack.pop()
            if en_tag and es_tag:
                entry = (en, es, en_tag[1:-1])
                if entry not in seen:
                    seen.add(entry)
                    yield entry
                continue
            if after > 12 or len(en) > _MAX_LEMMA or len(es) > _MAX_LEMMA:
                continue
            for target, symbol_in, symbol_out in arcs[state]:
                if target in cyclic:
                    continue
                next_en, next_es, next_en_tag, next_es_tag, next_after = en, es, en_tag, es_tag, after
                if not en_tag:
                    if _TAG.match(symbol_in):
                        next_en_tag, next_after = symbol_in, 1
                    elif symbol_in != "ε":
                        next_en = en + symbol_in
                elif _TAG.match(symbol_in) or symbol_in == "ε":
                    next_after = after + 1
                else:
                    continue
                if not es_tag:
                    if _TAG.match(symbol_out):
                        next_es_tag = symbol_out
                    elif symbol_out != "ε":
                        next_es = es + symbol_out
                stack.append((target, next_en, next_es, next_en_tag, next_es_tag, next_after))


def states_on_cycles(graph: dict[int, list[int]]) -> set[int]:
    """States that lie on a cycle (Tarjan's strongly connected components, iteratively: a bidix has
    hundreds of thousands of states, too deep for recursion)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    cyclic: set[int] = set()
    counter = 0
    for root in list(graph):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            successors = graph.get(node, [])
            if child < len(successors):
                work.append((node, child + 1))
                nxt = successors[child]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in successors:
                    cyclic.update(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return cyclic


def clean_lemma(text: str) -> str:
    """Apertium marks the fixed part of a multiword verb with ``#`` (``thank# for``); drop the mark."""
    return " ".join(text.replace("#", " ").split())


def member_pattern(dictionary: Dictionary) -> re.Pattern[str]:
    """The paths of a dictionary package's files that hold the dictionary."""
    name = re.escape(dictionary.file)
    if dictionary.kind == "apertium":
        return re.compile(rf"/{name}$")  # the compiled bilingual dictionary: eng-spa.autobil.bin
    return re.compile(rf"/{name}\.(index|dict\.dz)$")  # FreeDict's dictd database


def apertium_pairs(bidix: bytes, scratch: Path, name: str = "autobil.bin") -> Iterator[tuple[str, str, str]]:
    """(English, target, part of speech) of a compiled bilingual dictionary's English->target paths;
    lt-print reads a file, written to `scratch` under `name`."""
    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / name
    path.write_bytes(bidix)
    att = subprocess.run(
        [require_lt_print(), str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=LT_PRINT_TIMEOUT_S,
    ).stdout
    for en, es, pos in walk_bidix(att):
        en, es = clean_lemma(en), clean_lemma(es)
        if pos in APERTIUM_POS and en and es and not re.search(r"[<>\d]", en + es):
            yield en, es, pos


def _dictd_offset(text: str) -> int:
    """dictd's base64 numbers: digits A-Z a-z 0-9 + /, most significant first."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    value = 0
    for char in text:
        value = value * 64 + alphabet.index(char)
    return value


# FreeDict's databases generated from TEI (eng-deu, from the Ding dictionary) add lines that are no
# translation (cross-references, synonyms, notes) and write a translation's gender, number and part of
# speech after it: ``Aalfang <masc>``, ``Aalleitern <pl>``, ``anlegen <v, trans>``. The annotation lines
# are skipped and those grammar marks removed, so the word itself is kept; any other ``<...>`` (a stray
# ``<f>``) still drops its sense, as before.
_ANNOTATION_LINE = re.compile(r"^\s*(?:see|synonyms?|antonyms?|note)\s*:", re.IGNORECASE)
_GRAMMAR_MARK = re.compile(r"\s*<([a-z ,]+)>")
_GRAMMAR_WORDS = frozenset(
    ("masc", "fem", "neut", "pl", "sg", "only", "adj", "adv", "v", "trans", "intr", "refl", "prep", "int")
    + ("pron", "rel", "pers", "inter", "num", "conj", "art", "ptcl")
)


def _without_grammar_marks(line: str) -> str:
    def strip(match: re.Match[str]) -> str:
        words = set(re.split(r"[ ,]+", match.group(1).strip()))
        return "" if words <= _GRAMMAR_WORDS else match.group(0)

    return _GRAMMAR_MARK.sub(strip, line)


def freedict_pairs(index: str, dict_dz: bytes) -> Iterator[tuple[str, str, str]]:
    """(English headword, translation, "") of a FreeDict dictd database.

    An article is the headword line (with an optional ``/pronunciation/``) followed by the translations,
    separated by commas or semicolons (and numbered senses ``1.``); each translation becomes a pair."""
    data = gzip.decompress(dict_dz)  # the index's offsets count bytes of the uncompressed text
    for line in index.splitlines():
        fields = line.split("\t")
        if len(fields) != 3 or fields[0].startswith("00database"):
            continue
        headword = fields[0].strip()
        article = data[_dictd_offset(fields[1]) : _dictd_offset(fields[1]) + _dictd_offset(fields[2])]
        lines = [
            _without_grammar_marks(text)
            for text in article.decode("utf-8", "replace").splitlines()[1:]
            if not _ANNOTATION_LINE.match(text)
        ]
        for sense in re.split(r"[,;]|\b\d+\.\s", " ".join(lines)):
            sense = " ".join(sense.split()).strip(" .")
            if sense and not re.search(r"[<>()\[\]/\d]", sense):
                yield headword, sense, ""


def software_packages(packages: Iterable[str]) -> list[str]:
    """The packages of a pair's provenance that are software, not a dictionary: what the translation
    memory and the common UI strings count (a dictionary's word pair is no string a program ships)."""
    return [p for p in packages if p not in ALL_DICTIONARY_PACKAGES]


def pair_provenance(jsonl: Path) -> tuple[list[int], list[bool]]:
    """Per pair of a split, from its jsonl: the packages that ship it, and whether they are all bilingual
    dictionaries (model.train repeats pairs by them; model.pack stores both in its pack)."""
    counts, dictionary_only = [], []
    with jsonl.open(encoding="utf-8") as handle:
        for line in handle:
            packages = json.loads(line).get("packages") or [None]
            counts.append(len(packages))
            dictionary_only.append(packages != [None] and not software_packages(packages))
    return counts, dictionary_only


def capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]


def dictionary_variants(en: str, target: str) -> Iterator[tuple[str, str]]:
    """The pair as the dictionary writes it and with capital first letters (a UI label's case)."""
    yield en, target
    if en[:1].islower():
        yield capitalised(en), capitalised(target)


# A dictionary larger than this many pairs (German FreeDict: 1.1M, four fifths of the corpus) is cut
# down to its pairs of the commonest words, so that catalogs keep teaching software strings. The Spanish
# (40,000 + 12,209) and French (27,962) dictionaries are under it and stay whole.
DICTIONARY_CAP_PAIRS = 50_000
# Translations kept per English entry of a capped dictionary (a case variant counts as one more).
SENSES_PER_ENTRY = 4
_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?")


def english_word_counts(sources: Iterable[str]) -> Counter[str]:
    """How often each lower-cased English word occurs in these sources (the catalogs' training side)."""
    counts: Counter[str] = Counter()
    for text in sources:
        counts.update(w.lower() for w in _WORD.findall(text))
    return counts


def common_word_pairs(
    sources: list[str], word_counts: Counter[str], cap: int = DICTIONARY_CAP_PAIRS
) -> list[int]:
    """Indices (in dictionary order) of the pairs a capped dictionary keeps, given each pair's English
    source (the translation plays no part): all when it has at most
    `cap`; else the first SENSES_PER_ENTRY pairs of each entry, ranked by the catalog count of the
    entry's rarest word divided by the square of its word count (an entry whose words the software never
    uses ranks last; a phrase of common words, `table display`, must not crowd out the words, `cup`),
    and by the sense's rank, then dictionary order, the first `cap` of them."""
    if len(sources) <= cap:
        return list(range(len(sources)))
    seen: Counter[str] = Counter()
    candidates = []
    for index, source in enumerate(sources):
        entry = source.lower()
        seen[entry] += 1
        if seen[entry] > SENSES_PER_ENTRY:
            continue
        words = [w.lower() for w in _WORD.findall(source)] or [entry]
        rarest = min(word_counts.get(w, 0) for w in words)
        # the entry's first translation before its second (dictionaries list the usual sense first)
        sense = (seen[entry] + 1) // 2
        candidates.append((-rarest / len(words) ** 2 / sense, index))
    candidates.sort()
    return sorted(index for _, index in candidates[:cap])
