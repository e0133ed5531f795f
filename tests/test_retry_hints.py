"""Retry hints of a full queue: the backlog over the engine's recent throughput, bounded, smooth, and not
stuck on an old load's rate."""

from __future__ import annotations

import time

from server.scheduler.queue import SegmentQueue


def queue_with(n: int) -> SegmentQueue:
    q = SegmentQueue(None, 1000)
    q.segments = [object()] * n  # only the count matters here
    return q


def test_cold_hint_is_bounded_by_the_backlog():
    assert queue_with(1).retry_after_ms() == SegmentQueue.RETRY_MIN_MS
    assert queue_with(40).retry_after_ms() == 40 * SegmentQueue.RETRY_COLD_MS
    assert queue_with(100_000).retry_after_ms() == SegmentQueue.RETRY_MAX_MS


def test_hint_follows_the_backlog_over_the_measured_rate_and_moves_smoothly(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    q = queue_with(200)
    q.note_rate(100.0)  # 100 segments/s: 200 queued take 2 s
    assert q.retry_after_ms() == 2000
    q.note_rate(2.0)  # one slow batch a moment later (beam 8): the rate moves, but not all the way
    clock[0] += 0.1
    slow = q.retry_after_ms()
    assert 2000 < slow < 10_000
    clock[0] += 0.1
    assert abs(q.retry_after_ms() - slow) < 0.2 * slow  # smooth: no 1,000 <-> 30,000 swings
    for _ in range(30):  # seconds later at 100/s again: the old slow rate has faded
        clock[0] += 1.0
        q.note_rate(100.0)
        q.retry_after_ms()
    assert abs(q.retry_after_ms() - 2000) < 100
