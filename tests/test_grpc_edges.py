"""gRPC answers at the edges, over the fake engine: a stream item's timeout_ms on a call without a
deadline, the parse error of undecodable bytes, and a request that reaches a stopped scheduler."""

from __future__ import annotations

import time

import grpc
import pytest

from client import TranslatorError
from proto.gen.translator.v1 import translator_pb2 as pb
from proto.gen.translator.v1 import translator_pb2_grpc as pb_grpc
from tests.fake_engine import FakeEngine


def test_stream_item_timeout_ms_without_a_call_deadline(start_fake_server):
    server = start_fake_server(FakeEngine(step_s=0.01))
    items = [
        pb.TranslateStreamRequest(
            request_id="slow", texts=["a b"], options=pb.DecodingOptions(max_length=200), timeout_ms=200
        ),
        pb.TranslateStreamRequest(
            request_id="quick", texts=["c d"], options=pb.DecodingOptions(max_length=2)
        ),
    ]
    t0 = time.monotonic()
    with grpc.insecure_channel(server.target) as channel:
        answers = {a.request_id: a for a in pb_grpc.TranslatorStub(channel).TranslateStream(iter(items))}
    assert answers["slow"].status.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert answers["quick"].status.code == 0 and answers["quick"].translations[0].hypotheses[0].text == "d c"
    assert time.monotonic() - t0 < 1.9  # 200 steps of 10 ms: the item did not run to its end


def test_undecodable_bytes_are_answered_with_the_parse_error(start_fake_server):
    server = start_fake_server()
    with grpc.insecure_channel(server.target) as channel:
        raw = channel.unary_unary("/translator.v1.Translator/Translate")
        with pytest.raises(grpc.RpcError) as e:
            raw(b"\x0a\x02\xff\xfe", timeout=10)  # texts[0]: two bytes that are not UTF-8
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == (
        "the request is not a valid translator.v1.TranslateRequest protobuf (Error parsing message with type "
        "'translator.v1.TranslateRequest': String field had bad UTF-8); send a message built from "
        "proto/translator/v1/translator.proto"
    )


def test_a_request_reaching_a_stopped_scheduler_is_unavailable(start_fake_server, client_for):
    server = start_fake_server()
    server.server.scheduler.stop(10)
    with pytest.raises(TranslatorError) as e:
        client_for(server, retries=0).translate(["a b"])
    assert (e.value.code, e.value.details) == (grpc.StatusCode.UNAVAILABLE, "server is shutting down")
