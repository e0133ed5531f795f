"""Shared fixtures: a tiny random model exported to a real bundle, the shipped model's bundle, and
real translation servers (in-process on a background event loop, or as subprocesses) on 127.0.0.1.

Nothing here mocks the engine or gRPC: servers run server.engine.Engine on exported ONNX bundles and
tests talk to them over TCP with the real client.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from client.load import free_port
from runtime.bundle import OPTIONAL_GRAPHS

# ONNX Runtime's shared intra-op pool is made once per process and cannot be undone: an in-process server
# started with --threads 0 would put every later test's sessions on it. Tests keep pools per session
# (and so do the servers they start as subprocesses); tests/test_thread_pool.py turns it back on.
os.environ["ENGINE_ORT_SHARED_POOL"] = "0"

REPO_ROOT = Path(__file__).resolve().parents[1]
SHIPPED_CHECKPOINT = REPO_ROOT / "models" / "en-es-small"
SHIPPED_BUNDLE = REPO_ROOT / "bundles" / "en-es-small"
TOKENIZER = SHIPPED_CHECKPOINT / "tokenizer.model"


def copy_without_kv_rows(bundle: Path, dst: Path) -> Path:
    """A copy of `bundle` as exported before the kv_rows and kv_step graphs (in-flight K/V on the
    device) existed."""
    import shutil

    shutil.copytree(bundle, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    for variant in manifest["variants"].values():
        for graph in OPTIONAL_GRAPHS:
            manifest["files"].pop(variant.pop(graph))
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def run_export(checkpoint: Path, out: Path, *extra: str) -> Path:
    """`python -m export` in a subprocess (fp32 only, few parity sentences: fast)."""
    cmd = [
        sys.executable,
        "-m",
        "export",
        "--checkpoint",
        str(checkpoint),
        "--out",
        str(out),
        "--variants",
        "fp32",
        "--parity-sentences",
        "4",
        *extra,
    ]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not (out / "manifest.json").is_file():
        pytest.fail(f"export failed ({' '.join(cmd)}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return out


def make_tiny_checkpoint(out: Path, seed: int = 0) -> Path:
    """A tiny random Transformer with the shipped tokenizer, saved like a trained release."""
    import torch

    from model.model import Transformer, TransformerConfig
    from model.tokenizer import Tokenizer
    from model.train import save_release

    torch.manual_seed(seed)
    tokenizer = Tokenizer(TOKENIZER)
    config = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        n_heads=2,
        d_ff=64,
        n_encoder_layers=1,
        n_decoder_layers=1,
        dropout=0.0,
    )
    save_release(Transformer(config), out, tokenizer, {"note": "tiny random model for tests"})
    return out


@pytest.fixture(scope="module")
def torch_single_thread() -> Iterator[None]:
    """Tiny tensors gain nothing from intra-op threads, and thread spinning is very slow on a shared
    CPU: modules that run PyTorch opt in with `pytestmark = pytest.mark.usefixtures(...)`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    if (cached := _test_cache("tiny-checkpoint", make_tiny_checkpoint)) is not None:
        return cached
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "tiny-test")


@pytest.fixture(scope="session")
def tiny_bundle(tiny_checkpoint, tmp_path_factory) -> Path:
    """Random weights: outputs are gibberish that rarely ends before max_length, which makes decode
    time predictable (handy for deadline, cancellation and drain tests)."""
    if (cached := _test_cache("tiny-bundle", lambda out: run_export(tiny_checkpoint, out))) is not None:
        return cached
    return run_export(tiny_checkpoint, tmp_path_factory.mktemp("tiny-bundle") / "tiny-test")


# TRANSLATOR_TEST_CACHE=DIR: build the tiny checkpoint and bundle once into DIR and reuse them in later
# pytest runs (`make mutation` runs pytest once per mutant; a normal run leaves it unset).
TEST_CACHE_ENV = "TRANSLATOR_TEST_CACHE"


def _test_cache(name: str, build: Callable[[Path], Path]) -> Path | None:
    root = os.environ.get(TEST_CACHE_ENV)
    if not root:
        return None
    out = Path(root) / name / "tiny-test"
    if not out.is_dir():
        import shutil
        import tempfile

        Path(root).mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=root)) / "tiny-test"
        build(staging)
        out.parent.mkdir(exist_ok=True)
        try:
            staging.rename(out)  # atomic: concurrent runs see it whole or not at all
        except OSError:
            pass  # another run got there first
        shutil.rmtree(staging.parent, ignore_errors=True)
    return out


@pytest.fixture(scope="session")
def shipped_bundle(tmp_path_factory) -> Path:
    """bundles/en-es-small if it loads and is not older than the shipped checkpoint, else the shipped
    checkpoint exported to a tmp dir."""
    from runtime.bundle import BundleError, load_manifest
    from server.store import bundle_is_stale, is_checkpoint

    have_checkpoint = is_checkpoint(SHIPPED_CHECKPOINT)
    if (SHIPPED_BUNDLE / "manifest.json").is_file():
        try:
            load_manifest(SHIPPED_BUNDLE, "fp32")
            if not have_checkpoint or not bundle_is_stale(SHIPPED_BUNDLE, SHIPPED_CHECKPOINT):
                return SHIPPED_BUNDLE
        except BundleError:
            pass
    if not have_checkpoint:
        pytest.skip(
            f"no shipped model: {SHIPPED_CHECKPOINT} has no config.json + model.safetensors (make train)"
        )
    # Both variants, as `make bundle` exports them: the int8 server's golden test needs int8.
    out = tmp_path_factory.mktemp("shipped") / "en-es-small"
    return run_export(SHIPPED_CHECKPOINT, out, "--variants", "fp32,int8")


@pytest.fixture(scope="session")
def shipped_store(shipped_bundle, tmp_path_factory) -> Path:
    """A model store with the bundle of every model shipped in models/ (what `make run` serves): the
    default one from `shipped_bundle`, each other one bundles/<name> when it is fresh, else its
    checkpoint exported (fp32) to a tmp dir. Links, so nothing is copied."""
    from runtime.bundle import BundleError, load_manifest
    from server.store import bundle_is_stale, shipped_checkpoints

    store = tmp_path_factory.mktemp("shipped-store")
    (store / SHIPPED_CHECKPOINT.name).symlink_to(shipped_bundle.resolve(), target_is_directory=True)
    for checkpoint in shipped_checkpoints(SHIPPED_CHECKPOINT.parent):
        if checkpoint.name == SHIPPED_CHECKPOINT.name:
            continue
        bundle = REPO_ROOT / "bundles" / checkpoint.name
        try:
            load_manifest(bundle, "fp32")
            fresh = not bundle_is_stale(bundle, checkpoint)
        except (BundleError, OSError):
            fresh = False
        if not fresh:
            bundle = run_export(checkpoint, tmp_path_factory.mktemp("shipped") / checkpoint.name)
        (store / checkpoint.name).symlink_to(bundle.resolve(), target_is_directory=True)
    return store


# ---- in-process servers ----------------------------------------------------------------------------


class _Loop:
    """One background asyncio loop shared by all in-process servers of the session."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-server-loop", daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class RunningServer:
    """A TranslatorServer on the shared background loop, bound to 127.0.0.1 on free ports."""

    def __init__(self, loop: _Loop, config) -> None:
        from server.app import TranslatorServer

        self._loop = loop
        self.config = config
        self.server = TranslatorServer(config)
        self.stopped = False

    def start(self, wait_ready: bool = True, timeout: float = 180) -> RunningServer:
        self._loop.run(self.server.start(), 30)
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 180) -> None:
        self._loop.run(self.server.wait_ready(timeout), timeout + 5)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.server.metrics_port}/metrics"

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            return r.read().decode()

    def sample(self, name: str, **labels: str) -> float:
        """Value of one sample of the /metrics exposition (0.0 when absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        for family in text_string_to_metric_families(self.metrics_text()):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
        return 0.0

    def total(self, metric: str, **labels: str) -> float:
        """A sample of the server's own registry, summed over the labels not given (0.0 when absent):
        in-process, without the /metrics round trip."""
        return sum(
            s.value
            for family in self.server.metrics.registry.collect()
            for s in family.samples
            if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def wait_in_engine(self, timeout: float = 5) -> None:
        """Until the one request in flight has left the queue for the engine. Tests that need a batch still
        decoding when their next step comes wait on this rather than a fixed sleep, which a fast CPU can
        outrun (32 texts at beam 8 on the tiny model take 0.65 s on a 2-core EPYC)."""

        def until(condition) -> None:
            end = time.monotonic() + timeout
            while not condition():
                assert time.monotonic() < end, "timed out waiting for the request to reach the engine"
                time.sleep(0.02)

        until(lambda: self.sample("translator_requests_in_flight") == 1)
        time.sleep(0.05)  # the handler counts the request just before it queues the segments
        until(lambda: self.sample("translator_queue_segments") == 0)

    def stop(self, grace: float = 5) -> None:
        if not self.stopped:
            self.stopped = True
            self._loop.run(self.server.stop(grace), grace + 30)


@pytest.fixture(scope="session")
def server_loop() -> Iterator[_Loop]:
    loop = _Loop()
    yield loop
    loop.close()


def base_config(model_dir: Path | str, **overrides):
    from server.config import ServerConfig

    config = ServerConfig(
        model_dir=str(model_dir),
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        shutdown_grace_s=5,
        log_level="WARNING",
    )
    return replace(config, **overrides)


@pytest.fixture(scope="session")
def start_server(server_loop) -> Iterator[Callable[..., RunningServer]]:
    """start_server(model_dir, wait_ready=True, **config overrides) -> RunningServer (stopped at the end)."""
    servers: list[RunningServer] = []

    def start(model_dir, wait_ready: bool = True, **overrides) -> RunningServer:
        server = RunningServer(server_loop, base_config(model_dir, **overrides))
        servers.append(server)
        return server.start(wait_ready=wait_ready)

    yield start
    for server in servers:
        server.stop(1)


@pytest.fixture(scope="session")
def shipped_server(start_server, shipped_bundle) -> RunningServer:
    """The shipped model with default batching settings (shared: tests must not change it)."""
    return start_server(shipped_bundle)


@pytest.fixture(scope="session")
def tiny_server(start_server, tiny_bundle) -> RunningServer:
    return start_server(tiny_bundle, max_texts=16)


@pytest.fixture(scope="session")
def fake_bundle(tmp_path_factory) -> Path:
    """A directory the model store takes for a bundle (it has a manifest.json); the servers of
    `start_fake_server` never read it."""
    path = tmp_path_factory.mktemp("fake-bundle")
    (path / "manifest.json").write_text("{}\n")
    return path


@pytest.fixture()
def start_fake_server(server_loop, fake_bundle) -> Iterator[Callable[..., RunningServer]]:
    """start_fake_server(engine=None, wait_ready=True, **config overrides) -> RunningServer: the real
    TranslatorServer (gRPC, scheduler, metrics) over tests/fake_engine.py's FakeEngine (or `engine`), no
    warm-up; `.engine` is the engine. Milliseconds per request, no ONNX: for the serving side's tests."""
    from tests.fake_engine import FakeEngine

    servers: list[RunningServer] = []

    def start(engine=None, wait_ready: bool = True, **overrides) -> RunningServer:
        overrides.setdefault("warmup", False)
        server = RunningServer(server_loop, base_config(fake_bundle, **overrides))
        server.engine = engine if engine is not None else FakeEngine(step_s=0.001)
        server.server.engine_factory = lambda bundle_dir, config: server.engine
        servers.append(server)
        return server.start(wait_ready=wait_ready)

    yield start
    for server in servers:
        gate = getattr(server.engine, "gate", None)
        if gate is not None:
            gate.set()
        server.stop(1)


@pytest.fixture()
def loading_http_server(
    server_loop, fake_bundle
) -> Iterator[Callable[..., tuple[RunningServer, threading.Event]]]:
    """loading_http_server(model_dir=None, **config overrides) -> (server, gate): a fake-engine server
    with the HTTP API on a free port whose model (`model_dir`, default the fake bundle) is still loading
    until the test sets `gate` (30 s at most); stopped at the end."""
    from tests.fake_engine import FakeEngine

    started: list[tuple[RunningServer, threading.Event]] = []

    def start(model_dir: Path | None = None, **overrides) -> tuple[RunningServer, threading.Event]:
        gate = threading.Event()

        def slow_load(bundle_dir, config):
            gate.wait(30)
            return FakeEngine(step_s=0)

        overrides = {"warmup": False, "http_port": free_port(), **overrides}
        server = RunningServer(server_loop, base_config(model_dir or fake_bundle, **overrides))
        server.server.engine_factory = slow_load
        started.append((server, gate))
        server.start(wait_ready=False)
        return server, gate

    yield start
    for server, gate in started:
        gate.set()
        server.stop(1)


@pytest.fixture()
def client_for():
    """client_for(server, **kwargs) -> TranslatorClient (closed at the end)."""
    from client import TranslatorClient

    clients = []

    def make(server: RunningServer | str, **kwargs) -> TranslatorClient:
        target = server if isinstance(server, str) else server.target
        kwargs.setdefault("timeout", 60)
        c = TranslatorClient(target, **kwargs)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()


# ---- subprocess servers ----------------------------------------------------------------------------


class ServerProcess:
    """`python -m server` in a subprocess with TRANSLATOR_* settings; logs go to a file."""

    def __init__(self, log_path: Path, env: dict[str, str], args: list[str] = ()) -> None:
        self.port = int(env["TRANSLATOR_PORT"])
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "server", *args],
            cwd=REPO_ROOT,
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_lines(self) -> list[dict]:
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


@pytest.fixture()
def server_process(tmp_path) -> Iterator[Callable[..., ServerProcess]]:
    procs: list[ServerProcess] = []

    def start(env: dict[str, str], args: list[str] = ()) -> ServerProcess:
        env = {
            "TRANSLATOR_HOST": "127.0.0.1",
            "TRANSLATOR_PORT": str(free_port()),
            "TRANSLATOR_METRICS_PORT": "-1",
            **env,
        }
        p = ServerProcess(tmp_path / f"server-{len(procs)}.log", env, list(args))
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()


def wait_serving(target: str, timeout: float = 60, **client_kwargs) -> list[str]:
    """Poll the health service until SERVING; return the statuses seen (connection errors excluded)."""
    from client import TranslatorClient, TranslatorError

    seen: list[str] = []
    end = time.monotonic() + timeout
    with TranslatorClient(target, **client_kwargs) as c:
        while time.monotonic() < end:
            try:
                status = c.health(timeout=2)
                seen.append(status)
                if status == "SERVING":
                    return seen
            except TranslatorError:
                pass
            time.sleep(0.05)
    raise TimeoutError(f"{target} not SERVING after {timeout}s (seen {seen[-5:]})")
