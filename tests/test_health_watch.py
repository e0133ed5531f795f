"""Health Watch streams and shutdown: a load balancer's open Watch must not hold the shutdown for the
whole grace period (server/health.py), and it sees NOT_SERVING before its stream ends."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from server.service import SERVICE_NAME
from tests.fake_engine import GatedEngine

STATUS = health_pb2.HealthCheckResponse
SERVING, NOT_SERVING, UNKNOWN = STATUS.SERVING, STATUS.NOT_SERVING, STATUS.SERVICE_UNKNOWN


class Watcher:
    """One Watch stream read in a thread: the statuses it got and how it ended."""

    def __init__(self, channel: grpc.Channel, service: str) -> None:
        self.call = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=service), timeout=60
        )
        self.seen: list[int] = []
        self.code: grpc.StatusCode | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for response in self.call:
                self.seen.append(response.status)
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            self.code = e.code()

    def wait_for(self, statuses: list[int], timeout: float = 10) -> None:
        end = time.monotonic() + timeout
        while self.seen != statuses and time.monotonic() < end:
            time.sleep(0.01)
        assert self.seen == statuses


@pytest.mark.parametrize("drain_delay_s", [0, 0.3])
def test_open_watch_streams_end_at_shutdown_instead_of_holding_the_grace_period(
    start_fake_server, server_loop, drain_delay_s
):
    server = start_fake_server(shutdown_grace_s=20, drain_delay_s=drain_delay_s)
    with grpc.insecure_channel(server.target) as channel:
        watchers = {name: Watcher(channel, name) for name in ("", SERVICE_NAME, "no.such.Service")}
        for name, w in watchers.items():
            w.wait_for([UNKNOWN] if name == "no.such.Service" else [SERVING])
        server.stopped = True
        t0 = time.monotonic()
        asyncio.run_coroutine_threadsafe(server.server.stop(), server_loop.loop).result(30)
        took = time.monotonic() - t0
        for w in watchers.values():
            w.thread.join(10)
    assert took < drain_delay_s + 3, f"the shutdown waited {took:.1f} s for the open Watch streams"
    for name, w in watchers.items():
        assert w.code == grpc.StatusCode.OK, name  # ended by the server, not cut at the grace period
        assert w.seen == ([UNKNOWN] if name == "no.such.Service" else [SERVING, NOT_SERVING]), name


def test_watch_started_while_draining_gets_the_status_and_ends(start_fake_server, server_loop):
    """During the drain delay RPCs are still served: a new Watch gets NOT_SERVING, and ends once the
    server stops taking RPCs; a request held in flight still has its grace period."""
    engine = GatedEngine(step_s=0)
    server = start_fake_server(engine, shutdown_grace_s=20, drain_delay_s=1)
    from proto.gen.translator.v1 import translator_pb2 as pb
    from proto.gen.translator.v1 import translator_pb2_grpc as pb_grpc

    with grpc.insecure_channel(server.target) as channel:
        engine.gate.clear()
        held = pb_grpc.TranslatorStub(channel).Translate.future(
            pb.TranslateRequest(texts=["held words"], options=pb.DecodingOptions(max_length=2)), timeout=30
        )
        assert engine.waiting.wait(10)
        server.stopped = True
        stopping = asyncio.run_coroutine_threadsafe(server.server.stop(), server_loop.loop)
        time.sleep(0.2)  # in the drain delay
        late = Watcher(channel, SERVICE_NAME)
        late.wait_for([NOT_SERVING])
        late.thread.join(5)
        assert late.code == grpc.StatusCode.OK and not stopping.done()
        engine.gate.set()
        assert held.result(30).translations[0].hypotheses[0].text == "words held"
        stopping.result(10)


@contextlib.asynccontextmanager
async def health_only_server():
    """(DrainingHealthServicer, channel to it): a gRPC server with only the health service."""
    from server.health import DrainingHealthServicer

    servicer = DrainingHealthServicer()
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield servicer, channel
    finally:
        await server.stop(0)


def test_the_servicer_keeps_the_library_semantics_until_drained(server_loop):
    """DrainingHealthServicer alone: Check and Watch as grpcio-health-checking's servicer (service ""
    SERVING before anything is set, a status sent once per change), and drain() ends a Watch with the
    last status already sent, without repeating it."""

    async def main() -> tuple[list[int], grpc.StatusCode, int]:
        async with health_only_server() as (servicer, channel):
            stub = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest(service="")
            watch = stub.Watch(request)
            seen = [(await watch.read()).status]
            await servicer.set("", SERVING)  # no change: nothing sent
            await servicer.set("", NOT_SERVING)
            seen.append((await watch.read()).status)
            servicer.drain()
            assert await watch.read() is grpc.aio.EOF
            code = await watch.code()
            late = [r.status async for r in stub.Watch(request)]  # after drain: the status, then the end
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Check(health_pb2.HealthCheckRequest(service="nope"))
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
            return seen + late, code, (await stub.Check(request)).status

    seen, code, checked = server_loop.run(main(), 30)
    assert (seen, code, checked) == ([SERVING, NOT_SERVING, NOT_SERVING], grpc.StatusCode.OK, NOT_SERVING)


def test_drain_before_any_status_was_set_ends_the_watch_with_the_default(server_loop):
    async def main() -> list[int]:
        async with health_only_server() as (servicer, channel):
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
            seen = [(await watch.read()).status]
            servicer.drain()
            while (response := await watch.read()) is not grpc.aio.EOF:
                seen.append(response.status)
            return seen

    assert server_loop.run(main(), 30) == [SERVING]
