"""Reference decoders (greedy and beam search) on top of `Transformer.decode_step`.

Written for clarity, not speed: they are the oracle that the ONNX inference engine must match token for
token, so every rule (tie-breaking, stopping, length normalisation) is spelled out and deterministic.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from model.model import KV, Transformer
from runtime.decoding import gnmt_length_penalty, max_output_length  # noqa: F401 - re-exported


def _per_sentence_limits(max_len: int | Tensor, batch_size: int) -> list[int]:
    if isinstance(max_len, Tensor):
        limits = [int(n) for n in max_len.reshape(-1).tolist()]
        if len(limits) == 1:
            limits = limits * batch_size
    else:
        limits = [int(max_len)] * batch_size
    if len(limits) != batch_size:
        raise ValueError(f"max_len has {len(limits)} entries for a batch of {batch_size}")
    return limits


def _empty_self_kv(model: Transformer, rows: int, like: Tensor) -> list[KV]:
    cfg = model.config
    shape = (rows, cfg.n_heads, 0, cfg.d_model // cfg.n_heads)  # (B, H, 0, Dh)
    return [(like.new_zeros(shape), like.new_zeros(shape)) for _ in range(cfg.n_decoder_layers)]


@torch.no_grad()
def greedy_decode(model: Transformer, src: Tensor, max_len: int | Tensor) -> list[list[int]]:
    """Greedy decoding of src (B, S) with the KV cache.

    max_len is an int or a LongTensor (B,) of per-sentence limits on generated tokens (EOS excluded).
    Each sentence stops at EOS or after max_len tokens. Ties pick the lowest token id (torch.argmax).
    Returns token ids without BOS/EOS. The model is run in eval mode (its mode is restored afterwards).
    """
    cfg = model.config
    B = src.size(0)
    limits = _per_sentence_limits(max_len, B)
    was_training = model.training
    model.eval()
    try:
        memory, src_pad_mask = model.encode(src)  # (B, S, D), (B, S)
        cross_kv = model.cross_kv(memory)
        self_kv = _empty_self_kv(model, B, memory)
        tokens = torch.full((B, 1), cfg.bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        out: list[list[int]] = [[] for _ in range(B)]
        done = [n <= 0 for n in limits]
        for t in range(max(limits, default=0)):
            if all(done):
                break
            position = torch.full((B,), t, dtype=torch.long, device=src.device)  # (B,)
            log_probs, self_kv = model.decode_step(
                tokens, position, self_kv, cross_kv, src_pad_mask
            )  # (B, V)
            next_tokens = log_probs.argmax(dim=-1)  # (B,), first maximum on ties
            for b, tok in enumerate(next_tokens.tolist()):
                if done[b]:
                    continue
                if tok == cfg.eos_id:
                    done[b] = True
                    continue
                out[b].append(tok)
                done[b] = len(out[b]) >= limits[b]
            tokens = next_tokens.unsqueeze(1)  # (B, 1); finished rows keep running, their output is ignored
        return out
    finally:
        model.train(was_training)


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: Tensor,
    beam_size: int,
    max_len: int | Tensor,
    length_penalty: float = 0.6,
    n_best: int = 1,
) -> list[list[tuple[list[int], float]]]:
    """Beam search of src (B, S). Returns, per sentence, up to n_best (tokens, score), best first.

    Tokens exclude BOS/EOS. score = (sum of token log-probs, EOS included) / lp(len), with
    lp(len) = ((5 + len) / 6) ** length_penalty and len = number of generated tokens including EOS.

    Rules, per sentence, with K = beam_size and V = vocabulary size:
      * Step 0: only beam 0 is live (score 0); beams 1..K-1 start at -inf so they never duplicate it.
      * Each step, every live beam is expanded over the whole vocabulary; the K*V candidates
        (cumulative log-prob) are ranked by a stable descending sort, so ties go to the lower flat index
        beam * V + token (lower beam, then lower token id). Only the top 2*K are considered, and -inf
        candidates are discarded.
      * Walking that ranking in order: a candidate ending in EOS is finished only if its rank is < K
        (the classic rule, otherwise it is dropped); any other candidate becomes a live beam while fewer
        than K have been taken. Unfilled beams are dead (-inf).
      * max_len (an int or a LongTensor (B,) of per-sentence limits) caps generated tokens, EOS included:
        after the step that produces token number max_len, the live beams are finished as they are
        (no EOS, len = max_len).
      * Early stopping: a sentence is done as soon as it has >= K finished hypotheses (checked after
        each step), or when it has no live beam left, or at max_len. (The serving engine also stops a
        sentence once no live beam can beat its n-best any more, server.engine.settled: fewer steps,
        the same result.)
      * Result: finished hypotheses sorted by score, descending, stable (ties keep the order in which
        they were finished: by step, then by rank); the first n_best are returned (n_best <= K).
    With K = 1 this reduces exactly to greedy_decode. max_len 0 yields a single empty hypothesis, score 0.
    """
    if beam_size < 1 or not 1 <= n_best <= beam_size:
        raise ValueError(f"need beam_size >= 1 and 1 <= n_best <= beam_size, got {beam_size}, {n_best}")
    cfg = model.config
    B, K, V = src.size(0), beam_size, cfg.vocab_size
    limits = _per_sentence_limits(max_len, B)
    device = src.device
    was_training = model.training
    model.eval()
    try:
        memory, src_pad_mask = model.encode(src)  # (B, S, D), (B, S)
        # Row b * K + k holds beam k of sentence b.
        memory = memory.repeat_interleave(K, dim=0)  # (B*K, S, D)
        src_pad_mask = src_pad_mask.repeat_interleave(K, dim=0)  # (B*K, S)
        cross_kv = model.cross_kv(memory)
        self_kv = _empty_self_kv(model, B * K, memory)
        tokens = torch.full((B * K, 1), cfg.bos_id, dtype=torch.long, device=device)  # (B*K, 1)
        scores = torch.full((B, K), -math.inf, device=device)  # (B, K) cumulative log-probs
        scores[:, 0] = 0.0
        prefixes: list[list[list[int]]] = [[[] for _ in range(K)] for _ in range(B)]
        finished: list[list[tuple[list[int], float]]] = [[] for _ in range(B)]
        done = [n <= 0 for n in limits]
        for b in range(B):
            if done[b]:
                finished[b].append(([], 0.0))

        for t in range(max(limits, default=0)):
            if all(done):
                break
            position = torch.full((B * K,), t, dtype=torch.long, device=device)  # (B*K,)
            log_probs, self_kv = model.decode_step(
                tokens, position, self_kv, cross_kv, src_pad_mask
            )  # (B*K, V)
            cand = scores.unsqueeze(-1) + log_probs.view(B, K, V)  # (B, K, V)
            top_scores, top_idx = torch.sort(cand.view(B, K * V), dim=1, descending=True, stable=True)
            top_scores, top_idx = top_scores[:, : 2 * K].tolist(), top_idx[:, : 2 * K].tolist()

            # Next state; dead beams point at row 0 of their sentence with score -inf.
            next_rows = [b * K for b in range(B) for _ in range(K)]
            next_tokens = [cfg.pad_id] * (B * K)
            next_scores = torch.full((B, K), -math.inf, device=device)
            length = t + 1
            lp = gnmt_length_penalty(length, length_penalty)
            for b in range(B):
                if done[b]:
                    continue
                live: list[tuple[int, int, float]] = []  # (beam, token, cumulative score)
                for rank, (s, idx) in enumerate(zip(top_scores[b], top_idx[b], strict=True)):
                    if s == -math.inf:
                        break  # sorted: the rest are -inf too
                    beam, tok = divmod(idx, V)
                    if tok == cfg.eos_id:
                        if rank < K:
                            finished[b].append((list(prefixes[b][beam]), s / lp))
                    elif len(live) < K:
                        live.append((beam, tok, s))
                if length >= limits[b]:
                    finished[b].extend((prefixes[b][beam] + [tok], s / lp) for beam, tok, s in live)
                    done[b] = True
                elif len(finished[b]) >= K or not live:
                    done[b] = True
                else:
                    prefixes[b] = [prefixes[b][beam] + [tok] for beam, tok, _ in live]
                    for k, (beam, tok, s) in enumerate(live):
                        next_rows[b * K + k] = b * K + beam
                        next_tokens[b * K + k] = tok
                        next_scores[b, k] = s
            rows = torch.tensor(next_rows, dtype=torch.long, device=device)  # (B*K,)
            self_kv = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self_kv]
            tokens = torch.tensor(next_tokens, dtype=torch.long, device=device).unsqueeze(1)  # (B*K, 1)
            scores = next_scores

        return [sorted(f, key=lambda h: -h[1])[:n_best] for f in finished]
    finally:
        model.train(was_training)
