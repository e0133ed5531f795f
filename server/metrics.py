"""Prometheus metrics of the translation server (prefix ``translator_``, base units).

Each server instance owns a CollectorRegistry, so several servers can live in one process (tests).
"""

from __future__ import annotations

import copy
import logging
import os
import socket
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger(__name__)

# Translation latencies: a few ms (short segment, idle server) to tens of seconds (long beams, overload).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)
QUEUE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_SEGMENT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BATCH_ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
BATCH_TOKEN_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


# The scheduler's and engine's metrics carry the model that did the work (`model`: a loaded model's name,
# from its bundle manifest, never from a client: as many values as models in the store).
MODEL_LABEL = ("model",)
MODEL_METRICS = (
    "queue_wait",
    "batch_segments",
    "batch_tokens",
    "batch_decode",
    "step_seconds",
    "batch_rows",
    "decode_steps",
    "time_to_first_step",
    "input_tokens",
    "generated_tokens",
    "segments",
    "queue_segments",
    "queue_capacity",
    "queue_tokens",
    "engine_errors",
    "admission_wait",
    "admissions",
    "queue_waiters",
)
# Per-model metrics with labels of their own beyond `model` (their view binds `model` only).
MULTI_LABEL_METRICS = ("segments", "admissions")
# How a request that found the queue full ended (server/scheduler/queue.py); every series exists from the
# start, so that rate() and alerts see a 0 rather than nothing.
ADMISSION_OUTCOMES = ("admitted", "timed_out", "cancelled", "refused")


class _ModelBound:
    """A labelled metric with `model` fixed: `.labels(outcome=...)` adds the other labels."""

    def __init__(self, family: Any, model: str) -> None:
        self.family = family
        self.model = model

    def labels(self, **labels: str) -> Any:
        return self.family.labels(model=self.model, **labels)


class Metrics:
    """The server's metrics. The per-model ones (MODEL_METRICS) are reached through `for_model(name)`,
    a view whose attributes of those names are bound to that model (each model's scheduler gets its
    own view); on the server-wide object they are bound to model="" (a scheduler built without one)."""

    def __init__(self, registry: CollectorRegistry | None = None, process_metrics: bool = True) -> None:
        self.registry = registry or CollectorRegistry()
        self.families: dict[str, Any] = {}
        r = self.registry
        if process_metrics:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        self.requests = Counter(
            "translator_requests",
            "Finished requests by method, gRPC status code (HTTP requests too: their status mapped to the "
            "gRPC code of the same meaning) and transport (grpc, http); TranslateStream: per call.",
            ["rpc", "code", "transport"],
            registry=r,
        )
        self.stream_items = Counter(
            "translator_stream_items",
            "Finished TranslateStream items by gRPC status code.",
            ["code"],
            registry=r,
        )
        self.request_latency = Histogram(
            "translator_request_duration_seconds",
            "Time from receipt to answer of Translate calls, TranslateStream items and HTTP translations "
            "(rpc Translate, TranslateFile), by transport.",
            ["rpc", "transport"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.model_latency = Histogram(
            "translator_model_duration_seconds",
            "Time from routing to answer of translations (text layer, queue, decode; errors included), "
            "by model: the model's own latency, whatever carried the request.",
            labelnames=MODEL_LABEL,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.families["queue_wait"] = Histogram(
            "translator_queue_wait_seconds",
            "Time a segment waited in the queue before its engine batch.",
            buckets=QUEUE_BUCKETS,
            labelnames=MODEL_LABEL,
            registry=r,
        )
        self.families["batch_segments"] = Histogram(
            "translator_batch_segments",
            "Segments per engine batch.",
            buckets=BATCH_SEGMENT_BUCKETS,
            labelnames=MODEL_LABEL,
            registry=r,
        )
        self.families["batch_tokens"] = Histogram(
            "translator_batch_tokens",
            "Source tokens per engine batch (without padding).",
            buckets=BATCH_TOKEN_BUCKETS,
            labelnames=MODEL_LABEL,
            registry=r,
        )
        self.families["batch_decode"] = Histogram(
            "translator_batch_decode_seconds",
            "Engine time per batch (encode + decode).",
            buckets=LATENCY_BUCKETS,
            labelnames=MODEL_LABEL,
            registry=r,
        )
        self.families["step_seconds"] = Histogram(
            "translator_decode_step_seconds",
            "Engine time per decoding step. In-flight mode: each step of the running batch, admissions "
            "(encoder) included; request mode: the batch's decoder time over its steps, once per step.",
            buckets=STEP_BUCKETS,
            labelnames=MODEL_LABEL,
            registry=r,
        )
        self.families["batch_rows"] = Histogram(
            "translator_batch_rows",
            "Decoder rows (sentences x beam rows) per decoding step: batch occupancy. Request mode: "
            "the batch's mean per step.",
            buckets=BATCH_ROW_BUCKETS,
            labelnames=MODEL_LABEL,
            registry=r,
        )
        self.families["decode_steps"] = Counter(
            "translator_decode_steps",
            "Decoding steps run by the engine (rate: steps per second).",
            labelnames=MODEL_LABEL,
            registry=r,
        )
        self.families["time_to_first_step"] = Histogram(
            "translator_time_to_first_step_seconds",
            "Time from a segment's arrival to the end of its first decoding step (request mode: "
            "estimated as batch start + encoder time + mean step time).",
            buckets=QUEUE_BUCKETS,
            labelnames=MODEL_LABEL,
            registry=r,
        )
        self.families["input_tokens"] = Counter(
            "translator_input_tokens",
            "Source tokens of translated segments.",
            labelnames=MODEL_LABEL,
            registry=r,
        )
        self.families["generated_tokens"] = Counter(
            "translator_generated_tokens",
            "Generated target tokens (best hypothesis) of translated segments.",
            labelnames=MODEL_LABEL,
            registry=r,
        )
        self.families["segments"] = Counter(
            "translator_segments",
            "Segments leaving the scheduler, by outcome.",
            ["model", "outcome"],
            registry=r,
        )
        self.text_segments = Counter(
            "translator_text_segments",
            "Segments the text layer did not return as the model wrote them, by action "
            "(passed_through: kept untranslated; repaired: another hypothesis or a span put back; "
            "memory: a whole text from the translation memory).",
            ["action"],
            registry=r,
        )
        for action in ("passed_through", "repaired", "memory"):
            self.text_segments.labels(action=action)
        self.in_flight = Gauge(
            "translator_requests_in_flight",
            "Translate calls and TranslateStream items being served.",
            registry=r,
        )
        self.families["queue_segments"] = Gauge(
            "translator_queue_segments",
            "Segments waiting for an engine batch.",
            labelnames=MODEL_LABEL,
            registry=r,
        )
        self.families["queue_capacity"] = Gauge(
            "translator_queue_capacity_segments",
            "Segments the queue holds before new requests get RESOURCE_EXHAUSTED.",
            labelnames=MODEL_LABEL,
            registry=r,
        )
        self.families["queue_tokens"] = Gauge(
            "translator_queue_tokens",
            "Source tokens of the segments waiting for an engine batch.",
            labelnames=MODEL_LABEL,
            registry=r,
        )
        # Requests that found the queue full: HTTP ones wait in line for room (bounded), gRPC ones are
        # refused at once; how long they waited shows whether the queue or the wait bound is too small.
        self.families["admission_wait"] = Histogram(
            "translator_admission_wait_seconds",
            "Time a request waited in line for room in a full queue (HTTP API), whatever came of it.",
            buckets=QUEUE_BUCKETS,
            labelnames=MODEL_LABEL,
            registry=r,
        )
        self.families["admissions"] = Counter(
            "translator_admissions",
            "Requests that found the queue full, by outcome: admitted (after waiting in line), "
            "timed_out (429 after the wait bound), cancelled (the client left or its deadline passed "
            "while waiting), refused (at once: gRPC, or the line of waiting requests was full).",
            ["model", "outcome"],
            registry=r,
        )
        self.families["queue_waiters"] = Gauge(
            "translator_queue_waiting_requests",
            "Requests waiting in line for room in a full queue.",
            labelnames=MODEL_LABEL,
            registry=r,
        )
        self.model_wait = Histogram(
            "translator_model_wait_seconds",
            "Time HTTP requests that arrived while the models were loading waited for them (served or "
            "refused with 503 at the wait bound).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.families["engine_errors"] = Counter(
            "translator_engine_errors",
            "Engine batches that raised an error.",
            labelnames=MODEL_LABEL,
            registry=r,
        )
        self.model_info = Gauge(
            "translator_model_info",
            "The loaded model (value 1).",
            ["name", "version", "variant", "source_language", "target_language", "providers"],
            registry=r,
        )
        self.ready = Gauge(
            "translator_ready", "1 when the model is loaded and the server is SERVING, else 0.", registry=r
        )
        self._http = None
        self._thread: threading.Thread | None = None

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not set: the per-model metrics of an object that is no view.
        if name in MODEL_METRICS and "families" in self.__dict__:
            bound = self._bind(name, "")
            setattr(self, name, bound)
            return bound
        raise AttributeError(name)

    def _bind(self, name: str, model: str) -> Any:
        family = self.families[name]
        return _ModelBound(family, model) if name in MULTI_LABEL_METRICS else family.labels(model=model)

    def for_model(self, model: str) -> Metrics:
        """This registry's metrics with the per-model ones bound to `model` (for its scheduler)."""
        view = copy.copy(self)
        for name in MODEL_METRICS:
            setattr(view, name, self._bind(name, model))
        for outcome in ADMISSION_OUTCOMES:
            view.admissions.labels(outcome=outcome)
        return view

    def set_model(self, **info: Any) -> None:
        """The one loaded model's info series, replacing any before (the fields of `add_model`)."""
        self.model_info.clear()
        self.add_model(**info)

    def add_model(
        self,
        *,
        name: str,
        version: str,
        variant: str,
        source_language: str,
        target_language: str,
        providers: list[str],
    ) -> None:
        """One more loaded model's info series (several models: one series each)."""
        self.model_info.labels(
            name=name,
            version=version,
            variant=variant,
            source_language=source_language,
            target_language=target_language,
            providers=",".join(providers),
        ).set(1)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, host: str, port: int) -> int:
        """Start the /metrics HTTP endpoint (prometheus_client's WSGI app, a daemon thread per scrape)
        in a daemon thread; return the bound port. OSError naming the address when it cannot listen.

        As prometheus_client's start_http_server, but the serving loop looks for close() every
        CLOSE_POLL_S instead of every 0.5 s: a server's shutdown does not wait for it."""
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

        class Server(ThreadingWSGIServer):
            address_family = family

        try:
            self._http = make_server(host, port, make_wsgi_app(self.registry), Server, _QuietHandler)
        except OSError as e:
            reason = os.strerror(e.errno) if e.errno else str(e)
            raise OSError(e.errno, f"cannot serve /metrics on {host}:{port}: {reason}") from None
        self._thread = threading.Thread(
            target=self._http.serve_forever, args=(CLOSE_POLL_S,), name="metrics-http", daemon=True
        )
        self._thread.start()
        bound = self._http.server_port
        log.info("metrics endpoint listening", extra={"fields": {"host": host, "port": bound}})
        return bound

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


CLOSE_POLL_S = 0.02


class _QuietHandler(WSGIRequestHandler):
    """Scrapes are not logged (every 5 s, by every Prometheus)."""

    def log_message(self, format: str, *args: object) -> None:
        pass
