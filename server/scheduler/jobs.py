"""What travels through the scheduler: a request (`Job`), its segments, and the errors it can end with."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from server.contract import DecodingOptions, Hypothesis


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
    done: bool = False
    _loop: asyncio.AbstractEventLoop | None = None
    _future: asyncio.Future | None = None

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def dead(self, now: float) -> bool:
        """Resolved, cancelled or past its deadline: its segments need no more work."""
        return self.done or self.cancelled or self.expired(now)

    def drop_reason(self, now: float) -> str:
        """Why a dead job's segments were dropped: "deadline" or "cancelled"."""
        return "deadline" if self.expired(now) and not self.cancelled else "cancelled"

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
