"""Translate gettext catalogs (.pot/.po) into .po files with a running translation server: into the
language of --to, else of each catalog's Language header, else Spanish.

    python -m client po po/app.pot -o po/es.po                # fill the untranslated entries
    python -m client po po/es.po -o po/es.po --fuzzy          # in place, fuzzy entries too
    python -m client po po/ -o locale/es/                     # every .pot of po/ (else every .po)
    python -m client po - -o - < app.pot > es.po              # stdin to stdout

Untranslated entries are filled (--fuzzy: fuzzy ones too, --all: every entry); existing translations,
obsolete entries, msgctxt, comments, references and flags are kept; a plural entry gets every form of
the header's Plural-Forms (Spanish: msgstr[0] from msgid, msgstr[1] from msgid_plural). The header gets
the target's Language, its Plural-Forms when missing, charset UTF-8. Machine translations are marked
fuzzy (needs review) unless --no-fuzzy. Menu accelerators (_Save, &Save, ~Save) are stripped before
translation and put back on one letter (--accelerator). An entry is written only if the real
`msgfmt -c` accepts it; one it rejects, or one whose text the service kept untranslated, is left
untranslated with a translator comment `# machine translation left out: REASON`.

Resuming: OUT is written every --save-every entries and on Ctrl-C; when OUT exists, its filled entries
are kept and not sent again, so rerunning the same command finishes the job.

Directory or several inputs: OUT is a directory and each output keeps its input's name with .po
(app.pot -> OUT/app.po). Exit status as `python -m client` (0 ok, 2 usage, 3 server unreachable, ...,
130 interrupted); entries left untranslated do not change it.

Modules: runtime.po_catalog (reading, resuming, filling, header, msgfmt checks), client.po_stream
(TranslateStream), runtime.po_text (accelerators). Documentation: docs/service.md, "Translating gettext
catalogs".
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import polib

from client.cli import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    add_connection_args,
    add_translation_args,
    client_from_args,
    explain,
    read_glossary,
    translation_options,
)
from client.core import TranslatorError
from client.po_stream import Run, stream
from runtime.po_catalog import (
    CatalogError,
    Job,
    fill,
    leave_out,
    markers_of,
    merge_previous,
    nplurals,
    plan,
    read_catalog,
    read_catalog_file,
    require_msgfmt,
    update_header,
    write_checked,
)

EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m client po", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("inputs", nargs="+", metavar="IN", help=".pot/.po files, directories, or - (stdin)")
    add_connection_args(p)
    p.add_argument("-o", "--output", metavar="OUT", help="the .po to write, a directory, or - (stdout)")
    p.add_argument(
        "--to",
        dest="target_language",
        default="",
        metavar="LANG",
        help="target language, e.g. fr or pt-BR (default: each catalog's Language header, else es)",
    )
    p.add_argument(
        "--from", dest="source_language", default="", metavar="LANG", help="source language (default: en)"
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument("--fuzzy", action="store_true", help="re-translate fuzzy entries too")
    what.add_argument("--all", action="store_true", help="re-translate every entry")
    p.add_argument("--no-fuzzy", action="store_true", help="do not mark machine translations fuzzy")
    p.add_argument(
        "--accelerator",
        default="auto",
        metavar="CHARS",
        help="accelerator markers among _ & ~, the catalog's first; none; or auto: the header's "
        "X-Accelerator-Marker, else what the msgids use (default: %(default)s)",
    )
    add_translation_args(p)
    p.add_argument("--batch-size", type=int, default=16, help="texts per stream item (default: 16)")
    p.add_argument("--parallel", type=int, default=4, help="stream items in flight (default: 4)")
    p.add_argument(
        "--save-every",
        type=int,
        default=100,
        metavar="N",
        help="write OUT after every N filled entries, at most once per 5 times the last write took "
        "(default: %(default)s; OUT is written at the end and on Ctrl-C too)",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per stream item (default: 120)")
    p.add_argument("--retries", type=int, default=3, help="retries of an item the server is too busy for")
    p.add_argument("--wait-s", type=float, default=30.0, help="wait for the server to be ready (s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--no-notes", action="store_true", help="do not list the entries left untranslated")
    return p


# ---- what to translate where ------------------------------------------------------------------------


class UsageError(Exception):
    pass


def plan_files(inputs: list[str], output: str | None) -> list[tuple[str, str]]:
    """(input, output) pairs; "-" is stdin/stdout."""
    if "-" in inputs:
        if len(inputs) > 1:
            raise UsageError("- (stdin) must be the only input")
        return [("-", output or "-")]
    files: list[Path] = []
    many = len(inputs) > 1
    for name in inputs:
        path = Path(name)
        if path.is_dir():
            found = sorted(path.glob("*.pot")) or sorted(path.glob("*.po"))
            if not found:
                raise UsageError(f"{name}: no .pot or .po file in this directory")
            files += found
            many = True
        elif path.is_file():
            files.append(path)
        else:
            raise UsageError(f"{name}: no such file or directory")
    if output is None:
        raise UsageError("-o OUT is required (a .po file, a directory, or - for stdout)")
    if output == "-":
        if many:
            raise UsageError("-o - (stdout) takes a single input")
        return [(str(files[0]), "-")]
    out = Path(output)
    if not many and not out.is_dir() and not output.endswith(os.sep):
        return [(str(files[0]), output)]
    if out.exists() and not out.is_dir():
        raise UsageError(f"{output}: several inputs need a directory as OUT")
    pairs = [(str(f), str(out / (f.stem + ".po"))) for f in files]
    names = Counter(o for _, o in pairs)
    if any(n > 1 for n in names.values()):
        raise UsageError(f"two inputs would both write {next(o for o, n in names.items() if n > 1)}")
    return pairs


# ---- one catalog ------------------------------------------------------------------------------------


@dataclass
class Outcome:
    name: str
    filled: int = 0
    resumed: int = 0
    left_out: list[tuple[int, str, str]] = field(default_factory=list)  # (line, msgid, reason)
    skipped: Counter = field(default_factory=Counter)
    other_errors: list[tuple[int, str]] = field(default_factory=list)
    seconds: float = 0.0
    interrupted: bool = False

    def summary(self) -> str:
        rate = self.filled / self.seconds if self.seconds > 0 else 0.0
        parts = [f"{self.filled} filled"]
        if self.resumed:
            parts.append(f"{self.resumed} kept from the existing output")
        parts.append(f"{len(self.left_out)} left untranslated")
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
        parts.append(f"{sum(self.skipped.values())} skipped" + (f" ({skipped})" if skipped else ""))
        why = Counter(reason.split(":")[0] for _, _, reason in self.left_out)
        tail = "".join(f"\n  left untranslated, {n}: {r}" for r, n in why.most_common())
        stop = " (interrupted: rerun the same command to resume)" if self.interrupted else ""
        speed = f"; {rate:.1f} entries/s" if self.filled else ""
        return f"{self.name}: " + ", ".join(parts) + f"{speed}{stop}{tail}"


def catalog_language(run: Run, po: polib.POFile, name: str) -> str:
    """The language to translate a catalog into: --to, else its Language header, else "" (the default
    pair, English to Spanish). A language the server does not translate into is a CatalogError that
    names the served pairs (the server's own message), before anything is sent."""
    args = run.args
    language = args.target_language or po.metadata.get("Language", "").strip()
    if not language or language in run.checked:
        return language
    try:
        run.client.model_info(source_language=args.source_language, target_language=language)
    except TranslatorError as e:
        if e.code != grpc.StatusCode.INVALID_ARGUMENT:
            raise
        said = "--to" if args.target_language else f"its Language header ({language!r})"
        raise CatalogError(f"{name}: {said} is a language the server does not serve: {e.details}") from None
    run.checked.add(language)
    return language


def translate_catalog(run: Run, source: str, target: str) -> Outcome:
    args = run.args
    if source == "-":
        # The bytes, parsed as a catalog: never taken for a path (a stdin of "/etc/fstab" is no catalog).
        stdin = getattr(sys.stdin, "buffer", None)
        po = read_catalog(stdin.read() if stdin is not None else sys.stdin.read(), "stdin")
    else:
        po = read_catalog_file(source)
    out_path = None if target == "-" else Path(target)
    outcome = Outcome(f"{source} -> {target}")
    mode = "all" if args.all else "fuzzy" if args.fuzzy else "untranslated"
    resumed: set[int] = set()
    in_place = source != "-" and out_path is not None and Path(source).resolve() == out_path.resolve()
    if out_path is not None and out_path.exists() and not in_place:
        try:
            resumed = merge_previous(po, read_catalog_file(target), mode)
        except CatalogError as e:
            raise UsageError(f"{target}: {e}; choose another OUT or remove it") from None
    outcome.resumed = len(resumed)
    stem = Path(source).stem if source != "-" else "messages"
    language = catalog_language(run, po, source)
    markers = markers_of(po, args.accelerator)
    jobs, outcome.skipped = plan(po, mode, markers, resumed)
    update_header(po, stem, run.generator, revised=bool(jobs), target=language or None)
    n_forms = nplurals(po, language or "es")
    by_entry = {id(j.entry): j for j in jobs}
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)

    progress = None
    if not args.no_progress and jobs:
        from tqdm import tqdm

        progress = tqdm(
            total=len(jobs),
            unit="entry",
            file=sys.stderr,
            disable=None,
            desc=out_path.name if out_path else "stdout",
        )
    reasons: dict[int, str] = {}
    last_save = {"n": 0, "cost": 0.0, "at": 0.0}

    def save(final: bool = False) -> None:
        started = time.monotonic()
        checked = write_checked(po, out_path, markers[:1], by_entry)
        for job, message in checked.left_out:
            reasons[id(job.entry)] = f"msgfmt -c: {message}"
        last_save.update(n=outcome.filled, cost=time.monotonic() - started, at=time.monotonic())
        if final:
            if out_path is None:
                sys.stdout.write(checked.text)
                sys.stdout.flush()
            outcome.other_errors = checked.other_errors
            for job in jobs:
                if id(job.entry) in reasons:
                    line = checked.lines.get(id(job.entry), 0)
                    outcome.left_out.append((line, job.entry.msgid, reasons[id(job.entry)]))
            outcome.filled = sum(1 for j in jobs if j.filled)

    def on_done(job: Job) -> None:
        reason = job.reason if job.results is None else fill(job, n_forms, markers, not args.no_fuzzy)
        if reason is not None:
            leave_out(job, reason)
            reasons[id(job.entry)] = reason
        else:
            outcome.filled += 1
        if progress is not None:
            progress.update(1)
        due = outcome.filled - last_save["n"] >= args.save_every
        if out_path is not None and due and time.monotonic() - last_save["at"] >= 5 * last_save["cost"]:
            save()

    started = time.monotonic()
    try:
        stream(run, jobs, on_done, (args.source_language, language))
    except KeyboardInterrupt:
        outcome.interrupted = True
    finally:
        outcome.seconds = time.monotonic() - started
        if progress is not None:
            progress.close()
        save(final=True)
    return outcome


# ---- main -------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.batch_size < 1 or args.parallel < 1 or args.save_every < 1 or args.wait_s < 0:
        print("error: --batch-size, --parallel and --save-every must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    if args.accelerator not in ("auto", "none") and (
        not args.accelerator or set(args.accelerator) - set("_&~")
    ):
        print("error: --accelerator takes auto, none, or markers among _ & ~", file=sys.stderr)
        return EXIT_USAGE
    try:
        pairs = plan_files(args.inputs, args.output)
        require_msgfmt()
        glossary = read_glossary(args.glossary, args.keep)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (CatalogError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    client = client_from_args(args)
    options = translation_options(args)
    status, started = EXIT_OK, False
    try:
        if args.wait_s > 0:
            client.wait_until_serving(
                args.wait_s,
                on_waiting=lambda: print(
                    f"waiting for the server at {args.target} to be ready... (up to {args.wait_s:g} s, "
                    "--wait-s)",
                    file=sys.stderr,
                    flush=True,
                ),
            )
        info = client.model_info()
        run = Run(
            args,
            client,
            f"python -m client po ({info.name} {info.version})".replace("  ", " "),
            info.limits.max_text_chars,
            glossary,
            options,
        )
        for source, target in pairs:
            started = True
            try:
                outcome = translate_catalog(run, source, target)
            except BrokenPipeError:
                raise
            except (CatalogError, OSError) as e:
                print(f"error: {e}", file=sys.stderr)
                status = EXIT_ERROR
                continue
            if not args.no_notes:
                for line, msgid, reason in outcome.left_out:
                    where = f"{target}:{line}" if target != "-" else f"line {line}"
                    print(f"note: {where}: {msgid[:60]!r} left untranslated: {reason}", file=sys.stderr)
                for line, message in outcome.other_errors:
                    note = f"note: {target}:{line}: msgfmt -c, not on a machine translation: {message}"
                    print(note, file=sys.stderr)
            print(outcome.summary(), file=sys.stderr)
            if outcome.interrupted:
                return EXIT_INTERRUPTED
        return status
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except TranslatorError as e:
        code, message = explain(e, args.target, args.wait_s)
        print(f"error: {message}", file=sys.stderr)
        if started:
            print("what was translated is written: rerun the same command to resume", file=sys.stderr)
        return code
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        client.close()
