"""Engine throughput at saturation: request-level batches against the in-flight batch, same sentences,
one process (no gRPC, no scheduler, no arrivals): the ceiling each batching mode can reach, and why.

    python -m bench.saturation --bundle bundles/en-es-small --threads 1 [--device cuda]
        [--io-binding] [--beams 1,4] [--sentences 300] [--batch 32] [--rows 64] [--reps 3] [--json out.json]

Modes, every one translating all the sentences (text to text) with the bundle's decoding defaults:

* request-arrival: `Engine.translate` on consecutive batches of --batch sentences, in arrival order;
* request-sorted: the same on the sentences sorted by length (what a long queue lets request-level
  batching pick: similar lengths, little padding);
* inflight: one running batch (`Engine.running_batch`) refilled before every step up to --rows decoder
  rows, in arrival order (on CUDA with K/V on the device when the bundle has the kv_rows graph).

Reported per mode: sentences/s (best of --reps, modes interleaved), decoder steps, row-steps (rows
summed over steps), wall ms per row-step, and host ms per step and per sentence: the time outside ONNX
Runtime's runs (tokenizing, candidate selection, bookkeeping, numpy copies of the cache), which a GPU
does not shorten. Per step, in-flight batching looks costlier (it runs fewer, fuller steps); per
sentence, the host work of the modes compares directly. Finished sentences leave the batch in every
mode, so all modes run the same row-steps; a batching mode can only change the cost of a row-step
(padding, the fixed cost of a step shared by more or fewer rows) and the work around the steps.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import onnxruntime as ort

from bench.step_cost import engine_parser
from runtime.splits import source_sentences
from server.engine import BatchItem, DecodingOptions, Engine

MODES = ("request-arrival", "request-sorted", "inflight")
SAMPLE = Path(__file__).resolve().parents[1] / "client" / "sample.en"


def load_texts(data: Path, n: int, seed: int) -> list[str]:
    """n sentences of the corpus' test split (data/test.en), else of client/sample.en, in random order."""
    pool = [t.strip() for t in source_sentences(data, SAMPLE)]
    rng = random.Random(seed)
    return [pool[i] for i in rng.sample(range(len(pool)), min(n, len(pool)))]


class _TimedSession:
    """An ONNX Runtime session whose runs add their wall time to clock[0] (the rest passes through)."""

    def __init__(self, session: Any, clock: list[float]) -> None:
        self._session, self._clock = session, clock

    def _timed(self, method: str, args: tuple, kwargs: dict) -> Any:
        t0 = time.perf_counter()
        try:
            return getattr(self._session, method)(*args, **kwargs)
        finally:
            self._clock[0] += time.perf_counter() - t0

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed("run", args, kwargs)

    def run_with_iobinding(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed("run_with_iobinding", args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def time_sessions(engine: Engine) -> list[float]:
    """Time every graph run of the engine from now on (each session of the generator's Graphs, which
    the cache back-ends and in-flight storages share, is wrapped once): returns the clock ([seconds])."""
    clock = [0.0]
    graphs = engine.generator.graphs
    for name, value in list(vars(graphs).items()):
        if isinstance(value, ort.InferenceSession):
            setattr(graphs, name, _TimedSession(value, clock))
    return clock


def run_request(engine: Engine, texts: list[str], options: DecodingOptions, batch: int) -> dict[str, Any]:
    steps = row_steps = 0
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        engine.translate(texts[i : i + batch], options)
        stats = engine.generator.last_stats
        steps += stats["steps"]
        row_steps += stats["row_steps"]
    return {"seconds": time.perf_counter() - t0, "steps": steps, "row_steps": row_steps}


def run_inflight(engine: Engine, texts: list[str], options: DecodingOptions, rows: int) -> dict[str, Any]:
    rb = engine.running_batch()
    beam = max(1, options.beam_size)
    nxt = steps = row_steps = 0
    t0 = time.perf_counter()
    while nxt < len(texts) or len(rb):
        room = (rows - rb.rows) // beam
        if room > 0 and nxt < len(texts):
            take = texts[nxt : nxt + room]
            rb.admit([BatchItem(nxt + j, t, options) for j, t in enumerate(take)])
            nxt += len(take)
        row_steps += rb.rows
        steps += 1 if len(rb) else 0
        rb.step()
    return {"seconds": time.perf_counter() - t0, "steps": steps, "row_steps": row_steps}


def measure(
    engine: Engine, clock: list[float], texts: list[str], beam: int, batch: int, rows: int, reps: int
) -> dict[str, Any]:
    """Every mode --reps times, interleaved; clock: the engine's graph-run time (time_sessions)."""
    d = engine.default_options
    options = DecodingOptions(beam_size=beam, num_hypotheses=1, length_penalty=d.length_penalty)
    by_length = sorted(texts, key=len)
    runs = {
        "request-arrival": lambda: run_request(engine, texts, options, batch),
        "request-sorted": lambda: run_request(engine, by_length, options, batch),
        "inflight": lambda: run_inflight(engine, texts, options, rows),
    }
    engine.translate(texts[:batch], options)  # warm-up: kernels, arenas
    best: dict[str, dict[str, Any]] = {}
    for rep in range(reps):
        for mode, run in runs.items():
            before = clock[0]
            r = run()
            r["ort_seconds"] = clock[0] - before
            r["sentences"] = len(texts)
            r["sentences_per_s"] = len(texts) / r["seconds"]
            print(
                f"beam {beam} rep {rep + 1}/{reps} {mode:15s} {r['sentences_per_s']:7.1f} sentences/s, "
                f"{r['steps']} steps, {r['row_steps']} row-steps",
                file=sys.stderr,
                flush=True,
            )
            if mode not in best or r["seconds"] < best[mode]["seconds"]:
                best[mode] = r
    for r in best.values():
        r["mean_rows"] = r["row_steps"] / max(1, r["steps"])
        r["ms_per_row_step"] = 1000 * r["seconds"] / max(1, r["row_steps"])
        host = r["seconds"] - r["ort_seconds"]
        r["host_ms_per_step"] = 1000 * host / max(1, r["steps"])
        r["host_ms_per_sentence"] = 1000 * host / max(1, r["sentences"])
    return best


def main(argv: list[str] | None = None) -> int:
    p = engine_parser("python -m bench.saturation", __doc__)
    p.add_argument(
        "--io-binding",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="K/V as device OrtValues (default: on CUDA only); on the CPU it times the CUDA code path",
    )
    p.add_argument("--data", type=Path, default=Path("data"), help="corpus dir (test split), else sample.en")
    p.add_argument("--sentences", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--beams", default="1,4")
    p.add_argument("--batch", type=int, default=32, help="request-level batch, sentences")
    p.add_argument("--rows", type=int, default=64, help="in-flight batch, decoder rows")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    engine = Engine(
        args.bundle,
        variant=args.variant,
        device=args.device,
        intra_op_threads=args.threads,
        io_binding=args.io_binding,
    )
    texts = load_texts(args.data, args.sentences, args.seed)
    storage = "device" if engine.generator.inflight_on_device else "host"
    report: dict[str, Any] = {
        "bundle": str(args.bundle),
        "variant": args.variant,
        "providers": engine.providers,
        "threads": args.threads,
        "sentences": len(texts),
        "batch": args.batch,
        "rows": args.rows,
        "inflight_kv": storage,
        "beams": {},
    }
    clock = time_sessions(engine)
    for beam in [int(b) for b in args.beams.split(",")]:
        report["beams"][str(beam)] = measure(engine, clock, texts, beam, args.batch, args.rows, args.reps)
    where = f"{engine.providers[0]}, {args.threads} thread(s), in-flight K/V on the {storage}"
    print(f"\n{len(texts)} sentences, {where}\n")
    print(
        "| beam | mode | sentences/s | steps | row-steps | mean rows | ms per row-step | host ms / step "
        "| host ms / sentence |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for beam, modes in report["beams"].items():
        for mode in MODES:
            r = modes[mode]
            print(
                f"| {beam} | {mode} | {r['sentences_per_s']:.1f} | {r['steps']} | {r['row_steps']} | "
                f"{r['mean_rows']:.1f} | {r['ms_per_row_step']:.3f} | {r['host_ms_per_step']:.2f} | "
                f"{r['host_ms_per_sentence']:.2f} |"
            )
    ratios = []
    for beam, modes in report["beams"].items():
        rate = {mode: r["sentences_per_s"] for mode, r in modes.items()}
        ratios.append(
            f"beam {beam}: inflight / request-arrival {rate['inflight'] / rate['request-arrival']:.2f}x, "
            f"inflight / request-sorted {rate['inflight'] / rate['request-sorted']:.2f}x"
        )
    print("\nSummary: " + "; ".join(ratios))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
