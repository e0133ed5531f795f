"""The decoding guards (repetition_penalty, no_repeat_ngram_size): the option rules, the pure host-side
functions of server/engine/search.py against brute force over the full vocabulary, and the engine on tiny
exported models: the guards hold, they are exact (as if the graph returned every candidate), off means
unchanged, and in-flight batching with mixed options gives every sentence its solo result bit for bit."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from runtime.decoding import DecodingOptions, InvalidOptionsError, check_options, resolve_options
from server.engine import generator as generator_module
from server.engine.decode_batch import DecodeBatch, DecodeItem
from server.engine.search import apply_guards, banned_tokens, guard_pairs, guarded_candidates
from tests.test_engine import assert_same_nbest, brute_force, engine, repeats, tiny, vocab5  # noqa: F401 - fixtures
from tests.test_export import TEXTS

pytestmark = pytest.mark.usefixtures("torch_single_thread")


# ------------------------------------------------------------------------------------ option rules


def test_options_default_off_and_validated():
    assert DecodingOptions().repetition_penalty == 1.0 and DecodingOptions().no_repeat_ngram_size == 0
    d = DecodingOptions(repetition_penalty=1.2, no_repeat_ngram_size=3)
    kw = dict(max_beam_size=8, max_length_cap=256)
    assert resolve_options(d, **kw) == d  # None = the model's defaults
    got = resolve_options(d, **kw, repetition_penalty=np.float32(1.1), no_repeat_ngram_size=0)
    assert got.repetition_penalty == 1.1 and got.no_repeat_ngram_size == 0  # rounded like alpha
    for bad in (0.9, 0.0, float("nan"), float("inf")):
        with pytest.raises(InvalidOptionsError, match="options.repetition_penalty"):
            resolve_options(d, **kw, repetition_penalty=bad)
    for bad in (-1, 17, 2.5):
        with pytest.raises(InvalidOptionsError, match="options.no_repeat_ngram_size"):
            resolve_options(d, **kw, no_repeat_ngram_size=bad)
    check_options(d, **kw)
    with pytest.raises(InvalidOptionsError, match="options.no_repeat_ngram_size"):
        check_options(DecodingOptions(no_repeat_ngram_size=99), **kw)


# ---------------------------------------------------------------------------------- pure functions


def brute_banned(seq: list[int], n: int) -> set[int]:
    """Tokens whose emission after `seq` would make some n-gram occur twice."""
    if n <= 0:
        return set()
    grams = {tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)}
    prefix = tuple(seq[len(seq) - n + 1 :]) if n > 1 else ()
    return {g[-1] for g in grams if len(seq) >= n - 1 and g[:-1] == prefix}


def test_banned_tokens_examples():
    hist = np.array([[[5, 6, 7, 5, 6, 0]], [[4, 4, 4, 9, 9, 9]]])
    lengths = np.array([5, 3])

    def got(n):
        b = banned_tokens(hist, lengths, n)
        return [sorted(set(b[r, 0][b[r, 0] >= 0].tolist())) for r in range(2)]

    assert got(0) == [[], []]
    assert got(1) == [[5, 6, 7], [4]]
    assert got(2) == [[7], [4]]  # "6 7" and "4 4" exist already
    assert got(3) == [[7], [4]]
    assert got(4) == [[], []]  # "7 5 6" never occurred before; "4 4 4" has no earlier 3-gram
    assert banned_tokens(hist, np.array([0, 0]), 2).shape == (2, 1, 0)


@pytest.mark.parametrize("seed", range(40))
def test_guards_match_brute_force_over_the_full_vocabulary(seed: int):
    """Random steps: the graph's top C (C from guarded_candidates) re-ranked by apply_guards equals the
    top `keep` of every K x V candidate guarded and stably re-sorted (ties keep the graph's rank)."""
    rng = np.random.default_rng(seed)
    B, K, V = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(3, 9))
    T = int(rng.integers(0, 9))
    hist = rng.integers(0, min(V, 4), size=(B, K, T + 2))  # few distinct tokens: many repeats
    lengths = rng.integers(0, T + 1, size=B)
    lengths[0] = T
    beam_scores = (-rng.random((B, K)) * 5).astype(np.float32)
    beam_scores[rng.random((B, K)) < 0.25] = -np.inf  # dead beams
    logp = torch.log_softmax(torch.from_numpy(rng.normal(size=(B, K, V)) * 3), -1).numpy()
    full = (beam_scores[:, :, None] + logp.astype(np.float32)).reshape(B, K * V)
    full[:, : V // 2] = np.round(full[:, : V // 2])  # ties
    penalty = rng.choice([1.0, 1.0, 1.3, 2.0], size=B)
    ngram = rng.choice([0, 0, 1, 2, 3], size=B)
    keep = 1 if K == 1 and rng.random() < 0.5 else min(2 * K, K * V)
    rank = np.argsort(-full, axis=1, kind="stable")  # the graph's TopK: ties to the lower flat index

    guards = guard_pairs(hist, lengths, np.isfinite(beam_scores), penalty, ngram, V)
    n_cand = guarded_candidates(keep, guards)
    top_i = rank[:, :n_cand]
    top_s = np.take_along_axis(full, top_i, axis=1)
    if guards is None:
        assert n_cand == keep
        return
    got_s, got_i = apply_guards(top_s, top_i, beam_scores, guards, penalty, keep)

    for r in range(B):
        scores, lowered = full[r].copy(), 0
        for k in range(K):
            seq = hist[r, k, : lengths[r]].tolist()
            ban = brute_banned(seq, int(ngram[r]))
            for v in range(V):
                s = scores[k * V + v]
                if s == -np.inf:
                    continue
                if v in ban:
                    scores[k * V + v] = -np.inf
                elif penalty[r] != 1.0 and v in seq:
                    b = float(beam_scores[r, k])
                    scores[k * V + v] = min(np.float32(b + (float(s) - b) * penalty[r]), s)
                lowered += scores[k * V + v] < s
        assert lowered <= guards.extra[r]  # the candidate budget covers every lowered pair
        order = rank[r][np.argsort(-scores[rank[r]], kind="stable")][:keep]
        want_s = scores[order]
        np.testing.assert_array_equal(got_s[r], want_s)
        finite = want_s > -np.inf
        np.testing.assert_array_equal(got_i[r][finite], order[finite])


def test_penalty_math_and_dead_candidates():
    """log-prob * penalty for history tokens (recovered as top_s - beam score), -inf for banned ones,
    -inf candidates stay -inf, untouched rows are their first `keep` candidates."""
    V = 10
    hist = np.array([[[3, 4, 0]], [[3, 4, 0]]])
    beam_scores = np.array([[-1.0], [-np.inf]], dtype=np.float32)
    guards = guard_pairs(hist, np.array([2, 2]), np.isfinite(beam_scores), [1.5, 1.5], [0, 0], V)
    assert guards is not None and guards.extra.tolist() == [2, 0]  # the dead row is not counted
    top_i = np.array([[3, 5, 4, 6], [3, 4, 5, 6]])
    top_s = np.array([[-3.0, -3.5, -4.0, -9.0], [-np.inf] * 4], dtype=np.float32)
    s, i = apply_guards(top_s, top_i, beam_scores, guards, np.array([1.5, 1.5]), 3)
    assert s.tolist() == [[-3.5, -4.0, -5.5], [-np.inf] * 3]  # -1 + (-2 * 1.5), -1 + (-3 * 1.5)
    assert i[0].tolist() == [5, 3, 4]
    guards = guard_pairs(hist, np.array([2, 2]), np.ones((2, 1), bool), [1.0, 1.0], [1, 0], V)
    s, i = apply_guards(top_s, top_i, np.zeros((2, 1), np.float32), guards, np.ones(2), 2)
    assert s[0].tolist() == [-3.5, -9.0] and i[0].tolist() == [5, 6]
    assert guard_pairs(hist, np.array([2, 2]), np.ones((2, 1), bool), [1.0, 1.0], [0, 0], V) is None
    assert guard_pairs(hist, np.array([0, 0]), np.ones((2, 1), bool), [2.0, 1.0], [2, 0], V) is None


# --------------------------------------------------------------------------------- engine: vocab5


@pytest.mark.parametrize("penalty,ngram", [(1.0, 1), (1.0, 2), (2.0, 0), (1.5, 2)])
def test_exhaustive_guarded_beam_is_the_guarded_brute_force(vocab5, penalty: float, ngram: int):  # noqa: F811
    """A beam wide enough to keep everything returns every allowed hypothesis with its guarded score."""
    model, gen = vocab5
    max_len, beam = 3, 85
    for src in ([3, 4, 3], [4]):
        want = brute_force(model, src, max_len, 0.6, penalty, ngram)
        got = gen.generate(
            [src], beam_size=beam, num_hypotheses=len(want), max_lengths=max_len, length_penalty=0.6,
            repetition_penalty=penalty, no_repeat_ngram_size=ngram,
        )[0]  # fmt: skip
        assert (-np.diff([s for _, s in want])).min() > 1e-4  # the order is well defined
        assert_same_nbest(got, want)


# ---------------------------------------------------------------------------- engine: tiny bundle


@pytest.fixture(scope="module")
def ids(tiny) -> list[list[int]]:  # noqa: F811
    return tiny.tokenizer.encode_batch(TEXTS)


def spy_candidates(gen, monkeypatch) -> list[int]:
    seen: list[int] = []
    step = gen.cache.step

    def spy(feed, *args):
        seen.append(int(feed["num_candidates"][0]))
        return step(feed, *args)

    monkeypatch.setattr(gen.cache, "step", spy)
    return seen


@pytest.mark.parametrize("k", [1, 4])
def test_guards_off_is_the_unguarded_step(engine, ids, k: int, monkeypatch):  # noqa: F811
    gen = engine.generator
    seen = spy_candidates(gen, monkeypatch)
    plain = gen.generate(ids, beam_size=k, num_hypotheses=k, max_lengths=30)
    assert set(seen) == {1 if k == 1 else 2 * k}
    off = gen.generate(ids, beam_size=k, num_hypotheses=k, max_lengths=30, repetition_penalty=1.0)
    assert off == plain
    seen.clear()
    on = gen.generate(ids, beam_size=k, num_hypotheses=k, max_lengths=30, no_repeat_ngram_size=1)
    assert max(seen) > (1 if k == 1 else 2 * k) and on != plain


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("k", [1, 4])
def test_no_hypothesis_repeats_an_ngram(engine, ids, n: int, k: int):  # noqa: F811
    gen = engine.generator
    kw = dict(beam_size=k, num_hypotheses=k, max_lengths=40, length_penalty=2.0)
    if n == 1:
        plain = gen.generate(ids, **kw)
        assert any(repeats(t, n) for nb in plain for t, _ in nb)  # the tiny model does repeat itself
    out = gen.generate(ids, **kw, no_repeat_ngram_size=n)
    assert all(not repeats(t, n) for nb in out for t, _ in nb)
    assert sum(len(t) for nb in out for t, _ in nb) > 0


@pytest.mark.parametrize("k,penalty,ngram", [(1, 1.3, 2), (3, 1.0, 2), (4, 1.5, 0), (4, 1.2, 3)])
def test_guarded_search_is_exact_and_batch_invariant(engine, ids, k, penalty, ngram, monkeypatch):  # noqa: F811
    """The extra candidates suffice: the result equals the one with every K x V candidate returned
    (bit for bit), each sentence alone equals it inside the batch, and the greedy fast path equals
    the beam machinery with K = 1."""
    gen = engine.generator
    kw = dict(beam_size=k, num_hypotheses=k, max_lengths=30, length_penalty=1.0)
    kw |= dict(repetition_penalty=penalty, no_repeat_ngram_size=ngram)
    got = gen.generate(ids, **kw)
    assert [gen.generate([s], **kw)[0] for s in ids] == got
    with monkeypatch.context() as m:
        m.setattr(generator_module, "guarded_candidates", lambda base, g: base if g is None else g.width)
        assert gen.generate(ids, **kw) == got
    if k == 1:
        monkeypatch.setattr(gen, "greedy_fast_path", False)
        assert gen.generate(ids, **kw) == got


GUARDED_OPTIONS = [  # (beam, n-best, alpha, repetition_penalty, no_repeat_ngram_size)
    (1, 1, 0.6, 1.0, 0),
    (1, 1, 0.6, 1.4, 2),
    (1, 1, 0.6, 3.0, 0),
    (1, 1, 0.6, 1.0, 1),
    (4, 2, 2.0, 1.0, 0),
    (4, 2, 2.0, 1.2, 0),
    (4, 1, 2.0, 3.0, 0),
    (3, 3, 2.0, 1.0, 3),
    (2, 1, 1.0, 1.5, 1),
    (5, 2, 0.0, 1.1, 2),  # alpha 0: the settled() stop fires
]
LONG = [1, 3, 6, 7]  # the TEXTS the tiny model translates with more than a token or two


@pytest.mark.parametrize("seed", range(3))
def test_inflight_with_mixed_guards_matches_solo(engine, ids, seed: int):  # noqa: F811
    """Sentences with and without guards share the in-flight batches (greedy apart; beam sizes mixed in
    one DecodeBatch, which supports it although RunningBatch runs each beam size apart), joining at
    random steps: each result is generate() of it alone."""
    gen = engine.generator
    rng = random.Random(seed)
    items = []
    for key in range(16):
        k, n_best, alpha, penalty, ngram = GUARDED_OPTIONS[(key + seed) % len(GUARDED_OPTIONS)]
        src = ids[rng.choice(LONG)] if rng.random() < 0.8 else rng.choice(ids)
        items.append(DecodeItem(key, src, k, n_best, alpha, rng.choice([8, 30, 40]), penalty, ngram))
    greedy, beam = DecodeBatch(gen), DecodeBatch(gen)
    results, pending = {}, list(items)
    while pending or len(greedy) or len(beam):
        if pending and (rng.random() < 0.5 or not (len(greedy) or len(beam))):
            it = pending.pop(0)
            results |= dict((greedy if it.beam_size == 1 else beam).admit([it]))
        for batch in (greedy, beam):
            results |= dict(batch.step())
    assert len(results) == len(items)
    for it in items:
        alone = gen.generate(
            [it.ids], beam_size=it.beam_size, num_hypotheses=it.num_hypotheses,
            length_penalty=it.length_penalty, max_lengths=[it.max_length],
            repetition_penalty=it.repetition_penalty, no_repeat_ngram_size=it.no_repeat_ngram_size,
        )[0]  # fmt: skip
        assert results[it.key] == alone, it
        if it.no_repeat_ngram_size:
            assert all(not repeats(t, it.no_repeat_ngram_size) for t, _ in alone)


def test_bad_guards_are_refused(engine, ids):  # noqa: F811
    gen = engine.generator
    with pytest.raises(ValueError, match="repetition_penalty"):
        gen.generate(ids[:1], repetition_penalty=0.5)
    with pytest.raises(ValueError, match="no_repeat_ngram_size"):
        gen.generate(ids[:1], no_repeat_ngram_size=-1)
    with pytest.raises(ValueError, match="repetition_penalty"):
        DecodeBatch(gen).admit([DecodeItem(0, ids[0], repetition_penalty=math.nan)])


# ------------------------------------------------------------------------------- bench.tune_decoding


def test_tune_decoding_chooses_the_guards_with_the_plainest_rule(tmp_path, monkeypatch, capsys):
    """The guard stage of bench.tune_decoding on canned bench.evaluate reports (no model runs)."""
    from bench import evaluate, tune_decoding

    assert (
        tune_decoding.choose_plainest({0: 30.0, 3: 30.3, 4: 30.15}, 0.2, tune_decoding.ngram_plainness) == 4
    )
    assert tune_decoding.choose_plainest({0: 30.0, 3: 30.1, 4: 29.0}, 0.2, tune_decoding.ngram_plainness) == 0
    assert tune_decoding.choose_plainest({1.0: 30.0, 1.1: 30.5, 1.2: 30.6}, 0.2) == 1.1
    calls = []

    def fake_main(argv):
        a = dict(zip(argv[::2], argv[1::2], strict=False))
        n, p = int(a.get("--no-repeat-ngram-size", 0)), float(a.get("--repetition-penalty", 1.0))
        alpha = float(a["--length-penalty"])
        calls.append((alpha, n, p))
        bleu = 30.0 - abs(alpha - 1.0) + {0: 0.0, 3: 0.5, 4: 0.4}[n] + {1.0: 0.0, 1.1: 0.1, 1.2: 0.35}[p]
        common = {"accepted_percent": 50.0 + n, "repeated_word": 4 - n // 2}
        model = {"bleu": bleu, "chrf": 50.0, "novel": {"bleu": bleu}, "bleu_detail": "BLEU (BP = 1.000 r",
                 "repeated_word": {"count": 1, "percent": 0.5}, "common_strings": common}  # fmt: skip
        Path(a["--json"]).write_text(json.dumps({"systems": {"model": model}}))

    monkeypatch.setattr(evaluate, "main", fake_main)
    model = tmp_path / "m"
    model.mkdir()
    tune_decoding.main(["--model", str(model), "--bundle", str(tmp_path / "b"), "--n", "3"])
    decoding = json.loads((model / "decoding.json").read_text())
    assert decoding["defaults"] == {
        "beam_size": 4, "num_hypotheses": 1, "length_penalty": 1.0,
        "no_repeat_ngram_size": 4, "repetition_penalty": 1.2,
    }  # fmt: skip
    tuning = decoding["tuning"]
    assert set(tuning["by_no_repeat_ngram_size"]) == {"0", "3", "4"}
    assert set(tuning["by_repetition_penalty"]) == {"1.0", "1.1", "1.2"}
    assert tuning["by_no_repeat_ngram_size"]["3"]["common_repeated_word"] == 3
    assert tuning["by_no_repeat_ngram_size"]["4"]["common_accepted_percent"] == 54.0
    assert len(calls) == len(set(calls)) == 4 + 2 + 2  # alphas, then n = 3, 4, then p = 1.1, 1.2
    assert "repetition_penalty 1.2" in capsys.readouterr().out
    # torch backend (no --bundle): the guards are not tuned, nor written
    tune_decoding.main(["--model", str(model), "--n", "3", "--alphas", "0.6"])
    assert set(json.loads((model / "decoding.json").read_text())["defaults"]) == {
        "beam_size", "num_hypotheses", "length_penalty"
    }  # fmt: skip
