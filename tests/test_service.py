"""The gRPC service end to end: real servers on 127.0.0.1, real engine and bundles, real clients."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import StreamItem, TLSError, TranslatorClient, TranslatorError
from proto.gen.translator.v1 import translator_pb2 as pb
from proto.gen.translator.v1 import translator_pb2_grpc as pb_grpc
from tests.conftest import RunningServer, base_config, wait_serving

SENTENCES = [
    "Open the file",
    "Save changes to the document before closing?",
    "Do you want to continue?",
    "The file could not be found.",
    "Print the current page",
    "Delete the selected items",
    "Check for updates",
    "Connection to the server failed.",
    "Show hidden files",
    "Create a new folder",
    "Enter your password",
    "Restart the application to apply the changes.",
]
# Tiny random model: decodes to max_length, so this keeps the engine busy for seconds.
LONG = dict(beam_size=8, max_length=256)
# 32 distinct texts (the text layer decodes a text repeated within one request once).
LONG_TEXTS = [
    f"{s[:-1]} {w}{s[-1]}" if s[-1] in ".?" else f"{s} {w}"
    for w in ("now", "again", "today", "here")
    for s in SENTENCES[:8]
]


def wait_for(predicate, timeout: float = 10, interval: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


# ---- shipped model, end to end ----------------------------------------------------------------------


def test_translate(shipped_server, client_for):
    c = client_for(shipped_server)
    texts = ["Open the file", "", "  Save changes to the document?  "]
    out = c.translate(texts)
    assert len(out) == 3
    assert out[0].text.strip() and out[0].text != texts[0]
    assert out[1].text == ""
    assert out[2].text.startswith("  ") and out[2].text.endswith("  ") and out[2].text.strip()
    assert all(len(t.hypotheses) == 1 and t.hypotheses[0].score is None for t in out)

    nbest = c.translate(["Do you want to continue?"], beam_size=4, num_hypotheses=3, return_scores=True)[0]
    scores = [h.score for h in nbest.hypotheses]
    assert len(scores) == 3 and all(s is not None and s <= 0 for s in scores)
    assert scores == sorted(scores, reverse=True)
    greedy = c.translate(["Do you want to continue?"], beam_size=1, length_penalty=0.0)[0]
    assert greedy.text.strip()


# Golden outputs of the shipped model (deterministic: same bundle, same translations). When the model or
# the text layer changes on purpose, look at the new translations and rewrite the file with
#   TRANSLATOR_REFRESH_GOLDEN=1 python -m pytest tests/test_service.py -k golden
GOLDEN = Path(__file__).parent / "golden" / "en-es-small.json"
GOLDEN_TEXTS = [
    *SENTENCES,
    "",
    "  Save changes to the document?  ",
    "Copy %s to %s",
    "<b>Warning:</b> disk full",
    "Save _As...",  # a menu accelerator moves to the translation
    "_OK",
]


def golden_key(bundle: Path) -> dict:
    """What the outputs depend on besides the code: the weights and the decoding defaults."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    return {
        "weights_sha256": manifest["source_checkpoint"]["weights_sha256"],
        "decoding": manifest["decoding"],
    }


def golden_outputs(c: TranslatorClient) -> dict:
    nbest = c.translate(["Do you want to continue?"], beam_size=4, num_hypotheses=3, return_scores=True)[0]
    return {
        "default": [t.text for t in c.translate(GOLDEN_TEXTS)],
        "greedy": [t.text for t in c.translate(SENTENCES[:4], beam_size=1, length_penalty=0.0)],
        "nbest": [h.text for h in nbest.hypotheses],
        # Rounded: the int8 weights move scores by far more, other CPUs' float sums by far less.
        "nbest_scores": [round(h.score, 3) for h in nbest.hypotheses],
    }


def check_golden(variant: str, got: dict, bundle: Path) -> None:
    key = golden_key(bundle)
    data = json.loads(GOLDEN.read_text(encoding="utf-8")) if GOLDEN.exists() else {}
    if os.environ.get("TRANSLATOR_REFRESH_GOLDEN"):
        data = data if data.get("model") == key else {"model": key}
        data[variant] = got
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        return
    assert data.get("model") == key, (
        f"the shipped model changed since {GOLDEN.name} was written: check its translations, then refresh "
        "with TRANSLATOR_REFRESH_GOLDEN=1 python -m pytest tests/test_service.py -k golden"
    )
    assert got == data[variant], f"{variant} translations differ from {GOLDEN.name}"


def test_shipped_model_golden_translations(shipped_server, shipped_bundle, client_for):
    check_golden("fp32", golden_outputs(client_for(shipped_server)), shipped_bundle)


def test_int8_variant_server_golden_translations(start_server, shipped_bundle, client_for):
    """A server started with --variant int8 serves the int8 weights (their translations, not fp32's)."""
    server = start_server(shipped_bundle, variant="int8")
    c = client_for(server)
    assert c.model_info().variant == "int8"
    assert server.sample("translator_model_info", variant="int8") == 1
    got = golden_outputs(c)
    check_golden("int8", got, shipped_bundle)
    if not os.environ.get("TRANSLATOR_REFRESH_GOLDEN"):
        fp32 = json.loads(GOLDEN.read_text(encoding="utf-8"))["fp32"]
        assert got != fp32, "int8 and fp32 agree on every golden text: the int8 check proves nothing"


def test_translate_stream(shipped_server, client_for):
    c = client_for(shipped_server)
    items = [StreamItem(f"r{i}", [s]) for i, s in enumerate(SENTENCES[:5])]
    items.insert(2, StreamItem("bad-beam", ["Open the file"], beam_size=99))
    items.insert(4, StreamItem("empty", []))
    results = {r.request_id: r for r in c.translate_stream(items)}
    assert set(results) == {i.request_id for i in items}
    assert results["bad-beam"].code == grpc.StatusCode.INVALID_ARGUMENT
    assert "beam_size=99" in results["bad-beam"].message
    assert results["empty"].code == grpc.StatusCode.INVALID_ARGUMENT
    unary = c.translate(SENTENCES[:5])
    for i in range(5):
        r = results[f"r{i}"]
        assert r.ok and len(r.translations) == 1
        assert r.translations[0].text == unary[i].text


def test_get_model_info(shipped_server, client_for):
    info = client_for(shipped_server).model_info()
    assert info.name and info.version
    assert (info.source_language, info.target_language) == ("en", "es")
    assert info.limits.max_texts_per_request == shipped_server.config.max_texts
    assert info.limits.max_source_tokens > 0 and info.limits.max_beam_size >= 1 and info.limits.max_length > 0
    assert info.default_options.beam_size >= 1 and info.default_options.num_hypotheses >= 1
    assert info.default_options.HasField("length_penalty")
    assert "CPUExecutionProvider" in info.execution_providers
    assert info.variant == "fp32" and info.batching


def test_health_and_reflection(shipped_server):
    from google.protobuf.descriptor_pb2 import FileDescriptorProto
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha import reflection_pb2 as rpb
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(shipped_server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "translator.v1.Translator"):
            r = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert r.status == health_pb2.HealthCheckResponse.SERVING
        db = ProtoReflectionDescriptorDatabase(channel)
        services = set(db.get_services())
        assert {"translator.v1.Translator", "grpc.health.v1.Health"} <= services
        service = DescriptorPool(db).FindServiceByName("translator.v1.Translator")
        methods = {m.name for m in service.methods}
        assert methods == {"Translate", "TranslateStream", "GetModelInfo", "ListModels"}

        # A grpc.reflection.v1 client (grpcurl and most tools try v1 first). v1 and v1alpha messages are
        # the same on the wire, so grpcio-reflection's v1alpha classes encode the v1 protocol.
        v1 = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=rpb.ServerReflectionRequest.SerializeToString,
            response_deserializer=rpb.ServerReflectionResponse.FromString,
        )
        listed, translator, reflection_v1 = list(
            v1(
                iter(
                    [
                        rpb.ServerReflectionRequest(list_services=""),
                        rpb.ServerReflectionRequest(file_containing_symbol="translator.v1.Translator"),
                        rpb.ServerReflectionRequest(
                            file_containing_symbol="grpc.reflection.v1.ServerReflection"
                        ),
                    ]
                ),
                timeout=10,
            )
        )
        assert {s.name for s in listed.list_services_response.service} == {
            "translator.v1.Translator",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        }

        def files(response) -> list[FileDescriptorProto]:
            assert not response.HasField("error_response"), response.error_response
            protos = response.file_descriptor_response.file_descriptor_proto
            return [FileDescriptorProto.FromString(b) for b in protos]

        (translator_file,) = [f for f in files(translator) if f.package == "translator.v1"]
        (rpcs,) = [s.method for s in translator_file.service if s.name == "Translator"]
        assert {m.name for m in rpcs} == {"Translate", "TranslateStream", "GetModelInfo", "ListModels"}
        (v1_file,) = files(reflection_v1)
        assert (v1_file.name, v1_file.package) == (
            "grpc/reflection/v1/reflection.proto",
            "grpc.reflection.v1",
        )
        (method,) = v1_file.service[0].method
        assert method.input_type == ".grpc.reflection.v1.ServerReflectionRequest"


def test_concurrent_clients_get_solo_results_and_batches_fill(shipped_server, client_for):
    solo_client = client_for(shipped_server)
    solo = [solo_client.translate([s])[0].text for s in SENTENCES]

    def batch_counts() -> tuple[float, float]:
        """(engine batches, batches with more than one segment) so far."""
        total = shipped_server.sample("translator_batch_segments_count")
        return total, total - shipped_server.sample("translator_batch_segments_bucket", le="1.0")

    batches_before, multi_before = batch_counts()
    barrier = threading.Barrier(len(SENTENCES))

    def one(i: int) -> str:
        with TranslatorClient(shipped_server.target, timeout=60) as c:  # one channel per client
            c.health()
            barrier.wait(10)
            return c.translate([SENTENCES[i]])[0].text

    with ThreadPoolExecutor(len(SENTENCES)) as pool:
        together = list(pool.map(one, range(len(SENTENCES))))
    assert together == solo
    batches, multi = batch_counts()
    batches, multi = batches - batches_before, multi - multi_before
    assert batches < len(SENTENCES), "concurrent requests were not batched"
    assert multi >= 1, "no engine batch held more than one segment"
    assert wait_for(lambda: shipped_server.sample("translator_requests_in_flight") == 0)


def test_stream_with_many_items_and_flow_control(start_server, tiny_bundle, client_for):
    """60 items over one call, never more than max_stream_inflight=4 of them in the server at once (the
    server stops reading the stream; tests/test_serving.py holds the engine to show it)."""
    server = start_server(tiny_bundle, max_stream_inflight=4)
    items = [StreamItem(f"id-{i}", [SENTENCES[i % len(SENTENCES)]], max_length=4) for i in range(60)]
    items[10] = StreamItem("late", ["Open the file"], timeout_ms=-1)
    in_flight = server.server.metrics.in_flight
    peak, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], int(in_flight._value.get()))
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results = list(client_for(server).translate_stream(iter(items)))
    finally:
        done.set()
        watcher.join(10)
    assert 2 <= peak[0] <= 4, f"{peak[0]} items in flight at once"
    assert sorted(r.request_id for r in results) == sorted(i.request_id for i in items)
    assert sum(r.ok for r in results) == 59
    assert next(r for r in results if r.request_id == "late").code == grpc.StatusCode.INVALID_ARGUMENT
    assert server.sample("translator_stream_items_total", code="OK") == 59
    assert server.sample("translator_requests_total", rpc="TranslateStream", code="OK") == 1


# ---- validation (tiny model) -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("texts", "options", "expected"),
    [
        ([], {}, "texts is empty"),
        (["x"] * 17, {}, "too many texts: 17 in one request, the limit is 16"),
        (["ok", "word " * 4001], {}, "texts[1] has 20005 characters, over the limit of 20000"),
        (["ok"], {"beam_size": 9}, "beam_size=9 is above the maximum beam size 8"),
        (["ok"], {"beam_size": -1}, "beam_size must be >= 0"),
        (["ok"], {"beam_size": 2, "num_hypotheses": 3}, "num_hypotheses=3 is larger than the beam size 2"),
        (["ok"], {"max_length": -5}, "max_length must be >= 0"),
        (["ok"], {"max_length": 100000}, "above the model's cap"),
        (["ok"], {"length_penalty": -0.5}, "length_penalty must be a number from 0 to 10"),
        (["Hi"], {"beam_size": 4, "length_penalty": 1000.0}, "length_penalty must be a number from 0 to 10"),
    ],
)
def test_validation_errors(tiny_server, client_for, texts, options, expected):
    c = client_for(tiny_server, retries=0)
    with pytest.raises(TranslatorError) as e:
        c.translate(texts, **options)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in e.value.details


def test_text_layer_limits_are_inclusive(start_server, tiny_bundle, client_for):
    """A text of exactly max_text_chars (20,000) is taken, one more character is refused; a text that
    the text layer splits into exactly as many segments as the queue holds is taken, one more is refused
    (long texts are split, never refused for their token count)."""
    server = start_server(tiny_bundle, max_queue_segments=5, max_texts=1)
    c = client_for(server, retries=0)
    edge = "Open the file." + " " * (20_000 - 14)
    assert c.translate([edge], max_length=3)[0].text.endswith(" " * 100)
    with pytest.raises(TranslatorError) as e:
        c.translate([edge + " "], max_length=3)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details.startswith("texts[0] has 20001 characters, over the limit of 20000")

    def sentences(n: int) -> str:  # n sentences the text layer translates one by one
        nouns = "file folder page image table chart".split()
        return " ".join(
            f"Save the changes to the {w} before you close the window, or they will be lost forever and ever."
            for w in nouns[:n]
        )

    assert server.sample("translator_segments_total", outcome="translated") == 1  # the edge text
    assert c.translate([sentences(5)], max_length=2)[0].text
    assert server.sample("translator_segments_total", outcome="translated") == 1 + 5
    with pytest.raises(TranslatorError) as e:
        c.translate([sentences(6)], max_length=2)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details == (
        "these texts make 6 segments, more than the queue holds (5); send them over several requests"
    )


def test_grpc_refuses_oversized_and_invalid_utf8(tiny_server, client_for):
    c = client_for(tiny_server, retries=0)
    with pytest.raises(TranslatorError) as e:
        c.translate(["a" * (5 * 1024 * 1024)])
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    with grpc.insecure_channel(tiny_server.target) as channel:
        raw = channel.unary_unary(
            "/translator.v1.Translator/Translate", request_serializer=None, response_deserializer=None
        )
        bad_utf8 = b"\x0a\x02\xff\xfe"  # field 1 (texts), 2 bytes that are not UTF-8
        with pytest.raises(grpc.RpcError) as e2:
            raw(bad_utf8, timeout=10)
        assert e2.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid translator.v1.TranslateRequest protobuf" in e2.value.details()
    assert c.translate(["Open the file"], max_length=5)[0].text  # still serving


# ---- deadlines, cancellation, back-pressure (tiny model) -------------------------------------------


OUTCOMES = ("dropped_deadline", "dropped_cancelled", "translated")


def test_deadline_mid_decode_drops_the_running_rows(start_server, tiny_bundle, client_for):
    """In-flight mode: a new request would join the running batch even if the expired rows were still in
    it, so "the engine is free again" proves nothing; the expired rows must leave the running batch at
    the next decoding step (none translated, no more steps run). tests/test_serving.py checks the same
    with a fake engine whose step time is fixed."""
    server = start_server(tiny_bundle, max_texts=16)
    strategy = server.server.scheduler.strategy
    c = client_for(server, retries=0)
    # The deadline is a fraction of one 8-segment wave (beam 8: 64 rows, 256 steps) timed on this
    # machine: a fixed 0.15 s let a fast CPU finish the first wave in time (CI once saw 7 translated).
    wave_s = 60.0
    for texts in (LONG_TEXTS[16:24], LONG_TEXTS[24:32]):  # the first also pays for warming up
        started = time.monotonic()
        c.translate(texts, timeout=60, **LONG)
        wave_s = min(wave_s, time.monotonic() - started)
    before = server.sample("translator_decode_steps_total")
    counted = {k: server.sample("translator_segments_total", outcome=k) for k in OUTCOMES}
    with pytest.raises(TranslatorError) as e:
        c.translate(LONG_TEXTS[:16], timeout=min(0.15, wave_s / 3), **LONG)
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    at_deadline = server.sample("translator_decode_steps_total")
    assert at_deadline > before, "the request never reached the decoder: the test proves nothing"
    assert wait_for(lambda: not strategy.running and len(strategy.batch) == 0, 10), len(strategy.running)
    steps = server.sample("translator_decode_steps_total")
    assert steps - at_deadline <= 10, "the expired rows kept decoding"
    time.sleep(0.2)
    assert server.sample("translator_decode_steps_total") == steps  # nothing runs any more
    outcomes = {k: server.sample("translator_segments_total", outcome=k) - counted[k] for k in OUTCOMES}
    # All 16 dropped for the deadline (whatever the worker's clock said when it dropped them), none
    # translated.
    assert outcomes == {"dropped_deadline": 16, "dropped_cancelled": 0, "translated": 0}
    assert server.sample("translator_requests_total", rpc="Translate", code="DEADLINE_EXCEEDED") == 1
    assert c.translate(["Open the file"], max_length=5, timeout=10)[0].text
    assert wait_for(lambda: server.sample("translator_requests_in_flight") == 0)


def test_client_cancel_mid_decode_leaves_batchmates_alone(start_server, tiny_bundle):
    # Request-level batching: A and B share one engine batch (in-flight: tests/test_scheduler.py).
    server = start_server(tiny_bundle, batching_mode="request", max_wait_ms=300, max_texts=32)
    b_texts = SENTENCES[:4]
    with TranslatorClient(server.target, timeout=60) as c:
        b_alone = [t.text for t in c.translate(b_texts, **LONG)]
    channel_a = grpc.insecure_channel(server.target)
    channel_b = grpc.insecure_channel(server.target)
    try:
        big_before = server.sample("translator_batch_segments_count") - server.sample(
            "translator_batch_segments_bucket", le="32.0"
        )
        opts = pb.DecodingOptions(**LONG)
        a = pb_grpc.TranslatorStub(channel_a).Translate.future(
            pb.TranslateRequest(texts=LONG_TEXTS, options=opts)
        )
        b = pb_grpc.TranslatorStub(channel_b).Translate.future(
            pb.TranslateRequest(texts=b_texts, options=opts)
        )
        # Both queued, then taken as one batch (max wait 300 ms) and decoding: waiting on the queue
        # rather than a fixed sleep keeps a fast CPU from finishing the batch before the cancel.
        assert wait_for(lambda: server.sample("translator_queue_segments") == len(LONG_TEXTS) + 4, 5)
        assert wait_for(lambda: server.sample("translator_queue_segments") == 0, 5)
        time.sleep(0.1)
        assert a.cancel()
        b_together = [t.hypotheses[0].text for t in b.result(timeout=60).translations]
    finally:
        channel_a.close()
        channel_b.close()
    assert b_together == b_alone
    # A and B (36 segments) went through one engine batch.
    assert (
        server.sample("translator_batch_segments_count")
        - server.sample("translator_batch_segments_bucket", le="32.0")
        == big_before + 1
    )
    assert wait_for(
        lambda: server.sample("translator_requests_total", rpc="Translate", code="CANCELLED") == 1
    )
    assert server.sample("translator_segments_total", outcome="dropped_cancelled") == len(LONG_TEXTS)
    assert wait_for(lambda: server.sample("translator_requests_in_flight") == 0)


def test_queue_overflow_is_resource_exhausted(start_server, tiny_bundle):
    # Request-level batching: the first request's 32 segments all leave the queue at once (in-flight
    # admits them as running rows free up); the queue check itself is shared by both modes.
    server = start_server(
        tiny_bundle, batching_mode="request", max_wait_ms=1, max_queue_segments=32, max_texts=32
    )
    opts = pb.DecodingOptions(**LONG)
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        running = stub.Translate.future(pb.TranslateRequest(texts=LONG_TEXTS, options=opts))
        server.wait_in_engine()
        queued = stub.Translate.future(pb.TranslateRequest(texts=LONG_TEXTS[:30], options=opts))
        assert wait_for(lambda: server.sample("translator_queue_segments") == 30, 5)
        with pytest.raises(grpc.RpcError) as e:
            stub.Translate(pb.TranslateRequest(texts=SENTENCES[:3]), timeout=10)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "retry" in e.value.details()
        trailers = dict(e.value.trailing_metadata())
        assert int(trailers["retry-after-ms"]) > 0
        running.cancel()
        queued.cancel()
        assert stub.Translate(pb.TranslateRequest(texts=["Open"]), timeout=30).translations
    assert server.sample("translator_requests_total", rpc="Translate", code="RESOURCE_EXHAUSTED") == 1


# ---- lifecycle ----------------------------------------------------------------------------------------


def test_not_serving_while_the_model_loads(server_loop, tiny_bundle):
    """The port opens before the model is loaded: health NOT_SERVING and Translate UNAVAILABLE
    "loading" meanwhile; a client that retries UNAVAILABLE with backoff gets through once it is up."""
    from server.app import default_engine_factory

    loading = threading.Event()

    def slow_factory(bundle_dir, config):
        loading.wait(60)
        return default_engine_factory(bundle_dir, config)

    server = RunningServer(server_loop, base_config(tiny_bundle))
    server.server.engine_factory = slow_factory
    try:
        server.start(wait_ready=False)
        with TranslatorClient(server.target, timeout=5, retries=0) as c:
            assert c.health() == "NOT_SERVING"
            assert c.health("translator.v1.Translator") == "NOT_SERVING"
            with pytest.raises(TranslatorError) as e:
                c.translate(["Open the file"])
            assert e.value.code == grpc.StatusCode.UNAVAILABLE and "loading" in e.value.details
        threading.Timer(0.5, loading.set).start()  # the load finishes while the client retries
        with TranslatorClient(server.target, timeout=120, retries=100, backoff=0.2, max_backoff=1.0) as c:
            assert c.translate(["Open the file"], max_length=5)[0].text
            assert c.health() == "SERVING"
    finally:
        loading.set()
        server.stop(1)


def test_checkpoint_dir_fails_the_start_with_the_export_command(server_process, tiny_checkpoint, tmp_path):
    """The server serves bundles only: a training checkpoint exits 1 at once (nothing bound, nothing
    exported) with the command that makes its bundle."""
    bundles = tmp_path / "bundles"
    proc = server_process(
        {"TRANSLATOR_MODEL_DIR": str(tiny_checkpoint), "TRANSLATOR_BUNDLES_DIR": str(bundles)}
    )
    assert proc.proc.wait(60) == 1
    (error,) = [line for line in proc.log_lines() if line["level"] == "ERROR"]
    out = bundles / tiny_checkpoint.name
    assert f"python -m export --checkpoint {tiny_checkpoint} --out {out}" in error["msg"]
    assert f"--model-dir {out}" in error["msg"]
    assert not bundles.exists()


def test_sigterm_drains_in_flight_and_exits_0(server_process, tiny_bundle):
    """SIGTERM: NOT_SERVING during the drain delay, then new calls refused while the one in flight
    finishes (the process still running all along), then exit 0."""
    proc = server_process(
        {
            "TRANSLATOR_MODEL_DIR": str(tiny_bundle),
            "TRANSLATOR_SHUTDOWN_GRACE_S": "30",
            "TRANSLATOR_DRAIN_DELAY_S": "1",
            "TRANSLATOR_LOG_LEVEL": "INFO",
            "TRANSLATOR_THREADS": "1",
            "TRANSLATOR_MAX_RUNNING_ROWS": "8",  # 1 beam-8 segment at a time: seconds of decoding, even idle
        }
    )
    wait_serving(proc.target, timeout=60)
    result: dict = {}
    # 64 distinct texts: about 4 s of decoding here, one segment at a time, so the request is still
    # running when the drain delay is over and new calls are refused (32 took 2 s: too close)
    texts = [
        f"{t[:-1]} {w}{t[-1]}" if t[-1] in ".?" else f"{t} {w}"
        for w in ("please", "first")
        for t in LONG_TEXTS
    ]

    def long_request() -> None:
        with TranslatorClient(proc.target, timeout=60, retries=0) as c:
            try:
                result["out"] = c.translate(texts, **LONG)
            except TranslatorError as e:
                result["error"] = e

    thread = threading.Thread(target=long_request)
    thread.start()
    with TranslatorClient(proc.target, timeout=5, retries=0) as c:
        time.sleep(0.5)  # decoding
        proc.proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: c.health() == "NOT_SERVING", 0.9)  # the drain delay
        assert c.health("translator.v1.Translator") == "NOT_SERVING"
        during_delay = c.model_info().name  # still answered while the load balancers catch up

        def refused() -> bool:
            try:
                c.model_info(timeout=1)
            except TranslatorError as e:
                # A call gRPC has received but not yet handed to a handler when the server stops is
                # cancelled by gRPC itself (grpc/grpc#41785; CI saw it once, on a loaded machine): the
                # calls after it must be refused.
                if e.code == grpc.StatusCode.CANCELLED:
                    return False
                assert e.code == grpc.StatusCode.UNAVAILABLE
                return True
            return False

        assert wait_for(refused, 5)
        assert proc.proc.poll() is None and thread.is_alive() and not result, (
            f"refused only after the drain: {result}"
        )
    thread.join(60)
    assert proc.proc.wait(60) == 0
    assert during_delay
    assert "error" not in result, result.get("error")
    assert len(result["out"]) == len(texts)
    logs = proc.log_lines()
    requests = [r for r in logs if r.get("msg") == "request" and r.get("rpc") == "Translate"]
    assert len(requests) == 1 and requests[0]["status"] == "OK"
    line = requests[0]
    assert line["segments"] == len(texts) and line["input_tokens"] > 0 and line["output_tokens"] > 0
    assert {"id", "queue_ms", "decode_ms"} <= set(line)
    msgs = [r.get("msg") for r in logs]
    assert msgs.index("received SIGTERM: draining") < msgs.index("shutting down") < msgs.index("stopped")


# ---- TLS and token auth -----------------------------------------------------------------------------


def _pki_cryptography(d: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)

    def name(cn: str):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(stem: str, cert, k) -> None:
        (d / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (d / f"{stem}.key").write_bytes(
            k.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    def build(subject, issuer, public_key, signing_key, extensions):
        b = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
        )
        for ext, critical in extensions:
            b = b.add_extension(ext, critical=critical)
        return b.sign(signing_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = build(
        name("test CA"),
        name("test CA"),
        ca_key.public_key(),
        ca_key,
        [(x509.BasicConstraints(ca=True, path_length=None), True)],
    )
    write("ca", ca, ca_key)
    server_san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    for stem, cn, san in [
        ("server", "localhost", server_san),
        ("client", "test client", [x509.DNSName("client")]),
    ]:
        k = ec.generate_private_key(ec.SECP256R1())
        cert = build(
            name(cn), ca.subject, k.public_key(), ca_key, [(x509.SubjectAlternativeName(san), False)]
        )
        write(stem, cert, k)


def _pki_openssl(d: Path) -> None:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    ec_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec_key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=test CA")
    for stem, cn, san in [
        ("server", "localhost", "DNS:localhost,IP:127.0.0.1"),
        ("client", "client", "DNS:client"),
    ]:
        (d / f"{stem}.ext").write_text(f"subjectAltName={san}\n")
        run("req", *ec_key, "-keyout", f"{stem}.key", "-out", f"{stem}.csr", "-subj", f"/CN={cn}")
        run(
            "x509",
            "-req",
            "-in",
            f"{stem}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{stem}.pem",
            "-days",
            "1",
            "-extfile",
            f"{stem}.ext",
        )


def make_pki(d: Path, stems: tuple[str, ...] = ("ca", "server", "client")) -> dict[str, Path]:
    """Certificates made in `d` with `cryptography` or, without it, the openssl CLI: {stem_kind: path}."""
    try:
        import cryptography  # noqa: F401

        _pki_cryptography(d)
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor the openssl CLI is available")
        _pki_openssl(d)
    return {f"{stem}_{kind}": d / f"{stem}.{kind}" for stem in stems for kind in ("pem", "key")}


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate (PEM)."""
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_tls(start_server, tiny_bundle, pki):
    server = start_server(tiny_bundle, tls_cert=str(pki["server_pem"]), tls_key=str(pki["server_key"]))
    with TranslatorClient(server.target, ca_cert=pki["ca_pem"], server_name="localhost", timeout=10) as c:
        assert c.translate(["Open the file"], max_length=5)[0].text
        assert c.health() == "SERVING"
    assert server.sample("translator_ready") == 1  # TLS covers gRPC only: /metrics stays plain HTTP
    with TranslatorClient(server.target, timeout=3, retries=0) as plain, pytest.raises(TranslatorError) as e:
        plain.translate(["Open the file"])
    assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_and_token(start_server, tiny_bundle, pki):
    server = start_server(
        tiny_bundle,
        tls_cert=str(pki["server_pem"]),
        tls_key=str(pki["server_key"]),
        tls_client_ca=str(pki["ca_pem"]),
        auth_token="s3cret",
    )
    tls = dict(
        ca_cert=pki["ca_pem"],
        client_cert=pki["client_pem"],
        client_key=pki["client_key"],
        server_name="localhost",
        timeout=10,
        retries=0,
    )
    with TranslatorClient(server.target, token="s3cret", **tls) as c:
        assert c.translate(["Open the file"], max_length=5)[0].text
        assert c.model_info().name
        assert [r.ok for r in c.translate_stream([StreamItem("1", ["Open"], max_length=5)])] == [True]
    for token in (None, "wrong"):
        with TranslatorClient(server.target, token=token, **tls) as c:
            assert c.health() == "SERVING"  # health checks stay open
            with pytest.raises(TranslatorError) as e:
                c.translate(["Open the file"])
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(TranslatorError) as e:
                list(c.translate_stream([StreamItem("1", ["Open"])]))
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    no_client_cert = dict(tls, client_cert=None, client_key=None)
    with (
        TranslatorClient(server.target, token="s3cret", **no_client_cert) as c,
        pytest.raises(TLSError) as e,
    ):
        c.translate(["Open the file"])
    # The handshake fails (gRPC says UNAVAILABLE), not the token or the request.
    assert e.value.code == grpc.StatusCode.UNAVAILABLE and e.value.problem == "client_cert"
    assert server.sample("translator_requests_total", rpc="Translate", code="UNAUTHENTICATED") == 2


def test_token_over_plaintext(start_server, tiny_bundle, client_for):
    server = start_server(tiny_bundle, auth_token="t0ken")
    assert client_for(server, token="t0ken").translate(["Open"], max_length=5)[0].text
    with pytest.raises(TranslatorError) as e:
        client_for(server, retries=0).translate(["Open"])
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert "bearer token" in e.value.details
    # RFC 7235: the auth scheme is case-insensitive; the token is not.
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        for value in ("bearer t0ken", "BEARER t0ken", "BeArEr  t0ken"):
            info = stub.GetModelInfo(
                pb.GetModelInfoRequest(), metadata=[("authorization", value)], timeout=10
            )
            assert info.name
        for value in ("bearer T0KEN", "Basic t0ken", "t0ken", "bearert0ken"):
            with pytest.raises(grpc.RpcError) as e:
                stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=[("authorization", value)], timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, value


def test_inflight_mode_end_to_end_matches_solo(start_server, tiny_bundle):
    """Through gRPC: concurrent requests with mixed beam sizes, arriving at random times, share one
    running decode batch and each get exactly their solo translation (text and score)."""
    import random

    server = start_server(tiny_bundle, batching_mode="inflight", max_texts=16)
    rng = random.Random(3)
    calls = [
        (rng.uniform(0, 0.3), rng.sample(SENTENCES, rng.randint(1, 3)), rng.choice([1, 2, 4]))
        for _ in range(12)
    ]
    with TranslatorClient(server.target, timeout=60) as c:
        info = c.model_info()
        assert info.batching and info.batching_mode == "inflight"
        solo = {
            (t, k): c.translate([t], beam_size=k, max_length=20, return_scores=True)[0]
            for _, texts, k in calls
            for t in texts
        }
        steps_before = server.sample("translator_decode_steps_total")

        def call(delay, texts, k):
            time.sleep(delay)
            return c.translate(texts, beam_size=k, max_length=20, return_scores=True)

        with ThreadPoolExecutor(len(calls)) as pool:
            results = list(pool.map(lambda a: call(*a), calls))
    for (_, texts, k), got in zip(calls, results, strict=True):
        for t, tr in zip(texts, got, strict=True):
            assert (tr.text, tr.hypotheses[0].score) == (solo[t, k].text, solo[t, k].hypotheses[0].score)
    assert server.sample("translator_decode_steps_total") > steps_before
    assert server.sample("translator_batch_rows_count") > 0
    assert server.sample("translator_time_to_first_step_seconds_count") > 0


def _model_ready(caplog) -> dict:
    (record,) = [r for r in caplog.records if r.name == "server" and r.getMessage() == "model ready; serving"]
    return record.fields


def copy_with_shared_position(bundle: Path, dst: Path) -> Path:
    """A copy of `bundle` whose decoder graph takes one shared position (1,), as bundles exported before
    per-row positions (and in-flight batching) did: a real old graph, which ONNX Runtime enforces."""
    import onnx

    from runtime.bundle import file_entry

    shutil.copytree(bundle, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    for variant in manifest["variants"].values():
        rel = variant["decoder"]
        graph = onnx.load(dst / rel)
        (position,) = [i for i in graph.graph.input if i.name == "position"]
        dim = position.type.tensor_type.shape.dim[0]
        dim.ClearField("dim_param")
        dim.dim_value = 1
        onnx.save(graph, dst / rel)
        manifest["files"][rel] = file_entry(dst, rel)
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


@pytest.mark.parametrize(
    ("overrides", "old_graph", "mode", "threads"),
    [
        (dict(batching_mode="off", threads=0), False, "off", "physical"),
        (dict(batching=False, threads=1), False, "off", 1),
        (dict(batching_mode="inflight", threads=2), True, "request", 2),  # bundle can't: falls back
    ],
    ids=["mode-off", "batching-false", "inflight-fallback"],
)
def test_model_ready_log_and_model_info_agree(
    server_loop, tiny_bundle, tiny_server, tmp_path, caplog, overrides, old_graph, mode, threads
):
    """The "model ready" log line and GetModelInfo report the batching really in effect (after the
    fallback of in-flight batching to request for a real old decoder graph, without per-row positions),
    and the log gives the ONNX Runtime thread count in use (--threads 0 = one per physical core); the old
    bundle still translates, exactly as the new one."""
    from server.engine import physical_cores

    bundle = copy_with_shared_position(tiny_bundle, tmp_path / "old") if old_graph else tiny_bundle
    server = RunningServer(server_loop, base_config(bundle, **overrides))
    try:
        with caplog.at_level(logging.INFO, logger="server"):
            server.start()
        with TranslatorClient(server.target, timeout=30) as c:
            info = c.model_info()
            out = [t.text for t in c.translate(SENTENCES[:3], beam_size=2, max_length=8)]
        ready = _model_ready(caplog)
        assert (info.batching_mode, info.batching) == (mode, mode != "off")
        assert (ready["batching_mode"], ready["batching"]) == (mode, mode != "off")
        assert ready["threads"] == (physical_cores() if threads == "physical" else threads)
        if old_graph:
            assert "lacks per-row positions" in caplog.text
            with TranslatorClient(tiny_server.target, timeout=30) as c:
                assert out == [t.text for t in c.translate(SENTENCES[:3], beam_size=2, max_length=8)]
    finally:
        server.stop(1)
