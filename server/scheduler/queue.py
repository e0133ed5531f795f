"""The scheduler's one queue: where segments wait, and where their results and errors go.

Shared by both batching strategies (`request_level`, `inflight`): admission limit (``max_queue_segments``),
the line of requests that wait for room in a full queue (``max_waiters``, `admit`), retry hints, purging
of cancelled and expired jobs, resolving each job's future exactly once from any thread, routing one
segment's result to its job, and the metrics of all that. The strategies hold ``cond`` while they look at
or take from ``segments``; whatever frees room (`take`, `purge`, `finish`) lets the line in, in order.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from server.contract import Hypothesis
from server.scheduler.jobs import (
    DEADLINE_SLACK_S,
    Job,
    QueueFullError,
    RequestCancelled,
    SchedulerError,
    SchedulerStopped,
    Segment,
)

if TYPE_CHECKING:
    from server.metrics import Metrics


def _resolve_soon(future: asyncio.Future, error: BaseException | None, result: object = None) -> None:
    """Resolve an asyncio future from any thread, on its own loop, once (nothing when the loop is
    closed: nobody is waiting any more)."""

    def resolve() -> None:
        if future.done():
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    try:
        future.get_loop().call_soon_threadsafe(resolve)
    except RuntimeError:  # loop closed
        pass


class _Waiter:
    """A job waiting in line for room; `granted` is set under the queue's lock when it leaves the line
    (queued, or the queue stopped), and `granted_future` then resolves on the job's loop."""

    __slots__ = ("job", "granted_future", "granted")

    def __init__(self, job: Job, future: asyncio.Future) -> None:
        self.job = job
        self.granted_future = future
        self.granted = False
        # An abandoned waiter's SchedulerStopped is never read: mark it retrieved.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())


class SegmentQueue:
    """Queued segments in arrival order, guarded by ``cond``; results routed back to each job's future.
    ``max_waiters``: requests that may wait in line for room when the queue is full (`admit`; 0: none,
    every full queue is an immediate QueueFullError)."""

    def __init__(self, metrics: Metrics | None, max_segments: int, max_waiters: int = 0) -> None:
        self.metrics = metrics
        self.max_segments = max_segments
        self.max_waiters = max_waiters
        self._line: collections.deque[_Waiter] = collections.deque()  # FIFO, guarded by cond
        self.segments: list[Segment] = []  # arrival order
        self.tokens = 0  # source tokens of the queued segments
        self.cond = threading.Condition()
        self.stopping = False
        self._seq = itertools.count()
        self._segments_per_s = 0.0  # time-weighted average of engine throughput, for retry hints
        self._rate_at = 0.0
        self._hint = (0.0, 0.0)  # (last hint in ms, when)

    def __len__(self) -> int:
        return len(self.segments)

    # ---- caller side (event loop) ----------------------------------------------------------------

    def submit(self, job: Job) -> asyncio.Future:
        """Queue a job's segments; returns a future resolved with the job (results filled) or a
        SchedulerError. Raises QueueFullError at once when the queue cannot take the segments now (or
        requests wait in line for room before it: they come first)."""
        future = self._attach(job)
        if job.done:
            return future
        with self.cond:
            if not self._take_now(job):
                self.count_admission("refused")
                raise QueueFullError(len(self.segments), self.max_segments, self.retry_after_ms())
        return future

    async def admit(self, job: Job, wait_s: float) -> asyncio.Future:
        """`submit`, but a job that finds the queue full waits in line (first come, first served) for
        room, up to `wait_s` seconds and never past its deadline. QueueFullError at once when the line
        is full (`max_waiters`) or `wait_s` is 0, and after `wait_s` without room; RequestCancelled
        ("deadline") when the deadline ends the wait. A caller cancelled while in line leaves it; one
        cancelled as room came has its segments queued (Scheduler.run drops them)."""
        future = self._attach(job)
        if job.done:
            return future
        now = time.monotonic()
        if job.deadline is not None:
            wait_s = min(wait_s, job.deadline - now)
        with self.cond:
            if self._take_now(job):
                return future
            if wait_s <= 0 or len(self._line) >= self.max_waiters:
                self.count_admission("refused")
                raise QueueFullError(len(self.segments), self.max_segments, self.retry_after_ms())
            waiter = _Waiter(job, asyncio.get_running_loop().create_future())
            self._line.append(waiter)
            self._line_gauge()
        try:
            async with asyncio.timeout(wait_s):
                await waiter.granted_future
        except (TimeoutError, asyncio.CancelledError) as e:
            with self.cond:
                granted = waiter.granted
                if not granted:
                    self._line.remove(waiter)
                    self._grant()  # the head leaving may let the next ones in
                    self._line_gauge()
            if not granted:
                expired = job.expired(time.monotonic() + DEADLINE_SLACK_S)
                gone = isinstance(e, asyncio.CancelledError)
                self._waited(now, "cancelled" if gone or expired else "timed_out")
                if gone:
                    raise
                if expired:
                    raise RequestCancelled("deadline") from None
                raise QueueFullError(len(self.segments), self.max_segments, self.retry_after_ms()) from None
            if isinstance(e, asyncio.CancelledError):
                raise
            # else the timeout fired as room came: the job is queued
        self._waited(now, "admitted")
        return future

    def _attach(self, job: Job) -> asyncio.Future:
        """Give the job its future on the running loop; a job without texts is resolved at once."""
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

    def _take_now(self, job: Job) -> bool:
        """Queue the job's segments if they fit and nobody waits in line before it (lock held)."""
        if self.stopping:
            raise SchedulerStopped("server is shutting down")
        if self._line or len(self.segments) + len(job.texts) > self.max_segments:
            return False
        self._enqueue(job)
        return True

    def _enqueue(self, job: Job) -> None:
        """Append a job's segments (lock held) and wake the worker."""
        now = time.monotonic()
        for i in range(len(job.texts)):
            self.segments.append(Segment(job, i, next(self._seq), now))
        self.tokens += job.input_tokens
        self.update_gauges()
        self.cond.notify()

    def _grant(self) -> None:
        """Queue the jobs at the head of the line while they fit (lock held; any thread): room goes to
        the longest waiting first, and nobody behind a job that does not fit yet overtakes it."""
        while self._line and not self.stopping:
            waiter = self._line[0]
            if not waiter.job.done and len(self.segments) + len(waiter.job.texts) > self.max_segments:
                return
            self._line.popleft()
            waiter.granted = True
            if not waiter.job.done:  # a job cancelled in line is resolved already: nothing to queue
                self._enqueue(waiter.job)
            _resolve_soon(waiter.granted_future, None)
        self._line_gauge()

    def _waited(self, since: float, outcome: str) -> None:
        """A request's wait in line ended: how long, and how (admitted, timed_out, cancelled)."""
        self.count_admission(outcome)
        if self.metrics is not None:
            self.metrics.admission_wait.observe(time.monotonic() - since)

    def count_admission(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.admissions.labels(outcome=outcome).inc()

    def _line_gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_waiters.set(len(self._line))

    @property
    def waiting(self) -> int:
        """Requests waiting in line for room."""
        return len(self._line)

    def stop(self) -> None:
        """No more submissions; the worker finishes what is queued, and requests waiting in line for
        room get SchedulerStopped."""
        with self.cond:
            self.stopping = True
            line, self._line = list(self._line), collections.deque()
            for waiter in line:
                waiter.granted = True  # resolved: it leaves with the error below
                _resolve_soon(waiter.granted_future, SchedulerStopped("server is shutting down"))
            self._line_gauge()
            self.cond.notify_all()

    # ---- bookkeeping (any thread) -----------------------------------------------------------------

    # Retry hints: the queued segments over the engine's measured throughput, from a time-weighted
    # average (an old load's rate fades within seconds), bounded, and smoothed so that the hint does not
    # swing from one refusal to the next. Before any measurement: RETRY_COLD_MS per queued segment.
    RATE_TAU_S = 3.0
    HINT_TAU_S = 1.0
    RETRY_MIN_MS, RETRY_MAX_MS, RETRY_COLD_MS = 100, 10_000, 50

    def retry_after_ms(self) -> int:
        now = time.monotonic()
        rate = self._segments_per_s
        raw = 1000 * len(self.segments) / rate if rate > 0 else self.RETRY_COLD_MS * len(self.segments)
        raw = min(self.RETRY_MAX_MS, max(self.RETRY_MIN_MS, raw))
        last, at = self._hint
        if last:
            w = 1 - math.exp(-(now - at) / self.HINT_TAU_S)
            raw = last + w * (raw - last)
        self._hint = (raw, now)
        return int(raw)

    def note_rate(self, rate: float) -> None:
        """Fold a measured engine throughput (segments/s) into the time-weighted average behind hints."""
        now = time.monotonic()
        if self._segments_per_s == 0:
            self._segments_per_s = rate
        else:
            w = 1 - math.exp(-(now - self._rate_at) / self.RATE_TAU_S)
            self._segments_per_s += max(w, 0.2) * (rate - self._segments_per_s)
        self._rate_at = now

    def update_gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_segments.set(len(self.segments))
            self.metrics.queue_tokens.set(self.tokens)

    def count(self, outcome: str, n: int = 1) -> None:
        """Count segments by outcome: translated, failed, dropped_cancelled, dropped_deadline."""
        if self.metrics is not None and n:
            self.metrics.segments.labels(outcome=outcome).inc(n)

    def engine_error(self) -> None:
        if self.metrics is not None:
            self.metrics.engine_errors.inc()

    def _remove_job(self, job: Job) -> int:
        """Remove a job's queued segments (lock held); return how many."""
        kept = [s for s in self.segments if s.job is not job]
        removed = len(self.segments) - len(kept)
        if removed:
            self.segments = kept
            self.tokens = sum(s.tokens for s in kept)
            self._grant()
            self.update_gauges()
        return removed

    def finish(self, job: Job, error: BaseException | None) -> None:
        """Resolve a job exactly once, from any thread; its queued segments leave the queue."""
        with self.cond:
            if job.done:
                return
            job.done = True
            job.finished_at = time.monotonic()
            removed = self._remove_job(job)
        if isinstance(error, RequestCancelled):
            self.count("dropped_" + error.reason, removed)
        elif error is not None:
            self.count("failed", removed)
        if job._future is not None:
            _resolve_soon(job._future, error, job)

    def fail(self, segments: Sequence[Segment], error: SchedulerError) -> None:
        """Count the segments as failed and resolve their jobs with `error`."""
        self.count("failed", len(segments))
        for job in dict.fromkeys(s.job for s in segments):
            self.finish(job, error)

    # ---- worker thread ----------------------------------------------------------------------------

    def purge(self, now: float) -> list[tuple[Job, RequestCancelled]]:
        """Drop queued segments of finished, cancelled or expired jobs (lock held); return the jobs
        still to be resolved (outside the lock, with `finish`)."""
        dead: dict[Job, int] = {}
        for s in self.segments:
            if s.job.dead(now):
                dead[s.job] = dead.get(s.job, 0) + 1
        if not dead:
            return []
        self.segments = [s for s in self.segments if s.job not in dead]
        self.tokens = sum(s.tokens for s in self.segments)
        self._grant()
        self.update_gauges()
        to_finish = []
        for job, n in dead.items():
            reason = job.drop_reason(now)
            self.count("dropped_" + reason, n)
            if not job.done:
                to_finish.append((job, RequestCancelled(reason)))
        return to_finish

    def take(self, segments: Sequence[Segment]) -> None:
        """Remove segments chosen for the engine from the queue (lock held)."""
        chosen = set(map(id, segments))
        self.segments = [s for s in self.segments if id(s) not in chosen]
        self.tokens -= sum(s.tokens for s in segments)
        self._grant()

    def requeue(self, segments: Sequence[Segment]) -> None:
        """Put preempted segments back at their arrival places (lock held)."""
        self.segments = sorted(self.segments + list(segments), key=lambda s: s.seq)
        self.tokens += sum(s.tokens for s in segments)

    def dispatched(self, segments: Sequence[Segment], now: float) -> None:
        """Segments handed to the engine at `now`: their jobs' first dispatch, queue-wait metrics."""
        for s in segments:
            if s.job.first_dispatch_at is None:
                s.job.first_dispatch_at = now
            if self.metrics is not None:
                self.metrics.queue_wait.observe(now - s.enqueued_at)

    def deliver(self, seg: Segment, hyps: list[Hypothesis] | None, now: float) -> None:
        """Route one segment's n-best list (None: dropped by the engine) to its job."""
        job = seg.job
        if hyps is None or job.done:  # dropped by the engine; or cancelled during its last step
            if not job.done:
                self.finish(job, RequestCancelled(job.drop_reason(now)))
            self.count("dropped_" + job.drop_reason(now))
            return
        job.results[seg.index] = hyps
        job.remaining -= 1
        best = hyps[0].tokens if hyps else []
        job.output_tokens += len(best)
        self.count("translated")
        if self.metrics is not None:
            self.metrics.input_tokens.inc(seg.tokens)
            self.metrics.generated_tokens.inc(len(best))
        if job.remaining == 0:
            self.finish(job, None)
