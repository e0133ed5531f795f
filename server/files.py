"""File translation over the shared path: gettext catalogs (.po/.pot) and plain text.

Transport-independent (the HTTP API's /translate_file calls it): texts go through
`TranslationCore.translate` in requests of at most `max_texts` texts, a few at a time, so they are
batched, queued and limited like any other request. Catalogs are filled by runtime.po_catalog, the code
`python -m client po` uses: untranslated entries get a machine translation marked fuzzy, accelerators,
plurals and contexts are kept, and every filled entry is checked by the real `msgfmt -c` (one it rejects,
or one the service kept untranslated, is left untranslated with a translator comment saying why).

Files come from anyone who can reach the port, so what one may cost is bounded here, in one place
(`FileLimits`, set from the server's configuration): entries and output bytes per catalog, seconds per
msgfmt run (killed past them, or when the request is cancelled or the server stops), files in progress,
the share of the scheduler's queue all files together may hold, and the bytes kept for download. All
file work (parsing, planning, filling, msgfmt) runs in the file workers' own threads, never on the event
loop both transports share, and never in asyncio's default executor (which `asyncio.run` waits for at
exit).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import time
import unicodedata
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, TypeVar

from runtime.po_catalog import (
    CatalogError,
    CatalogLimits,
    CatalogTimeout,
    Job,
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
from runtime.subprocess_run import Cancellation
from server.contract import Hypothesis
from server.languages import bcp47, name_of
from server.translate import DEADLINE, INTERNAL, INVALID, OVERLOADED, UNAVAILABLE, Failure, OptionRequest

GENERATOR = "translator HTTP API (/translate_file)"
CATALOG_SUFFIXES = (".po", ".pot")
TEXT_SUFFIXES = (".txt",)
SUFFIXES = CATALOG_SUFFIXES + TEXT_SUFFIXES
PARALLEL_REQUESTS = 4  # requests of one file in the scheduler at once
MAX_NAME_CHARS = 120
STORED_FILE_OVERHEAD = 1024  # bytes a kept file counts for beyond its content: empty files are not free

T = TypeVar("T")
# source=auto: a file's texts -> the served source language they are in (Failure(INVALID) if none).
DetectSource = Callable[[Sequence[str]], Awaitable[str]]


@dataclass(frozen=True)
class FileLimits:
    """Everything a file may cost the server; server.config exposes the ones worth changing."""

    catalog: CatalogLimits = field(
        default_factory=lambda: CatalogLimits(
            max_entries=50_000, max_output_bytes=16 * 1024 * 1024, msgfmt_timeout_s=30.0
        )
    )
    workers: int = 2  # threads that parse, fill and check files (each msgfmt runs from one)
    max_files: int = 8  # files in progress at once; as many more wait for a slot, the rest get 429
    queue_share: float = 0.125  # share of the scheduler queue (texts) all files together may hold
    store_bytes: int = 64 * 1024 * 1024  # translated files kept for download, in bytes
    ttl_s: float = 900.0  # how long a translated file is kept for download
    public_url: str = ""  # the download links' base (https://host/prefix); "": links relative to the host

    @property
    def output_bytes(self) -> int:
        return self.catalog.max_output_bytes

    @classmethod
    def from_config(cls, config: Any) -> FileLimits:
        """The limits a server.config.ServerConfig sets (the others keep their defaults)."""
        return cls(
            catalog=CatalogLimits(
                max_entries=config.file_max_entries,
                max_output_bytes=config.file_max_output_bytes,
                msgfmt_timeout_s=config.file_check_timeout_s,
            ),
            workers=config.file_workers,
            queue_share=config.file_queue_share,
            store_bytes=config.download_store_bytes,
            ttl_s=config.download_ttl_s,
            public_url=config.http_public_url,
        )


@dataclass
class FileResult:
    name: str  # the translated file's name: app.pot -> app.po, notes.txt -> notes.es.txt
    text: str
    filled: int = 0  # catalog entries filled / text lines translated
    left_out: list[str] = field(default_factory=list)  # why entries were left untranslated


# ---- names -------------------------------------------------------------------------------------------


def safe_name(raw: str | None) -> str:
    """An uploaded file's name as one harmless path component: the last part of any path (either
    slash), without control and format characters (CR/LF/NUL end a header line) or quotes, at most
    MAX_NAME_CHARS characters (the suffix kept); "" when nothing is left."""
    name = (raw or "messages.po").replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(c for c in name if unicodedata.category(c)[0] != "C" and c not in "\"'<>|*?:;")
    name = name.strip(" .")  # "app.po." and " app.po" are app.po; ".po" alone is no name
    if len(name) > MAX_NAME_CHARS:
        suffix = PurePath(name).suffix[:16]
        name = name[: MAX_NAME_CHARS - len(suffix)] + suffix
    return name


def output_name(name: str, target: str) -> str:
    path = PurePath(name or "messages.po")
    if path.suffix.lower() in CATALOG_SUFFIXES:
        return path.stem + ".po"
    return f"{path.stem}.{target}{path.suffix}"


def content_disposition(name: str) -> str:
    """`attachment` with the name as RFC 6266 says: an ASCII fallback in `filename`, the real name
    percent-encoded in `filename*` (browsers prefer it); no byte of `name` can end the header or add a
    parameter."""
    fallback = "".join(c if " " <= c <= "~" and c not in '"\\%' else "_" for c in name)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{urllib.parse.quote(name, safe='')}"


def media_type(name: str) -> str:
    return "text/x-gettext-translation" if name.lower().endswith(".po") else "text/plain"


# ---- the download store ------------------------------------------------------------------------------


class StoreFull(Exception):
    def __init__(self, retry_after_s: float) -> None:
        super().__init__("the translated files kept for download fill the server's store")
        self.retry_after_s = retry_after_s


class DownloadStore:
    """Translated files kept `ttl_s` seconds for /download_file, at most `max_bytes` in all. A file is
    never evicted before its time: a new one that does not fit is refused (StoreFull, with how long until
    the oldest leaves), so no upload can take away another user's link. Expired files leave on every
    access and at their expiry (a timer), not only when the next upload arrives."""

    def __init__(self, max_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self.used = 0
        self._files: collections.OrderedDict[str, tuple[float, str, bytes]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._files)

    def sweep(self) -> None:
        now = self.clock()
        while self._files:
            file_id, (expires, _, data) = next(iter(self._files.items()))
            if expires > now:
                break
            del self._files[file_id]
            self.used -= len(data) + STORED_FILE_OVERHEAD

    def require_room(self, size: int = 0) -> None:
        """StoreFull unless a file of `size` bytes fits now."""
        self.sweep()
        if self.used + size + STORED_FILE_OVERHEAD > self.max_bytes:
            oldest = next(iter(self._files.values()))[0] if self._files else self.clock()
            raise StoreFull(max(1.0, oldest - self.clock()))

    def put(self, name: str, data: bytes) -> str:
        """Keep `data` under a new random id; StoreFull when it does not fit."""
        self.require_room(len(data))
        file_id = uuid.uuid4().hex
        self._files[file_id] = (self.clock() + self.ttl_s, name, data)
        self.used += len(data) + STORED_FILE_OVERHEAD
        try:
            asyncio.get_running_loop().call_later(self.ttl_s + 0.01, self.sweep)
        except RuntimeError:  # no loop (a unit test): every access sweeps anyway
            pass
        return file_id

    def get(self, file_id: str) -> tuple[str, bytes] | None:
        self.sweep()
        item = self._files.get(file_id)
        return None if item is None or item[0] <= self.clock() else (item[1], item[2])


# ---- the queue share ---------------------------------------------------------------------------------


class QueueShare:
    """Texts that all files together may have in the scheduler's queue at once (first come, first
    served). Without it each file kept PARALLEL_REQUESTS x max_texts texts queued (256 of the default
    1024): five files filled 948 and every other client waited behind them."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.used = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    async def acquire(self, n: int) -> None:
        if not self._waiting and self.used + n <= self.capacity:
            self.used += n
            return
        waiter = asyncio.get_running_loop().create_future()
        entry = (n, waiter)
        self._waiting.append(entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(n)  # granted as it was cancelled
            else:
                self._waiting.remove(entry)
                self._wake()
            raise

    def release(self, n: int) -> None:
        self.used -= n
        self._wake()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _wake(self) -> None:
        while self._waiting and self.used + self._waiting[0][0] <= self.capacity:
            n, waiter = self._waiting.popleft()
            if not waiter.done():
                self.used += n
                waiter.set_result(None)


# ---- translation -------------------------------------------------------------------------------------


async def translate_many(
    core: Any,
    texts: Sequence[str],
    options: OptionRequest,
    request_id: str,
    stats: dict,
    share: QueueShare | None = None,
    queue_wait_s: float = 30.0,
    pair: tuple[str, str] = ("", ""),
) -> list[Hypothesis | None]:
    """The best hypothesis of every text (None for one the service refused alone, e.g. too long), in
    requests of at most `core.max_texts` texts (and of the queue `share`, which they hold while queued).
    A refused request is retried text by text; each request waits in the scheduler's line for room in a
    full queue for up to `queue_wait_s` seconds (as any HTTP request: TranslationCore.translate's
    wait_until); past that, a deadline and the like end the whole file (Failure). The text layer
    leaves `_ & ~` alone here (accelerators=False): a catalog's accelerators are runtime.po_catalog's,
    and a text file is prose. `pair`: the (source, target) the texts are routed by (TranslationCore.route;
    empty: the default model)."""
    # Only a named pair is passed on: a core that serves one model takes no languages.
    languages = {"source_language": pair[0], "target_language": pair[1]} if any(pair) else {}
    results: list[Hypothesis | None] = [None] * len(texts)
    slots = asyncio.Semaphore(PARALLEL_REQUESTS)
    parts: list[dict] = []  # each request's counters, summed into the file's log line

    async def ask(chunk: Sequence[str]) -> list[list[Hypothesis]]:
        parts.append({})
        # A full queue is a moment, not a verdict on the file: the request waits in line for room.
        wait_until = time.monotonic() + queue_wait_s
        return await core.translate(
            chunk,
            options,
            request_id=request_id,
            stats=parts[-1],
            accelerators=False,
            wait_until=wait_until,
            **languages,
        )

    async def one(start: int, chunk: Sequence[str]) -> None:
        async with slots:
            if share is not None:
                await share.acquire(len(chunk))
            try:
                try:
                    out = await ask(chunk)
                except Failure as f:
                    if f.kind != INVALID or len(chunk) == 1:
                        if f.kind == INVALID:
                            return
                        raise
                    for i, text in enumerate(chunk):
                        try:
                            results[start + i] = (await ask([text]))[0][0]
                        except Failure as g:
                            if g.kind != INVALID:
                                raise
                    return
            finally:
                if share is not None:
                    share.release(len(chunk))
        for i, hyps in enumerate(out):
            results[start + i] = hyps[0]

    step = core.max_texts if share is None else max(1, min(core.max_texts, share.capacity))
    try:
        await asyncio.gather(*(one(i, texts[i : i + step]) for i in range(0, len(texts), step)))
    finally:
        stats["texts"] = len(texts)
        for key in ("segments", "input_tokens", "output_tokens", "queue_ms", "decode_ms"):
            total = sum(p.get(key, 0) for p in parts)
            stats[key] = round(total, 2) if isinstance(total, float) else total
        # Which model answered (set by the core when several are loaded): one per file, its pair's.
        model = next((p["model"] for p in parts if "model" in p), None)
        if model is not None:
            stats["model"] = model
    return results


@dataclass
class _Catalog:
    po: Any
    jobs: list[Job]
    markers: str
    n_forms: int


def _prepare_catalog(
    data: bytes, name: str, limits: CatalogLimits, cancel: Cancellation, target: str = "es"
) -> _Catalog:
    """Read, plan and head a catalog for the `target` language (in a file worker): everything before
    the translations."""
    po = read_catalog(data, name, limits, cancel)
    markers = markers_of(po, "auto")
    jobs, _skipped = plan(po, "untranslated", markers)
    update_header(po, PurePath(name).stem or "messages", GENERATOR, revised=bool(jobs), target=target)
    # After update_header: the Plural-Forms that will be written, bounded (a catalog's own is kept).
    n_forms = nplurals(po, target, name_of(bcp47(target)))
    return _Catalog(po, jobs, markers, n_forms)


def _finish_catalog(
    cat: _Catalog,
    best: list[Hypothesis | None],
    name: str,
    limits: CatalogLimits,
    cancel: Cancellation,
    target: str = "es",
) -> FileResult:
    """Fill the entries with their translations and write what msgfmt -c accepts (in a file worker)."""
    i = 0
    for job in cat.jobs:
        hyps = best[i : i + len(job.sources)]
        i += len(job.sources)
        if any(h is None for h in hyps):
            reason: str | None = "refused by the service (too long?)"
        else:
            job.results = list(hyps)
            reason = fill(job, cat.n_forms, cat.markers, True)
        if reason is not None:
            leave_out(job, reason)
    by_entry = {id(j.entry): j for j in cat.jobs}
    checked = write_checked(cat.po, None, cat.markers[:1], by_entry, limits, cancel)
    left = [f"{j.entry.msgid!r}: {j.entry.tcomment.splitlines()[-1]}" for j in cat.jobs if not j.filled]
    return FileResult(output_name(name, bcp47(target)), checked.text, sum(j.filled for j in cat.jobs), left)


def _split_text(data: bytes, name: str) -> tuple[list[str], list[int], list[str]]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise Failure(INVALID, f"{name} is not UTF-8 text: {e}") from None
    lines = text.splitlines(keepends=True)
    todo = [i for i, line in enumerate(lines) if line.strip()]
    return lines, todo, [lines[i].rstrip("\r\n") for i in todo]


class FileTranslator:
    """/translate_file's work: `await translate(data, name, request_id, stats)`, `close()` at shutdown.
    Owns the file workers (a bounded thread pool of its own), the queue share and the running msgfmt
    processes: a cancelled request kills its own, close() kills them all."""

    def __init__(self, core: Any, limits: FileLimits | None = None, queue_wait_s: float = 30.0) -> None:
        """queue_wait_s: how long a file waits for a slot (max_files in progress), and each of its
        requests for room in a full queue, before it fails with OVERLOADED (the HTTP port's
        HttpLimits.queue_wait_s)."""
        self.core = core
        self.limits = limits or FileLimits()
        self.queue_wait_s = queue_wait_s
        self.slots = QueueShare(self.limits.max_files)  # files in progress, first come first served
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.limits.workers, thread_name_prefix="file-work"
        )
        self.share = QueueShare(int(core.max_queue_segments * self.limits.queue_share))
        self.active: set[Cancellation] = set()
        self.closed = False

    def close(self) -> None:
        """Kill every msgfmt still running and drop the work not started: nothing of a file outlives the
        server's stop (its exit no longer waits for a check to end)."""
        self.closed = True
        for cancel in list(self.active):
            cancel.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def _call(self, cancel: Cancellation, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) in a file worker; the request's cancellation kills its msgfmt."""
        try:
            future = asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        except RuntimeError:  # the pool is shut down
            raise Failure(UNAVAILABLE, "the server is shutting down") from None
        try:
            return await future
        except asyncio.CancelledError:
            cancel.cancel()
            raise
        except concurrent.futures.CancelledError:  # dropped by close()
            raise Failure(UNAVAILABLE, "the server is shutting down") from None
        except CatalogTimeout as e:
            raise Failure(DEADLINE, str(e)) from None
        except CatalogError as e:
            if cancel.cancelled or self.closed:
                raise Failure(UNAVAILABLE, "the server is shutting down") from None
            raise Failure(INVALID, str(e)) from None

    async def translate(
        self,
        data: bytes,
        name: str,
        options: OptionRequest,
        request_id: str,
        stats: dict,
        pair: tuple[str, str] = ("", ""),
        detect_source: DetectSource | None = None,
    ) -> FileResult:
        """A .po/.pot/.txt file's bytes -> its version in `pair`'s target (routed as TranslationCore.route
        does; empty: the default model's). With `detect_source` (source=auto), pair's source is what it
        returns for the file's texts, before any is translated. Failure(INVALID) for another kind, an
        unserved pair or a file over the limits, Failure(OVERLOADED) when no slot frees within
        queue_wait_s (or as many files wait for one as may be in progress)."""
        suffix = PurePath(name).suffix.lower()
        if suffix not in SUFFIXES:
            raise Failure(
                INVALID, f"unsupported file format {suffix or name!r}: send one of {', '.join(SUFFIXES)}"
            )
        # Resolved before any work: an unserved pair is a 400 naming the served ones, and the catalog's
        # header is written for the target as the model serves it (pt -> pt_BR).
        if detect_source is None:
            _, pair = self.core.route(*pair)
        if self.closed:
            raise Failure(UNAVAILABLE, "the server is shutting down")
        await self._take_slot()
        cancel = Cancellation()
        self.active.add(cancel)
        try:
            if suffix in CATALOG_SUFFIXES:
                return await self._catalog(
                    cancel, data, name, options, request_id, stats, pair, detect_source
                )
            return await self._text(cancel, data, name, options, request_id, stats, pair, detect_source)
        finally:
            self.active.discard(cancel)
            self.slots.release(1)

    async def _take_slot(self) -> None:
        """One of the max_files slots, waited for in arrival order up to queue_wait_s; OVERLOADED past
        that, or at once when as many files already wait."""
        busy = Failure(
            OVERLOADED,
            f"{self.limits.max_files} files are being translated, the most at once; retry in a few seconds",
            retry_after_ms=2000,
        )
        if self.slots.waiting >= self.limits.max_files:
            raise busy
        try:
            async with asyncio.timeout(self.queue_wait_s):
                await self.slots.acquire(1)
        except TimeoutError:
            raise busy from None

    async def _source(
        self, pair: tuple[str, str], texts: Sequence[str], detect_source: DetectSource | None
    ) -> tuple[str, str]:
        """`pair`, its source detected from the file's texts when the request asked for that."""
        if detect_source is None:
            return pair
        return self.core.route(await detect_source(texts), pair[1])[1]

    async def _catalog(
        self,
        cancel: Cancellation,
        data: bytes,
        name: str,
        options: OptionRequest,
        request_id: str,
        stats: dict,
        pair: tuple[str, str],
        detect_source: DetectSource | None = None,
    ) -> FileResult:
        try:
            require_msgfmt()
        except CatalogError as e:
            raise Failure(INTERNAL, str(e)) from None
        limits = self.limits.catalog
        cat = await self._call(cancel, _prepare_catalog, data, name, limits, cancel, pair[1])
        sources = [s for job in cat.jobs for s in job.sources]
        pair = await self._source(pair, sources, detect_source)
        best = await translate_many(
            self.core, sources, options, request_id, stats, self.share, self.queue_wait_s, pair
        )
        return await self._call(cancel, _finish_catalog, cat, best, name, limits, cancel, pair[1])

    async def _text(
        self,
        cancel: Cancellation,
        data: bytes,
        name: str,
        options: OptionRequest,
        request_id: str,
        stats: dict,
        pair: tuple[str, str],
        detect_source: DetectSource | None = None,
    ) -> FileResult:
        """Translate a plain text file line by line (blank lines and line ends kept; a line the service
        refuses stays as it was)."""
        lines, todo, bodies = await self._call(cancel, _split_text, data, name)
        pair = await self._source(pair, bodies, detect_source)
        best = await translate_many(
            self.core, bodies, options, request_id, stats, self.share, self.queue_wait_s, pair
        )
        left = []
        for i, body, hyp in zip(todo, bodies, best, strict=True):
            if hyp is None:
                left.append(body[:80])
                continue
            lines[i] = hyp.text + lines[i][len(body) :]
        text = "".join(lines)
        if len(text.encode("utf-8")) > self.limits.output_bytes:
            raise Failure(
                INVALID,
                f"the translated file would be over {self.limits.output_bytes} bytes: "
                "split it into smaller files",
            )
        return FileResult(output_name(name, bcp47(pair[1])), text, len(todo) - len(left), left)
