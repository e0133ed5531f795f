"""Server configuration: command-line flags, each with a TRANSLATOR_* environment variable.

Precedence: flag > environment variable > default. The names of the environment variables are part
of the deployment contract (docs/service.md lists them).
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from server.scheduler import MODES as BATCHING_MODES

ENV_PREFIX = "TRANSLATOR_"
# What server/engine/sessions.py (open_sessions) accepts, case-insensitive: checked here so a bad
# device is a configuration error (exit 2), not a model that fails to load.
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:[0-9]+)?")
DEVICES = "auto, cpu, cuda or cuda:N"
# An origin as browsers send it (scheme://host[:port], no path): a configured one with a path or a
# trailing slash could never match, so it is a configuration error.
CORS_ORIGIN = re.compile(r"https?://[^\s/?#,*]+")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass
class ServerConfig:
    model_dir: str = ""  # bundle dir (manifest.json); "" = <bundles_dir>/en-es-small (server/store.py)
    bundles_dir: str = ""  # the model store: where the default bundle is; "" = <repo>/bundles
    models: str = ""  # comma-separated bundles to serve (paths or names in bundles_dir); "" = model_dir
    host: str = "0.0.0.0"
    port: int = 50051  # 0 = any free port
    metrics_host: str = ""  # "" = same as host
    metrics_port: int = 8000  # 0 = any free port, -1 = no metrics endpoint
    http_host: str = ""  # "" = same as host
    http_port: int = 0  # LibreTranslate-compatible HTTP API and web page; 0 = off (compose: 5000)
    variant: str = "fp32"  # fp32 | int8
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    cuda_tf32: bool = True  # CUDA: TF32 math in fp32 matrix products (Ampere and newer); false = full fp32
    threads: int = 0  # ONNX Runtime intra-op threads; 0 = one per physical core (engine: physical_cores)
    batching: bool = True  # False: every engine batch holds segments of one request only (= mode off)
    batching_mode: str = "inflight"  # inflight | request | off (batching=false forces off)
    max_batch_tokens: int = 4096  # padded source tokens per engine batch
    max_batch_segments: int = 64
    max_wait_ms: float = 10.0  # how long a segment may wait for a batch to fill
    max_running_tokens: int = 16384  # in-flight: KV-cache budget, sum of beam x (source + output budget)
    max_running_rows: int = 0  # in-flight: decoder rows (sum of beam sizes); 0 = auto (64 CPU, 512 CUDA)
    max_admit_wait_steps: int = 16  # in-flight fairness: steps before skip-ahead stops / preemption
    max_queue_segments: int = 1024  # queued (not yet decoding) segments; beyond: RESOURCE_EXHAUSTED
    max_texts: int = 64  # texts per request
    max_message_bytes: int = 4 * 1024 * 1024  # gRPC max receive/send message size
    max_stream_inflight: int = 64  # unanswered items per TranslateStream call before reading pauses
    # HTTP port limits (server/http_limits.py HttpLimits reads these; docs/service.md "Limits and hardening").
    http_header_timeout_s: float = 10.0  # a request's line and headers must arrive within this
    http_keepalive_timeout_s: float = 15.0  # an idle keep-alive connection is closed after this
    http_body_timeout_s: float = 30.0  # a request's body must arrive within this once its headers have
    http_max_connections: int = 1000  # open HTTP connections; beyond: 503 and closed (also <= fds / 2)
    # Browser origins allowed to call the HTTP API (CORS): "" = none (no CORS headers), "*" = any, or a
    # comma-separated list of exact origins. Off by default: see docs/service.md "HTTP API".
    http_cors_origins: str = ""
    # HTTP callers wait this long for room in a full queue (and for a loading model) before a 429 (503);
    # at most http_queue_waiters of them per model wait at once, the rest get 429 at once. gRPC callers
    # never wait: RESOURCE_EXHAUSTED at once (docs/service.md "Waiting for capacity").
    http_queue_wait_s: float = 30.0
    http_queue_waiters: int = 256
    # gRPC limits: health Watch streams (all connections together) and streams per HTTP/2 connection.
    max_health_watches: int = 100
    grpc_max_streams_per_connection: int = 128
    # /translate_file limits (server/files.py FileLimits reads these; the defaults are FileLimits').
    file_max_entries: int = 50_000  # entries of one catalog
    file_max_output_bytes: int = 16 * 1024 * 1024  # one translated file
    file_check_timeout_s: float = 30.0  # each msgfmt run on a catalog; killed past it
    file_workers: int = 2  # threads that parse, fill and check files
    file_queue_share: float = 0.125  # share of max_queue_segments all files together may hold
    download_store_bytes: int = 64 * 1024 * 1024  # translated files kept for /download_file
    download_ttl_s: float = 900.0  # how long a translated file is kept
    http_public_url: str = ""  # base of download links (https://host/prefix); "" = links relative to the host
    tls_cert: str = ""  # PEM server certificate chain; with tls_key enables TLS
    tls_key: str = ""
    tls_client_ca: str = ""  # PEM CA bundle; set = clients must present a certificate signed by it
    auth_token: str = ""  # set = every RPC but health needs `authorization: Bearer <token>`
    shutdown_grace_s: float = 30.0  # how long in-flight RPCs may run after SIGTERM
    drain_delay_s: float = 0.0  # NOT_SERVING this long before refusing new RPCs (load balancers)
    warmup: bool = True
    memory: bool = True  # answer texts the bundle's translation memory has with Debian's own translation
    lexical_guard: bool = True  # a segment's best hypothesis with a word in no dictionary gives way
    dictionary_terms: bool = True  # words the catalogs seldom hold, translated as the dictionaries do
    log_level: str = "INFO"  # DEBUG | INFO | WARNING | ERROR | CRITICAL, any case

    @property
    def effective_batching_mode(self) -> str:
        """The batching mode in force: TRANSLATOR_BATCHING=false means off whatever the mode says."""
        return self.batching_mode if self.batching else "off"

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_cert or self.tls_key)

    def validate(self) -> None:
        """Raise ValueError with every problem on one line, each naming the setting (flag and
        variable) and the values it allows. The one check of settings, flags and TRANSLATOR_* alike."""
        errors = []

        def bad(name: str, allowed: str, value: object) -> None:
            errors.append(f"{setting(name)} must be {allowed}, got {value!r}")

        if self.variant not in ("fp32", "int8"):
            bad("variant", "fp32 or int8", self.variant)
        if not DEVICE_PATTERN.fullmatch(self.device.lower()):
            bad("device", DEVICES, self.device)
        if self.log_level.upper() not in LOG_LEVELS:
            bad("log_level", f"{', '.join(LOG_LEVELS)} (any case)", self.log_level)
        if self.batching_mode not in BATCHING_MODES:
            bad("batching_mode", ", ".join(BATCHING_MODES), self.batching_mode)
        if not 0 <= self.port <= 65535:
            bad("port", "0..65535 (0 = any free port)", self.port)
        if not (0 <= self.metrics_port <= 65535 or self.metrics_port == -1):
            bad("metrics_port", "0..65535 (0 = any free port) or -1 (no metrics endpoint)", self.metrics_port)
        if not 0 <= self.http_port <= 65535:
            bad("http_port", "0..65535 (0 = no HTTP API)", self.http_port)
        if self.threads < 0:
            bad("threads", ">= 0 (0 = one per physical core)", self.threads)
        if self.max_admit_wait_steps < 0:
            bad("max_admit_wait_steps", ">= 0", self.max_admit_wait_steps)
        if self.max_running_rows < 0:
            bad("max_running_rows", ">= 0 (0 = auto)", self.max_running_rows)
        for name in (
            "max_batch_tokens",
            "max_batch_segments",
            "max_running_tokens",
            "max_queue_segments",
            "max_texts",
            "max_message_bytes",
            "max_stream_inflight",
            "http_max_connections",
            "max_health_watches",
            "grpc_max_streams_per_connection",
        ):
            if getattr(self, name) < 1:
                bad(name, ">= 1", getattr(self, name))
        if self.http_queue_waiters < 0:
            bad("http_queue_waiters", ">= 0 (0 = nobody waits: 429 at once)", self.http_queue_waiters)
        for name in ("max_wait_ms", "shutdown_grace_s", "drain_delay_s", "http_queue_wait_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                bad(name, "a finite number >= 0", value)
        for name in ("http_header_timeout_s", "http_keepalive_timeout_s", "http_body_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                bad(name, "a finite number > 0", value)
        if self.auth_token != self.auth_token.strip(" \t"):
            # Presented tokens are compared without surrounding blanks (server/auth.py): a configured
            # token with one could never match.
            errors.append(f"{setting('auth_token')} must not start or end with a space or tab")
        for name in ("file_max_entries", "file_max_output_bytes", "file_workers", "download_store_bytes"):
            if getattr(self, name) < 1:
                bad(name, ">= 1", getattr(self, name))
        for name in ("file_check_timeout_s", "download_ttl_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                bad(name, "a finite number > 0", value)
        if not (math.isfinite(self.file_queue_share) and 0 < self.file_queue_share <= 1):
            bad("file_queue_share", "a number in (0, 1]", self.file_queue_share)
        if self.http_public_url and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", self.http_public_url):
            bad("http_public_url", "an http(s):// URL without query or fragment", self.http_public_url)
        origins = [o.strip() for o in self.http_cors_origins.split(",") if o.strip()]
        if origins != ["*"] and not all(CORS_ORIGIN.fullmatch(o) for o in origins):
            bad(
                "http_cors_origins",
                "empty, * or comma-separated origins (https://host[:port])",
                self.http_cors_origins,
            )
        if self.max_texts > self.max_queue_segments:
            errors.append(
                f"{setting('max_texts')} ({self.max_texts}) must not exceed "
                f"{setting('max_queue_segments')} ({self.max_queue_segments})"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            errors.append("TLS needs both a certificate (TRANSLATOR_TLS_CERT) and a key (TRANSLATOR_TLS_KEY)")
        if self.tls_client_ca and not self.tls_enabled:
            errors.append("client certificate verification (TRANSLATOR_TLS_CLIENT_CA) needs TLS cert and key")
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            value = getattr(self, name)
            if value and not Path(value).is_file():
                errors.append(f"{setting(name)}: no such file {value!r}")
        if errors:
            raise ValueError("invalid configuration: " + "; ".join(errors))


def setting(field_name: str) -> str:
    """How messages name a setting: `threads (--threads / TRANSLATOR_THREADS)`."""
    return f"{field_name} ({'--' + field_name.replace('_', '-')} / {env_name(field_name)})"


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def _parse_bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def _convert(kind: type, value: str):
    if kind is bool:
        return _parse_bool(value)
    return kind(value)


# What a value that does not parse should have been, by type.
KINDS = {int: "an integer", float: "a number", bool: "true/false, 1/0, yes/no or on/off"}


class _Parser(argparse.ArgumentParser):
    """An unknown flag or a flag without its value is a configuration error like any other: one line,
    exit 2 (server/__main__.py prints it), not argparse's usage line plus its message."""

    def error(self, message: str):  # type: ignore[override]
        raise ValueError(f"invalid configuration: {message} (python -m server --help lists the flags)")


_TYPES = {"str": str, "int": int, "float": float, "bool": bool}

HELP = {
    "model_dir": "model bundle dir (with manifest.json, written by `python -m export`; checkpoints are "
    "not exported at start-up); default: <bundles-dir>/en-es-small, which must not be older than "
    "models/en-es-small (`make bundle` exports it)",
    "bundles_dir": "the model store: where the default bundle en-es-small is, and where the export "
    "command suggested for a checkpoint writes (default: <repo>/bundles)",
    "models": "several models: comma-separated bundle dirs or names of bundles in the bundles dir, each "
    "serving the language pairs its manifest declares (default: model_dir; a model_dir holding bundles "
    "in its subdirectories serves all of them)",
    "host": "address to listen on",
    "port": "gRPC port, 0..65535 (0 = any free port)",
    "metrics_host": "address of the Prometheus /metrics endpoint (default: --host)",
    "metrics_port": "Prometheus /metrics port, 0..65535 (0 = any free port) or -1 = disabled; plain "
    "HTTP even with TLS on",
    "http_host": "address of the HTTP API and web page (default: --host)",
    "http_port": "port of the LibreTranslate-compatible HTTP API and the web page, 0..65535 (0 = off); "
    "HTTPS with the gRPC certificate when TLS is on, the bearer token doubles as api_key",
    "variant": "weights variant: fp32 or int8",
    "device": "execution device: auto (CUDA when usable, else CPU), cpu, cuda or cuda:N",
    "cuda_tf32": "on CUDA, let fp32 matrix products use TF32 math (Ampere and newer GPUs: faster, "
    "log-probs within about 2e-2 of the CPU's); false: full fp32 precision. No effect on the CPU",
    "threads": "ONNX Runtime intra-op threads, >= 0 (0 = one per physical core available to the "
    "process; the 'model ready' log line shows the number used)",
    "batching": "batch segments of different requests together (false: one request per engine batch)",
    "batching_mode": "inflight (one running decode batch; requests join and leave at every decoding "
    "step), request (batches of queued requests decode to the end) or off (one request per batch)",
    "max_batch_tokens": "request mode: padded source tokens x beam size per engine batch",
    "max_batch_segments": "segments per engine batch (in-flight: running segments)",
    "max_running_tokens": "in-flight mode: KV-cache budget of the running batch, as the sum of "
    "beam x (source tokens + generation budget) of the running segments",
    "max_running_rows": "in-flight mode: decoder rows of the running batch (sum of beam sizes); "
    "0 = auto: 64 on CPU (past that a step costs the same per row, so more rows only slow every "
    "sentence), 512 on CUDA",
    "max_admit_wait_steps": "in-flight mode: decoding steps the oldest waiting segment may be passed "
    "over before later ones stop skipping ahead and later running ones are preempted",
    "max_wait_ms": "longest wait for a batch to fill, in milliseconds",
    "max_queue_segments": "queued segments before new requests get RESOURCE_EXHAUSTED",
    "max_texts": "texts per request",
    "max_message_bytes": "largest gRPC message, in bytes",
    "max_stream_inflight": "unanswered items per TranslateStream call before the server stops reading",
    "http_header_timeout_s": "seconds (> 0) an HTTP client has to send a request's line and headers, "
    "from its connection or its previous response on; slower connections are closed",
    "http_keepalive_timeout_s": "seconds (> 0) an idle HTTP keep-alive connection stays open",
    "http_body_timeout_s": "seconds (> 0) an HTTP client has to send a request's body once its headers "
    "are in; slower requests get 408",
    "http_max_connections": "open HTTP connections, >= 1; past it a new connection gets 503 and is "
    "closed (never more than half the process's open-file limit, so gRPC keeps descriptors)",
    "http_cors_origins": "browser origins allowed to call the HTTP API (CORS): empty = none (no CORS "
    "headers, the default), * = any origin (as LibreTranslate), or comma-separated exact origins "
    "(https://app.example.org,http://localhost:8080)",
    "http_queue_wait_s": "seconds (>= 0) an HTTP request waits in line for room in a full queue, and for "
    "a model still loading, before it gets 429 (503); never past its timeout_ms; 0 = 429 and 503 at once",
    "http_queue_waiters": "HTTP requests that may wait in line for room at once, per model, >= 0; past "
    "it a request gets 429 at once",
    "max_health_watches": "open gRPC health Watch streams, all clients together, >= 1; past it Watch "
    "answers RESOURCE_EXHAUSTED",
    "grpc_max_streams_per_connection": "concurrent gRPC streams (calls) per client connection, >= 1 "
    "(HTTP/2 MAX_CONCURRENT_STREAMS; a client queues calls past it)",
    "file_max_entries": "entries a catalog sent to /translate_file may have, >= 1",
    "file_max_output_bytes": "largest file /translate_file writes, in bytes, >= 1",
    "file_check_timeout_s": "seconds (> 0) each msgfmt run on an uploaded catalog may take; it is "
    "killed past them (504)",
    "file_workers": "threads that parse, fill and check uploaded files, >= 1 (never on the event loop)",
    "file_queue_share": "share of --max-queue-segments that all files being translated together may "
    "keep queued, in (0, 1]; the rest stays free for other clients",
    "download_store_bytes": "bytes of translated files kept for /download_file, >= 1; when full, new "
    "uploads get 503 with Retry-After (kept files are never evicted early)",
    "download_ttl_s": "seconds (> 0) a translated file is kept for /download_file",
    "http_public_url": "the server's public base URL (https://host/prefix) for download links; empty: "
    "links are relative to the host the client used (never taken from its Host header)",
    "tls_cert": "PEM server certificate (chain); enables TLS together with --tls-key",
    "tls_key": "PEM server private key",
    "tls_client_ca": "PEM CA certificates; when set, clients must present a certificate signed by one",
    "auth_token": "bearer token required on every RPC except health checks",
    "shutdown_grace_s": "seconds (>= 0) in-flight RPCs may run after SIGTERM/SIGINT",
    "drain_delay_s": "seconds (>= 0) to report NOT_SERVING before refusing new RPCs on shutdown",
    "warmup": "run a warm-up translation before reporting SERVING",
    "memory": "answer a text that Debian's translators already translated with their translation "
    "(the bundle's translation memory)",
    "lexical_guard": "a segment whose best hypothesis holds a word in none of the bundle's dictionaries "
    "(not copied from the source, nor a memory or do-not-translate term) takes the next hypothesis "
    "without one, else keeps it with a note (off, or a bundle without a lexicon: no guard)",
    "dictionary_terms": "translate a word or phrase that Debian's catalogs seldom hold as the bundle's "
    "bilingual dictionaries do, when they give one translation (off, or a bundle without "
    "dictionary_terms.tsv: the model translates it)",
    "log_level": "DEBUG, INFO, WARNING, ERROR or CRITICAL (any case)",
}


def build_parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The flags; each is parsed as text (None when not given) and converted by load_config, so that a
    flag and its variable get the same message. --help shows the variables' values as defaults."""
    env = os.environ if env is None else env
    parser = _Parser(
        prog="python -m server",
        description="English->Spanish translation gRPC server. Every flag can also be set with the "
        "environment variable shown in brackets.",
    )
    defaults = ServerConfig()
    for f in fields(ServerConfig):
        kind = _TYPES[f.type] if isinstance(f.type, str) else f.type
        flag = "--" + f.name.replace("_", "-")
        var = env_name(f.name)
        default = getattr(defaults, f.name)
        if var in env:
            try:
                default = _convert(kind, env[var])
            except ValueError:
                default = env[var]
        help_text = f"{HELP[f.name]} [{var}] (default: {default!r})"
        if kind is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, metavar=f.name.upper(), help=help_text)
    return parser


def load_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> ServerConfig:
    """Flags over TRANSLATOR_* environment variables over defaults; validated. Raises ValueError with
    one line naming every bad setting."""
    env = os.environ if env is None else env
    args = build_parser(env).parse_args(argv)
    values, errors = {}, []
    for f in fields(ServerConfig):
        kind = _TYPES[f.type] if isinstance(f.type, str) else f.type
        raw = getattr(args, f.name)
        if raw is None:
            raw = env.get(env_name(f.name))
        if raw is None or isinstance(raw, bool):  # unset, or a --[no-]flag
            if raw is not None:
                values[f.name] = raw
            continue
        try:
            values[f.name] = _convert(kind, raw)
        except ValueError:
            errors.append(f"{setting(f.name)} must be {KINDS[kind]}, got {raw!r}")
    if errors:
        raise ValueError("invalid configuration: " + "; ".join(errors))
    config = ServerConfig(**values)
    config.validate()
    config.log_level = config.log_level.upper()
    config.device = config.device.lower()
    return config
