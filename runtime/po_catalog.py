"""Catalog side of `python -m client po` (client.po) and of the HTTP API's /translate_file (server.files):
reading, resuming, choosing the entries to fill,
filling them, the header, and writing only what the real `msgfmt -c` accepts.

Entries are polib objects. A Job is one entry to translate: its source texts (msgid, and msgid_plural
for a plural entry) without their accelerator, and what the entry held before (to restore it when the
translation is left out).
"""

from __future__ import annotations

import bisect
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import polib

from runtime.po_text import (
    CREDIT_MSGIDS,
    catalog_markers,
    gettext_count,
    place_accelerator,
    strip_accelerator,
)

LEFT_OUT = "machine translation left out: "
TRIVIAL_NOTE = "nothing to translate"
SPANISH_PLURALS = "nplurals=2; plural=(n != 1);"
TEMPLATE_DEFAULTS = {
    "Project-Id-Version": "PACKAGE VERSION",
    "PO-Revision-Date": "YEAR-MO-DA HO:MI+ZONE",
    "Last-Translator": "FULL NAME <EMAIL@ADDRESS>",
    "Language-Team": "LANGUAGE <LL@li.org>",
}
_FIELDS = ("msgstr", "msgstr_plural", "flags", "tcomment", "previous_msgctxt", "previous_msgid")
_FIELDS += ("previous_msgid_plural",)


class CatalogError(Exception):
    """A catalog that cannot be read or written as asked (message for the user)."""


@dataclass
class Job:
    entry: polib.POEntry
    sources: list[str]  # texts to send (accelerator stripped): msgid [, msgid_plural]
    accels: list[tuple[str, str] | None]  # (marker, letter) per source
    overwrite: bool  # whether existing msgstr forms may be replaced
    saved: dict = field(default_factory=dict)  # the entry's fields before it was filled
    results: list | None = field(default_factory=list)  # client.core.Translation per source; None: failed
    pending: int = 0  # sources still being translated
    reason: str | None = None  # why it failed (results None)
    filled: bool = False


def key(e: polib.POEntry) -> tuple[str | None, str]:
    return e.msgctxt, e.msgid


def forms(e: polib.POEntry) -> tuple[str, ...]:
    """The msgstr(s) of an entry, empty ones included."""
    if e.msgid_plural:
        return tuple(e.msgstr_plural.get(i, "") for i in sorted(e.msgstr_plural or {0: ""}))
    return (e.msgstr,)


def has_translation(e: polib.POEntry) -> bool:
    return any(forms(e))


def read_catalog(source: str | Path, text: str | None = None) -> polib.POFile:
    """A .po/.pot from a path, or from `text` (stdin); CatalogError when it does not parse."""
    try:
        po = polib.pofile(text if text is not None else str(source), wrapwidth=78)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise CatalogError(f"{source}: not a readable gettext catalog: {e}") from None
    return po


def nplurals(po: polib.POFile) -> int:
    m = re.search(r"nplurals\s*=\s*(\d+)", po.metadata.get("Plural-Forms", ""))
    return int(m.group(1)) if m and int(m.group(1)) > 0 else 2


def left_out_comment(e: polib.POEntry) -> str:
    """The entry's translator comment without the one leave_out() added: always the last one, and
    written over several lines when long (polib wraps comments)."""
    lines = (e.tcomment or "").split("\n")
    ours = [i for i, line in enumerate(lines) if line.startswith(LEFT_OUT)]
    return "\n".join(lines[: ours[0]] if ours else lines)


def merge_previous(po: polib.POFile, out: polib.POFile, mode: str) -> set[int]:
    """Resume: take from `out` (an earlier output for the template `po`) every translation of an entry
    that the earlier run (or a person) already filled, and its header's translation fields. A translation
    counts as filled when `out` has one that differs from `po`'s own. Entries of `out` that `po` lacks are
    kept, as obsolete, with `out`'s obsolete ones. Returns the id() of the entries taken. CatalogError
    when `po` is not `out`'s template: fewer than half of `out`'s msgids are in `po`."""
    previous = {key(e): e for e in out if not e.obsolete}
    common = sum(1 for e in po if not e.obsolete and key(e) in previous)
    if previous and 2 * common < len(previous):
        raise CatalogError(
            f"it exists and is not a translation of this input ({common} of its {len(previous)} msgids "
            "are in the input)"
        )
    taken: set[int] = set()
    seen = {key(e) for e in po}
    for e in po:
        o = None if e.obsolete else previous.get(key(e))
        if o is None or not has_translation(o) or forms(o) == forms(e):
            continue
        if has_translation(e) and not selected(e, mode):
            continue  # the input's own translation, not to be replaced: it stays
        e.msgstr, e.msgstr_plural = o.msgstr, dict(o.msgstr_plural)
        e.flags = (["fuzzy"] if o.fuzzy else []) + [f for f in e.flags if f != "fuzzy"]
        e.tcomment = o.tcomment
        e.previous_msgctxt = e.previous_msgid = e.previous_msgid_plural = None
        taken.add(id(e))
    for o in out:
        if key(o) not in seen and (o.obsolete or has_translation(o)):
            o.obsolete = True
            seen.add(key(o))
            po.append(o)
    for name, value in out.metadata.items():
        if name not in ("POT-Creation-Date", "Project-Id-Version", "Report-Msgid-Bugs-To"):
            po.metadata[name] = value
    if out.header.strip():
        po.header = out.header
    return taken


def selected(e: polib.POEntry, mode: str) -> bool:
    """Whether `mode` ("untranslated", "fuzzy", "all") translates `e` (a non-obsolete entry)."""
    if not has_translation(e):
        return True
    if e.fuzzy:
        return mode in ("fuzzy", "all")
    return mode == "all" or not e.translated()  # an incomplete plural entry gets its empty forms


def plan(
    po: polib.POFile, mode: str, markers: str, resumed: set[int] = frozenset()
) -> tuple[list[Job], Counter[str]]:
    """The entries to translate, and why the others are skipped; `resumed` entries (filled by an
    earlier run) are neither."""
    jobs: list[Job] = []
    skipped: Counter[str] = Counter()
    for e in po:
        if e.obsolete:
            skipped["obsolete"] += 1
        elif not e.msgid or id(e) in resumed:
            continue
        elif e.msgid.strip().lower() in CREDIT_MSGIDS:
            skipped["translator credits"] += 1
        elif not selected(e, mode):
            skipped["fuzzy (--fuzzy translates them)" if e.fuzzy else "already translated"] += 1
        else:
            texts = [e.msgid] + ([e.msgid_plural] if e.msgid_plural else [])
            stripped = [strip_accelerator(t, markers) for t in texts]
            overwrite = mode == "all" or (e.fuzzy and mode == "fuzzy")
            saved = {f: getattr(e, f) for f in _FIELDS}
            saved["msgstr_plural"] = dict(e.msgstr_plural)
            saved["flags"] = list(e.flags)
            jobs.append(Job(e, [s for s, _ in stripped], [a for _, a in stripped], overwrite, saved))
    return jobs, skipped


def markers_of(po: polib.POFile, choice: str) -> str:
    """Accelerator markers: `choice` ("auto", "none" or the markers themselves)."""
    if choice == "none":
        return ""
    if choice != "auto":
        return choice
    msgids = [t for e in po if not e.obsolete and e.msgid for t in (e.msgid, e.msgid_plural) if t]
    return catalog_markers(msgids, po.metadata.get("X-Accelerator-Marker", "").strip()[:1])


def update_header(po: polib.POFile, stem: str, generator: str, revised: bool) -> None:
    """Spanish header: Language, Plural-Forms (when missing or not Spanish), UTF-8, and the template's
    placeholder values replaced as msginit does; PO-Revision-Date is now when `revised`."""
    md = po.metadata
    language = md.get("Language", "")
    if md.get("Project-Id-Version", TEMPLATE_DEFAULTS["Project-Id-Version"]) in ("", "PACKAGE VERSION"):
        md["Project-Id-Version"] = stem
    if revised or md.get("PO-Revision-Date", "") in ("", TEMPLATE_DEFAULTS["PO-Revision-Date"]):
        md["PO-Revision-Date"] = time.strftime("%Y-%m-%d %H:%M%z")
    for name, value in (("Last-Translator", "Automatically generated"), ("Language-Team", "none")):
        if md.get(name, TEMPLATE_DEFAULTS[name]) in ("", TEMPLATE_DEFAULTS[name]):
            md[name] = value
    if not language.lower().startswith("es"):
        md["Language"] = "es"
    md.setdefault("MIME-Version", "1.0")
    md["Content-Type"] = "text/plain; charset=UTF-8"
    md.setdefault("Content-Transfer-Encoding", "8bit")
    plural = md.get("Plural-Forms", "")
    if not re.search(r"nplurals\s*=\s*\d+\s*;\s*plural\s*=", plural) or (
        language and not language.lower().startswith("es")
    ):
        md["Plural-Forms"] = SPANISH_PLURALS
    md["X-Generator"] = generator
    po.metadata_is_fuzzy = False
    po.encoding = "utf-8"


def fill(job: Job, n_forms: int, markers: str, fuzzy: bool) -> str | None:
    """Put `job.results` into its entry; the reason when the translation is left out instead."""
    e = job.entry
    texts = []
    originals = [e.msgid] + ([e.msgid_plural] if e.msgid_plural else [])
    for source, original, accel, t in zip(job.sources, originals, job.accels, job.results, strict=True):
        for n in t.notes:
            if n.action == "passed_through" and n.reason != TRIVIAL_NOTE:
                return f"kept untranslated by the service: {source[n.start : n.end]!r} ({n.reason})"
        text = t.text
        if not text.strip():
            return "empty translation: the service returned nothing"
        if accel is not None:
            text = place_accelerator(text, *accel)
            if text is None:
                return f"accelerator: no letter to put {accel[0]!r} on"
        for mark in markers:
            if gettext_count(original, mark) == 1 and gettext_count(text, mark) != 1:
                return f"accelerator: {mark!r} not exactly once in the translation"
        texts.append(text)
    if e.msgid_plural:
        old = job.saved["msgstr_plural"]
        new = {i: texts[min(i, len(texts) - 1)] for i in range(n_forms)}
        if not job.overwrite:
            new = {i: old.get(i) or v for i, v in new.items()}
        e.msgstr_plural = new
    else:
        e.msgstr = texts[0]
    e.flags = (["fuzzy"] if fuzzy else []) + [f for f in e.flags if f != "fuzzy"]  # msgmerge's order
    e.tcomment = left_out_comment(e)
    e.previous_msgctxt = e.previous_msgid = e.previous_msgid_plural = None
    job.filled = True
    return None


def leave_out(job: Job, reason: str) -> None:
    """Restore the entry as it was, with a translator comment saying why it was not filled."""
    e = job.entry
    for name, value in job.saved.items():
        setattr(e, name, value)
    e.msgstr_plural = dict(job.saved["msgstr_plural"])
    e.flags = list(job.saved["flags"])
    comment = left_out_comment(e)
    e.tcomment = (comment + "\n" if comment else "") + LEFT_OUT + " ".join(reason.split())
    job.filled = False


def render(po: polib.POFile) -> tuple[str, list[int], list[polib.POEntry | None]]:
    """The catalog as polib writes it, with the first line (1-based) of every entry; None stands for
    the header."""
    head = "".join(
        "#\n" if not h else (f"#{h}\n" if h[:1] in ",:" else f"# {h}\n") for h in po.header.split("\n")
    )
    entries: list[polib.POEntry | None] = [None]
    entries += [e for e in po if not e.obsolete] + po.obsolete_entries()
    parts = [po.metadata_as_entry().__unicode__(po.wrapwidth)]
    parts += [e.__unicode__(po.wrapwidth) for e in entries[1:]]
    starts, line = [], 1 + head.count("\n")
    for part in parts:
        starts.append(line)
        line += part.count("\n") + 1
    text = head + "\n".join(parts)
    return (text if text.endswith("\n") else text + "\n"), starts, entries


def msgfmt_errors(path: str, accel: str) -> list[tuple[int, str]]:
    """(line, message) of every error of the real `msgfmt -c` (warnings left out). Fuzzy entries are
    checked too (--use-fuzzy): msgfmt skips them otherwise, and machine output is fuzzy."""
    cmd = ["msgfmt", "-c", "--use-fuzzy", "-o", os.devnull, path]
    if accel:
        cmd[2:2] = [f"--check-accelerators={accel}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    errors: list[tuple[int, str]] = []
    prefix = re.compile(re.escape(path) + r":(\d+): (.*)")
    for line in proc.stderr.splitlines():
        m = prefix.match(line)
        if m:
            errors.append((int(m.group(1)), m.group(2)))
        elif errors and not line.startswith(("msgfmt:", path)):
            errors[-1] = (errors[-1][0], errors[-1][1] + " " + line.strip())
    errors = [(n, msg) for n, msg in errors if not msg.startswith("warning:")]
    if proc.returncode != 0 and not errors:
        raise CatalogError(f"msgfmt -c failed: {proc.stderr.strip()[-500:]}")
    return errors


def require_msgfmt() -> None:
    if shutil.which("msgfmt") is None:
        raise CatalogError(
            "msgfmt (GNU gettext) is needed to check every entry before it is written: "
            "install gettext (apt-get install gettext, brew install gettext)"
        )


@dataclass
class Checked:
    text: str  # the catalog as written
    left_out: list[tuple[Job, str]]  # jobs reset for msgfmt -c, with its message
    other_errors: list[tuple[int, str]]  # msgfmt errors of entries this run did not fill (line, message)
    lines: dict[int, int]  # id(entry) -> first line in `text`


def write_checked(po: polib.POFile, path: Path | None, accel: str, jobs: dict[int, Job]) -> Checked:
    """Write `po` to `path` (None: only render it) so that every entry filled by this run passes
    `msgfmt -c`: each one msgfmt rejects is left out (restored, with a comment), then the catalog is
    checked again. Written atomically (a temporary file, renamed)."""
    left: list[tuple[Job, str]] = []
    directory = path.parent if path is not None else None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name if path else 'stdout'}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        for _ in range(5):
            text, starts, entries = render(po)
            Path(tmp).write_text(text, encoding="utf-8")
            others, bad = [], {}
            for line, message in msgfmt_errors(tmp, accel):
                e = entries[max(0, bisect.bisect_right(starts, line) - 1)]
                job = jobs.get(id(e)) if e is not None else None
                if job is not None and job.filled:
                    bad.setdefault(id(e), (job, message))
                else:
                    others.append((line, message))
            if not bad:
                break
            for job, message in bad.values():
                leave_out(job, f"msgfmt -c: {message}")
                left.append((job, message))
        else:
            raise CatalogError("msgfmt -c still fails after leaving out the entries it rejected")
        if path is not None:
            os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
            os.replace(tmp, path)
        lines = {id(e): s for e, s in zip(entries, starts, strict=True) if e is not None}
        return Checked(text, left, others, lines)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
