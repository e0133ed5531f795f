"""Held-out gettext catalogs for `python -m client po`: build a .pot and its human reference from a
Debian package's Spanish catalog, and score a machine-filled .po against that reference.

    # the package's es .mo (apt-get download PKG; dpkg-deb -x PKG.deb x/), e.g. krdc (ranked 234)
    python tests/data/po/heldout.py build x/usr/share/locale/es/LC_MESSAGES/krdc.mo \\
        --pot tests/data/po/real/krdc.pot --ref tests/data/po/real/krdc.es.po --limit 60
    python -m client po tests/data/po/real/krdc.pot -o /tmp/krdc.po
    python tests/data/po/heldout.py score /tmp/krdc.po tests/data/po/real/krdc.es.po

A .mo keeps msgctxt, plurals and the header but not the comments, references or flags; `build` puts back
the format flags xgettext would have written (c-format when every % of a msgid is a valid printf
directive, python-format for %(name)s, python-brace-format for {name}, kde-format or qt-format for %1),
dropping one the human translation does not pass (`msgfmt -c`), and turns the header into a template's.
`--limit N` keeps N entries: every plural, context, accelerator and multi-line entry first (in catalog
order), then the others in order.
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import polib

C_DIRECTIVE = re.compile(
    r"%(?:\d+\$)?[-+ #0']*(?:\*|\d+)?(?:\.(?:\*|\d+))?(?:hh|h|ll|l|L|q|j|z|t)?[diouxXeEfFgGaAcspn%]"
)
PLACEHOLDERS = re.compile(
    r"%\([^)\s]*\)[-+ #0]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]"
    r"|%(?:\d+\$)?[-+#0']*\d*(?:\.\d+)?(?:hh|h|ll|l|L|z|j|t)?[diouxXeEfFgGaAcspn]|%L?\d+|\{[\w.]*\}|\$\{?[A-Za-z_]\w*\}?|</?[A-Za-z][^<>]*>|&[A-Za-z]+;"
)
CREDITS = {"translator-credits", "translator_credits", "your names", "your emails", "translators"}
TEMPLATE_HEADER = {
    "PO-Revision-Date": "YEAR-MO-DA HO:MI+ZONE",
    "Last-Translator": "FULL NAME <EMAIL@ADDRESS>",
    "Language-Team": "LANGUAGE <LL@li.org>",
    "Language": "",
    "Content-Type": "text/plain; charset=CHARSET",
    "Plural-Forms": "nplurals=INTEGER; plural=EXPRESSION;",
}


def gettext_count(text: str, mark: str) -> int:
    return len(re.findall(rf"{re.escape(mark)}(?!{re.escape(mark)})", text.replace(mark * 2, "")))


def read(path: Path) -> polib.POFile:
    if path.suffix == ".mo":
        text = subprocess.run(["msgunfmt", str(path)], capture_output=True, text=True, check=True).stdout
        return polib.pofile(text)
    return polib.pofile(str(path))


def guess_flags(e: polib.POEntry, kde: bool) -> list[str]:
    texts = [t for t in (e.msgid, e.msgid_plural) if t]
    joined = " ".join(texts)
    flags = []
    if re.search(r"%\([^)\s]+\)", joined):
        flags.append("python-format")
    elif re.search(r"%L?\d", joined):
        flags.append("kde-format" if kde else "qt-format")
    elif "%" in joined and all(len(C_DIRECTIVE.findall(t)) == t.count("%") - t.count("%%") for t in texts):
        flags.append("c-format")
    if re.search(r"\{[A-Za-z_]\w*\}", joined):
        flags.append("python-brace-format")
    return flags


def msgfmt_lines(path: str) -> set[int]:
    proc = subprocess.run(["msgfmt", "-c", "-o", "/dev/null", path], capture_output=True, text=True)
    return {int(m.group(1)) for m in re.finditer(rf"{re.escape(path)}:(\d+): (?!warning)", proc.stderr)}


def build(args) -> None:
    po = read(Path(args.catalog))
    kde = "kde.org" in po.metadata.get("Report-Msgid-Bugs-To", "")
    entries = [e for e in po if e.msgid and not e.obsolete and e.translated()]
    for e in entries:
        e.flags = guess_flags(e, kde)
    if args.limit:
        first = [
            e
            for e in entries
            if e.msgid_plural
            or e.msgctxt
            or "\n" in e.msgid.strip()
            or re.search(r"(^|\W)[_&~]\w|\w&\w", e.msgid)
        ]
        rest = [e for e in entries if e not in first]
        keep = set(map(id, (first + rest)[: args.limit]))
        entries = [e for e in entries if id(e) in keep]
    ref = polib.POFile(wrapwidth=78)
    ref.metadata = dict(po.metadata)
    for e in entries:
        ref.append(e)
    # Drop a flag the human translation does not pass: xgettext would not have set it.
    with tempfile.NamedTemporaryFile("w", suffix=".po", delete=False) as f:
        f.write(str(ref))
    parsed = [e for e in polib.pofile(f.name) if e.msgid]
    starts = [e.linenum for e in parsed]
    by_key = {(r.msgctxt, r.msgid): r for r in ref}
    for line in msgfmt_lines(f.name):
        i = bisect.bisect_right(starts, line) - 1
        if i >= 0:
            by_key[(parsed[i].msgctxt, parsed[i].msgid)].flags = []
    Path(f.name).unlink()
    Path(args.ref).parent.mkdir(parents=True, exist_ok=True)
    ref.save(args.ref)
    pot = polib.pofile(args.ref)
    pot.metadata.update(TEMPLATE_HEADER)
    pot.metadata_is_fuzzy = True
    pot.header = "SOME DESCRIPTIVE TITLE.\nThis file is distributed under the same license as the package."
    for e in pot:
        e.msgstr = ""
        if e.msgid_plural:
            e.msgstr_plural = {0: "", 1: ""}
    pot.save(args.pot)
    print(f"{args.pot}: {len(pot)} entries; {args.ref}: the human translation", file=sys.stderr)


def score(args) -> None:
    import sacrebleu

    out, ref = polib.pofile(args.output), polib.pofile(args.reference)
    refs = {(e.msgctxt, e.msgid): e for e in ref if not e.obsolete}
    hyps, gold, missing, kept = [], [], 0, Counter()
    for e in out:
        r = refs.get((e.msgctxt, e.msgid))
        if e.obsolete or not e.msgid or r is None or e.msgid.strip().lower() in CREDITS:
            continue
        pairs = [(e.msgid, e.msgstr, r.msgstr)]
        if e.msgid_plural:
            pairs = [(e.msgid, e.msgstr_plural.get(0, ""), r.msgstr_plural.get(0, ""))]
            pairs.append((e.msgid_plural, e.msgstr_plural.get(1, ""), r.msgstr_plural.get(1, "")))
            kept["plural entries"] += 1
            kept["plural entries with both forms"] += all(p[1] for p in pairs)
        if e.msgctxt is not None:
            kept["context entries"] += 1
            kept["context entries filled"] += bool(e.msgstr or any(e.msgstr_plural.values()))
        if not all(p[1] for p in pairs):
            missing += 1
            continue
        kept["filled"] += 1
        kept["fuzzy"] += e.fuzzy
        for source, hyp, gold_text in pairs:
            hyps.append(hyp)
            gold.append(gold_text)
            want = Counter(PLACEHOLDERS.findall(source))
            kept["placeholders"] += sum(want.values())
            kept["placeholders kept"] += sum(
                min(n, Counter(PLACEHOLDERS.findall(hyp))[p]) for p, n in want.items()
            )
            for mark in "_&~":  # msgfmt --check-accelerators's rule: one marker (doubled ones escaped)
                if gettext_count(source, mark) == 1 and re.search(rf"{re.escape(mark)}\w", source):
                    kept[f"accelerators {mark}"] += 1
                    kept[f"accelerators {mark} kept once"] += gettext_count(hyp, mark) == 1
    total = kept["filled"] + missing
    chrf = sacrebleu.corpus_chrf(hyps, [gold]).score if hyps else 0.0
    result = {
        "entries": total,
        "filled": kept["filled"],
        "filled %": round(100 * kept["filled"] / max(1, total), 1),
    }
    result |= {k: v for k, v in sorted(kept.items()) if k != "filled"}
    result["chrF (filled, vs human)"] = round(chrf, 1)
    print(json.dumps(result, indent=1, ensure_ascii=False))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help=".mo/.po -> .pot + human reference .po")
    b.add_argument("catalog")
    b.add_argument("--pot", required=True)
    b.add_argument("--ref", required=True)
    b.add_argument("--limit", type=int, default=0)
    s = sub.add_parser("score", help="machine .po vs human reference")
    s.add_argument("output")
    s.add_argument("reference")
    args = p.parse_args()
    build(args) if args.cmd == "build" else score(args)


if __name__ == "__main__":
    main()
