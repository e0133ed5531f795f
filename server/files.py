"""File translation over the shared path: gettext catalogs (.po/.pot) and plain text.

Transport-independent (the HTTP API's /translate_file calls it): texts go through
`TranslationCore.translate` in requests of at most `max_texts` texts, a few at a time, so they are
batched, queued and limited like any other request. Catalogs are filled by runtime.po_catalog, the code
`python -m client po` uses: untranslated entries get a machine translation marked fuzzy, accelerators,
plurals and contexts are kept, and every filled entry is checked by the real `msgfmt -c` (one it rejects,
or one the service kept untranslated, is left untranslated with a translator comment saying why).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePath

from runtime.po_catalog import (
    CatalogError,
    fill,
    leave_out,
    markers_of,
    nplurals,
    plan,
    read_catalog,
    require_msgfmt,
    update_header,
    write_checked,
)
from server.contract import Hypothesis
from server.translate import INTERNAL, INVALID, Failure, OptionRequest, TranslationCore

GENERATOR = "translator HTTP API (/translate_file)"
CATALOG_SUFFIXES = (".po", ".pot")
TEXT_SUFFIXES = (".txt",)
SUFFIXES = CATALOG_SUFFIXES + TEXT_SUFFIXES
PARALLEL_REQUESTS = 4  # requests of one file in the scheduler at once


@dataclass
class FileResult:
    name: str  # the translated file's name: app.pot -> app.po, notes.txt -> notes.es.txt
    text: str
    filled: int = 0  # catalog entries filled / text lines translated
    left_out: list[str] = field(default_factory=list)  # why entries were left untranslated


def output_name(name: str, target: str) -> str:
    path = PurePath(name or "messages.po")
    if path.suffix in CATALOG_SUFFIXES:
        return path.stem + ".po"
    return f"{path.stem}.{target}{path.suffix}"


async def translate_many(
    core: TranslationCore, texts: Sequence[str], options: OptionRequest, request_id: str, stats: dict
) -> list[Hypothesis | None]:
    """The best hypothesis of every text (None for one the service refused alone, e.g. too long), in
    requests of at most `core.max_texts` texts. A refused request is retried text by text; overload,
    deadline and the like end the whole file (Failure). The text layer leaves `_ & ~` alone here
    (accelerators=False): a catalog's accelerators are runtime.po_catalog's, and a text file is prose."""
    results: list[Hypothesis | None] = [None] * len(texts)
    slots = asyncio.Semaphore(PARALLEL_REQUESTS)
    parts: list[dict] = []  # each request's counters, summed into the file's log line

    async def one(start: int, chunk: Sequence[str]) -> None:
        async with slots:
            try:
                parts.append({})
                out = await core.translate(
                    chunk, options, request_id=request_id, stats=parts[-1], accelerators=False
                )
            except Failure as f:
                if f.kind != INVALID or len(chunk) == 1:
                    if f.kind == INVALID:
                        return
                    raise
                for i, text in enumerate(chunk):
                    try:
                        parts.append({})
                        alone = await core.translate(
                            [text], options, request_id=request_id, stats=parts[-1], accelerators=False
                        )
                        results[start + i] = alone[0][0]
                    except Failure as g:
                        if g.kind != INVALID:
                            raise
                return
        for i, hyps in enumerate(out):
            results[start + i] = hyps[0]

    step = core.max_texts
    try:
        await asyncio.gather(*(one(i, texts[i : i + step]) for i in range(0, len(texts), step)))
    finally:
        stats["texts"] = len(texts)
        for key in ("segments", "input_tokens", "output_tokens", "queue_ms", "decode_ms"):
            total = sum(p.get(key, 0) for p in parts)
            stats[key] = round(total, 2) if isinstance(total, float) else total
    return results


async def translate_catalog(
    core: TranslationCore, text: str, name: str, options: OptionRequest, request_id: str, stats: dict
) -> FileResult:
    """Fill the untranslated entries of a .po/.pot given as text; Failure(INVALID) for a file that does
    not parse."""
    try:
        require_msgfmt()
    except CatalogError as e:
        raise Failure(INTERNAL, str(e)) from None
    try:
        po = read_catalog(name, text)
    except CatalogError as e:
        raise Failure(INVALID, str(e)) from None
    markers = markers_of(po, "auto")
    jobs, _skipped = plan(po, "untranslated", markers)
    update_header(po, PurePath(name).stem or "messages", GENERATOR, revised=bool(jobs))
    n_forms = nplurals(po)
    sources = [s for job in jobs for s in job.sources]
    best = await translate_many(core, sources, options, request_id, stats)
    i = 0
    for job in jobs:
        hyps = best[i : i + len(job.sources)]
        i += len(job.sources)
        if any(h is None for h in hyps):
            reason: str | None = "refused by the service (too long?)"
        else:
            job.results = list(hyps)
            reason = fill(job, n_forms, markers, True)
        if reason is not None:
            leave_out(job, reason)
    by_entry = {id(j.entry): j for j in jobs}
    try:
        checked = await asyncio.to_thread(write_checked, po, None, markers[:1], by_entry)
    except CatalogError as e:
        raise Failure(INVALID, str(e)) from None
    left = [f"{j.entry.msgid!r}: {j.entry.tcomment.splitlines()[-1]}" for j in jobs if not j.filled]
    return FileResult(output_name(name, "es"), checked.text, sum(j.filled for j in jobs), left)


async def translate_text_file(
    core: TranslationCore, text: str, name: str, options: OptionRequest, request_id: str, stats: dict
) -> FileResult:
    """Translate a plain text file line by line (blank lines and line ends kept; a line the service
    refuses stays as it was)."""
    lines = text.splitlines(keepends=True)
    todo = [i for i, line in enumerate(lines) if line.strip()]
    bodies = [lines[i].rstrip("\r\n") for i in todo]
    best = await translate_many(core, bodies, options, request_id, stats)
    left = []
    for i, body, hyp in zip(todo, bodies, best, strict=True):
        if hyp is None:
            left.append(body[:80])
            continue
        lines[i] = hyp.text + lines[i][len(body) :]
    return FileResult(output_name(name, "es"), "".join(lines), len(todo) - len(left), left)


async def translate_file(
    core: TranslationCore, data: bytes, name: str, options: OptionRequest, request_id: str, stats: dict
) -> FileResult:
    """A .po/.pot/.txt file's bytes (UTF-8) -> its Spanish version; Failure(INVALID) for another kind."""
    suffix = PurePath(name).suffix.lower()
    if suffix not in SUFFIXES:
        raise Failure(
            INVALID, f"unsupported file format {suffix or name!r}: send one of {', '.join(SUFFIXES)}"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise Failure(INVALID, f"{name} is not UTF-8 text: {e}") from None
    core.require_backend()
    run = translate_catalog if suffix in CATALOG_SUFFIXES else translate_text_file
    return await run(core, text, name, options, request_id, stats)
