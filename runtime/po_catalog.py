"""Catalog side of `python -m client po` (client.po) and of the HTTP API's /translate_file (server.files):
reading, resuming, choosing the entries to fill,
filling them, the header, and writing only what the real `msgfmt -c` accepts.

Entries are polib objects. A Job is one entry to translate: its source texts (msgid, and msgid_plural
for a plural entry) without their accelerator, and what the entry held before (to restore it when the
translation is left out).
"""

from __future__ import annotations

import bisect
import codecs
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

from runtime import subprocess_run
from runtime.languages import PluralForms, TargetLanguage, normalise_code, plural_forms, target_language
from runtime.po_text import (
    CREDIT_MSGIDS,
    catalog_markers,
    gettext_count,
    place_accelerator,
    strip_accelerator,
)
from runtime.subprocess_run import Cancellation, SubprocessCancelled, SubprocessTimeout

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


class CatalogTimeout(CatalogError):
    """msgfmt ran past CatalogLimits.msgfmt_timeout_s on a catalog."""


MAX_PLURAL_FORMS = 6  # the most any language has (Arabic); Spanish has 2


@dataclass(frozen=True)
class CatalogLimits:
    """What one catalog may cost; the defaults are the client's, the server takes its own from its
    configuration (server.files.FileLimits)."""

    max_entries: int = 100_000  # msgid lines (obsolete ones too)
    max_output_bytes: int = 64 * 1024 * 1024  # the catalog as written
    msgfmt_timeout_s: float = 120.0  # each msgfmt run (its cost grows with entries x plural forms)


def run_msgfmt(
    cmd: list[str], data: bytes | None, limits: CatalogLimits, cancel: Cancellation | None
) -> subprocess.CompletedProcess[bytes]:
    """msgfmt through the one subprocess runner: bounded by limits.msgfmt_timeout_s, killed on `cancel`."""
    try:
        return subprocess_run.run(cmd, input=data, timeout_s=limits.msgfmt_timeout_s, cancel=cancel)
    except SubprocessTimeout:
        raise CatalogTimeout(
            f"msgfmt took more than {limits.msgfmt_timeout_s:g} s to check this catalog and was stopped: "
            "split it into smaller catalogs"
        ) from None
    except SubprocessCancelled as e:
        raise CatalogError(str(e)) from None


@dataclass
class Job:
    entry: polib.POEntry
    sources: list[str]  # texts to send (accelerator stripped): msgid [, msgid_plural]
    accels: list[tuple[str, str, bool] | None]  # (marker, letter, on the first letter) per source
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


class _Content:
    """Catalog text that polib can only take as content. polib.pofile(str) treats a str naming an
    existing file as a path (its _is_file is os.path.isfile), so an upload whose whole content is
    `/etc/fstab` would read the server's own file; os.path.isfile raises TypeError for this object,
    which polib takes for "not a file", and its parser then only calls splitlines()."""

    def __init__(self, text: str) -> None:
        self.text = text

    def splitlines(self) -> list[str]:
        return self.text.splitlines()

    def __bool__(self) -> bool:
        return True


_CHARSET = re.compile(rb'"?Content-Type:.+? charset=([\w_\-:\.]+)')
_ENTRY = re.compile(rb"^[ \t]*(?:#~[ \t]*)?msgid[ \t]", re.MULTILINE)
_MSGFMT_LINE = re.compile(r"<stdin>:(\d+):(?:\d+:)? (.*)")


def decode_catalog(data: bytes, name: str) -> str:
    """The text of a catalog's bytes, in the charset its header declares (UTF-8 when it declares none or
    one Python does not know, as msgfmt reads a template's `charset=CHARSET`)."""
    m = _CHARSET.search(data[:65536])
    charset = "utf-8"
    if m:
        try:
            charset = codecs.lookup(m.group(1).decode("ascii")).name
        except (LookupError, UnicodeDecodeError):
            pass
    try:
        return data.decode("utf-8-sig" if charset == "utf-8" else charset)
    except UnicodeDecodeError as e:
        raise CatalogError(f"{name}: not a readable gettext catalog: not {charset} text ({e})") from None


def check_syntax(data: bytes, name: str, limits: CatalogLimits, cancel: Cancellation | None = None) -> None:
    """CatalogError naming the lines when the real `msgfmt` rejects the catalog as it is. polib is
    lenient where msgfmt is not: it reads `msgid "Save` (no closing quote) as "Sav", and a catalog would
    come back silently changed."""
    proc = run_msgfmt(["msgfmt", "--use-fuzzy", "-o", os.devnull, "-"], data, limits, cancel)
    if proc.returncode == 0:
        return
    stderr = proc.stderr.decode("utf-8", "replace")
    found = [f"line {m.group(1)}: {m.group(2)}" for m in map(_MSGFMT_LINE.match, stderr.splitlines()) if m]
    found = [f for f in found if ": warning: " not in f] or [stderr.strip()[-300:]]
    more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
    raise CatalogError(f"{name}: not a readable gettext catalog: " + "; ".join(found[:5]) + more)


def read_catalog(
    data: bytes | str,
    name: str,
    limits: CatalogLimits | None = None,
    cancel: Cancellation | None = None,
) -> polib.POFile:
    """The one catalog reader: a .po/.pot from its content (bytes as read from a file, an upload or
    stdin; or str), never from a path. Refused with CatalogError (a message naming `name`): more
    entries than `limits.max_entries`, text not in its declared charset, anything `msgfmt` rejects
    (with its line numbers)."""
    limits = limits or CatalogLimits()
    raw = data if isinstance(data, bytes) else data.encode("utf-8")
    entries = len(_ENTRY.findall(raw))
    if entries > limits.max_entries:
        raise CatalogError(
            f"{name}: {entries} entries, more than the {limits.max_entries} a catalog may have here: "
            "split it into smaller catalogs"
        )
    text = decode_catalog(raw, name) if isinstance(data, bytes) else data.removeprefix("\ufeff")
    require_msgfmt()
    check_syntax(raw, name, limits, cancel)
    try:
        return polib.pofile(_Content(text), encoding="utf-8", wrapwidth=78)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise CatalogError(f"{name}: not a readable gettext catalog: {e}") from None


def read_catalog_file(path: str | Path, limits: CatalogLimits | None = None) -> polib.POFile:
    """read_catalog of a file's bytes (the client's inputs and outputs)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise CatalogError(f"{path}: cannot read it: {e.strerror or e}") from None
    return read_catalog(data, str(path), limits)


def nplurals(po: polib.POFile, target: str = "es", name: str | None = None) -> int:
    """The number of plural forms the header declares (2, Spanish's, when it declares none). Every
    plural entry gets that many msgstr forms and msgfmt -c's cost grows with its square, so a number no
    language has is refused (CatalogError) rather than obeyed. `target` / `name`: the target language's
    code and the name the message gives it (default: the code); the message quotes its Plural-Forms."""
    m = re.search(r"nplurals\s*=\s*(\d+)", po.metadata.get("Plural-Forms", ""))
    if not m:
        return 2
    digits = m.group(1).lstrip("0") or "0"
    if len(digits) > 3 or not 1 <= int(digits) <= MAX_PLURAL_FORMS:
        shown = digits if len(digits) <= 12 else f"{digits[:6]}... ({len(digits)} digits)"
        expected = target_plural_header(target)
        n_expected = re.search(r"nplurals\s*=\s*(\d+)", expected)
        count = n_expected.group(1) if n_expected else "?"
        raise CatalogError(
            f"the header's Plural-Forms declares nplurals={shown}: {name or target} has {count} plural "
            f"forms ({expected}) and no language has more than {MAX_PLURAL_FORMS}; fix the header"
        )
    return int(digits)


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


def plural_header(forms: PluralForms) -> str:
    """A Plural-Forms value as msginit writes it (the expression in parentheses: `plural=(n != 1);`),
    so a filled catalog reads like one a translator started with msginit."""
    expr, depth, whole = forms.plural, 0, forms.plural.startswith("(")
    for i, c in enumerate(expr):
        depth += (c == "(") - (c == ")")
        if depth == 0 and i < len(expr) - 1:
            whole = False  # "(n == 1) ? 0 : 1": the first parenthesis closes before the end
    return f"nplurals={forms.nplurals}; plural={expr if whole else f'({expr})'};"


def target_plural_header(target: str) -> str:
    """The Plural-Forms gettext gives `target` (runtime/languages.json), as msginit writes it, for
    nplurals()'s message; "no rule known" for a language without data."""
    try:
        return plural_header(plural_forms(target))
    except KeyError:
        return "no rule known"


def _same_language(declared: str, target: TargetLanguage | None, code: str) -> bool:
    """Whether a catalog's Language header already names the target language: the same code, or a
    region of a target that has none (es_MX is Spanish); one variety never stands for another."""
    declared = normalise_code(declared) if declared.strip() else ""
    names = {normalise_code(code)} | ({normalise_code(target.gettext_language)} if target else set())
    return declared in names or (
        "_" not in normalise_code(code) and declared.partition("_")[0] == normalise_code(code)
    )


def update_header(
    po: polib.POFile, stem: str, generator: str, revised: bool, target: str | None = None
) -> None:
    """The header for the target language (`target`, a code runtime.languages knows; None: Spanish,
    as the client writes it): Language and Plural-Forms (when missing, not a valid rule, or the catalog
    names another language), UTF-8, and the template's placeholder values replaced as msginit does;
    PO-Revision-Date is now when `revised`. A catalog already of the target language keeps its own
    Plural-Forms (its translators' choice), bounded by nplurals() like any other."""
    md = po.metadata
    language = md.get("Language", "")
    try:
        lang = target_language(target) if target is not None else None
    except KeyError:
        lang = None  # a target without data: its code as Language, the catalog's own rule
    code = target if target is not None else "es"
    header_language = lang.gettext_language if lang else normalise_code(code)
    rule = SPANISH_PLURALS if target is None else (plural_header(lang.plural_forms) if lang else "")
    if md.get("Project-Id-Version", TEMPLATE_DEFAULTS["Project-Id-Version"]) in ("", "PACKAGE VERSION"):
        md["Project-Id-Version"] = stem
    if revised or md.get("PO-Revision-Date", "") in ("", TEMPLATE_DEFAULTS["PO-Revision-Date"]):
        md["PO-Revision-Date"] = time.strftime("%Y-%m-%d %H:%M%z")
    for name, value in (("Last-Translator", "Automatically generated"), ("Language-Team", "none")):
        if md.get(name, TEMPLATE_DEFAULTS[name]) in ("", TEMPLATE_DEFAULTS[name]):
            md[name] = value
    same = _same_language(language, lang, code)
    if not same:
        md["Language"] = header_language
    md.setdefault("MIME-Version", "1.0")
    md["Content-Type"] = "text/plain; charset=UTF-8"
    md.setdefault("Content-Transfer-Encoding", "8bit")
    plural = md.get("Plural-Forms", "")
    valid = re.search(r"nplurals\s*=\s*\d+\s*;\s*plural\s*=", plural)
    # Another language's rule (or a template's placeholder) would pick the wrong msgstr[i] for a count;
    # an empty catalog Language with a rule is a template someone headed: it is the target's rule then.
    if rule and (not valid or (language and not same) or (not language and target is not None)):
        md["Plural-Forms"] = rule
    elif not valid and not rule and any(e.msgid_plural for e in po):
        raise CatalogError(
            f"no plural forms are known for {code}: give the catalog's header a Plural-Forms for it"
        )
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


def msgfmt_errors(
    text: str, accel: str, limits: CatalogLimits | None = None, cancel: Cancellation | None = None
) -> list[tuple[int, str]]:
    """(line, message) of every error of the real `msgfmt -c` on the catalog `text` (warnings left
    out). Fuzzy entries are checked too (--use-fuzzy): msgfmt skips them otherwise, and machine output is
    fuzzy. The text goes through stdin: no temporary file to hold, whatever its size."""
    limits = limits or CatalogLimits()
    cmd = ["msgfmt", "-c", "--use-fuzzy", "-o", os.devnull, "-"]
    if accel:
        cmd[2:2] = [f"--check-accelerators={accel}"]
    proc = run_msgfmt(cmd, text.encode("utf-8"), limits, cancel)
    stderr = proc.stderr.decode("utf-8", "replace")
    errors: list[tuple[int, str]] = []
    for line in stderr.splitlines():
        m = _MSGFMT_LINE.match(line)
        if m:
            errors.append((int(m.group(1)), m.group(2)))
        elif errors and not line.startswith(("msgfmt:", "<stdin>")):
            errors[-1] = (errors[-1][0], errors[-1][1] + " " + line.strip())
    errors = [(n, msg) for n, msg in errors if not msg.startswith("warning:")]
    if proc.returncode != 0 and not errors:
        raise CatalogError(f"msgfmt -c failed: {stderr.strip()[-500:]}")
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


def write_checked(
    po: polib.POFile,
    path: Path | None,
    accel: str,
    jobs: dict[int, Job],
    limits: CatalogLimits | None = None,
    cancel: Cancellation | None = None,
) -> Checked:
    """Write `po` to `path` (None: only render it) so that every entry filled by this run passes
    `msgfmt -c`: each one msgfmt rejects is left out (restored, with a comment), then the catalog is
    checked again. Written atomically (a temporary file, renamed). CatalogError when the catalog is
    larger than `limits.max_output_bytes`."""
    limits = limits or CatalogLimits()
    left: list[tuple[Job, str]] = []
    for _ in range(5):
        text, starts, entries = render(po)
        size = len(text.encode("utf-8"))
        if size > limits.max_output_bytes:
            raise CatalogError(
                f"the translated catalog would be {size} bytes, more than the {limits.max_output_bytes} "
                "allowed: split it into smaller catalogs"
            )
        others, bad = [], {}
        for line, message in msgfmt_errors(text, accel, limits, cancel):
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
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    lines = {id(e): s for e, s in zip(entries, starts, strict=True) if e is not None}
    return Checked(text, left, others, lines)
