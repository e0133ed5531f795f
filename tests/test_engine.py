"""server/engine (request path) against the PyTorch reference decoders (model/decode.py) on tiny exported
models: token and score parity, batch invariance, the settled() stop, brute force on a 5-token vocabulary,
the int8/fp16 variants, the IOBinding cache path and cancellation. The text layer and bundle errors are
in test_engine_text.py, in-flight batching in test_engine_inflight.py."""

from __future__ import annotations

import dataclasses
import itertools
import random
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

from export import onnx_export as ox
from model.decode import beam_search, gnmt_length_penalty, greedy_decode, max_output_length
from server.engine import (
    LOGPROB_SLACK,
    BatchItem,
    BundleError,
    DecodingOptions,
    Engine,
    Generator,
    Hypothesis,
    settled,
)
from server.engine import generator as generator_module
from server.engine.cache import BoundCache, NumpyCache
from server.engine.search import _select_by_rule, select_candidates
from tests.test_export import (
    MAX_LENGTH_CAP,
    TEXTS,
    TinyBundle,
    batch,
    build_tiny_bundle,
)
from tests.test_export import tiny_model as make_tiny_model

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyBundle:
    return build_tiny_bundle(tmp_path_factory)


@pytest.fixture(scope="module")
def engine(tiny: TinyBundle) -> Engine:
    return Engine(tiny.bundle, intra_op_threads=1)


def reference(
    tiny: TinyBundle, texts: list[str], k: int, n_best: int = 1
) -> list[list[tuple[list[int], float]]]:
    ids = tiny.tokenizer.encode_batch([t.strip() for t in texts])
    limits = torch.tensor([max_output_length(len(s), cap=MAX_LENGTH_CAP) for s in ids])
    return beam_search(tiny.model, batch(ids), k, limits, 0.6, n_best=n_best)


def tokens_and_scores(result: list[Hypothesis] | None) -> list[tuple[list[int], float]]:
    assert result is not None
    return [(h.tokens, h.score) for h in result]


def assert_same_nbest(got: list[tuple[list[int], float]], ref: list[tuple[list[int], float]]) -> None:
    assert [t for t, _ in got] == [t for t, _ in ref]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in ref], atol=1e-4)


def same(got, want) -> None:
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert [h.text for h in got] == [h.text for h in want]
    # Bit-identical scores (not merely close): same numbers as alone.
    assert [h.score for h in got] == [h.score for h in want]


# --------------------------------------------------------------------------------- parity (tokens)


@pytest.mark.parametrize("k,n_best", [(1, 1), (3, 3), (5, 2)])
def test_token_identical_to_reference_beam_search(engine: Engine, tiny: TinyBundle, k: int, n_best: int):
    out = engine.translate(TEXTS, DecodingOptions(beam_size=k, num_hypotheses=n_best))
    ref = reference(tiny, TEXTS, k, n_best)
    for got, want in zip(out, ref, strict=True):
        assert_same_nbest(tokens_and_scores(got), want)
    if k > 1:
        assert any(len(nb) > 1 and len({len(t) for t, _ in nb}) > 1 for nb in ref)  # varied n-best lengths


def test_greedy_equals_reference_greedy_and_beam1(engine: Engine, tiny: TinyBundle):
    ids = tiny.tokenizer.encode_batch(TEXTS)
    limits = torch.tensor([max_output_length(len(s), cap=MAX_LENGTH_CAP) for s in ids])
    greedy_ref = greedy_decode(tiny.model, batch(ids), limits)
    assert any(len(h) < int(n) for h, n in zip(greedy_ref, limits, strict=True))  # some stop at EOS
    assert any(len(h) == int(n) for h, n in zip(greedy_ref, limits, strict=True))  # some at max length
    fast = engine.translate(TEXTS, DecodingOptions(beam_size=1))
    assert [r[0].tokens for r in fast] == greedy_ref
    gen = engine.generator
    gen.greedy_fast_path = False  # beam search machinery with K = 1
    try:
        slow = engine.translate(TEXTS, DecodingOptions(beam_size=1))
    finally:
        gen.greedy_fast_path = True
    assert [tokens_and_scores(r) for r in slow] == [tokens_and_scores(r) for r in fast]
    beam1 = reference(tiny, TEXTS, 1)
    for got, want in zip(fast, beam1, strict=True):
        assert_same_nbest(tokens_and_scores(got), want)


@pytest.mark.parametrize("k", [1, 4])
def test_each_sentence_alone_equals_inside_any_batch(engine: Engine, k: int):
    opts = DecodingOptions(beam_size=k, num_hypotheses=k)
    together = engine.translate(TEXTS, opts)
    alone = [engine.translate([t], opts)[0] for t in TEXTS]
    assert [tokens_and_scores(r) for r in alone] == [tokens_and_scores(r) for r in together]
    order = list(range(len(TEXTS)))
    random.Random(k).shuffle(order)
    shuffled = engine.translate([TEXTS[i] for i in order], opts)
    for pos, i in enumerate(order):
        assert tokens_and_scores(shuffled[pos]) == tokens_and_scores(together[i])
    doubled = engine.translate(TEXTS[::-1] + TEXTS, opts)
    assert doubled[len(TEXTS) :] == together and doubled[: len(TEXTS)] == together[::-1]


def test_per_sentence_limits_and_early_exit(engine: Engine, tiny: TinyBundle):
    """Sentences leaving the batch early (small limits, early EOS) do not disturb the others."""
    gen = engine.generator
    ids = tiny.tokenizer.encode_batch(TEXTS)
    limits = [1, 3, 40, 2, 17, 40, 5, 0]
    together = gen.generate(ids, beam_size=3, num_hypotheses=3, max_lengths=limits)
    stats = gen.last_stats
    assert stats["row_steps"] < stats["steps"] * stats["max_rows"]  # finished rows left the batch
    assert together[-1] == [([], 0.0)]  # zero budget: one empty hypothesis, as in the reference
    for i, (src, n) in enumerate(zip(ids, limits, strict=True)):
        assert gen.generate([src], beam_size=3, num_hypotheses=3, max_lengths=[n]) == [together[i]]
        assert all(len(t) <= n for t, _ in together[i])
    ref = beam_search(tiny.model, batch(ids), 3, torch.tensor(limits), 0.6, n_best=3)
    for got, want in zip(together, ref, strict=True):
        assert_same_nbest(got, want)


def test_settled_rule_bound_and_ties():
    fin = [([5], -1.0), ([6, 7], -2.0)]
    # n_best 2: the 2nd best (-2.0) against the best a live beam at -4.0 can reach by length 9, alpha 1:
    # -4 / lp(9) = -4 / (14 / 6) = -1.714... > -2.0: it could still enter the n-best.
    assert settled([fin], [2], [-4.0], [3], [9], [1.0]) == [False]
    assert settled([fin], [1], [-4.0], [3], [9], [1.0]) == [True]  # -1.0 >= -1.714
    # alpha 0: lp = 1, the bound is the live score itself (plus the slack of 7 remaining steps); a tie
    # settles (a later equal score ranks after).
    slack = 7 * LOGPROB_SLACK
    assert settled([fin], [2], [-2.0 - slack], [3], [9], [0.0]) == [True]
    assert settled([fin], [2], [-2.0], [3], [9], [0.0]) == [False]
    assert settled([fin[:1]], [2], [-50.0], [3], [9], [1.0]) == [False]  # fewer than n_best finished


def test_select_candidates_counts_a_live_beam_in_the_last_column():
    """K = 3 whose three best candidates are EOS (they finish): the next three, the last column included,
    are the three live beams."""
    V, eos = 10, 2
    top_i = np.array([[0 * V + eos, 1 * V + eos, 2 * V + eos, 0 * V + 5, 1 * V + 5, 2 * V + 5]])
    top_s = np.array([[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]], dtype=np.float32)
    _, _, _, eos_fin, n_live, new_beam, new_tok, new_score = select_candidates(
        top_s, top_i, V, eos, 0, np.array([3]), 3
    )
    assert eos_fin.tolist() == [[True, True, True, False, False, False]]
    assert n_live.tolist() == [3]
    assert new_beam.tolist() == [[0, 1, 2]] and new_tok.tolist() == [[5, 5, 5]]
    assert new_score.tolist() == [[-4.0, -5.0, -6.0]]


def test_select_candidates_keeps_rank_order_past_16_candidates():
    """Beam 10 (20 candidates, where numpy's default sort is no longer stable): the live beams are the
    first ten continuing candidates in rank order, whatever EOS candidates sit between them."""
    K, V, eos = 10, 100, 2
    rank = np.arange(2 * K)
    tok = 3 + rank // K
    tok[[0, 5]] = eos  # ranked below K: they finish
    top_i = (rank % K * V + tok)[None, :]
    top_s = (-1.0 - rank).astype(np.float32)[None, :]
    *_, n_live, new_beam, new_tok, new_score = select_candidates(top_s, top_i, V, eos, 0, np.array([K]), K)
    live = [1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    assert n_live.tolist() == [K]
    assert new_score.tolist() == [[-1.0 - r for r in live]]
    assert new_beam.tolist() == [[r % K for r in live]] and new_tok.tolist() == [[3 + r // K for r in live]]


def test_select_candidates_shortcut_equals_the_general_rule():
    """The usual step (no EOS and no -inf among a sentence's K best candidates, every sentence at K
    beams) takes a shortcut: on random steps, with and without EOS / -inf / mixed beam sizes, its
    outputs equal the general rule's, array for array, dtypes included."""
    rng = np.random.default_rng(3)
    V, eos, pad = 7, 2, 0
    shortcut = 0
    for trial in range(400):
        B, K = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        C = 2 * K if trial % 5 else K  # the guards' cut may leave just K
        top_s = -np.sort(rng.random((B, C)), axis=1).astype(np.float32) * 4
        top_s[rng.random((B, C)) < 0.03] = -np.inf
        top_s = -np.sort(-top_s, axis=1)  # ranked: -inf last
        top_i = rng.integers(0, K * V, (B, C))
        if trial % 3 == 0:  # EOS appears
            top_i[rng.random((B, C)) < 0.2] = eos
        sizes = np.full(B, K) if trial % 7 else rng.integers(1, K + 1, B)
        beam = top_i // V
        got = select_candidates(top_s, top_i, V, eos, pad, sizes, K)
        want = _select_by_rule(top_s, beam, top_i - beam * V, eos, pad, sizes, K)
        shortcut += got[3].shape == top_s.shape and got[4].tolist() == [K] * B and not got[3].any()
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)
    assert 100 < shortcut < 400  # both paths ran


@pytest.mark.parametrize("k,n_best,alpha", [(4, 1, 0.0), (4, 2, 0.0), (3, 1, 0.6), (5, 2, 0.3)])
def test_settled_stop_saves_steps_and_changes_no_result(
    engine: Engine, tiny: TinyBundle, monkeypatch, k: int, n_best: int, alpha: float
):
    """Retiring a sentence once no live beam can beat its n-best returns what searching on (the
    reference's rule: until K hypotheses have finished) returns, bit for bit, in fewer row-steps."""
    gen = engine.generator
    ids = tiny.tokenizer.encode_batch(TEXTS)
    limits = [max_output_length(len(s), cap=MAX_LENGTH_CAP) for s in ids]
    kwargs = dict(beam_size=k, num_hypotheses=n_best, max_lengths=limits, length_penalty=alpha)
    early = gen.generate(ids, **kwargs)
    stats = dict(gen.last_stats)
    assert stats["settled"] > 0
    monkeypatch.setattr(generator_module, "settled", lambda fin, *rest: [False] * len(fin))
    full = gen.generate(ids, **kwargs)
    assert gen.last_stats["settled"] == 0 and gen.last_stats["row_steps"] > stats["row_steps"]
    assert early == full
    ref = beam_search(tiny.model, batch(ids), k, torch.tensor(limits), alpha, n_best=n_best)
    for got, want in zip(early, ref, strict=True):
        assert_same_nbest(got, want)


# ----------------------------------------------------------------------- tiny vocabulary, brute force


@pytest.fixture(scope="module")
def vocab5(tmp_path_factory: pytest.TempPathFactory):
    """A 5-token model (pad, bos, eos, 3, 4) exported without a tokenizer; the Generator runs it."""
    model = make_tiny_model(5, seed=3, d_model=16, layers=1)
    with torch.no_grad():
        model.embed.weight.mul_(3.0)  # sharper distributions: hypothesis scores well apart
    d = tmp_path_factory.mktemp("vocab5")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ox.export_encoder(model, d / "encoder.onnx")
        ox.export_decoder(model, d / "decoder.onnx")
    gen = Generator(d / "encoder.onnx", d / "decoder.onnx", intra_op_threads=1)
    return model, gen


def repeats(seq: list[int], n: int) -> bool:
    """Whether some n-gram occurs twice in seq."""
    grams = [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]
    return len(grams) != len(set(grams))


def brute_force(
    model, src: list[int], max_len: int, alpha: float, penalty: float = 1.0, ngram: int = 0
) -> list[tuple[list[int], float]]:
    """Every hypothesis beam search can produce (EOS-terminated up to max_len, or max_len tokens without
    EOS), scored by a full teacher-forced pass, best first. With the decoding guards: log-prob * penalty
    for tokens already in the prefix, hypotheses repeating an n-gram left out."""
    cfg = model.config
    others = [v for v in range(cfg.vocab_size) if v != cfg.eos_id]
    hyps = [(list(p), True) for n in range(max_len) for p in itertools.product(others, repeat=n)]
    hyps += [(list(p), False) for p in itertools.product(others, repeat=max_len)]
    scored = []
    with torch.no_grad():
        memory, pad_mask = model.encode(torch.tensor([src]))
        for prefix, eos in hyps:
            if ngram and repeats(prefix, ngram):
                continue
            target = prefix + [cfg.eos_id] if eos else prefix
            tgt_in = torch.tensor([[cfg.bos_id] + target[:-1]]) if target else None
            total = 0.0
            if target:
                lp = F.log_softmax(model.decode(tgt_in, memory, pad_mask)[0].float(), dim=-1)
                if penalty == 1.0:
                    total = float(lp[torch.arange(len(target)), torch.tensor(target)].sum())
                else:
                    steps = [float(lp[i, tok]) for i, tok in enumerate(target)]
                    total = sum(
                        x * penalty if tok in target[:i] else x
                        for i, (tok, x) in enumerate(zip(target, steps, strict=True))
                    )
            scored.append((prefix, total / gnmt_length_penalty(len(target), alpha)))
    return sorted(scored, key=lambda h: -h[1])


def test_exhaustive_beam_returns_brute_force_optimum_and_order(vocab5):
    model, gen = vocab5
    sources, max_len = [[3, 4, 3], [4], [3, 3]], 3
    n_hyps = 1 + 4 + 16 + 64  # EOS after 0, 1, 2 tokens, or 3 tokens without EOS
    got = gen.generate(
        sources, beam_size=n_hyps, num_hypotheses=n_hyps, max_lengths=max_len, length_penalty=0.6
    )
    ref = beam_search(model, batch(sources), n_hyps, max_len, 0.6, n_best=n_hyps)
    for src, nbest, want in zip(sources, got, ref, strict=True):
        exhaustive = brute_force(model, src, max_len, 0.6)
        gaps = np.diff([s for _, s in exhaustive])
        assert len(exhaustive) == n_hyps and (-gaps).min() > 1e-4  # the order is well defined
        assert_same_nbest(nbest, exhaustive)
        assert_same_nbest(nbest, want)


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_tiny_vocabulary_matches_reference(vocab5, k: int):
    """Beams wider than the candidate pool (8 beams, 5 tokens), dead beams, early EOS."""
    model, gen = vocab5
    sources = [[3, 4, 3, 3], [4], [3, 3], [4, 4, 4, 3, 3, 4]]
    limits = [6, 2, 4, 9]
    got = gen.generate(sources, beam_size=k, num_hypotheses=k, max_lengths=limits, length_penalty=1.0)
    want = beam_search(model, batch(sources), k, torch.tensor(limits), 1.0, n_best=k)
    for g, w in zip(got, want, strict=True):
        assert_same_nbest(g, w)
    if k == 1:
        assert [g[0][0] for g in got] == greedy_decode(model, batch(sources), torch.tensor(limits))


# ------------------------------------------------------------------------ variants and binding path


@pytest.mark.parametrize("variant", ["int8", "fp16"])
def test_other_variants_load_and_translate(tiny: TinyBundle, variant: str):
    eng = Engine(tiny.bundle, variant=variant, intra_op_threads=1)
    out = eng.translate(TEXTS[:4], DecodingOptions(beam_size=3, num_hypotheses=2))
    for nbest in out:
        assert nbest is not None and len(nbest) == 2
        assert all(np.isfinite(h.score) and h.text == eng.tokenizer.decode(h.tokens) for h in nbest)
    assert eng.generator.kv_dtype == (np.float16 if variant == "fp16" else np.float32)
    # In flight with K/V on the device (the variant's own kv_rows graph, float16 K/V for fp16).
    rb = Engine(tiny.bundle, variant=variant, intra_op_threads=1, io_binding=True).running_batch()
    assert rb.batch(3).on_device
    opts = DecodingOptions(beam_size=3, num_hypotheses=2)
    rb.admit([BatchItem(i, t, opts) for i, t in enumerate(TEXTS[:3])])
    results = {f.key: f.hypotheses for _ in range(2) for f in rb.step()}
    rb.admit([BatchItem(i, t, opts) for i, t in enumerate(TEXTS[3:6], start=3)])
    while len(rb):
        results |= {f.key: f.hypotheses for f in rb.step()}
    assert set(results) == set(range(6))
    for key, hyps in results.items():
        same(hyps, eng.translate([TEXTS[key]], opts)[0])


def test_int8_uses_integer_gemms_and_is_batch_invariant(tiny: TinyBundle):
    # quantize_dynamic's DynamicQuantizeLinear used one activation scale for the whole batch, so a
    # sentence's int8 output depended on its batch mates; export/int8.py scales each row on its own.
    import onnx

    graphs = [onnx.load(str(tiny.bundle / "int8" / f"{g}.onnx")) for g in ("encoder", "decoder")]
    ops = [n.op_type for g in graphs for n in g.graph.node]
    assert "MatMulIntegerToFloat" in ops
    assert "Gemm" not in ops and "MatMulNBits" not in ops
    assert not set(ops) & {"DynamicQuantizeLinear", "DynamicQuantizeMatMul"}
    eng = Engine(tiny.bundle, variant="int8", intra_op_threads=2)
    texts = [*TEXTS, "Open the file.", "<b>Warning:</b> this action CANNOT be undone!!!"]
    for k in (1, 4):
        opts = DecodingOptions(beam_size=k, num_hypotheses=k)
        alone = [eng.translate([t], opts)[0] for t in texts]
        mixed = eng.translate(texts[::-1] + texts[:3], opts)
        got = [tokens_and_scores(r) for r in mixed]
        want = [tokens_and_scores(r) for r in alone]
        assert got == want[::-1] + want[:3]


def test_iobinding_path_matches_numpy_path(engine: Engine, tiny: TinyBundle):
    # Same search; the last bits of scores may differ (exact-length vs spare-capacity caches).
    bound = Engine(tiny.bundle, intra_op_threads=1, io_binding=True)
    assert isinstance(bound.generator.cache, BoundCache) and bound.generator.cache_graph
    assert isinstance(engine.generator.cache, NumpyCache)
    for k in (1, 4):
        opts = DecodingOptions(beam_size=k, num_hypotheses=min(k, 2))
        for got, want in zip(bound.translate(TEXTS, opts), engine.translate(TEXTS, opts), strict=True):
            assert_same_nbest(tokens_and_scores(got), tokens_and_scores(want))
    calls = []
    flags = lambda: calls.append(1) or [len(calls) >= 3 and i == 1 for i in range(len(TEXTS))]  # noqa: E731
    got = bound.translate(TEXTS, DecodingOptions(beam_size=3), flags)
    want = engine.translate(TEXTS, DecodingOptions(beam_size=3))
    assert got[1] is None
    for i in (0, 2, 3, 4, 5, 6, 7):
        assert_same_nbest(tokens_and_scores(got[i]), tokens_and_scores(want[i]))


def test_cache_back_ends_need_only_the_graphs(engine: Engine):
    """A back-end runs on a Generator's Graphs (sessions and interface), without the Generator (as
    bench/step_cost builds them); the IOBinding one needs the bundle's cache graph."""
    graphs = engine.generator.graphs
    src = np.full((2, 8), 5, dtype=np.int64)
    bias, cross = NumpyCache(graphs).encode(src)
    want_bias, want_cross = engine.generator.cache.encode(src)
    np.testing.assert_array_equal(bias, want_bias)
    bound_bias, bound_cross = BoundCache(graphs, "cpu", 0).encode(src)
    np.testing.assert_array_equal(bound_bias, want_bias)
    for got, bound, want in zip(cross, bound_cross, want_cross, strict=True):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(bound.numpy(), want)
    with pytest.raises(BundleError, match="cache graph"):
        BoundCache(dataclasses.replace(graphs, cache=None), "cpu", 0)


@pytest.mark.filterwarnings("ignore:Specified provider")
def test_cuda_request_without_cuda_raises(tiny: TinyBundle):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("a CUDA build of onnxruntime is installed")
    with pytest.raises(RuntimeError, match="CUDA|cuda"):
        Engine(tiny.bundle, device="cuda", intra_op_threads=1)
    assert Engine(tiny.bundle, device="auto", intra_op_threads=1).providers == ["CPUExecutionProvider"]


# ----------------------------------------------------------------------------------- cancellation


def test_cancellation_drops_row_and_leaves_others_identical(engine: Engine):
    opts = DecodingOptions(beam_size=4, num_hypotheses=2)
    full = engine.translate(TEXTS, opts)
    full_rows = engine.last_stats["row_steps"]
    long_row = max(range(len(TEXTS)), key=lambda i: len(full[i][0].tokens))
    calls = []

    def cancelled() -> list[bool]:
        calls.append(1)
        return [i == long_row and len(calls) >= 3 for i in range(len(TEXTS))]

    out = engine.translate(TEXTS, opts, cancelled)
    assert out[long_row] is None
    assert [r for i, r in enumerate(out) if i != long_row] == [r for i, r in enumerate(full) if i != long_row]
    assert engine.last_stats["row_steps"] < full_rows  # the row really left the batch
    assert len(calls) == engine.last_stats["steps"]  # checked at every step boundary (and before the first)
    assert engine.translate(TEXTS[:3], opts, lambda: [True, False, True])[::2] == [None, None]
    assert engine.translate(TEXTS[:2], opts, lambda: [True, True]) == [None, None]
    with pytest.raises(ValueError, match="flags"):
        engine.translate(TEXTS[:2], opts, lambda: [True])


@pytest.mark.parametrize("in_place_share", [0.0, 0.8, 1.0])
def test_numpy_cache_steps_match_a_plain_reference(engine: Engine, in_place_share: float):
    """NumpyCache.advance over its stacked storage (one array for all layers' K and V): appends in place,
    beam reorders and compactions (in place, or into the other buffer set: in_place_share) give the rows
    and slots a plain concatenation gives, whether `past` is its own stacked views or arrays from
    elsewhere (after a cancellation's take)."""
    graphs = engine.generator.graphs
    cache = NumpyCache(graphs)
    cache.IN_PLACE_SHARE = in_place_share
    rng = np.random.default_rng(3)
    n = 2 * graphs.n_layers
    h, dh = graphs.n_heads, graphs.head_dim

    def new_kv(rows: int) -> list[np.ndarray]:
        return [rng.standard_normal((rows, h, 1, dh)).astype(np.float32) for _ in range(n)]

    want = [np.zeros((6, h, 0, dh), np.float32) for _ in range(n)]  # reference: exact-length arrays
    past = cache.empty_past(6)
    orders = [None, np.array([0, 0, 2, 1, 4, 5]), None, np.array([5, 4, 3, 2, 1, 0]), np.array([1, 3, 5])]
    orders += [np.array([2, 2, 0]), None] * 10  # past the first 16 slots: the capacity grows
    for t, rows in enumerate(orders):
        if t == 7:  # a cancellation's take hands back plain arrays, not the stacked views
            past = cache.take(past, np.arange(past[0].shape[0]))
        new = new_kv(past[0].shape[0])
        past = cache.advance(past, new, rows, t)
        idx = np.arange(want[0].shape[0]) if rows is None else rows
        want = [np.concatenate([w[idx], x[idx]], axis=2) for w, x in zip(want, new, strict=True)]
        assert len(past) == n and past[0].shape[2] >= t + 1
        for got, ref in zip(past, want, strict=True):
            np.testing.assert_array_equal(got[:, :, : t + 1], ref)
        stack = cache._stack
        assert stack is not None and all(p.base is not None and np.shares_memory(p, stack) for p in past)


def test_bound_decoder_steps_match_plain_runs(engine: Engine):
    """NumpyCache keeps one IOBinding across steps and binds an input again only when it is another
    array object: the in-place appends of greedy steps, beam reorders into the other buffer set, capacity
    growth and compaction must all reach the decoder exactly as a fresh InferenceSession.run sees them."""
    gen = engine.generator
    bound = gen.cache
    assert isinstance(bound, NumpyCache) and bound.bind
    texts = TEXTS + ["a sentence that runs past the first sixteen slots"]
    cases = [DecodingOptions(), DecodingOptions(beam_size=4, num_hypotheses=2)]
    shapes: list[tuple] = []
    bind_outputs = bound._bind_outputs
    bound._bind_outputs = lambda io, *key: shapes.append(key) or bind_outputs(io, *key)  # type: ignore[method-assign]
    try:
        got = [engine.translate(texts, opts) for opts in cases]
    finally:
        del bound._bind_outputs
    assert shapes  # the bound path ran
    try:
        gen.cache = NumpyCache(gen.graphs, bind=False)
        want = [engine.translate(texts, opts) for opts in cases]
    finally:
        gen.cache = bound
    for g_case, w_case in zip(got, want, strict=True):
        for g, w in zip(g_case, w_case, strict=True):
            assert_same_nbest(tokens_and_scores(g), tokens_and_scores(w))


def test_bound_step_sees_in_place_writes_and_rebinds_new_objects(engine: Engine):
    """Bound by address: a write into a bound array reaches the next step without binding it again; a
    different array object is bound anew; the returned K/V are views of the reused output buffer."""
    graphs = engine.generator.graphs
    bound, plain = NumpyCache(graphs), NumpyCache(graphs, bind=False)
    src = np.full((2, 6), 5, dtype=np.int64)
    bias, cross = plain.encode(src)
    rng = np.random.default_rng(0)
    past = [rng.standard_normal((2, graphs.n_heads, 16, graphs.head_dim)).astype(np.float32)]
    past = past * (2 * graphs.n_layers)

    def feed(token: int) -> dict[str, np.ndarray]:
        return {
            "input_ids": np.full((2, 1), token, dtype=np.int64),
            "position": np.array([3, 5], dtype=np.int64),
            "src_bias": bias,
            "beam_scores": np.zeros((2, 1), dtype=np.float32),
            "num_candidates": np.array([3], dtype=np.int64),
        }

    def same(a: tuple, b: tuple) -> None:
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        for x, y in zip(a[2], b[2], strict=True):
            np.testing.assert_array_equal(x, y)

    same(bound.step(feed(7), cross, past), plain.step(feed(7), cross, past))
    assert bound._bound["past_key_0"] is past[0]
    past[0][:, :, :4] += 1.0  # in place: the binding must see it
    first = bound.step(feed(7), cross, past)
    same(first, plain.step(feed(7), cross, past))
    assert all(x.base is bound._out[2] for x in first[2])
    other = [p.copy() * 0.5 for p in past]  # other objects: bound anew
    same(bound.step(feed(9), cross, other), plain.step(feed(9), cross, other))
    assert bound._bound["past_key_0"] is other[0]
    bound.release()
    assert bound._io is None and not bound._bound
