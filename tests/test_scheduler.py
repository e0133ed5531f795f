"""Batching scheduler (no gRPC). Its behaviour runs against a small fake engine (tests/fake_engine.py:
deterministic, fast, no ONNX); a few tests check the integration with the real engine on a tiny exported
bundle (bit-identical results through both strategies, the cancelled callback, the bundle checks)."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time

import pytest

from server.contract import (
    BatchItem,
    BundleError,
    DecodingOptions,
    InFlightBatch,
    InputTooLongError,
    InvalidOptionsError,
    TranslationEngine,
)
from server.metrics import Metrics
from server.scheduler import EngineFailure, InvalidInput, Job, QueueFullError, RequestCancelled, Scheduler
from server.scheduler.jobs import Segment
from tests.conftest import copy_without_kv_rows
from tests.fake_engine import FakeEngine, GatedEngine

TEXTS = [
    "Open the file",
    "Save changes to the document before closing?",
    "Do you want to continue?",
    "The file could not be found.",
    "Print",
    "Are you sure you want to delete this folder and everything in it?",
    "Check for updates",
    "Connection to the server failed.",
]
GREEDY = DecodingOptions(beam_size=1, num_hypotheses=1, max_length=12, length_penalty=0.6)
# Both engines decode to max_length: 32 texts x beam 8 x 256 steps keep the engine busy for seconds, long
# enough to cancel, expire or queue behind.
LONG = DecodingOptions(beam_size=8, num_hypotheses=1, max_length=256, length_penalty=0.6)
LONG_TEXTS = TEXTS * 4
BEAM2 = DecodingOptions(beam_size=2, num_hypotheses=2, max_length=10, length_penalty=0.6)
BEAM4 = DecodingOptions(beam_size=4, num_hypotheses=1, max_length=16, length_penalty=1.0)
SOLO = FakeEngine(step_s=0)  # the fake's solo results without the wait: they do not depend on step_s


@pytest.fixture()
def fake() -> FakeEngine:
    return FakeEngine(step_s=0.002)


@pytest.fixture()
def slow_fake() -> FakeEngine:
    """10 ms steps: LONG runs for 2.5 s, time to queue behind it, cancel it or let deadlines pass."""
    return FakeEngine(step_s=0.01)


@pytest.fixture(scope="module")
def engine(tiny_bundle):
    from server.engine import Engine

    return Engine(tiny_bundle, intra_op_threads=1)


def make_scheduler(engine, **kwargs) -> tuple[Scheduler, Metrics]:
    metrics = Metrics(process_metrics=False)
    kwargs.setdefault("max_wait_ms", 20)
    return Scheduler(engine, metrics, **kwargs), metrics


def job(engine, texts, options=GREEDY, deadline=None) -> Job:
    return Job(list(texts), engine.count_tokens(list(texts)), options, deadline=deadline)


def hist(metrics: Metrics, name: str) -> tuple[float, float]:
    """(count, sum) of an unlabelled histogram."""
    values = {s.name: s.value for m in metrics.registry.collect() if m.name == name for s in m.samples}
    return values[name + "_count"], values[name + "_sum"]


def outcomes(metrics: Metrics) -> dict[str, float]:
    """translator_segments_total by outcome."""
    return {
        s.labels["outcome"]: s.value
        for m in metrics.registry.collect()
        for s in m.samples
        if s.name == "translator_segments_total"
    }


def texts_of(results) -> list[str]:
    return [hyps[0].text for hyps in results]


def nbest(hyps) -> list[tuple]:
    return [(h.text, h.tokens, h.score) for h in hyps]


# ---- the fake engine ------------------------------------------------------------------------------------


def test_fake_engine_satisfies_the_contract():
    fake = FakeEngine(step_s=0)
    assert isinstance(fake, TranslationEngine)
    rb = fake.running_batch()
    assert isinstance(rb, InFlightBatch)
    solo = [fake.translate([t], BEAM2)[0] for t in TEXTS]
    assert fake.translate(TEXTS, BEAM2) == solo  # the same in any batch
    assert [h.text for h in solo[0]] == ["file the Open", "file the Open (1)"]
    assert fake.translate(["  Print "], GREEDY)[0][0].text == "  Print "
    assert fake.translate([" \n"], GREEDY)[0][0].text == " \n"
    assert fake.last_stats["steps"] == 0
    # One step per token of the generation budget; cancelled() drops a row at a step boundary.
    calls = []
    out = fake.translate(TEXTS[:2], GREEDY, cancelled=lambda: calls.append(1) or [False, len(calls) > 3])
    assert out == [fake.translate(TEXTS[:1], GREEDY)[0], None]
    assert len(calls) == GREEDY.max_length  # before every step
    # The running batch gives the same results, with any options, and drops on demand.
    done = rb.admit([BatchItem(i, t, BEAM2 if i % 2 else GREEDY) for i, t in enumerate(TEXTS)])
    assert done == [] and len(rb) == len(TEXTS) and rb.rows == 4 * 1 + 4 * 2
    assert rb.drop([0, 99]) == 1 and rb.keys == list(range(1, len(TEXTS)))
    finished = {}
    while len(rb):
        finished.update((f.key, f.hypotheses) for f in rb.step())
    assert sorted(finished) == list(range(1, len(TEXTS)))
    for i, hyps in finished.items():
        assert hyps == fake.translate([TEXTS[i]], BEAM2 if i % 2 else GREEDY)[0]
    assert rb.cost(3, GREEDY) == 1 * (3 + 12)
    blank, beam, long = rb.admit(
        [
            BatchItem("blank", "  ", GREEDY),
            BatchItem("beam", "x", DecodingOptions(beam_size=99)),
            BatchItem("long", "x " * 65, GREEDY),
        ]
    )
    assert blank.hypotheses[0].text == "  " and len(rb) == 0
    assert isinstance(beam.error, InvalidOptionsError) and isinstance(long.error, InputTooLongError)
    with pytest.raises(InputTooLongError):
        fake.translate(["x " * 65], GREEDY)
    with pytest.raises(BundleError):
        FakeEngine(supports_inflight=False).running_batch()


# ---- request-level batching (fake engine) ---------------------------------------------------------------


def concurrent_single_text_requests(engine) -> tuple[list[str], list, object]:
    """Single-text requests sent at once: (their solo translations, the jobs, the metrics)."""
    solo = [r[0].text for r in (engine.translate([t], GREEDY)[0] for t in TEXTS)]
    scheduler, metrics = make_scheduler(engine, max_wait_ms=50)

    async def main():
        return await asyncio.gather(*(scheduler.run(job(engine, [t])) for t in TEXTS))

    try:
        jobs = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert [texts_of(j.results)[0] for j in jobs] == solo
    batches, segments = hist(metrics, "translator_batch_segments")
    assert segments == len(TEXTS)
    assert batches < len(TEXTS), "concurrent single-text requests should be batched together"
    return solo, jobs, metrics


def test_concurrent_requests_share_batches_and_match_solo(fake):
    fake.batches.clear()
    _, _, metrics = concurrent_single_text_requests(fake)
    batches, _ = hist(metrics, "translator_batch_segments")
    solo_batches = len(TEXTS)  # the solo translations above were recorded too
    recorded = fake.batches[solo_batches:]
    assert len(recorded) == batches and sum(len(t) for t, _ in recorded) == len(TEXTS)
    steps = {s.name: s.value for m in metrics.registry.collect() for s in m.samples}
    assert steps["translator_decode_steps_total"] == batches * GREEDY.max_length  # from last_stats


def test_batching_off_keeps_requests_apart(fake):
    scheduler, metrics = make_scheduler(fake, batching=False, max_wait_ms=50)
    requests = [TEXTS[i : i + 2] for i in range(0, 8, 2)]

    async def main():
        return await asyncio.gather(*(scheduler.run(job(fake, texts)) for texts in requests))

    try:
        jobs = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert scheduler.mode == "off" and not scheduler.batching
    assert [len(j.results) for j in jobs] == [2, 2, 2, 2]
    assert hist(metrics, "translator_batch_segments") == (4, 8)  # one batch per request, 2 segments each
    assert sorted(texts for texts, _ in fake.batches) == sorted(requests)


def test_different_options_are_not_mixed(fake):
    other = DecodingOptions(beam_size=2, num_hypotheses=2, max_length=12, length_penalty=0.6)
    scheduler, metrics = make_scheduler(fake, max_wait_ms=100)

    async def main():
        a = [scheduler.run(job(fake, [t])) for t in TEXTS[:4]]
        b = [scheduler.run(job(fake, [t], other)) for t in TEXTS[4:]]
        return await asyncio.gather(*a, *b)

    try:
        jobs = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert [len(j.results[0]) for j in jobs] == [1, 1, 1, 1, 2, 2, 2, 2]  # n-best sizes kept apart
    assert hist(metrics, "translator_batch_segments") == (2, 8)
    assert sorted((texts, o) for texts, o in fake.batches) == [(TEXTS[:4], GREEDY), (TEXTS[4:], other)]


def test_token_budget_splits_batches(fake):
    counts = fake.count_tokens(TEXTS)
    budget = max(counts) * 3  # at most 3 of the longest per batch (greedy: beam 1)
    assert sum(counts) > budget
    scheduler, metrics = make_scheduler(fake, max_batch_tokens=budget, max_wait_ms=50)

    async def main():
        return await scheduler.run(job(fake, TEXTS))

    try:
        result = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert texts_of(result.results) == texts_of(fake.translate(TEXTS, GREEDY))
    batches, segments = hist(metrics, "translator_batch_segments")
    assert segments == len(TEXTS) and batches >= 2
    for texts, _ in fake.batches[: int(batches)]:  # padded tokens x beam within the budget
        assert max(fake.count_tokens(texts)) * len(texts) <= budget


def test_select_groups_similar_lengths(fake):
    scheduler, _ = make_scheduler(fake, max_batch_tokens=40)
    try:
        lengths = [10, 2, 9, 3, 10, 1, 2]
        j = Job(["x"] * len(lengths), lengths, GREEDY)
        segs = [Segment(j, i, i, 0.0) for i in range(len(lengths))]
        select = scheduler.strategy.select
        batch = select(segs[0], segs)  # head has 10 tokens: budget 40 = 4 rows x 10
        assert sorted(s.tokens for s in batch) == [3, 9, 10, 10]
        batch = select(segs[1], segs)  # head has 2 tokens: the short ones go together
        assert sorted(s.tokens for s in batch)[:4] == [1, 2, 2, 3]
    finally:
        scheduler.stop(1)


def test_lone_request_waits_about_max_wait(fake):
    scheduler, _ = make_scheduler(fake, max_wait_ms=50)

    async def main():
        return await scheduler.run(job(fake, ["Open the file"]))

    try:
        j = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert 0.045 <= j.queue_s < 0.3


def cancel_and_deadline(engine, scheduler: Scheduler) -> tuple[float, Job]:
    """A long batch occupies the engine; a request queued behind it expires in the queue; the long one
    is cancelled mid-decode and a new request goes through quickly. Returns (time to that, its job)."""

    async def main():
        running = asyncio.ensure_future(scheduler.run(job(engine, LONG_TEXTS, LONG)))
        # Until the long batch has left the queue for the engine, rather than a fixed 0.3 s: the tiny
        # real engine decodes it in 0.65 s on a 2-core EPYC, which a faster CPU could finish before the
        # queued request's deadline below.
        await asyncio.sleep(0.05)
        for _ in range(100):
            if scheduler.queue_depth == 0:
                break
            await asyncio.sleep(0.01)
        assert scheduler.queue_depth == 0
        queued = job(engine, ["Print"], GREEDY, deadline=time.monotonic() + 0.15)
        queued_run = asyncio.ensure_future(scheduler.run(queued))
        await asyncio.sleep(0.05)
        assert scheduler.queue_depth == 1
        with pytest.raises(RequestCancelled) as e:
            await queued_run
        assert e.value.reason == "deadline"
        assert scheduler.queue_depth == 0  # left the queue although the engine is still busy
        t0 = time.monotonic()
        running.cancel()  # mid-decode: dropped at the next decoding step
        with pytest.raises(asyncio.CancelledError):
            await running
        # The engine is free again soon: a new request goes through quickly.
        j = await scheduler.run(job(engine, ["Print"]))
        return time.monotonic() - t0, j

    return asyncio.run(main())


def cancel_and_deadline_dropped(engine) -> None:
    """A cancelled long batch and an expired request leave the engine free for the next one."""
    scheduler, metrics = make_scheduler(engine, max_wait_ms=1, max_queue_segments=64)
    try:
        elapsed, j = cancel_and_deadline(engine, scheduler)
    finally:
        scheduler.stop(10)
    assert j.results[0][0].text
    assert elapsed < 2.0
    dropped = outcomes(metrics)
    assert dropped["dropped_deadline"] == 1
    assert dropped["dropped_cancelled"] == len(LONG_TEXTS)


def test_cancel_and_deadline_drop_rows_and_queue(slow_fake):
    cancel_and_deadline_dropped(slow_fake)
    long_batch = slow_fake.batches[0]
    assert long_batch == (LONG_TEXTS, LONG) and slow_fake.batches[1:] == [(["Print"], GREEDY)]


def test_queue_full(slow_fake):
    scheduler, _ = make_scheduler(slow_fake, max_wait_ms=1, max_queue_segments=32)

    async def main():
        running = asyncio.ensure_future(scheduler.run(job(slow_fake, LONG_TEXTS, LONG)))
        await asyncio.sleep(0.3)
        queued = asyncio.ensure_future(scheduler.run(job(slow_fake, LONG_TEXTS[:30])))
        await asyncio.sleep(0.05)
        assert scheduler.queue_depth == 30
        with pytest.raises(QueueFullError) as e:
            scheduler.submit(job(slow_fake, TEXTS[:3]))
        assert e.value.retry_after_ms > 0
        assert "retry" in str(e.value)
        extra = scheduler.submit(job(slow_fake, TEXTS[:2]))  # still fits
        assert scheduler.queue_depth == 32
        running.cancel()
        queued.cancel()
        await asyncio.gather(running, queued, return_exceptions=True)
        assert len((await extra).results) == 2

    try:
        asyncio.run(main())
    finally:
        scheduler.stop(10)


@pytest.mark.parametrize("mode", ["request", "inflight"])
def test_engine_failures_and_refusals(mode):
    """An engine that raises fails the batch's requests (EngineFailure, counted as an engine error); input
    it refuses (InputTooLongError, InvalidOptionsError) is InvalidInput; the scheduler serves on."""
    fake = FakeEngine(step_s=0.001, fail_on="Print")
    scheduler, metrics = make_scheduler(fake, mode=mode, max_wait_ms=1)
    too_long = "x " * (fake.max_source_tokens + 1)

    async def main():
        with pytest.raises(EngineFailure, match="fake engine failure"):
            await scheduler.run(job(fake, ["Print"]))
        with pytest.raises(InvalidInput, match="over the limit"):
            await scheduler.run(Job([too_long], [1], GREEDY))  # the caller's count was wrong
        with pytest.raises(InvalidInput, match="beam_size=99"):
            await scheduler.run(job(fake, ["Open the file"], DecodingOptions(beam_size=99)))
        return await scheduler.run(job(fake, TEXTS[:2]))

    try:
        ok = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert scheduler.mode == mode
    assert ok.results == [fake.translate([t], GREEDY)[0] for t in TEXTS[:2]]
    errors = {s.name: s.value for m in metrics.registry.collect() for s in m.samples}
    assert errors["translator_engine_errors_total"] == 1  # refusals are not engine errors
    assert outcomes(metrics)["failed"] == 3 and outcomes(metrics)["translated"] == 2


def test_a_deadline_is_due_at_its_instant():
    j = Job(["Print"], [1], GREEDY, deadline=100.0)
    assert not j.expired(99.999) and not j.dead(99.999)
    assert j.expired(100.0) and j.dead(100.0)
    assert not Job(["Print"], [1], GREEDY).expired(1e12)  # no deadline


def test_stop_is_bounded_and_a_worker_stuck_in_the_engine_does_not_hold_the_exit():
    """stop(timeout) returns with the worker still inside an engine call that does not end; the worker is
    a daemon thread, so the process can exit without it. Once the call ends, the worker finishes."""
    gated = GatedEngine(step_s=0)
    gated.gate.clear()
    before = set(threading.enumerate())
    scheduler, _ = make_scheduler(gated, max_wait_ms=1)
    (worker,) = [t for t in set(threading.enumerate()) - before if t.name == "engine-worker"]

    async def main():
        running = asyncio.ensure_future(scheduler.run(job(gated, ["Print"])))
        assert await asyncio.to_thread(gated.waiting.wait, 10)
        t0 = time.monotonic()
        await asyncio.to_thread(scheduler.stop, 0.05)
        assert time.monotonic() - t0 < 5 and worker.is_alive() and worker.daemon
        gated.gate.set()
        return await running

    try:
        done = asyncio.run(main())
    finally:
        gated.gate.set()
        scheduler.stop(10)
    assert not worker.is_alive() and done.results == [SOLO.translate(["Print"], GREEDY)[0]]


# ---- in-flight batching (fake engine) -------------------------------------------------------------------


def random_plan(seed: int = 7) -> list[tuple[float, list[str], DecodingOptions]]:
    """12 requests of 1-3 texts arriving over 0.4 s with mixed beams."""
    rng = random.Random(seed)
    return [
        (rng.uniform(0, 0.4), rng.sample(TEXTS, rng.randint(1, 3)), rng.choice([GREEDY, BEAM2, BEAM4]))
        for _ in range(12)
    ]


def run_plan(scheduler: Scheduler, engine, plan) -> list[Job]:
    async def one(delay, texts, options):
        await asyncio.sleep(delay)
        return await scheduler.run(job(engine, texts, options))

    async def main():
        return await asyncio.gather(*(one(*p) for p in plan))

    try:
        return asyncio.run(main())
    finally:
        scheduler.stop(10)


def check_plan(plan, jobs, solo, scheduler: Scheduler, metrics: Metrics) -> None:
    """Every result is the solo one; steps were shared and counted."""
    for (_, texts, options), j in zip(plan, jobs, strict=True):
        for text, hyps in zip(texts, j.results, strict=True):
            assert nbest(hyps) == nbest(solo[text, options])
    assert scheduler.steps > 0
    steps = {s.name: s.value for m in metrics.registry.collect() for s in m.samples}
    assert steps["translator_decode_steps_total"] == scheduler.steps
    rows_count, rows_sum = hist(metrics, "translator_batch_rows")
    assert rows_count == scheduler.steps and rows_sum / rows_count > 1  # requests shared steps
    assert hist(metrics, "translator_time_to_first_step_seconds")[0] == sum(len(t) for _, t, _ in plan)


def test_inflight_random_arrivals_mixed_beams_match_solo(slow_fake):
    plan = random_plan()
    solo = {(t, o): SOLO.translate([t], o)[0] for _, texts, o in plan for t in texts}
    scheduler, metrics = make_scheduler(slow_fake, mode="inflight")
    assert scheduler.mode == "inflight"
    jobs = run_plan(scheduler, slow_fake, plan)
    check_plan(plan, jobs, solo, scheduler, metrics)
    (rb,) = slow_fake.running
    assert len(rb.step_rows) == scheduler.steps and len(rb) == 0 and not rb.dropped
    assert any(len(beams) > 1 for beams in rb.step_beams), "mixed beams never shared a step"
    assert scheduler.strategy.load == (0, 0, 0) and not scheduler.strategy.running


def test_inflight_short_request_does_not_wait_for_long_one(slow_fake):
    # Seven long segments (the fake runs each to its 256-step budget): 56 of the default 64 rows, room to
    # join for the short one.
    scheduler, metrics = make_scheduler(slow_fake, mode="inflight")

    async def main():
        long = asyncio.ensure_future(scheduler.run(job(slow_fake, LONG_TEXTS[:7], LONG)))
        await asyncio.sleep(0.3)
        assert not long.done()
        t0 = time.monotonic()
        short = await scheduler.run(job(slow_fake, ["Print"], GREEDY))
        short_s = time.monotonic() - t0
        assert not long.done()  # joined the running batch and left it before the long one
        long.cancel()  # dropped at the next step boundary
        with pytest.raises(asyncio.CancelledError):
            await long
        return short, short_s

    try:
        short, short_s = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert short.results[0][0].text == SOLO.translate(["Print"], GREEDY)[0][0].text
    assert short_s < 2.0
    assert outcomes(metrics)["dropped_cancelled"] >= 1  # the rows still running when it was cancelled
    (rb,) = slow_fake.running
    assert len(rb.dropped) == 7 and len(rb) == 0  # every long segment left the batch through drop()


def test_inflight_deadline_in_queue_and_cancel_while_running(slow_fake):
    """Rows full: a waiting request expires in the queue; a running one cancelled leaves at the next step
    through drop(), and the batch serves on."""
    scheduler, metrics = make_scheduler(slow_fake, mode="inflight", max_running_rows=8)

    async def main():
        running = asyncio.ensure_future(scheduler.run(job(slow_fake, TEXTS[:1], LONG)))  # 8 rows: all
        await asyncio.sleep(0.2)
        waiting = job(slow_fake, ["Print"], GREEDY, deadline=time.monotonic() + 0.2)
        with pytest.raises(RequestCancelled) as e:
            await scheduler.run(waiting)
        assert e.value.reason == "deadline" and waiting.first_dispatch_at is None
        assert scheduler.queue_depth == 0 and not running.done()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        return await scheduler.run(job(slow_fake, ["Print"], GREEDY))

    try:
        j = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert j.results[0] == SOLO.translate(["Print"], GREEDY)[0]
    (rb,) = slow_fake.running
    assert len(rb.dropped) == 1 and max(rb.step_rows) == 8
    assert outcomes(metrics) == {"dropped_deadline": 1, "dropped_cancelled": 1, "translated": 1}


def test_inflight_budget_and_fairness_preempt_later_arrivals(fake):
    """A big segment B that does not fit next to a running A waits; a later small one C skips ahead;
    once B has waited max_admit_wait_steps steps (and A has left), C is preempted so that B runs, and C
    restarts later with the same result."""
    rb = fake.running_batch()
    a_opts = DecodingOptions(beam_size=4, num_hypotheses=1, max_length=6, length_penalty=0.6)
    c_opts = DecodingOptions(beam_size=1, num_hypotheses=1, max_length=40, length_penalty=0.6)
    a_text, b_text, c_text = TEXTS[1], TEXTS[5], TEXTS[0]
    a_cost = rb.cost(fake.count_tokens([a_text])[0], a_opts)
    c_cost = rb.cost(fake.count_tokens([c_text])[0], c_opts)
    big_cost = rb.cost(fake.count_tokens([b_text])[0], LONG)
    assert a_cost >= c_cost
    scheduler, _ = make_scheduler(
        fake, mode="inflight", max_running_tokens=big_cost + c_cost - 1, max_admit_wait_steps=2
    )

    async def main():
        # Queued at once, in this order: A runs, B does not fit next to it, C does and skips ahead.
        jobs = [job(fake, [a_text], a_opts), job(fake, [b_text], LONG), job(fake, [c_text], c_opts)]
        with scheduler.queue.cond:  # the worker sees all three together
            futures = [scheduler.submit(j) for j in jobs]
        return await asyncio.gather(*futures)

    try:
        a, b, c = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert scheduler.preempted == 1
    for j, text, opts in ((a, a_text, a_opts), (b, b_text, LONG), (c, c_text, c_opts)):
        want = SOLO.translate([text], opts)[0]
        assert [(h.tokens, h.score) for h in j.results[0]] == [(h.tokens, h.score) for h in want]
    assert c.finished_at > b.finished_at  # C waited for B once preempted
    served = fake.running[-1]
    assert len(served.dropped) == 1  # C, preempted through drop()


def test_inflight_skip_ahead_lasts_max_admit_wait_steps_from_when_the_head_arrived(fake):
    """B arrives while A has run for a while and does not fit next to it; C, behind B, fits and skips
    ahead at once: B's wait is counted from its own arrival, not from the start of the batch."""
    rb = fake.running_batch()
    a_opts = DecodingOptions(beam_size=4, num_hypotheses=1, max_length=120, length_penalty=0.6)
    c_opts = DecodingOptions(beam_size=1, num_hypotheses=1, max_length=3, length_penalty=0.6)
    a_text, b_text, c_text = TEXTS[1], TEXTS[5], TEXTS[4]
    a_cost = rb.cost(fake.count_tokens([a_text])[0], a_opts)
    c_cost = rb.cost(fake.count_tokens([c_text])[0], c_opts)
    scheduler, _ = make_scheduler(
        fake, mode="inflight", max_running_tokens=a_cost + c_cost, max_admit_wait_steps=8
    )

    async def main():
        a = scheduler.submit(job(fake, [a_text], a_opts))
        while len(fake.running[-1].step_rows) < 12:  # A alone for 12 steps
            await asyncio.sleep(0.002)
        with scheduler.queue.cond:  # B then C, seen together
            b, c = scheduler.submit(job(fake, [b_text], LONG)), scheduler.submit(job(fake, [c_text], c_opts))
        return await asyncio.gather(a, b, c)

    try:
        a, b, c = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert c.finished_at < a.finished_at < b.finished_at  # C ran beside A; B waited for A to leave
    assert scheduler.preempted == 0


def test_inflight_rows_cap_bounds_the_running_batch(fake):
    """max_running_rows counts beam rows: with 8 rows, at most two beam-4 segments (or one beam-4 and
    four greedy ones) decode together; everything still finishes with its solo result."""
    scheduler, metrics = make_scheduler(fake, mode="inflight", max_running_rows=8)
    plan = [(t, BEAM4) for t in TEXTS[:5]] + [(t, GREEDY) for t in TEXTS[3:]]

    async def main():
        return await asyncio.gather(*(scheduler.run(job(fake, [t], o)) for t, o in plan))

    try:
        jobs = asyncio.run(main())
    finally:
        scheduler.stop(10)
    for (text, options), j in zip(plan, jobs, strict=True):
        assert j.results[0][0].tokens == fake.translate([text], options)[0][0].tokens
    buckets = {
        s.labels["le"]: s.value
        for m in metrics.registry.collect()
        for s in m.samples
        if s.name == "translator_batch_rows_bucket"
    }
    steps = scheduler.steps
    assert steps > 0 and buckets["8.0"] == steps  # no step ran more than 8 rows
    assert scheduler.strategy.load == (0, 0, 0)
    (rb,) = fake.running
    assert max(rb.step_rows) == 8 and len(rb.step_rows) == steps


def test_inflight_falls_back_without_per_row_positions(caplog):
    old = FakeEngine(supports_inflight=False)
    scheduler, _ = make_scheduler(old, mode="inflight")
    try:
        assert scheduler.mode == "request"
    finally:
        scheduler.stop(5)
    assert "lacks per-row positions" in caplog.text and not old.running
    with pytest.raises(ValueError, match="batching mode"):
        Scheduler(old, mode="sometimes")


# ---- the real engine (tiny exported bundle) --------------------------------------------------------------


def test_real_concurrent_requests_share_batches_and_match_solo(engine):
    concurrent_single_text_requests(engine)


def test_real_cancel_and_deadline_drop_rows_and_queue(engine):
    """The real engine's cancelled callback drops the long batch's rows mid-decode."""
    cancel_and_deadline_dropped(engine)


@pytest.mark.parametrize("storage", ["host", "device"])
def test_real_inflight_random_arrivals_mixed_beams_match_solo(engine, tiny_bundle, storage):
    """Bit-identical to solo through the real RunningBatch; also with K/V as OrtValues changed by the
    kv_rows graph (IOBinding, the CUDA path) on the CPU."""
    from server.engine import Engine

    plan = random_plan()
    solo = {(t, o): engine.translate([t], o)[0] for _, texts, o in plan for t in texts}
    served_by = engine if storage == "host" else Engine(tiny_bundle, intra_op_threads=1, io_binding=True)
    scheduler, metrics = make_scheduler(served_by, mode="inflight")
    assert scheduler.mode == "inflight" and served_by.generator.inflight_on_device == (storage == "device")
    jobs = run_plan(scheduler, engine, plan)
    check_plan(plan, jobs, solo, scheduler, metrics)


def test_real_inflight_falls_back_without_per_row_positions(engine, monkeypatch):
    monkeypatch.setattr(engine.generator, "row_positions", False)
    scheduler, _ = make_scheduler(engine, mode="inflight")
    try:
        assert scheduler.mode == "request"
    finally:
        scheduler.stop(5)


def test_real_inflight_warns_when_the_cache_would_cross_the_bus(tiny_bundle, tmp_path, caplog):
    """Device sessions (IOBinding) with a bundle exported before the kv_rows graph: in-flight batching
    works from host memory, and the operator is told to re-export."""
    from server.engine import Engine

    bundle = copy_without_kv_rows(tiny_bundle, tmp_path / "bundle")
    for path, copies in ((tiny_bundle, False), (bundle, True)):
        engine = Engine(path, intra_op_threads=1, io_binding=True)
        assert engine.inflight_copies_cache is copies
        caplog.clear()
        scheduler, _ = make_scheduler(engine, mode="inflight")
        scheduler.stop(5)
        assert ("no kv_rows/kv_step graphs" in caplog.text) is copies


@pytest.mark.parametrize("reason", ["deadline", "cancelled"])
def test_inflight_running_rows_leave_at_the_next_step(slow_fake, reason):
    """A running request whose deadline passes (or that is cancelled) leaves the running batch at the next
    step boundary, through drop(): its rows stop decoding, its batch mate runs on to its solo result."""
    scheduler, metrics = make_scheduler(slow_fake, mode="inflight")
    mate_text, mate_opts = TEXTS[0], DecodingOptions(beam_size=1, num_hypotheses=1, max_length=60)

    async def main():
        deadline = time.monotonic() + 0.3 if reason == "deadline" else None
        doomed = job(slow_fake, TEXTS[1:3], LONG, deadline=deadline)
        mate = asyncio.ensure_future(scheduler.run(job(slow_fake, [mate_text], mate_opts)))
        run = asyncio.ensure_future(scheduler.run(doomed))
        await asyncio.sleep(0.15)  # both running
        (rb,) = slow_fake.running
        assert len(rb) == 3
        if reason == "cancelled":
            await asyncio.sleep(0.15)
            run.cancel()
        with pytest.raises((RequestCancelled, asyncio.CancelledError)):
            await run
        steps_then = len(rb.step_rows)
        for _ in range(100):  # the rows leave at the next step boundary
            if len(rb) == 1:
                break
            await asyncio.sleep(0.005)
        assert len(rb) == 1 and sorted(rb.dropped) == sorted(seg for seg in range(3) if seg != 0)
        assert len(rb.step_rows) - steps_then <= 2
        return await mate

    try:
        mate = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert mate.results[0] == SOLO.translate([mate_text], mate_opts)[0]
    assert outcomes(metrics) == {"dropped_" + reason: 2, "translated": 1}


def test_select_stops_at_max_batch_segments(fake):
    scheduler, _ = make_scheduler(fake, max_batch_segments=2, max_batch_tokens=10_000)
    try:
        j = Job(["x"] * 5, [1, 2, 3, 4, 5], GREEDY)
        segs = [Segment(j, i, i, 0.0) for i in range(5)]
        assert [s.tokens for s in scheduler.strategy.select(segs[4], segs)] == [4, 5]  # the longest as head
        assert [s.tokens for s in scheduler.strategy.select(segs[2], segs)] == [2, 3]
    finally:
        scheduler.stop(1)


def test_select_takes_the_shorter_side_when_the_longer_would_overflow(fake):
    """Head 5 tokens, budget 11 (greedy: padded tokens x rows): the 6-token neighbour (earlier, so it wins
    the tie) would make 12, the 4-token one fits (10); then nothing more fits."""
    scheduler, _ = make_scheduler(fake, max_batch_tokens=11)
    try:
        j = Job(["x"] * 3, [4, 5, 6], GREEDY)
        four, head, six = Segment(j, 0, 3, 0.0), Segment(j, 1, 2, 0.0), Segment(j, 2, 1, 0.0)
        batch = scheduler.strategy.select(head, [four, head, six])
        assert [(s.tokens, s.seq) for s in batch] == [(5, 2), (4, 3)]  # arrival order
    finally:
        scheduler.stop(1)


def test_inflight_measures_throughput_for_retry_hints(fake, caplog):
    """In-flight mode folds the segments finished per second (over windows of about a second) into the
    queue's rate, behind the retry hints of a full queue."""
    scheduler, _ = make_scheduler(fake, mode="inflight")
    opts = DecodingOptions(beam_size=1, num_hypotheses=1, max_length=20, length_penalty=0.6)

    async def main():
        t0, n = time.monotonic(), 0
        while time.monotonic() - t0 < 1.3:  # one window of a second at least
            await asyncio.gather(*(scheduler.run(job(fake, [t], opts)) for t in TEXTS[:4]))
            n += 4
        return n / (time.monotonic() - t0)

    try:
        assert scheduler.queue._segments_per_s == 0
        with caplog.at_level(logging.INFO, logger="server.scheduler"):
            rate = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert 0.3 * rate < scheduler.queue._segments_per_s < 3 * rate
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # no "scheduler error" on the way
