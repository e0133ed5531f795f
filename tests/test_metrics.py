"""Prometheus metrics: names and units, `promtool check metrics`, and a real Prometheus scraping a
real server (skipped with a reason where the Debian binaries are absent: apt-get install prometheus)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from client import StreamItem
from tests.conftest import free_port

EXPECTED = {
    "translator_requests": "counter",
    "translator_stream_items": "counter",
    "translator_request_duration_seconds": "histogram",
    "translator_queue_wait_seconds": "histogram",
    "translator_batch_segments": "histogram",
    "translator_batch_tokens": "histogram",
    "translator_batch_decode_seconds": "histogram",
    "translator_input_tokens": "counter",
    "translator_generated_tokens": "counter",
    "translator_segments": "counter",
    "translator_text_segments": "counter",
    "translator_requests_in_flight": "gauge",
    "translator_queue_segments": "gauge",
    "translator_queue_tokens": "gauge",
    "translator_engine_errors": "counter",
    "translator_model_info": "gauge",
    "translator_ready": "gauge",
}


def drive_traffic(server, client_for, n: int = 3) -> None:
    c = client_for(server, retries=0)
    for _ in range(n):
        c.translate(["Open the file", "Save changes?"], max_length=8)
    list(c.translate_stream([StreamItem("a", ["Print"], max_length=5), StreamItem("b", [])]))
    c.model_info()
    try:
        c.translate([])
    except Exception:
        pass


def families(server) -> dict:
    return {f.name: f for f in text_string_to_metric_families(server.metrics_text())}


def test_metric_families_and_values(tiny_server, client_for):
    drive_traffic(tiny_server, client_for)
    fams = families(tiny_server)
    for name, kind in EXPECTED.items():
        assert name in fams, f"missing metric {name}"
        assert fams[name].type == kind, f"{name} is a {fams[name].type}, expected {kind}"
    assert tiny_server.sample("translator_requests_total", rpc="Translate", code="OK") >= 3
    assert tiny_server.sample("translator_requests_total", rpc="Translate", code="INVALID_ARGUMENT") >= 1
    assert tiny_server.sample("translator_requests_total", rpc="GetModelInfo", code="OK") >= 1
    assert tiny_server.sample("translator_requests_total", rpc="TranslateStream", code="OK") >= 1
    assert tiny_server.sample("translator_stream_items_total", code="OK") >= 1
    assert tiny_server.sample("translator_stream_items_total", code="INVALID_ARGUMENT") >= 1
    assert tiny_server.sample("translator_input_tokens_total") > 0
    assert tiny_server.sample("translator_generated_tokens_total") > 0
    assert tiny_server.sample("translator_ready") == 1
    assert tiny_server.sample("translator_requests_in_flight") == 0
    assert tiny_server.sample("translator_queue_segments") == 0
    info = [s for s in fams["translator_model_info"].samples]
    assert len(info) == 1 and info[0].value == 1
    assert info[0].labels["name"] == "tiny-test" and info[0].labels["version"]
    # Latency buckets span milliseconds to tens of seconds.
    bounds = {
        float(s.labels["le"]) for s in fams["translator_request_duration_seconds"].samples if "le" in s.labels
    }
    assert min(bounds) <= 0.01 and max(b for b in bounds if b != float("inf")) >= 30


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)"
)
def test_promtool_check_metrics(tiny_server, client_for):
    drive_traffic(tiny_server, client_for, 1)
    text = tiny_server.metrics_text()
    proc = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr


def _get_json(url: str, timeout: float = 5) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


@pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus not installed (apt-get install prometheus)"
)
def test_prometheus_scrapes_the_server(tiny_server, client_for, tmp_path):
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: translator\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{tiny_server.server.metrics_port}']\n"
    )
    log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(base + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("prometheus did not become ready in 30 s")
        drive_traffic(tiny_server, client_for, 3)
        expected = tiny_server.sample("translator_requests_total", rpc="Translate", code="OK")

        def query(expr: str) -> list:
            data = _get_json(base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
            assert data["status"] == "success", data
            return data["data"]["result"]

        value = None
        end = time.monotonic() + 30
        while time.monotonic() < end:
            result = query('translator_requests_total{rpc="Translate",code="OK"}')
            if result and float(result[0]["value"][1]) >= expected:
                value = float(result[0]["value"][1])
                break
            time.sleep(0.5)
        assert value is not None and value >= expected, "Prometheus never saw the server's request counter"
        targets = _get_json(base + "/api/v1/targets")["data"]["activeTargets"]
        assert targets and targets[0]["health"] == "up"
        assert query("translator_batch_segments_count")
        assert query("translator_model_info")[0]["metric"]["name"] == "tiny-test"
        assert query("histogram_quantile(0.5, sum by (le) (translator_request_duration_seconds_bucket))")
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
