"""Cost of one decoder step of a bundle, by batch rows and cache capacity: the cost model behind the
batching modes (docs/service.md, "Batching modes").

    python -m bench.step_cost --bundle bundles/en-es-small --threads 1 [--json out.json]
        [--device cuda --cache host,device]

Runs the bundle's decoder-step graph through the engine's own call paths on synthetic inputs (rows at
position 5 of a cache of `capacity` slots, a source of 32 positions) and reports the best of --reps
timings of --iters steps each, in ms, plus a least-squares fit `step_ms = fixed + per_row x rows` per
capacity. Batching (request-level or in-flight) only shares the fixed part between rows: in-flight
batching runs fewer steps for the same sentences (nobody waits for the longest one), not fewer rows.

--cache says where the K/V live between steps: `host` (numpy arrays, the CPU path: on CUDA, ONNX Runtime
copies the cache to the device and the new K/V back at every step) or `device` (OrtValues bound with
IOBinding, the CUDA path of both batching modes; on the CPU provider it measures the binding overhead).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from server.engine import Engine
from server.engine.cache import BoundCache, NumpyCache


def step_ms(
    engine: Engine, rows: int, capacity: int, source: int, iters: int, reps: int, cache: str = "host"
) -> float:
    g = engine.generator
    host = NumpyCache(g.graphs)
    bias, cross = host.encode(np.full((rows, source), 5, dtype=np.int64))
    rng = np.random.default_rng(0)
    past: list[Any] = [
        rng.standard_normal((rows, g.n_heads, capacity, g.head_dim)).astype(g.kv_dtype) for _ in g.past_names
    ]
    feed = {
        "input_ids": np.full((rows, 1), 7, dtype=np.int64),
        "position": np.full(rows, 5, dtype=np.int64),
        "src_bias": bias,
        "beam_scores": np.zeros((rows, 1), dtype=np.float32),
        "num_candidates": np.array([1], dtype=np.int64),
    }
    step = host.step
    if cache == "device":
        bound = g.cache if isinstance(g.cache, BoundCache) else BoundCache(g.graphs, "cpu", 0)
        cross = [ort.OrtValue.ortvalue_from_numpy(x, bound.dev, bound.dev_id) for x in cross]
        past = [ort.OrtValue.ortvalue_from_numpy(x, bound.dev, bound.dev_id) for x in past]
        step = bound.step
    for _ in range(3):
        step(dict(feed), cross, past)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            step(dict(feed), cross, past)
        best = min(best, (time.perf_counter() - t0) / iters * 1000)
    return best


def engine_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """Arguments of the engine-level benchmarks: which bundle, variant, device and thread count."""
    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=raw)
    p.add_argument("--bundle", type=Path, default=Path("bundles/en-es-small"))
    p.add_argument("--variant", default="fp32")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (as the server's --device)")
    p.add_argument("--threads", type=int, default=1)
    return p


def main(argv: list[str] | None = None) -> int:
    p = engine_parser("python -m bench.step_cost", __doc__)
    p.add_argument("--cache", default="host", help="where K/V live between steps: host, device or both")
    p.add_argument("--rows", default="1,2,4,8,16,32,64")
    p.add_argument("--capacities", default="16,64,128")
    p.add_argument("--source", type=int, default=32, help="source positions")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    rows = [int(x) for x in args.rows.split(",")]
    caps = [int(x) for x in args.capacities.split(",")]
    placements = ["host", "device"] if args.cache == "both" else args.cache.split(",")
    if set(placements) - {"host", "device"}:
        p.error(f"--cache: host, device or both, got {args.cache!r}")
    engine = Engine(args.bundle, variant=args.variant, device=args.device, intra_op_threads=args.threads)
    report: dict[str, Any] = {
        "bundle": str(args.bundle),
        "variant": args.variant,
        "threads": args.threads,
        "providers": engine.providers,
        "source_positions": args.source,
        "cache": {},
    }
    for where in placements:
        table: dict[int, dict[int, float]] = {}
        for cap in caps:
            table[cap] = {}
            for r in rows:
                table[cap][r] = step_ms(engine, r, cap, args.source, args.iters, args.reps, where)
                print(
                    f"{where} cache, capacity {cap:4d}, rows {r:3d}: {table[cap][r]:7.3f} ms",
                    file=sys.stderr,
                    flush=True,
                )
        print(f"\nK/V on the {where}, ms per decoder step:\n")
        print("| rows | " + " | ".join(f"capacity {c}" for c in caps) + " |")
        print("|---:|" + "---:|" * len(caps))
        for r in rows:
            print(f"| {r} | " + " | ".join(f"{table[c][r]:.2f}" for c in caps) + " |")
        fits = {}
        for cap in caps:
            ms = np.array([table[cap][r] for r in rows])
            per_row, fixed = np.polyfit(np.array(rows, dtype=float), ms, 1)
            fits[cap] = {"fixed_ms": float(fixed), "per_row_ms": float(per_row)}
        report["cache"][where] = {
            "ms_per_step": {str(c): {str(r): v for r, v in t.items()} for c, t in table.items()},
            "fit": {str(c): f for c, f in fits.items()},
        }
        terms = [f"capacity {c}: {f['fixed_ms']:.2f} + {f['per_row_ms']:.3f} x rows" for c, f in fits.items()]
        print(
            f"\nSummary ({where} cache): step_ms = fixed + per_row x rows, "
            + "; ".join(terms)
            + f" ({args.variant}, {args.threads} thread(s), providers {engine.providers[0]})"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
