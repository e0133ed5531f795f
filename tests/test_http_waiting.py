"""HTTP callers wait for capacity instead of an instant 429 or 503 (docs/service.md "Waiting for
capacity"): LibreTranslate clients such as Weblate turn a service off for 30 minutes on either. Over the
real server (HTTP port, scheduler, metrics) and the fake engine held at its gate, so a queue stays full
or a model stays loading exactly as long as a test needs. tests/test_weblate.py drives Weblate itself."""

from __future__ import annotations

import json
import socket
import threading
import time

import grpc

from client.load import free_port
from proto.gen.translator.v1 import translator_pb2 as pb
from proto.gen.translator.v1 import translator_pb2_grpc as pb_grpc
from tests.conftest import RunningServer, base_config
from tests.fake_engine import GatedEngine
from tests.http_helpers import call, upload

Q = {"source": "en", "target": "es"}


def wait_until(predicate, timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.01)


def in_background(fn, *args) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    thread.start()
    return thread, out


def full_queue_server(start_fake_server, **overrides) -> tuple[RunningServer, GatedEngine, list]:
    """A server whose queue (4 segments) is full behind one segment held in the engine at its gate.
    Returns the server, the engine and the threads holding those requests."""
    engine = GatedEngine(step_s=0)
    config = dict(batching_mode="request", max_wait_ms=0, max_batch_segments=1, max_queue_segments=4)
    config["max_texts"] = 4
    server = start_fake_server(engine, http_port=free_port(), **{**config, **overrides})
    engine.gate.clear()
    held = [in_background(call, server, "translate", {"q": "held", **Q})]
    assert engine.waiting.wait(10)
    held.append(in_background(call, server, "translate", {"q": ["a", "b", "c", "d"], **Q}))
    wait_until(lambda: server.total("translator_queue_segments") == 4)
    return server, engine, held


def test_a_full_queue_makes_http_wait_its_turn_while_grpc_is_refused(start_fake_server):
    server, engine, held = full_queue_server(start_fake_server)
    waiting = [in_background(call, server, "translate", {"q": f"w {i}", **Q}) for i in range(3)]
    wait_until(lambda: server.total("translator_queue_waiting_requests") == 3)
    # gRPC callers keep their fast RESOURCE_EXHAUSTED (they have retry policies); nor do they overtake.
    with grpc.insecure_channel(server.target) as channel:
        try:
            pb_grpc.TranslatorStub(channel).Translate(pb.TranslateRequest(texts=["grpc"]), timeout=10)
            raise AssertionError("gRPC was not refused")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    time.sleep(0.3)
    assert all(not out for _, out in waiting)  # still waiting, no 429
    engine.gate.set()
    for thread, _ in held + waiting:
        thread.join(30)
    assert [out[0][:3:2] for _, out in waiting] == [(200, {"translatedText": f"{i} w"}) for i in range(3)]
    assert server.total("translator_requests_total", code="RESOURCE_EXHAUSTED", transport="http") == 0
    assert server.total("translator_admissions_total", outcome="admitted") == 3
    assert server.total("translator_admission_wait_seconds_count") == 3
    assert server.total("translator_admission_wait_seconds_sum") >= 3 * 0.3


def test_past_the_wait_bound_or_the_line_cap_it_is_429_with_retry_after(start_fake_server):
    server, engine, held = full_queue_server(start_fake_server, http_queue_wait_s=0.5, http_queue_waiters=1)
    first = in_background(call, server, "translate", {"q": "first", **Q})
    wait_until(lambda: server.total("translator_queue_waiting_requests") == 1)
    t0 = time.monotonic()
    status, headers, body = call(server, "translate", {"q": "second", **Q})  # the line is full: at once
    assert (status, int(headers["Retry-After"]) >= 1) == (429, True) and time.monotonic() - t0 < 0.4
    first[0].join(10)
    status, headers, body = first[1][0]
    assert status == 429 and "retry" in body["error"] and int(headers["Retry-After"]) >= 1
    # A timeout_ms shorter than the wait bound ends the wait as a deadline: 504, not 429.
    t0 = time.monotonic()
    status, _, body = call(server, "translate", {"q": "hurried", **Q, "timeout_ms": 200})
    assert (status, body) == (504, {"error": "deadline exceeded"}) and time.monotonic() - t0 < 0.45
    engine.gate.set()
    for thread, _ in held:
        thread.join(30)
    assert server.total("translator_admissions_total", outcome="refused") == 1
    assert server.total("translator_admissions_total", outcome="timed_out") == 1
    assert server.total("translator_admissions_total", outcome="cancelled") == 1


def test_a_client_that_hangs_up_leaves_the_line(start_fake_server):
    server, engine, held = full_queue_server(start_fake_server)
    body = json.dumps({"q": "gone", **Q}).encode()
    with socket.create_connection(("127.0.0.1", server.server.http_port), timeout=10) as s:
        s.sendall(
            b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_until(lambda: server.total("translator_queue_waiting_requests") == 1)
    wait_until(lambda: server.total("translator_queue_waiting_requests") == 0)
    wait_until(lambda: server.total("translator_requests_total", code="CANCELLED", transport="http") == 1)
    assert server.total("translator_admissions_total", outcome="cancelled") == 1
    engine.gate.set()
    for thread, _ in held:
        thread.join(30)
    assert call(server, "translate", {"q": "after", **Q})[0] == 200


def test_files_wait_for_room_and_for_a_slot(start_fake_server):
    """/translate_file shares the mechanism: more files than may be in progress (8) wait for a slot,
    and their requests wait in line for room in the queue, instead of failing with 429."""
    server, engine, held = full_queue_server(start_fake_server, max_queue_segments=8, max_texts=8)
    uploads = [in_background(upload, server, f"f{i}.txt", f"line {i}\n") for i in range(10)]
    wait_until(lambda: len(server.server.http.file_work.active) == 8)
    time.sleep(0.3)
    assert all(not out for _, out in uploads)
    engine.gate.set()
    for thread, _ in held + uploads:
        thread.join(60)
    assert [out[0][0] for _, out in uploads] == [200] * 10
    assert server.total("translator_requests_total", code="RESOURCE_EXHAUSTED", transport="http") == 0


def test_a_model_still_loading_is_waited_for(loading_http_server):
    server, gate = loading_http_server()
    assert call(server, "health")[0] == 503  # health tells the truth: not ready yet
    thread, out = in_background(call, server, "translate", {"q": "a b", **Q})
    wait_until(lambda: server.total("translator_requests_in_flight") == 1)
    time.sleep(0.3)
    assert not out
    gate.set()
    thread.join(30)
    assert out[0][:3:2] == (200, {"translatedText": "b a"})
    assert server.total("translator_model_wait_seconds_count") == 1
    assert server.total("translator_model_wait_seconds_sum") >= 0.3


def test_a_model_that_failed_to_load_is_503_at_once(server_loop, fake_bundle):
    gate = threading.Event()

    def failing_load(bundle_dir, config):
        gate.wait(30)
        raise RuntimeError("no such graph")

    server = RunningServer(server_loop, base_config(fake_bundle, warmup=False, http_port=free_port()))
    server.server.engine_factory = failing_load
    server.start(wait_ready=False)
    try:
        thread, out = in_background(call, server, "translate", {"q": "a", **Q})
        wait_until(lambda: server.total("translator_requests_in_flight") == 1)
        gate.set()  # the load fails: the waiting request is answered now, not at the wait bound
        thread.join(5)
        assert out[0][:3:2] == (503, {"error": "the model failed to load: no such graph"})
        t0 = time.monotonic()
        assert call(server, "translate", {"q": "a", **Q})[0] == 503 and time.monotonic() - t0 < 1
    finally:
        gate.set()
        server.stop(1)
