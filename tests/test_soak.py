"""bench.soak's measurements (the soak itself runs for minutes: make soak)."""

from __future__ import annotations

import os

from bench.soak import rss_mb, slope_per_hour


def test_rss_trend_is_a_least_squares_slope_per_hour():
    assert slope_per_hour([(0, 100.0), (60, 100.0), (120, 100.0)]) == 0.0
    assert abs(slope_per_hour([(0, 100.0), (1800, 101.0), (3600, 102.0)]) - 2.0) < 1e-9
    assert slope_per_hour([(0, 5.0)]) == 0.0


def test_rss_of_this_process_is_read_from_proc():
    assert 1.0 < rss_mb(os.getpid()) < 100_000
