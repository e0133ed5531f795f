"""The search rules of one decoding step, vectorised over sentences: pure functions, no sessions.

`select_candidates` is the reference beam rule of model/decode.py (EOS ranked below K finishes, the other
candidates fill the live beams in rank order); `select_greedy` is that rule with K = 1. `greedy_endings`
and `beam_endings` list the hypotheses a step finishes, in the reference's order; `settled` is the early
stop that retires a sentence once no live beam can change its n-best. The request path (generator.py)
and the in-flight batch (decode_batch.py) both decide every step with these, so they agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from runtime.decoding import gnmt_length_penalty

__all__ = [
    "LOGPROB_SLACK",
    "Ending",
    "NBest",
    "beam_endings",
    "greedy_endings",
    "select_candidates",
    "select_greedy",
    "settled",
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
