"""Cost of one decoder step of a bundle, by batch rows and cache capacity: the cost model behind the
batching modes (docs/service.md, "Batching modes").

    python -m export.step_cost --bundle bundles/en-es-small --threads 1 [--json out.json]

Runs the bundle's decoder-step graph through the engine's own call path on synthetic inputs (rows at
position 5 of a cache of `capacity` slots, a source of 32 positions) and reports the best of --reps
timings of --iters steps each, in ms, plus a least-squares fit `step_ms = fixed + per_row x rows` per
capacity. Batching (request-level or in-flight) only shares the fixed part between rows: in-flight
batching runs fewer steps for the same sentences (nobody waits for the longest one), not fewer rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from server.engine import Engine


def step_ms(engine: Engine, rows: int, capacity: int, source: int, iters: int, reps: int) -> float:
    g = engine.generator
    bias, cross = g.cache.encode(np.full((rows, source), 5, dtype=np.int64))
    rng = np.random.default_rng(0)
    past = [
        rng.standard_normal((rows, g.n_heads, capacity, g.head_dim)).astype(g.kv_dtype) for _ in g.past_names
    ]
    feed = {
        "input_ids": np.full((rows, 1), 7, dtype=np.int64),
        "position": np.full(rows, 5, dtype=np.int64),
        "src_bias": bias,
        "beam_scores": np.zeros((rows, 1), dtype=np.float32),
        "num_candidates": np.array([1], dtype=np.int64),
    }
    for _ in range(3):
        g.cache.step(dict(feed), cross, past)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            g.cache.step(dict(feed), cross, past)
        best = min(best, (time.perf_counter() - t0) / iters * 1000)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m export.step_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--bundle", type=Path, default=Path("bundles/en-es-small"))
    p.add_argument("--variant", default="fp32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", default="1,2,4,8,16,32,64")
    p.add_argument("--capacities", default="16,64,128")
    p.add_argument("--source", type=int, default=32, help="source positions")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    rows = [int(x) for x in args.rows.split(",")]
    caps = [int(x) for x in args.capacities.split(",")]
    engine = Engine(args.bundle, variant=args.variant, device="cpu", intra_op_threads=args.threads)
    table: dict[int, dict[int, float]] = {}
    for cap in caps:
        table[cap] = {}
        for r in rows:
            table[cap][r] = step_ms(engine, r, cap, args.source, args.iters, args.reps)
            print(f"capacity {cap:4d}  rows {r:3d}: {table[cap][r]:7.3f} ms", file=sys.stderr, flush=True)
    print("| rows | " + " | ".join(f"capacity {c}" for c in caps) + " |")
    print("|---:|" + "---:|" * len(caps))
    for r in rows:
        print(f"| {r} | " + " | ".join(f"{table[c][r]:.2f}" for c in caps) + " |")
    fits = {}
    for cap in caps:
        per_row, fixed = np.polyfit(np.array(rows, dtype=float), np.array([table[cap][r] for r in rows]), 1)
        fits[cap] = {"fixed_ms": float(fixed), "per_row_ms": float(per_row)}
    terms = [f"capacity {c}: {f['fixed_ms']:.2f} + {f['per_row_ms']:.3f} x rows" for c, f in fits.items()]
    print(
        "Summary: step_ms = fixed + per_row x rows, "
        + "; ".join(terms)
        + f" ({args.variant}, {args.threads} thread(s), providers {engine.providers[0]})"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "bundle": str(args.bundle),
                    "variant": args.variant,
                    "threads": args.threads,
                    "source_positions": args.source,
                    "ms_per_step": {str(c): {str(r): v for r, v in t.items()} for c, t in table.items()},
                    "fit": {str(c): f for c, f in fits.items()},
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
