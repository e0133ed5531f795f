"""Wiring: gRPC server, HTTP API, health and reflection, metrics endpoint, model loading, graceful shutdown.

Startup: the bundle to serve is resolved first (server/store.py; no bundle, e.g. a training checkpoint
or a stale default bundle, fails the start with the command that makes one); then the gRPC port opens
with health NOT_SERVING (Translate answers UNAVAILABLE) while the model is loaded and warmed up in a
worker thread; then health turns SERVING. Shutdown: health NOT_SERVING, optional drain delay, stop
accepting RPCs (health Watch streams end then: server/health.py), let in-flight ones finish within the
grace period, stop the engine worker.
With --http-port, the LibreTranslate-compatible HTTP API and web page (server/http_api.py) run on the
same event loop over the same translation core and scheduler, and stop with gRPC.
Logging (JSON lines) is set up by server/logs.py. Server reflection answers both grpc.reflection.v1
and the older v1alpha (grpcio-reflection ships only v1alpha: v1 is served by the same servicer).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2 as reflection_alpha_pb2

from server.auth import BearerTokenInterceptor
from server.config import ServerConfig
from server.files import FileLimits
from server.health import DrainingHealthServicer
from server.http_api import HttpApi, server_ssl_context
from server.http_limits import HttpLimits
from server.logs import LoopErrorLimiter
from server.metrics import Metrics
from server.scheduler import Scheduler
from server.service import SERVICE_NAME, Backend, TranslatorService, add_to_server
from server.store import bundle_pairs, resolve_bundles

log = logging.getLogger("server")

EngineFactory = Callable[[Path, ServerConfig], Any]

REFLECTION_V1_PACKAGE = "grpc.reflection.v1"
REFLECTION_V1_SERVICE = f"{REFLECTION_V1_PACKAGE}.ServerReflection"


def register_reflection_v1(pool: descriptor_pool.DescriptorPool) -> None:
    """Add grpc/reflection/v1/reflection.proto to `pool` (once). The v1 proto is v1alpha's with another
    package name, so it is built from the v1alpha descriptor that grpcio-reflection ships."""
    try:
        pool.FindServiceByName(REFLECTION_V1_SERVICE)
        return
    except KeyError:
        pass
    alpha = reflection_alpha_pb2.DESCRIPTOR
    old, new = f".{alpha.package}.", f".{REFLECTION_V1_PACKAGE}."

    def renamed(type_name: str) -> str:
        return new + type_name[len(old) :] if type_name.startswith(old) else type_name

    def rename_fields(messages) -> None:
        for message in messages:
            for field in message.field:
                if field.HasField("type_name"):  # message and enum fields only
                    field.type_name = renamed(field.type_name)
            rename_fields(message.nested_type)

    file = descriptor_pb2.FileDescriptorProto()
    alpha.CopyToProto(file)
    file.name = "grpc/reflection/v1/reflection.proto"
    file.package = REFLECTION_V1_PACKAGE
    file.ClearField("options")  # v1alpha's language options (java_package...) do not fit v1
    rename_fields(file.message_type)
    for service in file.service:
        for method in service.method:
            method.input_type, method.output_type = renamed(method.input_type), renamed(method.output_type)
    pool.AddSerializedFile(file.SerializeToString())


def enable_reflection(server: grpc.aio.Server, service_names: tuple[str, ...]) -> None:
    """Serve reflection as grpc.reflection.v1 and v1alpha, listing `service_names` and both versions.

    One servicer answers both: the two protocols' messages are the same on the wire."""
    pool = descriptor_pool.Default()
    register_reflection_v1(pool)
    names = (*service_names, REFLECTION_V1_SERVICE, reflection.SERVICE_NAME)
    servicer = reflection.aio.ReflectionServicer(names, pool=pool)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_alpha_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_alpha_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1_SERVICE, {"ServerReflectionInfo": v1}),)
    )


def threads_in_use(engine: Any) -> int | None:
    """ONNX Runtime intra-op threads the engine really uses (--threads 0 resolved to the physical
    cores), from its generator; None for an engine that does not say."""
    threads = getattr(getattr(engine, "generator", None), "threads", None)
    return threads if isinstance(threads, int) else None


def default_engine_factory(bundle_dir: Path, config: ServerConfig) -> Any:
    from server.engine import Engine, use_shared_pool

    use_shared_pool(config.threads)  # every bundle's sessions on one ONNX Runtime pool
    return Engine(
        bundle_dir,
        variant=config.variant,
        device=config.device,
        intra_op_threads=config.threads,
        memory=config.memory,
        lexical_guard=config.lexical_guard,
        dictionary_terms=config.dictionary_terms,
        cuda_tf32=config.cuda_tf32,
    )


class TranslatorServer:
    """The whole service in one object: `await start()`, `await wait_ready()`, `await stop()`."""

    def __init__(self, config: ServerConfig, engine_factory: EngineFactory | None = None) -> None:
        self.config = config
        self.engine_factory = engine_factory or default_engine_factory
        self.metrics = Metrics()
        self.service = TranslatorService(
            self.metrics,
            max_texts=config.max_texts,
            max_message_bytes=config.max_message_bytes,
            max_stream_inflight=config.max_stream_inflight,
            max_queue_segments=config.max_queue_segments,
        )
        self.health = DrainingHealthServicer(max_watches=config.max_health_watches)
        self.serving = False  # what the health services say (gRPC health and HTTP /health)
        self.http: HttpApi | None = None
        self.http_port = 0
        self.server: grpc.aio.Server | None = None
        self.scheduler: Scheduler | None = None
        self.engine: Any = None
        self.bundle_dir: Path | None = None  # the default model's bundle
        self.bundle_dirs: list[Path] = []  # every bundle served (server/store.py resolve_bundles)
        self.schedulers: list[Scheduler] = []  # one per model: its own queue and running batch
        self.port = 0
        self.metrics_port = 0
        self.load_error: BaseException | None = None
        self._ready = asyncio.Event()
        self._stopped = asyncio.Event()
        self._load_task: asyncio.Task | None = None
        self._stopping = False

    async def start(self) -> None:
        """Resolve the bundle (raises server.store.StoreError, nothing bound yet, when there is none to
        serve), open the ports and start loading the model in the background."""
        cfg = self.config
        self.bundle_dirs = resolve_bundles(cfg.model_dir, cfg.bundles_dir, cfg.models)
        self.pairs = [bundle_pairs(b) for b in self.bundle_dirs]  # StoreError before anything binds
        self.service.core.announced = list(dict.fromkeys(p for pairs in self.pairs for p in pairs))
        self.bundle_dir = self.bundle_dirs[0]
        interceptors = [BearerTokenInterceptor(cfg.auth_token, self.metrics)] if cfg.auth_token else []
        self.server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", cfg.max_message_bytes),
                ("grpc.max_send_message_length", 4 * cfg.max_message_bytes),
                ("grpc.so_reuseport", 0),
                # HTTP/2 MAX_CONCURRENT_STREAMS: one connection cannot open thousands of calls (health
                # Watch streams need no token); a client past it queues its calls, none fails.
                ("grpc.max_concurrent_streams", cfg.grpc_max_streams_per_connection),
            ],
        )
        add_to_server(self.service, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        enable_reflection(
            self.server, (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
        )
        await self._set_health(False)
        address = f"{cfg.host}:{cfg.port}"
        if cfg.tls_enabled:
            creds = grpc.ssl_server_credentials(
                [(Path(cfg.tls_key).read_bytes(), Path(cfg.tls_cert).read_bytes())],
                root_certificates=Path(cfg.tls_client_ca).read_bytes() if cfg.tls_client_ca else None,
                require_client_auth=bool(cfg.tls_client_ca),
            )
            self.port = self.server.add_secure_port(address, creds)
        else:
            self.port = self.server.add_insecure_port(address)
        loop = asyncio.get_running_loop()
        if loop.get_exception_handler() is None:
            # Out of descriptors, asyncio reports every failed accept(): one line per kind per 10 s
            # instead (server/logs.py). A handler someone else set is left alone.
            loop.set_exception_handler(LoopErrorLimiter())
        await self.server.start()
        try:
            if cfg.metrics_port >= 0:
                self.metrics_port = self.metrics.serve(cfg.metrics_host or cfg.host, cfg.metrics_port)
            if cfg.http_port:
                await self._start_http()
        except BaseException:
            # A port in use: close what started, or the gRPC server left running would hang the
            # interpreter's exit (grpc.aio's poller thread) after `could not start`.
            await self.server.stop(0)
            self.metrics.close()
            raise
        self.metrics.ready.set(0)
        log.info(
            "gRPC server listening",
            extra={
                "fields": {
                    "host": cfg.host,
                    "port": self.port,
                    "tls": cfg.tls_enabled,
                    "client_auth": bool(cfg.tls_client_ca),
                    "token_auth": bool(cfg.auth_token),
                    "metrics_port": self.metrics_port if cfg.metrics_port >= 0 else None,
                    "http_port": self.http_port or None,
                }
            },
        )
        self._load_task = asyncio.create_task(self._load())

    async def _start_http(self) -> None:
        """The LibreTranslate-compatible HTTP API and web page on this event loop, over the gRPC
        service's translation core (same validation, scheduler and metrics)."""
        cfg = self.config
        self.http = HttpApi(
            self.service.core,
            self.metrics,
            auth_token=cfg.auth_token,
            limits=HttpLimits.from_config(cfg),
            serving=lambda: self.serving,
            shutdown_grace_s=cfg.shutdown_grace_s,
            file_limits=FileLimits.from_config(cfg),
        )
        context = None
        if cfg.tls_enabled:
            context = server_ssl_context(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)
        self.http_port = await self.http.start(cfg.http_host or cfg.host, cfg.http_port, context)

    async def _set_health(self, serving: bool) -> None:
        self.serving = serving
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def _load(self) -> None:
        cfg = self.config
        try:
            start = time.monotonic()
            backends = []
            for bundle_dir, pairs in zip(self.bundle_dirs, self.pairs, strict=True):
                backends.append(await self._load_model(bundle_dir, pairs))
                if self._stopping:
                    return
            # A pair served twice is refused here (ValueError), before health turns SERVING.
            self.service.core.set_backends(backends)
            default = self.service.core.require_backend()
            self.engine, self.scheduler = default.engine, default.scheduler
            self.bundle_dir = self.bundle_dirs[[b.engine for b in backends].index(default.engine)]
            self.metrics.model_info.clear()
            for b in backends:
                self.metrics.add_model(
                    name=str(b.engine.name),
                    version=str(b.engine.version),
                    variant=cfg.variant,
                    source_language=str(b.engine.source_language),
                    target_language=str(b.engine.target_language),
                    providers=[str(p) for p in b.engine.providers],
                )
            if self._stopping:
                return
            await self._set_health(True)
            self.metrics.ready.set(1)
            log.info(
                "model ready; serving",
                extra={
                    "fields": {
                        "name": default.engine.name,
                        "version": default.engine.version,
                        "providers": list(default.engine.providers),
                        "max_source_tokens": default.engine.max_source_tokens,
                        "batching": default.scheduler.batching,
                        "batching_mode": default.scheduler.mode,
                        "threads": threads_in_use(default.engine),
                        "models": [b.engine.name for b in backends],
                        "pairs": [f"{s}->{t}" for b in backends for s, t in b.served],
                        "load_seconds": round(time.monotonic() - start, 2),
                    }
                },
            )
        except Exception as e:
            self.load_error = e
            self.service.core.cannot_serve(f"the model failed to load: {e}")  # no waiting for it
            log.error("model failed to load", exc_info=True, extra={"fields": {"error": str(e)}})
        finally:
            self._ready.set()

    async def _load_model(self, bundle_dir: Path, pairs: tuple[tuple[str, str], ...]) -> Backend:
        """One model of the store: its engine (warmed up) and its own scheduler (queue and running
        batch), so one model's load never waits behind another's batch (docs/service.md)."""
        cfg = self.config
        log.info(
            "loading model",
            extra={
                "fields": {
                    "bundle": str(bundle_dir),
                    "variant": cfg.variant,
                    "device": cfg.device,
                    "threads": cfg.threads,
                }
            },
        )
        engine = await asyncio.to_thread(self.engine_factory, bundle_dir, cfg)
        if cfg.warmup:
            await asyncio.to_thread(engine.warmup)
        # Its own metrics view: the scheduler's series carry model=<its name> (bounded: the store's).
        metrics = self.metrics.for_model(str(engine.name))
        scheduler = Scheduler(
            engine,
            metrics,
            mode=cfg.effective_batching_mode,
            max_batch_tokens=cfg.max_batch_tokens,
            max_batch_segments=cfg.max_batch_segments,
            max_wait_ms=cfg.max_wait_ms,
            max_queue_segments=cfg.max_queue_segments,
            max_running_tokens=cfg.max_running_tokens,
            max_running_rows=cfg.max_running_rows or (512 if getattr(engine, "on_cuda", False) else 64),
            max_admit_wait_steps=cfg.max_admit_wait_steps,
            max_queue_waiters=cfg.http_queue_waiters,  # only HTTP requests wait in line (HttpLimits)
        )
        self.schedulers.append(scheduler)
        metrics.queue_capacity.set(cfg.max_queue_segments)  # each model's own queue
        # What GetModelInfo reports and the log says: the mode in effect, after any fallback.
        return Backend(engine, scheduler, cfg.variant, scheduler.batching, scheduler.mode, pairs)

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the model is loaded (or failed to: raises the load error)."""
        await asyncio.wait_for(self._ready.wait(), timeout)
        if self.load_error is not None:
            raise RuntimeError(f"model failed to load: {self.load_error}") from self.load_error

    async def stop(self, grace: float | None = None) -> None:
        """Drain: NOT_SERVING, stop accepting, finish in-flight RPCs within `grace` seconds."""
        if self._stopping:
            # A second stop (the second signal's stop(0)) shortens the first one's grace period.
            if grace is not None and self.server is not None:
                await self.server.stop(grace)
            await self._stopped.wait()
            return
        self._stopping = True
        grace = self.config.shutdown_grace_s if grace is None else grace
        log.info(
            "shutting down", extra={"fields": {"grace_s": grace, "drain_delay_s": self.config.drain_delay_s}}
        )
        self.service.core.cannot_serve("the server is shutting down")
        self.metrics.ready.set(0)
        await self._set_health(False)
        if self.config.drain_delay_s > 0:
            await asyncio.sleep(self.config.drain_delay_s)
        self.health.drain()  # open health Watch streams end: the grace period is for translations
        self.service.draining = True
        stops = [self.server.stop(grace)] if self.server is not None else []
        if self.http is not None:
            self.http.shutdown_grace_s = grace
            stops.append(self.http.stop())
        await asyncio.gather(*stops)
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()
        for scheduler in self.schedulers:
            await asyncio.to_thread(scheduler.stop, 10.0)
        self.metrics.close()
        self._stopped.set()
        log.info("stopped")

    async def wait_for_termination(self) -> None:
        await self._stopped.wait()
