"""In-flight (continuous) batching at the id level: DecodeBatch, which sentences join and leave at
decoding-step boundaries, each with its own step index, beam size, n-best, length budget, alpha and
decoding guards (repetition_penalty, no_repeat_ngram_size).

It owns the batch's membership and search state (per-sentence metadata, beam histories, next tokens and
scores) and decides every step with search.py's rules, so every sentence's result is the one
`Generator.generate` gives it alone; its tensors live in a storage from rows.py (host or device). It
needs a decoder graph with per-row positions (N,). The text level over it is text.RunningBatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.bundle import BundleError
from runtime.decoding import gnmt_length_penalty
from server.engine.cache import move_rows
from server.engine.generator import Generator, check_guards
from server.engine.rows import DeviceRows, HostRows, grow, time_slots
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

__all__ = ["DecodeBatch", "DecodeItem"]


@dataclass
class DecodeItem:
    """A sentence to admit into a DecodeBatch (ids without BOS/EOS)."""

    key: Any
    ids: Sequence[int]
    beam_size: int = 1
    num_hypotheses: int = 1
    length_penalty: float = 0.6
    max_length: int = 256
    repetition_penalty: float = 1.0  # 1 = off
    no_repeat_ngram_size: int = 0  # 0 = off


class DecodeBatch:
    """One running decode batch that sentences join and leave at decoding-step boundaries (in-flight,
    a.k.a. continuous batching), id level. No threads, no asyncio: the caller owns the loop.

    Every sentence's result is the one `Generator.generate` gives it alone (same search rule, same
    candidates; see the in-flight tests in tests/test_engine_inflight.py), whatever joins or leaves around it,
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

    * HostRows (CPU): numpy buffers with spare capacity, live prefix; a step writes the new K/V in
      place, and a beam reorder copies only the rows whose origin changed and only the slots their
      sentence has filled (not the capacity of the longest running sentence, as a whole-cache gather
      would);
    * DeviceRows (IOBinding, CUDA): OrtValues of exactly the live rows, rebuilt on the device by the
      bundle's kv_step / kv_rows graphs at each change (device memory bandwidth makes the full copy
      cheap; the host never sees the K/V).

    The time axis grows by 16 slots when the longest row needs it and shrinks again when long sentences
    leave (every row attends over all of it, masked); likewise the source axis.

    Mixed beam sizes pay for dead rows (a beam-2 sentence next to beam 4 costs 4 rows), so
    text.RunningBatch runs each beam size in a DecodeBatch of its own.

    Decoding guards are per sentence: the batch asks the graph for the unguarded count of candidates
    plus the most any sentence's guards may lower, each sentence's own guards re-rank its own
    candidates, and every row is cut back to the unguarded count (search.apply_guards: exact, so a
    sentence without guards gets exactly the candidates it would get without them).
    """

    def __init__(self, gen: Generator) -> None:
        if not gen.row_positions:
            raise BundleError(
                f"{gen.paths['decoder']}: the decoder graph takes one shared position (1,); in-flight "
                "batching needs per-row positions (N,): re-export the bundle with this version"
            )
        self.g = gen
        self._store: HostRows | DeviceRows = (
            DeviceRows(gen.graphs, gen.cache) if gen.inflight_on_device else HostRows(gen.graphs)
        )
        self._clear()  # per-sentence state
        self._hist = np.zeros((0, 1, 0), dtype=np.int64)  # (n_cap, Kc, L) tokens so far per beam
        self.steps = 0
        self.settled = 0  # sentences retired by the settled() stop

    # ---------------------------------------------------------------------------------- properties

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def rows(self) -> int:
        return len(self.keys) * self.kc

    @property
    def on_device(self) -> bool:
        """Whether K/V stay on the device (IOBinding storage)."""
        return isinstance(self._store, DeviceRows)

    @property
    def past(self) -> list[Any]:
        """The live self-attention cache: 2L x (rows, H, T_cap, Dh)."""
        return self._store.past(self.rows)

    @property
    def source_width(self) -> int:
        """Source positions every running sentence's cross-attention spans (padded)."""
        return self._store.source_width if self.keys else 0

    # ----------------------------------------------------------------------------------- storage

    def _apply_perm_meta(self, perm: np.ndarray) -> None:
        idx = perm.tolist()
        self.keys = [self.keys[i] for i in idx]
        self._finished = [self._finished[i] for i in idx]
        self.beam, self.n_best, self.lim = self.beam[perm], self.n_best[perm], self.lim[perm]
        self.t, self.n_fin = self.t[perm], self.n_fin[perm]
        self.src_lens, self.alpha = self.src_lens[perm], self.alpha[perm]
        self.penalty, self.ngram = self.penalty[perm], self.ngram[perm]

    def _shrink_source(self) -> None:
        """Trim the source axis when the widest sentences have left (two buckets of hysteresis)."""
        if not self.keys:
            return
        width = self.g.source_width(self.src_lens)
        if width + 2 * self.g.source_bucket <= self._store.source_width:
            self._store.fit_sources(len(self.keys), width)

    def _clear(self) -> None:
        """No running sentences (the host storage stays, for reuse)."""
        self.keys: list[Any] = []
        self._finished: list[NBest] = []
        self.kc = 1  # rows per sentence: the largest running beam
        z = np.zeros(0, dtype=np.int64)
        # Per sentence (n,): beam size, n-best, length limit, step, finished count, source length, alpha,
        # repetition penalty, no-repeat n-gram size.
        self.beam, self.n_best, self.lim, self.t, self.n_fin, self.src_lens = z, z, z, z, z, z
        self.alpha, self.penalty, self.ngram = np.zeros(0), np.ones(0), z
        self.tokens = np.zeros((0, 1), dtype=np.int64)  # (n * Kc, 1) next input token per row
        self.scores = np.zeros((0, 1), dtype=np.float32)  # (n, Kc) beam scores
        self._store.clear()

    def _compact(
        self, perm: np.ndarray, kc_next: int, nb: np.ndarray | None, new_kv: list[Any] | None
    ) -> None:
        """Keep sentences perm (new sentence i = old perm[i], from swap_remove) with kc_next rows each,
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
        t_cap = time_slots(int(t_keep.max()) + (1 if new_kv is not None else 0))
        self._store.update_rows(src, filled, t_cap, new_kv, same_layout=kc_next == kc)
        if perm.size == len(self.keys):  # nobody left (perm is the identity): only beams may move
            if nb is not None or kc_next != kc:
                self._hist = self._hist[perm[:, None], base]  # (n, Kc', L)
            self.kc = kc_next
            return
        moved = np.flatnonzero(perm != np.arange(perm.size))
        self._store.compact_sources(perm, moved)
        if nb is None and kc_next == kc:
            move_rows([self._hist], perm, moved)
        else:
            self._hist = self._hist[perm[:, None], base]  # (n', Kc', L)
        self._apply_perm_meta(perm)
        self.kc = kc_next
        self._shrink_source()

    # --------------------------------------------------------------------------------------- admit

    def admit(self, items: Sequence[DecodeItem]) -> list[tuple[Any, NBest]]:
        """Encode `items` (one encoder batch per source width) and merge them into the batch; they take part
        from the next step() on. Returns the items that finish at once (zero length budget)."""
        g = self.g
        done_now: list[tuple[Any, NBest]] = []
        new = []
        for it in items:
            k = int(it.beam_size)
            if k < 1 or not 1 <= it.num_hypotheses <= k:
                raise ValueError(f"need beam_size >= 1 and 1 <= num_hypotheses <= beam_size, got {it}")
            check_guards(it.repetition_penalty, it.no_repeat_ngram_size)
            if it.max_length <= 0:
                done_now.append((it.key, [([], 0.0)]))
            else:
                new.append(it)
        if not new:
            return done_now
        # One encoder batch per source width (bucket of 8): padding a short source to the longest one
        # admitted with it would cost more than another encoder call. Sorted by width, each encoder
        # batch joins as one contiguous block.
        widths = np.array([g.source_width(np.array([len(it.ids)])) for it in new], dtype=np.int64)
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
        t_cap = time_slots(int(self.t.max()) if n_old else 1)
        self._store.update_rows(src_rows.reshape(-1), filled, t_cap, None, same_layout=kc == kc_old)
        # History: (n_cap, Kc, L) with L the longest length budget.
        limit = max(int(it.max_length) for it in new)
        h_cap, h_kc, h_len = self._hist.shape
        if n > h_cap or kc != h_kc or limit > h_len:
            hist = np.zeros((grow(n, h_cap), kc, max(limit, h_len)), dtype=np.int64)
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
        self.penalty = cat([self.penalty, [float(it.repetition_penalty) for it in new]])
        self.ngram = cat([self.ngram, [int(it.no_repeat_ngram_size) for it in new]]).astype(np.int64)
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
        perm = swap_remove(keep)
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
        n_cand = 1 if greedy else min(2 * kc, kc * V)
        bias, cross = self._store.sources(n)
        guards = guard_pairs(self._hist[:n], self.t, np.isfinite(self.scores), self.penalty, self.ngram, V)
        feed = {
            "input_ids": self.tokens,
            "position": self.t if greedy else np.repeat(self.t, kc),
            "src_bias": bias,
            "beam_scores": self.scores,
            "num_candidates": np.array([guarded_candidates(n_cand, guards)], dtype=np.int64),
        }
        top_s, top_i, new_kv = self._store.step(feed, cross, self.past)
        if guards is not None:  # each sentence's own guards, cut back to n_cand: the rules are unchanged
            top_s, top_i = apply_guards(top_s, top_i, self.scores, guards, self.penalty, n_cand)
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
        # settled() needs n_best finished ones; a row still searching has n_fin of them
        if not greedy and (search := np.flatnonzero(~done & (self.n_fin >= self.n_best))).size:
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
        if out:
            keep = ~done
            kc_next = int(self.beam[keep].max()) if keep.any() else 1
            perm = swap_remove(keep)
            kept: np.ndarray | slice = perm
        else:  # nobody leaves (most steps): the identity, and slices instead of fancy indexing
            kc_next, perm, kept = kc, np.arange(n), slice(None)
        nb = None if new_beam is None else new_beam[kept, :kc_next]
        t_keep = self.t[kept]
        self._compact(perm, kc_next, nb, new_kv)
        if perm.size:
            self._hist[np.arange(perm.size), :, t_keep] = new_tok[kept, :kc_next]
            self.tokens = np.ascontiguousarray(new_tok[kept, :kc_next]).reshape(-1, 1)
            self.scores = np.ascontiguousarray(new_score[kept, :kc_next], dtype=np.float32)
            self.t = self.t + 1
        return out
