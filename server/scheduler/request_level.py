"""Request-level batching: the worker thread builds engine batches from the queue and runs each to the end.

The oldest queued segment picks the decoding options; segments with identical options and similar
length join it while the padded token budget (``max_batch_tokens``, counted as padded source tokens x
beam size) and ``max_batch_segments`` allow, and a batch leaves as soon as it is full or its oldest
segment has waited ``max_wait_s``. With batching off (mode "off"), a batch holds segments of one
request only. A request cancelled or past its deadline leaves a running batch at the engine's next
decoding step (through `TranslationEngine.translate`'s ``cancelled`` callback).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from server.contract import InputTooLongError, InvalidOptionsError, TranslationEngine
from server.scheduler.jobs import EngineFailure, InvalidInput, Job, RequestCancelled, SchedulerError, Segment
from server.scheduler.queue import SegmentQueue

if TYPE_CHECKING:
    from server.metrics import Metrics

log = logging.getLogger("server.scheduler")

# Errors by which the engine refuses a batch's input (as opposed to failing on it).
REFUSALS = (InputTooLongError, InvalidOptionsError)


def batch_cost(max_tokens: int, rows: int, beam: int) -> int:
    """Padded token budget of a batch: longest source x rows x beam size."""
    return max(1, max_tokens) * rows * max(1, beam)


class RequestLevelBatching:
    """The worker loop of modes "request" (``batching=True``) and "off" (one request per batch)."""

    steps = 0  # decoding steps are counted in in-flight mode only
    preempted = 0

    def __init__(
        self,
        engine: TranslationEngine,
        queue: SegmentQueue,
        metrics: Metrics | None,
        *,
        batching: bool,
        max_batch_tokens: int,
        max_batch_segments: int,
        max_wait_s: float,
    ) -> None:
        self.engine = engine
        self.queue = queue
        self.metrics = metrics
        self.batching = batching
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_segments = max_batch_segments
        self.max_wait_s = max_wait_s

    def run(self) -> None:
        """The worker thread: batches until the queue is stopping and empty."""
        while True:
            try:
                batch, to_finish = self._next_batch()
            except Exception:  # pragma: no cover - defensive: never let the worker die
                log.exception("scheduler error")
                time.sleep(0.01)
                continue
            for job, error in to_finish:
                self.queue.finish(job, error)
            if batch is None:
                return
            if batch:
                self._run_batch(batch)

    def select(self, head: Segment, candidates: list[Segment]) -> list[Segment]:
        """Grow a batch around `head` with candidates of the closest lengths within the budgets."""
        beam = head.options.beam_size
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
                assert left is not None
                pick, new_i, new_j = left, i - 1, j
            else:
                pick, new_i, new_j = right, i, j + 1
            new_longest = max(longest, pick.tokens)
            if batch_cost(new_longest, j - i + 2, beam) > self.max_batch_tokens:
                # The other side may still fit (shorter segments add no padding).
                if (
                    pick is right
                    and left is not None
                    and batch_cost(longest, j - i + 2, beam) <= self.max_batch_tokens
                ):
                    i -= 1
                    continue
                break
            i, j, longest = new_i, new_j, new_longest
        batch = ordered[i : j + 1]
        batch.sort(key=lambda s: s.seq)
        return batch

    def _next_batch(self) -> tuple[list[Segment] | None, list[tuple[Job, RequestCancelled]]]:
        """Block until a batch is due. Returns (batch, jobs to resolve); batch is None when stopping
        with an empty queue, and empty when only dropped jobs are to be resolved."""
        q = self.queue
        with q.cond:
            while True:
                now = time.monotonic()
                to_finish = q.purge(now)
                if to_finish:
                    return [], to_finish
                if not q.segments:
                    if q.stopping:
                        return None, []
                    q.cond.wait()
                    continue
                head = q.segments[0]
                if self.batching:
                    options = head.options
                    same = [s for s in q.segments if s.options == options]
                    rows = len(same)
                    longest = max(s.tokens for s in same)
                    full = (
                        rows >= self.max_batch_segments
                        or batch_cost(longest, rows, options.beam_size) >= self.max_batch_tokens
                    )
                    due = head.enqueued_at + self.max_wait_s
                    if not full and now < due and not q.stopping:
                        q.cond.wait(due - now)
                        continue
                else:
                    same = [s for s in q.segments if s.job is head.job]
                batch = self.select(head, same)
                q.take(batch)
                q.update_gauges()
                return batch, []

    def _run_batch(self, batch: list[Segment], retry: bool = False) -> None:
        q = self.queue
        jobs = [s.job for s in batch]
        options = jobs[0].options
        texts = [s.text for s in batch]
        start = time.monotonic()
        if not retry:
            q.dispatched(batch, start)

        def cancelled() -> Sequence[bool]:
            now = time.monotonic()
            return [job.dead(now) for job in jobs]

        try:
            outputs = self.engine.translate(texts, options, cancelled=cancelled)
            if len(outputs) != len(batch):
                raise RuntimeError(f"engine returned {len(outputs)} results for {len(batch)} texts")
        except Exception as e:
            elapsed = time.monotonic() - start
            refused = isinstance(e, REFUSALS)
            by_job = {job: [s for s in batch if s.job is job] for job in dict.fromkeys(jobs)}
            if not refused and len(by_job) > 1:
                # Fault isolation: one request must not fail the others. Each request's segments are
                # decoded again on their own; only the one that fails alone fails.
                log.warning(
                    "engine failed on a batch of %d requests (%s); retrying each alone",
                    len(by_job),
                    type(e).__name__,
                    extra={"fields": {"error": str(e)}},
                )
                for segs in by_job.values():
                    self._run_batch(segs, retry=True)
                return
            if not refused:
                log.exception(
                    "engine failed on a batch of %d segments",
                    len(batch),
                    extra={"fields": {"id": jobs[0].request_id}},
                )
                q.engine_error()
            error: SchedulerError = (
                InvalidInput(str(e)) if refused else EngineFailure(f"translation failed: {e}")
            )
            q.fail(batch, error)
            if self.metrics is not None:
                self.metrics.batch_decode.observe(elapsed)
            return
        elapsed = time.monotonic() - start
        translated = sum(o is not None for o in outputs)
        if translated:
            q.note_rate(translated / max(elapsed, 1e-6))
        if self.metrics is not None:
            self._observe(batch, start, elapsed)
        now = time.monotonic()
        for seg, hyps in zip(batch, outputs, strict=True):
            q.deliver(seg, hyps, now)

    def _observe(self, batch: list[Segment], start: float, elapsed: float) -> None:
        """Batch metrics, with the engine's per-batch stats where it keeps them (`last_stats`, an
        optional extra of server.engine.Engine, outside the contract)."""
        m = self.metrics
        assert m is not None
        m.batch_segments.observe(len(batch))
        m.batch_tokens.observe(sum(s.tokens for s in batch))
        m.batch_decode.observe(elapsed)
        stats: dict[str, Any] = getattr(self.engine, "last_stats", None) or {}
        steps = int(stats.get("steps", 0))
        if steps:
            m.decode_steps.inc(steps)
            mean_rows = stats.get("row_steps", 0) / steps
            step_s = float(stats.get("decoder_s", 0.0)) / steps
            for _ in range(steps):  # per-step occupancy and time: the batch's means per step
                m.batch_rows.observe(mean_rows)
                m.step_seconds.observe(step_s)
            first = float(stats.get("encoder_s", 0.0)) + float(stats.get("decoder_s", 0.0)) / steps
            for seg in batch:  # estimated: batch start + encoder + one mean step
                m.time_to_first_step.observe(start - seg.enqueued_at + first)
