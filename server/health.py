"""grpc.health.v1 as grpcio-health-checking serves it, plus an end for Watch streams at shutdown.

A health `Watch` is a server-streaming RPC that stays open as long as the client (a load balancer, a
sidecar, grpc-health-probe --watch) keeps it, and grpc's graceful stop waits for every open RPC: one
Watch held the whole shutdown grace period (30 s by default) after the translations had finished.
`DrainingHealthServicer.drain()` ends every Watch stream, with status OK, once the server stops taking
RPCs; each stream carries the last status set before it (NOT_SERVING while draining) first. Check, Watch
and set() otherwise behave as the library's servicer does.

Health stays open without the bearer token (load balancers and Kubernetes probes carry none), so open
Watch streams are capped instead: `max_watches` across all clients (5,000 streams held ~100 MB); one
past the cap ends at once with RESOURCE_EXHAUSTED. Check is a unary call and needs no cap of its own.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2

SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class _Sent:
    """A servicer context that remembers the last status written to the stream, and whether a write is
    under way (`idle` is clear meanwhile: a write is not cut off half-way)."""

    def __init__(self, context) -> None:
        self._context = context
        self.status: int | None = None
        self.idle = asyncio.Event()
        self.idle.set()

    async def write(self, response: health_pb2.HealthCheckResponse) -> None:
        self.idle.clear()
        try:
            await self._context.write(response)
            self.status = response.status
        finally:
            self.idle.set()

    def __getattr__(self, name: str):
        return getattr(self._context, name)


class DrainingHealthServicer(health.aio.HealthServicer):
    def __init__(self, max_watches: int = 100) -> None:
        super().__init__()
        self._statuses: dict[str, int] = {"": health_pb2.HealthCheckResponse.SERVING}  # as the library's
        self._drained = asyncio.Event()
        self.max_watches = max_watches
        self.watches = 0  # open Watch streams

    async def set(self, service: str, status: int) -> None:
        await super().set(service, status)
        self._statuses[service] = status

    def drain(self) -> None:
        """End every Watch stream, open or to come (the server is about to stop taking RPCs)."""
        self._drained.set()

    async def Watch(self, request: health_pb2.HealthCheckRequest, context) -> None:
        if self.watches >= self.max_watches:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"too many health Watch streams open ({self.max_watches}, --max-health-watches): "
                "use Check, or retry later",
            )
        self.watches += 1
        try:
            await self._watch(request, context)
        finally:
            self.watches -= 1

    async def _watch(self, request: health_pb2.HealthCheckRequest, context) -> None:
        sent = _Sent(context)
        watch = asyncio.ensure_future(super().Watch(request, sent))
        drained = asyncio.ensure_future(self._drained.wait())
        try:
            await asyncio.wait({watch, drained}, return_when=asyncio.FIRST_COMPLETED)
            while not watch.done() and not sent.idle.is_set():
                await sent.idle.wait()
            if watch.done():
                return watch.result()
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
            status = self._statuses.get(request.service, SERVICE_UNKNOWN)
            if sent.status != status:  # the library's loop had not sent it yet
                await context.write(health_pb2.HealthCheckResponse(status=status))
        finally:
            watch.cancel()
            drained.cancel()
