"""Batching scheduler with the real engine on a tiny exported bundle (no gRPC)."""

from __future__ import annotations

import asyncio
import time

import pytest

from server.engine import DecodingOptions, Engine
from server.metrics import Metrics
from server.scheduler import Job, QueueFullError, RequestCancelled, Scheduler
from tests.conftest import copy_without_kv_rows

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
# The tiny random model decodes to max_length: 32 texts x beam 8 x 256 steps keep the engine busy for
# seconds, long enough to cancel, expire or queue behind.
LONG = DecodingOptions(beam_size=8, num_hypotheses=1, max_length=256, length_penalty=0.6)
LONG_TEXTS = TEXTS * 4


@pytest.fixture(scope="module")
def engine(tiny_bundle) -> Engine:
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


def texts_of(results) -> list[str]:
    return [hyps[0].text for hyps in results]


def test_concurrent_requests_share_batches_and_match_solo(engine):
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


def test_batching_off_keeps_requests_apart(engine):
    scheduler, metrics = make_scheduler(engine, batching=False, max_wait_ms=50)

    async def main():
        return await asyncio.gather(*(scheduler.run(job(engine, TEXTS[i : i + 2])) for i in range(0, 8, 2)))

    try:
        jobs = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert [len(j.results) for j in jobs] == [2, 2, 2, 2]
    assert hist(metrics, "translator_batch_segments") == (4, 8)  # one batch per request, 2 segments each


def test_different_options_are_not_mixed(engine):
    other = DecodingOptions(beam_size=2, num_hypotheses=2, max_length=12, length_penalty=0.6)
    scheduler, metrics = make_scheduler(engine, max_wait_ms=100)

    async def main():
        a = [scheduler.run(job(engine, [t])) for t in TEXTS[:4]]
        b = [scheduler.run(job(engine, [t], other)) for t in TEXTS[4:]]
        return await asyncio.gather(*a, *b)

    try:
        jobs = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert [len(j.results[0]) for j in jobs] == [1, 1, 1, 1, 2, 2, 2, 2]  # n-best sizes kept apart
    assert hist(metrics, "translator_batch_segments") == (2, 8)


def test_token_budget_splits_batches(engine):
    counts = engine.count_tokens(TEXTS)
    budget = max(counts) * 3  # at most 3 of the longest per batch (greedy: beam 1)
    assert sum(counts) > budget
    scheduler, metrics = make_scheduler(engine, max_batch_tokens=budget, max_wait_ms=50)

    async def main():
        return await scheduler.run(job(engine, TEXTS))

    try:
        result = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert texts_of(result.results) == texts_of(engine.translate(TEXTS, GREEDY))
    batches, segments = hist(metrics, "translator_batch_segments")
    assert segments == len(TEXTS) and batches >= 2


def test_select_groups_similar_lengths(engine):
    scheduler, _ = make_scheduler(engine, max_batch_tokens=40)
    try:
        lengths = [10, 2, 9, 3, 10, 1, 2]
        j = Job(["x"] * len(lengths), lengths, GREEDY)
        from server.scheduler import _Segment

        segs = [_Segment(j, i, i, 0.0) for i in range(len(lengths))]
        batch = scheduler._select(segs[0], segs)  # head has 10 tokens: budget 40 = 4 rows x 10
        assert sorted(s.tokens for s in batch) == [3, 9, 10, 10]
        batch = scheduler._select(segs[1], segs)  # head has 2 tokens: the short ones go together
        assert sorted(s.tokens for s in batch)[:4] == [1, 2, 2, 3]
    finally:
        scheduler.stop(1)


def test_lone_request_waits_about_max_wait(engine):
    scheduler, _ = make_scheduler(engine, max_wait_ms=50)

    async def main():
        return await scheduler.run(job(engine, ["Open the file"]))

    try:
        j = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert 0.045 <= j.queue_s < 0.3


def test_cancel_and_deadline_drop_rows_and_queue(engine):
    scheduler, metrics = make_scheduler(engine, max_wait_ms=1, max_queue_segments=64)

    async def main():
        # A long batch occupies the engine; a second request waits in the queue behind it.
        running = asyncio.ensure_future(scheduler.run(job(engine, LONG_TEXTS, LONG)))
        await asyncio.sleep(0.3)
        assert scheduler.queue_depth == 0
        queued = job(engine, ["Print"], GREEDY, deadline=time.monotonic() + 0.2)
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

    try:
        elapsed, j = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert j.results[0][0].text
    assert elapsed < 2.0
    samples = {
        (s.name, s.labels.get("outcome")): s.value
        for m in metrics.registry.collect()
        if m.name == "translator_segments"
        for s in m.samples
    }
    assert samples[("translator_segments_total", "dropped_deadline")] == 1
    assert samples[("translator_segments_total", "dropped_cancelled")] == len(LONG_TEXTS)


def test_queue_full(engine):
    scheduler, _ = make_scheduler(engine, max_wait_ms=1, max_queue_segments=32)

    async def main():
        running = asyncio.ensure_future(scheduler.run(job(engine, LONG_TEXTS, LONG)))
        await asyncio.sleep(0.3)
        queued = asyncio.ensure_future(scheduler.run(job(engine, LONG_TEXTS[:30])))
        await asyncio.sleep(0.05)
        assert scheduler.queue_depth == 30
        with pytest.raises(QueueFullError) as e:
            scheduler.submit(job(engine, TEXTS[:3]))
        assert e.value.retry_after_ms > 0
        assert "retry" in str(e.value)
        extra = scheduler.submit(job(engine, TEXTS[:2]))  # still fits
        assert scheduler.queue_depth == 32
        running.cancel()
        queued.cancel()
        await asyncio.gather(running, queued, return_exceptions=True)
        assert len((await extra).results) == 2

    try:
        asyncio.run(main())
    finally:
        scheduler.stop(10)


# ---- in-flight mode -------------------------------------------------------------------------------

BEAM2 = DecodingOptions(beam_size=2, num_hypotheses=2, max_length=10, length_penalty=0.6)
BEAM4 = DecodingOptions(beam_size=4, num_hypotheses=1, max_length=16, length_penalty=1.0)


@pytest.mark.parametrize("storage", ["host", "device"])
def test_inflight_random_arrivals_mixed_beams_match_solo(engine, tiny_bundle, storage):
    """Also with K/V as OrtValues changed by the kv_rows graph (IOBinding, the CUDA path) on the CPU."""
    import random

    rng = random.Random(7)
    plan = [(rng.uniform(0, 0.4), rng.sample(TEXTS, rng.randint(1, 3)), rng.choice([GREEDY, BEAM2, BEAM4]))]
    plan += [
        (rng.uniform(0, 0.4), rng.sample(TEXTS, rng.randint(1, 3)), rng.choice([GREEDY, BEAM2, BEAM4]))
        for _ in range(11)
    ]
    solo = {(t, o): engine.translate([t], o)[0] for _, texts, o in plan for t in texts}
    served_by = engine if storage == "host" else Engine(tiny_bundle, intra_op_threads=1, io_binding=True)
    scheduler, metrics = make_scheduler(served_by, mode="inflight")
    assert scheduler.mode == "inflight" and served_by.generator.inflight_on_device == (storage == "device")

    async def one(delay, texts, options):
        await asyncio.sleep(delay)
        return await scheduler.run(job(engine, texts, options))

    async def main():
        return await asyncio.gather(*(one(*p) for p in plan))

    try:
        jobs = asyncio.run(main())
    finally:
        scheduler.stop(10)
    for (_, texts, options), j in zip(plan, jobs, strict=True):
        for text, hyps in zip(texts, j.results, strict=True):
            want = solo[text, options]
            assert [(h.text, h.tokens, h.score) for h in hyps] == [(h.text, h.tokens, h.score) for h in want]
    assert scheduler.steps > 0
    steps = {s.name: s.value for m in metrics.registry.collect() for s in m.samples}
    assert steps["translator_decode_steps_total"] == scheduler.steps
    rows_count, rows_sum = hist(metrics, "translator_batch_rows")
    assert rows_count == scheduler.steps and rows_sum / rows_count > 1  # requests shared steps
    assert hist(metrics, "translator_time_to_first_step_seconds")[0] == sum(len(t) for _, t, _ in plan)


def test_inflight_short_request_does_not_wait_for_long_one(engine):
    scheduler, metrics = make_scheduler(engine, mode="inflight")

    async def main():
        long = asyncio.ensure_future(scheduler.run(job(engine, LONG_TEXTS[:8], LONG)))
        await asyncio.sleep(0.3)
        assert not long.done()
        t0 = time.monotonic()
        short = await scheduler.run(job(engine, ["Print"], GREEDY))
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
    assert short.results[0][0].text == engine.translate(["Print"], GREEDY)[0][0].text
    assert short_s < 2.0
    dropped = {
        s.labels["outcome"]: s.value
        for m in metrics.registry.collect()
        for s in m.samples
        if s.name == "translator_segments_total"
    }
    assert dropped["dropped_cancelled"] >= 1  # the rows still running when it was cancelled


def test_inflight_budget_and_fairness_preempt_later_arrivals(engine):
    """A big segment B that does not fit next to a running A waits; a later small one C skips ahead;
    once B has waited max_admit_wait_steps steps (and A has left), C is preempted so that B runs, and C
    restarts later with the same result."""
    rb = engine.running_batch()
    a_opts = DecodingOptions(beam_size=4, num_hypotheses=1, max_length=6, length_penalty=0.6)
    c_opts = DecodingOptions(beam_size=1, num_hypotheses=1, max_length=40, length_penalty=0.6)
    a_text, b_text, c_text = TEXTS[1], TEXTS[5], TEXTS[0]
    a_cost = rb.cost(engine.count_tokens([a_text])[0], a_opts)
    c_cost = rb.cost(engine.count_tokens([c_text])[0], c_opts)
    big_cost = rb.cost(engine.count_tokens([b_text])[0], LONG)
    assert a_cost >= c_cost
    scheduler, _ = make_scheduler(
        engine, mode="inflight", max_running_tokens=big_cost + c_cost - 1, max_admit_wait_steps=2
    )

    async def main():
        # Queued at once, in this order: A runs, B does not fit next to it, C does and skips ahead.
        jobs = [job(engine, [a_text], a_opts), job(engine, [b_text], LONG), job(engine, [c_text], c_opts)]
        with scheduler._cond:  # the worker sees all three together
            futures = [scheduler.submit(j) for j in jobs]
        return await asyncio.gather(*futures)

    try:
        a, b, c = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert scheduler.preempted == 1
    for j, text, opts in ((a, a_text, a_opts), (b, b_text, LONG), (c, c_text, c_opts)):
        want = engine.translate([text], opts)[0]
        assert [(h.tokens, h.score) for h in j.results[0]] == [(h.tokens, h.score) for h in want]
    assert c.finished_at > b.finished_at  # C waited for B once preempted


def test_inflight_rows_cap_bounds_the_running_batch(engine):
    """max_running_rows counts beam rows: with 8 rows, at most two beam-4 segments (or one beam-4 and
    four greedy ones) decode together; everything still finishes with its solo result."""
    scheduler, metrics = make_scheduler(engine, mode="inflight", max_running_rows=8)
    plan = [(t, BEAM4) for t in TEXTS[:5]] + [(t, GREEDY) for t in TEXTS[3:]]

    async def main():
        return await asyncio.gather(*(scheduler.run(job(engine, [t], o)) for t, o in plan))

    try:
        jobs = asyncio.run(main())
    finally:
        scheduler.stop(10)
    for (text, options), j in zip(plan, jobs, strict=True):
        assert j.results[0][0].tokens == engine.translate([text], options)[0][0].tokens
    buckets = {
        s.labels["le"]: s.value
        for m in metrics.registry.collect()
        for s in m.samples
        if s.name == "translator_batch_rows_bucket"
    }
    steps = scheduler.steps
    assert steps > 0 and buckets["8.0"] == steps  # no step ran more than 8 rows
    assert scheduler._load == (0, 0, 0)


def test_inflight_falls_back_without_per_row_positions(engine, monkeypatch):
    monkeypatch.setattr(engine.generator, "row_positions", False)
    scheduler, _ = make_scheduler(engine, mode="inflight")
    try:
        assert scheduler.mode == "request"
    finally:
        scheduler.stop(5)
    with pytest.raises(ValueError, match="batching mode"):
        Scheduler(engine, mode="sometimes")


def test_inflight_warns_when_the_cache_would_cross_the_bus(tiny_bundle, tmp_path, caplog):
    """Device sessions (IOBinding) with a bundle exported before the kv_rows graph: in-flight batching
    works from host memory, and the operator is told to re-export."""
    bundle = copy_without_kv_rows(tiny_bundle, tmp_path / "bundle")
    for path, copies in ((tiny_bundle, False), (bundle, True)):
        engine = Engine(path, intra_op_threads=1, io_binding=True)
        assert engine.inflight_copies_cache is copies
        caplog.clear()
        scheduler, _ = make_scheduler(engine, mode="inflight")
        scheduler.stop(5)
        assert ("no kv_rows/kv_step graphs" in caplog.text) is copies
