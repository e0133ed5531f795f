"""In-flight (continuous) batching: one running decode batch that waiting segments join and finished
ones leave at every decoding-step boundary.

At every step boundary the worker (1) drops running rows of cancelled/expired requests, (2) admits
waiting segments, (3) runs one step, (4) answers the segments that finished. Admission policy:

* budget: a segment's cost is its KV-cache bound, beam x (source tokens + generation budget)
  (`InFlightBatch.cost`); the running cost stays <= max_running_tokens, the running segments
  <= max_batch_segments, their decoder rows (sum of beam sizes) <= max_running_rows. A segment larger
  than the whole budget runs alone. The rows cap keeps steps short: past a few dozen rows a CPU step
  costs about the same per row (bench/step_cost.py), so more rows add little throughput but slow every
  running sentence.
* order: arrival order; a later segment that fits may skip ahead of one that does not.
* fairness: once the oldest waiting segment has been passed over for max_admit_wait_steps steps,
  skipping stops and running segments that arrived after it are preempted (dropped and queued again at
  their arrival place; they restart from scratch later, with the same result) until it fits. So every
  segment starts within max_admit_wait_steps steps plus the remaining steps of older segments. Small
  values: strict FIFO, big segments never starve, but preemption wastes work and skip-ahead
  (utilisation) stops sooner; large values: more throughput for short segments, longer waits for big
  ones.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, NamedTuple

from server.contract import (
    BatchItem,
    Finished,
    InFlightBatch,
    InputTooLongError,
    InvalidOptionsError,
    TranslationEngine,
)
from server.scheduler.jobs import EngineFailure, InvalidInput, Segment
from server.scheduler.queue import SegmentQueue

if TYPE_CHECKING:
    from server.metrics import Metrics

log = logging.getLogger("server.scheduler")


class Size(NamedTuple):
    """What segments add to (or the whole of) a running batch."""

    segments: int
    cost: int  # KV-cache bound (InFlightBatch.cost)
    rows: int  # decoder rows (beam sizes)

    def __add__(self, other: tuple) -> Size:  # type: ignore[override]
        return Size(*(a + b for a, b in zip(self, other, strict=True)))

    def __sub__(self, other: tuple) -> Size:
        return Size(*(a - b for a, b in zip(self, other, strict=True)))


EMPTY = Size(0, 0, 0)
SMALLEST = Size(1, 1, 1)  # no segment adds less to a running batch


class InFlightBatching:
    """The worker loop of mode "inflight", over one `InFlightBatch` of the engine."""

    def __init__(
        self,
        engine: TranslationEngine,
        queue: SegmentQueue,
        metrics: Metrics | None,
        *,
        max_batch_segments: int,
        max_running_tokens: int,
        max_running_rows: int,
        max_admit_wait_steps: int,
    ) -> None:
        self.engine = engine
        self.queue = queue
        self.metrics = metrics
        self.max_batch_segments = max_batch_segments
        self.max_running_tokens = max_running_tokens
        self.max_running_rows = max_running_rows
        self.max_admit_wait_steps = max_admit_wait_steps
        self.steps = 0  # decoding steps run
        self.preempted = 0  # running segments preempted for a starving one
        self.batch: InFlightBatch = engine.running_batch()
        self.running: dict[int, tuple[Segment, Size]] = {}  # seq -> (segment, its size), in order
        self.load = EMPTY  # the running segments' sizes, summed
        self._head_seq, self._head_since = -1, 0  # the oldest waiting segment, and since which step
        self._window = (time.monotonic(), 0)  # (start, segments finished): throughput for retry hints

    def run(self) -> None:
        """The worker thread: step boundaries until the queue is stopping and nothing runs."""
        while True:
            try:
                if not self.round():
                    return
            except Exception:  # pragma: no cover - defensive: never let the worker die
                log.exception("scheduler error")
                time.sleep(0.01)

    def round(self) -> bool:
        """One step boundary; False when stopping with nothing left."""
        q = self.queue
        with q.cond:
            while True:
                now = time.monotonic()
                to_finish = q.purge(now)
                if self.running or q.segments or to_finish:
                    break
                if q.stopping:
                    return False
                q.cond.wait()
            dead = [k for k, (seg, _) in self.running.items() if seg.job.dead(now)]
            dead_segs = [self._pop_running(key) for key in dead]
            admit, preempt = self._admission()
            q.update_gauges()
        for job, error in to_finish:
            q.finish(job, error)
        if dead or preempt:
            self.batch.drop(dead + [seg.seq for seg in preempt])
        for seg in dead_segs:
            q.deliver(seg, None, now)
        try:
            started = time.monotonic()
            fresh = self._admit(admit, now) if admit else []
            rows = self.batch.rows
            finished = self.batch.step() if len(self.batch) else []
            now = time.monotonic()
        except Exception as e:
            self._engine_failed(e)
            return True
        if not rows and self.running and not finished:  # pragma: no cover - defensive: never spin
            self._engine_failed(RuntimeError("running segments lost by the engine batch"))
            return True
        if rows:
            self.steps += 1
            if self.metrics is not None:
                m = self.metrics
                m.decode_steps.inc()
                m.batch_rows.observe(rows)
                m.step_seconds.observe(now - started)
                for seg in fresh:
                    m.time_to_first_step.observe(now - seg.enqueued_at)
        self._finish_items(finished, now)
        return True

    def _admission(self) -> tuple[list[tuple[Segment, Size]], list[Segment]]:
        """Pick queued segments to admit now (with their sizes), and running ones to preempt (lock
        held). Removes the admitted segments from the queue and queues the preempted ones again."""
        q = self.queue
        if not q.segments:
            self._head_seq = -1
            return [], []
        head = q.segments[0]
        if head.seq != self._head_seq:
            self._head_seq, self._head_since = head.seq, self.steps
        starving = self.steps - self._head_since >= self.max_admit_wait_steps
        preempt: list[Segment] = []
        younger = [size for seg, size in self.running.values() if seg.seq > head.seq] if starving else []
        if younger:
            need = self.size(head)
            without = self.load - sum(younger, EMPTY)
            if not self.fits(need, self.load) and self.fits(need, without):
                # Preempt the latest-admitted segments that arrived after the head, until it fits (only
                # when that is enough: otherwise the head waits for older ones, and nobody skips ahead).
                for key in reversed(list(self.running)):
                    if self.fits(need, self.load):
                        break
                    if self.running[key][0].seq > head.seq:
                        preempt.append(self._pop_running(key))
                if preempt:
                    self.preempted += len(preempt)
                    log.info("preempted %d running segments for a starving one", len(preempt))
                    q.requeue(preempt)
        load = self.load
        admit: list[tuple[Segment, Size]] = []
        for seg in q.segments:
            size = self.size(seg)
            if load.segments == 0 or self.fits(size, load):
                admit.append((seg, size))
                load = load + size
            elif starving or not self.fits(SMALLEST, load):
                break  # no skipping ahead of a starving head; or nothing further can fit
        if admit:
            q.take([seg for seg, _ in admit])
        return admit, preempt

    def size(self, seg: Segment) -> Size:
        """What a segment adds to the running batch."""
        options = seg.options
        return Size(1, self.batch.cost(seg.tokens, options), max(1, options.beam_size))

    def fits(self, size: Size, load: Size) -> bool:
        total = load + size
        return (
            total.segments <= self.max_batch_segments
            and total.cost <= self.max_running_tokens
            and total.rows <= self.max_running_rows
        )

    def _pop_running(self, key: int) -> Segment:
        seg, size = self.running.pop(key)
        self.load = self.load - size
        return seg

    def _admit(self, sized: list[tuple[Segment, Size]], now: float) -> list[Segment]:
        """Encode and merge the segments (with their sizes from _admission) into the running batch;
        returns those now running."""
        admit = [seg for seg, _ in sized]
        self.queue.dispatched(admit, now)
        for seg, size in sized:
            self.running[seg.seq] = (seg, size)
            self.load = self.load + size
        if self.metrics is not None:
            self.metrics.batch_segments.observe(len(admit))
            self.metrics.batch_tokens.observe(sum(s.tokens for s in admit))
        done = self.batch.admit([BatchItem(seg.seq, seg.text, seg.options) for seg in admit])
        self._finish_items(done, time.monotonic())
        return [seg for seg in admit if seg.seq in self.running]

    def _finish_items(self, finished: list[Finished], now: float) -> None:
        q = self.queue
        n = 0
        for f in finished:
            if f.key not in self.running:
                continue
            seg = self._pop_running(f.key)
            if f.error is not None:
                refused = isinstance(f.error, (InputTooLongError, InvalidOptionsError))
                q.fail([seg], InvalidInput(str(f.error)) if refused else EngineFailure(str(f.error)))
                continue
            q.deliver(seg, f.hypotheses, now)
            n += 1
        # Throughput estimate for retry hints, over windows of about a second.
        start, count = self._window
        count += n
        if now - start >= 1.0:
            q.note_rate(count / (now - start))
            start, count = now, 0
        self._window = (start, count)

    def _engine_failed(self, e: Exception) -> None:
        """The engine raised mid-batch: start a fresh batch and decode each request's running segments
        again on their own (request-level, from scratch), so that only the request that fails alone fails
        (fault isolation: one client must not fail the others)."""
        segs = [seg for seg, _ in self.running.values()]
        self.running.clear()
        self.load = EMPTY
        self.batch = self.engine.running_batch()
        by_job: dict = {}
        for seg in segs:
            by_job.setdefault(seg.job, []).append(seg)
        log.warning(
            "engine failed on the running batch (%d segments of %d requests: %s); retrying each alone",
            len(segs),
            len(by_job),
            type(e).__name__,
            extra={"fields": {"error": str(e)}},
        )
        q = self.queue
        for job, job_segs in by_job.items():
            now = time.monotonic()
            if job.dead(now):
                for seg in job_segs:
                    q.deliver(seg, None, now)
                continue
            try:
                outputs = self.engine.translate([s.text for s in job_segs], job.options)
            except Exception as err:  # noqa: BLE001 - this request fails alone
                log.exception("engine failed on request %s alone", job.request_id or "-")
                q.engine_error()
                q.fail(job_segs, EngineFailure(f"translation failed: {err}"))
                continue
            now = time.monotonic()
            for seg, hyps in zip(job_segs, outputs, strict=True):
                q.deliver(seg, hyps, now)
