"""Storage of the in-flight batch's tensors between steps: where DecodeBatch keeps its rows.

DecodeBatch (decode_batch.py) decides which rows and sentences stay, join and move; a storage carries
that out on the tensors it holds: the self-attention cache (rows, H, T, Dh) per layer, the cross-attention
K/V (sentences, H, S, Dh) and the source bias (sentences, S). Two storages, one interface:

* `HostRows` (CPU): numpy buffers with spare capacity on every axis whose live part is a prefix, so the
  decoder gets contiguous views and membership changes copy little;
* `DeviceRows` (IOBinding: CUDA, or the CPU provider in tests): OrtValues of exactly the live rows,
  changed on the device by the bundle's kv_step / kv_rows / cache graphs, so K/V never cross the bus.

`grow` and `time_slots` are the capacity rules (rows and time slots) both share with DecodeBatch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.bundle import BundleError
from server.engine.cache import BoundCache, NumpyCache, bind_input, move_rows, shape_of
from server.engine.sessions import Graphs

__all__ = ["DeviceRows", "HostRows", "Rows", "grow", "time_slots"]


def grow(need: int, cap: int, headroom: float = 2.0) -> int:
    """Capacity for `need` entries: the current one while it suffices, else room to grow (admissions
    then rarely copy)."""
    return cap if need <= cap else int(need * headroom)


def time_slots(need: int) -> int:
    """Cache slots for `need` entries: a multiple of 16 (at least one), as in the request path."""
    return max(NumpyCache.CAPACITY_STEP, NumpyCache.slots(need))


class Rows:
    """What both storages share: the encoder and decoder calls of their cache object, the source bias
    (host numpy in both: it is fed to every step)."""

    cache: NumpyCache | BoundCache
    bias: np.ndarray

    @property
    def source_width(self) -> int:
        return self.bias.shape[1]

    def encode(self, src: np.ndarray) -> tuple[np.ndarray, list[Any]]:
        return self.cache.encode(src)

    def step(self, feed: dict[str, np.ndarray], cross: list[Any], past: list[Any]) -> tuple[Any, ...]:
        return self.cache.step(feed, cross, past)


class HostRows(Rows):
    """The in-flight batch's tensors in host memory (CPU): numpy buffers with spare capacity on every
    axis whose live part is a prefix (sentences [0, n), rows [0, rows)), so the decoder gets contiguous
    views and membership changes copy little (see DecodeBatch)."""

    def __init__(self, graphs: Graphs) -> None:
        self.graphs = graphs
        self.cache = NumpyCache(graphs)  # own double buffers (the request path keeps its own)
        self.kv: list[np.ndarray] = []  # 2L x (row_cap, H, T_cap, Dh) self-attention cache
        self.cross: list[np.ndarray] = []  # 2L x (n_cap, H, S, Dh) cross-attention K/V
        self.bias = np.zeros((0, 0), dtype=np.float32)  # (n_cap, S) source bias (-inf = padding)
        self._past_views: tuple[Any, ...] = (None, 0, [])  # (kv list, rows, views) last handed out
        self._source_views: tuple[Any, ...] = (None, None, 0, self.bias, [])  # (bias, cross, n, views)

    def past(self, rows: int) -> list[Any]:
        if not rows:
            return []
        # The same view objects while the storage and the row count stay: the decoder's binding
        # (NumpyCache.step) is kept for as long as its inputs are the same objects.
        memo = self._past_views
        if memo[0] is not self.kv or memo[1] != rows:
            memo = self._past_views = (self.kv, rows, [p[:rows] for p in self.kv])
        return memo[2]

    def sources(self, n: int) -> tuple[np.ndarray, list[Any]]:
        """Source bias and cross K/V of the first n sentences (the same view objects while they last,
        as past())."""
        memo = self._source_views
        if memo[0] is not self.bias or memo[1] is not self.cross or memo[2] != n:
            memo = self._source_views = (self.bias, self.cross, n, self.bias[:n], [x[:n] for x in self.cross])
        return memo[3], memo[4]

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
            self._relayout(src, filled, grow(m, row_cap), t_cap)
        else:
            # In place, copying only the rows whose origin changed and only the slots they have filled
            # (rounded up to 16), not the whole capacity of the longest sentence. A sentence's rows
            # come from its own old rows (a moved sentence's from past the new end, into a leaving
            # sentence's place), so one span group never reads what another writes.
            changed = np.flatnonzero((src != np.arange(m)) & (src >= 0))
            if changed.size:
                self._copy_rows(self.kv, changed, src[changed], NumpyCache.slots(filled[changed]))
        if new_kv is None:
            return
        f = int(filled[0])
        if m == new_kv[0].shape[0] and (filled == f).all() and (src == np.arange(m)).all():
            for p, x in zip(self.kv, new_kv, strict=True):  # same rows, one slot: a strided copy
                p[:m, :, f] = x[:, :, 0]
            return
        ar = np.arange(m)
        for p, x in zip(self.kv, new_kv, strict=True):
            p[ar, :, filled] = x[src, :, 0]

    def _relayout(self, src: np.ndarray, filled: np.ndarray, row_cap: int, t_cap: int) -> None:
        """New storage (row_cap, H, t_cap, Dh) with row m taken from old row src[m] (its first `filled`
        slots rounded up to 16); the rest holds whatever finite values the reused buffer has."""
        gr = self.graphs
        like = self.kv or [gr.empty_kv(0)] * (2 * gr.n_layers)
        dest = self.cache.buffers(like, row_cap, t_cap)
        if self.kv:
            spans = np.minimum(NumpyCache.slots(filled), min(self.kv[0].shape[2], t_cap))
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
            self._resize(n_old, grow(n, n_cap), width)
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
        move_rows([self.bias, *self.cross], perm, moved)

    def fit_sources(self, n: int, width: int) -> None:
        """Trim (or pad) the source axis of the n live sentences to `width`."""
        self._resize(n, self.bias.shape[0], width)

    def _resize(self, n: int, n_cap: int, width: int) -> None:
        gr = self.graphs
        w = min(self.bias.shape[1], width)
        bias = np.full((n_cap, width), -np.inf, dtype=np.float32)
        bias[:n, :w] = self.bias[:n, :w]
        cross = []
        for j in range(2 * gr.n_layers):
            x = gr.empty_kv(n_cap, width)
            if n:
                x[:n, :, :w] = self.cross[j][:n, :, :w]
            cross.append(x)
        self.bias, self.cross = bias, cross


class DeviceRows(Rows):
    """The in-flight batch's tensors on the device (IOBinding path: CUDA; also runs on CPU for tests):
    K/V are OrtValues holding exactly the live rows, and every change is one graph run on the device, so
    K/V never cross the bus (only ids, positions, the source bias and the decoder's candidates do): a
    plain step (beam reorder + this step's K/V at per-row positions) runs the bundle's kv_step graph,
    sentences leaving the cache graph's row gather, and the rest (sentences joining, the time or source
    axis growing or shrinking) the general kv_rows graph. Same interface as HostRows."""

    def __init__(self, graphs: Graphs, cache: NumpyCache | BoundCache) -> None:
        if not isinstance(cache, BoundCache) or graphs.kv_rows is None or graphs.kv_step is None:
            raise BundleError("in-flight K/V on the device need IOBinding and the kv_rows/kv_step graphs")
        self.graphs = graphs
        self.cache = cache  # the request path's (stateless): encode and step with device outputs
        self.kv: list[Any] = []  # 2L x (rows, H, T, Dh) OrtValues
        self.cross: list[Any] = []  # 2L x (n, H, S, Dh) OrtValues
        self.bias = np.zeros((0, 0), dtype=np.float32)  # (n, S), host: fed to every step
        self._zero = graphs.empty_kv(1, 1)  # one zero row

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
        export/cache_graphs.make_kv_rows_graph). An empty a or a missing b is one zero row."""
        gr, cache = self.graphs, self.cache
        graph = gr.kv_rows
        io = graph.io_binding()
        m = idx.size
        io.bind_cpu_input("idx", np.ascontiguousarray(idx, dtype=np.int64))
        io.bind_cpu_input("n_idx", np.zeros(m, np.int64) if n_idx is None else np.ascontiguousarray(n_idx))
        io.bind_cpu_input("pos", np.full(m, -1, np.int64) if pos is None else np.ascontiguousarray(pos))
        io.bind_cpu_input("t_out", np.array([t_out], dtype=np.int64))
        for j in range(2 * gr.n_layers):
            bind_input(io, f"a_{j}", a[j] if a else self._zero)
            bind_input(io, f"b_{j}", b[j] if b else self._zero)
            bind_input(io, f"n_{j}", new_kv[j] if new_kv is not None else self._zero)
            io.bind_output(f"y_{j}", cache.dev, cache.dev_id)
        graph.run_with_iobinding(io)
        return list(io.get_outputs())

    def update_rows(
        self, src: np.ndarray, filled: np.ndarray, t_cap: int, new_kv: list[Any] | None, same_layout: bool
    ) -> None:
        if self.kv and t_cap == shape_of(self.kv[0])[2] and (src >= 0).all():
            # Nobody joins, same capacity: the steady state of decoding (a step) or sentences leaving.
            self.kv = self.cache.take(self.kv, src) if new_kv is None else self._step(src, filled, new_kv)
            return
        n_a = shape_of(self.kv[0])[0] if self.kv else 1
        idx = np.where(src >= 0, src, n_a)  # joining rows: the zero row after a
        if new_kv is None:
            self.kv = self._run(self.kv, None, idx, t_cap)
        else:
            self.kv = self._run(self.kv, None, idx, t_cap, new_kv, src, filled)

    def _step(self, src: np.ndarray, filled: np.ndarray, new_kv: list[Any]) -> list[Any]:
        """kv_step graph: rows src of the cache with new_kv[src] written at slot filled (per row)."""
        gr, cache = self.graphs, self.cache
        m, h = src.size, gr.n_heads
        write = np.empty((m, h, 3), dtype=np.int64)  # [row, head, slot] of every row's new K/V
        write[:, :, 0] = np.arange(m)[:, None]
        write[:, :, 1] = np.arange(h)[None, :]
        write[:, :, 2] = filled[:, None]
        graph = gr.kv_step
        io = graph.io_binding()
        io.bind_cpu_input("idx", np.ascontiguousarray(src, dtype=np.int64))
        io.bind_cpu_input("write", write.reshape(m * h, 3))
        for j in range(2 * gr.n_layers):
            bind_input(io, f"a_{j}", self.kv[j])
            bind_input(io, f"n_{j}", new_kv[j])
            io.bind_output(f"y_{j}", cache.dev, cache.dev_id)
        graph.run_with_iobinding(io)
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
