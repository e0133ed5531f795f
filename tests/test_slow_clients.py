"""Slow and silent HTTP clients (issue 33): a thousand connections that send nothing, or a request head
byte by byte, leave /health and gRPC answering, and every one is closed within the header timeout;
idle keep-alive connections within the keep-alive timeout; a body that does not arrive gets 408; past
the connection cap a new connection gets 503 and is closed. Short timeouts (2 s) keep this quick."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client.load import free_port

TIMEOUT_S = 2.0  # header, keep-alive and body timeouts of these servers
SLACK_S = 5.0  # timers, and the server sharing this process (GIL) on a loaded 2-core machine (3.6 s
# over the timeout was seen with two training runs beside the suite)
TRICKLE = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 4096  # a head that never ends


@pytest.fixture()
def slow_server(start_fake_server):
    return start_fake_server(
        None,
        http_port=free_port(),
        http_header_timeout_s=TIMEOUT_S,
        http_keepalive_timeout_s=TIMEOUT_S,
        http_body_timeout_s=TIMEOUT_S,
        http_max_connections=1100,
    )


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setblocking(False)
    return s


def health_answers(server) -> None:
    url = f"http://127.0.0.1:{server.server.http_port}/health"
    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.status == 200 and json.loads(r.read()) == {"status": "SERVING"}
    with grpc.insecure_channel(server.target) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert check.status == health_pb2.HealthCheckResponse.SERVING


def catch(function, *args) -> BaseException | None:
    try:
        function(*args)
    except BaseException as e:  # reported by the test's thread
        return e
    return None


def watch_until_closed(
    socks: dict[int, socket.socket], opened: dict[int, float], trickle: set[int], limit_s: float
) -> tuple[dict[int, float], dict[int, bytes]]:
    """Trickle one byte a quarter second on the `trickle` sockets and read what every socket gets, until
    the server has closed them all or `limit_s` passes: ({index: seconds from open to close}, {index:
    bytes received}). poll, not select: the descriptors go past 1023."""
    closed: dict[int, float] = {}
    answers = {i: b"" for i in socks}
    sent = dict.fromkeys(trickle, 0)
    by_fd = {s.fileno(): i for i, s in socks.items()}
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    deadline = time.monotonic() + limit_s
    last_trickle = 0.0

    def close(i: int) -> None:
        closed[i] = time.monotonic() - opened[i]
        poller.unregister(socks[i].fileno())

    while len(closed) < len(socks) and time.monotonic() < deadline:
        if time.monotonic() - last_trickle >= 0.25:
            last_trickle = time.monotonic()
            for i in trickle - closed.keys():
                try:
                    socks[i].send(TRICKLE[sent[i] : sent[i] + 1])
                    sent[i] += 1
                except OSError:  # reset or broken pipe: the server closed it
                    close(i)
        for fd, _ in poller.poll(50):
            i = by_fd[fd]
            if i in closed:
                continue
            try:
                data = socks[i].recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            answers[i] += data
            if not data:
                close(i)
    return closed, answers


def test_a_thousand_silent_or_byte_by_byte_connections_are_all_closed_in_time(slow_server):
    port = slow_server.server.http_port
    socks, opened = {}, {}
    try:
        for i in range(1000):
            socks[i] = connect(port)
            opened[i] = time.monotonic()
        trickle = set(range(1, 1000, 2))
        # /health and gRPC asked while the 1,000 are open, from a thread: the loop below must see each
        # close when it happens.
        during: list[BaseException | None] = []
        checker = threading.Thread(target=lambda: during.append(catch(health_answers, slow_server)))
        checker.start()
        closed, _ = watch_until_closed(socks, opened, trickle, limit_s=TIMEOUT_S + SLACK_S + 10)
        checker.join(30)
        assert during == [None], during
        assert len(closed) == 1000, f"{1000 - len(closed)} connections still open"
        worst = max(closed.values())
        assert worst <= TIMEOUT_S + SLACK_S, f"the slowest was closed after {worst:.1f} s"
        health_answers(slow_server)
        assert slow_server.server.http.guard.open == 0
    finally:
        for s in socks.values():
            s.close()


def test_idle_keepalive_connections_and_slow_bodies_are_closed(slow_server):
    port = slow_server.server.http_port
    socks, opened = {}, {}
    try:
        for i in range(40):
            socks[i] = connect(port)
            if i % 2:  # a complete request, then silence: keep-alive
                socks[i].send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            else:  # headers, then a body that never comes
                socks[i].send(
                    b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000\r\n\r\n{"
                )
            opened[i] = time.monotonic()
        closed, answers = watch_until_closed(socks, opened, set(), limit_s=2 * TIMEOUT_S + SLACK_S + 10)
        assert len(closed) == len(socks)
        for i, answer in answers.items():
            if i % 2:
                assert answer.startswith(b"HTTP/1.1 200") and closed[i] <= TIMEOUT_S + SLACK_S, (i, closed[i])
            else:
                # 408 at the body timeout, then up to HttpLimits.lingering_s (2 s) reading what follows
                assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
                assert b"did not arrive within 2 s" in answer
                assert closed[i] <= TIMEOUT_S + 2.0 + SLACK_S, (i, closed[i])
    finally:
        for s in socks.values():
            s.close()


def test_connections_past_the_cap_get_503_and_are_closed(start_fake_server):
    server = start_fake_server(None, http_port=free_port(), http_max_connections=5, http_header_timeout_s=30)
    port = server.server.http_port
    held = [connect(port) for _ in range(5)]
    try:
        deadline = time.monotonic() + 10
        while server.server.http.guard.open < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
            answer = b""
            while chunk := extra.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and b"too many open connections (5)" in body
        assert server.server.http.guard.refused == 1
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 10
    while server.server.http.guard.open and time.monotonic() < deadline:
        time.sleep(0.02)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        assert r.status == 200  # room again once they are gone


SERVE_WITH_1024_FILES = """
import asyncio, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
from server.app import TranslatorServer
from server.logs import setup_logging
from tests.conftest import base_config
from tests.fake_engine import FakeEngine

async def main():
    setup_logging("INFO")
    config = base_config(sys.argv[1], port=int(sys.argv[2]), http_port=int(sys.argv[3]), metrics_port=-1,
                         warmup=False, http_header_timeout_s=float(sys.argv[4]))
    server = TranslatorServer(config, engine_factory=lambda bundle, cfg: FakeEngine(step_s=0.001))
    await server.start()
    await server.wait_ready(30)
    print("READY", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_past_the_open_file_limit_http_refuses_and_grpc_keeps_answering(tmp_path):
    """`ulimit -n 1024` and 1,100 idle HTTP connections used to leave no descriptor for anything (gRPC
    calls failed, asyncio logged 316,415 ERROR lines in 50 s): now the cap (half the limit) refuses the
    rest with 503, gRPC answers, nothing is logged at ERROR, and the held ones are closed in time."""
    import subprocess
    import sys

    from proto.gen.translator.v1 import translator_pb2 as pb
    from proto.gen.translator.v1 import translator_pb2_grpc as pb_grpc
    from tests.conftest import REPO_ROOT

    # Long enough for all 1,100 to connect (the accept backlog) before the first ones are closed.
    header_timeout_s = 8.0
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "manifest.json").write_text("{}\n")
    grpc_port, http_port = free_port(), free_port()
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                SERVE_WITH_1024_FILES,
                str(tmp_path / "bundle"),
                str(grpc_port),
                str(http_port),
                str(header_timeout_s),
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    socks: list[socket.socket] = []
    try:
        assert proc.stdout.readline().strip() == "READY", log_path.read_text()[-2000:]
        for _ in range(1100):
            socks.append(connect(http_port))
        refused = 0
        deadline = time.monotonic() + 10
        pending = list(socks)
        while pending and time.monotonic() < deadline:  # the refused ones answer 503 and close
            select.select([], [], [], 0.2)
            still = []
            for s in pending:
                try:
                    data = s.recv(4096)
                except BlockingIOError:
                    still.append(s)
                    continue
                refused += data.startswith(b"HTTP/1.1 503")
            pending = still
            if refused >= 1100 - 512:
                break
        assert refused == 1100 - 512, refused  # the cap: half of 1024
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert check.status == health_pb2.HealthCheckResponse.SERVING
            answer = pb_grpc.TranslatorStub(channel).Translate(pb.TranslateRequest(texts=["a b"]), timeout=10)
            assert answer.translations[0].hypotheses[0].text == "b a"
        deadline = time.monotonic() + header_timeout_s + SLACK_S + 5
        while time.monotonic() < deadline:  # the held ones go at the header timeout: room again
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("/health never answered 200 again")
    finally:
        for s in socks:
            s.close()
        proc.kill()
        proc.wait(10)
    errors = [line for line in log_path.read_text().splitlines() if '"level": "ERROR"' in line]
    assert not errors, errors[:3]


def test_a_tls_client_that_never_finishes_its_handshake_is_closed_in_time(start_fake_server, tmp_path):
    """With TLS the connection protocol only starts after the handshake: the handshake has the header
    timeout too (asyncio's default was 60 s, uncounted by the connection cap)."""
    from tests.test_service import make_pki

    pki = make_pki(tmp_path)
    server = start_fake_server(
        None,
        http_port=free_port(),
        http_header_timeout_s=TIMEOUT_S,
        tls_cert=str(pki["server_pem"]),
        tls_key=str(pki["server_key"]),
    )
    socks = {i: connect(server.server.http_port) for i in range(20)}
    opened = dict.fromkeys(socks, time.monotonic())
    try:
        closed, _ = watch_until_closed(socks, opened, set(range(0, 20, 2)), limit_s=TIMEOUT_S + SLACK_S + 10)
        assert len(closed) == 20 and max(closed.values()) <= TIMEOUT_S + SLACK_S, closed
    finally:
        for s in socks.values():
            s.close()
