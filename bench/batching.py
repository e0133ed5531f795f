"""Batching modes benchmark: off vs request-level vs in-flight, on one machine, in one run.

    python -m bench.batching --model-dir bundles/en-es-small --out bench-batching.json \
        --server-cpus 1 --threads 1

Starts one server per mode (`python -m server --batching-mode MODE` on 127.0.0.1, free ports), pinned
to --server-cpus with --threads ONNX Runtime threads (this process, the load generator, moves to the
other CPUs), and drives them one after the other (only one is busy at a time) with the same sentences
(data/test.en via model.corpus.read_split, else client/sample.en), one text per request:

* closed loop at each --concurrency level, for each --beams size: throughput (sentences/s, generated
  tokens/s from the server's translator_generated_tokens_total) and p50/p95/p99 latency;
* a mixed workload (closed loop, --mixed-concurrency): short sentences (<= --short-words words) and
  long ones (>= --long-words), --long-share of the requests long; p95 per class (do short ones still
  wait for long ones?);
* open loop (Poisson arrivals) at --rate-factors x the request-level saturation throughput (its best
  closed-loop sentences/s), same rates for every mode;
* the p95 objective: request-level's p95 once saturated: at the most clients whose closed-loop
  throughput is within 5% of its best (the plateau's end). For request and inflight,
  --search-steps bisection runs refine the highest open-loop rate the mode sustains within it (>= 95%
  of the offered requests answered, none refused, p95 <= objective).

Every load point is measured --repeats times, the modes taking turns (the bisections too), so slow
drifts of the machine's speed hit all modes alike; the report's runs are the medians of those
repetitions, with the lowest and highest throughput and p95 (every measurement is kept under
"repetitions"). Writes the JSON report (runs, and a summary with ratios against request-level) to --out
and a PNG plot (p95 latency vs throughput per mode and beam size, whiskers = the spread, matplotlib)
next to it (or to --plot).
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
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from client.core import AsyncTranslatorClient, TranslatorError
from client.load import free_port, load_sentences, percentile, run_requests

REPO_ROOT = Path(__file__).resolve().parents[1]
MODES = ("off", "request", "inflight")


def metric_total(exposition: str, name: str) -> float:
    """A sample's value in Prometheus' text format, summed over its label sets (the server's histogram
    series carry the model's label); 0 when absent."""
    families = text_string_to_metric_families(exposition)
    return sum(s.value for family in families for s in family.samples if s.name == name)


class Server:
    """`python -m server` in batching `mode` on free ports of 127.0.0.1, logging to log_dir; `env`: variables
    added to this process's environment for it."""

    def __init__(
        self,
        mode: str,
        model_dir: str,
        threads: int,
        extra: list[str],
        log_dir: Path,
        cpus: set[int] | None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.mode, self.port, self.metrics_port = mode, free_port(), free_port()
        self.log = open(log_dir / f"server-{mode}.log", "w")  # noqa: SIM115 - closed in stop()
        cmd = [sys.executable, "-m", "server", "--model-dir", model_dir, "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--metrics-port", str(self.metrics_port)]
        cmd += ["--threads", str(threads), "--batching-mode", mode, "--log-level", "WARNING", *extra]
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            preexec_fn=pin,
            env={**os.environ, **env} if env else None,
        )

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def counter(self, name: str) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read()
        return metric_total(text.decode(), name)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


async def drive(
    client: AsyncTranslatorClient,
    pick,
    *,
    duration: float,
    concurrency: int = 0,
    rate: float = 0.0,
    options: dict,
    max_in_flight: int = 1024,
) -> dict:
    """Closed loop (concurrency) or open loop (rate); pick() -> (text, class). Per-class latencies."""
    lat: dict[str, list[float]] = {}
    errors: dict[str, int] = {}

    async def one() -> None:
        text, cls = pick()
        t0 = time.perf_counter()
        try:
            await client.translate([text], **options)
        except TranslatorError as e:
            errors[e.code.name] = errors.get(e.code.name, 0) + 1
            return
        lat.setdefault(cls, []).append(time.perf_counter() - t0)

    elapsed, overloaded = await run_requests(
        one, duration=duration, concurrency=concurrency, rate=rate, max_in_flight=max_in_flight
    )
    if overloaded:
        errors["CLIENT_OVERLOAD"] = errors.get("CLIENT_OVERLOAD", 0) + overloaded
    everything = [x for v in lat.values() for x in v]

    def stats(values: list[float]) -> dict:
        ms = [x * 1000 for x in values]
        if not ms:
            return {"n": 0}
        return {
            "n": len(ms),
            "p50_ms": percentile(ms, 50),
            "p95_ms": percentile(ms, 95),
            "p99_ms": percentile(ms, 99),
            "mean_ms": sum(ms) / len(ms),
        }

    out = {"elapsed_s": elapsed, "sentences": len(everything), "errors": errors}
    out["sentences_per_s"] = len(everything) / elapsed
    out |= stats(everything)
    if len(lat) > 1:
        out["by_class"] = {cls: stats(v) for cls, v in sorted(lat.items())}
    return out


async def measure(server: Server, pick, *, warmup: float, duration: float, **kw) -> dict:
    async with AsyncTranslatorClient(server.target, timeout=120, retries=0) as client:
        if warmup > 0:
            await drive(client, pick, duration=warmup, **kw)
        names = (
            "translator_generated_tokens_total",
            "translator_batch_rows_sum",
            "translator_batch_rows_count",
        )
        before = [server.counter(n) for n in names]
        res = await drive(client, pick, duration=duration, **kw)
        tokens, rows, steps = (server.counter(n) - b for n, b in zip(names, before, strict=True))
        res["generated_tokens_per_s"] = tokens / res["elapsed_s"]
        # Decoder rows per step as the engine ran them (in flight: per step; request-level: the mean of
        # each batch's mean), so a batch running more rows than the scheduler counted shows.
        res["mean_rows"] = rows / steps if steps else None
    return res


def merge(reps: list[dict]) -> dict:
    """One load point measured several times (modes taking turns between them): the median of each
    throughput and latency figure (and of each class's), the lowest and highest throughput and p95
    (the spread), and errors, answered sentences and time summed."""
    out: dict = {"repeats": len(reps), "elapsed_s": sum(r["elapsed_s"] for r in reps)}
    out["sentences"] = sum(r["sentences"] for r in reps)
    out["n"] = sum(r.get("n", 0) for r in reps)
    errors: dict[str, int] = {}
    for r in reps:
        for code, k in r["errors"].items():
            errors[code] = errors.get(code, 0) + k
    out["errors"] = errors
    figures = (
        "sentences_per_s",
        "generated_tokens_per_s",
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "mean_ms",
        "mean_rows",
    )
    for key in figures:
        values = [r[key] for r in reps if r.get(key) is not None]
        if values:
            out[key] = statistics.median(values)
            if key in ("sentences_per_s", "p95_ms"):
                out[key + "_min"], out[key + "_max"] = min(values), max(values)
    classes = sorted({c for r in reps for c in r.get("by_class", {})})
    if classes:
        out["by_class"] = {}
        for c in classes:
            mine = [r["by_class"][c] for r in reps if r.get("by_class", {}).get(c, {}).get("n")]
            out["by_class"][c] = {"n": sum(x["n"] for x in mine)} | {
                key: statistics.median(x[key] for x in mine)
                for key in ("p50_ms", "p95_ms", "p99_ms", "mean_ms")
                if mine
            }
    return out


def sustained(run: dict, slo_ms: float) -> bool:
    """An open-loop run the mode kept up with: nearly all offered requests answered, none refused,
    p95 within the latency objective."""
    offered = run["rate"] * run["elapsed_s"]
    return (
        bool(run.get("n"))
        and not run["errors"]
        and run["sentences"] >= 0.95 * offered
        and run["p95_ms"] <= slo_ms
    )


PLATEAU = 0.95  # closed-loop levels within 5% of the best throughput are all "saturated"


def saturation_point(closed: list[dict]) -> dict | None:
    """The closed-loop run where a mode is saturated: the most clients whose throughput is within
    PLATEAU of the best. Not simply the best one: on a plateau the best level flips between runs on
    noise, and the p95 (which grows with the clients) would flip with it, by 3x between 16 and 48."""
    if not closed:
        return None
    top = max(r["sentences_per_s"] for r in closed)
    return max((r for r in closed if r["sentences_per_s"] >= PLATEAU * top), key=lambda r: r["concurrency"])


def summarize(runs: list[dict], beams: list[int], modes: list[str]) -> dict:
    """Per beam size: the latency objective (request-level batching's p95 at its saturation point,
    see saturation_point) and per mode the best closed-loop throughput, the highest
    open-loop rate sustained within that p95, and the mixed workload's p95 per class; ratios against
    request-level batching."""
    summary: dict = {}
    for beam in beams:
        mine = [r for r in runs if r["beam"] == beam]
        done = [r for r in mine if r["kind"] == "closed" and r.get("n")]
        closed = {m: [r for r in done if r["mode"] == m] for m in modes}
        ref = saturation_point(closed.get("request", []))
        slo = ref["p95_ms"] if ref else float("inf")
        out: dict = {"p95_objective_ms": ref and slo, "objective_at_concurrency": ref and ref["concurrency"]}
        for m in modes:
            best = max(closed[m], key=lambda r: r["sentences_per_s"], default=None)
            ok = [r for r in mine if r["mode"] == m and r["kind"] in ("open", "search") and sustained(r, slo)]
            top = max(ok, key=lambda r: r["sentences_per_s"], default=None)
            mixed = next((r for r in mine if r["mode"] == m and r["kind"] == "mixed"), None)
            by_class = (mixed or {}).get("by_class", {})
            out[m] = {
                "closed_max_sentences_per_s": best and best["sentences_per_s"],
                "closed_max_at_concurrency": best and best["concurrency"],
                "closed_max_p95_ms": best and best["p95_ms"],
                "closed_max_tokens_per_s": best and best.get("generated_tokens_per_s"),
                "sustained_sentences_per_s_within_objective": top and top["sentences_per_s"],
                "sustained_p95_ms": top and top["p95_ms"],
                "mixed_short_p95_ms": by_class.get("short", {}).get("p95_ms"),
                "mixed_long_p95_ms": by_class.get("long", {}).get("p95_ms"),
            }
        base = out.get("request", {})
        for m in modes:
            for key in ("closed_max_sentences_per_s", "sustained_sentences_per_s_within_objective"):
                if out[m].get(key) and base.get(key):
                    out[m][key.replace("sentences_per_s", "vs_request")] = out[m][key] / base[key]
        summary[f"beam{beam}"] = out
    return summary


def markdown(summary: dict) -> str:
    """The summary as a Markdown table (README)."""

    def num(x: float | None, fmt: str = ".0f") -> str:
        return "-" if x is None else format(x, fmt)

    lines = [
        "| beam | mode | closed loop: best sent/s (clients) | p95 ms there | sustained sent/s within the p95"
        " objective | vs request | short p95 ms, mixed | long p95 ms, mixed |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, per_beam in summary.items():
        objective = per_beam.get("p95_objective_ms")
        for mode, s in per_beam.items():
            if not isinstance(s, dict):
                continue
            closed = f"{num(s['closed_max_sentences_per_s'], '.1f')} ({s['closed_max_at_concurrency']})"
            ratio = s.get("sustained_vs_request_within_objective")
            beam = f"{key[4:]} (objective {num(objective)} ms)"
            lines.append(
                f"| {beam} | {mode} | {closed} | {num(s['closed_max_p95_ms'])} "
                f"| {num(s['sustained_sentences_per_s_within_objective'], '.1f')} | {num(ratio, '.2f')} "
                f"| {num(s['mixed_short_p95_ms'])} | {num(s['mixed_long_p95_ms'])} |"
            )
    return "\n".join(lines)


def spread(ax, runs: list[dict], color: str | None) -> None:
    """Whiskers from the lowest to the highest throughput and p95 of each point's repetitions."""
    runs = [r for r in runs if "sentences_per_s_min" in r and "p95_ms_min" in r]
    if not runs:
        return
    x = [r["sentences_per_s"] for r in runs]
    y = [r["p95_ms"] for r in runs]
    xerr = [
        [r["sentences_per_s"] - r["sentences_per_s_min"] for r in runs],
        [r["sentences_per_s_max"] - r["sentences_per_s"] for r in runs],
    ]
    yerr = [[r["p95_ms"] - r["p95_ms_min"] for r in runs], [r["p95_ms_max"] - r["p95_ms"] for r in runs]]
    ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="none", ecolor=color, alpha=0.35, lw=0.8)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    beams = report["config"]["beams"]
    fig, axes = plt.subplots(1, len(beams), figsize=(6 * len(beams), 4.5), squeeze=False)
    colors = {"off": "tab:gray", "request": "tab:blue", "inflight": "tab:red"}
    for ax, beam in zip(axes[0], beams, strict=True):
        for mode in report["config"]["modes"]:
            runs = [r for r in report["runs"] if r["mode"] == mode and r["beam"] == beam]
            closed = sorted(
                (r for r in runs if r["kind"] == "closed" and r.get("n")), key=lambda r: r["concurrency"]
            )
            xs = [r["sentences_per_s"] for r in closed]
            ys = [r["p95_ms"] for r in closed]
            ax.plot(xs, ys, "o-", color=colors.get(mode), label=f"{mode} closed loop (p95)")
            spread(ax, closed, colors.get(mode))
            for r in closed:
                ax.annotate(f"c{r['concurrency']}", (r["sentences_per_s"], r["p95_ms"]), fontsize=7)
            opened = sorted(
                (r for r in runs if r["kind"] in ("open", "search") and r.get("n")), key=lambda r: r["rate"]
            )
            ax.plot(
                [r["sentences_per_s"] for r in opened],
                [r["p95_ms"] for r in opened],
                "s--",
                color=colors.get(mode),
                mfc="none",
                alpha=0.7,
                label=f"{mode} open loop (p95)",
            )
            spread(ax, opened, colors.get(mode))
        objective = report.get("summary", {}).get(f"beam{beam}", {}).get("p95_objective_ms")
        if objective:
            ax.axhline(objective, color="black", lw=0.8, ls=":", label="p95 objective")
        ax.set_title(f"beam {beam}")
        ax.set_xlabel("throughput (sentences/s)")
        ax.set_ylabel("p95 latency (ms)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(report["config"].get("title", "batching modes"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.batching",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model-dir", required=True, help="bundle dir (exported by this version)")
    p.add_argument("--out", type=Path, required=True, help="JSON report path")
    p.add_argument("--plot", type=Path, default=None, help="PNG path (default: --out with .png)")
    p.add_argument("--log-dir", type=Path, default=None, help="server logs (default: a new temp dir)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--beams", default="1,4")
    p.add_argument("--concurrency", default="1,4,16,48")
    p.add_argument(
        "--rate-factors",
        default="0.5,0.75,1.0,1.25,1.5,1.75",
        help="open loop rates, x request-level saturation (its best closed-loop sentences/s)",
    )
    p.add_argument(
        "--search-steps",
        type=int,
        default=3,
        help="bisection steps refining each mode's highest open-loop rate within the p95 objective",
    )
    p.add_argument("--duration", type=float, default=8.0, help="seconds per measurement")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="measurements per mode and load point, modes taking turns; the report gives their medians",
    )
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads per server")
    p.add_argument("--mixed-concurrency", type=int, default=16)
    p.add_argument("--short-words", type=int, default=8)
    p.add_argument("--long-words", type=int, default=25)
    p.add_argument("--long-share", type=float, default=0.3)
    p.add_argument("--server-arg", action="append", default=[], help="extra server flag (repeatable)")
    p.add_argument(
        "--server-cpus",
        default="",
        help="pin the servers to these CPUs (e.g. 1); the load generator then runs on the others",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--title", default="")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    beams = [int(b) for b in args.beams.split(",")]
    levels = [int(c) for c in args.concurrency.split(",")]
    factors = [float(f) for f in args.rate_factors.split(",") if f]
    sentences = load_sentences(None, 400)
    short = [s for s in sentences if len(s.split()) <= args.short_words]
    long = [s for s in sentences if len(s.split()) >= args.long_words]
    rng = random.Random(args.seed)

    def pick_any():
        return rng.choice(sentences), "all"

    def pick_mixed():
        if long and rng.random() < args.long_share:
            return rng.choice(long), "long"
        return rng.choice(short or sentences), "short"

    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "config": {
            "modes": modes,
            "beams": beams,
            "concurrency": levels,
            "rate_factors": factors,
            "duration_s": args.duration,
            "repeats": args.repeats,
            "threads": args.threads,
            "model_dir": args.model_dir,
            "sentences": len(sentences),
            "short_sentences": len(short),
            "long_sentences": len(long),
            "cpu_affinity": sorted(os.sched_getaffinity(0)),
            "title": args.title or f"batching modes, {args.model_dir}",
        },
        "runs": [],  # one per mode and load point: the medians over its repetitions (merge)
        "repetitions": [],  # every measurement
    }
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-batching-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"server logs: {log_dir}", file=sys.stderr)
    server_cpus = {int(c) for c in args.server_cpus.split(",") if c}
    if server_cpus and os.sched_getaffinity(0) - server_cpus:
        os.sched_setaffinity(0, os.sched_getaffinity(0) - server_cpus)  # the client keeps off their cores
    report["config"]["server_cpus"] = sorted(server_cpus)
    report["config"]["client_cpus"] = sorted(os.sched_getaffinity(0))
    cpus = server_cpus or None
    servers = {m: Server(m, args.model_dir, args.threads, args.server_arg, log_dir, cpus) for m in modes}
    try:
        from client import TranslatorClient

        for s in servers.values():
            with TranslatorClient(s.target, timeout=30) as c:
                c.wait_until_serving(300)

        def points(beam: int, kind: str, pick, loads: dict[str, dict], *, warmup: float = 0.0) -> dict:
            """Measure one load point per mode --repeats times, the modes taking turns (so slow drifts
            of the machine's speed hit them alike), and record each mode's merged result. loads: mode ->
            concurrency= (closed loop) or rate= (open loop), plus tags (rate_factor=)."""
            reps: dict[str, list[dict]] = {mode: [] for mode in loads}
            for rep in range(args.repeats):
                for mode, load in loads.items():
                    drive_load = {k: v for k, v in load.items() if k in ("concurrency", "rate")}
                    res = asyncio.run(
                        measure(
                            servers[mode],
                            pick,
                            warmup=warmup,
                            duration=args.duration,
                            options={"beam_size": beam},
                            **drive_load,
                        )
                    )
                    res = {"mode": mode, "beam": beam, "kind": kind, "rep": rep, **load} | res
                    report["repetitions"].append(res)
                    reps[mode].append(res)
                    print(json.dumps(res), flush=True)
            merged = {}
            for mode, load in loads.items():
                merged[mode] = {"mode": mode, "beam": beam, "kind": kind, **load} | merge(reps[mode])
                report["runs"].append(merged[mode])
            args.out.write_text(json.dumps(report, indent=2))
            return merged

        for beam in beams:
            for c in levels:
                points(beam, "closed", pick_any, {m: {"concurrency": c} for m in modes}, warmup=args.warmup)
            points(
                beam,
                "mixed",
                pick_mixed,
                {m: {"concurrency": args.mixed_concurrency} for m in modes},
                warmup=args.warmup,
            )
            base = [
                r["sentences_per_s"]
                for r in report["runs"]
                if r["beam"] == beam and r["kind"] == "closed" and r["mode"] == "request"
            ]
            saturation = max(base) if base else 0.0
            for f in factors:
                if saturation <= 0:
                    break
                points(beam, "open", pick_any, {m: {"rate": saturation * f, "rate_factor": f} for m in modes})
            # Refine, per batching mode, the highest rate it sustains within the latency objective
            # (request-level's p95 at saturation) between the sweep's last good and first bad rate;
            # the modes' bisections step together, taking turns like every other point.
            slo = summarize(report["runs"], [beam], modes)[f"beam{beam}"]["p95_objective_ms"]
            bounds: dict[str, tuple[float, float]] = {}
            for mode in modes:
                if not slo or mode == "off":
                    continue
                mine = [
                    r
                    for r in report["runs"]
                    if r["beam"] == beam and r["mode"] == mode and r["kind"] == "open"
                ]
                good = [r["rate"] for r in mine if sustained(r, slo)]
                lo = max(good, default=0.0)
                hi = min((r["rate"] for r in mine if r["rate"] > lo), default=2 * lo or saturation)
                bounds[mode] = (lo, hi)
            for _ in range(args.search_steps if bounds else 0):
                rates = {mode: (lo + hi) / 2 for mode, (lo, hi) in bounds.items()}
                loads = {mode: {"rate": r, "rate_factor": r / saturation} for mode, r in rates.items()}
                for mode, res in points(beam, "search", pick_any, loads).items():
                    lo, hi = bounds[mode]
                    bounds[mode] = (rates[mode], hi) if sustained(res, slo) else (lo, rates[mode])
    finally:
        for s in servers.values():
            s.stop()
    report["summary"] = summarize(report["runs"], beams, modes)
    report["markdown"] = markdown(report["summary"])
    args.out.write_text(json.dumps(report, indent=2))
    png = args.plot or args.out.with_suffix(".png")
    plot(report, png)
    print(json.dumps(report["summary"], indent=2))
    print(report["markdown"])
    print(f"wrote {args.out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
