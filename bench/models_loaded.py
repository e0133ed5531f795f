"""Memory and latency of one server by the number of models it loads (issue 31's "1, 3 and 5 models").

For each set of bundles (the first 1, then 2, ... of --bundles, or --counts of them) a `python -m server`
subprocess starts on a free port with those models (TRANSLATOR_MODELS, one ONNX Runtime thread, no warm-up
beyond the server's own), and the run records how long it took to serve, its resident memory once
serving, and the p50 of --requests requests of one sentence per pair, after --warmup requests each.

    python -m bench.models_loaded --bundles bundles/en-es-small bundles/en-fr-small bundles/en-de-small \\
        bundles/en-it-small --counts 1 3 4 --json runs/models-loaded.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.machine import cpu_info, describe
from client.core import TranslatorClient
from runtime.bundle import load_manifest

SENTENCE = "Could not open the file because the folder it was saved in has been moved."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(bundles: list[Path], requests: int, warmup: int, threads: int) -> dict:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSLATOR_")}
    env |= {
        "TRANSLATOR_MODELS": ",".join(str(b) for b in bundles), "TRANSLATOR_PORT": str(port),
        "TRANSLATOR_HOST": "127.0.0.1", "TRANSLATOR_HTTP_PORT": "0", "TRANSLATOR_METRICS_PORT": "0",
        "TRANSLATOR_THREADS": str(threads),
    }  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "server"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    client = TranslatorClient(f"127.0.0.1:{port}")
    try:
        client.wait_until_serving(timeout=300)
        load_s = time.perf_counter() - started
        rss = _rss_mb(proc.pid)
        latency = {}
        for bundle in bundles:
            target = load_manifest(bundle, "fp32")["target_language"]
            for _ in range(warmup):
                client.translate([SENTENCE], target_language=target)
            times = []
            for _ in range(requests):
                t0 = time.perf_counter()
                client.translate([SENTENCE], target_language=target)
                times.append(1000 * (time.perf_counter() - t0))
            latency[target] = round(statistics.median(times), 1)
        return {"models": len(bundles), "rss_mb": round(rss), "load_s": round(load_s, 1), "p50_ms": latency}
    finally:
        client.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundles", type=Path, nargs="+", required=True)
    parser.add_argument("--counts", type=int, nargs="*", help="how many of --bundles each run loads")
    parser.add_argument("--requests", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    counts = args.counts or list(range(1, len(args.bundles) + 1))
    rows = []
    for n in counts:
        row = measure(args.bundles[:n], args.requests, args.warmup, args.threads)
        rows.append(row)
        print(f"{row['models']} models: {row['rss_mb']} MB resident, serving after {row['load_s']} s, p50 "
              + ", ".join(f"{k} {v} ms" for k, v in row["p50_ms"].items()), flush=True)  # fmt: skip
    report = {"machine": describe(cpu_info()), "sentence": SENTENCE, "threads": args.threads, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"summary: {len(rows)} server starts; {report['machine']}")


if __name__ == "__main__":
    main()
