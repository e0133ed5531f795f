"""Batching scheduler: a bounded queue of segments feeding one engine worker thread.

Requests are split into segments (one per text) and queued (`queue`); the worker thread runs one of
two strategies over the queue, picked by ``mode``:

* ``request`` (the Scheduler's default) and ``off``: request-level batching (`request_level`): engine
  batches of segments with the same options and similar lengths, each run to the end; ``off`` keeps
  requests apart.
* ``inflight`` (the server's default): continuous batching (`inflight`): one running decode batch that
  waiting segments join and finished ones leave at every decoding-step boundary, under a KV-cache token
  budget, a decoder rows cap, FIFO with skip-ahead and a fairness bound.

Results are routed back to each caller's asyncio future. A request that is cancelled or whose deadline
passes leaves the queue at once and a running batch at the engine's next decoding step; the rest of the
batch is unaffected.

This package knows nothing about gRPC and never imports the engine: it is typed against the contract
(`server.contract.TranslationEngine` / `InFlightBatch`), and the engine is only called from the worker
thread.
"""

from server.scheduler.core import MODES, Scheduler
from server.scheduler.jobs import (
    DEADLINE_SLACK_S,
    EngineFailure,
    InvalidInput,
    Job,
    QueueFullError,
    RequestCancelled,
    SchedulerError,
    SchedulerStopped,
)

__all__ = [
    "DEADLINE_SLACK_S",
    "MODES",
    "EngineFailure",
    "InvalidInput",
    "Job",
    "QueueFullError",
    "RequestCancelled",
    "Scheduler",
    "SchedulerError",
    "SchedulerStopped",
]
