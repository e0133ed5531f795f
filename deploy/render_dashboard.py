"""Render the provisioned Grafana dashboard to a PNG with real data, without Grafana.

    python -m deploy.render_dashboard [--model-dir bundles/en-es-small] [--out docs/dashboard.png]

Starts a translation server (`python -m server`) and Prometheus (Debian package `prometheus`, with the
repository's rules) on 127.0.0.1, drives a few minutes of varied traffic through the real client
(light, open-loop, overload with a small queue, invalid requests and tight deadlines, streams),
then runs every query of deploy/grafana/dashboards/translator.json over that time range against
Prometheus and draws each panel at its grid position with matplotlib. Everything it starts is
stopped at the end. Needs matplotlib (not a runtime dependency).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deploy.promstack import (
    Prometheus,
    grafana_to_promql,
    legend,
    load_dashboard,
    loopback_config,
    panels,
)

REPO_ROOT = Path(__file__).resolve().parents[1]

# Grafana's dark theme and classic palette.
BG, PANEL, TEXT, MUTED, GRID = "#111217", "#181b1f", "#ccccdc", "#8e8e9a", "#2c3235"
PALETTE = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#fade2a"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- traffic ------------------------------------------------------------------------------------------


async def drive_traffic(target: str, scale: float = 1.0, log=print) -> None:
    """About 150 s x scale of traffic in phases."""
    from client.core import AsyncTranslatorClient, StreamItem, TranslatorError
    from client.load import load_sentences, run_load

    sentences = load_sentences()
    rng = random.Random(1)

    async def streams(client: AsyncTranslatorClient, seconds: float) -> None:
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            items = [StreamItem(f"{n}-{i}", [rng.choice(sentences)], beam_size=1) for i in range(4)]
            n += 1
            try:
                async for _ in client.translate_stream(items):
                    pass
            except TranslatorError:
                pass
            await asyncio.sleep(0.5)

    async def mistakes(client: AsyncTranslatorClient, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for call in (
                lambda: client.translate([rng.choice(sentences)], beam_size=99),  # INVALID_ARGUMENT
                lambda: client.translate([rng.choice(sentences)] * 4, beam_size=4, timeout=0.03),  # deadline
            ):
                try:
                    await call()
                except TranslatorError:
                    pass
            await asyncio.sleep(0.7)

    phases = [
        ("light: 1 client, greedy", dict(concurrency=1, options={"beam_size": 1}), 25),
        ("open loop 6 req/s, beam 4", dict(rate=6, texts_per_request=2, options={"beam_size": 4}), 35),
        ("overload: 24 clients x 4 texts", dict(concurrency=24, texts_per_request=4), 35),
        ("moderate + mistakes", dict(concurrency=3, texts_per_request=2), 30),
        ("cool-down", dict(concurrency=1, options={"beam_size": 1}), 25),
    ]
    async with AsyncTranslatorClient(target, timeout=30, retries=0) as client:
        deadline = time.monotonic() + 180
        while True:
            try:
                if await client.health(timeout=2) == "SERVING":
                    break
            except TranslatorError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{target} not SERVING after 180 s")
            await asyncio.sleep(0.3)
        for name, kwargs, seconds in phases:
            seconds *= scale
            log(f"traffic: {name} ({seconds:.0f} s)")
            extra = []
            if name.startswith("open"):
                extra.append(streams(client, seconds))
            if name.startswith("moderate"):
                extra.append(mistakes(client, seconds))
            results = await asyncio.gather(run_load(client, sentences, duration=seconds, **kwargs), *extra)
            report = results[0]
            log(f"  {report.ok}/{report.requests} ok, errors {report.errors}")


# ---- drawing ------------------------------------------------------------------------------------------


def format_value(value: float, unit: str) -> str:
    if value is None or math.isnan(value):
        return "no data"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "percentunit":
        return f"{value * 100:.2f}%"
    if unit == "reqps":
        return f"{value:.2f} req/s" if value < 100 else f"{value:.0f} req/s"
    return f"{value:.3g}"


def axis_formatter(unit: str):
    from matplotlib.ticker import FuncFormatter

    def fmt(v, _pos):
        if unit == "s":
            return f"{v * 1000:.0f} ms" if abs(v) < 1 else f"{v:.1f} s"
        if unit == "percentunit":
            return f"{v * 100:.0f}%"
        if unit == "reqps":
            return f"{v:g}/s"
        return f"{v:g}"

    return FuncFormatter(fmt)


def clock_formatter():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _pos: time.strftime("%H:%M:%S", time.gmtime(v)))


def collect(prom: Prometheus, dashboard: dict, start: float, end: float, step: float, rate_interval: str):
    """{panel id: [(legend, [t...], [v...]), ...]} for every panel of the dashboard."""
    data: dict[int, list] = {}
    for panel in panels(dashboard):
        series = []
        for target in panel.get("targets", []):
            expr = grafana_to_promql(target["expr"], rate_interval=rate_interval)
            for result in prom.query_range(expr, start, end, step):
                name = legend(target.get("legendFormat", ""), result["metric"]) or expr[:40]
                ts = [float(t) for t, _ in result["values"]]
                vs = [float(v) for _, v in result["values"]]
                series.append((name, ts, vs))
        data[panel["id"]] = series
    return data


def draw(
    dashboard: dict, data: dict[int, list], out: Path, time_range: tuple[float, float], subtitle: str = ""
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    all_panels = list(panels(dashboard))
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in all_panels)
    unit_h = 0.34
    header = 0.9
    fig_w, fig_h = 20.0, rows * unit_h + header
    fig = plt.figure(figsize=(fig_w, fig_h), dpi=100, facecolor=BG)
    fig.text(0.008, 1 - 0.35 / fig_h, dashboard["title"], color=TEXT, fontsize=16, weight="bold", va="center")
    if subtitle:
        fig.text(0.992, 1 - 0.35 / fig_h, subtitle, color=MUTED, fontsize=9, va="center", ha="right")
    pad_x, pad_y = 0.004, 0.006
    for panel in all_panels:
        g = panel["gridPos"]
        left = g["x"] / 24 + pad_x
        width = g["w"] / 24 - 2 * pad_x
        top = 1 - (header + g["y"] * unit_h) / fig_h
        height = g["h"] * unit_h / fig_h - 2 * pad_y
        bottom = top - pad_y - height
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        frame = fig.add_axes((left, bottom, width, height))
        frame.set_facecolor(PANEL)
        frame.set_xticks([])
        frame.set_yticks([])
        for spine in frame.spines.values():
            spine.set_color(GRID)
        frame.text(
            0.012,
            0.96,
            panel["title"],
            color=TEXT,
            fontsize=10,
            weight="bold",
            va="top",
            transform=frame.transAxes,
        )
        series = data.get(panel["id"], [])
        if panel["type"] == "stat":
            draw_stat(fig, frame, panel, series, unit, (left, bottom, width, height), time_range)
        else:
            draw_timeseries(fig, panel, series, unit, (left, bottom, width, height), time_range)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, facecolor=BG)
    plt.close(fig)


def draw_stat(fig, frame, panel, series, unit, box, time_range) -> None:
    left, bottom, width, height = box
    value = float("nan")
    if series:
        values = [v for v in series[0][2] if not math.isnan(v)]
        value = values[-1] if values else float("nan")
    color = PALETTE[0]
    steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
    for step in steps:
        if step.get("value") is None or (not math.isnan(value) and value >= step["value"]):
            color = {"green": PALETTE[0], "orange": PALETTE[3], "red": PALETTE[4]}.get(step["color"], color)
    if series and len(series[0][1]) > 1:
        spark = fig.add_axes((left + 0.002, bottom + 0.002, width - 0.004, height * 0.45))
        spark.fill_between(series[0][1], series[0][2], color=color, alpha=0.18, linewidth=0)
        spark.plot(series[0][1], series[0][2], color=color, alpha=0.6, linewidth=1)
        spark.set_axis_off()
        spark.set_xlim(*time_range)
        spark.set_ylim(bottom=0)
    frame.text(
        0.5,
        0.5,
        format_value(value, unit),
        color=color,
        fontsize=24,
        weight="bold",
        ha="center",
        va="center",
        transform=frame.transAxes,
    )


def draw_timeseries(fig, panel, series, unit, box, time_range) -> None:
    left, bottom, width, height = box
    ax = fig.add_axes((left + 0.032, bottom + height * 0.27, width - 0.04, height * 0.56))
    ax.set_facecolor(PANEL)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.grid(True, color=GRID, linewidth=0.6)
    ax.tick_params(colors=MUTED, labelsize=7, length=0)
    ax.yaxis.set_major_formatter(axis_formatter(unit))
    ax.xaxis.set_major_formatter(clock_formatter())
    ax.set_xlim(*time_range)
    if not series:
        ax.text(0.5, 0.5, "No data", color=MUTED, ha="center", va="center", transform=ax.transAxes)
        return
    stacked = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("stacking")
    for i, (name, ts, vs) in enumerate(series[:10]):
        color = PALETTE[i % len(PALETTE)]
        ax.plot(ts, vs, color=color, linewidth=1.3, label=name)
        if not stacked:
            ax.fill_between(ts, vs, color=color, alpha=0.08, linewidth=0)
    ax.set_ylim(bottom=0)
    ax.set_xlim(*time_range)
    ax.legend(
        loc="upper left",
        bbox_to_anchor=(0, -0.1),
        ncol=4,
        frameon=False,
        fontsize=7.5,
        labelcolor=TEXT,
        handlelength=1.2,
        columnspacing=1.2,
    )


# ---- main ---------------------------------------------------------------------------------------------


def default_model_dir() -> Path:
    """bundles/en-es-small, checked as the server checks it (server/store.py): a missing or stale
    bundle raises StoreError naming the command that exports it (`make bundle`)."""
    from server.store import resolve_bundle

    return resolve_bundle()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.render_dashboard", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="model bundle (default: bundles/en-es-small)"
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "dashboard.png")
    parser.add_argument("--scale", type=float, default=1.0, help="traffic duration factor (1 = ~150 s)")
    parser.add_argument("--rate-interval", default="10s", help="stands in for Grafana's $__rate_interval")
    parser.add_argument(
        "--max-queue-segments",
        type=int,
        default=64,
        help="server queue size (small, so the overload phase shows back-pressure)",
    )
    args = parser.parse_args(argv)
    from server.store import StoreError

    try:
        model_dir = args.model_dir or default_model_dir()
    except StoreError as e:
        print(f"python -m deploy.render_dashboard: {e}", file=sys.stderr)
        return 1
    dashboard = load_dashboard()
    with tempfile.TemporaryDirectory(prefix="render-dashboard-") as tmp:
        tmp = Path(tmp)
        grpc_port, metrics_port, prom_port = free_port(), free_port(), free_port()
        env = {
            **os.environ,
            "TRANSLATOR_MODEL_DIR": str(model_dir),
            "TRANSLATOR_HOST": "127.0.0.1",
            "TRANSLATOR_PORT": str(grpc_port),
            "TRANSLATOR_METRICS_PORT": str(metrics_port),
            "TRANSLATOR_MAX_QUEUE_SEGMENTS": str(args.max_queue_segments),
            "TRANSLATOR_LOG_LEVEL": "WARNING",
        }
        server_log = open(tmp / "server.log", "w")  # noqa: SIM115
        server = subprocess.Popen(
            [sys.executable, "-m", "server"],
            cwd=REPO_ROOT,
            env=env,
            stdout=server_log,
            stderr=subprocess.STDOUT,
        )
        prom = Prometheus(loopback_config([f"127.0.0.1:{metrics_port}"]), tmp / "prometheus", prom_port)
        try:
            prom.wait_ready(60)
            start = time.time()
            asyncio.run(drive_traffic(f"127.0.0.1:{grpc_port}", args.scale))
            time.sleep(3)  # last scrape + rule evaluation
            end = time.time()
            data = collect(prom, dashboard, start, end, step=2, rate_interval=args.rate_interval)
        finally:
            prom.stop()
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
            server_log.close()
        empty = [p["title"] for p in panels(dashboard) if not data.get(p["id"])]
        subtitle = (
            "rendered by deploy/render_dashboard.py from deploy/grafana/dashboards/translator.json "
            f"with real Prometheus data; model {model_dir.name}; {end - start:.0f} s of traffic; "
            f"$__rate_interval = {args.rate_interval}; times UTC"
        )
        draw(dashboard, data, args.out, (start, end), subtitle)
        print(f"wrote {args.out} ({len(data)} panels; no data: {empty or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
