"""ONNX Runtime inference engine: bundle loading, batched greedy / beam search with a KV cache.

The contract is docs/engine-contract.md. This is the only module that touches ONNX Runtime; it needs
numpy, onnxruntime and sentencepiece (through model.tokenizer), never torch or grpc.

Decoding reproduces model/decode.py token for token (see `beam_search` there for the rule):

* The encoder graph runs once per batch and returns the cross-attention K/V of every decoder layer and
  an additive source bias; the decoder graph runs one step for all live beam rows and returns the top
  candidates of each sentence (beam_scores + log-probs ranked inside the graph, ties to the lower flat
  index beam * V + token, exactly the stable sort of the reference), so only (B, 2K) numbers come back.
* Every sentence has K rows from step 0 on (the reference's beams 1..K-1 start at -inf and are never
  picked; one row at step 0 would be cheaper but takes another MatMul kernel, see `generate`).
* Sentences that finish (or are cancelled) leave the batch: their cache rows, cross K/V and bias are
  dropped and the source axis is trimmed to the longest remaining source (rounded up to a multiple of
  8, so that a sentence's numbers do not depend on the batch it is in).
* The decoder graph reads the self-attention cache without concatenating it and returns only the new
  step's K/V. On CPU the cache is a preallocated buffer with spare time capacity: greedy steps write
  the new K/V in place (no copy of the cache), a beam step whose row order changed does one contiguous
  np.take (by beam origin) into a second buffer. On CUDA (IOBinding) the cache never leaves the GPU:
  reorder + append run through the bundle's tiny cache graph; only ids, scores and the top candidates
  cross the bus.

In-flight (continuous) batching: `Engine.running_batch()` gives a step-level RunningBatch (admit /
step / drop at decoding-step boundaries) over `DecodeBatch`; every sentence's output stays bit-identical
to translating it alone (see DecodeBatch). It needs a decoder graph with per-row positions (N,).

Long inputs: a segment longer than `max_source_tokens` raises InputTooLongError (callers should split
long text into sentences or paragraphs first; `count_tokens` gives the lengths without translating).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from runtime.bundle import BundleError, load_manifest
from runtime.decoding import DecodingOptions, gnmt_length_penalty
from runtime.decoding import check_options as _check_options
from runtime.decoding import max_output_length as _max_output_length
from runtime.tokenizer import Tokenizer
from server.contract import BatchItem, Finished, Hypothesis, InputTooLongError

__all__ = [
    "BatchItem",
    "BundleError",
    "DecodeBatch",
    "DecodingOptions",
    "Engine",
    "Finished",
    "Generator",
    "Hypothesis",
    "InputTooLongError",
    "RunningBatch",
    "physical_cores",
]

NBest = list[tuple[list[int], float]]


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


# ------------------------------------------------------------------------------------------ backends


def _shape(x: Any) -> tuple[int, ...]:
    """Shape of a numpy array or an OrtValue (where shape is a method)."""
    return tuple(x.shape()) if callable(x.shape) else x.shape


class _NumpyCache:
    """CPU path: numpy arrays. The self-attention cache has spare capacity along time (a multiple of
    CAPACITY_STEP): in greedy steps the new K/V are written in place (no copy of the cache at all); a
    beam reorder is one contiguous np.take into a second, reused buffer."""

    trims_source = True
    CAPACITY_STEP = 16

    @staticmethod
    def slots(n: Any) -> Any:
        """n time slots (an int or an array of them) rounded up to a multiple of CAPACITY_STEP."""
        step = _NumpyCache.CAPACITY_STEP
        return -(-n // step) * step

    def __init__(self, gen: Generator) -> None:
        self.g = gen
        self._sets: list[list[np.ndarray | None]] = [[], []]  # double buffer: never read and write one set
        self._flip = 0

    def encode(self, src: np.ndarray) -> tuple[np.ndarray, list[Any]]:
        out = self.g.encoder.run(self.g.encoder_outputs, {"src_ids": src})
        return out[0], out[1:]

    def empty_past(self, rows: int) -> list[Any]:
        g = self.g
        z = np.zeros((rows, g.n_heads, 0, g.head_dim), dtype=g.kv_dtype)
        return [z] * (2 * g.n_layers)

    def step(self, feed: dict[str, np.ndarray], cross: list[Any], past: list[Any]) -> tuple[Any, ...]:
        g = self.g
        feed.update(zip(g.cross_names, cross, strict=True))
        feed.update(zip(g.past_names, past, strict=True))
        out = g.decoder.run(g.step_outputs, feed)
        return out[0], out[1], out[2:]

    def _buffers(self, like: list[np.ndarray], rows: int, capacity: int) -> list[np.ndarray]:
        """Zero-initialised, reused arrays (rows, H, capacity, Dh): spare entries must stay finite, and a
        fresh allocation per step would page-fault its memory in every time (slower than the copy)."""
        bufs = self._sets[self._flip]
        self._flip ^= 1
        if len(bufs) != len(like):
            bufs[:] = [None] * len(like)
        out = []
        for j, x in enumerate(like):
            shape = (rows, x.shape[1], capacity, x.shape[3])
            n = math.prod(shape)
            buf = bufs[j]
            if buf is None or buf.size < n or buf.dtype != x.dtype:
                buf = bufs[j] = np.zeros(n + n // 2, dtype=x.dtype)
            out.append(buf[:n].reshape(shape))
        return out

    def advance(self, past: list[Any], new: list[Any], rows: np.ndarray | None, t: int) -> list[Any]:
        """The cache of the next step: rows `rows` (None = same rows, same order) of past[:, :, :t] with
        this step's K/V written at index t."""
        capacity = past[0].shape[2]
        if rows is None and t < capacity:
            for p, x in zip(past, new, strict=True):
                p[:, :, t] = x[:, :, 0]
            return past
        n_rows = past[0].shape[0] if rows is None else rows.size
        if t < capacity:
            dest = self._buffers(past, n_rows, capacity)
            for p, x, d in zip(past, new, dest, strict=True):
                np.take(p, rows, axis=0, out=d, mode="clip")  # contiguous; rows are always in range
                d[:, :, t] = x[rows, :, 0]
            return dest
        dest = self._buffers(past, n_rows, self.slots(t + 1))
        for p, x, d in zip(past, new, dest, strict=True):
            d[:, :, :t] = p[:, :, :t] if rows is None else p[rows, :, :t]
            d[:, :, t] = x[:, :, 0] if rows is None else x[rows, :, 0]
        return dest

    def take(self, tensors: list[Any], idx: np.ndarray, src_len: int | None = None) -> list[Any]:
        if src_len is None:
            return [np.take(x, idx, axis=0) for x in tensors]
        return [np.ascontiguousarray(x[idx, :, :src_len]) for x in tensors]

    def release(self) -> None:
        self._sets = [[], []]


class _BoundCache:
    """IOBinding path (CUDA; also runs on CPU for tests): K/V live as OrtValues on the device and are
    reordered/appended there by the bundle's cache graph; only ids, scores and candidates cross the bus."""

    trims_source = False

    def __init__(self, gen: Generator, device_type: str, device_id: int) -> None:
        if gen.cache_graph is None:
            raise BundleError("the IOBinding path needs the bundle's cache graph")
        self.g, self.dev, self.dev_id = gen, device_type, device_id

    def encode(self, src: np.ndarray) -> tuple[np.ndarray, list[Any]]:
        g = self.g
        io = g.encoder.io_binding()
        io.bind_cpu_input("src_ids", src)
        io.bind_output("src_bias", "cpu")
        for name in g.cross_names:
            io.bind_output(name, self.dev, self.dev_id)
        g.encoder.run_with_iobinding(io)
        out = io.get_outputs()
        return out[0].numpy(), list(out[1:])

    def empty_past(self, rows: int) -> list[Any]:
        g = self.g
        z = np.zeros((rows, g.n_heads, 0, g.head_dim), dtype=g.kv_dtype)
        return [z] * (2 * g.n_layers)

    @staticmethod
    def _bind(io: Any, name: str, value: Any) -> None:
        if isinstance(value, np.ndarray):  # e.g. the zero-length cache of the first step
            io.bind_cpu_input(name, value)
        else:
            io.bind_ortvalue_input(name, value)

    def step(self, feed: dict[str, np.ndarray], cross: list[Any], past: list[Any]) -> tuple[Any, ...]:
        g = self.g
        io = g.decoder.io_binding()
        for name, value in feed.items():
            io.bind_cpu_input(name, value)
        for name, value in zip(g.cross_names, cross, strict=True):
            self._bind(io, name, value)
        for name, value in zip(g.past_names, past, strict=True):
            self._bind(io, name, value)
        io.bind_output("topk_scores", "cpu")
        io.bind_output("topk_indices", "cpu")
        for name in g.new_kv_names:
            io.bind_output(name, self.dev, self.dev_id)
        g.decoder.run_with_iobinding(io)
        out = io.get_outputs()
        return out[0].numpy(), out[1].numpy(), list(out[2:])

    def _run_cache(self, xs: list[Any], ns: list[Any], idx: np.ndarray) -> list[Any]:
        g = self.g
        io = g.cache_graph.io_binding()
        io.bind_cpu_input("idx", np.ascontiguousarray(idx, dtype=np.int64))
        for j, (x, n) in enumerate(zip(xs, ns, strict=True)):
            self._bind(io, f"x_{j}", x)
            self._bind(io, f"n_{j}", n)
            io.bind_output(f"y_{j}", self.dev, self.dev_id)
        g.cache_graph.run_with_iobinding(io)
        return list(io.get_outputs())

    def advance(self, past: list[Any], new: list[Any], rows: np.ndarray | None, t: int) -> list[Any]:
        if rows is None:
            rows = np.arange(_shape(past[0])[0])
        return self._run_cache(past, new, rows)

    def take(self, tensors: list[Any], idx: np.ndarray, src_len: int | None = None) -> list[Any]:
        n, h, _, d = _shape(tensors[0])
        nothing = np.zeros((n, h, 0, d), dtype=self.g.kv_dtype)  # zero-length: a plain row gather
        return self._run_cache(tensors, [nothing] * len(tensors), idx)

    def release(self) -> None:
        pass


# ----------------------------------------------------------------------------------------- generator


def select_candidates(
    top_s: np.ndarray,
    top_i: np.ndarray,
    vocab_size: int,
    eos_id: int,
    pad_id: int,
    beam_sizes: np.ndarray,
    width: int,
) -> tuple[np.ndarray, ...]:
    """One step of the reference beam rule (model/decode.py) for every sentence at once.

    top_s/top_i (B, C): each sentence's best candidates over its beams x vocabulary, ranked (flat index
    beam * V + token); beam_sizes (B,): K per sentence, which considers its own top 2K only. An EOS
    candidate ranked below K finishes; the other candidates fill the K live beams in rank order. Returns
    (beam, tok, top_s, eos_fin, n_live, new_beam, new_tok, new_score): per candidate its beam origin, token,
    score (padded to `width` columns when C < width) and whether it finishes; per sentence the live-beam
    count; and the next `width` rows (dead slots: beam 0, pad token, -inf).
    """
    K = beam_sizes[:, None]
    n_cand = top_s.shape[1]
    rank = np.arange(n_cand)[None, :]
    beam = top_i // vocab_size
    tok = top_i - beam * vocab_size
    finite = (top_s > -np.inf) & (rank < 2 * K)
    is_eos = tok == eos_id
    eos_fin = is_eos & finite & (rank < K)
    cont = finite & ~is_eos
    csum = np.cumsum(cont, axis=1)
    live = cont & (csum <= K)
    n_live = np.minimum(csum[:, -1], beam_sizes)
    if n_cand < width:  # tiny vocabularies: fewer candidates than rows
        pad = width - n_cand
        live = np.pad(live, ((0, 0), (0, pad)))
        beam, tok = np.pad(beam, ((0, 0), (0, pad))), np.pad(tok, ((0, 0), (0, pad)))
        top_s = np.pad(top_s, ((0, 0), (0, pad)), constant_values=-np.inf)
    # Live candidates first, in rank order; slots past n_live are dead beams.
    order = np.argsort(~live, axis=1, kind="stable")[:, :width]
    valid = np.arange(width)[None, :] < n_live[:, None]
    new_beam = np.where(valid, np.take_along_axis(beam, order, axis=1), 0)
    new_tok = np.where(valid, np.take_along_axis(tok, order, axis=1), pad_id)
    new_score = np.where(valid, np.take_along_axis(top_s, order, axis=1), -np.inf).astype(np.float32)
    return beam, tok, top_s, eos_fin, n_live, new_beam, new_tok, new_score


def select_greedy(
    top_s: np.ndarray, top_i: np.ndarray, eos_id: int, at_limit: np.ndarray
) -> tuple[np.ndarray, ...]:
    """One greedy step (the beam rule with K = 1) for every sentence at once, from each row's best
    candidate top_s/top_i[:, 0] (lowest id on ties). Returns (tok, score, is_eos, ends, done): the
    token and score per row; whether it is EOS; whether the row adds its hypothesis now (EOS, or a
    finite score at the length limit: then the token is appended); whether the row stops."""
    tok = top_i[:, 0]
    score = top_s[:, 0]
    finite = score > -np.inf
    is_eos = (tok == eos_id) & finite
    ends = is_eos | (at_limit & finite)
    done = is_eos | at_limit | ~finite
    return tok, score, is_eos, ends, done


Ending = tuple[int, list[int], float]  # (row, tokens, length-normalised score) of a finished hypothesis


def greedy_endings(
    hist: np.ndarray,
    t: Sequence[int],
    lp: Callable[[int], float],
    tok: np.ndarray,
    score: np.ndarray,
    is_eos: np.ndarray,
    ends: np.ndarray,
) -> list[Ending]:
    """The hypotheses that end at this greedy step (select_greedy's `ends`): row r's history
    hist[r, 0, :t[r]], plus this step's token unless it is EOS, its score divided by lp(r)."""
    out = []
    for r in np.flatnonzero(ends).tolist():
        seq = hist[r, 0, : t[r]].tolist()
        if not is_eos[r]:
            seq.append(int(tok[r]))
        out.append((r, seq, float(score[r]) / lp(r)))
    return out


def beam_endings(
    hist: np.ndarray,
    t: Sequence[int],
    lp: Callable[[int], float],
    beam: np.ndarray,
    top_s: np.ndarray,
    eos_fin: np.ndarray,
    at_limit: np.ndarray,
    n_live: np.ndarray,
    new_beam: np.ndarray,
    new_tok: np.ndarray,
    new_score: np.ndarray,
) -> list[Ending]:
    """The hypotheses that finish at this beam step (select_candidates' outputs), in the reference's
    order: EOS candidates ranked below K (their beam's history hist[r, beam, :t[r]]), then, for rows at
    their length limit, every live beam with this step's token appended; scores divided by lp(r)."""
    out = []
    rows_e, ranks_e = np.nonzero(eos_fin)
    for r, rk in zip(rows_e.tolist(), ranks_e.tolist(), strict=True):
        out.append((r, hist[r, beam[r, rk], : t[r]].tolist(), float(top_s[r, rk]) / lp(r)))
    for r in np.flatnonzero(at_limit).tolist():
        for k in range(int(n_live[r])):
            seq = hist[r, new_beam[r, k], : t[r]].tolist()
            seq.append(int(new_tok[r, k]))
            out.append((r, seq, float(new_score[r, k]) / lp(r)))
    return out


LOGPROB_SLACK = 1e-6  # settled(): the most a step's log-prob is assumed to exceed 0 by (rounding)


def settled(
    finished: Sequence[NBest],
    n_best: Sequence[int],
    live_best: Sequence[float],
    next_len: Sequence[int],
    limit: Sequence[int],
    alpha: Sequence[float],
) -> list[bool]:
    """Per sentence still searching: whether no live beam can change its result any more (the "best
    finished hypothesis cannot be beaten" stop; it saves steps, the result is unchanged).

    A live beam's log-prob sum s only falls (each step adds a log-prob <= 0, in float32 as the decoder
    graph adds it), and a hypothesis descending from it finishes with a length L in
    [next_len, limit], scoring s' / lp(L) <= s / lp(L) <= max(s / lp(next_len), s / lp(limit)) (lp is
    monotone in L). Once the n_best-th best finished score reaches that bound for the best live beam
    (live_best), no later hypothesis can enter the n-best: a tie ranks after it (the stable sort keeps
    the finishing order). So the n-best returned now is the one a longer search returns, bit for bit.
    (s is first raised by LOGPROB_SLACK per remaining step: a LogSoftmax kernel with an approximate exp
    could give the top token a log-prob a hair above 0.)"""
    out = []
    for fin, k, s, n, lim, a in zip(finished, n_best, live_best, next_len, limit, alpha, strict=True):
        k, s, a = int(k), float(s), float(a)
        if len(fin) < k:
            out.append(False)
            continue
        s += LOGPROB_SLACK * (int(lim) - int(n) + 1)
        bound = max(s / gnmt_length_penalty(int(n), a), s / gnmt_length_penalty(int(lim), a))
        out.append(sorted((norm for _, norm in fin), reverse=True)[k - 1] >= bound)
    return out


class Generator:
    """Id-level decoding over an encoder/decoder graph pair (no tokenizer; used by Engine and tests)."""

    def __init__(
        self,
        encoder_path: str | Path,
        decoder_path: str | Path,
        cache_path: str | Path | None = None,
        kv_rows_path: str | Path | None = None,
        kv_step_path: str | Path | None = None,
        *,
        device: str = "cpu",
        intra_op_threads: int = 0,
        io_binding: bool | None = None,
        pad_id: int = 0,
        bos_id: int = 1,
        eos_id: int = 2,
        max_positions: int | None = None,
        source_bucket: int = 8,
    ) -> None:
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        # The source axis is padded to a multiple of `source_bucket` (at most max_positions): CPU kernels
        # reduce a ragged tail in a different order, so without it a sentence's scores would differ in
        # the last bits between "alone" and "inside a padded batch".
        self.max_positions, self.source_bucket = max_positions, max(1, source_bucket)
        self.paths = {"encoder": Path(encoder_path), "decoder": Path(decoder_path)}
        optional = {"cache": cache_path, "kv_rows": kv_rows_path, "kv_step": kv_step_path}
        self.paths |= {name: Path(p) for name, p in optional.items() if p is not None}
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
        self.threads = intra_op_threads if intra_op_threads > 0 else physical_cores()
        self.on_cuda = False
        if want_cuda:
            cuda = ("CUDAExecutionProvider", {"device_id": device_id})
            # onnxruntime-gpu lists CUDA as available even without a usable GPU: trust the sessions only
            # (they either fall back to CPU silently or fail to initialise CUDA).
            problem = ""
            try:
                self._load([cuda, "CPUExecutionProvider"])
                got = [s.get_providers()[0] for s in self._sessions.values()]
                self.on_cuda = all(p == "CUDAExecutionProvider" for p in got)
                problem = f"ONNX Runtime gave {got}"
            except BundleError as e:
                problem = str(e)
            if not self.on_cuda and device.startswith("cuda"):
                raise RuntimeError(f"device {device!r} requested but CUDA is not usable: {problem}")
        if not self.on_cuda:
            self._load(["CPUExecutionProvider"])
        self.providers: list[str] = self.decoder.get_providers()
        self._inspect()
        use_binding = self.on_cuda if io_binding is None else io_binding
        if use_binding:
            self.cache: _NumpyCache | _BoundCache = _BoundCache(
                self, "cuda" if self.on_cuda else "cpu", device_id if self.on_cuda else 0
            )
        else:
            self.cache = _NumpyCache(self)
        self.last_stats: dict[str, Any] = {}
        self.greedy_fast_path = True  # beam 1 through the vectorised greedy branch (same result, faster)

    @property
    def inflight_on_device(self) -> bool:
        """Whether an in-flight DecodeBatch keeps K/V on the device (IOBinding and the kv_* graphs)."""
        graphs = (self.kv_rows_graph, self.kv_step_graph)
        return isinstance(self.cache, _BoundCache) and all(g is not None for g in graphs)

    def _session_options(self) -> ort.SessionOptions:
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        # No spin-waiting between ops: a decoder step is hundreds of tiny ops, and spinning worker
        # threads compete with the decoding loop's own Python thread (and any other process) for the
        # cores; measured 1.5-2x faster steps on a busy 2-core machine. ENGINE_ORT_SPINNING=1 re-enables.
        spin = "1" if os.environ.get("ENGINE_ORT_SPINNING", "0") == "1" else "0"
        so.add_session_config_entry("session.intra_op.allow_spinning", spin)
        so.add_session_config_entry("session.inter_op.allow_spinning", spin)
        return so

    def _load(self, providers: list[Any]) -> None:
        so = self._session_options()
        sessions = {}
        for name, path in self.paths.items():
            try:
                sessions[name] = ort.InferenceSession(str(path), so, providers=providers)
            except Exception as e:  # noqa: BLE001 - onnxruntime raises several private exception types
                raise BundleError(f"{path}: ONNX Runtime cannot load this graph: {e}") from e
        self._sessions = sessions
        self.encoder, self.decoder = sessions["encoder"], sessions["decoder"]
        self.cache_graph = sessions.get("cache")
        # In-flight storage on the device (bundles exported since): general changes, plain steps.
        self.kv_rows_graph, self.kv_step_graph = sessions.get("kv_rows"), sessions.get("kv_step")

    def _inspect(self) -> None:
        dec_in = {i.name: i for i in self.decoder.get_inputs()}
        dec_out = {o.name: o for o in self.decoder.get_outputs()}
        enc_out = {o.name for o in self.encoder.get_outputs()}
        n_layers = sum(1 for n in dec_in if n.startswith("past_key_"))
        self.n_layers = n_layers
        self.cross_names = [n for i in range(n_layers) for n in (f"cross_key_{i}", f"cross_value_{i}")]
        self.past_names = [n for i in range(n_layers) for n in (f"past_key_{i}", f"past_value_{i}")]
        self.new_kv_names = [n for i in range(n_layers) for n in (f"new_key_{i}", f"new_value_{i}")]
        need_in = {"input_ids", "position", "src_bias", "beam_scores", "num_candidates"}
        need_in |= set(self.cross_names) | set(self.past_names)
        need_out = {"log_probs", "topk_scores", "topk_indices", *self.new_kv_names}
        problems = []
        if n_layers == 0:
            problems.append("decoder has no past_key_* inputs")
        if need_in - set(dec_in):
            problems.append(f"decoder lacks inputs {sorted(need_in - set(dec_in))}")
        if need_out - set(dec_out):
            problems.append(f"decoder lacks outputs {sorted(need_out - set(dec_out))}")
        if {"src_bias", *self.cross_names} - enc_out:
            problems.append(f"encoder lacks outputs {sorted({'src_bias', *self.cross_names} - enc_out)}")
        if problems:
            raise BundleError(
                f"{self.paths['decoder'].parent}: unexpected graph interface: {'; '.join(problems)}"
            )
        shape = dec_in["past_key_0"].shape  # [rows, H, past_len, Dh]
        self.n_heads, self.head_dim = int(shape[1]), int(shape[3])
        self.vocab_size = int(dec_out["log_probs"].shape[1])
        self.kv_dtype = np.float16 if dec_in["past_key_0"].type == "tensor(float16)" else np.float32
        self.encoder_outputs = ["src_bias", *self.cross_names]
        self.step_outputs = ["topk_scores", "topk_indices", *self.new_kv_names]
        # Per-row positions (N,) (bundles exported since in-flight batching): rows at different steps
        # can share a call. Older graphs take one shared position (1,) (request-level batching only).
        pos_shape = dec_in["position"].shape
        self.row_positions = bool(pos_shape) and not isinstance(pos_shape[0], int)

    # ------------------------------------------------------------------------------------- decoding

    def generate(
        self,
        sources: Sequence[Sequence[int]],
        *,
        beam_size: int = 1,
        num_hypotheses: int = 1,
        length_penalty: float = 0.6,
        max_lengths: Sequence[int] | int = 256,
        cancelled: Callable[[], Sequence[bool]] | None = None,
    ) -> list[NBest | None]:
        """Decode source id lists (no BOS/EOS). Per source: up to num_hypotheses (tokens, score), best
        first, or None if `cancelled()` reported it at a step boundary. max_lengths: int or per source."""
        K = int(beam_size)
        if K < 1 or not 1 <= num_hypotheses <= K:
            raise ValueError(
                f"need beam_size >= 1 and 1 <= num_hypotheses <= beam_size, got {K}, {num_hypotheses}"
            )
        B = len(sources)
        limits = np.array(
            [max_lengths] * B if isinstance(max_lengths, int) else list(max_lengths), dtype=np.int64
        )
        if limits.shape != (B,):
            raise ValueError(f"max_lengths has {limits.size} entries for {B} sources")
        stats = {"batch": B, "beam_size": K, "steps": 0, "encoder_s": 0.0, "decoder_s": 0.0}
        stats |= {"select_s": 0.0, "reorder_s": 0.0, "max_rows": 0, "row_steps": 0, "settled": 0}
        t_start = time.perf_counter()
        finished: list[NBest] = [[] for _ in range(B)]
        dropped = np.zeros(B, dtype=bool)  # cancelled
        self.last_stats = stats
        if B == 0:
            return []

        V, eos, cache = self.vocab_size, self.eos_id, self.cache
        # Sentences with a zero budget finish at once with an empty hypothesis (as in the reference).
        for b in np.flatnonzero(limits <= 0):
            finished[b].append(([], 0.0))
        active = np.flatnonzero(limits > 0)  # original indices, in batch order
        src_lens = np.array([len(s) for s in sources], dtype=np.int64)
        if active.size and cancelled is not None:
            active = self._drop_cancelled(active, cancelled, dropped)
        if active.size == 0:
            return self._results(finished, dropped, num_hypotheses)

        src = np.full((active.size, self._source_width(src_lens[active])), self.pad_id, dtype=np.int64)
        for row, b in enumerate(active):
            src[row, : src_lens[b]] = sources[b]
        t0 = time.perf_counter()
        bias, cross = cache.encode(src)
        stats["encoder_s"] = time.perf_counter() - t0

        n_act = active.size
        max_len = int(limits[active].max())
        lim = limits[active]
        # Beam rows per sentence: K from step 0 on, beams 1..K-1 dead (-inf) at step 0 as in the
        # reference. (One row at step 0 would be cheaper, but ONNX Runtime's MatMul takes another
        # kernel for one query row per sentence, so the cross-attention numbers would differ in the
        # last bits from an in-flight batch, where a sentence's step 0 runs next to other sentences'
        # K rows. Greedy keeps its one row: the in-flight batch runs greedy sentences apart.)
        scores = np.full((n_act, K), -np.inf, dtype=np.float32)
        scores[:, 0] = 0.0
        tokens = np.full((n_act * K, 1), self.bos_id, dtype=np.int64)
        hist = np.zeros((n_act, K, max_len), dtype=np.int64)  # tokens of each beam so far
        n_fin = np.zeros(n_act, dtype=np.int64)
        past = cache.empty_past(n_act * K)
        positions = np.arange(max_len, dtype=np.int64)

        for t in range(max_len):
            if cancelled is not None and t > 0:
                keep_pos = self._cancel_mask(active, cancelled, dropped)
                if keep_pos is not None:
                    t0 = time.perf_counter()
                    rows = (keep_pos[:, None] * K + np.arange(K)).reshape(-1)
                    past = cache.take(past, rows)
                    active, lim, scores, hist, n_fin = (
                        active[keep_pos],
                        lim[keep_pos],
                        scores[keep_pos],
                        hist[keep_pos],
                        n_fin[keep_pos],
                    )
                    tokens = tokens.reshape(-1, K)[keep_pos].reshape(-1, 1)
                    bias, cross = self._compact_source(bias, cross, keep_pos, src_lens[active])
                    stats["reorder_s"] += time.perf_counter() - t0
                    if active.size == 0:
                        break
            n_act = active.size
            greedy = K == 1 and self.greedy_fast_path
            n_cand = 1 if greedy else min(2 * K, K * V)
            feed = {
                "input_ids": tokens,
                "position": positions[t : t + 1],
                "src_bias": bias,
                "beam_scores": scores,
                "num_candidates": np.array([n_cand], dtype=np.int64),
            }
            t0 = time.perf_counter()
            top_s, top_i, new_kv = cache.step(feed, cross, past)
            t1 = time.perf_counter()
            stats["decoder_s"] += t1 - t0
            stats["steps"] += 1
            stats["row_steps"] += n_act * K
            stats["max_rows"] = max(stats["max_rows"], n_act * K)
            length = t + 1
            lp = gnmt_length_penalty(length, length_penalty)
            at_limit = lim <= length

            ts, lp_of = [t] * n_act, lambda r, lp=lp: lp  # every row is at step t
            if greedy:
                tok, s, is_eos, ends, done = select_greedy(top_s, top_i, eos, at_limit)
                new_beam = np.zeros((n_act, 1), dtype=np.int64)
                new_tok = np.ascontiguousarray(tok).reshape(-1, 1)
                new_score = np.ascontiguousarray(s).reshape(-1, 1)
                endings = greedy_endings(hist, ts, lp_of, tok, s, is_eos, ends)
            else:
                beam, tok, top_s, eos_fin, n_live, new_beam, new_tok, new_score = select_candidates(
                    top_s, top_i, V, eos, self.pad_id, np.full(n_act, K), K
                )
                endings = beam_endings(
                    hist, ts, lp_of, beam, top_s, eos_fin, at_limit, n_live, new_beam, new_tok, new_score
                )
                n_fin += eos_fin.sum(axis=1)
                done = at_limit | (n_fin >= K) | (n_live == 0)
            for r, seq, norm in endings:
                finished[active[r]].append((seq, norm))
            if not greedy and (search := np.flatnonzero(~done)).size:
                m = search.size
                stop = settled(
                    [finished[b] for b in active[search].tolist()],
                    [num_hypotheses] * m,
                    new_score[search].max(axis=1).tolist(),
                    [length + 1] * m,
                    lim[search].tolist(),
                    [length_penalty] * m,
                )
                done[search[stop]] = True
                stats["settled"] += sum(stop)
            t2 = time.perf_counter()
            stats["select_s"] += t2 - t1

            if done.all():
                break
            keep = ~done
            keep_pos = np.flatnonzero(keep)
            compact = keep_pos.size < n_act
            # Rows of the next cache: sentence-major, K per sentence, taken from their beam origins.
            rows = ((keep_pos * K)[:, None] + new_beam[keep_pos]).reshape(-1)
            if not compact and np.array_equal(rows, np.arange(rows.size)):
                rows = None  # same rows in the same order: append in place
            past = cache.advance(past, new_kv, rows, t)
            if compact:
                active, lim, n_fin = active[keep_pos], lim[keep_pos], n_fin[keep_pos]
                bias, cross = self._compact_source(bias, cross, keep_pos, src_lens[active])
                new_beam, new_tok, new_score = new_beam[keep_pos], new_tok[keep_pos], new_score[keep_pos]
                hist = hist[keep_pos]
            if K > 1:
                hist = hist[np.arange(hist.shape[0])[:, None], new_beam]  # (B', K, max_len)
            hist[:, :, t] = new_tok
            scores = np.ascontiguousarray(new_score, dtype=np.float32)
            tokens = new_tok.reshape(-1, 1)
            stats["reorder_s"] += time.perf_counter() - t2

        cache.release()
        stats["generate_s"] = time.perf_counter() - t_start
        return self._results(finished, dropped, num_hypotheses)

    def _compact_source(
        self, bias: np.ndarray, cross: list[Any], keep_pos: np.ndarray, kept_src_lens: np.ndarray
    ) -> tuple[np.ndarray, list[Any]]:
        """Drop finished sentences from the per-sentence tensors (and trim the source axis on CPU)."""
        if keep_pos.size == 0:
            return bias[:0], cross
        if self.cache.trims_source:
            s = self._source_width(kept_src_lens)
            if s < bias.shape[1]:
                return np.ascontiguousarray(bias[keep_pos, :s]), self.cache.take(cross, keep_pos, s)
        return bias[keep_pos], self.cache.take(cross, keep_pos)

    def _source_width(self, lengths: np.ndarray) -> int:
        longest = max(1, int(lengths.max()))
        width = -(-longest // self.source_bucket) * self.source_bucket
        return max(longest, min(width, self.max_positions or width))

    @staticmethod
    def _cancel_mask(
        active: np.ndarray, cancelled: Callable[[], Sequence[bool]], dropped: np.ndarray
    ) -> np.ndarray | None:
        """Positions (within `active`) to keep, or None when nothing active was cancelled."""
        flags = np.asarray(cancelled(), dtype=bool)
        if flags.shape != dropped.shape:
            raise ValueError(f"cancelled() returned {flags.size} flags for {dropped.size} inputs")
        dropped |= flags
        hit = flags[active]
        if not hit.any():
            return None
        return np.flatnonzero(~hit)

    def _drop_cancelled(
        self, active: np.ndarray, cancelled: Callable[[], Sequence[bool]], dropped: np.ndarray
    ) -> np.ndarray:
        keep = self._cancel_mask(active, cancelled, dropped)
        return active if keep is None else active[keep]

    @staticmethod
    def _results(finished: list[NBest], dropped: np.ndarray, n_best: int) -> list[NBest | None]:
        # Stable sort: ties keep the order of finishing (step, then rank), as in the reference.
        return [
            None if dropped[b] else sorted(f, key=lambda h: -h[1])[:n_best] for b, f in enumerate(finished)
        ]


# ------------------------------------------------------------------------------------ in-flight batch


def _grow(need: int, cap: int, headroom: float = 2.0) -> int:
    """Capacity for `need` entries: the current one while it suffices, else room to grow (admissions
    then rarely copy)."""
    return cap if need <= cap else int(need * headroom)


def _time_slots(need: int) -> int:
    """Cache slots for `need` entries: a multiple of 16 (at least one), as in the request path."""
    return max(_NumpyCache.CAPACITY_STEP, _NumpyCache.slots(need))


class _Rows:
    """What both storages share: the encoder and decoder calls of their cache object, the source bias
    (host numpy in both: it is fed to every step)."""

    cache: _NumpyCache | _BoundCache
    bias: np.ndarray

    @property
    def source_width(self) -> int:
        return self.bias.shape[1]

    def encode(self, src: np.ndarray) -> tuple[np.ndarray, list[Any]]:
        return self.cache.encode(src)

    def step(self, feed: dict[str, np.ndarray], cross: list[Any], past: list[Any]) -> tuple[Any, ...]:
        return self.cache.step(feed, cross, past)


class _HostRows(_Rows):
    """The in-flight batch's tensors in host memory (CPU): numpy buffers with spare capacity on every
    axis whose live part is a prefix (sentences [0, n), rows [0, rows)), so the decoder gets contiguous
    views and membership changes copy little (see DecodeBatch)."""

    def __init__(self, gen: Generator) -> None:
        self.g = gen
        self.cache = _NumpyCache(gen)  # own double buffers (the request path keeps its own)
        self.kv: list[np.ndarray] = []  # 2L x (row_cap, H, T_cap, Dh) self-attention cache
        self.cross: list[np.ndarray] = []  # 2L x (n_cap, H, S, Dh) cross-attention K/V
        self.bias = np.zeros((0, 0), dtype=np.float32)  # (n_cap, S) source bias (-inf = padding)

    def past(self, rows: int) -> list[Any]:
        return [p[:rows] for p in self.kv] if rows else []

    def sources(self, n: int) -> tuple[np.ndarray, list[Any]]:
        """Source bias and cross K/V of the first n sentences."""
        return self.bias[:n], [x[:n] for x in self.cross]

    def clear(self) -> None:
        pass  # keep the buffers for the next sentences

    # ------------------------------------------------------------------------- self-attention cache

    def update_rows(
        self, src: np.ndarray, filled: np.ndarray, t_cap: int, new_kv: list[Any] | None, same_layout: bool
    ) -> None:
        """Next cache: row m is old row src[m] (-1: a joining row, masked until written) of which the
        first filled[m] slots matter, t_cap slots; new_kv[src[m]] is then written at slot filled[m].
        same_layout: rows keep their sentence's place (only beam origins and swap-removed sentences
        change), so rows can be copied in place."""
        m = src.size
        row_cap = self.kv[0].shape[0] if self.kv else 0
        if not (same_layout and m <= row_cap and t_cap == self.kv[0].shape[2]):
            self._relayout(src, filled, _grow(m, row_cap), t_cap)
        else:
            # In place, copying only the rows whose origin changed and only the slots they have filled
            # (rounded up to 16), not the whole capacity of the longest sentence. A sentence's rows
            # come from its own old rows (a moved sentence's from past the new end, into a leaving
            # sentence's place), so one span group never reads what another writes.
            changed = np.flatnonzero((src != np.arange(m)) & (src >= 0))
            if changed.size:
                self._copy_rows(self.kv, changed, src[changed], _NumpyCache.slots(filled[changed]))
        if new_kv is not None:
            ar = np.arange(m)
            for p, x in zip(self.kv, new_kv, strict=True):
                p[ar, :, filled] = x[src, :, 0]

    def _relayout(self, src: np.ndarray, filled: np.ndarray, row_cap: int, t_cap: int) -> None:
        """New storage (row_cap, H, t_cap, Dh) with row m taken from old row src[m] (its first `filled`
        slots rounded up to 16); the rest holds whatever finite values the reused buffer has."""
        g = self.g
        like = self.kv or [np.zeros((0, g.n_heads, 0, g.head_dim), dtype=g.kv_dtype)] * (2 * g.n_layers)
        dest = self.cache._buffers(like, row_cap, t_cap)
        if self.kv:
            spans = np.minimum(_NumpyCache.slots(filled), min(self.kv[0].shape[2], t_cap))
            spans[src < 0] = 0
            self._copy_rows(dest, np.arange(src.size), src, spans)
        self.kv = dest

    def _copy_rows(
        self, dest: list[np.ndarray], rows: np.ndarray, src: np.ndarray, spans: np.ndarray
    ) -> None:
        """dest[rows[i], :, :spans[i]] = kv[src[i], :, :spans[i]] for every i (dest may be the cache
        itself: each group's right side is gathered before it is written), grouped by span; a span of
        0 copies nothing."""
        for span in np.unique(spans).tolist():
            if span == 0:
                continue
            sel = spans == span
            d, s = rows[sel], src[sel]
            for p, x in zip(self.kv, dest, strict=True):
                x[d, :, :span] = p[s, :, :span]

    # ------------------------------------------------------------------- per-sentence source tensors

    def admit_sources(self, n_old: int, groups: list[tuple[np.ndarray, list[Any]]], width: int) -> None:
        """Append the encoder outputs `groups` [(bias (k, w), cross K/V)] after the n_old live
        sentences, every sentence's source axis padded (bias -inf, K/V zeros) to `width`."""
        n = n_old + sum(b.shape[0] for b, _ in groups)
        n_cap, s_cur = self.bias.shape
        if n > n_cap or width != s_cur:
            self._resize(n_old, _grow(n, n_cap), width)
        pos = n_old
        for bias_new, cross_new in groups:
            k, w = bias_new.shape
            rows = slice(pos, pos + k)
            self.bias[rows, :w] = bias_new
            self.bias[rows, w:] = -np.inf
            for x, c in zip(self.cross, cross_new, strict=True):
                x[rows, :, :w] = c
                x[rows, :, w:] = 0
            pos += k

    def compact_sources(self, perm: np.ndarray, moved: np.ndarray) -> None:
        """Sentence i becomes old sentence perm[i]; only the `moved` positions change."""
        if moved.size:
            src = perm[moved]
            self.bias[moved] = self.bias[src]
            for x in self.cross:
                x[moved] = x[src]

    def fit_sources(self, n: int, width: int) -> None:
        """Trim (or pad) the source axis of the n live sentences to `width`."""
        self._resize(n, self.bias.shape[0], width)

    def _resize(self, n: int, n_cap: int, width: int) -> None:
        g = self.g
        w = min(self.bias.shape[1], width)
        bias = np.full((n_cap, width), -np.inf, dtype=np.float32)
        bias[:n, :w] = self.bias[:n, :w]
        cross = []
        for j in range(2 * g.n_layers):
            x = np.zeros((n_cap, g.n_heads, width, g.head_dim), dtype=g.kv_dtype)
            if n:
                x[:n, :, :w] = self.cross[j][:n, :, :w]
            cross.append(x)
        self.bias, self.cross = bias, cross


class _DeviceRows(_Rows):
    """The in-flight batch's tensors on the device (IOBinding path: CUDA; also runs on CPU for tests):
    K/V are OrtValues holding exactly the live rows, and every change is one graph run on the device, so
    K/V never cross the bus (only ids, positions, the source bias and the decoder's candidates do): a
    plain step (beam reorder + this step's K/V at per-row positions) runs the bundle's kv_step graph,
    sentences leaving the cache graph's row gather, and the rest (sentences joining, the time or source
    axis growing or shrinking) the general kv_rows graph. Same interface as _HostRows."""

    def __init__(self, gen: Generator) -> None:
        if not gen.inflight_on_device:
            raise BundleError("in-flight K/V on the device need IOBinding and the kv_rows/kv_step graphs")
        self.g = gen
        self.cache = gen.cache  # stateless: encode and step with device outputs
        self.kv: list[Any] = []  # 2L x (rows, H, T, Dh) OrtValues
        self.cross: list[Any] = []  # 2L x (n, H, S, Dh) OrtValues
        self.bias = np.zeros((0, 0), dtype=np.float32)  # (n, S), host: fed to every step
        self._zero = np.zeros((1, gen.n_heads, 1, gen.head_dim), dtype=gen.kv_dtype)  # one zero row

    def past(self, rows: int) -> list[Any]:
        return self.kv if rows else []

    def sources(self, n: int) -> tuple[np.ndarray, list[Any]]:
        return self.bias, self.cross

    def clear(self) -> None:
        self.kv, self.cross = [], []  # back to ONNX Runtime's arena
        self.bias = np.zeros((0, 0), dtype=np.float32)

    def _run(
        self,
        a: list[Any],
        b: list[Any] | None,
        idx: np.ndarray,
        t_out: int,
        new_kv: list[Any] | None = None,
        n_idx: np.ndarray | None = None,
        pos: np.ndarray | None = None,
    ) -> list[Any]:
        """y_j = rows idx of [a_j; b_j] fitted to t_out slots, with new_kv_j[n_idx] written at pos (see
        export/onnx_export.make_kv_rows_graph). An empty a or a missing b is one zero row."""
        g, cache = self.g, self.cache
        io = g.kv_rows_graph.io_binding()
        m = idx.size
        io.bind_cpu_input("idx", np.ascontiguousarray(idx, dtype=np.int64))
        io.bind_cpu_input("n_idx", np.zeros(m, np.int64) if n_idx is None else np.ascontiguousarray(n_idx))
        io.bind_cpu_input("pos", np.full(m, -1, np.int64) if pos is None else np.ascontiguousarray(pos))
        io.bind_cpu_input("t_out", np.array([t_out], dtype=np.int64))
        for j in range(2 * g.n_layers):
            cache._bind(io, f"a_{j}", a[j] if a else self._zero)
            cache._bind(io, f"b_{j}", b[j] if b else self._zero)
            cache._bind(io, f"n_{j}", new_kv[j] if new_kv is not None else self._zero)
            io.bind_output(f"y_{j}", cache.dev, cache.dev_id)
        g.kv_rows_graph.run_with_iobinding(io)
        return list(io.get_outputs())

    def update_rows(
        self, src: np.ndarray, filled: np.ndarray, t_cap: int, new_kv: list[Any] | None, same_layout: bool
    ) -> None:
        if self.kv and t_cap == _shape(self.kv[0])[2] and (src >= 0).all():
            # Nobody joins, same capacity: the steady state of decoding (a step) or sentences leaving.
            self.kv = self.cache.take(self.kv, src) if new_kv is None else self._step(src, filled, new_kv)
            return
        n_a = _shape(self.kv[0])[0] if self.kv else 1
        idx = np.where(src >= 0, src, n_a)  # joining rows: the zero row after a
        if new_kv is None:
            self.kv = self._run(self.kv, None, idx, t_cap)
        else:
            self.kv = self._run(self.kv, None, idx, t_cap, new_kv, src, filled)

    def _step(self, src: np.ndarray, filled: np.ndarray, new_kv: list[Any]) -> list[Any]:
        """kv_step graph: rows src of the cache with new_kv[src] written at slot filled (per row)."""
        g, cache = self.g, self.cache
        m, h = src.size, g.n_heads
        write = np.empty((m, h, 3), dtype=np.int64)  # [row, head, slot] of every row's new K/V
        write[:, :, 0] = np.arange(m)[:, None]
        write[:, :, 1] = np.arange(h)[None, :]
        write[:, :, 2] = filled[:, None]
        io = g.kv_step_graph.io_binding()
        io.bind_cpu_input("idx", np.ascontiguousarray(src, dtype=np.int64))
        io.bind_cpu_input("write", write.reshape(m * h, 3))
        for j in range(2 * g.n_layers):
            cache._bind(io, f"a_{j}", self.kv[j])
            cache._bind(io, f"n_{j}", new_kv[j])
            io.bind_output(f"y_{j}", cache.dev, cache.dev_id)
        g.kv_step_graph.run_with_iobinding(io)
        return list(io.get_outputs())

    def admit_sources(self, n_old: int, groups: list[tuple[np.ndarray, list[Any]]], width: int) -> None:
        for bias_new, cross_new in groups:
            n_cur, k = self.bias.shape[0], bias_new.shape[0]
            n_a = n_cur if n_cur else 1
            idx = np.concatenate([np.arange(n_cur), n_a + np.arange(k)])
            self.cross = self._run(self.cross if n_cur else [], cross_new, idx, width)
            bias = np.full((n_cur + k, width), -np.inf, dtype=np.float32)
            w = min(self.bias.shape[1], width)
            bias[:n_cur, :w] = self.bias[:, :w]
            bias[n_cur:, : bias_new.shape[1]] = bias_new
            self.bias = bias

    def compact_sources(self, perm: np.ndarray, moved: np.ndarray) -> None:
        if moved.size or perm.size != self.bias.shape[0]:
            self.cross = self.cache.take(self.cross, perm)  # a plain row gather (the cache graph)
            self.bias = self.bias[perm]

    def fit_sources(self, n: int, width: int) -> None:
        self.cross = self._run(self.cross, None, np.arange(n), width)
        self.bias = np.ascontiguousarray(self.bias[:, :width])


@dataclass
class _Item:
    """A sentence to admit into a DecodeBatch (ids without BOS/EOS)."""

    key: Any
    ids: Sequence[int]
    beam_size: int = 1
    num_hypotheses: int = 1
    length_penalty: float = 0.6
    max_length: int = 256


class DecodeBatch:
    """One running decode batch that sentences join and leave at decoding-step boundaries (in-flight,
    a.k.a. continuous batching), id level. No threads, no asyncio: the caller owns the loop.

    Every sentence's result is the one `Generator.generate` gives it alone (same search rule, same
    candidates; see the in-flight tests in tests/test_engine.py), whatever joins or leaves around it,
    because:

    * each row carries its own step index: the decoder graph takes per-row `position` (N,), which is
      also the number of valid entries of the row's self-attention cache; longer histories of other
      rows and spare capacity are masked inside the graph (bias -inf: softmax weight exactly 0);
    * every sentence has Kc rows (Kc = the largest beam in the batch), sentence-major, so the graph's
      per-sentence cross-attention and top-k stay as they are; rows past a sentence's own beam (and
      beams 1..K-1 at its first step, as in the reference) are dead: score -inf, never selected. The
      first 2K candidates of a sentence over Kc * V are then exactly its candidates over K * V;
    * the source axis is padded to a multiple of the generator's bucket (8) with a -inf bias, and the
      cache's time axis to a multiple of 16, as in the request path; a sentence's position in the batch
      does not change its numbers.

    Membership changes keep sentence order stable except that a sentence that leaves (finished,
    dropped) is replaced by the last live one (swap-remove), so little moves. Where the tensors live is
    the storage's business:

    * _HostRows (CPU): numpy buffers with spare capacity, live prefix; a step writes the new K/V in
      place, and a beam reorder copies only the rows whose origin changed and only the slots their
      sentence has filled (not the capacity of the longest running sentence, as a whole-cache gather
      would);
    * _DeviceRows (IOBinding, CUDA): OrtValues of exactly the live rows, rebuilt on the device by the
      bundle's kv_step / kv_rows graphs at each change (device memory bandwidth makes the full copy
      cheap; the host never sees the K/V).

    The time axis grows by 16 slots when the longest row needs it and shrinks again when long sentences
    leave (every row attends over all of it, masked); likewise the source axis.

    Mixed beam sizes pay for dead rows (a beam-2 sentence next to beam 4 costs 4 rows).
    """

    def __init__(self, gen: Generator) -> None:
        if not gen.row_positions:
            raise BundleError(
                f"{gen.paths['decoder']}: the decoder graph takes one shared position (1,); in-flight "
                "batching needs per-row positions (N,): re-export the bundle with this version"
            )
        self.g = gen
        self._store: _HostRows | _DeviceRows = _DeviceRows(gen) if gen.inflight_on_device else _HostRows(gen)
        self._clear()  # per-sentence state
        self._hist = np.zeros((0, 1, 0), dtype=np.int64)  # (n_cap, Kc, L) tokens so far per beam
        self.steps = 0
        self.settled = 0  # sentences retired by the settled() stop
        self.last_step_s = 0.0

    # ---------------------------------------------------------------------------------- properties

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def rows(self) -> int:
        return len(self.keys) * self.kc

    @property
    def on_device(self) -> bool:
        """Whether K/V stay on the device (IOBinding storage)."""
        return isinstance(self._store, _DeviceRows)

    @property
    def past(self) -> list[Any]:
        """The live self-attention cache: 2L x (rows, H, T_cap, Dh)."""
        return self._store.past(self.rows)

    @property
    def source_width(self) -> int:
        """Source positions every running sentence's cross-attention spans (padded)."""
        return self._store.source_width if self.keys else 0

    # ----------------------------------------------------------------------------------- storage

    @staticmethod
    def _swap_remove(keep: np.ndarray) -> np.ndarray:
        """perm (n',): new sentence i is old sentence perm[i]. Kept sentences past the new end move
        into the holes left by leaving ones; everything else stays where it is."""
        n_new = int(keep.sum())
        perm = np.arange(n_new)
        holes = np.flatnonzero(~keep[:n_new])
        if holes.size:
            perm[holes] = n_new + np.flatnonzero(keep[n_new:])
        return perm

    def _apply_perm_meta(self, perm: np.ndarray) -> None:
        idx = perm.tolist()
        self.keys = [self.keys[i] for i in idx]
        self._finished = [self._finished[i] for i in idx]
        self.beam, self.n_best, self.lim = self.beam[perm], self.n_best[perm], self.lim[perm]
        self.t, self.n_fin = self.t[perm], self.n_fin[perm]
        self.src_lens, self.alpha = self.src_lens[perm], self.alpha[perm]

    def _shrink_source(self) -> None:
        """Trim the source axis when the widest sentences have left (two buckets of hysteresis)."""
        if not self.keys:
            return
        width = self.g._source_width(self.src_lens)
        if width + 2 * self.g.source_bucket <= self._store.source_width:
            self._store.fit_sources(len(self.keys), width)

    def _clear(self) -> None:
        """No running sentences (the host storage stays, for reuse)."""
        self.keys: list[Any] = []
        self._finished: list[NBest] = []
        self.kc = 1  # rows per sentence: the largest running beam
        z = np.zeros(0, dtype=np.int64)
        # Per sentence (n,): beam size, n-best, length limit, step, finished count, source length, alpha.
        self.beam, self.n_best, self.lim, self.t, self.n_fin, self.src_lens = z, z, z, z, z, z
        self.alpha = np.zeros(0)
        self.tokens = np.zeros((0, 1), dtype=np.int64)  # (n * Kc, 1) next input token per row
        self.scores = np.zeros((0, 1), dtype=np.float32)  # (n, Kc) beam scores
        self._store.clear()

    def _compact(
        self, perm: np.ndarray, kc_next: int, nb: np.ndarray | None, new_kv: list[Any] | None
    ) -> None:
        """Keep sentences perm (new sentence i = old perm[i], from _swap_remove) with kc_next rows each,
        row k of sentence i taken from its row nb[i, k] (None: rows 0..kc_next-1, no reorder), plus this
        step's K/V of those rows written at their sentence's position when new_kv is given. Per-sentence
        metadata, cache, sources and history follow; tokens and scores are the caller's."""
        if perm.size == 0:
            self._clear()
            return
        kc = self.kc
        t_keep = self.t[perm]
        base = np.arange(kc_next)[None, :] if nb is None else nb
        src = ((perm * kc)[:, None] + base).reshape(-1)
        filled = np.repeat(t_keep, kc_next)
        t_cap = _time_slots(int(t_keep.max()) + (1 if new_kv is not None else 0))
        self._store.update_rows(src, filled, t_cap, new_kv, same_layout=kc_next == kc)
        moved = np.flatnonzero(perm != np.arange(perm.size))
        self._store.compact_sources(perm, moved)
        if nb is None and kc_next == kc:
            if moved.size:
                self._hist[moved] = self._hist[perm[moved]]
        else:
            self._hist = self._hist[perm[:, None], base]  # (n', Kc', L)
        self._apply_perm_meta(perm)
        self.kc = kc_next
        self._shrink_source()

    # --------------------------------------------------------------------------------------- admit

    def admit(self, items: Sequence[_Item]) -> list[tuple[Any, NBest]]:
        """Encode `items` (one encoder batch per source width) and merge them into the batch; they take part
        from the next step() on. Returns the items that finish at once (zero length budget)."""
        g = self.g
        done_now: list[tuple[Any, NBest]] = []
        new = []
        for it in items:
            k = int(it.beam_size)
            if k < 1 or not 1 <= it.num_hypotheses <= k:
                raise ValueError(f"need beam_size >= 1 and 1 <= num_hypotheses <= beam_size, got {it}")
            if it.max_length <= 0:
                done_now.append((it.key, [([], 0.0)]))
            else:
                new.append(it)
        if not new:
            return done_now
        # One encoder batch per source width (bucket of 8): padding a short source to the longest one
        # admitted with it would cost more than another encoder call. Sorted by width, each encoder
        # batch joins as one contiguous block.
        widths = np.array([g._source_width(np.array([len(it.ids)])) for it in new], dtype=np.int64)
        order = np.argsort(widths, kind="stable")
        new, widths = [new[i] for i in order.tolist()], widths[order]
        lens = np.array([len(it.ids) for it in new], dtype=np.int64)
        k_new = len(new)
        n_old = len(self.keys)
        n = n_old + k_new
        kc_old = self.kc if n_old else 1
        kc = max([int(it.beam_size) for it in new] + [kc_old])
        groups = []
        for w in np.unique(widths).tolist():
            idx = np.flatnonzero(widths == w)
            src = np.full((idx.size, w), g.pad_id, dtype=np.int64)
            for r, i in enumerate(idx.tolist()):
                src[r, : lens[i]] = new[i].ids
            groups.append(self._store.encode(src))
        # The source axis as wide as the widest running sentence.
        width = int(widths.max())
        self._store.admit_sources(n_old, groups, max(self._store.source_width, width) if n_old else width)
        # Cache rows: new sentences' rows after the live ones (masked until written). A larger Kc re-lays
        # the old rows out (dead rows copy row 0 of their sentence).
        src_rows = np.full((n, kc), -1, dtype=np.int64)
        if n_old:
            src_rows[:n_old] = (np.arange(n_old) * kc_old)[:, None]
            src_rows[:n_old, :kc_old] += np.arange(kc_old)
        filled = np.repeat(np.concatenate([self.t, np.zeros(k_new, dtype=np.int64)]), kc)
        t_cap = _time_slots(int(self.t.max()) if n_old else 1)
        self._store.update_rows(src_rows.reshape(-1), filled, t_cap, None, same_layout=kc == kc_old)
        # History: (n_cap, Kc, L) with L the longest length budget.
        limit = max(int(it.max_length) for it in new)
        h_cap, h_kc, h_len = self._hist.shape
        if n > h_cap or kc != h_kc or limit > h_len:
            hist = np.zeros((_grow(n, h_cap), kc, max(limit, h_len)), dtype=np.int64)
            if n_old:
                hist[:n_old, :kc_old, :h_len] = self._hist[:n_old, :kc_old]
            self._hist = hist
        # Per-sentence state.
        self.keys += [it.key for it in new]
        self._finished += [[] for _ in new]
        cat = np.concatenate
        self.beam = cat([self.beam, [it.beam_size for it in new]]).astype(np.int64)
        self.n_best = cat([self.n_best, [it.num_hypotheses for it in new]]).astype(np.int64)
        self.lim = cat([self.lim, [it.max_length for it in new]]).astype(np.int64)
        self.t = cat([self.t, np.zeros(k_new, dtype=np.int64)])
        self.n_fin = cat([self.n_fin, np.zeros(k_new, dtype=np.int64)])
        self.src_lens = cat([self.src_lens, lens])
        self.alpha = cat([self.alpha, [float(it.length_penalty) for it in new]])
        scores = np.full((n, kc), -np.inf, dtype=np.float32)
        tokens = np.full((n, kc), g.pad_id, dtype=np.int64)
        if n_old:
            scores[:n_old, :kc_old] = self.scores
            tokens[:n_old, :kc_old] = self.tokens.reshape(n_old, kc_old)
        scores[n_old:, 0] = 0.0  # step 0: beam 0 only; beams 1..K-1 start dead (the reference's rule)
        tokens[n_old:] = g.bos_id
        self.scores, self.tokens, self.kc = scores, tokens.reshape(-1, 1), kc
        return done_now

    # ---------------------------------------------------------------------------------------- drop

    def drop(self, keys: Sequence[Any]) -> int:
        """Remove the sentences with these keys (cancelled, expired); returns how many were running."""
        gone = set(keys)
        keep = np.array([k not in gone for k in self.keys], dtype=bool)
        if keep.all():
            return 0
        kc, n = self.kc, len(self.keys)
        kc_next = int(self.beam[keep].max()) if keep.any() else 1
        tokens, scores = self.tokens.reshape(n, kc), self.scores
        perm = self._swap_remove(keep)
        self._compact(perm, kc_next, None, None)
        self.tokens = np.ascontiguousarray(tokens[perm, :kc_next]).reshape(-1, 1)
        self.scores = np.ascontiguousarray(scores[perm, :kc_next])
        return int((~keep).sum())

    # ---------------------------------------------------------------------------------------- step

    def step(self) -> list[tuple[Any, NBest]]:
        """One decoding step for every running sentence; returns (key, n-best) of the sentences that
        finished (they have left the batch)."""
        n = len(self.keys)
        if n == 0:
            return []
        g = self.g
        V, eos, kc = g.vocab_size, g.eos_id, self.kc
        greedy = kc == 1
        bias, cross = self._store.sources(n)
        feed = {
            "input_ids": self.tokens,
            "position": self.t if greedy else np.repeat(self.t, kc),
            "src_bias": bias,
            "beam_scores": self.scores,
            "num_candidates": np.array([1 if greedy else min(2 * kc, kc * V)], dtype=np.int64),
        }
        t0 = time.perf_counter()
        top_s, top_i, new_kv = self._store.step(feed, cross, self.past)
        self.steps += 1
        at_limit = self.lim <= self.t + 1
        fin, hist, t_all = self._finished, self._hist, self.t.tolist()

        def lp_of(r: int) -> float:  # each sentence at its own step, with its own alpha
            return gnmt_length_penalty(t_all[r] + 1, float(self.alpha[r]))

        if greedy:
            tok, score, is_eos, ends, done = select_greedy(top_s, top_i, eos, at_limit)
            endings = greedy_endings(hist, t_all, lp_of, tok, score, is_eos, ends)
            new_beam, new_tok, new_score = None, tok.reshape(-1, 1), score.reshape(-1, 1)
        else:
            beam, tok, top_s, eos_fin, n_live, new_beam, new_tok, new_score = select_candidates(
                top_s, top_i, V, eos, g.pad_id, self.beam, kc
            )
            endings = beam_endings(
                hist, t_all, lp_of, beam, top_s, eos_fin, at_limit, n_live, new_beam, new_tok, new_score
            )
            self.n_fin = self.n_fin + eos_fin.sum(axis=1)
            done = at_limit | (self.n_fin >= self.beam) | (n_live == 0)
        for r, seq, norm in endings:
            fin[r].append((seq, norm))
        if not greedy and (search := np.flatnonzero(~done)).size:
            stop = settled(
                [fin[r] for r in search.tolist()],
                self.n_best[search].tolist(),
                new_score[search].max(axis=1).tolist(),
                (self.t[search] + 2).tolist(),
                self.lim[search].tolist(),
                self.alpha[search].tolist(),
            )
            done[search[stop]] = True
            self.settled += sum(stop)
        # Stable sort: ties keep the order of finishing (step, then rank), as in the reference.
        out = [
            (self.keys[r], sorted(fin[r], key=lambda h: -h[1])[: int(self.n_best[r])])
            for r in np.flatnonzero(done).tolist()
        ]
        keep = ~done
        kc_next = int(self.beam[keep].max()) if keep.any() else 1
        perm = self._swap_remove(keep)
        nb = None if new_beam is None else new_beam[perm, :kc_next]
        t_keep = self.t[perm]
        self._compact(perm, kc_next, nb, new_kv)
        if perm.size:
            self._hist[np.arange(perm.size), :, t_keep] = new_tok[perm, :kc_next]
            self.tokens = np.ascontiguousarray(new_tok[perm, :kc_next]).reshape(-1, 1)
            self.scores = np.ascontiguousarray(new_score[perm, :kc_next], dtype=np.float32)
            self.t = self.t + 1
        self.last_step_s = time.perf_counter() - t0
        return out


# -------------------------------------------------------------------------------------------- engine


def split_whitespace(text: str) -> tuple[str, str, str]:
    """(leading whitespace, stripped text, trailing whitespace): only the middle is translated."""
    core = text.strip()
    start, end = len(text) - len(text.lstrip()), len(text.rstrip())
    return text[:start], core, text[end:]


def blank_result(text: str) -> list[Hypothesis]:
    """A blank text comes back unchanged, score 0."""
    return [Hypothesis(text=text, score=0.0, tokens=[])]


class Engine:
    """Translation engine over an export bundle (see docs/engine-contract.md)."""

    def __init__(
        self,
        bundle_dir: str | Path,
        *,
        variant: str = "fp32",
        device: str = "auto",
        intra_op_threads: int = 0,
        io_binding: bool | None = None,
    ) -> None:
        self.bundle_dir = Path(bundle_dir)
        self.manifest: dict[str, Any] = load_manifest(self.bundle_dir, variant)
        m = self.manifest
        self.variant = variant
        self.name: str = m["name"]
        self.version: str = str(m["version"])
        self.source_language: str = m["source_language"]
        self.target_language: str = m["target_language"]
        self.max_source_tokens: int = int(m["max_source_tokens"])
        self.max_beam_size: int = int(m["max_beam_size"])
        self.max_length_cap: int = int(m["max_length_cap"])
        dec = m["decoding"]
        self.default_options = DecodingOptions(
            beam_size=int(dec.get("beam_size", 4)),
            num_hypotheses=int(dec.get("num_hypotheses", 1)),
            max_length=int(dec.get("max_length", 0)),
            length_penalty=float(dec.get("length_penalty", 0.6)),
        )
        self._ratio = float(dec.get("max_length_ratio", 1.5))
        self._extra = int(dec.get("max_length_extra", 10))
        tok_path = self.bundle_dir / m["tokenizer"]
        try:
            self.tokenizer = Tokenizer(tok_path)
        except Exception as e:  # noqa: BLE001 - sentencepiece raises RuntimeError/OSError
            raise BundleError(f"{tok_path}: cannot load tokenizer: {e}") from e
        if self.tokenizer.vocab_size != int(m["vocab_size"]):
            raise BundleError(
                f"{tok_path}: {self.tokenizer.vocab_size} pieces, manifest vocab_size is {m['vocab_size']}"
            )
        ids = m["special_ids"]
        files = m["variants"][variant]
        self.generator = Generator(
            self.bundle_dir / files["encoder"],
            self.bundle_dir / files["decoder"],
            self.bundle_dir / files["cache"],
            *(self.bundle_dir / files[g] if g in files else None for g in ("kv_rows", "kv_step")),
            device=device,
            intra_op_threads=intra_op_threads,
            io_binding=io_binding,
            pad_id=int(ids["pad"]),
            bos_id=int(ids["bos"]),
            eos_id=int(ids["eos"]),
            max_positions=int(m["dims"].get("max_positions", 0)) or None,
        )
        if self.generator.vocab_size != int(m["vocab_size"]):
            raise BundleError(
                f"{self.bundle_dir / files['decoder']}: vocabulary {self.generator.vocab_size}, "
                f"manifest says {m['vocab_size']}"
            )
        self.providers: list[str] = list(self.generator.providers)
        self.last_stats: dict[str, Any] = {}
        self._lock = threading.Lock()  # one batch at a time: the generator reuses its cache buffers

    # ---------------------------------------------------------------------------------------- public

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Source tokens per text as translate() would feed them (0 for blank texts)."""
        cores = [t.strip() for t in texts]
        encoded = self._encode([c for c in cores if c])
        it = iter(encoded)
        return [len(next(it)) if c else 0 for c in cores]

    # One text at a time on purpose: sentencepiece's list calls start a thread pool per call (about 4 ms
    # of wall time even for one sentence, 50x the work itself on a busy machine); same ids and texts.
    def _encode(self, texts: list[str]) -> list[list[int]]:
        encode = self.tokenizer.encode
        return [encode(t) for t in texts]

    def _decode(self, seqs: list[list[int]]) -> list[str]:
        decode = self.tokenizer.decode
        return [decode(s) for s in seqs]

    def warmup(self) -> None:
        """Run both graphs once (first runs allocate memory and pick kernels)."""
        self.translate(["Hello world."], self.default_options)
        self.translate(["Hello world.", "Open the file."], DecodingOptions(beam_size=1))

    @property
    def on_cuda(self) -> bool:
        """Whether the sessions run on the CUDA execution provider."""
        return bool(self.generator.on_cuda)

    @property
    def supports_inflight(self) -> bool:
        """Whether the bundle's decoder takes per-row positions (needed by running_batch())."""
        return bool(self.generator.row_positions)

    @property
    def inflight_copies_cache(self) -> bool:
        """Whether the in-flight batch's K/V cross the bus at every step: the sessions bind their cache
        on the device (CUDA) but the bundle predates the kv_rows/kv_step graphs, so the batch runs from host
        memory."""
        g = self.generator
        return isinstance(g.cache, _BoundCache) and not g.inflight_on_device

    def running_batch(self) -> RunningBatch:
        """A step-level in-flight batch over this engine (see RunningBatch); BundleError if the bundle's
        decoder graph is too old for it (re-export)."""
        return RunningBatch(self)

    def max_output_length(self, src_len: int, options: DecodingOptions) -> int:
        if options.max_length > 0:
            return min(options.max_length, self.max_length_cap)
        return _max_output_length(src_len, self._ratio, self._extra, self.max_length_cap)

    def check_options(self, options: DecodingOptions) -> None:
        """InvalidOptionsError (a ValueError) unless this model can run `options` (runtime.decoding's rules;
        a max_length over the cap is clipped, not refused)."""
        _check_options(
            options,
            max_beam_size=self.max_beam_size,
            max_length_cap=max(self.max_length_cap, options.max_length),
        )

    def too_long(self, n_tokens: int, segment: str = "segment") -> InputTooLongError | None:
        """The error for a segment of n_tokens source tokens, or None when it is within the limit."""
        if n_tokens <= self.max_source_tokens:
            return None
        return InputTooLongError(
            f"{segment} has {n_tokens} source tokens, over the limit of {self.max_source_tokens} "
            "(max_source_tokens); split long text into sentences or paragraphs before translating"
        )

    def translate(
        self,
        texts: list[str],
        options: DecodingOptions | None = None,
        cancelled: Callable[[], Sequence[bool]] | None = None,
    ) -> list[list[Hypothesis] | None]:
        """Translate a batch; one entry per text: the n-best list (best first) or None if cancelled.

        Blank texts come back unchanged (score 0.0). Leading/trailing whitespace of each text is kept
        around its translation. A row reported by `cancelled()` at any step boundary is dropped from the
        batch and returns None (even if it had already finished). Raises InputTooLongError (nothing is
        translated) if a segment is over max_source_tokens, ValueError for invalid options.
        """
        t_start = time.perf_counter()
        options = self.default_options if options is None else options
        self.check_options(options)
        results: list[list[Hypothesis] | None] = [None] * len(texts)
        segments: list[tuple[int, str, str]] = []  # (index, prefix, suffix)
        cores: list[str] = []
        for i, text in enumerate(texts):
            prefix, core, suffix = split_whitespace(text)
            if not core:
                results[i] = blank_result(text)
                continue
            segments.append((i, prefix, suffix))
            cores.append(core)
        sources = self._encode(cores)
        for (i, _, _), ids in zip(segments, sources, strict=True):
            if error := self.too_long(len(ids), f"segment {i}"):
                raise error
        t_tok = time.perf_counter()
        seg_index = np.array([i for i, _, _ in segments], dtype=np.int64)
        cancel_fn = None
        if cancelled is not None:
            n_texts = len(texts)

            def cancel_fn() -> np.ndarray:
                flags = np.asarray(cancelled(), dtype=bool)
                if flags.shape != (n_texts,):
                    raise ValueError(f"cancelled() returned {flags.size} flags for {n_texts} texts")
                cancelled_rows[flags] = True
                return flags[seg_index]

            cancelled_rows = np.zeros(n_texts, dtype=bool)
        with self._lock:
            decoded = self.generator.generate(
                sources,
                beam_size=options.beam_size,
                num_hypotheses=options.num_hypotheses,
                length_penalty=options.length_penalty,
                max_lengths=[self.max_output_length(len(s), options) for s in sources],
                cancelled=cancel_fn,
            )
            gen_stats = dict(self.generator.last_stats)
        t_dec = time.perf_counter()
        flat = [h for nbest in decoded if nbest is not None for h, _ in nbest]
        texts_out = iter(self._decode(flat))
        for (i, prefix, suffix), nbest in zip(segments, decoded, strict=True):
            if nbest is None:
                continue
            results[i] = [
                Hypothesis(text=prefix + next(texts_out) + suffix, score=score, tokens=tokens)
                for tokens, score in nbest
            ]
        if cancelled is not None:
            for i in np.flatnonzero(cancelled_rows):
                results[i] = None
        stats = gen_stats | {
            "texts": len(texts),
            "segments": len(segments),
            "source_tokens": int(sum(len(s) for s in sources)),
            "output_tokens": int(sum(len(h[0].tokens) for h in results if h)),
            "tokenize_s": t_tok - t_start,
            "detokenize_s": time.perf_counter() - t_dec,
            "total_s": time.perf_counter() - t_start,
        }
        self.last_stats = stats
        return results


# ------------------------------------------------------------------------------------ text level


class RunningBatch:
    """Text-level in-flight batch over an Engine (see DecodeBatch): admit(items), step(), drop(keys).

    Items may have any decoding options (mixed beam sizes share the batch). Each item's result is
    the one `Engine.translate([text], options)` gives it alone, bit for bit. Greedy items run in their
    own DecodeBatch (one row per sentence; ONNX Runtime's MatMul takes another kernel for one query row
    per sentence than for several, so a greedy sentence next to beam rows would differ in the last bits
    from greedy alone); a step with both kinds running makes two decoder calls. Not thread-safe: one
    caller thread."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.greedy = DecodeBatch(engine.generator)
        self.beam = DecodeBatch(engine.generator)
        self._affixes: dict[Any, tuple[str, str]] = {}

    def __len__(self) -> int:
        return len(self.greedy) + len(self.beam)

    @property
    def rows(self) -> int:
        return self.greedy.rows + self.beam.rows

    @property
    def keys(self) -> list[Any]:
        return list(self.greedy.keys) + list(self.beam.keys)

    def cost(self, source_tokens: int, options: DecodingOptions) -> int:
        """KV-cache slots an item can occupy at most: beam x (source tokens + generation budget)."""
        out = self.engine.max_output_length(source_tokens, options)
        return max(1, options.beam_size) * (max(1, source_tokens) + out)

    def admit(self, items: Sequence[BatchItem]) -> list[Finished]:
        """Tokenize and encode `items` (one encoder batch per source width) and merge them into the batch.
        Returns the items that are already done: blank texts, zero length budgets, and refused ones
        (invalid options, over max_source_tokens: `error` set)."""
        e = self.engine
        done: list[Finished] = []
        todo: list[tuple[BatchItem, str]] = []
        for it in items:
            try:
                e.check_options(it.options)
            except ValueError as err:
                done.append(Finished(it.key, error=err))
                continue
            prefix, core, suffix = split_whitespace(it.text)
            if not core:
                done.append(Finished(it.key, blank_result(it.text)))
                continue
            todo.append((it, core))
            self._affixes[it.key] = (prefix, suffix)
        sources = e._encode([core for _, core in todo])
        admit: list[_Item] = []
        for (it, _), ids in zip(todo, sources, strict=True):
            if error := e.too_long(len(ids)):
                self._affixes.pop(it.key)
                done.append(Finished(it.key, error=error))
                continue
            o = it.options
            admit.append(
                _Item(
                    it.key,
                    ids,
                    o.beam_size,
                    o.num_hypotheses,
                    o.length_penalty,
                    e.max_output_length(len(ids), o),
                )
            )
        greedy = [it for it in admit if it.beam_size == 1]
        beam = [it for it in admit if it.beam_size > 1]
        with e._lock:
            now = (self.greedy.admit(greedy) if greedy else []) + (self.beam.admit(beam) if beam else [])
        return done + self._texts(now)

    def step(self) -> list[Finished]:
        """One decoding step of every running item; returns those that finished (and left)."""
        with self.engine._lock:
            out = self.greedy.step() + self.beam.step()
        return self._texts(out)

    def drop(self, keys: Sequence[Any]) -> int:
        """Remove running items (cancelled, expired) at this step boundary; returns how many ran."""
        n = self.greedy.drop(keys) + self.beam.drop(keys)
        for k in keys:
            self._affixes.pop(k, None)
        return n

    def _texts(self, out: list[tuple[Any, NBest]]) -> list[Finished]:
        res = []
        for key, nbest in out:
            prefix, suffix = self._affixes.pop(key, ("", ""))
            texts = self.engine._decode([h for h, _ in nbest])
            res.append(
                Finished(
                    key,
                    [
                        Hypothesis(text=prefix + t + suffix, score=score, tokens=tokens)
                        for t, (tokens, score) in zip(texts, nbest, strict=True)
                    ],
                )
            )
        return res
