"""The do-not-translate list: terms that the human translations of the training split copy unchanged.

Product, program and protocol names (``LibreOffice``, ``GNOME``, ``KDE``, ``GIMP``, ``systemd``, ``GTK+``)
must come back unchanged; the serving text layer masks every whole-word occurrence of a listed term before
the model and restores it after. The list is learned from the corpus (``data/train.en`` / ``.es``) with
rules chosen for precision: a wrong entry forces an English word into every Spanish output, while a
missing name is only left to the model, which usually copies it anyway.

    python -m model.keep_terms --data data --out models/en-es-small/keep_terms.txt
    # options: --min-count 3 (pairs a term must occur in), --min-copy 0.9 (share of them copying it)

Selection (terms are case-sensitive: ``GNOME`` is listed, ``gnome`` is not):

1. Tokens. URLs, e-mail addresses, placeholders and markup (``runtime.tokenizer.PLACEHOLDER_PATTERN``:
   ``%s``, ``{0}``, ``<b>``, ``&amp;``) are blanked first. A source occurrence is a whitespace-separated
   chunk that, once quotes, brackets, final punctuation and an English ``'s`` are stripped, is one word
   token: letters and digits with inner ``+ . - _`` and trailing ``+`` (``GTK+``, ``Qt5``, ``x86_64``,
   ``C++``). Chunks glued to paths, options or code (``/usr/bin``, ``--help``, ``f(x)``, ``a=b``) give no
   term. On the target side every word token counts (``Firefox/Thunderbird`` holds ``Firefox``).
2. Evidence. ``count``: training pairs whose source holds the term; ``copied``: those whose target holds
   it verbatim (same case). A candidate has ``count >= --min-count`` and ``copied / count >= --min-copy``.
3. Shape. Rejected: shorter than 2 characters, no letter, numbers and versions (``1.0``, ``2-3``),
   hexadecimal hashes, dotted terms (file and domain names, ``unit.name``).
4. Ordinary words. With ``w`` the term in lowercase, a term is rejected when
   a. English uses ``w`` as a word it translates: ``w`` written in lowercase is in at least
      ``max(2, 5% of count)`` sources, and fewer than half of those targets hold it (``WITH``, ``SELECT``,
      ``HEAD``, ``Writer``, ``Thumb``, ``ELF``);
   b. or both languages use ``w`` as a word: it is lowercase in at least ``max(3, 5% of count)`` sources,
      and at least ``max(3, 2% of the targets holding it)`` Spanish targets have it in lowercase while
      their source has no form of it (``etc``, ``portal``, ``cookies``, ``constructor``);
   c. or, for an all-lowercase term (only kept as a program or identifier: ``git``, ``pngquant``,
      ``systemd``): it has 2 characters, or is copied in under ``LOWER_MIN_COPY`` (98%) of its pairs, or
      Spanish uses it on its own (b's count above ``max(1, 2% of count)``), or an inflection or its
      capitalised form is in at least 2 sources and mostly translated (``hooks``: ``hook``);
   d. or it is in ``STOP_WORDS``: English words that other languages borrow or write alike (``no``,
      ``error``, ``normal``, ``general``, ``color``, ``video``, ``control``, ``terminal``...) and generic
      English words (``Foundation``, ``Premium``, ``Pro``) too rare in lowercase for a and b to recognise,
      found by reading the generated Spanish list (rejecting a term is the safe side in any language: the
      model is left to copy or translate it);
   e. or, with ``--lexicon`` (the target language's hunspell word list, ``model.lexicon``), it is a plain
      lowercase word (letters only) that the target language has: the French copies of ``invasion``,
      ``religion``, ``permutations`` or ``quotient`` are French words, not names. ``make model`` builds
      the lexicon before this list.

File format: ``#`` comment lines (what the file is and how to regenerate it), then one term per line, most
frequent first, as ``term<TAB>count<TAB>copied``. Readers take the first tab-separated field and skip blank
and ``#`` lines (`read_keep_terms`).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.faithful.lexicon import Lexicon, read_lexicon
from runtime.faithful.terms import SOURCE_WORD, read_term_list
from runtime.splits import read_split
from runtime.tokenizer import PLACEHOLDER_PATTERN

KEEP_TERMS_FILE = "keep_terms.txt"  # in the model directory; export/build.py copies it into the bundle
SOURCE_WORDS_FILE = "source_words.txt"  # likewise: the words the model was trained on
MIN_COUNT = 3
MIN_COPY = 0.9
LOWER_MIN_COPY = 0.98
LOWER_MAX_ES_ALONE = 1
LOWER_MAX_ES_ALONE_SHARE = 0.02
WORD_SRC_SHARE = 0.05
WORD_ES_SHARE = 0.02
WORD_MIN_PAIRS = 3
WORD_MIN_PAIRS_EN = 2

# A word token: letters/digits, inner + . - _ , optional trailing + (GTK+, C++).
TOKEN = re.compile(r"[^\W_]+(?:[+.\-_][^\W_]+)*\++|[^\W_]+(?:[+.\-_][^\W_]+)*")
_LEAD = "\"'“”‘’«»‹›([{¿¡*"
_TRAIL = "\"'“”‘’«»‹›)]}.,;:!?…*"
_POSSESSIVE = re.compile(r"['’]s?$")
_NUMBER = re.compile(r"[\d.,+\-_]+")
_HEX = re.compile(r"(?=.*\d)[0-9a-fA-F]{8,}")
_URL = re.compile(r"\b(?:[a-z][a-z0-9+.-]*://|www\.|mailto:)\S*|\S+@\S+\.\w+", re.IGNORECASE)

# Rule 4d, compared in lowercase. English words that Spanish (and often other languages) writes alike, with
# the same meaning (a name-like copy share is then no evidence of a name), and generic English words the
# corpus rarely has in lowercase. Rule 4e finds each language's own with its lexicon.
SHARED_WORDS = frozenset(
    """no error normal general total local manual color video radio control final central digital virtual
    global original principal simple animal hotel idea mental natural plural personal popular regular social
    solar ideal legal literal modal nominal formal actual real similar particular terminal cursor base
    variables macros hardware software firmware proxy bytes megabytes gigabytes chip chipset radar altar vial
    cardinal sepia drama lava oasis paranoia divisible irreducible tolerable alveolar palatal bilabial uvular
    labiodental detective sigma antivirus wiki blog oh ah ahh ahhh ahhhh bah eh hmm uh""".split()
)
ENGLISH_WORDS = frozenset(
    "foundation commons premium pro express federal hat trans ultra foo inflate goblin scream vamp est tot "
    "fixme luster".split()
)
STOP_WORDS = SHARED_WORDS | ENGLISH_WORDS


@dataclass(frozen=True)
class TermStats:
    term: str
    count: int  # training pairs whose source holds the term (a clean whole-word chunk)
    copied: int  # of those, pairs whose target holds it verbatim
    en_lower: int = 0  # pairs whose source holds the term's lowercase form, written in lowercase
    en_lower_kept: int = 0  # of those, pairs whose target holds that form (any case)
    es_alone: int = 0  # pairs whose target holds the lowercase form, written in lowercase, and whose
    # source holds no case of it (nor of its plural): Spanish uses the word on its own
    es_total: int = 0  # pairs whose target holds the lowercase form (any case)
    family_translated: str = ""  # an inflection of a lowercase term that the translations do not copy

    @property
    def copy_share(self) -> float:
        return self.copied / self.count if self.count else 0.0


def _blank(text: str) -> str:
    return _URL.sub(" ", PLACEHOLDER_PATTERN.sub(" ", text))


def source_terms(text: str) -> set[str]:
    """The clean whole-word terms of an English segment (see the module docstring, rule 1)."""
    terms = set()
    for chunk in _blank(text).split():
        chunk = chunk.lstrip(_LEAD).rstrip(_TRAIL)
        chunk = _POSSESSIVE.sub("", chunk).rstrip(_TRAIL)
        if chunk and TOKEN.fullmatch(chunk):
            terms.add(chunk)
    return terms


def target_tokens(text: str) -> set[str]:
    """Every whole-word token of a segment (placeholders and markup blanked)."""
    return set(TOKEN.findall(_blank(text)))


def shape_ok(term: str) -> bool:
    """Rule 3: long enough, has a letter, not a number, version, hash or dotted name."""
    if len(term) < 2 or not any(c.isalpha() for c in term):
        return False
    if _NUMBER.fullmatch(term) or _HEX.fullmatch(term):
        return False
    return "." not in term


def collect(pairs: Iterable[tuple[str, str]], progress: bool = False) -> dict[str, TermStats]:
    """Counts for every source term (rule 2 inputs and rule 4 signals)."""
    count: Counter[str] = Counter()
    copied: Counter[str] = Counter()
    copied_folded: Counter[str] = Counter()  # the target holds the term in some case
    en_lower: Counter[str] = Counter()
    en_lower_kept: Counter[str] = Counter()
    es_alone: Counter[str] = Counter()
    es_total: Counter[str] = Counter()
    started = time.perf_counter()
    for i, (en, es) in enumerate(pairs, 1):
        terms = source_terms(en)
        es_tokens = target_tokens(es)
        es_folded = {t.lower() for t in es_tokens}
        for term in terms:
            count[term] += 1
            if term in es_tokens:
                copied[term] += 1
            if term.lower() in es_folded:
                copied_folded[term] += 1
            if term.islower():
                en_lower[term] += 1
                if term in es_folded:
                    en_lower_kept[term] += 1
        en_folded = {t.lower() for t in target_tokens(en)}
        for t in es_folded:
            es_total[t] += 1
        for t in es_tokens:
            if t.islower() and t not in en_folded and t + "s" not in en_folded and t + "es" not in en_folded:
                es_alone[t] += 1
        if progress and i % 50_000 == 0:
            print(f"  {i} pairs, {len(count)} terms, {time.perf_counter() - started:.1f} s", file=sys.stderr)
    stats = {}
    for term, n in count.items():
        w = term.lower()
        family = ""
        if term.islower():
            for v in (*inflections(term), term.capitalize()):
                if count[v] >= WORD_MIN_PAIRS_EN and copied_folded[v] < 0.5 * count[v]:
                    family = v
                    break
        stats[term] = TermStats(
            term, n, copied[term], en_lower[w], en_lower_kept[w], es_alone[w], es_total[w], family
        )
    return stats


def inflections(word: str) -> list[str]:
    """English inflections of a lowercase word (and the word a plural or -ed/-ing form comes from)."""
    forms = [word + s for s in ("s", "es", "ed", "ing", "er", "ers")]
    for suffix, repl in (
        ("ies", "y"),
        ("es", ""),
        ("s", ""),
        ("ed", ""),
        ("ed", "e"),
        ("ing", ""),
        ("ing", "e"),
    ):
        if word.endswith(suffix) and len(word) > len(suffix) + 2:
            forms.append(word[: -len(suffix)] + repl)
    if word.endswith("y"):
        forms.append(word[:-1] + "ies")
    if word.endswith("e"):
        forms += [word + "d", word[:-1] + "ing"]
    return [f for f in dict.fromkeys(forms) if f != word]


_PLAIN_LOWER = re.compile(r"[^\W\d_]+")


def word_reason(stats: TermStats, lexicon: Lexicon | None = None) -> str | None:
    """Rule 4: why the term looks like an ordinary word rather than a name (None: it looks like a name).
    `lexicon`: the target language's words (rule 4e)."""
    w = stats.term.lower()
    if w in STOP_WORDS:
        return "stop word"
    if lexicon is not None and stats.term.islower() and _PLAIN_LOWER.fullmatch(w) and w in lexicon:
        return "lowercase, a word of the target language"
    if stats.en_lower >= max(WORD_MIN_PAIRS_EN, WORD_SRC_SHARE * stats.count):
        if stats.en_lower_kept < 0.5 * stats.en_lower:
            return f"English word ('{w}' translated in {1 - stats.en_lower_kept / stats.en_lower:.0%})"
    english = stats.en_lower >= max(WORD_MIN_PAIRS, WORD_SRC_SHARE * stats.count)
    if english and stats.es_alone >= max(WORD_MIN_PAIRS, WORD_ES_SHARE * stats.es_total):
        return f"word in both languages ('{w}' alone in {stats.es_alone} targets)"
    if stats.term.islower():
        if len(stats.term) < 3:
            return "lowercase, 2 characters"
        if stats.copy_share < LOWER_MIN_COPY:
            return f"lowercase, copied {stats.copy_share:.0%} < {LOWER_MIN_COPY:.0%}"
        if stats.es_alone > max(LOWER_MAX_ES_ALONE, LOWER_MAX_ES_ALONE_SHARE * stats.count):
            return f"lowercase, alone in {stats.es_alone} targets"
        if stats.family_translated:
            return f"lowercase, '{stats.family_translated}' is translated"
    return None


def select(
    stats: dict[str, TermStats],
    min_count: int = MIN_COUNT,
    min_copy: float = MIN_COPY,
    lexicon: Lexicon | None = None,
) -> tuple[list[TermStats], list[tuple[TermStats, str]]]:
    """(kept, rejected-as-words) among the candidates (rules 2 and 3 passed), most frequent first."""
    candidates = [
        s for s in stats.values() if s.count >= min_count and s.copy_share >= min_copy and shape_ok(s.term)
    ]
    candidates.sort(key=lambda s: (-s.count, s.term))
    kept, words = [], []
    for s in candidates:
        reason = word_reason(s, lexicon)
        if reason is None:
            kept.append(s)
        else:
            words.append((s, reason))
    return kept, words


def write_keep_terms(path: Path, kept: Sequence[TermStats], command: str, n_pairs: int) -> None:
    header = [
        "# terms copied unchanged by the human translations; regenerate with: " + command,
        f"# {len(kept)} terms from {n_pairs} training pairs; format: term<TAB>pairs with it<TAB>"
        "pairs copying it",
        "# (readers take the first tab-separated field and skip blank and # lines)",
    ]
    lines = [f"{s.term}\t{s.count}\t{s.copied}" for s in kept]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(header + lines) + "\n", encoding="utf-8")


def read_keep_terms(path: Path) -> list[str]:
    """The terms of a keep-terms file, in file order."""
    return read_term_list(path)


def source_words(pairs: Iterable[tuple[str, str]]) -> list[str]:
    """Every word (letters only, 3+, lowercased) of the training sources: what the model has seen."""
    return sorted({w.lower() for source, _ in pairs for w in SOURCE_WORD.findall(source)})


def write_source_words(path: Path, words: Sequence[str], command: str) -> None:
    header = [
        "# words of the training sources (lowercased); capitalised words not in here are kept as names",
        f"# regenerate with: {command}",
    ]
    path.write_text("\n".join(header + list(words)) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("data"), help="corpus directory (train.en/.es)")
    parser.add_argument("--out", type=Path, default=Path("models/en-es-small") / KEEP_TERMS_FILE)
    parser.add_argument("--min-count", type=int, default=MIN_COUNT, help="pairs the term must occur in")
    parser.add_argument("--min-copy", type=float, default=MIN_COPY, help="share of them copying it")
    parser.add_argument(
        "--source-words",
        type=Path,
        default=None,
        help=f"also write the training sources' words here (default: {SOURCE_WORDS_FILE} beside --out)",
    )
    parser.add_argument(
        "--lexicon",
        type=Path,
        default=None,
        help="the target language's word list (model.lexicon's lexicon.txt.gz): its plain lowercase words "
        "are not kept (rule 4e)",
    )
    args = parser.parse_args(argv)
    words_out = args.source_words or args.out.parent / SOURCE_WORDS_FILE

    started = time.perf_counter()
    print(f"reading {args.data}/train.en, train.es ...", file=sys.stderr)
    pairs = read_split(args.data, "train")
    print(f"counting terms in {len(pairs)} pairs ...", file=sys.stderr)
    stats = collect(pairs, progress=True)
    lexicon = read_lexicon(args.lexicon) if args.lexicon else None
    kept, words = select(stats, args.min_count, args.min_copy, lexicon)
    command = f"python -m model.keep_terms --data {args.data} --out {args.out}"
    if args.lexicon:
        command += f" --lexicon {args.lexicon}"
    if args.min_count != MIN_COUNT or args.min_copy != MIN_COPY:
        command += f" --min-count {args.min_count} --min-copy {args.min_copy}"
    write_keep_terms(args.out, kept, command, len(pairs))
    vocabulary = source_words(pairs)
    write_source_words(words_out, vocabulary, command)
    print(f"wrote {len(vocabulary)} source words to {words_out}", file=sys.stderr)
    by_rule = Counter(why.split(" (")[0].split(",")[0] for _, why in words)
    print(
        f"{len(stats)} source terms; {len(kept) + len(words)} candidates (>= {args.min_count} pairs, "
        f">= {args.min_copy:.0%} copied, name-shaped); kept {len(kept)}, rejected {len(words)} as words "
        f"({', '.join(f'{rule}: {n}' for rule, n in by_rule.most_common())}); "
        f"wrote {args.out} in {time.perf_counter() - started:.1f} s"
    )
    print("top 30 kept:", ", ".join(f"{s.term} ({s.count})" for s in kept[:30]))
    print("top 30 rejected as words:")
    for s, why in words[:30]:
        print(f"  {s.term}\t{s.count} pairs, {s.copy_share:.0%} copied: {why}")


if __name__ == "__main__":
    main()
