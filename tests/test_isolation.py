"""Fault isolation: a request that makes the engine fail fails alone; the requests batched with it (one
request-level batch, or one running in-flight batch) are answered as if it had never been there."""

from __future__ import annotations

import asyncio
import logging

import pytest

from runtime.decoding import DecodingOptions
from server.scheduler import EngineFailure
from tests.fake_engine import FakeEngine
from tests.test_scheduler import SOLO, TEXTS, job, make_scheduler, outcomes

# Not the engine's defaults: a batch mate decoded again alone keeps the options it asked for.
OPTIONS = DecodingOptions(beam_size=2, num_hypotheses=2, max_length=40, length_penalty=1.0)


@pytest.mark.parametrize("mode", ["request", "inflight"])
def test_a_failing_request_does_not_fail_its_batch_mates(mode, caplog):
    fake = FakeEngine(step_s=0.002, fail_on="Print")
    caplog.set_level(logging.INFO, logger="server.scheduler")
    scheduler, metrics = make_scheduler(fake, mode=mode, max_wait_ms=100)
    victims = [t for t in TEXTS if t != "Print"][:4]

    async def main():
        first = asyncio.ensure_future(scheduler.run(job(fake, victims[:2], OPTIONS)))
        second = asyncio.ensure_future(scheduler.run(job(fake, victims[2:], OPTIONS)))
        await asyncio.sleep(0.03)  # both queued (request-level: one batch) or running (in-flight)
        culprit = asyncio.ensure_future(scheduler.run(job(fake, ["Print"], OPTIONS)))
        return await asyncio.gather(first, second, culprit, return_exceptions=True)

    try:
        first, second, culprit = asyncio.run(main())
    finally:
        scheduler.stop(10)
    assert isinstance(culprit, EngineFailure) and "fake engine failure" in str(culprit)
    assert first.results == [SOLO.translate([t], OPTIONS)[0] for t in victims[:2]]
    assert second.results == [SOLO.translate([t], OPTIONS)[0] for t in victims[2:]]
    assert any("Print" in texts for texts, _ in fake.batches) or mode == "inflight"
    assert outcomes(metrics)["failed"] == 1 and outcomes(metrics)["translated"] == 4
    errors = {s.name: s.value for m in metrics.registry.collect() for s in m.samples}
    assert errors["translator_engine_errors_total"] == 1
    # The log says the batch failed, why, and that its requests were decoded again alone.
    (retry,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert retry.getMessage().endswith("RuntimeError); retrying each alone")
    assert retry.fields == {"error": "fake engine failure on 'Print'"}


def test_undecodable_bytes_get_invalid_argument_and_the_server_serves_on(tiny_server, client_for):
    import grpc

    with grpc.insecure_channel(tiny_server.target) as channel:
        raw = channel.unary_unary(
            "/translator.v1.Translator/Translate", request_serializer=None, response_deserializer=None
        )
        for payload in (b"\xff\xff\xff\xff", b"\x0a\x02\xff\xfe", b"\x12\x05\x08"):
            with pytest.raises(grpc.RpcError) as e:
                raw(payload, timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
            assert e.value.details().startswith("the request is not a valid translator.v1.TranslateRequest ")
            assert e.value.details().endswith(
                "; send a message built from proto/translator/v1/translator.proto"
            )
        stream = channel.stream_stream(
            "/translator.v1.Translator/TranslateStream", request_serializer=None, response_deserializer=None
        )
        from proto.gen.translator.v1 import translator_pb2 as pb

        good = pb.TranslateStreamRequest(request_id="ok", texts=["Open"]).SerializeToString()
        answers = [
            pb.TranslateStreamResponse.FromString(r) for r in stream(iter([b"\xff\xff", good]), timeout=30)
        ]
    by_id = {a.request_id: a for a in answers}
    assert by_id[""].status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert by_id["ok"].status.code == 0 and by_id["ok"].translations
    assert client_for(tiny_server, retries=0).translate(["Open the file"], max_length=5)[0].text
