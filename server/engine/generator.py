"""Id-level request decoding: the Generator runs a batch of source id lists to their n-best lists.

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
  step's K/V; where the cache lives between steps is the cache back-end's business (cache.py).

The step's selection rules are search.py's; the sessions and graph interface are sessions.py's. The
decoding guards (repetition_penalty, no_repeat_ngram_size) ask the graph for more candidates and re-rank
them on the host (search.apply_guards, exact); with both off the step is exactly the unguarded one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from runtime.decoding import gnmt_length_penalty
from server.engine.cache import BoundCache, NumpyCache, move_rows
from server.engine.search import (
    NBest,
    apply_guards,
    beam_endings,
    greedy_endings,
    guard_pairs,
    guarded_candidates,
    select_candidates,
    select_greedy,
    settled,
    swap_remove,
)
from server.engine.sessions import Graphs, open_sessions, physical_cores

__all__ = ["Generator", "check_guards"]


def check_guards(repetition_penalty: float, no_repeat_ngram_size: int) -> None:
    """ValueError unless repetition_penalty is finite and >= 1 and no_repeat_ngram_size >= 0."""
    if not math.isfinite(repetition_penalty) or repetition_penalty < 1.0:
        raise ValueError(f"need a finite repetition_penalty >= 1.0 (1 = off), got {repetition_penalty}")
    if no_repeat_ngram_size < 0 or no_repeat_ngram_size != int(no_repeat_ngram_size):
        raise ValueError(f"need an integer no_repeat_ngram_size >= 0 (0 = off), got {no_repeat_ngram_size}")


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
        cuda_tf32: bool = True,
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
        self.threads = intra_op_threads if intra_op_threads > 0 else physical_cores()
        sessions, self.on_cuda, device_id = open_sessions(self.paths, device, self.threads, cuda_tf32)
        self.providers: list[str] = sessions["decoder"].get_providers()
        self.graphs = Graphs.inspect(sessions, self.paths["decoder"].parent)
        gr = self.graphs  # the model interface, also as attributes for callers (e.g. bench/step_cost):
        self.n_layers, self.n_heads, self.head_dim = gr.n_layers, gr.n_heads, gr.head_dim
        self.vocab_size, self.kv_dtype = gr.vocab_size, gr.kv_dtype
        self.cross_names, self.past_names, self.new_kv_names = gr.cross_names, gr.past_names, gr.new_kv_names
        self.row_positions = gr.row_positions  # the in-flight batch needs it (tests turn it off)
        use_binding = self.on_cuda if io_binding is None else io_binding
        if use_binding:
            self.cache: NumpyCache | BoundCache = BoundCache(
                gr, "cuda" if self.on_cuda else "cpu", device_id if self.on_cuda else 0
            )
        else:
            self.cache = NumpyCache(gr)
        self.last_stats: dict[str, Any] = {}
        self.greedy_fast_path = True  # beam 1 through the vectorised greedy branch (same result, faster)

    # The sessions live in self.graphs (one place, shared with the cache back-ends and in-flight storages).

    @property
    def encoder(self) -> ort.InferenceSession:
        return self.graphs.encoder

    @property
    def decoder(self) -> ort.InferenceSession:
        return self.graphs.decoder

    @property
    def cache_graph(self) -> ort.InferenceSession | None:
        return self.graphs.cache

    @property
    def kv_rows_graph(self) -> ort.InferenceSession | None:
        return self.graphs.kv_rows

    @property
    def kv_step_graph(self) -> ort.InferenceSession | None:
        return self.graphs.kv_step

    @property
    def inflight_on_device(self) -> bool:
        """Whether an in-flight DecodeBatch keeps K/V on the device (IOBinding and the kv_* graphs)."""
        graphs = (self.graphs.kv_rows, self.graphs.kv_step)
        return isinstance(self.cache, BoundCache) and all(g is not None for g in graphs)

    def source_width(self, lengths: np.ndarray) -> int:
        """Source positions for sources of these lengths: the longest, rounded up to the bucket (at most
        max_positions)."""
        longest = max(1, int(lengths.max()))
        width = -(-longest // self.source_bucket) * self.source_bucket
        return max(longest, min(width, self.max_positions or width))

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
        repetition_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
    ) -> list[NBest | None]:
        """Decode source id lists (no BOS/EOS). Per source: up to num_hypotheses (tokens, score), best
        first, or None if `cancelled()` reported it at a step boundary. max_lengths: int or per source.
        repetition_penalty (1 = off) and no_repeat_ngram_size (0 = off): CTranslate2's decoding guards."""
        K = int(beam_size)
        if K < 1 or not 1 <= num_hypotheses <= K:
            raise ValueError(
                f"need beam_size >= 1 and 1 <= num_hypotheses <= beam_size, got {K}, {num_hypotheses}"
            )
        check_guards(repetition_penalty, no_repeat_ngram_size)
        guarded = repetition_penalty != 1.0 or no_repeat_ngram_size > 0
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

        t0 = time.perf_counter()
        bias, cross = self._encode([sources[b] for b in active])
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
            guards = None
            if guarded:
                t0 = time.perf_counter()
                penalty = np.full(n_act, repetition_penalty, dtype=np.float64)
                ngram = np.full(n_act, no_repeat_ngram_size, dtype=np.int64)
                guards = guard_pairs(hist, np.full(n_act, t), np.isfinite(scores), penalty, ngram, V)
                stats["select_s"] += time.perf_counter() - t0
            feed = {
                "input_ids": tokens,
                "position": positions[t : t + 1],
                "src_bias": bias,
                "beam_scores": scores,
                "num_candidates": np.array([guarded_candidates(n_cand, guards)], dtype=np.int64),
            }
            t0 = time.perf_counter()
            top_s, top_i, new_kv = cache.step(feed, cross, past)
            t1 = time.perf_counter()
            if guards is not None:  # re-ranked and cut back to n_cand: the rules below are unchanged
                top_s, top_i = apply_guards(top_s, top_i, scores, guards, penalty, n_cand)
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
                new_beam = None  # every row continues itself
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
            # settled() needs num_hypotheses finished ones; a row still searching has n_fin of them
            if not greedy and (search := np.flatnonzero(~done & (n_fin >= num_hypotheses))).size:
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
            keep_pos = swap_remove(keep)  # the last kept sentences take the leavers' places
            compact = keep_pos.size < n_act
            # Rows of the next cache: sentence-major, K per sentence, taken from their beam origins
            # (None: the same rows in the same order, appended in place; always so in a greedy step
            # where nobody finished).
            rows = None
            if new_beam is None:
                rows = keep_pos if compact else None
            elif compact or K > 1:
                rows = ((keep_pos * K)[:, None] + new_beam[keep_pos]).reshape(-1)
                if not compact and np.array_equal(rows, np.arange(rows.size)):
                    rows = None
            past = cache.advance(past, new_kv, rows, t)
            if compact:
                active, lim, n_fin = active[keep_pos], lim[keep_pos], n_fin[keep_pos]
                bias, cross = self._compact_source(bias, cross, keep_pos, src_lens[active], swapped=True)
                new_tok, new_score = new_tok[keep_pos], new_score[keep_pos]
                if new_beam is not None:
                    new_beam = new_beam[keep_pos]
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
        self,
        bias: np.ndarray,
        cross: list[Any],
        keep_pos: np.ndarray,
        kept_src_lens: np.ndarray,
        swapped: bool = False,
    ) -> tuple[np.ndarray, list[Any]]:
        """Drop finished sentences from the per-sentence tensors (and trim the source axis on CPU).
        swapped: keep_pos is a swap_remove permutation, so on the CPU, when the source axis stays, the
        moved sentences are copied into the leavers' places and the rest stays in place."""
        if keep_pos.size == 0:
            return bias[:0], cross
        if self.cache.trims_source:
            s = self.source_width(kept_src_lens)
            if s < bias.shape[1]:
                return np.ascontiguousarray(bias[keep_pos, :s]), self.cache.take(cross, keep_pos, s)
            if swapped:
                move_rows([bias, *cross], keep_pos)
                n = keep_pos.size
                return bias[:n], [x[:n] for x in cross]
        return bias[keep_pos], self.cache.take(cross, keep_pos)

    def _encode(self, sources: list[Sequence[int]]) -> tuple[np.ndarray, list[Any]]:
        """Encoder outputs (bias (N, W), cross K/V) of `sources`, W the widest one's bucket.

        On the host cache, one encoder call per source width (as the in-flight batch admits them):
        padding a 5-token string to a 60-token description would cost the encoder more than another
        call. Real positions come out bit-identical at any bucketed width; the padding is bias -inf
        and zero K/V, which the decoder's attention weighs at exactly 0."""
        lens = np.array([len(s) for s in sources], dtype=np.int64)
        widths = np.array([self.source_width(lens[i : i + 1]) for i in range(lens.size)], dtype=np.int64)
        width = int(widths.max())
        if isinstance(self.cache, BoundCache) or np.unique(widths).size == 1:
            src = np.full((lens.size, width), self.pad_id, dtype=np.int64)
            for row, ids in enumerate(sources):
                src[row, : lens[row]] = ids
            return self.cache.encode(src)
        bias = np.full((lens.size, width), -np.inf, dtype=np.float32)
        cross: list[np.ndarray] = []
        for w in np.unique(widths).tolist():
            rows = np.flatnonzero(widths == w)
            src = np.full((rows.size, w), self.pad_id, dtype=np.int64)
            for r, i in enumerate(rows.tolist()):
                src[r, : lens[i]] = sources[i]
            bias_w, cross_w = self.cache.encode(src)
            if not cross:
                cross = [np.zeros((lens.size, x.shape[1], width, x.shape[3]), dtype=x.dtype) for x in cross_w]
            bias[rows, :w] = bias_w
            for x, c in zip(cross, cross_w, strict=True):
                x[rows, :, :w] = c
        return bias, cross

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
