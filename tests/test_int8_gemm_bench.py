"""bench.int8_gemm: the int8 formulations it compares compute the product, and the bundle's row-int8 one
is batch-invariant."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench import int8_gemm


def test_every_candidate_computes_the_product_and_row_int8_is_batch_invariant():
    w = (np.random.default_rng(1).standard_normal((64, 48)) * 0.05).astype(np.float32)
    results = int8_gemm.measure(w, rows=[1, 5], block=32, reps=1)
    assert {r["candidate"] for r in results} == {"fp32", "row-int8", "nbits8", "nbits4"}
    limits = {"fp32": 1e-5, "row-int8": 0.05, "nbits8": 0.05, "nbits4": 0.3}  # 8 bits: ~1-2%, 4 bits: ~10%
    for r in results:
        assert r["us"] > 0 and r["rel_error"] < limits[r["candidate"]], r
    assert all(r["batch_invariant"] for r in results if r["candidate"] in ("fp32", "row-int8"))


def test_the_command_prints_a_table_per_shape_and_rows(tmp_path: Path, capsys):
    out = tmp_path / "gemm.json"
    argv = ["--shapes", "64x32,80x16", "--rows", "1,3", "--reps", "1", "--json", str(out)]
    assert int8_gemm.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len([line for line in lines if line.startswith(("| 64x32 |", "| 80x16 |"))]) == 4
    report = json.loads(out.read_text())
    # 64 rows of K split into blocks of 32: four candidates; 80 does not: no MatMulNBits.
    assert report["cpu"]["model"] and len(report["results"]) == 4 * 2 + 2 * 2
