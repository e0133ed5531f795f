"""Waiting in line for room in a full queue (server/scheduler/queue.py `SegmentQueue.admit`, what HTTP
requests do through `Scheduler.run(job, wait_s)`): first come first served, bounded in time and in
number, never past a deadline, left when the caller goes, and ended by a stop. Against the fake engine
held at its gate, so the queue stays full exactly as long as a test needs."""

from __future__ import annotations

import asyncio
import time

import pytest

from server.metrics import Metrics
from server.scheduler import Job, QueueFullError, RequestCancelled, Scheduler, SchedulerStopped
from tests.fake_engine import GatedEngine
from tests.test_scheduler import GREEDY


def make(max_queue_segments: int = 4, max_queue_waiters: int = 8) -> tuple[GatedEngine, Scheduler, Metrics]:
    engine = GatedEngine(step_s=0)
    metrics = Metrics(process_metrics=False)
    scheduler = Scheduler(
        engine,
        metrics,
        mode="request",
        max_wait_ms=0,
        max_batch_segments=1,  # one segment in the engine at a time: the queue holds the rest
        max_queue_segments=max_queue_segments,
        max_queue_waiters=max_queue_waiters,
    )
    return engine, scheduler, metrics


def job(texts: list[str], deadline: float | None = None) -> Job:
    return Job(texts, [len(t.split()) for t in texts], GREEDY, deadline=deadline)


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, {"model": "", **labels})
    return value or 0.0


async def fill(engine: GatedEngine, scheduler: Scheduler, n: int) -> list[asyncio.Future]:
    """One segment held in the engine at its closed gate, then `n` more queued behind it."""
    engine.gate.clear()
    held = asyncio.ensure_future(scheduler.run(job(["held"])))
    while not engine.waiting.is_set():
        await asyncio.sleep(0.005)
    queued = [asyncio.ensure_future(scheduler.run(job([f"q{i}"]))) for i in range(n)]
    while scheduler.queue_depth < n:
        await asyncio.sleep(0.005)
    return [held, *queued]


async def until(predicate, timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.005)


def run(scheduler: Scheduler, engine: GatedEngine, coro):
    try:
        return asyncio.run(coro)
    finally:
        engine.gate.set()
        scheduler.stop(10)


def test_room_goes_to_the_line_in_arrival_order_and_nobody_overtakes():
    engine, scheduler, metrics = make()
    admitted: list[str] = []

    async def main():
        before = await fill(engine, scheduler, 4)

        async def wait(name: str, texts: list[str]) -> None:
            await scheduler.run(job(texts), wait_s=30)
            admitted.append(name)

        # Two segments first, then two of one: when one place frees, the pair still does not fit, and
        # the singles behind it wait for it instead of taking the place.
        line = [asyncio.ensure_future(wait("pair", ["a", "b"]))]
        await until(lambda: scheduler.queue.waiting == 1)
        line += [asyncio.ensure_future(wait(n, [n])) for n in ("one", "two")]
        await until(lambda: scheduler.queue.waiting == 3)
        assert sample(metrics, "translator_queue_waiting_requests") == 3
        before[1].cancel()  # one place frees: not enough for the pair, and nobody behind it takes it
        await asyncio.gather(before[1], return_exceptions=True)
        assert (scheduler.queue_depth, scheduler.queue.waiting) == (3, 3)
        # Newcomers that do not wait are refused too, although a place is free: the line comes first.
        with pytest.raises(QueueFullError):
            scheduler.submit(job(["gRPC"]))
        engine.gate.set()
        await asyncio.gather(before[0], *before[2:], *line)
        return admitted

    assert run(scheduler, engine, main()) == ["pair", "one", "two"]
    assert sample(metrics, "translator_admissions_total", outcome="admitted") == 3
    assert sample(metrics, "translator_admissions_total", outcome="refused") == 1
    assert sample(metrics, "translator_admission_wait_seconds_count") == 3
    assert sample(metrics, "translator_queue_waiting_requests") == 0


def test_the_wait_is_bounded_in_time_and_by_the_deadline():
    engine, scheduler, metrics = make()

    async def main():
        held = await fill(engine, scheduler, 4)
        t0 = time.monotonic()
        with pytest.raises(QueueFullError) as full:
            await scheduler.run(job(["late"]), wait_s=0.3)
        waited = time.monotonic() - t0
        assert 0.3 <= waited < 2 and full.value.retry_after_ms > 0
        t0 = time.monotonic()
        with pytest.raises(RequestCancelled) as cut:  # the deadline comes before the wait bound
            await scheduler.run(job(["hurried"], deadline=time.monotonic() + 0.2), wait_s=30)
        assert cut.value.reason == "deadline" and 0.2 <= time.monotonic() - t0 < 2
        assert scheduler.queue.waiting == 0
        for f in held:
            f.cancel()
        await asyncio.gather(*held, return_exceptions=True)

    run(scheduler, engine, main())
    assert sample(metrics, "translator_admissions_total", outcome="timed_out") == 1
    assert sample(metrics, "translator_admissions_total", outcome="cancelled") == 1  # by its deadline
    assert sample(metrics, "translator_admission_wait_seconds_count") == 2


def test_the_line_is_capped_and_a_zero_wait_is_refused_at_once():
    engine, scheduler, metrics = make(max_queue_waiters=2)

    async def main():
        held = await fill(engine, scheduler, 4)
        line = [asyncio.ensure_future(scheduler.run(job([f"w{i}"]), wait_s=30)) for i in range(2)]
        await until(lambda: scheduler.queue.waiting == 2)
        t0 = time.monotonic()
        for wait_s in (30, 0):  # the line is full; no wait at all
            with pytest.raises(QueueFullError):
                await scheduler.run(job(["third"]), wait_s=wait_s)
        assert time.monotonic() - t0 < 0.5
        engine.gate.set()
        answered = await asyncio.gather(*line)
        await asyncio.gather(*held)
        return [j.results[0][0].text for j in answered]

    assert run(scheduler, engine, main()) == ["w0", "w1"]
    assert sample(metrics, "translator_admissions_total", outcome="refused") == 2


def test_a_caller_that_goes_leaves_the_line_and_lets_the_next_one_in():
    engine, scheduler, metrics = make()

    async def main():
        held = await fill(engine, scheduler, 4)
        big = asyncio.ensure_future(scheduler.run(job(["x", "y", "z"]), wait_s=30))
        await until(lambda: scheduler.queue.waiting == 1)
        small = asyncio.ensure_future(scheduler.run(job(["s"]), wait_s=30))
        await until(lambda: scheduler.queue.waiting == 2)
        held[1].cancel()  # one place: the big one at the head does not fit, the small one waits behind
        await asyncio.gather(held[1], return_exceptions=True)
        assert scheduler.queue.waiting == 2
        big.cancel()  # e.g. the HTTP client hung up: the small one takes the place at once
        await asyncio.gather(big, return_exceptions=True)
        await until(lambda: scheduler.queue.waiting == 0 and scheduler.queue_depth == 4)
        engine.gate.set()
        done = await small
        await asyncio.gather(held[0], *held[2:])
        return done.results[0][0].text

    assert run(scheduler, engine, main()) == "s"
    assert sample(metrics, "translator_admissions_total", outcome="cancelled") == 1
    assert sample(metrics, "translator_segments_total", outcome="translated") == 5  # held, 3, small


def test_a_stop_ends_the_wait():
    engine, scheduler, _ = make()

    async def main():
        held = await fill(engine, scheduler, 4)
        waiting = asyncio.ensure_future(scheduler.run(job(["w"]), wait_s=30))
        await until(lambda: scheduler.queue.waiting == 1)
        scheduler.queue.stop()
        with pytest.raises(SchedulerStopped):
            await waiting
        engine.gate.set()
        await asyncio.gather(*held)

    run(scheduler, engine, main())
