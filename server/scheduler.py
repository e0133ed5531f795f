"""Batching scheduler: a bounded queue of segments feeding one engine worker thread.

Requests are split into segments (one per text) and queued. The worker thread builds engine batches:
the oldest queued segment picks the decoding options, segments with identical options and similar
length join it while the padded token budget (``max_batch_tokens``, counted as padded source tokens x
beam size) and ``max_batch_segments`` allow, and a batch leaves as soon as it is full or its oldest
segment has waited ``max_wait_ms``. With batching off, a batch holds segments of one request only.

Modes (``mode``): ``request`` (above; this class's default), ``off`` (one request per engine batch) and
``inflight`` (the server's default): one running decode batch (the engine's RunningBatch) that
waiting segments join and finished ones leave at every decoding-step boundary; see the comment above
`Scheduler._inflight_worker` for the admission policy (KV-cache token budget, decoder rows cap, FIFO
with skip-ahead, and a fairness bound).

Results are routed back to each caller's asyncio future. A request that is cancelled or whose
deadline passes leaves the queue at once and a running batch at the engine's next decoding step
(through the engine's ``cancelled`` callback); the rest of the batch is unaffected.

This module knows nothing about gRPC; the engine is only called from the worker thread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from server.contract import BatchItem, DecodingOptions, InputTooLongError

if TYPE_CHECKING:
    from server.metrics import Metrics

log = logging.getLogger(__name__)


class SchedulerError(Exception):
    """Base class of the errors a submitted request can end with."""


class QueueFullError(SchedulerError):
    def __init__(self, queued: int, capacity: int, retry_after_ms: int) -> None:
        super().__init__(
            f"server busy: {queued} segments queued (capacity {capacity}); retry in about {retry_after_ms} ms"
        )
        self.retry_after_ms = retry_after_ms


class RequestCancelled(SchedulerError):
    """The caller cancelled, or the deadline passed (``reason`` is "cancelled" or "deadline")."""

    def __init__(self, reason: str) -> None:
        super().__init__("deadline exceeded" if reason == "deadline" else "request cancelled")
        self.reason = reason


class EngineFailure(SchedulerError):
    """The engine raised while translating a batch this request was in."""


class InvalidInput(SchedulerError):
    """The engine refused the input (e.g. a segment over the token limit)."""


class SchedulerStopped(SchedulerError):
    pass


@dataclass(eq=False)
class Job:
    """One request: its segments, options, deadline and where the results go."""

    texts: list[str]
    token_counts: list[int]
    options: DecodingOptions
    deadline: float | None = None  # time.monotonic() value
    request_id: str = ""
    submitted_at: float = field(default_factory=time.monotonic)
    first_dispatch_at: float | None = None
    finished_at: float | None = None
    results: list[Any] = field(default_factory=list)
    remaining: int = 0
    output_tokens: int = 0
    cancelled: bool = False  # read by the worker thread at every decoding step
    done: bool = False
    _loop: asyncio.AbstractEventLoop | None = None
    _future: asyncio.Future | None = None

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    @property
    def queue_s(self) -> float:
        end = self.first_dispatch_at if self.first_dispatch_at is not None else (self.finished_at or 0.0)
        return max(0.0, end - self.submitted_at)

    @property
    def decode_s(self) -> float:
        if self.first_dispatch_at is None or self.finished_at is None:
            return 0.0
        return max(0.0, self.finished_at - self.first_dispatch_at)

    @property
    def input_tokens(self) -> int:
        return sum(self.token_counts)


class _Size(NamedTuple):
    """What segments add to (or the whole of) a running batch."""

    segments: int
    cost: int  # KV-cache bound (RunningBatch.cost)
    rows: int  # decoder rows (beam sizes)

    def __add__(self, other: tuple) -> _Size:  # type: ignore[override]
        return _Size(*(a + b for a, b in zip(self, other, strict=True)))

    def __sub__(self, other: tuple) -> _Size:
        return _Size(*(a - b for a, b in zip(self, other, strict=True)))


_EMPTY = _Size(0, 0, 0)
_SMALLEST = _Size(1, 1, 1)  # no segment adds less to a running batch


@dataclass(eq=False)
class _Segment:
    job: Job
    index: int
    seq: int  # arrival order
    enqueued_at: float

    @property
    def text(self) -> str:
        return self.job.texts[self.index]

    @property
    def tokens(self) -> int:
        return self.job.token_counts[self.index]


MODES = ("request", "inflight", "off")


class Scheduler:
    def __init__(
        self,
        engine: Any,
        metrics: Metrics | None = None,
        *,
        batching: bool = True,
        mode: str | None = None,
        max_batch_tokens: int = 4096,
        max_batch_segments: int = 64,
        max_wait_ms: float = 10.0,
        max_queue_segments: int = 1024,
        max_running_tokens: int = 16384,
        max_running_rows: int = 64,
        max_admit_wait_steps: int = 16,
    ) -> None:
        """mode: "request" (default; "off" when batching is False) or "inflight" (needs an engine with
        running_batch(); falls back to "request" with a warning when the bundle is too old)."""
        self.engine = engine
        self.metrics = metrics
        mode = mode or ("request" if batching else "off")
        if mode not in MODES:
            raise ValueError(f"batching mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "inflight" and not getattr(engine, "supports_inflight", False):
            log.warning("the bundle's decoder graph lacks per-row positions: request-level batching instead")
            mode = "request"
        if mode == "inflight" and getattr(engine, "inflight_copies_cache", False):
            log.warning(
                "the bundle has no kv_rows/kv_step graphs: the in-flight batch keeps its KV cache in host "
                "memory and copies it to the device at every step; re-export the bundle (python -m export) "
                "to keep it on the device"
            )
        self.mode = mode
        self.batching = mode != "off"
        self.max_running_tokens = max_running_tokens
        self.max_running_rows = max_running_rows
        self.max_admit_wait_steps = max_admit_wait_steps
        self.steps = 0  # decoding steps run (in-flight mode)
        self.preempted = 0  # running segments preempted for a starving one (in-flight mode)
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_segments = max_batch_segments
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue_segments = max_queue_segments
        self._queue: list[_Segment] = []  # arrival order
        self._queue_tokens = 0
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._stopping = False
        self._segments_per_s = 0.0  # EMA of engine throughput, for retry hints
        worker = self._inflight_worker if mode == "inflight" else self._worker
        self._thread = threading.Thread(target=worker, name="engine-worker", daemon=True)
        self._thread.start()

    # ---- caller side (event loop) ----------------------------------------------------------------

    def submit(self, job: Job) -> asyncio.Future:
        """Queue a job's segments; returns a future resolved with the job (results filled) or a
        SchedulerError. Raises QueueFullError at once when the queue cannot take the segments."""
        loop = asyncio.get_running_loop()
        job._loop, job._future = loop, loop.create_future()
        # An abandoned waiter (cancelled, timed out) leaves the error unread: mark it retrieved.
        job._future.add_done_callback(lambda f: f.cancelled() or f.exception())
        n = len(job.texts)
        job.results = [None] * n
        job.remaining = n
        if n == 0:
            job.done, job.finished_at = True, time.monotonic()
            job._future.set_result(job)
            return job._future
        with self._cond:
            if self._stopping:
                raise SchedulerStopped("server is shutting down")
            if len(self._queue) + n > self.max_queue_segments:
                raise QueueFullError(len(self._queue), self.max_queue_segments, self._retry_after_ms())
            now = time.monotonic()
            for i in range(n):
                self._queue.append(_Segment(job, i, next(self._seq), now))
            self._queue_tokens += job.input_tokens
            self._update_gauges()
            self._cond.notify()
        return job._future

    async def run(self, job: Job) -> Job:
        """Submit and wait; cancellation of the awaiting task or the deadline drops the job."""
        fut = self.submit(job)
        timeout = None if job.deadline is None else max(0.0, job.deadline - time.monotonic())
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            self.cancel(job, "deadline")
            raise RequestCancelled("deadline") from None
        except asyncio.CancelledError:
            self.cancel(job, "cancelled")
            raise

    def cancel(self, job: Job, reason: str = "cancelled") -> None:
        """Drop a job: its queued segments leave now, its running rows at the next decoding step."""
        job.cancelled = True
        self._finish(job, RequestCancelled(reason))

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def stop(self, timeout: float | None = None) -> None:
        """Let the worker finish what is queued, then end it."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # ---- bookkeeping (any thread) -----------------------------------------------------------------

    def _retry_after_ms(self) -> int:
        rate = self._segments_per_s
        if rate <= 0:
            return 1000
        return int(min(30_000, max(100, 1000 * len(self._queue) / rate)))

    def _update_gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_segments.set(len(self._queue))
            self.metrics.queue_tokens.set(self._queue_tokens)

    def _count(self, outcome: str, n: int = 1) -> None:
        if self.metrics is not None and n:
            self.metrics.segments.labels(outcome=outcome).inc(n)

    def _remove_queued(self, job: Job) -> int:
        """Remove a job's queued segments (caller holds the lock); return how many."""
        kept = [s for s in self._queue if s.job is not job]
        removed = len(self._queue) - len(kept)
        if removed:
            self._queue = kept
            self._queue_tokens = sum(s.tokens for s in kept)
            self._update_gauges()
        return removed

    def _finish(self, job: Job, error: BaseException | None) -> None:
        """Resolve a job exactly once, from any thread."""
        with self._cond:
            if job.done:
                return
            job.done = True
            job.finished_at = time.monotonic()
            removed = self._remove_queued(job)
        if isinstance(error, RequestCancelled):
            self._count("dropped_" + error.reason, removed)
        elif error is not None:
            self._count("failed", removed)
        loop, fut = job._loop, job._future
        if loop is None or fut is None:
            return

        def resolve() -> None:
            if fut.done():
                return
            if error is None:
                fut.set_result(job)
            else:
                fut.set_exception(error)

        try:
            loop.call_soon_threadsafe(resolve)
        except RuntimeError:  # loop closed: nobody is waiting any more
            pass

    # ---- worker thread ----------------------------------------------------------------------------

    def _purge(self, now: float) -> list[tuple[Job, RequestCancelled]]:
        """Drop queued segments of finished, cancelled or expired jobs (lock held); return the jobs
        still to be resolved (outside the lock)."""
        dead: dict[Job, int] = {}
        for s in self._queue:
            if s.job.done or s.job.cancelled or s.job.expired(now):
                dead[s.job] = dead.get(s.job, 0) + 1
        if not dead:
            return []
        self._queue = [s for s in self._queue if s.job not in dead]
        self._queue_tokens = sum(s.tokens for s in self._queue)
        self._update_gauges()
        to_finish = []
        for job, n in dead.items():
            reason = "deadline" if job.expired(now) and not job.cancelled else "cancelled"
            self._count("dropped_" + reason, n)
            if not job.done:
                to_finish.append((job, RequestCancelled(reason)))
        return to_finish

    def _cost(self, max_tokens: int, rows: int, beam: int) -> int:
        return max(1, max_tokens) * rows * max(1, beam)

    def _select(self, head: _Segment, candidates: list[_Segment]) -> list[_Segment]:
        """Grow a batch around `head` with candidates of the closest lengths within the budgets."""
        beam = getattr(head.job.options, "beam_size", 1)
        ordered = sorted(candidates, key=lambda s: (s.tokens, s.seq))
        i = j = ordered.index(head)
        longest = head.tokens
        target = head.tokens
        while j - i + 1 < self.max_batch_segments:
            left = ordered[i - 1] if i > 0 else None
            right = ordered[j + 1] if j + 1 < len(ordered) else None
            if left is None and right is None:
                break
            if right is None or (
                left is not None and (target - left.tokens, left.seq) <= (right.tokens - target, right.seq)
            ):
                pick, new_i, new_j = left, i - 1, j
            else:
                pick, new_i, new_j = right, i, j + 1
            new_longest = max(longest, pick.tokens)
            if self._cost(new_longest, j - i + 2, beam) > self.max_batch_tokens:
                # The other side may still fit (shorter segments add no padding).
                if (
                    pick is right
                    and left is not None
                    and self._cost(longest, j - i + 2, beam) <= self.max_batch_tokens
                ):
                    i -= 1
                    continue
                break
            i, j, longest = new_i, new_j, new_longest
        batch = ordered[i : j + 1]
        batch.sort(key=lambda s: s.seq)
        return batch

    def _next_batch(self) -> tuple[list[_Segment] | None, list[tuple[Job, RequestCancelled]]]:
        """Block until a batch is due. Returns (batch, jobs to resolve); batch is None when stopping
        with an empty queue, and empty when only dropped jobs are to be resolved."""
        with self._cond:
            while True:
                now = time.monotonic()
                to_finish = self._purge(now)
                if to_finish:
                    return [], to_finish
                if not self._queue:
                    if self._stopping:
                        return None, []
                    self._cond.wait()
                    continue
                head = self._queue[0]
                if self.batching:
                    options = head.job.options
                    same = [s for s in self._queue if s.job.options == options]
                    rows = len(same)
                    longest = max(s.tokens for s in same)
                    beam = getattr(options, "beam_size", 1)
                    full = (
                        rows >= self.max_batch_segments
                        or self._cost(longest, rows, beam) >= self.max_batch_tokens
                    )
                    due = head.enqueued_at + self.max_wait_s
                    if not full and now < due and not self._stopping:
                        self._cond.wait(due - now)
                        continue
                else:
                    same = [s for s in self._queue if s.job is head.job]
                batch = self._select(head, same)
                chosen = set(map(id, batch))
                self._queue = [s for s in self._queue if id(s) not in chosen]
                self._queue_tokens -= sum(s.tokens for s in batch)
                self._update_gauges()
                return batch, []

    def _worker(self) -> None:
        while True:
            try:
                batch, to_finish = self._next_batch()
            except Exception:  # pragma: no cover - defensive: never let the worker die
                log.exception("scheduler error")
                time.sleep(0.01)
                continue
            for job, error in to_finish:
                self._finish(job, error)
            if batch is None:
                return
            if batch:
                self._run_batch(batch)

    def _run_batch(self, batch: list[_Segment]) -> None:
        jobs = [s.job for s in batch]
        options = jobs[0].options
        texts = [s.text for s in batch]
        start = time.monotonic()
        for s in batch:
            if s.job.first_dispatch_at is None:
                s.job.first_dispatch_at = start
            if self.metrics is not None:
                self.metrics.queue_wait.observe(start - s.enqueued_at)

        def cancelled() -> Sequence[bool]:
            now = time.monotonic()
            return [job.done or job.cancelled or job.expired(now) for job in jobs]

        try:
            outputs = self.engine.translate(texts, options, cancelled=cancelled)
            if len(outputs) != len(batch):
                raise RuntimeError(f"engine returned {len(outputs)} results for {len(batch)} texts")
        except Exception as e:
            elapsed = time.monotonic() - start
            invalid = isinstance(e, InputTooLongError)
            if not invalid:
                log.exception("engine failed on a batch of %d segments", len(batch))
                if self.metrics is not None:
                    self.metrics.engine_errors.inc()
            error: SchedulerError = (
                InvalidInput(str(e)) if invalid else EngineFailure(f"translation failed: {e}")
            )
            self._count("failed", len(batch))
            for job in dict.fromkeys(jobs):
                self._finish(job, error)
            if self.metrics is not None:
                self.metrics.batch_decode.observe(elapsed)
            return
        elapsed = time.monotonic() - start
        translated = sum(o is not None for o in outputs)
        if translated:
            self._note_rate(translated / max(elapsed, 1e-6))
        if self.metrics is not None:
            m = self.metrics
            m.batch_segments.observe(len(batch))
            m.batch_tokens.observe(sum(s.tokens for s in batch))
            m.batch_decode.observe(elapsed)
            stats = getattr(self.engine, "last_stats", None) or {}
            steps = int(stats.get("steps", 0))
            if steps:
                m.decode_steps.inc(steps)
                mean_rows = stats.get("row_steps", 0) / steps
                for _ in range(steps):  # per-step occupancy: the batch's mean rows per step
                    m.batch_rows.observe(mean_rows)
                first = float(stats.get("encoder_s", 0.0)) + float(stats.get("decoder_s", 0.0)) / steps
                for seg in batch:  # estimated: batch start + encoder + one mean step
                    m.time_to_first_step.observe(start - seg.enqueued_at + first)
        now = time.monotonic()
        for seg, hyps in zip(batch, outputs, strict=True):
            self._deliver(seg, hyps, now)

    def _deliver(self, seg: _Segment, hyps: Any, now: float) -> None:
        """Route one segment's n-best list (None: dropped by the engine) to its job."""
        job = seg.job
        if hyps is None:
            if not job.done:
                reason = "deadline" if job.expired(now) and not job.cancelled else "cancelled"
                self._finish(job, RequestCancelled(reason))
            self._count("dropped_" + ("deadline" if job.expired(now) else "cancelled"))
            return
        if job.done:  # cancelled after its last decoding step
            self._count("dropped_cancelled")
            return
        job.results[seg.index] = hyps
        job.remaining -= 1
        best = hyps[0].tokens if hyps else []
        job.output_tokens += len(best)
        self._count("translated")
        if self.metrics is not None:
            self.metrics.input_tokens.inc(seg.tokens)
            self.metrics.generated_tokens.inc(len(best))
        if job.remaining == 0:
            self._finish(job, None)

    # ---- in-flight mode (worker thread) -----------------------------------------------------------
    #
    # One running batch. At every decoding-step boundary the worker (1) drops running rows of
    # cancelled/expired requests, (2) admits waiting segments, (3) runs one step, (4) answers the
    # segments that finished. Admission policy:
    #   * budget: a segment's cost is its KV-cache bound, beam x (source tokens + generation budget)
    #     (RunningBatch.cost); the running cost stays <= max_running_tokens, the running segments
    #     <= max_batch_segments, their decoder rows (sum of beam sizes) <= max_running_rows. A segment
    #     larger than the whole budget runs alone. The rows cap keeps steps short: past a few dozen
    #     rows a CPU step costs about the same per row (export/step_cost.py), so more rows add little
    #     throughput but slow every running sentence.
    #   * order: arrival order; a later segment that fits may skip ahead of one that does not.
    #   * fairness: once the oldest waiting segment has been passed over for max_admit_wait_steps
    #     steps, skipping stops and running segments that arrived after it are preempted (dropped and
    #     queued again at their arrival place; they restart from scratch later, with the same result)
    #     until it fits. So every segment starts within max_admit_wait_steps steps plus the remaining
    #     steps of older segments. Small values: strict FIFO, big segments never starve, but
    #     preemption wastes work and skip-ahead (utilisation) stops sooner; large values: more
    #     throughput for short segments, longer waits for big ones.

    def _inflight_worker(self) -> None:
        self._rb = self.engine.running_batch()
        self._running: dict[int, tuple[_Segment, _Size]] = {}  # seq -> (segment, its size), in order
        self._load = _EMPTY  # the running segments' sizes, summed
        self._head_seq, self._head_since = -1, 0
        self._window = (time.monotonic(), 0)
        while True:
            try:
                if not self._inflight_round():
                    return
            except Exception:  # pragma: no cover - defensive: never let the worker die
                log.exception("scheduler error")
                time.sleep(0.01)

    def _inflight_round(self) -> bool:
        """One step boundary; False when stopping with nothing left."""
        with self._cond:
            while True:
                now = time.monotonic()
                to_finish = self._purge(now)
                if self._running or self._queue or to_finish:
                    break
                if self._stopping:
                    return False
                self._cond.wait()
            dead = [
                k
                for k, (seg, _) in self._running.items()
                if seg.job.done or seg.job.cancelled or seg.job.expired(now)
            ]
            dead_segs = [self._pop_running(key) for key in dead]
            admit, preempt = self._admission()
            self._update_gauges()
        for job, error in to_finish:
            self._finish(job, error)
        rb = self._rb
        if dead or preempt:
            rb.drop(dead + [seg.seq for seg in preempt])
        for seg in dead_segs:
            self._deliver(seg, None, now)
        try:
            fresh = self._admit(admit, now) if admit else []
            rows = rb.rows
            finished = rb.step() if len(rb) else []
            now = time.monotonic()
        except Exception as e:
            self._engine_failed(e)
            return True
        if not rows and self._running and not finished:  # pragma: no cover - defensive: never spin
            self._engine_failed(RuntimeError("running segments lost by the engine batch"))
            return True
        if rows:
            self.steps += 1
            if self.metrics is not None:
                m = self.metrics
                m.decode_steps.inc()
                m.batch_rows.observe(rows)
                for seg in fresh:
                    m.time_to_first_step.observe(now - seg.enqueued_at)
        self._finish_items(finished, now)
        return True

    def _admission(self) -> tuple[list[tuple[_Segment, _Size]], list[_Segment]]:
        """Pick queued segments to admit now (with their sizes), and running ones to preempt (lock
        held). Removes the admitted segments from the queue and queues the preempted ones again."""
        if not self._queue:
            self._head_seq = -1
            return [], []
        head = self._queue[0]
        if head.seq != self._head_seq:
            self._head_seq, self._head_since = head.seq, self.steps
        starving = self.steps - self._head_since >= self.max_admit_wait_steps
        preempt: list[_Segment] = []
        younger = [size for seg, size in self._running.values() if seg.seq > head.seq] if starving else []
        if younger:
            need = self._size(head)
            without = self._load - sum(younger, _EMPTY)
            if not self._fits(need, self._load) and self._fits(need, without):
                # Preempt the latest-admitted segments that arrived after the head, until it fits (only
                # when that is enough: otherwise the head waits for older ones, and nobody skips ahead).
                for key in reversed(list(self._running)):
                    if self._fits(need, self._load):
                        break
                    if self._running[key][0].seq > head.seq:
                        preempt.append(self._pop_running(key))
                if preempt:
                    self.preempted += len(preempt)
                    log.info("preempted %d running segments for a starving one", len(preempt))
                    self._queue = sorted(self._queue + preempt, key=lambda x: x.seq)
                    self._queue_tokens += sum(x.tokens for x in preempt)
        load = self._load
        admit: list[tuple[_Segment, _Size]] = []
        for seg in self._queue:
            size = self._size(seg)
            if load.segments == 0 or self._fits(size, load):
                admit.append((seg, size))
                load = load + size
            elif starving or not self._fits(_SMALLEST, load):
                break  # no skipping ahead of a starving head; or nothing further can fit
        if admit:
            chosen = {id(seg) for seg, _ in admit}
            self._queue = [x for x in self._queue if id(x) not in chosen]
            self._queue_tokens -= sum(seg.tokens for seg, _ in admit)
        return admit, preempt

    def _size(self, seg: _Segment) -> _Size:
        """What a segment adds to the running batch."""
        options = seg.job.options
        return _Size(1, self._rb.cost(seg.tokens, options), max(1, options.beam_size))

    def _fits(self, size: _Size, load: _Size) -> bool:
        total = load + size
        return (
            total.segments <= self.max_batch_segments
            and total.cost <= self.max_running_tokens
            and total.rows <= self.max_running_rows
        )

    def _pop_running(self, key: int) -> _Segment:
        seg, size = self._running.pop(key)
        self._load = self._load - size
        return seg

    def _admit(self, sized: list[tuple[_Segment, _Size]], now: float) -> list[_Segment]:
        """Encode and merge the segments (with their sizes from _admission) into the running batch;
        returns those now running."""

        admit = [seg for seg, _ in sized]
        for seg, size in sized:
            if seg.job.first_dispatch_at is None:
                seg.job.first_dispatch_at = now
            if self.metrics is not None:
                self.metrics.queue_wait.observe(now - seg.enqueued_at)
            self._running[seg.seq] = (seg, size)
            self._load = self._load + size
        rb = self._rb
        if self.metrics is not None:
            self.metrics.batch_segments.observe(len(admit))
            self.metrics.batch_tokens.observe(sum(s.tokens for s in admit))
        done = rb.admit([BatchItem(seg.seq, seg.text, seg.job.options) for seg in admit])
        self._finish_items(done, time.monotonic())
        return [seg for seg in admit if seg.seq in self._running]

    def _finish_items(self, finished: list[Any], now: float) -> None:
        n = 0
        for f in finished:
            if f.key not in self._running:
                continue
            seg = self._pop_running(f.key)
            if f.error is not None:
                invalid = isinstance(f.error, ValueError)
                self._count("failed")
                self._finish(seg.job, InvalidInput(str(f.error)) if invalid else EngineFailure(str(f.error)))
                continue
            self._deliver(seg, f.hypotheses, now)
            n += 1
        # Throughput estimate for retry hints, over windows of about a second.
        start, count = self._window
        count += n
        if now - start >= 1.0:
            self._note_rate(count / (now - start))
            start, count = now, 0
        self._window = (start, count)

    def _note_rate(self, rate: float) -> None:
        """Fold a measured engine throughput (segments/s) into the EMA behind retry hints."""
        self._segments_per_s = rate if self._segments_per_s == 0 else 0.8 * self._segments_per_s + 0.2 * rate

    def _engine_failed(self, e: Exception) -> None:
        """The engine raised mid-batch: fail every running segment and start a fresh batch."""
        log.exception("engine failed on the running batch (%d segments)", len(self._running))
        if self.metrics is not None:
            self.metrics.engine_errors.inc()
        segs = [seg for seg, _ in self._running.values()]
        self._running.clear()
        self._load = _EMPTY
        self._count("failed", len(segs))
        for job in dict.fromkeys(seg.job for seg in segs):
            self._finish(job, EngineFailure(f"translation failed: {e}"))
        self._rb = self.engine.running_batch()
