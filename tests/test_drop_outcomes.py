"""The outcome a dropped segment is counted under (`translator_segments_total{outcome=...}`): operators
tell client cancellations from deadlines by it, so it must follow why the request ended, not which
thread looked at the clock first. Scheduler-level, with tests/fake_engine.py's GatedEngine holding the
worker at a decoding step while the test cancels."""

from __future__ import annotations

import asyncio
import time

import pytest

from server.contract import DecodingOptions
from server.metrics import Metrics
from server.scheduler import DEADLINE_SLACK_S, Job, RequestCancelled, Scheduler
from tests.fake_engine import GatedEngine

LONG = DecodingOptions(beam_size=2, num_hypotheses=1, max_length=200, length_penalty=0.6)
ONE_STEP = DecodingOptions(beam_size=1, num_hypotheses=1, max_length=1, length_penalty=0.6)


def outcomes(metrics: Metrics) -> dict[str, float]:
    return {
        s.labels["outcome"]: s.value
        for m in metrics.registry.collect()
        for s in m.samples
        if s.name == "translator_segments_total"
    }


def settled(metrics: Metrics, n: int, timeout: float = 10) -> dict[str, float]:
    """The outcomes once `n` segments have one."""
    end = time.monotonic() + timeout
    while sum(outcomes(metrics).values()) < n and time.monotonic() < end:
        time.sleep(0.005)
    return outcomes(metrics)


def run_held(
    mode: str, options: DecodingOptions, act, texts: tuple[str, ...] = ("one two three", "four five"), **kw
) -> tuple[dict[str, float], str]:
    """The texts of one request decoding on a GatedEngine (scheduler settings `kw`); once the worker
    waits at the closed gate, `act(scheduler, job)` runs, then the gate opens. Returns the outcomes of
    the segments and the reason the request's future was cancelled with."""
    engine = GatedEngine(step_s=0)
    metrics = Metrics(process_metrics=False)
    scheduler = Scheduler(engine, metrics, mode=mode, max_wait_ms=0, **kw)
    j = Job(list(texts), engine.count_tokens(list(texts)), options, deadline=time.monotonic() + 60)
    engine.gate.clear()
    try:

        async def main() -> str:
            fut = scheduler.submit(j)
            while not engine.waiting.is_set():
                await asyncio.sleep(0.002)
            act(scheduler, j)
            engine.gate.set()
            with pytest.raises(RequestCancelled) as e:
                await fut
            return e.value.reason

        reason = asyncio.run(main())
        return settled(metrics, len(texts)), reason
    finally:
        engine.gate.set()
        scheduler.stop(10)


@pytest.mark.parametrize("mode", ["inflight", "request"])
@pytest.mark.parametrize("reason", ["deadline", "cancelled"])
def test_running_rows_are_counted_by_the_reason_their_request_ended(mode, reason):
    """The event loop's deadline timer cancels a request while the worker's clock for the step still
    reads before the deadline (here: 60 s before it): its running rows are dropped for the deadline
    all the same."""
    assert run_held(mode, LONG, lambda s, j: s.cancel(j, reason)) == ({"dropped_" + reason: 2}, reason)


@pytest.mark.parametrize("reason", ["deadline", "cancelled"])
def test_rows_cancelled_during_their_last_step_are_dropped_for_that_reason(reason):
    """In-flight: the request ends while its one and only step runs; the step's results are thrown away
    and the rows counted as dropped for the request's reason, not translated."""
    got = run_held("inflight", ONE_STEP, lambda s, j: s.cancel(j, reason))
    assert got == ({"dropped_" + reason: 2}, reason)


def test_a_second_cancellation_keeps_the_first_reason():
    def twice(scheduler: Scheduler, j: Job) -> None:
        scheduler.cancel(j, "deadline")
        scheduler.cancel(j, "cancelled")

    assert run_held("inflight", LONG, twice) == ({"dropped_deadline": 2}, "deadline")


def test_queued_segments_of_a_cancelled_request_are_dropped_for_its_reason():
    """Request mode, one segment per batch: the second segment is still queued when the deadline
    cancels the request; both are counted as deadline drops."""

    def cancel_while_one_is_queued(scheduler: Scheduler, j: Job) -> None:
        assert scheduler.queue_depth == 1
        scheduler.cancel(j, "deadline")
        assert scheduler.queue_depth == 0

    got = run_held(
        "request", LONG, cancel_while_one_is_queued, ("one two", "three four"), max_batch_segments=1
    )
    assert got == ({"dropped_deadline": 2}, "deadline")


@pytest.mark.parametrize(("left_s", "reason"), [(-0.05, "deadline"), (0.05, "deadline"), (5.0, "cancelled")])
def test_a_caller_cancelled_at_its_deadline_ended_by_the_deadline(left_s, reason):
    """gRPC cancels a call when the client's deadline passes, a little before the server's copy of that
    deadline (it started when the request arrived): a caller cancelled within DEADLINE_SLACK_S of its
    deadline, or past it, ended by the deadline; one cancelled earlier was cancelled."""
    assert DEADLINE_SLACK_S == 0.1
    engine = GatedEngine(step_s=0)
    metrics = Metrics(process_metrics=False)
    scheduler = Scheduler(engine, metrics, mode="inflight")
    texts = ["one two three", "four five"]
    j = Job(texts, engine.count_tokens(texts), LONG, deadline=None)
    engine.gate.clear()
    try:

        async def main() -> None:
            task = asyncio.ensure_future(scheduler.run(j))
            while not engine.waiting.is_set():
                await asyncio.sleep(0.002)
            j.deadline = time.monotonic() + left_s  # as if it had been there from the start
            task.cancel()  # before the scheduler's own timer (there is none: no deadline when it started)
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        engine.gate.set()
        assert j.cancel_reason == reason
        assert settled(metrics, 2) == {"dropped_" + reason: 2}
    finally:
        engine.gate.set()
        scheduler.stop(10)
