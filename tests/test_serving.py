"""The serving side over a fake engine: gRPC handlers, streams, metrics, logs, health, drain and the
`python -m server` lifecycle, with the real TranslatorServer, scheduler and client.

The engine is tests/fake_engine.py's (it reverses words, one decoding step per output token; GatedEngine
holds its steps while a test needs requests in flight), so every count below is exact and no test
waits on ONNX Runtime. The real engine behind the same server is tests/test_service.py's."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from client import StreamItem, TranslatorClient, TranslatorError
from client.load import free_port
from proto.gen.translator.v1 import translator_pb2 as pb
from proto.gen.translator.v1 import translator_pb2_grpc as pb_grpc
from runtime.faithful.segment import MAX_TEXT_CHARS
from runtime.faithful.spans import MAX_GLOSSARY_ENTRIES
from server.contract import DecodingOptions, Hypothesis, Prepared, SegmentNote
from server.service import SERVICE_NAME
from tests.conftest import RunningServer, base_config, wait_serving
from tests.fake_engine import FakeEngine, GatedEngine

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def wait_for(predicate: Callable[[], object], timeout: float = 10, interval: float = 0.01) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def request_lines(caplog, rpc: str | None = None) -> list[dict]:
    """The `"msg": "request"` log lines' fields (of `rpc`, when given), in order."""
    return [
        r.fields
        for r in caplog.records
        if r.name == "server.requests"
        and r.getMessage() == "request"
        and (rpc is None or r.fields["rpc"] == rpc)
    ]


@pytest.fixture()
def channel_to():
    """channel_to(server) -> an insecure grpc.Channel (closed at the end): for metadata and futures,
    which the client library does not expose."""
    channels = []

    def make(server: RunningServer) -> grpc.Channel:
        channels.append(grpc.insecure_channel(server.target))
        return channels[-1]

    yield make
    for c in channels:
        c.close()


# ---- Translate and GetModelInfo ---------------------------------------------------------------------


def test_translate_returns_each_text_in_order_with_scores_on_request(start_fake_server, client_for):
    server = start_fake_server()
    c = client_for(server, retries=0)
    out = c.translate(["Open the file", "", "  Save it  "], max_length=8)
    assert [t.text for t in out] == ["file the Open", "", "  it Save  "]
    assert all(len(t.hypotheses) == 1 and t.hypotheses[0].score is None for t in out)
    (scored,) = c.translate(["Open the file"], beam_size=2, num_hypotheses=2, return_scores=True)
    want = FakeEngine(step_s=0).result("Open the file", DecodingOptions(beam_size=2, num_hypotheses=2))
    assert [(h.text, h.score) for h in scored.hypotheses] == [(h.text, pytest.approx(h.score)) for h in want]


def test_model_info_reports_the_engine_limits_and_the_settings(start_fake_server, client_for):
    engine = FakeEngine(step_s=0)
    engine.default_options = DecodingOptions(
        beam_size=4, num_hypotheses=1, length_penalty=0.6, repetition_penalty=1.2, no_repeat_ngram_size=3
    )
    server = start_fake_server(
        engine, max_texts=7, max_queue_segments=9, max_message_bytes=123_456, variant="int8"
    )
    info = client_for(server).model_info()
    assert (info.name, info.version, info.source_language, info.target_language) == (
        "fake-en-es",
        "1",
        "en",
        "es",
    )
    assert info.limits == pb.Limits(
        max_texts_per_request=7,
        max_source_tokens=64,
        max_beam_size=8,
        max_length=256,
        max_request_bytes=123_456,
        max_text_chars=MAX_TEXT_CHARS,
        max_glossary_entries=MAX_GLOSSARY_ENTRIES,
    )
    d = info.default_options
    assert (d.beam_size, d.num_hypotheses, d.max_length, d.length_penalty) == (4, 1, 0, pytest.approx(0.6))
    assert (d.repetition_penalty, d.no_repeat_ngram_size) == (pytest.approx(1.2), 3)
    assert list(info.execution_providers) == ["FakeExecutionProvider"]
    assert (info.variant, info.batching, info.batching_mode) == ("int8", True, "inflight")
    assert server.total("translator_requests_total", rpc="GetModelInfo", code="OK") == 1


@pytest.mark.parametrize(
    ("overrides", "mode"), [({"batching_mode": "request"}, "request"), ({"batching": False}, "off")]
)
def test_model_info_gives_the_batching_mode_in_effect(start_fake_server, client_for, overrides, mode):
    info = client_for(start_fake_server(**overrides)).model_info()
    assert (info.batching, info.batching_mode) == (mode != "off", mode)


def test_texts_per_request_limit_is_inclusive(start_fake_server, client_for):
    server = start_fake_server(max_texts=4)
    c = client_for(server, retries=0)
    assert len(c.translate(["a", "b", "c", "d"], max_length=2)) == 4
    with pytest.raises(TranslatorError) as e:
        c.translate(["a", "b", "c", "d", "e"], max_length=2)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        e.value.details
        == "too many texts: 5 in one request, the limit is 4; split them over several requests"
    )


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"length_penalty": float("nan")}, "length_penalty must be a number from 0 to 10"),
        ({"length_penalty": float("inf")}, "length_penalty must be a number from 0 to 10"),
        ({"length_penalty": -0.1}, "length_penalty must be a number from 0 to 10"),
        ({"length_penalty": 10.5}, "length_penalty must be a number from 0 to 10"),
        ({"repetition_penalty": 0.5}, "repetition_penalty"),
        ({"repetition_penalty": float("nan")}, "repetition_penalty"),
        ({"no_repeat_ngram_size": 17}, "no_repeat_ngram_size"),
        ({"beam_size": 9}, "beam_size=9 is above the maximum beam size 8"),
        ({"max_length": 257}, "above the model's cap of 256 tokens"),
        ({"num_hypotheses": -1}, "num_hypotheses must be >= 0"),
    ],
)
def test_invalid_options_are_refused_before_queueing(start_fake_server, client_for, options, expected):
    server = start_fake_server()
    with pytest.raises(TranslatorError) as e:
        client_for(server, retries=0).translate(["Open the file"], **options)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and expected in e.value.details
    assert server.total("translator_requests_total", rpc="Translate", code="INVALID_ARGUMENT") == 1
    assert server.total("translator_segments_total", outcome="translated") == 0
    assert server.engine.batches == [] and not any(rb.step_rows for rb in server.engine.running)


def test_edge_options_are_accepted(start_fake_server, client_for):
    c = client_for(start_fake_server(), retries=0)
    assert c.translate(["a b"], length_penalty=0.0, beam_size=8, max_length=256)[0].text == "b a"
    assert c.translate(["a b"], length_penalty=10.0, beam_size=1, max_length=1)[0].text == "b"
    assert c.translate(["a b"], repetition_penalty=1.0, no_repeat_ngram_size=16)[0].text == "b a"


def test_a_bad_glossary_is_invalid_argument(start_fake_server, client_for):
    c = client_for(start_fake_server(), retries=0)
    with pytest.raises(TranslatorError) as e:
        c.translate(["Open the file"], glossary={"file": "archivo", "FILE": "fichero"})
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "glossary" in e.value.details


def test_default_num_hypotheses_is_capped_at_a_smaller_requested_beam(start_fake_server, client_for):
    engine = FakeEngine(step_s=0)
    engine.default_options = DecodingOptions(beam_size=4, num_hypotheses=3, length_penalty=0.6)
    c = client_for(start_fake_server(engine), retries=0)
    assert c.model_info().default_options.num_hypotheses == 3
    assert [h.text for h in c.translate(["a b"])[0].hypotheses] == ["b a", "b a (1)", "b a (2)"]
    assert [h.text for h in c.translate(["a b"], beam_size=2)[0].hypotheses] == ["b a", "b a (1)"]
    assert [h.text for h in c.translate(["a b"], beam_size=1)[0].hypotheses] == ["b a"]
    with pytest.raises(TranslatorError) as e:  # an explicit n-best above the beam stays an error
        c.translate(["a b"], beam_size=2, num_hypotheses=3)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


class NotingEngine(FakeEngine):
    """A fake text layer: texts with a "!" take a second round (the text layer's retry) and come back
    with a note; the rest are the model's output as it is."""

    def finish(self, prepared: Prepared, results):
        if prepared.plan is None and any("!" in s for s in prepared.segments):
            return Prepared(list(prepared.segments), list(prepared.token_counts), prepared.options, "again")
        out = []
        for segment, hyps in zip(prepared.segments, results, strict=True):
            hyps = list(hyps or [])
            if "!" in segment:
                note = SegmentNote("repaired", 0, len(segment), "second round")
                hyps = [Hypothesis(h.text, h.score, h.tokens, (note,)) for h in hyps]
            out.append(hyps)
        if prepared.plan == "again":
            out[0] = [
                Hypothesis(prepared.segments[0], 0.0, [], (SegmentNote("passed_through", 1, 2, "kept"),))
            ]
        return out


def test_text_layer_rounds_notes_and_counts(start_fake_server, client_for, caplog):
    server = start_fake_server(NotingEngine(step_s=0.001))
    with caplog.at_level(logging.INFO, logger="server.requests"):
        out = client_for(server).translate(["Keep this!", "Open the file"], max_length=8)
    assert [t.text for t in out] == ["Keep this!", "file the Open"]
    assert [(n.action, n.start, n.end, n.reason) for n in out[0].notes] == [("passed_through", 1, 2, "kept")]
    assert out[1].notes == []
    assert server.total("translator_text_segments_total", action="passed_through") == 1
    assert server.total("translator_text_segments_total", action="repaired") == 0
    (line,) = request_lines(caplog, "Translate")
    # Two rounds of two segments (2 + 3 source tokens, 2 + 3 generated): the log adds both up.
    assert (line["texts"], line["segments"], line["input_tokens"], line["output_tokens"]) == (2, 4, 10, 10)
    assert server.total("translator_segments_total", outcome="translated") == 4


def test_repaired_notes_reach_the_proto_and_the_metric(start_fake_server, client_for):
    class Repairing(FakeEngine):
        def finish(self, prepared, results):
            note = SegmentNote("repaired", 2, 5, "span put back")
            return [[Hypothesis(h.text, h.score, h.tokens, (note,)) for h in r or []] for r in results]

    server = start_fake_server(Repairing(step_s=0))
    (t,) = client_for(server).translate(["a b"])
    assert [(n.action, n.start, n.end, n.reason) for n in t.notes] == [("repaired", 2, 5, "span put back")]
    assert server.total("translator_text_segments_total", action="repaired") == 1


def test_model_loading_answers_unavailable_everywhere(server_loop, fake_bundle, client_for, caplog):
    gate = threading.Event()

    def slow_load(bundle_dir, config) -> FakeEngine:
        gate.wait(30)
        return FakeEngine(step_s=0)

    server = RunningServer(server_loop, base_config(fake_bundle, warmup=False))
    server.server.engine_factory = slow_load
    server.start(wait_ready=False)
    caplog.set_level(logging.INFO, logger="server.requests")
    try:
        c = client_for(server, retries=0, timeout=5)
        assert c.health() == "NOT_SERVING" and c.health(SERVICE_NAME) == "NOT_SERVING"
        assert server.total("translator_ready") == 0
        for call in (lambda: c.translate(["a"]), c.model_info):
            with pytest.raises(TranslatorError) as e:
                call()
            assert e.value.code == grpc.StatusCode.UNAVAILABLE
            assert e.value.details == "the model is loading; retry shortly"
        (item,) = c.translate_stream([StreamItem("x", ["a"])])
        assert item.code == grpc.StatusCode.UNAVAILABLE
        assert server.total("translator_requests_total", rpc="GetModelInfo", code="UNAVAILABLE") == 1
        (info,) = [line for line in request_lines(caplog) if line["rpc"] == "GetModelInfo"]
        assert (info["status"], info["error"]) == ("UNAVAILABLE", "the model is loading; retry shortly")
    finally:
        gate.set()
    try:
        server.wait_ready(30)
        assert c.health() == "SERVING" and server.total("translator_ready") == 1
        assert server.total("translator_queue_capacity_segments") == 1024
    finally:
        server.stop(1)


# ---- metrics: exact counts on a server of the test's own ---------------------------------------------


def test_request_metrics_count_exactly(start_fake_server, client_for):
    server = start_fake_server(batching_mode="request", max_wait_ms=0, max_queue_segments=77)
    c = client_for(server, retries=0)
    for _ in range(3):
        # "Open the file" -> 3 tokens, "Save changes?" -> 2: 5 source and 5 generated tokens a request.
        assert [t.text for t in c.translate(["Open the file", "Save changes?"], max_length=8)] == [
            "file the Open",
            "changes? Save",
        ]
    c.translate(["one two three four"], max_length=2)  # generation cut at 2 tokens
    with pytest.raises(TranslatorError):
        c.translate([])
    list(c.translate_stream([StreamItem("a", ["Print it"], max_length=5), StreamItem("b", [])]))
    c.model_info()

    def v(metric: str, **labels: str) -> float:
        return server.total(metric, **labels)

    assert v("translator_requests_total", rpc="Translate", code="OK", transport="grpc") == 4
    assert v("translator_requests_total", rpc="Translate", code="INVALID_ARGUMENT", transport="grpc") == 1
    assert v("translator_requests_total", rpc="TranslateStream", code="OK", transport="grpc") == 1
    assert v("translator_requests_total", rpc="GetModelInfo", code="OK", transport="grpc") == 1
    assert v("translator_stream_items_total", code="OK") == 1
    assert v("translator_stream_items_total", code="INVALID_ARGUMENT") == 1
    assert v("translator_request_duration_seconds_count", rpc="Translate") == 5  # errors included
    assert v("translator_request_duration_seconds_count", rpc="TranslateStream") == 2  # per item
    assert v("translator_request_duration_seconds_count", rpc="GetModelInfo") == 0
    assert v("translator_input_tokens_total") == 3 * 5 + 4 + 2
    assert v("translator_generated_tokens_total") == 3 * 5 + 2 + 2
    assert v("translator_segments_total", outcome="translated") == 3 * 2 + 1 + 1
    assert v("translator_queue_wait_seconds_count") == 8
    assert v("translator_batch_segments_count") == 5 and v("translator_batch_segments_sum") == 8
    assert v("translator_batch_tokens_sum") == 3 * 5 + 4 + 2
    assert v("translator_batch_decode_seconds_count") == 5
    # Request mode: steps from the engine's stats (each batch runs to its longest budget).
    assert v("translator_decode_steps_total") == 3 * 8 + 2 + 5
    assert v("translator_batch_rows_count") == 3 * 8 + 2 + 5
    assert v("translator_decode_step_seconds_count") == 3 * 8 + 2 + 5
    assert 0 < v("translator_decode_step_seconds_sum") <= v("translator_batch_decode_seconds_sum")
    # Each step observed at its batch's mean rows (beam 4 x running segments): the sum is every row-step.
    assert v("translator_batch_rows_sum") == 3 * 8 * 4 * 2 + 2 * 4 + 5 * 4
    assert v("translator_time_to_first_step_seconds_count") == 8
    assert v("translator_queue_capacity_segments") == 77
    assert (v("translator_queue_segments"), v("translator_queue_tokens")) == (0, 0)
    assert (
        v("translator_requests_in_flight"),
        v("translator_ready"),
        v("translator_engine_errors_total"),
    ) == (0, 1, 0)
    labels = dict(
        name="fake-en-es",
        version="1",
        variant="fp32",
        source_language="en",
        target_language="es",
        providers="FakeExecutionProvider",
    )
    assert v("translator_model_info", **labels) == 1


def test_an_engine_without_batch_stats_serves_in_request_mode(start_fake_server, client_for):
    """`last_stats` is an optional extra of server.engine.Engine: an engine without it serves, and
    only the step metrics stay empty."""

    class NoStats(FakeEngine):
        def __getattribute__(self, name: str):
            if name == "last_stats":
                raise AttributeError(name)
            return super().__getattribute__(name)

    server = start_fake_server(NoStats(step_s=0), batching_mode="request", max_wait_ms=0)
    assert client_for(server, retries=0).translate(["a b"], max_length=3)[0].text == "b a"
    assert server.total("translator_batch_segments_count") == 1
    assert server.total("translator_decode_steps_total") == server.total("translator_batch_rows_count") == 0


def test_inflight_metrics_count_steps_rows_and_first_steps(start_fake_server, client_for):
    server = start_fake_server(batching_mode="inflight")
    c = client_for(server, retries=0)
    t0 = time.monotonic()
    c.translate(["Open the file"], beam_size=2, max_length=4)  # 4 steps of 2 rows
    c.translate(["Print"], beam_size=1, max_length=3)  # 3 steps of 1 row
    assert 0 < server.total("translator_time_to_first_step_seconds_sum") < time.monotonic() - t0
    assert server.total("translator_decode_steps_total") == 7
    assert (
        server.total("translator_batch_rows_count") == 7 and server.total("translator_batch_rows_sum") == 11
    )
    assert server.total("translator_time_to_first_step_seconds_count") == 2
    assert server.total("translator_decode_step_seconds_count") == 7
    assert 0 < server.total("translator_decode_step_seconds_sum") < time.monotonic() - t0
    assert server.total("translator_batch_segments_count") == 2  # one admission each
    assert server.total("translator_generated_tokens_total") == 3 + 1
    assert server.total("translator_input_tokens_total") == 3 + 1


def test_queue_gauges_follow_waiting_segments(start_fake_server, channel_to, caplog):
    engine = GatedEngine(step_s=0)
    server = start_fake_server(engine, batching_mode="request", max_wait_ms=0)
    stub = pb_grpc.TranslatorStub(channel_to(server))
    engine.gate.clear()
    opts = pb.DecodingOptions(max_length=2)
    running = stub.Translate.future(pb.TranslateRequest(texts=["a b c"], options=opts), timeout=30)
    assert wait_for(engine.waiting.is_set)
    queued = stub.Translate.future(pb.TranslateRequest(texts=["d e", "f g h i"], options=opts), timeout=30)
    also = stub.Translate.future(pb.TranslateRequest(texts=["j k l m"], options=opts), timeout=30)
    assert wait_for(lambda: server.total("translator_queue_segments") == 3)
    assert server.total("translator_queue_tokens") == 2 + 4 + 4
    assert server.total("translator_requests_in_flight") == 3
    time.sleep(0.2)
    with caplog.at_level(logging.INFO, logger="server.requests"):
        engine.gate.set()
        assert [t.hypotheses[0].text for t in queued.result(30).translations] == ["e d", "i h"]
        assert also.result(30).translations[0].hypotheses[0].text == "m l"
        assert wait_for(lambda: len(request_lines(caplog)) == 3)
    waited = {line["input_tokens"]: line["queue_ms"] for line in request_lines(caplog)}
    assert waited[6] >= 150 and waited[4] >= 150  # the two queued requests waited the 0.2 s
    assert running.result(30).translations[0].hypotheses[0].text == "c b"
    assert wait_for(lambda: server.total("translator_requests_in_flight") == 0)
    assert (server.total("translator_queue_segments"), server.total("translator_queue_tokens")) == (0, 0)


# ---- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["request", "inflight"])
def test_engine_failure_is_internal_and_counted(start_fake_server, client_for, caplog, mode):
    server = start_fake_server(FakeEngine(step_s=0.001, fail_on="boom"), batching_mode=mode)
    c = client_for(server, retries=0)
    with caplog.at_level(logging.INFO, logger="server.requests"), pytest.raises(TranslatorError) as e:
        c.translate(["boom"])
    assert e.value.code == grpc.StatusCode.INTERNAL
    assert e.value.details == "translation failed: fake engine failure on 'boom'"
    (line,) = request_lines(caplog, "Translate")
    assert line["status"] == "INTERNAL" and line["error"] == e.value.details
    assert server.total("translator_engine_errors_total") == 1
    assert server.total("translator_requests_total", rpc="Translate", code="INTERNAL") == 1
    assert server.total("translator_segments_total", outcome="failed") == 1
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="server.scheduler"):
        (item,) = c.translate_stream([StreamItem("item-9", ["boom"])])
    assert item.code == grpc.StatusCode.INTERNAL and item.message == e.value.details
    # The scheduler's error line names the request (its x-request-id, or here the stream item's id).
    (failed,) = [r for r in caplog.records if r.name == "server.scheduler" and r.levelno == logging.ERROR]
    if mode == "request":
        assert (failed.getMessage(), failed.fields["id"]) == (
            "engine failed on a batch of 1 segments",
            "item-9",
        )
    else:
        assert failed.getMessage() == "engine failed on request item-9 alone"
    assert "fake engine failure on 'boom'" in failed.exc_text or failed.exc_info
    assert server.total("translator_engine_errors_total") == 2
    assert server.total("translator_stream_items_total", code="INTERNAL") == 1
    assert c.translate(["still serving"], max_length=3)[0].text == "serving still"


def test_an_unexpected_error_in_a_handler_is_internal(start_fake_server, client_for, caplog):
    class Broken(FakeEngine):
        def prepare(self, texts, options, glossary=None, **kwargs):
            raise RuntimeError("prepare exploded")

    server = start_fake_server(Broken(step_s=0))
    c = client_for(server, retries=0)
    with caplog.at_level(logging.INFO, logger="server.requests"):
        with pytest.raises(TranslatorError) as e:
            c.translate(["a"])
        (item,) = c.translate_stream([StreamItem("s", ["a"])])
    assert e.value.code == grpc.StatusCode.INTERNAL and e.value.details == "internal error: prepare exploded"
    assert item.code == grpc.StatusCode.INTERNAL and item.message == "internal error: prepare exploded"
    assert server.total("translator_requests_total", rpc="Translate", code="INTERNAL") == 1
    assert server.total("translator_stream_items_total", code="INTERNAL") == 1
    assert server.total("translator_requests_in_flight") == 0
    assert [line["status"] for line in request_lines(caplog)] == ["INTERNAL", "INTERNAL"]


def status_details(error: grpc.RpcError, kind: type) -> list:
    """The google.rpc details of type `kind` in an error's status (grpc-status-details-bin trailer)."""
    status = rpc_status.from_call(error)
    assert status is not None, "no google.rpc.Status in the trailers"
    assert status.code == error.code().value[0] and status.message == error.details()
    found = []
    for detail in status.details:
        if detail.Is(kind.DESCRIPTOR):
            found.append(kind())
            detail.Unpack(found[-1])
    return found


def test_invalid_argument_names_the_field_as_a_bad_request(start_fake_server, channel_to):
    server = start_fake_server()
    stub = pb_grpc.TranslatorStub(channel_to(server))
    cases = {
        "options.beam_size": pb.TranslateRequest(texts=["a"], options=pb.DecodingOptions(beam_size=99)),
        "options.length_penalty": pb.TranslateRequest(
            texts=["a"], options=pb.DecodingOptions(length_penalty=-1)
        ),
        "texts": pb.TranslateRequest(texts=[]),
        "texts[1]": pb.TranslateRequest(texts=["ok", "w " * 65]),
        "target_language": pb.TranslateRequest(texts=["a"], target_language="xx"),
        "glossary[0].source": pb.TranslateRequest(texts=["a"], glossary=[pb.GlossaryEntry(target="b")]),
    }
    for field, request in cases.items():
        with pytest.raises(grpc.RpcError) as e:
            stub.Translate(request, timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        (bad,) = status_details(e.value, error_details_pb2.BadRequest)
        assert [(v.field, v.description) for v in bad.field_violations] == [(field, e.value.details())]
    with pytest.raises(grpc.RpcError) as e:  # bytes that are no request at all: no field to name
        channel_to(server).unary_unary("/translator.v1.Translator/Translate")(b"\xff\xff", timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and rpc_status.from_call(e.value) is None


def test_text_over_the_limit_from_the_text_layer_is_invalid_argument(start_fake_server, client_for):
    # FakeEngine.prepare refuses a text over its 64 tokens, as Engine.prepare does one over 20,000 chars.
    server = start_fake_server()
    with pytest.raises(TranslatorError) as e:
        client_for(server, retries=0).translate(["ok", "w " * 65])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details == "texts[1] has 65 source tokens, over the limit of 64"
    assert client_for(server).translate(["w " * 64], max_length=1)[0].text == "w "


def test_queue_full_is_resource_exhausted_with_a_retry_hint(start_fake_server, channel_to, client_for):
    engine = GatedEngine(step_s=0)
    server = start_fake_server(
        engine, batching_mode="request", max_wait_ms=0, max_queue_segments=4, max_texts=4
    )
    stub = pb_grpc.TranslatorStub(channel_to(server))
    engine.gate.clear()
    opts = pb.DecodingOptions(max_length=2)
    running = stub.Translate.future(pb.TranslateRequest(texts=["a"], options=opts), timeout=30)
    assert wait_for(engine.waiting.is_set)
    queued = stub.Translate.future(pb.TranslateRequest(texts=["b", "c", "d"], options=opts), timeout=30)
    assert wait_for(lambda: server.total("translator_queue_segments") == 3)
    with pytest.raises(grpc.RpcError) as e:
        stub.Translate(pb.TranslateRequest(texts=["e", "f"], options=opts), timeout=10)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    hint = int(dict(e.value.trailing_metadata())["retry-after-ms"])
    assert hint == 150  # nothing measured yet: 50 ms a queued segment, at least 100 ms (test_retry_hints.py)
    (retry,) = status_details(e.value, error_details_pb2.RetryInfo)  # the same wait, the standard way
    assert retry.retry_delay.ToMilliseconds() == hint
    assert e.value.details() == f"server busy: 3 segments queued (capacity 4); retry in about {hint} ms"
    c = client_for(server, retries=0)
    (item,) = c.translate_stream([StreamItem("full", ["e", "f"])])
    assert item.code == grpc.StatusCode.RESOURCE_EXHAUSTED and item.retry_after_ms == hint
    last = stub.Translate.future(pb.TranslateRequest(texts=["g"], options=opts), timeout=30)  # just fits
    assert wait_for(lambda: server.total("translator_queue_segments") == 4)
    engine.gate.set()
    for call in (running, queued, last):
        assert call.result(30).translations
    assert server.total("translator_requests_total", rpc="Translate", code="RESOURCE_EXHAUSTED") == 1
    assert server.total("translator_stream_items_total", code="RESOURCE_EXHAUSTED") == 1


# ---- request ids and log lines ---------------------------------------------------------------------


def test_x_request_id_names_the_request_in_its_log_line(start_fake_server, channel_to, caplog):
    server = start_fake_server()
    stub = pb_grpc.TranslatorStub(channel_to(server))
    request = pb.TranslateRequest(texts=["Open the file", "Print"], options=pb.DecodingOptions(max_length=8))
    with caplog.at_level(logging.INFO, logger="server.requests"):
        stub.Translate(request, metadata=[("x-request-id", "req-42")], timeout=10)
        stub.Translate(request, metadata=[("x-request-id", "x" * 100)], timeout=10)
        stub.Translate(request, timeout=10)
        stub.Translate(request, metadata=[("x-request-id", "")], timeout=10)
        with pytest.raises(grpc.RpcError):
            stub.Translate(pb.TranslateRequest(), metadata=[("x-request-id", "bad-1")], timeout=10)
        stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=[("x-request-id", "info-1")], timeout=10)
    lines = request_lines(caplog)
    assert [line["id"] for line in lines[:2]] == ["req-42", "x" * 64]
    generated = [lines[2]["id"], lines[3]["id"]]
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in generated) and generated[0] != generated[1]
    ok = lines[0]
    assert (ok["rpc"], ok["status"], ok["texts"], ok["segments"]) == ("Translate", "OK", 2, 2)
    assert (ok["input_tokens"], ok["output_tokens"]) == (4, 4)
    assert ok["queue_ms"] >= 0 and ok["decode_ms"] > 0 and ok["ms"] >= ok["decode_ms"]
    assert "error" not in ok
    bad = lines[4]
    assert (bad["id"], bad["status"]) == ("bad-1", "INVALID_ARGUMENT")
    assert bad["error"] == "texts is empty: send at least one text to translate"
    assert (lines[5]["id"], lines[5]["rpc"], lines[5]["status"]) == ("info-1", "GetModelInfo", "OK")


# ---- TranslateStream -------------------------------------------------------------------------------


def test_stream_answers_as_items_finish_and_logs_the_call(start_fake_server, channel_to, caplog):
    server = start_fake_server(FakeEngine(step_s=0.005))
    stub = pb_grpc.TranslatorStub(channel_to(server))
    requests = [
        pb.TranslateStreamRequest(
            request_id="long", texts=["a b c"], options=pb.DecodingOptions(max_length=150)
        ),
        pb.TranslateStreamRequest(
            request_id="short", texts=["d e"], options=pb.DecodingOptions(max_length=2)
        ),
        pb.TranslateStreamRequest(request_id="bad", texts=[]),
        pb.TranslateStreamRequest(texts=["f g"], options=pb.DecodingOptions(max_length=2)),  # no id
    ]
    with caplog.at_level(logging.INFO, logger="server.requests"):
        answers = list(
            stub.TranslateStream(iter(requests), metadata=[("x-request-id", "call-7")], timeout=30)
        )
        assert wait_for(lambda: any(r.getMessage() == "stream" for r in caplog.records))
    order = [a.request_id for a in answers]
    assert sorted(order) == ["", "bad", "long", "short"] and order[-1] == "long"  # finish order
    by_id = {a.request_id: a for a in answers}
    assert by_id["short"].status.code == 0 and by_id["short"].translations[0].hypotheses[0].text == "e d"
    assert by_id["long"].translations[0].hypotheses[0].text == "c b a"
    assert (
        by_id["bad"].status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        and not by_id["bad"].translations
    )
    assert by_id["bad"].status.message == "texts is empty: send at least one text to translate"
    items = {line["id"]: line for line in request_lines(caplog, "TranslateStream")}
    assert set(items) == {"long", "short", "bad", "-"}
    assert all(line["call"] == "call-7" for line in items.values())
    assert items["bad"]["status"] == "INVALID_ARGUMENT" and items["long"]["status"] == "OK"
    assert items["long"]["output_tokens"] == 3 and items["long"]["segments"] == 1
    (stream,) = [r.fields for r in caplog.records if r.getMessage() == "stream"]
    assert (stream["id"], stream["rpc"], stream["status"], stream["items"]) == (
        "call-7",
        "TranslateStream",
        "OK",
        4,
    )
    assert stream["ms"] >= 150 * 5 and "error" not in stream
    assert server.total("translator_requests_total", rpc="TranslateStream", code="OK") == 1
    assert server.total("translator_stream_items_total", code="OK") == 3
    assert server.total("translator_stream_items_total", code="INVALID_ARGUMENT") == 1


def test_stream_item_timeout_ms_is_its_own_deadline(start_fake_server, client_for):
    server = start_fake_server(FakeEngine(step_s=0.01))
    items = [
        StreamItem("slow", ["one two three"], max_length=200, timeout_ms=300),  # 200 steps of 10 ms
        StreamItem("quick", ["four five"], max_length=2, timeout_ms=20_000),
        StreamItem("bad", ["six"], timeout_ms=-1),
    ]
    t0 = time.monotonic()
    results = {r.request_id: r for r in client_for(server, retries=0).translate_stream(items, timeout=30)}
    elapsed = time.monotonic() - t0
    assert results["slow"].code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert results["slow"].message == "deadline exceeded" and not results["slow"].translations
    assert results["quick"].ok and results["quick"].translations[0].text == "five four"
    assert results["bad"].code == grpc.StatusCode.INVALID_ARGUMENT
    assert results["bad"].message == "timeout_ms must be >= 0, got -1"
    assert elapsed < 1.9, "the item ran to its end: timeout_ms was ignored"
    assert wait_for(lambda: server.total("translator_segments_total", outcome="dropped_deadline") == 1)
    assert server.total("translator_stream_items_total", code="DEADLINE_EXCEEDED") == 1
    assert server.total("translator_requests_total", rpc="TranslateStream", code="OK") == 1


def test_stream_call_deadline_bounds_items_with_a_longer_timeout_ms(start_fake_server, client_for):
    server = start_fake_server(FakeEngine(step_s=0.01))
    c = client_for(server, retries=0)
    t0 = time.monotonic()
    try:  # the item's deadline is the call's: the item or the call ends DEADLINE_EXCEEDED, whichever first
        (item,) = c.translate_stream(
            [StreamItem("slow", ["a b"], max_length=200, timeout_ms=60_000)], timeout=0.4
        )
        code = item.code
    except TranslatorError as e:
        code = e.code
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - t0 < 1.9
    assert wait_for(lambda: server.total("translator_segments_total", outcome="dropped_deadline") == 1, 3)


def test_stream_flow_control_stops_reading_at_max_stream_inflight(start_fake_server, client_for):
    engine = GatedEngine(step_s=0)
    server = start_fake_server(engine, max_stream_inflight=4)
    engine.gate.clear()
    sent: list[int] = []

    def items():
        for i in range(12):
            sent.append(i)
            yield StreamItem(f"s{i}", [f"word{i} two"], max_length=2)

    results: list = []
    reader = threading.Thread(target=lambda: results.extend(client_for(server).translate_stream(items())))
    reader.start()
    try:
        assert wait_for(lambda: len(sent) == 12), "the client could not send every item"
        assert wait_for(lambda: server.total("translator_requests_in_flight") == 4)
        time.sleep(0.3)
        assert server.total("translator_requests_in_flight") == 4, "the server read past the limit"
        assert server.total("translator_queue_segments") + len(server.server.scheduler.strategy.running) == 4
    finally:
        engine.gate.set()
        reader.join(30)
    assert sorted(r.request_id for r in results) == sorted(f"s{i}" for i in range(12))
    assert all(r.ok for r in results)
    assert server.total("translator_stream_items_total", code="OK") == 12


def test_client_cancelling_a_stream_cancels_its_items(start_fake_server, channel_to, caplog):
    engine = GatedEngine(step_s=0)
    server = start_fake_server(engine)
    stub = pb_grpc.TranslatorStub(channel_to(server))
    engine.gate.clear()
    release = threading.Event()

    def requests():
        yield pb.TranslateStreamRequest(
            request_id="a", texts=["a b"], options=pb.DecodingOptions(max_length=2)
        )
        release.wait(30)

    with caplog.at_level(logging.INFO, logger="server.requests"):
        call = stub.TranslateStream(requests(), timeout=30)
        assert wait_for(engine.waiting.is_set)
        call.cancel()
        assert wait_for(
            lambda: server.total("translator_requests_total", rpc="TranslateStream", code="CANCELLED") == 1
        )
        assert server.total("translator_stream_items_total", code="CANCELLED") == 1
    engine.gate.set()  # the worker reaches the next step boundary, where the cancelled row leaves
    release.set()
    assert wait_for(lambda: server.total("translator_segments_total", outcome="dropped_cancelled") == 1)
    assert server.total("translator_segments_total", outcome="translated") == 0
    assert server.total("translator_requests_in_flight") == 0
    (stream,) = [r.fields for r in caplog.records if r.getMessage() == "stream"]
    assert (stream["status"], stream["items"], stream["error"]) == ("CANCELLED", 1, "cancelled by client")
    (item,) = request_lines(caplog, "TranslateStream")
    assert (item["id"], item["status"], item["error"]) == ("a", "CANCELLED", "cancelled by client")
    assert server.total("translator_request_duration_seconds_count", rpc="TranslateStream") == 1


# ---- cancellation and deadlines in flight -------------------------------------------------------------


@pytest.mark.parametrize("mode", ["request", "inflight"])
def test_client_deadline_mid_decode_drops_the_rows_at_the_next_step(start_fake_server, client_for, mode):
    engine = FakeEngine(step_s=0.01)
    server = start_fake_server(engine, batching_mode=mode, max_wait_ms=0)
    c = client_for(server, retries=0)
    with pytest.raises(TranslatorError) as e:
        c.translate(["a b c", "d e f", "g h i"], max_length=250, timeout=0.3)  # 2.5 s of decoding
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert wait_for(lambda: server.total("translator_segments_total", outcome="dropped_deadline") == 3, 2)
    # The client's deadline ends its call at once; the server's handler records it a moment later.
    assert wait_for(
        lambda: server.total("translator_requests_total", rpc="Translate", code="DEADLINE_EXCEEDED") == 1, 2
    )
    assert server.total("translator_segments_total", outcome="translated") == 0
    if mode == "inflight":
        (batch,) = engine.running
        assert wait_for(lambda: len(batch) == 0, 2) and sorted(batch.dropped) == [0, 1, 2]
        assert len(batch.step_rows) < 150, "the rows ran on after the deadline"
    else:
        ((texts, _),) = engine.batches
        assert texts == ["a b c", "d e f", "g h i"]
        assert engine.last_stats["steps"] < 150, "the rows ran on after the deadline"
    assert c.translate(["Print"], max_length=2)[0].text == "Print"


# ---- health, drain and grace ----------------------------------------------------------------------------


def test_drain_reports_not_serving_then_refuses_while_in_flight_requests_finish(
    start_fake_server, channel_to, server_loop
):
    engine = GatedEngine(step_s=0)
    # A drain delay long enough for the checks below on a loaded CI machine (1.5 s was not, once).
    server = start_fake_server(engine, drain_delay_s=4, shutdown_grace_s=30)
    channel = channel_to(server)
    stub, health = pb_grpc.TranslatorStub(channel), health_pb2_grpc.HealthStub(channel)
    watch = health.Watch(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=30)
    seen: list[int] = []

    def read_watch() -> None:
        seen.extend(r.status for r in watch)  # ends (OK) when the server stops taking RPCs

    watcher = threading.Thread(target=read_watch, daemon=True)
    watcher.start()
    assert wait_for(lambda: seen == [SERVING])
    engine.gate.clear()
    held = stub.Translate.future(
        pb.TranslateRequest(texts=["held words"], options=pb.DecodingOptions(max_length=2))
    )
    assert wait_for(engine.waiting.is_set)

    server.stopped = True
    stopping = asyncio.run_coroutine_threadsafe(server.server.stop(30), server_loop.loop)
    # The drain delay: NOT_SERVING for the load balancers, but RPCs are still served.
    assert wait_for(lambda: NOT_SERVING in seen, 1)
    for service in ("", SERVICE_NAME):
        assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status == NOT_SERVING
    assert server.total("translator_ready") == 0
    assert stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5).name == "fake-en-es"

    # Then new RPCs are refused while the held one is still decoding.
    def refused() -> bool:
        try:
            stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=2)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE
            return True
        return False

    assert wait_for(refused, 10, 0.05)
    watcher.join(5)  # the Watch stream ended by itself: the grace period is the held request's
    assert not watcher.is_alive() and watch.code() == grpc.StatusCode.OK
    assert not held.done() and not stopping.done()
    engine.gate.set()
    assert held.result(30).translations[0].hypotheses[0].text == "words held"
    stopping.result(30)
    assert seen == [SERVING, NOT_SERVING]


def test_grace_expiry_ends_what_is_still_running(start_fake_server, channel_to, server_loop, caplog):
    engine = GatedEngine(step_s=0)
    server = start_fake_server(engine, shutdown_grace_s=0.5)
    stub = pb_grpc.TranslatorStub(channel_to(server))
    engine.gate.clear()
    held = stub.Translate.future(
        pb.TranslateRequest(texts=["held"], options=pb.DecodingOptions(max_length=2))
    )
    assert wait_for(engine.waiting.is_set)
    server.stopped = True
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="server.requests"):
        stopping = asyncio.run_coroutine_threadsafe(server.server.stop(), server_loop.loop)  # config's grace
        error = held.exception(10)
        ended = time.monotonic() - t0
        assert error is not None and error.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
        assert 0.4 <= ended < 3.0
        engine.gate.set()
        stopping.result(30)
    (line,) = request_lines(caplog, "Translate")
    assert (line["status"], line["error"]) == ("CANCELLED", "cut at the end of the shutdown grace period")


def test_stop_twice_waits_for_the_first(start_fake_server, server_loop):
    server = start_fake_server(drain_delay_s=0.3)
    server.stopped = True
    first = asyncio.run_coroutine_threadsafe(server.server.stop(1), server_loop.loop)
    time.sleep(0.05)
    second = asyncio.run_coroutine_threadsafe(server.server.stop(1), server_loop.loop)
    second.result(10)
    assert first.done()


# ---- python -m server: signals, exit statuses ---------------------------------------------------------


class MainRun:
    """`server.__main__.main(argv)` in this (the main) thread, so that its signal handlers work, with a
    fake engine; `script(target)` runs beside it in a thread (and must end the server: signals)."""

    def __init__(self, monkeypatch, capsys, bundle) -> None:
        from server.config import ServerConfig, env_name

        for name in ServerConfig.__dataclass_fields__:
            monkeypatch.delenv(env_name(name), raising=False)
        self.monkeypatch, self.capsys, self.bundle = monkeypatch, capsys, bundle
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"

    def __call__(
        self, engine_factory, script: Callable[[str], None] | None, *args: str
    ) -> tuple[int, list[dict]]:
        import server.app
        from server.__main__ import main

        self.monkeypatch.setattr(server.app, "default_engine_factory", engine_factory)
        errors: list[BaseException] = []

        def run_script() -> None:
            try:
                script(self.target)
            except BaseException as e:  # noqa: BLE001 - reported below, after main() returns
                errors.append(e)
                os.kill(os.getpid(), signal.SIGTERM)  # never leave main() waiting: drain...
                time.sleep(0.5)
                os.kill(os.getpid(), signal.SIGTERM)  # ...and stop now

        thread = threading.Thread(target=run_script, daemon=True) if script else None
        if thread:
            thread.start()
        argv = ["--model-dir", str(self.bundle), "--host", "127.0.0.1", "--port", str(self.port)]
        code = main([*argv, "--metrics-port", "-1", "--no-warmup", "--log-level", "INFO", *args])
        for sig in (signal.SIGTERM, signal.SIGINT):  # asyncio put the defaults back: keep the test run safe
            signal.signal(sig, lambda signum, frame: None)
        if thread:
            thread.join(30)
        if errors:
            raise errors[0]
        lines = [
            json.loads(line) for line in self.capsys.readouterr().err.splitlines() if line.startswith("{")
        ]
        return code, lines


@pytest.fixture()
def main_run(monkeypatch, capsys, fake_bundle):
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    # main() installs its own handlers while it runs; outside it (before, or once it has returned, e.g. on
    # a settings error), a signal meant for it must not end the test run.
    previous = {
        sig: signal.signal(sig, lambda signum, frame: None) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    yield MainRun(monkeypatch, capsys, fake_bundle)
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    root.handlers[:] = handlers
    root.setLevel(level)


def held_request(target: str, engine: GatedEngine):
    """A Translate call held mid-decode by the closed gate: (channel, future)."""
    channel = grpc.insecure_channel(target)
    engine.gate.clear()
    held = pb_grpc.TranslatorStub(channel).Translate.future(
        pb.TranslateRequest(texts=["held words"], options=pb.DecodingOptions(max_length=2)), timeout=60
    )
    assert wait_for(engine.waiting.is_set)
    return channel, held


def test_main_sigterm_drains_and_exits_0(main_run):
    engine = GatedEngine(step_s=0)
    result: dict = {}

    def script(target: str) -> None:
        wait_serving(target, 30)
        channel, held = held_request(target, engine)
        os.kill(os.getpid(), signal.SIGTERM)
        with TranslatorClient(target, timeout=2, retries=0) as c:
            assert wait_for(lambda: c.health() == "NOT_SERVING", 5)  # drain delay: still answering
        time.sleep(0.2)
        result["held_done_while_draining"] = held.done()
        engine.gate.set()
        result["text"] = held.result(30).translations[0].hypotheses[0].text
        channel.close()

    code, lines = main_run(lambda d, c: engine, script, "--drain-delay-s", "1", "--shutdown-grace-s", "30")
    assert code == 0
    assert result == {"held_done_while_draining": False, "text": "words held"}
    msgs = [line["msg"] for line in lines]
    assert "received SIGTERM: draining" in msgs and "stopped" in msgs
    (shutting,) = [line for line in lines if line["msg"] == "shutting down"]
    assert (shutting["grace_s"], shutting["drain_delay_s"]) == (30.0, 1.0)
    (request,) = [line for line in lines if line["msg"] == "request"]
    assert request["status"] == "OK"


def refusing(target: str) -> bool:
    """Whether the server at `target` refuses new RPCs (UNAVAILABLE): it is draining or gone."""
    with grpc.insecure_channel(target) as channel:
        try:
            pb_grpc.TranslatorStub(channel).GetModelInfo(pb.GetModelInfoRequest(), timeout=2)
        except grpc.RpcError as e:
            return e.code() == grpc.StatusCode.UNAVAILABLE
    return False


def test_main_second_signal_stops_at_once(main_run):
    engine = GatedEngine(step_s=0)
    result: dict = {}

    def script(target: str) -> None:
        wait_serving(target, 30)
        channel, held = held_request(target, engine)
        os.kill(os.getpid(), signal.SIGTERM)  # drain, with 60 s of grace
        assert wait_for(lambda: refusing(target), 5)
        time.sleep(0.3)
        assert not held.done()
        t0 = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)  # again: stop now
        try:
            error = held.exception(5)
        except grpc.FutureTimeoutError:
            error = None
        result["ended_s"] = time.monotonic() - t0
        result["code"] = error.code() if error else None
        engine.gate.set()
        channel.close()

    t0 = time.monotonic()
    code, lines = main_run(lambda d, c: engine, script, "--shutdown-grace-s", "60")
    assert code == 0 and time.monotonic() - t0 < 30
    assert result["code"] in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
    assert result["ended_s"] < 5
    assert "received SIGINT again: stopping now" in [line["msg"] for line in lines]


def test_main_grace_expiry_exits_0(main_run):
    engine = GatedEngine(step_s=0)
    result: dict = {}

    def script(target: str) -> None:
        wait_serving(target, 30)
        channel, held = held_request(target, engine)
        t0 = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        error = held.exception(10)
        result["ended_s"] = time.monotonic() - t0
        result["code"] = error.code() if error else None
        engine.gate.set()
        channel.close()

    code, _ = main_run(lambda d, c: engine, script, "--shutdown-grace-s", "0.5")
    assert code == 0
    assert result["code"] in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
    assert 0.4 <= result["ended_s"] < 3


def test_main_exits_1_when_the_model_fails_to_load(main_run):
    def broken(bundle_dir, config):
        raise RuntimeError("bad weights")

    t0 = time.monotonic()
    code, lines = main_run(broken, None)
    assert code == 1 and time.monotonic() - t0 < 20
    (error,) = [line for line in lines if line["level"] == "ERROR"]
    assert error["msg"] == "model failed to load" and error["error"] == "bad weights" and "exc" in error


def test_main_exits_1_without_a_bundle(main_run, tmp_path):
    main_run.bundle = tmp_path / "missing"
    code, lines = main_run(lambda d, c: FakeEngine(), None)
    assert code == 1
    (error,) = [line for line in lines if line["level"] == "ERROR"]
    assert error["msg"].startswith("could not start: ") and "missing" in error["msg"]


def test_main_serves_what_the_flags_say(main_run):
    engine = FakeEngine(step_s=0)
    seen: dict = {}

    def factory(bundle_dir, config):
        seen["config"] = config
        return engine

    def script(target: str) -> None:
        wait_serving(target, 30)
        with TranslatorClient(target, timeout=10) as c:
            info = c.model_info()
            seen["info"] = (info.variant, info.batching_mode, info.limits.max_texts_per_request)
        os.kill(os.getpid(), signal.SIGTERM)

    code, lines = main_run(
        factory, script, "--variant", "int8", "--batching-mode", "request", "--max-texts", "5"
    )
    assert code == 0
    assert seen["info"] == ("int8", "request", 5)
    assert (seen["config"].variant, seen["config"].max_texts) == ("int8", 5)
    (ready,) = [line for line in lines if line["msg"] == "model ready; serving"]
    assert (ready["name"], ready["version"], ready["batching_mode"], ready["batching"]) == (
        "fake-en-es",
        "1",
        "request",
        True,
    )
    assert (ready["providers"], ready["max_source_tokens"], ready["threads"]) == (
        ["FakeExecutionProvider"],
        64,
        None,
    )
    assert ready["load_seconds"] >= 0
    (listening,) = [line for line in lines if line["msg"] == "gRPC server listening"]
    assert (listening["port"], listening["tls"], listening["metrics_port"]) == (
        int(main_run.port),
        False,
        None,
    )


def test_bearer_credentials_parsing():
    from server.auth import bearer_credentials

    assert bearer_credentials(b"Bearer abc") == b"abc"
    assert bearer_credentials(b"bEaReR   abc") == b"abc"  # one or more spaces
    # blanks around the token are dropped, by gRPC and HTTP alike (one rule, server/auth.py)
    assert bearer_credentials(b"Bearer \tabc \t") == b"abc"
    assert bearer_credentials(b"Bearer") is None and bearer_credentials(b"Basic abc") is None
    assert bearer_credentials(b"Bearerabc") is None


@pytest.mark.parametrize(("on_cuda", "rows"), [(False, 64), (True, 512)])
def test_running_rows_default_to_64_on_cpu_and_512_on_cuda(start_fake_server, on_cuda, rows):
    engine = FakeEngine(step_s=0)
    engine.on_cuda = on_cuda
    server = start_fake_server(engine, max_running_rows=0)
    assert server.server.scheduler.strategy.max_running_rows == rows
    assert (
        start_fake_server(FakeEngine(step_s=0), max_running_rows=7).server.scheduler.strategy.max_running_rows
        == 7
    )


def test_a_failed_request_counts_its_queued_segments_as_failed(start_fake_server, client_for):
    """One segment per batch: the first segment's batch fails, and the request's segments still queued
    leave with it, counted as failed too (never translated)."""
    server = start_fake_server(
        FakeEngine(step_s=0.001, fail_on="boom"), batching_mode="request", max_batch_segments=1, max_wait_ms=0
    )
    with pytest.raises(TranslatorError) as e:
        client_for(server, retries=0).translate(["boom", "fine words", "more words"], max_length=3)
    assert e.value.code == grpc.StatusCode.INTERNAL
    assert server.total("translator_segments_total", outcome="failed") == 3
    assert server.total("translator_segments_total", outcome="translated") == 0
