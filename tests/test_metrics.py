"""Prometheus metrics: names and units, `promtool check metrics`, and a real Prometheus scraping a
real server (skipped with a reason where the Debian binaries are absent: apt-get install prometheus)."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from client import StreamItem, TranslatorError
from tests.conftest import free_port

# Every translator_* family the server exports, with its type (docs/service.md lists the same).
EXPECTED = {
    "translator_requests": "counter",
    "translator_stream_items": "counter",
    "translator_request_duration_seconds": "histogram",
    "translator_model_duration_seconds": "histogram",
    "translator_queue_wait_seconds": "histogram",
    "translator_batch_segments": "histogram",
    "translator_batch_tokens": "histogram",
    "translator_batch_decode_seconds": "histogram",
    "translator_batch_rows": "histogram",
    "translator_decode_step_seconds": "histogram",
    "translator_decode_steps": "counter",
    "translator_time_to_first_step_seconds": "histogram",
    "translator_input_tokens": "counter",
    "translator_generated_tokens": "counter",
    "translator_segments": "counter",
    "translator_text_segments": "counter",
    "translator_requests_in_flight": "gauge",
    "translator_queue_segments": "gauge",
    "translator_queue_capacity_segments": "gauge",
    "translator_queue_tokens": "gauge",
    "translator_engine_errors": "counter",
    "translator_admission_wait_seconds": "histogram",
    "translator_admissions": "counter",
    "translator_queue_waiting_requests": "gauge",
    "translator_model_wait_seconds": "histogram",
    "translator_model_info": "gauge",
    "translator_ready": "gauge",
}


def drive_traffic(server, client_for, n: int = 3) -> None:
    """n Translate calls of two texts, one refused call, a stream of one good and one refused item,
    one GetModelInfo."""
    c = client_for(server, retries=0)
    for _ in range(n):
        assert len(c.translate(["Open the file", "Save changes?"], max_length=8)) == 2
    results = {
        r.request_id: r
        for r in c.translate_stream([StreamItem("a", ["Print"], max_length=5), StreamItem("b", [])])
    }
    assert results["a"].ok and results["b"].code == grpc.StatusCode.INVALID_ARGUMENT
    assert c.model_info().name
    with pytest.raises(TranslatorError) as e:
        c.translate([])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


def families(server) -> dict:
    return {f.name: f for f in text_string_to_metric_families(server.metrics_text())}


def test_metric_families_and_exact_values(start_server, tiny_bundle, client_for, caplog):
    """A server of the test's own (the real engine on the tiny bundle), so every value is exact: the
    counts of the traffic above, and the token counters equal to the request log lines' sums."""
    server = start_server(tiny_bundle, max_queue_segments=333)
    fams = families(server)
    exported = {n for n in fams if n.startswith("translator_") and not n.endswith("_created")}
    assert exported == set(EXPECTED)  # *_created: prometheus_client's creation times of counters
    for name, kind in EXPECTED.items():
        assert fams[name].type == kind, f"{name} is a {fams[name].type}, expected {kind}"
    assert server.sample("translator_queue_capacity_segments") == 333  # set before any traffic
    with caplog.at_level(logging.INFO, logger="server.requests"):
        drive_traffic(server, client_for)
    lines = [r.fields for r in caplog.records if r.name == "server.requests" and r.getMessage() == "request"]
    ok = [line for line in lines if line["status"] == "OK" and line["rpc"] != "GetModelInfo"]
    assert len(ok) == 4  # 3 Translate + 1 stream item

    def count(name: str, **labels: str) -> float:
        return server.sample(name, **labels)

    assert count("translator_requests_total", rpc="Translate", code="OK") == 3
    assert count("translator_requests_total", rpc="Translate", code="INVALID_ARGUMENT") == 1
    assert count("translator_requests_total", rpc="GetModelInfo", code="OK") == 1
    assert count("translator_requests_total", rpc="TranslateStream", code="OK") == 1
    assert count("translator_stream_items_total", code="OK") == 1
    assert count("translator_stream_items_total", code="INVALID_ARGUMENT") == 1
    assert count("translator_request_duration_seconds_count", rpc="Translate") == 4
    segments = sum(line["segments"] for line in ok)
    assert segments == 7
    assert count("translator_segments_total", outcome="translated") == segments
    assert count("translator_input_tokens_total") == sum(line["input_tokens"] for line in ok) > segments
    generated = sum(line["output_tokens"] for line in ok)
    assert count("translator_generated_tokens_total") == generated > segments  # tokens, not segments
    assert count("translator_queue_wait_seconds_count") == segments
    assert count("translator_time_to_first_step_seconds_count") == segments
    steps = count("translator_decode_steps_total")
    assert steps >= 8 and count("translator_batch_rows_count") == steps  # in-flight: one per step
    assert count("translator_decode_step_seconds_count") == steps
    assert count("translator_ready") == 1 and count("translator_requests_in_flight") == 0
    assert (count("translator_queue_segments"), count("translator_queue_tokens")) == (0, 0)
    assert count("translator_engine_errors_total") == 0
    assert count("translator_queue_capacity_segments") == 333
    (info,) = families(server)["translator_model_info"].samples
    assert info.value == 1
    assert {k: info.labels[k] for k in ("name", "variant", "source_language", "target_language")} == {
        "name": "tiny-test",
        "variant": "fp32",
        "source_language": "en",
        "target_language": "es",
    }
    assert info.labels["version"] and info.labels["providers"] == "CPUExecutionProvider"
    # Latency buckets span milliseconds to tens of seconds.
    bounds = {
        float(s.labels["le"])
        for s in families(server)["translator_request_duration_seconds"].samples
        if "le" in s.labels
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


def test_histograms_have_the_documented_buckets():
    """The dashboards and alerts (deploy/) read these buckets: latency 5 ms .. 60 s and the rest."""
    from server import metrics as m

    metrics = m.Metrics(process_metrics=False)
    latency = metrics.request_latency
    latency.labels(*["x"] * len(latency._labelnames)).observe(0.1)  # labelled: samples once a child exists
    metrics.for_model("x")  # the per-model histograms (label `model`): their children, with buckets
    registry = metrics.registry
    expected = {
        "translator_request_duration_seconds": m.LATENCY_BUCKETS,
        "translator_batch_decode_seconds": m.LATENCY_BUCKETS,
        "translator_queue_wait_seconds": m.QUEUE_BUCKETS,
        "translator_time_to_first_step_seconds": m.QUEUE_BUCKETS,
        "translator_batch_segments": m.BATCH_SEGMENT_BUCKETS,
        "translator_batch_rows": m.BATCH_ROW_BUCKETS,
        "translator_decode_step_seconds": m.STEP_BUCKETS,
        "translator_batch_tokens": m.BATCH_TOKEN_BUCKETS,
    }
    assert m.LATENCY_BUCKETS[0] == 0.005 and m.LATENCY_BUCKETS[-1] == 60.0
    for family in registry.collect():
        if family.name in expected:
            bounds = sorted({float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")})
            assert bounds == [*map(float, expected.pop(family.name)), float("inf")], family.name
    assert not expected  # every histogram seen


def test_text_layer_series_exist_from_the_start():
    """Both actions are exported at 0 before the first segment takes one: the dashboard's rate() by
    action needs the series to exist."""
    from server.metrics import Metrics

    samples = {
        s.labels["action"]: s.value
        for family in Metrics(process_metrics=False).registry.collect()
        for s in family.samples
        if s.name == "translator_text_segments_total"
    }
    assert samples == {"passed_through": 0.0, "repaired": 0.0, "memory": 0.0}
