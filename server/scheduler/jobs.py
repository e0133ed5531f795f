"""What travels through the scheduler: a request (`Job`), its segments, and the errors it can end with."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from server.contract import DecodingOptions, Hypothesis

# A caller cancelled this close to its request's deadline ended by the deadline: a gRPC client cancels
# the call when its own deadline passes, and the server's copy of that deadline (time remaining when the
# request arrived) runs late by however long the request took to reach the handler.
DEADLINE_SLACK_S = 0.1


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
    """The engine refused the input (a segment over the token limit, options it cannot run)."""


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
    results: list[list[Hypothesis] | None] = field(default_factory=list)  # n-best list per text
    remaining: int = 0
    output_tokens: int = 0
    cancelled: bool = False  # read by the worker thread at every decoding step
    cancel_reason: str | None = None  # why it was cancelled: "cancelled" or "deadline" (Scheduler.cancel)
    done: bool = False
    _loop: asyncio.AbstractEventLoop | None = None
    _future: asyncio.Future | None = None

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def cancel_reason_at(self, now: float) -> str:
        """Why a caller that gives up at `now` ended: "deadline" within DEADLINE_SLACK_S of it."""
        return "deadline" if self.expired(now + DEADLINE_SLACK_S) else "cancelled"

    def dead(self, now: float) -> bool:
        """Resolved, cancelled or past its deadline: its segments need no more work."""
        return self.done or self.cancelled or self.expired(now)

    def drop_reason(self, now: float) -> str:
        """Why a dead job's segments were dropped: "deadline" or "cancelled". A cancelled job's reason
        is the one given when it was cancelled, whatever the clock of the thread that drops its rows
        says (a worker's step can start before the deadline that cancelled the job)."""
        if self.cancel_reason is not None:
            return self.cancel_reason
        return "deadline" if self.expired(now) else "cancelled"

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


@dataclass(eq=False)
class Segment:
    """One text of a job, queued or running."""

    job: Job
    index: int
    seq: int  # arrival order (the key of a running in-flight item)
    enqueued_at: float

    @property
    def text(self) -> str:
        return self.job.texts[self.index]

    @property
    def tokens(self) -> int:
        return self.job.token_counts[self.index]

    @property
    def options(self) -> DecodingOptions:
        return self.job.options
