"""The two KV-cache back-ends of the request path: where K/V live between decoder steps.

Both run the encoder and one decoder step and turn a step's new K/V into the next step's cache
(`advance`: reorder rows by beam origin, append at slot t) and drop rows (`take`):

* `NumpyCache` (CPU): numpy arrays with spare time capacity, all layers' K and V stacked in one array;
  greedy steps write in place, a beam reorder copies the changed rows in place (or, when most rows
  change, takes the whole cache into a second, reused buffer); the decoder reads them through one
  IOBinding kept across steps.
* `BoundCache` (IOBinding: CUDA, or the CPU provider in tests): OrtValues on the device, reordered and
  appended there by the bundle's cache graph; only ids, scores and candidates cross the bus.

A back-end gets the sessions and the model interface (a `Graphs`) explicitly; it knows nothing of the
Generator that drives it. `bind_input` and `shape_of` also serve the in-flight device storage (rows.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from runtime.bundle import BundleError
from server.engine.sessions import Graphs

__all__ = ["BoundCache", "NumpyCache", "bind_input", "move_rows", "shape_of"]


def shape_of(x: Any) -> tuple[int, ...]:
    """Shape of a numpy array or an OrtValue (where shape is a method)."""
    return tuple(x.shape()) if callable(x.shape) else x.shape


def bind_input(io: Any, name: str, value: Any) -> None:
    """Bind a numpy array (e.g. the zero-length cache of the first step) or an OrtValue as an input."""
    if isinstance(value, np.ndarray):
        io.bind_cpu_input(name, value)
    else:
        io.bind_ortvalue_input(name, value)


def move_rows(tensors: list[np.ndarray], perm: np.ndarray, moved: np.ndarray | None = None) -> None:
    """Row i of every tensor becomes old row perm[i] (a swap_remove permutation, in place): only the
    holes change, and their sources lie past the new end, so nothing is read after it is written.
    moved: the positions where perm differs from the identity, when the caller has them already."""
    if moved is None:
        moved = np.flatnonzero(perm != np.arange(perm.size))
    if moved.size:
        src = perm[moved]
        for x in tensors:
            x[moved] = x[src]


class NumpyCache:
    """CPU path: numpy arrays. The self-attention cache has spare capacity along time (a multiple of
    CAPACITY_STEP): in greedy steps the new K/V are written in place (no copy of the cache at all); a
    beam reorder copies the changed rows' filled slots in place, or (past IN_PLACE_SHARE) takes the whole
    cache into a second, reused buffer with one contiguous np.take.

    The decoder runs through one IOBinding kept across steps: an input is bound again only when the
    caller passes another array object (the cache's views stay the same objects while greedy steps
    write into them), and the outputs land in buffers reused from step to step. That saves the
    per-call conversion of 17 inputs and 8 outputs (15 µs of a 180 µs int8 step at one row).
    Contract: the new K/V a step returns are views of those buffers, valid until the next step."""

    trims_source = True
    CAPACITY_STEP = 16
    # A reorder copies the changed rows' filled slots in place while they are at most this share of
    # the cache (rows x capacity), else the whole cache into the other buffer set with one np.take:
    # in place is 1.2-5x faster at 25-75% of the rows changed, np.take as fast when nearly all change.
    IN_PLACE_SHARE = 0.8

    @staticmethod
    def slots(n: Any) -> Any:
        """n time slots (an int or an array of them) rounded up to a multiple of CAPACITY_STEP."""
        step = NumpyCache.CAPACITY_STEP
        return -(-n // step) * step

    def __init__(self, graphs: Graphs, bind: bool = True) -> None:
        self.graphs = graphs
        self.bind = bind  # False: a plain InferenceSession.run per step (the reference in tests)
        self._sets: list[np.ndarray | None] = [None, None]  # double buffer: never read and write one set
        self._flip = 0
        self._stack: np.ndarray | None = None  # (2L, rows, H, capacity, Dh): the last buffers() made
        self._views: list[np.ndarray] = []  # its 2L views, as handed out
        self._io: Any = None  # the decoder's IOBinding, kept across steps
        self._bound: dict[str, np.ndarray] = {}  # what is bound to each input (kept alive here)
        self._out_key: tuple[int, int, int] = (-1, -1, -1)  # (kv rows, sentences, candidates) bound
        self._out: list[np.ndarray] = []  # topk scores, topk indices, new K/V (2L, rows, H, 1, Dh)

    def encode(self, src: np.ndarray) -> tuple[np.ndarray, list[Any]]:
        gr = self.graphs
        out = gr.encoder.run(gr.encoder_outputs, {"src_ids": src})
        return out[0], out[1:]

    def empty_past(self, rows: int) -> list[Any]:
        return [self.graphs.empty_kv(rows)] * (2 * self.graphs.n_layers)

    def step(self, feed: dict[str, np.ndarray], cross: list[Any], past: list[Any]) -> tuple[Any, ...]:
        gr = self.graphs
        if not self.bind:
            feed.update(zip(gr.cross_names, cross, strict=True))
            feed.update(zip(gr.past_names, past, strict=True))
            out = gr.decoder.run(gr.step_outputs, feed)
            return out[0], out[1], out[2:]
        if self._io is None:
            self._io = gr.decoder.io_binding()
        io, bound = self._io, self._bound
        for name, value in feed.items():  # small per-step inputs: copied into buffers bound once
            mine = bound.get(name)
            if mine is not None and mine.shape == value.shape and mine.dtype == value.dtype:
                np.copyto(mine, value)
            else:
                bound[name] = mine = np.array(value, order="C")
                io.bind_cpu_input(name, mine)
        for name, value in zip((*gr.cross_names, *gr.past_names), (*cross, *past), strict=True):
            if bound.get(name) is not value:
                # bound by address: ONNX Runtime reads the array's memory at every run, so the
                # in-place writes of advance() reach the next step without binding again
                value = np.ascontiguousarray(value)
                io.bind_cpu_input(name, value)
                bound[name] = value
        key = (feed["input_ids"].shape[0], feed["beam_scores"].shape[0], int(feed["num_candidates"][0]))
        if key != self._out_key:
            self._bind_outputs(io, *key)
        gr.decoder.run_with_iobinding(io)
        scores, indices, new = self._out
        return scores.copy(), indices.copy(), list(new)

    def _bind_outputs(self, io: Any, rows: int, sentences: int, candidates: int) -> None:
        """Fresh output buffers for this shape, bound by address."""
        gr = self.graphs
        scores = np.empty((sentences, candidates), dtype=np.float32)
        indices = np.empty((sentences, candidates), dtype=np.int64)
        new = np.empty((len(gr.new_kv_names), rows, gr.n_heads, 1, gr.head_dim), dtype=gr.kv_dtype)
        for name, arr in zip(("topk_scores", "topk_indices"), (scores, indices), strict=True):
            io.bind_output(name, "cpu", 0, arr.dtype, arr.shape, arr.ctypes.data)
        for name, arr in zip(gr.new_kv_names, new, strict=True):
            io.bind_output(name, "cpu", 0, arr.dtype, arr.shape, arr.ctypes.data)
        self._out, self._out_key = [scores, indices, new], (rows, sentences, candidates)

    def buffers(self, like: list[np.ndarray], rows: int, capacity: int) -> list[np.ndarray]:
        """Zero-initialised, reused storage for len(like) tensors (rows, H, capacity, Dh): one array
        (len(like), rows, H, capacity, Dh), returned as its contiguous views (so a step reorders or
        appends all layers in one numpy call). Spare entries must stay finite, and a fresh allocation
        per step would page-fault its memory in every time (slower than the copy)."""
        shape = (len(like), rows, like[0].shape[1], capacity, like[0].shape[3])
        n = math.prod(shape)
        buf = self._sets[self._flip]
        if buf is None or buf.size < n or buf.dtype != like[0].dtype:
            buf = self._sets[self._flip] = np.zeros(n + n // 2, dtype=like[0].dtype)
        self._flip ^= 1
        self._stack = buf[:n].reshape(shape)
        self._views = list(self._stack)
        return self._views

    def _stacked(self, past: list[Any]) -> np.ndarray | None:
        """The stacked array whose views `past` is (the last buffers()), else None."""
        if self._stack is None or len(past) != len(self._views):
            return None
        return self._stack if all(p is v for p, v in zip(past, self._views, strict=True)) else None

    def advance(self, past: list[Any], new: list[Any], rows: np.ndarray | None, t: int) -> list[Any]:
        """The cache of the next step: rows `rows` (None = same rows, same order) of past[:, :, :t] with
        this step's K/V written at index t."""
        capacity = past[0].shape[2]
        st = self._stacked(past)
        if st is not None and t < capacity:
            fresh = self._fresh(new)  # (2L, rows, H, Dh)
            if rows is None:
                st[:, :, :, t] = fresh
                return past
            m = rows.size
            changed = np.flatnonzero(rows != np.arange(m))
            if changed.size * t <= self.IN_PLACE_SHARE * m * capacity:
                # In place: only the rows whose origin changed, only their filled slots (a beam step
                # keeps most rows; a finished sentence shifts the rest down). The right side is
                # gathered (copied) before it is written, so sources and destinations may overlap.
                if changed.size:
                    st[:, changed, :, :t] = st[:, rows[changed], :, :t]
                if m < st.shape[1]:
                    self._stack = st = st[:, :m]  # every layer's view stays contiguous
                    self._views = list(st)
                st[:, :, :, t] = fresh[:, rows]
                return self._views
            dest = self.buffers(past, m, capacity)
            np.take(st, rows, axis=1, out=self._stack, mode="clip")  # contiguous; rows are in range
            self._stack[:, :, :, t] = fresh[:, rows]
            return dest
        n_rows = past[0].shape[0] if rows is None else rows.size
        dest = self.buffers(past, n_rows, self.slots(t + 1))
        for p, x, d in zip(past, new, dest, strict=True):
            d[:, :, :t] = p[:, :, :t] if rows is None else p[rows, :, :t]
            d[:, :, t] = x[:, :, 0] if rows is None else x[rows, :, 0]
        return dest

    def _fresh(self, new: list[Any]) -> np.ndarray:
        """A step's new K/V as one (2L, rows, H, Dh) array: a view of the output buffer when they are
        its views (the bound path), else stacked."""
        if self._out and len(new) == len(self._out[2]) and new[0].base is self._out[2]:
            return self._out[2][:, :, :, 0]
        return np.stack(new)[:, :, :, 0]

    def take(self, tensors: list[Any], idx: np.ndarray, src_len: int | None = None) -> list[Any]:
        if src_len is None:
            return [np.take(x, idx, axis=0) for x in tensors]
        return [np.ascontiguousarray(x[idx, :, :src_len]) for x in tensors]

    def release(self) -> None:
        self._sets = [None, None]
        self._stack, self._views = None, []
        if self._io is not None:
            self._io.clear_binding_inputs()
            self._io.clear_binding_outputs()
        self._io, self._bound = None, {}
        self._out, self._out_key = [], (-1, -1, -1)


class BoundCache:
    """IOBinding path (CUDA; also runs on CPU for tests): K/V live as OrtValues on the device and are
    reordered/appended there by the bundle's cache graph; only ids, scores and candidates cross the bus."""

    trims_source = False

    def __init__(self, graphs: Graphs, device_type: str, device_id: int) -> None:
        if graphs.cache is None:
            raise BundleError("the IOBinding path needs the bundle's cache graph")
        self.graphs, self.dev, self.dev_id = graphs, device_type, device_id

    def encode(self, src: np.ndarray) -> tuple[np.ndarray, list[Any]]:
        gr = self.graphs
        io = gr.encoder.io_binding()
        io.bind_cpu_input("src_ids", src)
        io.bind_output("src_bias", "cpu")
        for name in gr.cross_names:
            io.bind_output(name, self.dev, self.dev_id)
        gr.encoder.run_with_iobinding(io)
        out = io.get_outputs()
        return out[0].numpy(), list(out[1:])

    def empty_past(self, rows: int) -> list[Any]:
        return [self.graphs.empty_kv(rows)] * (2 * self.graphs.n_layers)

    def step(self, feed: dict[str, np.ndarray], cross: list[Any], past: list[Any]) -> tuple[Any, ...]:
        gr = self.graphs
        io = gr.decoder.io_binding()
        for name, value in feed.items():
            io.bind_cpu_input(name, value)
        for name, value in zip(gr.cross_names, cross, strict=True):
            bind_input(io, name, value)
        for name, value in zip(gr.past_names, past, strict=True):
            bind_input(io, name, value)
        io.bind_output("topk_scores", "cpu")
        io.bind_output("topk_indices", "cpu")
        for name in gr.new_kv_names:
            io.bind_output(name, self.dev, self.dev_id)
        gr.decoder.run_with_iobinding(io)
        out = io.get_outputs()
        return out[0].numpy(), out[1].numpy(), list(out[2:])

    def _run_cache(self, xs: list[Any], ns: list[Any], idx: np.ndarray) -> list[Any]:
        graph = self.graphs.cache
        assert graph is not None  # checked in __init__
        io = graph.io_binding()
        io.bind_cpu_input("idx", np.ascontiguousarray(idx, dtype=np.int64))
        for j, (x, n) in enumerate(zip(xs, ns, strict=True)):
            bind_input(io, f"x_{j}", x)
            bind_input(io, f"n_{j}", n)
            io.bind_output(f"y_{j}", self.dev, self.dev_id)
        graph.run_with_iobinding(io)
        return list(io.get_outputs())

    def advance(self, past: list[Any], new: list[Any], rows: np.ndarray | None, t: int) -> list[Any]:
        if rows is None:
            rows = np.arange(shape_of(past[0])[0])
        return self._run_cache(past, new, rows)

    def take(self, tensors: list[Any], idx: np.ndarray, src_len: int | None = None) -> list[Any]:
        n, h, _, d = shape_of(tensors[0])
        nothing = np.zeros((n, h, 0, d), dtype=self.graphs.kv_dtype)  # zero-length: a plain row gather
        return self._run_cache(tensors, [nothing] * len(tensors), idx)

    def release(self) -> None:
        pass
