"""A real Prometheus (Debian package `prometheus`) on 127.0.0.1 with the repository's rules, for the
tests and deploy/render_dashboard.py; and the PromQL of the Grafana dashboard, made runnable outside
Grafana.

The configuration is deploy/prometheus/prometheus.yml with its service discovery (compose DNS names)
replaced by static loopback targets and the intervals shortened; rule files are the repository's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parent
PROMETHEUS_DIR = DEPLOY / "prometheus"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "translator.json"


def loopback_config(targets: Sequence[str], interval: str = "1s") -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml scraping `targets` (host:port of /metrics) as job translator."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"].update(scrape_interval=interval, evaluation_interval=interval, scrape_timeout=interval)
    config["rule_files"] = [str(PROMETHEUS_DIR / pattern) for pattern in config.get("rule_files", [])]
    jobs = []
    for job in config["scrape_configs"]:
        if job["job_name"] == "translator":
            job = {k: v for k, v in job.items() if k not in ("dns_sd_configs", "relabel_configs")}
            job["static_configs"] = [{"targets": list(targets)}]
            jobs.append(job)
    config["scrape_configs"] = jobs
    return config


class Prometheus:
    """`prometheus` as a child process on 127.0.0.1:port with a tmp TSDB; stop() ends it."""

    def __init__(self, config: dict[str, Any], workdir: Path, port: int, binary: str = "prometheus") -> None:
        if shutil.which(binary) is None:
            raise FileNotFoundError(f"{binary} not installed (apt-get install prometheus)")
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        self.base = f"http://127.0.0.1:{port}"
        self._log = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text()[-n:]

    def wait_ready(self, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"prometheus not ready after {timeout}s:\n{self.log_tail()}")

    def api(self, path: str, **params: Any) -> Any:
        url = self.base + "/api/v1/" + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read().decode())
        except urllib.error.HTTPError as e:  # 400/422: the error is in the JSON body
            body = json.loads(e.read().decode())
        if body.get("status") != "success":
            raise PromQLError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        return self.api("query", **params)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return self.api("query_range", query=expr, start=start, end=end, step=step)["result"]

    def targets(self) -> list[dict]:
        return self.api("targets")["activeTargets"]

    def rules(self) -> list[dict]:
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]

    def wait_for(self, expr: str, timeout: float = 30, predicate=bool) -> list[dict]:
        """Poll `expr` until predicate(result) holds; the last result, or TimeoutError."""
        end = time.monotonic() + timeout
        result: list[dict] = []
        while time.monotonic() < end:
            result = self.query(expr)
            if predicate(result):
                return result
            time.sleep(0.25)
        raise TimeoutError(f"{expr!r} still {result!r} after {timeout}s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


class PromQLError(RuntimeError):
    pass


# ---- the dashboard's queries ------------------------------------------------------------------------


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(path.read_text())


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def panel_targets(dashboard: dict[str, Any]) -> list[tuple[dict, dict]]:
    """(panel, target) for every query of the dashboard."""
    return [(p, t) for p in panels(dashboard) for t in p.get("targets", []) if t.get("expr")]


def grafana_to_promql(expr: str, rate_interval: str = "15s", instance: str = ".*", model: str = ".*") -> str:
    """Replace the Grafana variables the dashboard uses; fail on any other `$` left over."""
    out = (
        expr.replace("$__rate_interval", rate_interval)
        .replace("${__rate_interval}", rate_interval)
        .replace("$instance", instance)
        .replace("${instance}", instance)
        .replace("$model", model)
        .replace("${model}", model)
    )
    leftover = re.findall(r"\$\{?\w+", out)
    if leftover:
        raise ValueError(f"unknown Grafana variables {leftover} in {expr!r}")
    return out


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's legendFormat: {{label}} replaced by the series' label values."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def rule_expressions(rule_files: Sequence[Path] | None = None) -> list[tuple[str, str]]:
    """(rule name, expression) of every recording and alerting rule."""
    files = rule_files or sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
    out = []
    for path in files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                out.append((rule.get("record") or rule["alert"], rule["expr"]))
    return out
