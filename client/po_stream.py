"""Streaming side of `python -m client po` (client.po): the texts of the entries to translate over one
TranslateStream call, a few items in flight, each entry handed back once all its texts are translated."""

from __future__ import annotations

import argparse
import queue
import threading
from collections import Counter
from dataclasses import dataclass, field

import grpc

from client.core import StreamItem, TranslatorClient, TranslatorError
from runtime.po_catalog import Job


@dataclass
class Run:
    """What every catalog of one command shares: its options, the client, the X-Generator value, the
    server's longest text, the glossary and the decoding options."""

    args: argparse.Namespace
    client: TranslatorClient
    generator: str
    max_chars: int
    glossary: dict[str, str]
    options: dict = field(default_factory=dict)
    checked: set[str] = field(default_factory=set)  # target languages the server said it serves


class Feeder:
    """The request side of one TranslateStream call: items put by the main thread; finish() ends it
    after the items put, abort() at once."""

    def __init__(self) -> None:
        self.queue: queue.Queue[StreamItem | None] = queue.Queue()
        self.stopped = threading.Event()

    def put(self, item: StreamItem | None) -> None:
        self.queue.put(item)

    def finish(self) -> None:
        self.queue.put(None)

    def abort(self) -> None:
        self.stopped.set()

    def __iter__(self):
        while not self.stopped.is_set():
            try:
                item = self.queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is None:
                return
            yield item


def stream(run: Run, jobs: list[Job], on_done, pair: tuple[str, str] = ("", "")) -> None:
    """Translate the sources of `jobs` over one TranslateStream call, --parallel items in flight, into
    `pair` (source, target language; "" = the server's default); `on_done(job)` once all the sources of
    a job have their translation (or `job.results` is None and `job.reason` says why). Identical texts
    are sent once."""
    args = run.args
    users: dict[str, list[tuple[Job, int]]] = {}
    for job in jobs:
        job.results = [None] * len(job.sources)
        job.pending = len(job.sources)
        for i, text in enumerate(job.sources):
            users.setdefault(text, []).append((job, i))

    def fail(text: str, reason: str) -> None:
        for job, _ in users.pop(text, []):
            if job.results is not None:
                job.results, job.reason = None, reason
                on_done(job)

    texts = []
    for text in list(users):
        if run.max_chars and len(text) > run.max_chars:
            fail(text, f"too long: over the {run.max_chars} characters the server takes")
        else:
            texts.append(text)
    if not texts:
        return
    batches = run.client.batches(texts, args.batch_size, **run.options)
    items = [
        # The catalog's accelerators are already out (runtime.po_catalog): what is left is literal.
        StreamItem(
            str(i),
            b,
            timeout_ms=int(args.timeout * 1000),
            glossary=run.glossary,
            literal_markers=True,
            source_language=pair[0],
            target_language=pair[1],
            **run.options,
        )
        for i, b in enumerate(batches)
    ]
    feeder = Feeder()
    waiting = list(reversed(items))
    outstanding = 0
    tries: Counter[str] = Counter()

    def send_next() -> None:
        nonlocal outstanding
        if waiting:
            feeder.put(waiting.pop())
            outstanding += 1

    for _ in range(args.parallel):
        send_next()
    results = run.client.translate_stream(feeder, timeout=None)
    try:
        for r in results:
            item = items[int(r.request_id)]
            if r.ok:
                for text, t in zip(item.texts, r.translations, strict=True):
                    for job, i in users.pop(text, []):
                        if job.results is not None:
                            job.results[i] = t
                            job.pending -= 1
                            if job.pending == 0:
                                on_done(job)
            elif r.code == grpc.StatusCode.RESOURCE_EXHAUSTED and tries[r.request_id] < args.retries:
                tries[r.request_id] += 1
                delay = max(0.05, r.retry_after_ms / 1000)
                threading.Timer(delay, feeder.put, (item,)).start()
                continue  # still outstanding
            elif r.code == grpc.StatusCode.INVALID_ARGUMENT and len(item.texts) > 1:
                for text in item.texts:  # find the text it refuses: one per item
                    items.append(StreamItem(str(len(items)), [text], **_same(item)))
                    waiting.append(items[-1])
            elif r.code == grpc.StatusCode.INVALID_ARGUMENT:
                fail(item.texts[0], f"refused by the server: {r.message}")
            else:
                raise TranslatorError(r.code, r.message, r.retry_after_ms, run.client.target)
            outstanding -= 1
            send_next()
            if outstanding == 0:
                feeder.finish()
        if outstanding:
            raise TranslatorError(grpc.StatusCode.UNAVAILABLE, "the stream ended early", 0, run.client.target)
    finally:
        feeder.abort()
        results.close()


def _same(item: StreamItem) -> dict:
    return {k: v for k, v in vars(item).items() if k not in ("request_id", "texts")}
