"""The Scheduler facade: one queue, one engine worker thread, and the batching strategy it runs.

Callers (the transports, through server.translate) `submit` or `run` jobs and `cancel` them; `run`
may wait a bounded time in line for room in a full queue (the HTTP transport does: see
`queue.SegmentQueue.admit`); the worker thread runs the
strategy the mode picks (`request_level.RequestLevelBatching` for "request" and "off",
`inflight.InFlightBatching` for "inflight") over the shared `queue.SegmentQueue`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING, Protocol

from server.contract import TranslationEngine
from server.scheduler.inflight import InFlightBatching
from server.scheduler.jobs import Job, RequestCancelled
from server.scheduler.queue import SegmentQueue
from server.scheduler.request_level import RequestLevelBatching

if TYPE_CHECKING:
    from server.metrics import Metrics

log = logging.getLogger("server.scheduler")

MODES = ("request", "inflight", "off")


class BatchingStrategy(Protocol):
    """What the worker thread runs: `run()` returns once the queue is stopping and nothing is left."""

    steps: int  # decoding steps run (in-flight mode)
    preempted: int  # running segments preempted for a starving one (in-flight mode)

    def run(self) -> None: ...


def effective_mode(engine: TranslationEngine, mode: str) -> str:
    """The mode the scheduler runs: "inflight" falls back to "request" when the bundle cannot."""
    if mode not in MODES:
        raise ValueError(f"batching mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "inflight" and not engine.supports_inflight:
        log.warning("the bundle's decoder graph lacks per-row positions: request-level batching instead")
        return "request"
    # inflight_copies_cache: an optional extra of server.engine.Engine (device sessions, old bundle).
    if mode == "inflight" and getattr(engine, "inflight_copies_cache", False):
        log.warning(
            "the bundle has no kv_rows/kv_step graphs: the in-flight batch keeps its KV cache in host "
            "memory and copies it to the device at every step; re-export the bundle (python -m export) "
            "to keep it on the device"
        )
    return mode


class Scheduler:
    def __init__(
        self,
        engine: TranslationEngine,
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
        max_queue_waiters: int = 0,
    ) -> None:
        """mode: "request" (default; "off" when batching is False) or "inflight" (needs an engine whose
        `supports_inflight`; falls back to "request" with a warning when the bundle is too old).
        max_queue_waiters: requests that may wait in line for room when the queue is full (`run`'s
        `wait_s`); past it they get QueueFullError at once."""
        self.engine = engine
        self.metrics = metrics
        self.mode = effective_mode(engine, mode or ("request" if batching else "off"))
        self.batching = self.mode != "off"
        self.queue = SegmentQueue(metrics, max_queue_segments, max_queue_waiters)
        self.strategy: BatchingStrategy
        if self.mode == "inflight":
            self.strategy = InFlightBatching(
                engine,
                self.queue,
                metrics,
                max_batch_segments=max_batch_segments,
                max_running_tokens=max_running_tokens,
                max_running_rows=max_running_rows,
                max_admit_wait_steps=max_admit_wait_steps,
            )
        else:
            self.strategy = RequestLevelBatching(
                engine,
                self.queue,
                metrics,
                batching=self.batching,
                max_batch_tokens=max_batch_tokens,
                max_batch_segments=max_batch_segments,
                max_wait_s=max_wait_ms / 1000.0,
            )
        self._thread = threading.Thread(target=self.strategy.run, name="engine-worker", daemon=True)
        self._thread.start()

    # ---- caller side (event loop) ----------------------------------------------------------------

    def submit(self, job: Job) -> asyncio.Future:
        """Queue a job's segments; returns a future resolved with the job (results filled) or a
        SchedulerError. Raises QueueFullError at once when the queue cannot take the segments."""
        return self.queue.submit(job)

    async def run(self, job: Job, wait_s: float = 0.0) -> Job:
        """Submit and wait; cancellation of the awaiting task or the deadline drops the job. `wait_s`:
        how long a job that finds the queue full may wait in line for room (`SegmentQueue.admit`;
        0: QueueFullError at once, the gRPC transport's choice)."""
        try:
            fut = await self.queue.admit(job, wait_s)
        except asyncio.CancelledError:
            # Cancelled in line, or just as room came (its segments are queued then): drop them.
            self.cancel(job, job.cancel_reason_at(time.monotonic()))
            raise
        timeout = None if job.deadline is None else max(0.0, job.deadline - time.monotonic())
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            self.cancel(job, "deadline")
            raise RequestCancelled("deadline") from None
        except asyncio.CancelledError:
            # The transport cancels the call at its deadline too (gRPC does): that is a deadline.
            self.cancel(job, job.cancel_reason_at(time.monotonic()))
            raise

    def cancel(self, job: Job, reason: str = "cancelled") -> None:
        """Drop a job: its queued segments leave now, its running rows at the next decoding step. Every
        segment of it that did not finish is counted as dropped for `reason` ("cancelled" or
        "deadline"; the first cancellation's, if it is cancelled twice)."""
        if job.cancel_reason is None:
            job.cancel_reason = reason
        job.cancelled = True
        self.queue.finish(job, RequestCancelled(reason))

    @property
    def queue_depth(self) -> int:
        return len(self.queue)

    @property
    def steps(self) -> int:
        """Decoding steps run (in-flight mode; 0 otherwise)."""
        return self.strategy.steps

    @property
    def preempted(self) -> int:
        """Running segments preempted for a starving one (in-flight mode; 0 otherwise)."""
        return self.strategy.preempted

    def stop(self, timeout: float | None = None) -> None:
        """Let the worker finish what is queued, then end it."""
        self.queue.stop()
        self._thread.join(timeout)
