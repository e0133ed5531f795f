"""The search rules of one decoding step, vectorised over sentences: pure functions, no sessions.

`select_candidates` is the reference beam rule of model/decode.py (EOS ranked below K finishes, the other
candidates fill the live beams in rank order); `select_greedy` is that rule with K = 1. `greedy_endings`
and `beam_endings` list the hypotheses a step finishes, in the reference's order; `settled` is the early
stop that retires a sentence once no live beam can change its n-best. The request path (generator.py)
and the in-flight batch (decode_batch.py) both decide every step with these, so they agree bit for bit.
The decoding guards (repetition_penalty, no_repeat_ngram_size) re-rank the graph's candidates on the host
before those rules run: `guard_pairs`, `guarded_candidates`, `apply_guards`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from runtime.decoding import gnmt_length_penalty

__all__ = [
    "LOGPROB_SLACK",
    "Ending",
    "Guards",
    "NBest",
    "apply_guards",
    "banned_tokens",
    "beam_endings",
    "greedy_endings",
    "guard_pairs",
    "guarded_candidates",
    "history_tokens",
    "select_candidates",
    "select_greedy",
    "settled",
    "swap_remove",
]

NBest = list[tuple[list[int], float]]  # (tokens, length-normalised score) per hypothesis, best first


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
    beam = top_i // vocab_size
    tok = top_i - beam * vocab_size
    n_cand = top_s.shape[1]
    uniform = beam_sizes.size > 0 and beam_sizes.min() == width == beam_sizes.max()  # in-flight may mix
    if n_cand >= width and uniform:
        head_s = top_s[:, :width]
        if not (tok[:, :width] == eos_id).any() and (head_s > -np.inf).all():
            # The usual step: every sentence's K best candidates continue (none is EOS or -inf), so
            # they are its K live beams in rank order and nothing finishes: the rule below gives
            # exactly this (a test compares both), in 5 numpy calls instead of about 20.
            B = top_s.shape[0]
            return (
                beam,
                tok,
                top_s,
                np.zeros(top_s.shape, dtype=bool),
                np.full(B, width),
                beam[:, :width],
                tok[:, :width],
                head_s.astype(np.float32),
            )
    return _select_by_rule(top_s, beam, tok, eos_id, pad_id, beam_sizes, width)


def _select_by_rule(
    top_s: np.ndarray,
    beam: np.ndarray,
    tok: np.ndarray,
    eos_id: int,
    pad_id: int,
    beam_sizes: np.ndarray,
    width: int,
) -> tuple[np.ndarray, ...]:
    """select_candidates' rule in general (any EOS, -inf or per-sentence beam size)."""
    K = beam_sizes[:, None]
    n_cand = top_s.shape[1]
    rank = np.arange(n_cand)[None, :]
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
    picked = (np.arange(len(order))[:, None], order)  # fancy indexing: cheaper than take_along_axis here
    valid = np.arange(width)[None, :] < n_live[:, None]
    new_beam = np.where(valid, beam[picked], 0)
    new_tok = np.where(valid, tok[picked], pad_id)
    new_score = np.where(valid, top_s[picked], -np.inf).astype(np.float32)
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


def swap_remove(keep: np.ndarray) -> np.ndarray:
    """perm (n',) for keeping the rows `keep` (n,) marks: new row i is old row perm[i]. Kept rows past
    the new end move into the holes left by leaving ones; everything else stays where it is, so a
    compaction copies as many rows as left instead of every row after the first leaver."""
    n_new = int(keep.sum())
    perm = np.arange(n_new)
    holes = np.flatnonzero(~keep[:n_new])
    if holes.size:
        perm[holes] = n_new + np.flatnonzero(keep[n_new:])
    return perm


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


# ------------------------------------------------------------------------------------ decoding guards
# CTranslate2's repetition_penalty and no_repeat_ngram_size, exact although the decoder graph ranks the
# candidates itself (log_softmax + beam scores + TopK inside the graph; the host never sees the logits).
#
# Both guards only LOWER scores, and only of a known set A of (beam, token) pairs per sentence: the
# tokens already in a live beam's history (penalty: log-prob * penalty <= log-prob; n-gram ban: -inf,
# and a banned token always occurs in the history). Let L be a sentence's top n + |A| candidates before
# the guards. At least n of L are untouched; every candidate outside L ranks after all of them before the
# guards and its score can only fall, so after the guards (re-sorted by score, ties by the graph's rank)
# it still ranks after them. Hence the top n after the guards over all K x V pairs are the top n of L
# after the guards: asking the graph for n + max |A| candidates and re-ranking them on the host is exact,
# and a sentence's result does not depend on how many more candidates its batch asked for.


class Guards(NamedTuple):
    """The (sentence, beam, token) pairs one step's guards may lower, as sorted unique int64 keys
    row * width + beam * vocab_size + token (width = beams per row x vocab_size: the graph's flat
    candidate index space, one block per row)."""

    banned: np.ndarray  # would repeat an n-gram: score -> -inf
    penalised: np.ndarray  # already in the beam's history (rows with repetition_penalty != 1)
    extra: np.ndarray  # (B,) per row: how many pairs the guards may lower, |banned | penalised|
    width: int
    vocab_size: int


def history_tokens(hist: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """(B, K, T), T = max(lengths): each beam's history hist[b, k, :lengths[b]], -1 past its length."""
    lengths = np.asarray(lengths, dtype=np.int64)
    T = int(lengths.max(initial=0))
    valid = np.arange(T)[None, None, :] < lengths[:, None, None]
    return np.where(valid, hist[:, :, :T], -1)


def banned_tokens(hist: np.ndarray, lengths: np.ndarray, n: int) -> np.ndarray:
    """The tokens no_repeat_ngram_size = n bans at the next step: (B, K, T), T = max(lengths), holding at
    position p the token hist[b, k, p] when the n - 1 tokens before p equal the beam's last n - 1 tokens
    (emitting it again would repeat the n-gram that ends at p), else -1. n = 1: every token of the
    history; n <= 0: none. hist (B, K, >= T): beam k of row b has the tokens hist[b, k, :lengths[b]]."""
    lengths = np.asarray(lengths, dtype=np.int64)
    B, K = hist.shape[:2]
    T = int(lengths.max(initial=0))
    if n <= 0 or T == 0:
        return np.full((B, K, T), -1, dtype=np.int64)
    h = history_tokens(hist, lengths)
    if n == 1:
        return h
    m = n - 1
    match = np.zeros((B, K, T), dtype=bool)
    if T > m:
        idx = np.clip(lengths[:, None] - m + np.arange(m), 0, None)  # (B, m): the last m positions
        suffix = np.take_along_axis(h, np.broadcast_to(idx[:, None, :], (B, K, m)), axis=2)
        ok = np.ones((B, K, T - m), dtype=bool)
        for j in range(m):  # window hist[p - m : p] == suffix, for p = m .. T - 1
            ok &= h[:, :, j : T - m + j] == suffix[:, :, j : j + 1]
        match[:, :, m:] = ok
    match &= h >= 0  # p < length (then p - m >= 0 and the suffix is real history too)
    return np.where(match, h, -1)


def guard_pairs(
    hist: np.ndarray,
    lengths: np.ndarray,
    live: np.ndarray,
    penalty: np.ndarray,
    ngram: np.ndarray,
    vocab_size: int,
) -> Guards | None:
    """The pairs this step's guards may lower, per row's own options: penalty (B,) repetition_penalty
    (1 = off), ngram (B,) no_repeat_ngram_size (0 = off); live (B, K) the beams with a finite score (dead
    beams are never lowered: their candidates are -inf already). hist (B, K, >= max(lengths)). None when
    no pair is touched (then the step is the unguarded one, unchanged)."""
    penalty, ngram = np.asarray(penalty, dtype=np.float64), np.asarray(ngram, dtype=np.int64)
    on_pen, on_ngram = penalty != 1.0, ngram > 0
    if not (on_pen.any() or on_ngram.any()):
        return None
    B, K = live.shape
    hist, width = hist[:B, :K], K * vocab_size
    lengths = np.asarray(lengths, dtype=np.int64)
    base = np.arange(B)[:, None, None] * width + np.arange(K)[None, :, None] * vocab_size

    def keys(rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:  # tokens (rows, K, T), -1 = none
        sel = (tokens >= 0) & live[rows][:, :, None]
        return (base[rows] + tokens)[sel]

    empty = np.zeros(0, dtype=np.int64)
    rows = np.flatnonzero(on_pen)
    penalised = np.unique(keys(rows, history_tokens(hist[rows], lengths[rows]))) if rows.size else empty
    found = [empty]
    for n in np.unique(ngram[on_ngram]).tolist():
        rows = np.flatnonzero(ngram == n)
        found.append(keys(rows, banned_tokens(hist[rows], lengths[rows], n)))
    banned = np.unique(np.concatenate(found))
    touched = np.union1d(banned, penalised)
    if touched.size == 0:
        return None
    extra = np.bincount(touched // width, minlength=B)
    return Guards(banned, penalised, extra, width, vocab_size)


def guarded_candidates(base: int, guards: Guards | None) -> int:
    """Candidates to ask the graph for: the unguarded count `base`, plus the most pairs any row's guards
    may lower (capped at all K x V pairs); `base` itself when no guard touches anything."""
    if guards is None:
        return base
    return min(base + int(guards.extra.max()), guards.width)


def _member(keys: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    if sorted_keys.size == 0:
        return np.zeros(keys.shape, dtype=bool)
    idx = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.size - 1)
    return sorted_keys[idx] == keys


def apply_guards(
    top_s: np.ndarray,
    top_i: np.ndarray,
    beam_scores: np.ndarray,
    guards: Guards,
    penalty: np.ndarray,
    keep: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The graph's candidates top_s/top_i (B, C) (asked for with `guarded_candidates`) after the guards,
    re-ranked and cut back to the unguarded count `keep`: banned pairs -> -inf; penalised pairs (finite
    only: no -inf is resurrected) -> beam score + log-prob * penalty[row], the log-prob recovered as
    top_s - beam_scores[row, beam] and the result never above top_s (so a score only falls, whatever the
    rounding); each touched row stably re-sorted by score (ties keep the graph's rank). Untouched rows
    are their first `keep` candidates, as without guards. See the comment above Guards for exactness."""
    B = top_s.shape[0]
    keys = np.arange(B)[:, None] * guards.width + top_i
    s = np.array(top_s, dtype=np.float32)
    finite = s > -np.inf
    banned = _member(keys, guards.banned) & finite
    pen = _member(keys, guards.penalised) & finite & ~banned
    if pen.any():
        r, c = np.nonzero(pen)
        old = s[r, c]
        b = beam_scores[r, top_i[r, c] // guards.vocab_size].astype(np.float64)
        lowered = b + (old.astype(np.float64) - b) * np.asarray(penalty, dtype=np.float64)[r]
        s[r, c] = np.minimum(lowered.astype(np.float32), old)
    s[banned] = -np.inf
    out_s, out_i = s[:, :keep].copy(), np.array(top_i[:, :keep])
    rows = np.flatnonzero((banned | pen).any(axis=1))
    if rows.size:
        order = np.argsort(-s[rows], axis=1, kind="stable")[:, :keep]
        out_s[rows] = np.take_along_axis(s[rows], order, axis=1)
        out_i[rows] = np.take_along_axis(top_i[rows], order, axis=1)
    return out_s, out_i
