"""The server with several ONNX Runtime threads: one intra-op pool for every session (the default,
server/engine/sessions.py `use_shared_pool`) against a pool per session (ENGINE_ORT_SHARED_POOL=0).

    python -m bench.server_threads [--bundle bundles/en-es-small] [--threads 2] [--sentences 64]
        [--repeats 2] [--json out.json]

Starts `python -m server` once per configuration and repetition (configurations taking turns), and sends
the shipped sample sentences (bench/data/speed.en) through the real gRPC client, one sentence per call:
one caller after the other (latency: median ms per call, and the total), then 8 callers at once (the
total). Greedy and beam 4, translation memory off so every sentence is decoded. The callers run on the
same machine as the server, as a client on the same host would; the report names the CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.batching import Server
from bench.machine import cpu_info, describe, sample_texts
from client import TranslatorClient

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {"shared pool": "1", "pool per session": "0"}  # ENGINE_ORT_SHARED_POOL
CALLERS = 8
START_TIMEOUT_S = 180


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure(target: str, texts: list[str], beam: int) -> dict[str, float]:
    """One caller after the other, then CALLERS at once, one sentence per call."""
    latencies = []
    with TranslatorClient(target, timeout=120) as c:
        for text in texts[:4]:  # warm-up
            c.translate([text], beam_size=beam)
        started = time.perf_counter()
        for text in texts:
            t0 = time.perf_counter()
            c.translate([text], beam_size=beam)
            latencies.append(time.perf_counter() - t0)
        serial_s = time.perf_counter() - started

    def caller(share: list[str]) -> None:
        with TranslatorClient(target, timeout=120) as cc:
            for text in share:
                cc.translate([text], beam_size=beam)

    threads = [threading.Thread(target=caller, args=(texts[i::CALLERS],)) for i in range(CALLERS)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "one_caller_s": serial_s,
        "one_caller_p50_ms": statistics.median(latencies) * 1000,
        f"{CALLERS}_callers_s": time.perf_counter() - started,
    }


def run(bundle: Path, threads: int, texts: list[str], repeats: int) -> dict[str, Any]:
    runs: dict[str, dict[str, list[float]]] = {name: {} for name in CONFIGS}
    with tempfile.TemporaryDirectory() as log_dir:
        for rep in range(repeats):
            for name, shared in CONFIGS.items():
                env = {"ENGINE_ORT_SHARED_POOL": shared}
                server = Server("inflight", str(bundle), threads, ["--no-memory"], Path(log_dir), None, env)
                try:
                    with TranslatorClient(server.target, timeout=30) as c:
                        c.wait_until_serving(START_TIMEOUT_S)
                    for beam in (1, 4):
                        for key, value in measure(server.target, texts, beam).items():
                            runs[name].setdefault(f"beam{beam} {key}", []).append(value)
                    log(f"rep {rep + 1}/{repeats} {name}: done")
                finally:
                    server.stop()
    medians = {name: {k: round(statistics.median(v), 4) for k, v in r.items()} for name, r in runs.items()}
    shared, own = medians["shared pool"], medians["pool per session"]
    speedup = {k: round(own[k] / shared[k], 2) for k in shared}  # times: per-session / shared
    return {"medians": medians, "speedup_shared": speedup, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", type=Path, default=REPO_ROOT / "bundles" / "en-es-small")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sentences", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.threads < 2:
        p.error("--threads must be at least 2: with one thread no pool is made")
    texts = sample_texts()[: args.sentences]
    machine = cpu_info()
    log(f"{len(texts)} sentences, {args.threads} threads, {args.repeats} repeats; CPU: {describe(machine)}")
    report = run(args.bundle, args.threads, texts, args.repeats)
    print(f"\nmedian of {args.repeats}, {len(texts)} sentences, {args.threads} ONNX Runtime threads")
    print("| measurement | shared pool | pool per session | per session / shared |")
    print("|---|---:|---:|---:|")
    for key, value in report["medians"]["shared pool"].items():
        own = report["medians"]["pool per session"][key]
        print(f"| {key} | {value:.3f} | {own:.3f} | {report['speedup_shared'][key]:.2f} |")
    report |= {"bundle": str(args.bundle), "threads": args.threads, "sentences": len(texts), "cpu": machine}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
