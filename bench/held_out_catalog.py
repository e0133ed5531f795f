"""A held-out package's gettext catalog, filled by the model as `python -m client po` fills it and checked
with the real `msgfmt -c`: the model card's "Held-out catalog" section.

    python -m bench.held_out_catalog --data runs/data-fr --bundle bundles/en-fr-small [--json OUT.json]
        [--keep DIR]

Of the corpus's test-split packages (held out from training), the catalog of the corpus's language
with the most entries among those that have plural entries is cut to `--limit` entries (60; plurals,
contexts, accelerators and multi-line entries first) and turned into a template plus the human
translation (`build`, also `tests/data/po/heldout.py build`). The template is filled in-process through
the engine's text layer (bench.pofilter_check.fill_catalog: runtime.po_catalog's plan, fill and header,
machine translations fuzzy, each entry msgfmt rejects left out with a comment), written with the
language's Language and Plural-Forms through runtime.po_catalog.write_checked, whose `msgfmt -c
--use-fuzzy` (fuzzy entries checked too) gives the clean/not verdict. `score` compares the filled
entries with the human ones (chrF, BLEU; also `heldout.py score`). The packages' .deb files come from
the corpus's cache (`DATA/cache/debs`), else the Spanish corpus's (`data/cache/debs`): a package's
.deb holds the catalogs of every language. `--keep DIR` keeps the .mo, template, human and machine
catalogs.
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import polib

from model.corpus import read_mo
from model.debs import cached_deb, iter_deb_members
from model.languages import Language, corpus_language
from runtime.bundle import load_manifest
from runtime.catalog import CREDIT_MSGIDS
from runtime.languages import normalise_code, parse_plural_forms
from runtime.po_catalog import LEFT_OUT, markers_of, target_plural_header, write_checked
from runtime.po_text import gettext_count

REPO_ROOT = Path(__file__).resolve().parents[1]
LIMIT = 60
C_DIRECTIVE = re.compile(
    r"%(?:\d+\$)?[-+ #0']*(?:\*|\d+)?(?:\.(?:\*|\d+))?(?:hh|h|ll|l|L|q|j|z|t)?[diouxXeEfFgGaAcspn%]"
)
PLACEHOLDERS = re.compile(
    r"%\([^)\s]*\)[-+ #0]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]"
    r"|%(?:\d+\$)?[-+#0']*\d*(?:\.\d+)?(?:hh|h|ll|l|L|z|j|t)?[diouxXeEfFgGaAcspn]|%L?\d+|\{[\w.]*\}|\$\{?[A-Za-z_]\w*\}?|</?[A-Za-z][^<>]*>|&[A-Za-z]+;"
)
ACCELERATOR = re.compile(r"(^|\W)[_&~]\w|\w&\w")
TEMPLATE_HEADER = {
    "PO-Revision-Date": "YEAR-MO-DA HO:MI+ZONE",
    "Last-Translator": "FULL NAME <EMAIL@ADDRESS>",
    "Language-Team": "LANGUAGE <LL@li.org>",
    "Language": "",
    "Content-Type": "text/plain; charset=CHARSET",
    "Plural-Forms": "nplurals=INTEGER; plural=EXPRESSION;",
}


def read(path: Path) -> polib.POFile:
    """A .mo (through msgunfmt, which keeps msgctxt and plurals as gettext reads them) or a .po."""
    if path.suffix == ".mo":
        text = subprocess.run(
            ["msgunfmt", str(path)], capture_output=True, text=True, check=True, timeout=120
        ).stdout
        return polib.pofile(text)
    return polib.pofile(str(path))


def guess_flags(e: polib.POEntry, kde: bool) -> list[str]:
    """The format flags xgettext would have written: a .mo keeps none."""
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
    proc = subprocess.run(
        ["msgfmt", "-c", "-o", "/dev/null", path], capture_output=True, text=True, timeout=120
    )
    return {int(m.group(1)) for m in re.finditer(rf"{re.escape(path)}:(\d+): (?!warning)", proc.stderr)}


def build(po: polib.POFile, limit: int = 0) -> tuple[polib.POFile, polib.POFile]:
    """(template, human reference) of a translated catalog: format flags guessed (a flag the human
    translation fails dropped), `limit` entries kept when > 0 (plurals, contexts, accelerators and
    multi-line entries first, in catalog order), the template's header as xgettext writes it."""
    kde = "kde.org" in po.metadata.get("Report-Msgid-Bugs-To", "")
    entries = [e for e in po if e.msgid and not e.obsolete and e.translated()]
    for e in entries:
        e.flags = guess_flags(e, kde)
    if limit:
        first = [
            e
            for e in entries
            if e.msgid_plural or e.msgctxt or "\n" in e.msgid.strip() or ACCELERATOR.search(e.msgid)
        ]
        chosen = {id(e) for e in first}  # ids, not `in`: polib compares entries field by field
        keep = set(map(id, (first + [e for e in entries if id(e) not in chosen])[:limit]))
        entries = [e for e in entries if id(e) in keep]
    ref = polib.POFile(wrapwidth=78)
    ref.metadata = dict(po.metadata)
    for e in entries:
        ref.append(e)
    with tempfile.TemporaryDirectory() as tmp:
        # Drop a flag the human translation does not pass: xgettext would not have set it.
        path = str(Path(tmp) / "ref.po")
        ref.save(path)
        parsed = [e for e in polib.pofile(path) if e.msgid]
        starts = [e.linenum for e in parsed]
        by_key = {(r.msgctxt, r.msgid): r for r in ref}
        for line in msgfmt_lines(path):
            i = bisect.bisect_right(starts, line) - 1
            if i >= 0:
                by_key[(parsed[i].msgctxt, parsed[i].msgid)].flags = []
        ref.save(path)
        pot = polib.pofile(path)  # a copy, read back as the reference is written
    pot.metadata.update(TEMPLATE_HEADER)
    pot.metadata_is_fuzzy = True
    pot.header = "SOME DESCRIPTIVE TITLE.\nThis file is distributed under the same license as the package."
    for e in pot:
        e.msgstr = ""
        if e.msgid_plural:
            e.msgstr_plural = {0: "", 1: ""}
    return pot, ref


def score(output: polib.POFile, reference: polib.POFile) -> dict:
    """A machine-filled catalog against the human one: entries filled (both plural forms for a plural
    entry), fuzzy marks, placeholders and accelerators kept, chrF and BLEU (sacrebleu's defaults) of the
    filled msgstr forms 0 and 1 against the human ones. Translator credits count for nothing."""
    import sacrebleu

    refs = {(e.msgctxt, e.msgid): e for e in reference if not e.obsolete}
    hyps, gold, missing, kept = [], [], 0, Counter()
    for e in output:
        r = refs.get((e.msgctxt, e.msgid))
        if e.obsolete or not e.msgid or r is None or e.msgid.strip().lower() in CREDIT_MSGIDS:
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
    bleu = sacrebleu.corpus_bleu(hyps, [gold]).score if hyps else 0.0
    result = {
        "entries": total,
        "filled": kept["filled"],
        "filled %": round(100 * kept["filled"] / max(1, total), 1),
    }
    result |= {k: v for k, v in sorted(kept.items()) if k != "filled"}
    result["chrF (filled, vs human)"] = round(chrf, 1)
    result["BLEU (filled, vs human)"] = round(bleu, 1)
    return result


class NoCatalog(Exception):
    """No test-split package of the corpus has a cached .deb with a catalog in its language."""


def deb_caches(data: Path) -> list[Path]:
    return [data / "cache" / "debs", REPO_ROOT / "data" / "cache" / "debs"]


def pick_catalog(data: Path, lang: Language, work: Path) -> dict:
    """The test-split catalog in `lang` with the most entries among those with plural entries (any,
    when none has one): {package, deb, catalog (path in the package), mo (written into `work`),
    entries, plural_entries}. NoCatalog when there is none."""
    manifest = json.loads((data / "manifest.json").read_text(encoding="utf-8"))
    packages = sorted(p for p, counts in manifest.get("packages", {}).items() if counts.get("test"))
    best, best_key, missing = None, None, []
    for package in packages:
        deb = next((d for c in deb_caches(data) if (d := cached_deb(c, package)) is not None), None)
        if deb is None:
            missing.append(package)
            continue
        for member, blob in iter_deb_members(deb, lang.mo_pattern()):
            entries = [e for e in read_mo(blob)[1] if e.msgid]
            plurals = sum(bool(e.msgid_plural) for e in entries)
            key = (plurals > 0, len(entries))
            if best_key is None or key > best_key:  # strict: the first in name order wins a tie
                name = member.removeprefix("./")
                best_key = key
                best = {"package": package, "deb": deb.name, "catalog": name, "blob": blob}
                best |= {"entries": len(entries), "plural_entries": plurals}
    if best is None:
        where = " or ".join(map(str, deb_caches(data)))
        no_deb = f" ({', '.join(missing)}: no .deb in {where})" if missing else ""
        raise NoCatalog(f"no {lang.name} catalog in the test split's packages of {data}{no_deb}")
    mo = work / Path(best["catalog"]).name
    mo.write_bytes(best.pop("blob"))
    return best | {"mo": mo}


def fill_and_check(
    pot: Path, bundle: Path, code: str, out: Path, threads: int = 0
) -> tuple[polib.POFile, dict]:
    """The template filled by the bundle's model for language `code` (as `python -m client po` fills
    it), written to `out` through the checked writer; the catalog and what was written."""
    from bench.pofilter_check import CachedEngine, fill_catalog
    from server.engine import Engine

    into = load_manifest(bundle, "fp32")["target_language"]  # before the engine loads: a cheap refusal
    if normalise_code(into) != normalise_code(code):
        raise SystemExit(f"{bundle} translates into {into}, the corpus is {code}")
    engine = Engine(bundle, intra_op_threads=threads)
    po = fill_catalog(
        engine, CachedEngine(engine, None), pot, 1, target=code, generator="bench.held_out_catalog"
    )
    markers = markers_of(po, "auto")
    # No jobs: an entry msgfmt still rejects is reported, not left out (fill_catalog did that already).
    checked = write_checked(po, out, markers[:1], {})
    command = ["msgfmt", "-c", "--use-fuzzy"] + ([f"--check-accelerators={markers[0]}"] if markers else [])
    left = [
        {"msgctxt": e.msgctxt, "msgid": e.msgid, "reason": " ".join(e.tcomment.split(LEFT_OUT, 1)[1].split())}
        for e in po
        if LEFT_OUT in (e.tcomment or "")
    ]
    return po, {
        "language": po.metadata.get("Language", ""),
        "plural_forms": po.metadata.get("Plural-Forms", ""),
        "plural_forms_expected": target_plural_header(code),
        "msgfmt": {
            "command": " ".join(command),
            "clean": not checked.other_errors,
            "errors": [f"line {n}: {m}" for n, m in checked.other_errors],
        },
        "left_out": left,
    }


def evaluate(
    data: Path, bundle: Path, keep: Path | None = None, limit: int = LIMIT, threads: int = 0
) -> dict:
    """The report of the section: see the module docstring."""
    started = time.monotonic()
    lang = corpus_language(data)
    with tempfile.TemporaryDirectory() as tmp:
        work = keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        print(f"held-out catalog: the {lang.name} catalogs of {data}'s test split", file=sys.stderr)
        picked = pick_catalog(data, lang, work)
        stem = picked["mo"].stem
        pot_path, ref_path = work / f"{stem}.pot", work / f"{stem}.{lang.code}.po"
        out_path = work / f"{stem}.{lang.code}.machine.po"
        pot, ref = build(read(picked["mo"]), limit)
        pot.save(str(pot_path))
        ref.save(str(ref_path))
        print(
            f"  {picked['package']}: {picked['catalog']} ({picked['entries']:,} entries), {len(pot)} kept",
            file=sys.stderr,
        )
        machine, written = fill_and_check(pot_path, bundle, lang.code, out_path, threads)
    entries = [e for e in pot if e.msgid]
    credits = sum(e.msgid.strip().lower() in CREDIT_MSGIDS for e in entries)
    filled = [e for e in machine if e.msgid and (e.msgstr or any(e.msgstr_plural.values()))]
    nplurals = parse_plural_forms(written["plural_forms"]).nplurals
    scores = score(machine, ref)
    return {
        "package": picked["package"],
        "deb": picked["deb"],
        "catalog": picked["catalog"],
        "catalog_entries": picked["entries"],
        "catalog_plural_entries": picked["plural_entries"],
        "limit": limit,
        "entries": len(entries),
        "plural_entries": sum(bool(e.msgid_plural) for e in entries),
        "context_entries": sum(e.msgctxt is not None for e in entries),
        "accelerator_entries": sum(bool(ACCELERATOR.search(e.msgid)) for e in entries),
        "translator_credits": credits,
        "filled": len(filled),
        "plural_entries_filled": sum(
            bool(e.msgid_plural) and all(e.msgstr_plural.get(i) for i in range(nplurals)) for e in filled
        ),
        **written,
        "left_out_reasons": dict(Counter(r["reason"].split(":")[0] for r in written["left_out"])),
        "chrf": scores["chrF (filled, vs human)"],
        "bleu": scores["BLEU (filled, vs human)"],
        "score": scores,
        "seconds": round(time.monotonic() - started, 1),
    }


def card_lines(report: dict) -> list[str]:
    """The model card's section (bench.model_card)."""
    if "skipped" in report:
        return [
            "",
            f"Held-out catalog (`python -m bench.held_out_catalog`): not measured, {report['skipped']}.",
        ]
    r, msgfmt = report, report["msgfmt"]
    reasons = ", ".join(f"{reason} ({n})" for reason, n in r["left_out_reasons"].items())
    verdict = (
        "clean" if msgfmt["clean"] else f"{len(msgfmt['errors'])} errors: {'; '.join(msgfmt['errors'][:3])}"
    )
    forms = r["plural_forms"] + (
        "" if r["plural_forms"] == r["plural_forms_expected"] else " (not the language's!)"
    )
    return [
        "",
        f"## Held-out catalog ({r['package']}, {r['entries']} entries, what `python -m client po` writes)",
        "",
        f"`python -m bench.held_out_catalog`: of the test split's packages, the catalog with the most "
        f"entries among those with plural entries, `{r['catalog']}` of {r['package']} "
        f"({r['catalog_entries']:,} entries), cut to {r['limit']} entries (plurals, contexts and "
        "accelerators first) and turned into a template and the human reference "
        "(`tests/data/po/heldout.py build`); the template filled as `python -m client po` fills it "
        "(engine in-process, decoding defaults, machine translations fuzzy, an entry `msgfmt -c` "
        f"rejects left out with a comment) and checked with `{msgfmt['command']}`. chrF and BLEU: "
        "the filled msgstr forms against the human ones.",
        "",
        "| entries | plural / context / accelerator entries | filled | plural entries filled | left out | "
        "`msgfmt -c` | Plural-Forms written | chrF | BLEU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {r['entries']} | {r['plural_entries']} / {r['context_entries']} / {r['accelerator_entries']} | "
        f"{r['filled']} | {r['plural_entries_filled']} / {r['plural_entries']} | {len(r['left_out'])}"
        f"{': ' + reasons if reasons else ''} | {verdict} | `{forms}` | {r['chrf']:.1f} | {r['bleu']:.1f} |",
    ]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("data"), help="a corpus (model.corpus) directory")
    p.add_argument("--bundle", type=Path, default=Path("bundles/en-es-small"))
    p.add_argument("--limit", type=int, default=LIMIT, help="entries of the catalog kept")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0 = library default)")
    p.add_argument("--json", type=Path, help="write the report here")
    p.add_argument("--keep", type=Path, help="keep the .mo, template, human and machine catalogs here")
    args = p.parse_args(argv)
    try:
        report = evaluate(args.data, args.bundle, args.keep, args.limit, args.threads)
    except NoCatalog as e:
        # Reported, not raised: `make model-card` goes on and its card says why the section is missing.
        report = {"skipped": str(e)}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if "skipped" in report:
        print(f"held-out catalog not measured: {report['skipped']}", file=sys.stderr)
        return report
    print(
        f"{report['package']} {report['catalog']}: {report['filled']}/{report['entries']} entries filled "
        f"({report['plural_entries_filled']}/{report['plural_entries']} plural), "
        f"{len(report['left_out'])} left out, "
        f"{report['msgfmt']['command']}: {'clean' if report['msgfmt']['clean'] else 'ERRORS'}, "
        f"Plural-Forms {report['plural_forms']!r}, chrF {report['chrf']:.1f}, BLEU {report['bleu']:.1f} "
        f"({report['seconds']:.0f} s)",
        file=sys.stderr,
    )
    return report


if __name__ == "__main__":
    sys.exit(1 if "skipped" in main() else 0)
