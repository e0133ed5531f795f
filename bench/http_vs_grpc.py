"""HTTP (LibreTranslate API) vs gRPC throughput: one server, the same sentences, the same scheduler.

    python -m bench.http_vs_grpc --model-dir bundles/en-es-small --concurrency 1 8 32 --duration 10

Starts one `python -m server` with --http-port (127.0.0.1, free ports, --threads ONNX Runtime threads)
and drives it in closed loop, one sentence per request, at each --concurrency level, over gRPC
(client.AsyncTranslatorClient, one channel) and over HTTP (aiohttp, keep-alive connections, POST
/translate with a JSON body), the transports taking turns --repeats times so that drifts of the
machine's speed hit both alike. Sentences: data/test.en (client.load.load_sentences), else
client/sample.en, picked in the same seeded order for both. Prints sentences/s, p50/p95 latency and
the server process's CPU time per sentence (user + system, /proc: what the transport costs the server,
whatever the load generator takes) per transport (medians of the repeats), and the throughput ratio;
--out writes the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp

from client.core import AsyncTranslatorClient
from client.load import free_port, load_sentences, percentile, run_requests

REPO_ROOT = Path(__file__).resolve().parents[1]


def start_server(model_dir: str, threads: int, log: Path) -> tuple[subprocess.Popen, int, int]:
    port, http_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "server", "--model-dir", model_dir, "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--http-port", str(http_port), "--metrics-port", "-1"]
    cmd += ["--threads", str(threads), "--log-level", "WARNING"]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, port, http_port
        except OSError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: see {log}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the server did not become ready in 180 s: see {log}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(
    transport: str, send, sentences: list[str], concurrency: int, duration: float, pid: int
) -> dict:
    rng = random.Random(concurrency)  # the same sentence order for both transports
    latencies: list[float] = []
    errors = 0

    async def one() -> None:
        nonlocal errors
        text = sentences[rng.randrange(len(sentences))]
        t0 = time.perf_counter()
        try:
            await send(text)
        except Exception:
            errors += 1
            return
        latencies.append(time.perf_counter() - t0)

    cpu = cpu_seconds(pid)
    elapsed, _ = await run_requests(one, duration=duration, concurrency=concurrency)
    cpu = cpu_seconds(pid) - cpu
    ms = [x * 1000 for x in latencies]
    return {
        "transport": transport,
        "concurrency": concurrency,
        "sentences_per_s": round(len(ms) / elapsed, 2),
        "p50_ms": round(percentile(ms, 50), 1),
        "p95_ms": round(percentile(ms, 95), 1),
        "server_cpu_ms_per_sentence": round(cpu * 1000 / max(len(ms), 1), 2),
        "errors": errors,
    }


async def run(
    args: argparse.Namespace, pid: int, port: int, http_port: int, sentences: list[str]
) -> list[dict]:
    results: list[dict] = []
    url = f"http://127.0.0.1:{http_port}/translate"
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        AsyncTranslatorClient(f"127.0.0.1:{port}", timeout=120) as grpc_client,
        aiohttp.ClientSession(connector=connector) as session,
    ):

        async def via_grpc(text: str) -> None:
            await grpc_client.translate([text])

        async def via_http(text: str) -> None:
            async with session.post(url, json={"q": text, "source": "en", "target": "es"}) as r:
                if r.status != 200:
                    raise RuntimeError(await r.text())
                await r.json()

        senders = {"grpc": via_grpc, "http": via_http}
        for send in senders.values():  # warm-up: connections, caches
            await asyncio.gather(*(send(s) for s in sentences[:16]))
        for concurrency in args.concurrency:
            runs: dict[str, list[dict]] = {"grpc": [], "http": []}
            for _ in range(args.repeats):
                for name, send in senders.items():
                    runs[name].append(await measure(name, send, sentences, concurrency, args.duration, pid))
            for name, rs in runs.items():
                best = {
                    k: statistics.median(r[k] for r in rs)
                    for k in ("sentences_per_s", "p50_ms", "p95_ms", "server_cpu_ms_per_sentence")
                }
                results.append(
                    {
                        "transport": name,
                        "concurrency": concurrency,
                        **best,
                        "errors": sum(r["errors"] for r in rs),
                    }
                )
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.http_vs_grpc", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", default=str(REPO_ROOT / "bundles" / "en-es-small"))
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads of the server")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sentences", type=int, default=500)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    sentences = load_sentences()[: args.sentences]
    log = Path("/tmp") / f"http-vs-grpc-server-{free_port()}.log"
    proc, port, http_port = start_server(args.model_dir, args.threads, log)
    try:
        results = asyncio.run(run(args, proc.pid, port, http_port, sentences))
    finally:
        proc.terminate()
        proc.wait(30)
    print(
        f"{len(sentences)} sentences, one per request, {args.duration:g} s x {args.repeats} "
        "per point (medians)"
    )
    print(
        f"{'clients':>7} {'transport':>9} {'sent/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'cpu ms':>7} "
        f"{'errors':>6}"
    )
    by = {(r["transport"], r["concurrency"]): r for r in results}
    for c in args.concurrency:
        for t in ("grpc", "http"):
            r = by[(t, c)]
            print(
                f"{c:>7} {t:>9} {r['sentences_per_s']:>8.1f} {r['p50_ms']:>8.1f} {r['p95_ms']:>8.1f} "
                f"{r['server_cpu_ms_per_sentence']:>7.2f} {r['errors']:>6}"
            )
        ratio = by[("http", c)]["sentences_per_s"] / max(by[("grpc", c)]["sentences_per_s"], 1e-9)
        print(f"{c:>7} {'http/grpc':>9} {ratio:>8.2f}")
    if args.out:
        args.out.write_text(
            json.dumps({"args": vars(args) | {"out": str(args.out)}, "results": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
