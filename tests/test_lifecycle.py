"""The server's start and end as operators see them: the start-up log lines, a port it cannot bind (one
JSON error line and exit 1, which a container restarts, never a process left hanging after `could not
start`), a shutdown while the model still loads, and /metrics keeping stderr to JSON log lines."""

from __future__ import annotations

import asyncio
import faulthandler
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import grpc
import pytest

from client import TranslatorClient, TranslatorError
from client.load import free_port
from server.__main__ import exit_with
from tests.conftest import REPO_ROOT, RunningServer, base_config
from tests.fake_engine import FakeEngine
from tests.test_exit_watchdog import _exit as exit_in_a_child


@pytest.mark.parametrize("busy", ["metrics", "http"])
def test_a_port_in_use_exits_1_with_one_error_line(busy, fake_bundle):
    """The gRPC port is open by then: it must be closed again, or grpc.aio's poller thread keeps the
    interpreter from exiting (it did, for a /metrics port in use) or tracebacks follow the error."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = {"metrics": free_port(), "http": free_port(), busy: taken.getsockname()[1]}
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TRANSLATOR_")},
            "TRANSLATOR_MODEL_DIR": str(fake_bundle),  # never loaded: the start fails first
            "TRANSLATOR_HOST": "127.0.0.1",
            "TRANSLATOR_PORT": str(free_port()),
            "TRANSLATOR_METRICS_PORT": str(ports["metrics"]),
            "TRANSLATOR_HTTP_PORT": str(ports["http"]),
        }
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "server"],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1 and time.monotonic() - t0 < 30
    lines = [json.loads(line) for line in proc.stderr.splitlines()]  # JSON lines only: no traceback
    (error,) = [line for line in lines if line["level"] == "ERROR"]
    what = {"metrics": "/metrics", "http": "the HTTP API"}[busy]
    assert error["msg"] == (
        f"could not start: [Errno 98] cannot serve {what} on 127.0.0.1:{ports[busy]}: Address already in use"
    )


def test_scrapes_write_nothing_to_stderr(capfd):
    """Logs are JSON lines on stderr: the endpoint must not add an access-log line per scrape."""
    from server.metrics import Metrics

    metrics = Metrics(process_metrics=False)
    port = metrics.serve("127.0.0.1", 0)
    try:
        capfd.readouterr()
        for _ in range(2):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                assert b"translator_requests_total" in r.read()
        time.sleep(0.1)  # the handler thread has written whatever it writes
        assert capfd.readouterr().err == ""
    finally:
        metrics.close()
    with pytest.raises(OSError):  # closed: nothing listens any more
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


@pytest.mark.parametrize("taken", ["port", "http_port"])
def test_a_second_server_on_the_same_port_fails_to_start(start_fake_server, server_loop, fake_bundle, taken):
    """Ports are not shared (no SO_REUSEPORT): a second server given a port the first one serves fails at
    start, instead of quietly taking half of its connections."""
    first = start_fake_server(http_port=free_port())
    ports = {"port": free_port(), "http_port": free_port(), taken: getattr(first.server, taken)}
    second = RunningServer(server_loop, base_config(fake_bundle, warmup=False, **ports))
    with pytest.raises(
        (OSError, RuntimeError), match="(bind|serve the HTTP API) .*127.0.0.1:" + str(ports[taken])
    ):
        second.start(wait_ready=False)
    second.stopped = True
    with urllib.request.urlopen(f"http://127.0.0.1:{first.server.http_port}/health", timeout=10) as r:
        assert r.status == 200


def test_the_start_up_log_lines_say_what_runs(server_loop, fake_bundle, caplog):
    config = base_config(
        fake_bundle, warmup=False, http_port=free_port(), auth_token="t0ken", variant="int8", threads=3
    )
    server = RunningServer(server_loop, config)
    server.server.engine_factory = lambda bundle_dir, config: FakeEngine(step_s=0)
    with caplog.at_level(logging.INFO, logger="server"):
        server.start()
    server.stop(1)
    lines = {r.getMessage(): r.fields for r in caplog.records if hasattr(r, "fields")}
    assert lines["metrics endpoint listening"] == {"host": "127.0.0.1", "port": server.server.metrics_port}
    assert lines["gRPC server listening"] == {
        "host": "127.0.0.1",
        "port": server.server.port,
        "tls": False,
        "client_auth": False,
        "token_auth": True,
        "metrics_port": server.server.metrics_port,
        "http_port": server.server.http_port,
    }
    assert lines["loading model"] == {
        "bundle": str(fake_bundle),
        "variant": "int8",
        "device": "auto",
        "threads": 3,
    }


def test_a_shutdown_while_the_model_loads_says_so(server_loop, fake_bundle):
    """Calls during the drain delay of a server still loading its model are told it is shutting down
    (not that it is loading: they would wait for it), and it never turns SERVING."""
    gate = threading.Event()

    def slow_load(bundle_dir, config):
        gate.wait(30)
        return FakeEngine(step_s=0)

    server = RunningServer(server_loop, base_config(fake_bundle, warmup=False, drain_delay_s=1))
    server.server.engine_factory = slow_load
    server.start(wait_ready=False)
    server.stopped = True
    stopping = asyncio.run_coroutine_threadsafe(server.server.stop(5), server_loop.loop)
    try:
        with TranslatorClient(server.target, timeout=5, retries=0) as c:
            with pytest.raises(TranslatorError) as e:
                c.translate(["a"])
            assert (e.value.code, e.value.details) == (
                grpc.StatusCode.UNAVAILABLE,
                "the server is shutting down",
            )
            gate.set()  # the model arrives during the drain: too late to serve
            time.sleep(0.2)
            assert c.health() == "NOT_SERVING"
    finally:
        gate.set()
        stopping.result(30)


def test_the_default_bundle_comes_from_the_bundles_dir(server_loop, tmp_path):
    """--bundles-dir without --model-dir: the store's en-es-small is the bundle served."""
    store = tmp_path / "store"
    (store / "en-es-small").mkdir(parents=True)
    (store / "en-es-small" / "manifest.json").write_text("{}")
    seen = []
    server = RunningServer(server_loop, base_config("", bundles_dir=str(store), warmup=False))
    server.server.engine_factory = lambda bundle_dir, config: seen.append(bundle_dir) or FakeEngine(step_s=0)
    server.start()
    server.stop(1)
    assert seen == [store / "en-es-small"]


def test_the_exit_keeps_its_code_and_a_hung_teardown_ends_with_1():
    """python -m server ends with exit_with(main()): sys.exit with the code, with faulthandler armed so
    that a teardown that hangs dumps every stack and exits 1 (here in this process, the watchdog disarmed
    at once; then in a child whose teardown hangs, as tests/test_exit_watchdog.py does)."""
    try:
        with pytest.raises(SystemExit) as e:
            exit_with(3, 600.0)
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert e.value.code == 3
    hung = exit_in_a_child(0, hang=True)
    assert hung.returncode == 1 and "Timeout" in hung.stderr
