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
order), then the others in order. The work is bench.held_out_catalog's (the model card's "Held-out
catalog" section runs it on a test-split package); this is its command line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.held_out_catalog import build, read, score


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
    if args.cmd == "build":
        pot, ref = build(read(Path(args.catalog)), args.limit)
        Path(args.ref).parent.mkdir(parents=True, exist_ok=True)
        ref.save(args.ref)
        pot.save(args.pot)
        print(f"{args.pot}: {len(pot)} entries; {args.ref}: the human translation", file=sys.stderr)
    else:
        result = score(read(Path(args.output)), read(Path(args.reference)))
        print(json.dumps(result, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
