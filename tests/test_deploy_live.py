"""The monitoring and load-balancing configuration run for real on 127.0.0.1:

- Prometheus (Debian `prometheus`) with deploy/prometheus's rules scrapes a real server under
  traffic: every rule evaluates without error, every query of the Grafana dashboard runs, and the key
  ones return data; a dead target makes TranslatorInstanceDown pending.
- nginx (Debian `nginx`) with deploy/nginx/nginx.conf in front of two `python -m server` processes
  spreads gRPC calls over both (per-server request counters) and keeps serving when one is killed.

Everything started here is stopped at the end; waits are bounded. Skipped, with the package to
install, where a binary is missing (make system-deps).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from client import StreamItem, TranslatorClient, TranslatorError
from tests.conftest import REPO_ROOT, free_port, wait_serving

pytest.importorskip("yaml", reason="PyYAML is needed (pip install pyyaml)")

NGINX_DIR = REPO_ROOT / "deploy" / "nginx"


def need(binary: str, package: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.skip(f"{binary} not installed (apt-get install {package}; make system-deps)")
    return path


# ---- Prometheus ---------------------------------------------------------------------------------------

# Queries that must return data once the server has had traffic.
KEY_PANELS = [
    "Serving instances",
    "Answers / s",
    "p95 latency (Translate)",
    "Request rate by status",
    "Latency (Translate)",
    "Queue depth",
    "Queue wait",
    "Batch size",
    "Tokens / s",
    "In-flight requests",
    "Engine time per batch and per step",
]
KEY_RULES = [
    "translator:requests:rate5m",
    "translator:answers:rate5m",
    "translator:answer_errors:ratio_rate5m",
    "translator:request_duration_seconds:p95_5m",
    "translator:queue_wait_seconds:p95_5m",
    "translator:batch_segments:mean_5m",
    "translator:generated_tokens:rate5m",
    "translator:ready_instances:sum",
]


def traffic(target: str, stop: threading.Event, seconds: float) -> None:
    """Translate calls, a stream, a client mistake: bounded by `seconds`."""
    end = time.monotonic() + seconds
    with TranslatorClient(target, timeout=20, retries=0) as c:
        while not stop.is_set() and time.monotonic() < end:
            c.translate(["Open the file", "Save changes?"], max_length=6, beam_size=1)
            list(c.translate_stream([StreamItem("a", ["Print"], max_length=4), StreamItem("b", ["Close"])]))
            try:
                c.translate([])
            except TranslatorError:
                pass
            time.sleep(0.05)


@pytest.fixture()
def prometheus(tiny_server, tmp_path):
    from deploy.promstack import Prometheus, loopback_config

    need("prometheus", "prometheus")
    dead = f"127.0.0.1:{free_port()}"  # nothing listens: up == 0
    config = loopback_config([f"127.0.0.1:{tiny_server.server.metrics_port}", dead])
    prom = Prometheus(config, tmp_path / "prometheus", free_port())
    try:
        prom.wait_ready(30)
        yield prom
    finally:
        prom.stop()


def test_rules_and_dashboard_queries_run_against_prometheus(prometheus, tiny_server):
    from deploy.promstack import grafana_to_promql, load_dashboard, panel_targets, rule_expressions

    stop = threading.Event()
    driver = threading.Thread(target=traffic, args=(tiny_server.target, stop, 25), daemon=True)
    driver.start()
    try:
        # Two scrapes with traffic between them: rates exist.
        prometheus.wait_for(
            'sum(rate(translator_requests_total{rpc="Translate",code="OK"}[15s])) > 0', timeout=20
        )
        prometheus.wait_for("translator:answers:rate5m > 0", timeout=10)
    finally:
        stop.set()
        driver.join(30)

    dashboard = load_dashboard()
    empty = []
    for panel, target in panel_targets(dashboard):
        expr = grafana_to_promql(target["expr"], rate_interval="15s")
        result = prometheus.query(expr)  # raises PromQLError on a bad query
        if not result:
            empty.append(panel["title"])
    missing = sorted({title for title in empty if title in KEY_PANELS})
    assert not missing, f"dashboard panels without data after traffic: {missing}"

    names = dict(rule_expressions())
    for expr in names.values():
        prometheus.query(expr)  # every rule expression is valid PromQL for this Prometheus

    def rules_evaluated(_) -> bool:
        rules = prometheus.rules()
        return len(rules) == len(names) and all(
            not r.get("lastEvaluation", "0001").startswith("0001") for r in rules
        )

    prometheus.wait_for("vector(1)", timeout=10, predicate=rules_evaluated)
    rules = prometheus.rules()
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, f"rules failing in Prometheus: {bad}"
    for record in KEY_RULES:
        assert prometheus.wait_for(record, timeout=10), f"recording rule {record} has no data"

    # The dead target: up == 0, and the instance-down alert is pending (it fires after 1 m).
    alerts = prometheus.wait_for('ALERTS{alertname="TranslatorInstanceDown"}', timeout=15)
    assert alerts[0]["metric"]["alertstate"] == "pending"
    live = prometheus.query(f'up{{instance="127.0.0.1:{tiny_server.server.metrics_port}"}}')
    assert live and live[0]["value"][1] == "1"
    assert not prometheus.query('ALERTS{alertname=~"TranslatorHighErrorRate|TranslatorEngineErrors"}')


# ---- nginx --------------------------------------------------------------------------------------------


def loopback_nginx_config(
    directory: Path, upstream_ports: list[int], grpc_port: int, status_port: int
) -> Path:
    """deploy/nginx/nginx.conf with its two listen ports moved, and the compose upstream
    (upstream.compose.conf) with its DNS-resolved replica replaced by 127.0.0.1 servers."""
    directory.mkdir(parents=True, exist_ok=True)
    conf = (NGINX_DIR / "nginx.conf").read_text()
    conf, n_grpc = re.subn(r"listen 50051 http2;", f"listen 127.0.0.1:{grpc_port} http2;", conf)
    conf, n_status = re.subn(r"listen 8080;", f"listen 127.0.0.1:{status_port};", conf)
    assert n_grpc == 1 and n_status == 1, "nginx.conf listen directives changed: update this test"
    upstream = (NGINX_DIR / "upstream.compose.conf").read_text()
    upstream = re.sub(r"^\s*resolver .*$", "", upstream, flags=re.M)  # Docker's DNS
    m = re.search(r"^(\s*)server translator-replica:50051 resolve(.*);$", upstream, flags=re.M)
    assert m, "upstream.compose.conf server line changed: update this test"
    servers = "\n".join(f"{m.group(1)}server 127.0.0.1:{port}{m.group(2)};" for port in upstream_ports)
    upstream = upstream[: m.start()] + servers + upstream[m.end() :]
    (directory / "nginx.conf").write_text(conf)
    (directory / "upstream.conf").write_text(upstream)
    return directory / "nginx.conf"


class Nginx:
    def __init__(self, directory: Path, conf: Path) -> None:
        self.log_path = directory / "nginx.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            ["nginx", "-p", f"{directory}/", "-c", str(conf), "-e", "stderr", "-g", "daemon off;"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # fast shutdown of master and workers
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


def translate_ok(server) -> float:
    return server_sample(server, 'translator_requests_total{code="OK",rpc="Translate"}')


def server_sample(server, selector: str) -> float:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    name, _, rest = selector.partition("{")
    labels = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_nginx_spreads_grpc_calls_and_survives_a_dead_replica(server_process, tiny_bundle, tmp_path):
    nginx_binary = need("nginx", "nginx")
    assert nginx_binary
    servers = []
    for _ in range(2):
        metrics_port = free_port()
        p = server_process(
            {
                "TRANSLATOR_MODEL_DIR": str(tiny_bundle),
                "TRANSLATOR_METRICS_PORT": str(metrics_port),
                "TRANSLATOR_LOG_LEVEL": "WARNING",
                "TRANSLATOR_THREADS": "1",
            }
        )
        p.metrics_port = metrics_port
        servers.append(p)
    lb_port, status_port = free_port(), free_port()
    conf = loopback_nginx_config(tmp_path / "nginx", [s.port for s in servers], lb_port, status_port)
    nginx = Nginx(tmp_path / "nginx", conf)
    try:
        for s in servers:
            wait_serving(s.target, timeout=120)
        lb = f"127.0.0.1:{lb_port}"
        wait_serving(lb, timeout=20)  # health through the balancer
        texts = [f"Open file {i}" for i in range(16)]
        with TranslatorClient(servers[1].target, timeout=20) as direct:  # both serve the same bundle
            expected = [t.text for t in direct.translate(texts, max_length=4, beam_size=1)]
        assert all(expected)
        before = [translate_ok(s) for s in servers]
        with TranslatorClient(lb, timeout=20, retries=0) as c:  # one HTTP/2 connection to nginx
            for text, want in zip(texts, expected, strict=True):
                assert c.translate([text], max_length=4, beam_size=1)[0].text == want
            results = list(
                c.translate_stream([StreamItem(str(i), ["Print"], max_length=4) for i in range(4)])
            )
            assert all(r.ok for r in results) and len(results) == 4
            assert c.model_info().limits.max_texts_per_request > 0
            per_server = [translate_ok(s) - b for s, b in zip(servers, before, strict=True)]
            assert sum(per_server) == 16 and min(per_server) >= 4, f"calls per server: {per_server}"

            # Kill one replica outright: every following call still succeeds, on the other one.
            servers[0].proc.kill()
            servers[0].proc.wait(10)
            survivor_before = translate_ok(servers[1])
            for i in range(10):
                c.translate([f"Close window {i}"], max_length=4, beam_size=1)
            assert translate_ok(servers[1]) - survivor_before == 10
        assert nginx.proc.poll() is None, nginx.log_path.read_text()[-2000:]
        log = nginx.log_path.read_text()
        assert '"grpc_status":"0"' in log and "/translator.v1.Translator/Translate" in log
    finally:
        nginx.stop()
