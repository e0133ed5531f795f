"""ONNX Runtime's process-wide intra-op pool (server/engine/sessions.py, `use_shared_pool`).

ONNX Runtime makes that pool once per process, so each case runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

TRANSLATE = """
import json, sys
import onnxruntime as ort
from server.engine import DecodingOptions, Engine, use_shared_pool

bundle, threads, pool, made_before = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if made_before:
    ort.set_global_thread_pool_sizes(made_before, 1)  # other code in the process made the pool
made = [use_shared_pool(pool), use_shared_pool(pool + 1)] if pool >= 0 else []
options = DecodingOptions(beam_size=4, num_hypotheses=1, max_length=12)
texts = ["Open the file", "Save the document before closing it.", "Settings"]
tokens = []
for n in (threads, 1):  # a second engine asking for another thread count loads all the same
    engine = Engine(bundle, variant="fp32", device="cpu", intra_op_threads=n)
    tokens.append([r[0].tokens for r in engine.translate(texts, options)])
print(json.dumps({"tokens": tokens, "made": made}))
"""


def python(code: str, *args: object, **env: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter (ONNX Runtime's pool is per process), the shared pool allowed."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=REPO_ROOT,
        env={**os.environ, "ENGINE_ORT_SHARED_POOL": "1", **env},  # conftest turns it off
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def run(bundle: Path, threads: int, pool: int, made_before: int = 0, **env: str) -> dict:
    proc = python(TRANSLATE, bundle, threads, pool, made_before, **env)
    # No "thread counts are ignored with a global pool" warning: the options leave them unset.
    assert "ignored when using a global thread pool" not in proc.stderr, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["tokens"][0] == out["tokens"][1]
    return out


def test_one_shared_pool_translates_as_pools_per_session_do(tiny_bundle):
    own = run(tiny_bundle, 2, pool=-1)  # no shared pool: each session has its own
    # The first call sizes the pool and later calls keep it; engines of any thread count load on it.
    shared = run(tiny_bundle, 2, pool=2)
    assert shared["made"] == [2, 2]
    assert shared["tokens"] == own["tokens"]
    assert run(tiny_bundle, 1, pool=1)["made"] == [0, 2]  # one thread needs no pool; then 2 makes one
    off = run(tiny_bundle, 2, pool=2, ENGINE_ORT_SHARED_POOL="0")
    assert off["made"] == [0, 0] and off["tokens"] == own["tokens"]


def test_a_pool_made_elsewhere_is_used(tiny_bundle):
    """Other code in the process made ONNX Runtime's pool first: ONNX Runtime then refuses sessions with
    pools of their own, so the engine's sessions run on that pool (size unknown to us)."""
    out = run(tiny_bundle, 2, pool=2, made_before=3)
    assert out["made"] == [-1, -1]
    assert out["tokens"] == run(tiny_bundle, 2, pool=-1)["tokens"]


SERVER_FACTORY = """
import sys
from server.app import default_engine_factory
from server.config import ServerConfig
from server.engine import sessions

config = ServerConfig(model_dir=sys.argv[1], threads=int(sys.argv[2]), warmup=False)
engine = default_engine_factory(sys.argv[1], config)
print(sessions._shared_pool_threads, engine.generator.threads)
"""


def test_the_server_puts_its_engines_on_one_pool(tiny_bundle):
    def pool(threads: int) -> list[str]:
        return python(SERVER_FACTORY, tiny_bundle, threads).stdout.split()[-2:]

    assert pool(3) == ["3", "3"]
    assert pool(1) == ["0", "1"]
