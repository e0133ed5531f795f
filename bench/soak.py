"""Soak test: a real server under steady load at half of its measured saturation for a long time.

    python -m bench.soak [--minutes 30] [--bundle bundles/en-es-small] [--json soak.json]
    make soak            # 30 minutes;  make soak SOAK_MINUTES=5  for a quick check

Starts `python -m server` on the bundle (loopback, free ports), measures its saturation with a closed loop
of 32 clients for 20 s, then drives it open loop at half that request rate (real test sentences, the
model's default decoding) in one-minute windows. Every window reports requests, errors by code,
p50/p95 latency and the server's resident memory (VmRSS from /proc); the end compares the first and the
last window and fits the RSS trend (MB per hour over the second half: warm-up allocations excluded).
Stops the server (SIGTERM, it drains) and writes the JSON report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

from client.core import AsyncTranslatorClient, TranslatorClient
from client.load import free_port, load_sentences, run_load

REPO_ROOT = Path(__file__).resolve().parents[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) points, in MB per hour."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return 3600 * sum((t - mx) * (v - my) for t, v in points) / var if var else 0.0


async def soak(target: str, pid: int, sentences: list[str], minutes: float, rate: float | None) -> dict:
    async with AsyncTranslatorClient(target, timeout=60, retries=0) as client:
        if rate is None:
            print("measuring saturation: closed loop, 32 clients, 20 s ...", flush=True)
            sat = await run_load(client, sentences, duration=20, concurrency=32, label="saturation")
            print("\n".join(sat.lines()), flush=True)
            rate = max(0.5, sat.throughput_rps / 2)
            saturation = {"throughput_rps": sat.throughput_rps, "latency_ms": sat.latency_ms}
        else:
            saturation = None
        windows = []
        started = time.monotonic()
        total = max(1, round(minutes))
        window_s = 60.0 * minutes / total
        for i in range(total):
            r = await run_load(
                client, sentences, duration=window_s, rate=rate, seed=i, label=f"window {i + 1}"
            )
            w = {
                "window": i + 1,
                "t_s": round(time.monotonic() - started, 1),
                "requests": r.requests,
                "ok": r.ok,
                "errors": r.errors,
                "p50_ms": round(r.latency_ms.get("p50", float("nan")), 1),
                "p95_ms": round(r.latency_ms.get("p95", float("nan")), 1),
                "rss_mb": round(rss_mb(pid), 1),
            }
            windows.append(w)
            print(
                f"[{w['window']}/{total}] {w['t_s']:7.1f}s  ok {w['ok']}/{w['requests']}  "
                f"errors {sum(w['errors'].values())}  p50 {w['p50_ms']} ms  p95 {w['p95_ms']} ms  "
                f"RSS {w['rss_mb']} MB",
                flush=True,
            )
    half = windows[len(windows) // 2 :]
    return {
        "rate_rps": round(rate, 2),
        "saturation": saturation,
        "windows": windows,
        "requests": sum(w["requests"] for w in windows),
        "errors": sum(sum(w["errors"].values()) for w in windows),
        "first": windows[0],
        "last": windows[-1],
        "rss_trend_mb_per_hour": round(slope_per_hour([(w["t_s"], w["rss_mb"]) for w in half]), 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--bundle", type=Path, default=REPO_ROOT / "bundles" / "en-es-small")
    p.add_argument(
        "--rate", type=float, default=None, help="requests/s (default: half the measured saturation)"
    )
    p.add_argument("--threads", type=int, default=0, help="server intra-op threads (0: its default)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    port, metrics_port = free_port(), free_port()
    env = dict(os.environ, TRANSLATOR_MODEL_DIR=str(args.bundle), TRANSLATOR_HOST="127.0.0.1")
    env |= {"TRANSLATOR_PORT": str(port), "TRANSLATOR_METRICS_PORT": str(metrics_port)}
    if args.threads:
        env["TRANSLATOR_THREADS"] = str(args.threads)
    server = subprocess.Popen([sys.executable, "-m", "server"], env=env, cwd=REPO_ROOT)
    target = f"127.0.0.1:{port}"
    try:
        with TranslatorClient(target) as c:
            c.wait_until_serving(180)
        report = asyncio.run(soak(target, server.pid, load_sentences(), args.minutes, args.rate))
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(60)
    report |= {
        "minutes": args.minutes,
        "bundle": str(args.bundle),
        "server_exit_code": code,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    f, last = report["first"], report["last"]
    print(
        f"\nsoak {args.minutes:g} min at {report['rate_rps']} req/s: {report['requests']} requests, "
        f"{report['errors']} errors; p50 {f['p50_ms']} -> {last['p50_ms']} ms, p95 {f['p95_ms']} -> "
        f"{last['p95_ms']} ms; RSS {f['rss_mb']} -> {last['rss_mb']} MB "
        f"({report['rss_trend_mb_per_hour']:+} MB/h over the second half); server exit {code}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"report: {args.json}")
    return 0 if report["errors"] == 0 and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
