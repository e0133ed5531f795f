"""Fuzzing the request path against a real server with the shipped model (hypothesis): any text of any
Unicode category and any option values get OK or a clear client error, never INTERNAL or UNKNOWN; the
server keeps serving, and a well-formed client running alongside gets exactly its quiet-run answers.

The HTTP API gets the same treatment from raw sockets (tests/http_fuzz.py): JSON of every shape and
depth, forms, multipart bodies whole and broken, hostile headers, malformed HTTP, and gettext catalogs of
every shape for /translate_file; never a 500 and never a traceback in the log, a well-behaved HTTP client
beside it gets its quiet-run answers, and the process's open descriptors and RSS come back.

    make fuzz                                   # FUZZ_EXAMPLES=10000 by default
    FUZZ_EXAMPLES=200 python -m pytest tests/test_fuzz.py
"""

from __future__ import annotations

import os
import threading

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client.load import free_port
from proto.gen.translator.v1 import translator_pb2 as pb
from proto.gen.translator.v1 import translator_pb2_grpc as pb_grpc
from tests import http_fuzz
from tests.conftest import wait_serving

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
# Answers a client can get for what it sent; anything else (INTERNAL, UNKNOWN) is a server defect.
CLIENT_CODES = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}
VICTIM_TEXTS = ["Open the file", "Delete %1 selected images?", "Could not save the document %s."]

texts = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)),  # protobuf strings are UTF-8: no lone surrogates
    max_size=120,
)
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from([0.0, 0.6, 1.0, 10.0, 10.01, 650.0, 1e30, -1.0]),
)


@st.composite
def requests(draw) -> pb.TranslateRequest:
    options = pb.DecodingOptions(
        beam_size=draw(st.integers(-3, 12)),
        num_hypotheses=draw(st.integers(-2, 10)),
        max_length=draw(st.sampled_from([0, 0, 0, 1, 5, 40, 256, 257, -1, 100_000])),
        return_scores=draw(st.booleans()),
    )
    if draw(st.booleans()):
        options.length_penalty = draw(floats)
    if draw(st.booleans()):
        options.repetition_penalty = draw(floats)
    if draw(st.booleans()):
        options.no_repeat_ngram_size = draw(st.integers(-2, 20))
    glossary = [
        pb.GlossaryEntry(source=s, target=t) for s, t in draw(st.lists(st.tuples(texts, texts), max_size=3))
    ]
    return pb.TranslateRequest(
        texts=draw(st.lists(texts, min_size=0, max_size=4)), options=options, glossary=glossary
    )


class Victim(threading.Thread):
    """A well-formed client sending the same texts over and over while the fuzzer runs."""

    def __init__(self, stub: pb_grpc.TranslatorStub, want: list[str]) -> None:
        super().__init__(daemon=True)
        self.stub, self.want = stub, want
        self.stop = threading.Event()
        self.answers: list[list[str] | str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                r = self.stub.Translate(pb.TranslateRequest(texts=VICTIM_TEXTS), timeout=60)
                self.answers.append([t.hypotheses[0].text for t in r.translations])
            except grpc.RpcError as e:
                self.answers.append(f"{e.code().name}: {e.details()}")


@pytest.fixture(scope="module")
def stub(shipped_server):
    channel = grpc.insecure_channel(shipped_server.target)
    yield pb_grpc.TranslatorStub(channel)
    channel.close()


def test_fuzzed_requests_never_break_the_server_or_a_well_formed_client(stub):
    quiet = [
        t.hypotheses[0].text for t in stub.Translate(pb.TranslateRequest(texts=VICTIM_TEXTS)).translations
    ]
    victim = Victim(stub, quiet)
    victim.start()
    seen: dict[str, int] = {}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=EXAMPLES <= 200,
        suppress_health_check=list(HealthCheck),
    )
    @given(request=requests())
    def fuzz(request: pb.TranslateRequest) -> None:
        try:
            response = stub.Translate(request, timeout=30)
            code = grpc.StatusCode.OK
            assert len(response.translations) == len(request.texts)
            for text, t in zip(request.texts, response.translations, strict=True):
                assert t.hypotheses, text
                if not text.strip():
                    assert t.hypotheses[0].text == text
        except grpc.RpcError as e:
            code = e.code()
            assert code in CLIENT_CODES, (code, e.details(), request)
            assert e.details(), code
        seen[code.name] = seen.get(code.name, 0) + 1

    try:
        fuzz()
    finally:
        victim.stop.set()
        victim.join(120)
    assert victim.answers and all(a == quiet for a in victim.answers), victim.answers[:3]
    assert seen.get("OK", 0) > 0 and seen.get("INVALID_ARGUMENT", 0) > 0, seen
    again = [
        t.hypotheses[0].text for t in stub.Translate(pb.TranslateRequest(texts=VICTIM_TEXTS)).translations
    ]
    assert again == quiet


# ---- the HTTP API --------------------------------------------------------------------------------------


@pytest.fixture()
def http_fuzz_server(server_process, shipped_bundle):
    """`python -m server` with the shipped model behind the HTTP port, in a process of its own (its RSS,
    descriptors and log are the server's alone, not hypothesis's), with short timeouts (a fuzzed
    Content-Length larger than the body waits for the body timeout) and a small download store (what it
    keeps is no leak; full, it answers 503)."""
    http_port = free_port()
    process = server_process(
        {
            "TRANSLATOR_MODEL_DIR": str(shipped_bundle),
            "TRANSLATOR_HTTP_PORT": str(http_port),
            "TRANSLATOR_METRICS_PORT": str(free_port()),
            "TRANSLATOR_HTTP_BODY_TIMEOUT_S": "2",
            "TRANSLATOR_HTTP_HEADER_TIMEOUT_S": "2",
            "TRANSLATOR_DOWNLOAD_STORE_BYTES": str(1024 * 1024),
            "TRANSLATOR_AUTH_TOKEN": http_fuzz.TOKEN,
        }
    )
    wait_serving(process.target, timeout=180)
    return process, http_port


def test_fuzzed_http_requests_never_break_the_server_or_a_well_formed_client(http_fuzz_server):
    server, port = http_fuzz_server
    quiet = http_fuzz.victim_answer(port)
    seen: dict[int, int] = {}

    def check(request: bytes) -> None:
        status, body = http_fuzz.send(port, request)
        assert status is not None, ("no answer", request[:300])
        assert status != 500 and status in http_fuzz.CLIENT_STATUSES, (status, body[:300], request[:300])
        if status >= 400 and status != 404 and not request.startswith(b"HEAD "):  # HEAD: no body
            assert body.startswith(b'{"error": "'), (status, body[:200])
        seen[status] = seen.get(status, 0) + 1

    def run(examples: int) -> None:
        @settings(
            max_examples=examples,
            deadline=None,
            derandomize=EXAMPLES <= 200,
            suppress_health_check=list(HealthCheck),
        )
        @given(request=http_fuzz.http_requests())
        def fuzz(request: bytes) -> None:
            check(request)

        fuzz()

    # Warm-up: what the first requests of each shape allocate once (ONNX Runtime's arenas, the allocator's
    # high-water marks) is no leak; the resources are measured after it.
    http_fuzz.heavy_warmup(port)
    run(min(EXAMPLES, 100))
    start = http_fuzz.settled_resources(server.proc.pid, {"fds": 0})
    victim = http_fuzz.HttpVictim(port, quiet)
    victim.start()
    try:
        run(EXAMPLES)
    finally:
        victim.stop.set()
        victim.join(120)
    end = http_fuzz.settled_resources(server.proc.pid, start)
    assert server.proc.poll() is None, "the server died"
    lines = server.log_lines()
    tracebacks = [line for line in lines if "exc" in line or line.get("level") in ("ERROR", "CRITICAL")]
    assert not tracebacks, tracebacks[:3]
    assert victim.answers and all(a == quiet for a in victim.answers), victim.answers[:3]
    assert seen.get(200, 0) > 0 and seen.get(400, 0) > 0 and seen.get(403, 0) > 0, seen
    http_500 = [line for line in lines if line.get("http_status") == 500]
    assert not http_500, http_500[:3]
    assert end["fds"] <= start["fds"], (start, end)
    assert end["rss_mb"] <= start["rss_mb"] + http_fuzz.RSS_SLACK_MB, (start, end)
    assert http_fuzz.victim_answer(port) == quiet
    statuses = dict(sorted(seen.items()))
    print(f"HTTP fuzz: {sum(seen.values())} requests, statuses {statuses}; server {start} -> {end}")
