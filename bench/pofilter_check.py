"""translate-toolkit's `pofilter` on machine-filled catalogs beside their human translation.

    # a package's Spanish catalog -> template + human reference (tests/data/po/heldout.py build)
    python tests/data/po/heldout.py build x/usr/share/locale/es/LC_MESSAGES/bash.mo \\
        --pot /tmp/bash.pot --ref /tmp/bash.es.po
    python -m bench.pofilter_check /tmp/bash.pot:/tmp/bash.es.po /tmp/mousepad.pot:/tmp/mousepad.es.po \\
        --bundle bundles/en-es-small --cache /tmp/pofilter-cache.json

Each template is filled the way `python -m client po` fills it (runtime.po_catalog's plan, fill and
`msgfmt -c` check; accelerators taken out by the catalog's convention, machine translations fuzzy), with
the engine in-process: no server. Then `pofilter --language=es` runs on the filled catalog and on the
human one, and a table gives, per pofilter test, the failing entries of each (only the entries both
filled, so a left-out entry counts for neither). `--sample N` fills every k-th entry only (iterating on
rules); `--cache FILE` keeps the model's n-best lists per segment, so a rerun decodes only the segments a
change of the text layer sends differently. `--show TEST` prints the machine's failures of that test.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import polib

from runtime.decoding import DecodingOptions
from runtime.po_catalog import (
    fill,
    leave_out,
    markers_of,
    nplurals,
    plan,
    update_header,
    write_checked,
)
from server.contract import Hypothesis, Prepared

# The tests the issue names first: quotes, start punctuation, and what code spans break.
FOCUS = ("doublequoting", "singlequoting", "startpunc", "options", "variables", "brackets", "escapes")
_TEST = re.compile(r"\(pofilter\) (\w+):")

# An independent look at code in the sources (nothing here comes from runtime.faithful.code): GNU-quoted
# literals `...' kept verbatim, the command of a usage line (`alias [-p] ...`) and the keywords of a shell
# construct (`if COMMANDS; then ...`) kept as words.
_GNU_LITERAL = re.compile(r"`[^`'\n]+'")
_USAGE_LINE = re.compile(r"^\s*([a-z][\w-]*) (?=.*\[)", re.MULTILINE)
_KEYWORD_LINE = re.compile(r"^\s*(?:if|for|while|until|case|select|function|\(\(|\[\[)\s.*$", re.MULTILINE)
_KEYWORD = re.compile(
    r"(?<![\w-])(?:if|then|elif|else|fi|for|in|do|done|case|esac|while|until|select)(?![\w-])"
)


def code_kept(source: str, target: str) -> tuple[int, int]:
    """(code spans of `source`, those `target` keeps): see _GNU_LITERAL and friends."""
    spans = _GNU_LITERAL.findall(source) + [m.group(1) for m in _USAGE_LINE.finditer(source)]
    for line in _KEYWORD_LINE.findall(source):
        spans += _KEYWORD.findall(line)
    words = Counter(re.findall(r"[\w-]+|[^\w\s]+", target))
    kept = 0
    for span, n in Counter(spans).items():
        have = target.count(span) if not span.isalpha() else words[span]
        kept += min(n, have)
    return len(spans), kept


class CachedEngine:
    """Engine.translate with its n-best lists kept per (segment, options) in a JSON file."""

    def __init__(self, engine, path: Path | None) -> None:
        self.engine, self.path = engine, path
        self.cache: dict[str, list[list]] = {}
        if path is not None and path.exists():
            self.cache = json.loads(path.read_text(encoding="utf-8"))

    def translate(self, segments: list[str], options: DecodingOptions) -> list[list[Hypothesis]]:
        key = f"{options.beam_size}/{options.num_hypotheses}/{options.length_penalty}/"
        todo = [s for s in dict.fromkeys(segments) if key + s not in self.cache]
        for i in range(0, len(todo), 8):
            batch = todo[i : i + 8]
            for s, hyps in zip(batch, self.engine.translate(batch, options), strict=True):
                self.cache[key + s] = [[h.text, h.score, list(h.tokens)] for h in hyps]
            print(f"  decoded {min(i + 8, len(todo))}/{len(todo)}", file=sys.stderr, flush=True)
        if todo and self.path is not None:
            self.path.write_text(json.dumps(self.cache, ensure_ascii=False), encoding="utf-8")
        return [[Hypothesis(t, sc, tok) for t, sc, tok in self.cache[key + s]] for s in segments]


def translate(engine, cached: CachedEngine, texts: list[str]) -> list[Hypothesis]:
    """The best hypothesis of each text, through the text layer (catalog texts: accelerators already
    out, as `python -m client po` sends them with literal_markers)."""
    options = engine.default_options
    step: Prepared | list = engine.prepare(texts, options, accelerators=False)
    while isinstance(step, Prepared):
        step = engine.finish(step, cached.translate(step.segments, step.options))
    return [hyps[0] for hyps in step]


def fill_catalog(
    engine,
    cached: CachedEngine,
    pot: Path,
    sample: int,
    target: str | None = None,
    generator: str = "bench.pofilter_check",
) -> polib.POFile:
    """The template filled as `python -m client po` fills it (every `sample`-th entry when > 1), for
    `target` (a language code; None: Spanish, the client's default) as its --to would."""
    po = polib.pofile(str(pot))
    markers = markers_of(po, "auto")
    jobs, _ = plan(po, "untranslated", markers)
    jobs = jobs[::sample] if sample > 1 else jobs
    update_header(po, pot.stem, generator, revised=True, target=target)
    n_forms = nplurals(po, target or "es")
    texts = list(dict.fromkeys(t for j in jobs for t in j.sources))
    best = dict(zip(texts, translate(engine, cached, texts), strict=True))
    for job in jobs:
        job.results = [best[t] for t in job.sources]
        if (reason := fill(job, n_forms, markers, True)) is not None:
            leave_out(job, reason)
    write_checked(po, None, markers[:1], {id(j.entry): j for j in jobs})
    return po


def pofilter(po: polib.POFile) -> dict[tuple[str | None, str], set[str]]:
    """(msgctxt, msgid) -> the pofilter tests its entry fails."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "in.po", Path(tmp) / "out.po"
        po.save(str(src))
        cmd = [str(Path(sys.executable).parent / "pofilter"), "--language=es", "--progress=none"]
        subprocess.run([*cmd, str(src), str(out)], check=True, capture_output=True, timeout=600)
        failed: dict[tuple[str | None, str], set[str]] = {}
        if out.exists():
            for e in polib.pofile(str(out)):
                tests = set(_TEST.findall(e.tcomment or "")) | set(_TEST.findall(e.comment or ""))
                failed[(e.msgctxt, e.msgid)] = tests
        return failed


def compare(machine: polib.POFile, human: polib.POFile) -> tuple[Counter, Counter, int, dict]:
    """Failures per test of each catalog over the entries both translated, and the machine's chrF
    against the human translations of those entries (x10, an integer like the counts)."""
    import sacrebleu

    both = _filled(machine) & _filled(human)
    fm, fh = pofilter(machine), pofilter(human)
    cm = Counter(t for k, ts in fm.items() if k in both for t in ts)
    ch = Counter(t for k, ts in fh.items() if k in both for t in ts)
    texts = {k: _texts(e) for e in human if (k := (e.msgctxt, e.msgid)) in both}
    hyps = [t for e in machine if (k := (e.msgctxt, e.msgid)) in both for t in _texts(e)[: len(texts[k])]]
    refs = [t for e in machine if (k := (e.msgctxt, e.msgid)) in both for t in texts[k][: len(_texts(e))]]
    cm["(chrF x10 vs human)"] = round(10 * sacrebleu.corpus_chrf(hyps, [refs]).score) if hyps else 0
    cm["(left untranslated)"] = len(_filled(human) - _filled(machine))
    for po, counter in ((machine, cm), (human, ch)):
        found = kept = 0
        for e in po:
            if (e.msgctxt, e.msgid) in both:
                n, k = code_kept(e.msgid, _texts(e)[0])
                found, kept = found + n, kept + k
        counter["(code spans kept)"] = kept
        counter["(code spans in the sources)"] = found
    return cm, ch, len(both), {k: v for k, v in fm.items() if k in both}


def _texts(e: polib.POEntry) -> list[str]:
    return [e.msgstr_plural[i] for i in sorted(e.msgstr_plural)] if e.msgid_plural else [e.msgstr]


def _filled(po: polib.POFile) -> set[tuple[str | None, str]]:
    return {(e.msgctxt, e.msgid) for e in po if e.msgid and (e.msgstr or any(e.msgstr_plural.values()))}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("catalogs", nargs="+", metavar="POT:HUMAN_PO")
    p.add_argument("--bundle", default="bundles/en-es-small")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cache", type=Path, help="JSON file of the model's n-best lists per segment")
    p.add_argument("--sample", type=int, default=1, help="fill every N-th entry only")
    p.add_argument("--show", action="append", default=[], metavar="TEST", help="print the machine's failures")
    p.add_argument("--save", type=Path, help="directory for the filled catalogs")
    args = p.parse_args(argv)

    from server.engine import Engine

    engine = Engine(args.bundle, intra_op_threads=args.threads)
    cached = CachedEngine(engine, args.cache)
    rows: dict[str, tuple[Counter, Counter, int]] = {}
    for spec in args.catalogs:
        pot, ref = (Path(x) for x in spec.split(":"))
        machine = fill_catalog(engine, cached, pot, args.sample)
        if args.save is not None:
            args.save.mkdir(parents=True, exist_ok=True)
            machine.save(str(args.save / f"{pot.stem}.po"))
        cm, ch, n, failures = compare(machine, polib.pofile(str(ref)))
        rows[pot.stem] = (cm, ch, n)
        for test in args.show:
            for (ctx, msgid), tests in failures.items():
                if test in tests:
                    e = machine.find(msgid, msgctxt=ctx) if ctx is not None else machine.find(msgid)
                    print(f"[{pot.stem} {test}] {msgid!r}\n    -> {e.msgstr or e.msgstr_plural!r}")
    every = {t for cm, ch, _ in rows.values() for t in cm | ch} - {"isfuzzy"}  # machine ones are, by design
    tests = sorted(every, key=lambda t: (not t.startswith("("), t not in FOCUS, t))
    names = list(rows)
    print("| pofilter test | " + " | ".join(f"{n}: machine | {n}: human" for n in names) + " |")
    print("| --- |" + " --- | --- |" * len(names))
    print("| entries compared | " + " | ".join(f"{rows[n][2]} | {rows[n][2]}" for n in names) + " |")
    for t in tests:
        cells = " | ".join(f"{rows[n][0][t]} | {rows[n][1][t]}" for n in names)
        print(f"| {'**' + t + '**' if t in FOCUS else t} | {cells} |")


if __name__ == "__main__":
    main()
