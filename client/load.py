"""Load generator: drive a translation server with real sentences and report throughput and latency.

    python -m client.load --target localhost:50051 --concurrency 16 --duration 20
    python -m client.load --target localhost:50051 --rate 50 --duration 20      # open loop, 50 req/s

Closed loop (--concurrency N): N workers each send a request as soon as the previous one returns.
Open loop (--rate R): requests start every 1/R s whatever the answers (at most --max-in-flight pending).
Sentences come from data/test.en (runtime.splits.read_split) when present, else client/sample.en.

Batching on vs off: start two servers and give both targets; they are measured one after the other:

    python -m server --port 50051 --metrics-port 8000 &
    TRANSLATOR_BATCHING=false python -m server --port 50052 --metrics-port 8001 &
    python -m client.load --target localhost:50051 --label batching \\
        --target localhost:50052 --label no-batching
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from client.core import AsyncTranslatorClient, TranslatorError

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE = Path(__file__).resolve().parent / "sample.en"


def load_sentences(data_dir: Path | None = None, max_chars: int = 200) -> list[str]:
    from runtime.splits import source_sentences

    return source_sentences(data_dir or REPO_ROOT / "data", SAMPLE, max_chars)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, for a server started next to the load generator."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of unsorted values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


@dataclass
class Report:
    label: str
    target: str
    mode: str
    duration_s: float
    requests: int = 0
    ok: int = 0
    segments: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    throughput_rps: float = 0.0
    segments_per_s: float = 0.0
    latency_ms: dict[str, float] = field(default_factory=dict)

    def lines(self) -> list[str]:
        lat = self.latency_ms
        out = [
            f"[{self.label}] {self.target}  {self.mode}  {self.duration_s:.1f}s",
            f"  requests {self.requests}  ok {self.ok}  errors {sum(self.errors.values())} "
            + (str(self.errors) if self.errors else ""),
            f"  throughput {self.throughput_rps:.2f} req/s  {self.segments_per_s:.2f} segments/s",
        ]
        if lat:
            out.append(
                f"  latency ms  p50 {lat['p50']:.1f}  p95 {lat['p95']:.1f}  p99 {lat['p99']:.1f}  "
                f"mean {lat['mean']:.1f}  max {lat['max']:.1f}"
            )
        return out


async def run_requests(
    one: Callable[[], Awaitable[None]],
    *,
    duration: float,
    concurrency: int = 0,
    rate: float = 0.0,
    max_in_flight: int = 512,
) -> tuple[float, int]:
    """Call `one()` for `duration` seconds: open loop at `rate` requests/s (arrivals do not wait for
    answers; at most `max_in_flight` outstanding, further arrivals are counted as client overload), or
    closed loop with `concurrency` workers. No request starts after `duration`; pending ones are
    awaited. Returns (elapsed seconds, arrivals skipped as client overload)."""
    start = time.perf_counter()
    end = start + duration
    overloaded = 0
    if rate > 0:
        pending: set[asyncio.Task] = set()
        n = 0
        while True:
            due = start + n / rate
            if due >= end:
                break
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            n += 1
            if len(pending) >= max_in_flight:
                overloaded += 1
                continue
            task = asyncio.create_task(one())
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.gather(*pending)
    else:

        async def worker() -> None:
            while time.perf_counter() < end:
                await one()

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start, overloaded


async def run_load(
    client: AsyncTranslatorClient,
    sentences: list[str],
    *,
    duration: float,
    concurrency: int = 8,
    rate: float = 0.0,
    texts_per_request: int = 1,
    max_in_flight: int = 512,
    options: dict | None = None,
    seed: int = 0,
    label: str = "",
) -> Report:
    """Bounded in time: no request starts after `duration` seconds; pending ones are awaited."""
    rng = random.Random(seed)
    options = options or {}
    latencies: list[float] = []
    errors: Counter = Counter()
    counts = {"requests": 0, "ok": 0, "segments": 0}

    async def one() -> None:
        texts = [rng.choice(sentences) for _ in range(texts_per_request)]
        counts["requests"] += 1
        t0 = time.perf_counter()
        try:
            await client.translate(texts, **options)
        except TranslatorError as e:
            errors[e.code.name] += 1
            return
        latencies.append(time.perf_counter() - t0)
        counts["ok"] += 1
        counts["segments"] += len(texts)

    mode = f"rate {rate:g} req/s" if rate > 0 else f"concurrency {concurrency}"
    elapsed, overloaded = await run_requests(
        one, duration=duration, concurrency=concurrency, rate=rate, max_in_flight=max_in_flight
    )
    if overloaded:
        errors["CLIENT_OVERLOAD"] += overloaded
    report = Report(
        label or client.target,
        client.target,
        mode + f", {texts_per_request} text(s)/request",
        elapsed,
        counts["requests"],
        counts["ok"],
        counts["segments"],
        dict(errors),
    )
    report.throughput_rps = counts["ok"] / elapsed
    report.segments_per_s = counts["segments"] / elapsed
    if latencies:
        ms = [x * 1000 for x in latencies]
        report.latency_ms = {
            "p50": percentile(ms, 50),
            "p95": percentile(ms, 95),
            "p99": percentile(ms, 99),
            "mean": sum(ms) / len(ms),
            "max": max(ms),
        }
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m client.load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--target", action="append", help="host:port; repeat to compare servers (default: localhost:50051)"
    )
    p.add_argument("--label", action="append", help="name of each --target in the report")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--concurrency", type=int, default=8, help="closed loop with N workers (default: 8)")
    g.add_argument("--rate", type=float, default=0.0, help="open loop: requests per second")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per target (default: 10)")
    p.add_argument(
        "--warmup", type=float, default=1.0, help="unmeasured seconds before each run (default: 1)"
    )
    p.add_argument("--texts-per-request", type=int, default=1)
    p.add_argument("--beam-size", type=int, default=0)
    p.add_argument("--max-length", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    p.add_argument("--max-in-flight", type=int, default=512, help="open loop: cap on pending requests")
    p.add_argument("--max-chars", type=int, default=200, help="skip longer test sentences")
    p.add_argument("--data", type=Path, default=None, help="data dir with test.en/test.es (default: data/)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    p.add_argument(
        "--token", default=os.environ.get("TRANSLATOR_TOKEN"), help="bearer token [TRANSLATOR_TOKEN]"
    )
    p.add_argument("--ca-cert", help="PEM CA certificate (enables TLS)")
    return p


async def amain(args: argparse.Namespace) -> list[Report]:
    targets = args.target or ["localhost:50051"]
    labels = args.label or []
    sentences = load_sentences(args.data, args.max_chars)
    options = {"beam_size": args.beam_size, "max_length": args.max_length}
    reports = []
    for i, target in enumerate(targets):
        label = labels[i] if i < len(labels) else target
        async with AsyncTranslatorClient(
            target, timeout=args.timeout, retries=0, token=args.token, ca_cert=args.ca_cert
        ) as client:
            kwargs = dict(
                concurrency=args.concurrency,
                rate=args.rate,
                texts_per_request=args.texts_per_request,
                max_in_flight=args.max_in_flight,
                options=options,
                seed=args.seed,
                label=label,
            )
            if args.warmup > 0:
                await run_load(client, sentences, duration=args.warmup, **kwargs)
            reports.append(await run_load(client, sentences, duration=args.duration, **kwargs))
        if not args.json:
            print("\n".join(reports[-1].lines()), flush=True)
    return reports


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    reports = asyncio.run(amain(args))
    if args.json:
        print(json.dumps([asdict(r) for r in reports], indent=2))
    elif len(reports) > 1:
        base = reports[0]
        print("\ncomparison (throughput, p50, p95 vs the first target):")
        for r in reports:
            if not (base.throughput_rps and r.latency_ms and base.latency_ms):
                continue
            print(
                f"  {r.label:<20} x{r.throughput_rps / base.throughput_rps:.2f} throughput  "
                f"p50 {r.latency_ms['p50']:.0f} ms  p95 {r.latency_ms['p95']:.0f} ms"
            )
    failed = all(r.ok == 0 for r in reports)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
