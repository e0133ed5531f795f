"""ONNX Runtime sessions of a bundle: session options, loading on a device, and the graph interface.

`open_sessions` turns a device name ('auto', 'cpu', 'cuda', 'cuda:N') into loaded sessions (CUDA only if
every session really runs on it); `Graphs` holds those sessions together with what the decoder graph's
inputs and outputs say about the model (layers, heads, vocabulary, K/V dtype, per-row positions). The
cache back-ends (cache.py), the in-flight storages (rows.py) and the Generator read the sessions from one
`Graphs` object at call time, so wrapping a session there (e.g. to time it) reaches every caller.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from runtime.bundle import BundleError

__all__ = ["Graphs", "load_sessions", "open_sessions", "physical_cores", "session_options", "use_shared_pool"]


def physical_cores() -> int:
    """Physical cores available to this process (hyper-threads are no help for GEMM-bound inference)."""
    try:
        available = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        available = os.cpu_count() or 1
    physical = 0
    try:
        import psutil  # optional

        physical = psutil.cpu_count(logical=False) or 0
    except ImportError:
        try:
            cores, current = set(), ""
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    key, value = key.strip(), value.strip()
                    if key == "physical id":
                        current = value
                    elif key == "core id":
                        cores.add((current, value))
            physical = len(cores)
        except OSError:
            physical = 0
    return max(1, min(available, physical) if physical else available)


_shared_pool_lock = threading.Lock()
_shared_pool_threads = 0  # size of ONNX Runtime's process-wide intra-op pool once made here, else 0


def use_shared_pool(threads: int) -> int:
    """Run every session this process opens from now on on one ONNX Runtime intra-op pool of `threads`
    threads (0: the physical cores). Call it before the first session; returns the pool's size, 0 where
    no pool is made (one thread, or ENGINE_ORT_SHARED_POOL=0), -1 where other code in the process made
    one first (its size unknown; the sessions run on it all the same). Idempotent: ONNX Runtime makes the
    pool once per process and never resizes it, so the first call's size stays.

    A pool per session means a worker set per graph (5 per bundle, 25 in the default service), each
    woken separately for each op: at 2 threads a batch-1 decoder step got nothing from the second
    thread, and spinning made it worse (the sessions' workers competing for the cores). One shared
    pool: 1.2-1.4x the tokens/s at 2 threads (README, Performance). The server calls this with its
    --threads; library users opt in. Once the pool exists ONNX Runtime refuses sessions with their own
    pools, so `session_options` puts every later session on it, whatever thread count it asks for."""
    global _shared_pool_threads
    threads = threads if threads > 0 else physical_cores()
    with _shared_pool_lock:
        if _shared_pool_threads or threads <= 1 or os.environ.get("ENGINE_ORT_SHARED_POOL", "1") == "0":
            return _shared_pool_threads
        try:
            ort.set_global_thread_pool_sizes(threads, 1)
            _shared_pool_threads = threads
        except Exception:  # noqa: BLE001 - other code in this process made it first: size unknown
            _shared_pool_threads = -1
        return _shared_pool_threads


def session_options(threads: int) -> ort.SessionOptions:
    """Options of every session: sequential, full graph optimisation, on the shared intra-op pool where
    this process made one (`use_shared_pool`), else a pool of `threads` threads of its own."""
    so = ort.SessionOptions()
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    if _shared_pool_threads:
        # The shared pool spins briefly between ops (ONNX Runtime's default for it; Python cannot
        # change it): one worker set, so the spinning that hurt per-session pools costs little here.
        # Thread counts are left unset: ONNX Runtime warns that a shared pool ignores them.
        so.use_per_session_threads = False
        return so
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    # Per-session pools: no spin-waiting between ops. A decoder step is a hundred tiny ops, and each
    # session's spinning workers compete with the decoding loop's own Python thread (and any other
    # process) for the cores; measured 1.5-2x faster steps on a busy 2-core machine.
    # ENGINE_ORT_SPINNING=1 re-enables.
    spin = "1" if os.environ.get("ENGINE_ORT_SPINNING", "0") == "1" else "0"
    so.add_session_config_entry("session.intra_op.allow_spinning", spin)
    so.add_session_config_entry("session.inter_op.allow_spinning", spin)
    return so


def load_sessions(
    paths: dict[str, Path], providers: list[Any], threads: int
) -> dict[str, ort.InferenceSession]:
    """One session per graph (same keys as `paths`); BundleError naming the file ONNX Runtime refuses."""
    so = session_options(threads)
    sessions = {}
    for name, path in paths.items():
        try:
            sessions[name] = ort.InferenceSession(str(path), so, providers=providers)
        except Exception as e:  # noqa: BLE001 - onnxruntime raises several private exception types
            raise BundleError(f"{path}: ONNX Runtime cannot load this graph: {e}") from e
    return sessions


def cuda_provider(device_id: int, tf32: bool = True) -> tuple[str, dict[str, int | str]]:
    """The CUDA execution provider with its options. ONNX Runtime allows TF32 in fp32 MatMuls by default
    (on an H100: 1.75e-2 max |d log-prob| against the CPU, docs/gpu.md); use_tf32=0 asks for full fp32.
    The option is only passed to turn TF32 off, so builds that predate it keep their default."""
    options: dict[str, int | str] = {"device_id": device_id}  # as the H100 check ran it
    if not tf32:
        options["use_tf32"] = "0"
    return "CUDAExecutionProvider", options


def open_sessions(
    paths: dict[str, Path], device: str, threads: int, cuda_tf32: bool = True
) -> tuple[dict[str, ort.InferenceSession], bool, int]:
    """Load `paths` for `device` ('auto', 'cpu', 'cuda' or 'cuda:N'): (sessions, on_cuda, device_id).

    'auto' takes CUDA when the build has it and every session really runs there, else the CPU; an
    explicit 'cuda' that cannot be honoured raises RuntimeError (ValueError for an unknown device).
    cuda_tf32=False: full fp32 precision on CUDA (see cuda_provider)."""
    device = device.lower()
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    device_id = int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0
    if device.startswith("cuda") and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise RuntimeError(
            f"device {device!r} requested but this onnxruntime build has no CUDA provider "
            f"(available: {ort.get_available_providers()}; install onnxruntime-gpu)"
        )
    want_cuda = device.startswith("cuda") or (
        device == "auto" and "CUDAExecutionProvider" in ort.get_available_providers()
    )
    if want_cuda:
        cuda = cuda_provider(device_id, cuda_tf32)
        # onnxruntime-gpu lists CUDA as available even without a usable GPU: trust the sessions only
        # (they either fall back to CPU silently or fail to initialise CUDA).
        problem = ""
        on_cuda = False
        try:
            sessions = load_sessions(paths, [cuda, "CPUExecutionProvider"], threads)
            got = [s.get_providers()[0] for s in sessions.values()]
            on_cuda = all(p == "CUDAExecutionProvider" for p in got)
            problem = f"ONNX Runtime gave {got}"
        except BundleError as e:
            problem = str(e)
        if on_cuda:
            return sessions, True, device_id
        if device.startswith("cuda"):
            raise RuntimeError(f"device {device!r} requested but CUDA is not usable: {problem}")
    return load_sessions(paths, ["CPUExecutionProvider"], threads), False, device_id


@dataclass
class Graphs:
    """A bundle's sessions and the model interface their inputs and outputs declare.

    encoder/decoder are required; cache (row gather + append on the device), kv_rows and kv_step (the
    in-flight batch's K/V changes on the device) are optional graphs of newer bundles."""

    encoder: ort.InferenceSession
    decoder: ort.InferenceSession
    cache: ort.InferenceSession | None
    kv_rows: ort.InferenceSession | None
    kv_step: ort.InferenceSession | None
    n_layers: int
    n_heads: int
    head_dim: int
    vocab_size: int
    kv_dtype: type
    cross_names: list[str]  # cross_key_i, cross_value_i per layer: encoder outputs, decoder inputs
    past_names: list[str]  # past_key_i, past_value_i: the decoder's self-attention cache inputs
    new_kv_names: list[str]  # new_key_i, new_value_i: this step's K/V (decoder outputs)
    encoder_outputs: list[str]
    step_outputs: list[str]
    # Per-row positions (N,) (bundles exported since in-flight batching): rows at different steps
    # can share a call. Older graphs take one shared position (1,) (request-level batching only).
    row_positions: bool

    @classmethod
    def inspect(cls, sessions: dict[str, ort.InferenceSession], where: Path) -> Graphs:
        """Check the encoder/decoder interface and read the model's shape from it (BundleError naming
        `where` and what is missing otherwise)."""
        encoder, decoder = sessions["encoder"], sessions["decoder"]
        dec_in = {i.name: i for i in decoder.get_inputs()}
        dec_out = {o.name: o for o in decoder.get_outputs()}
        enc_out = {o.name for o in encoder.get_outputs()}
        n_layers = sum(1 for n in dec_in if n.startswith("past_key_"))
        cross_names = [n for i in range(n_layers) for n in (f"cross_key_{i}", f"cross_value_{i}")]
        past_names = [n for i in range(n_layers) for n in (f"past_key_{i}", f"past_value_{i}")]
        new_kv_names = [n for i in range(n_layers) for n in (f"new_key_{i}", f"new_value_{i}")]
        need_in = {"input_ids", "position", "src_bias", "beam_scores", "num_candidates"}
        need_in |= set(cross_names) | set(past_names)
        need_out = {"log_probs", "topk_scores", "topk_indices", *new_kv_names}
        problems = []
        if n_layers == 0:
            problems.append("decoder has no past_key_* inputs")
        if need_in - set(dec_in):
            problems.append(f"decoder lacks inputs {sorted(need_in - set(dec_in))}")
        if need_out - set(dec_out):
            problems.append(f"decoder lacks outputs {sorted(need_out - set(dec_out))}")
        if {"src_bias", *cross_names} - enc_out:
            problems.append(f"encoder lacks outputs {sorted({'src_bias', *cross_names} - enc_out)}")
        if problems:
            raise BundleError(f"{where}: unexpected graph interface: {'; '.join(problems)}")
        shape = dec_in["past_key_0"].shape  # [rows, H, past_len, Dh]
        pos_shape = dec_in["position"].shape
        return cls(
            encoder=encoder,
            decoder=decoder,
            cache=sessions.get("cache"),
            kv_rows=sessions.get("kv_rows"),
            kv_step=sessions.get("kv_step"),
            n_layers=n_layers,
            n_heads=int(shape[1]),
            head_dim=int(shape[3]),
            vocab_size=int(dec_out["log_probs"].shape[1]),
            kv_dtype=np.float16 if dec_in["past_key_0"].type == "tensor(float16)" else np.float32,
            cross_names=cross_names,
            past_names=past_names,
            new_kv_names=new_kv_names,
            encoder_outputs=["src_bias", *cross_names],
            step_outputs=["topk_scores", "topk_indices", *new_kv_names],
            row_positions=bool(pos_shape) and not isinstance(pos_shape[0], int),
        )

    def empty_kv(self, rows: int, time: int = 0) -> np.ndarray:
        """A zero K/V tensor (rows, H, time, Dh) in the cache dtype."""
        return np.zeros((rows, self.n_heads, time, self.head_dim), dtype=self.kv_dtype)
