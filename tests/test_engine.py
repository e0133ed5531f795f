"""server/engine.py against the PyTorch reference decoders (model/decode.py) on tiny exported models."""

from __future__ import annotations

import itertools
import json
import random
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

from export import onnx_export as ox
from model.decode import beam_search, gnmt_length_penalty, greedy_decode, max_output_length
from server import engine as engine_module
from server.engine import (
    LOGPROB_SLACK,
    BatchItem,
    BundleError,
    DecodingOptions,
    Engine,
    Generator,
    Hypothesis,
    InputTooLongError,
    settled,
)
from tests.conftest import copy_without_kv_rows
from tests.test_export import (
    MAX_LENGTH_CAP,
    MAX_SOURCE_TOKENS,
    ROOT,
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


# ------------------------------------------------------------------------------------------ basics


def test_load_metadata_and_round_trip(engine: Engine, tiny: TinyBundle):
    assert (engine.name, engine.version) == ("tiny-en-es", "0.0.1-test")
    assert (engine.source_language, engine.target_language) == ("en", "es")
    assert engine.max_source_tokens == MAX_SOURCE_TOKENS and engine.max_length_cap == MAX_LENGTH_CAP
    assert engine.max_beam_size == 8
    assert engine.default_options == DecodingOptions(
        beam_size=4, num_hypotheses=1, max_length=0, length_penalty=0.6
    )
    assert engine.providers == ["CPUExecutionProvider"]
    assert engine.manifest["format_version"] == 1
    out = engine.translate(TEXTS, engine.default_options)
    assert len(out) == len(TEXTS)
    for nbest in out:
        assert nbest is not None and len(nbest) == 1
        h = nbest[0]
        assert isinstance(h, Hypothesis) and h.score < 0
        assert h.text == tiny.tokenizer.decode(h.tokens)
    stats = engine.last_stats
    for key in ("encoder_s", "decoder_s", "select_s", "reorder_s", "steps", "total_s", "tokenize_s"):
        assert key in stats
    assert stats["segments"] == len(TEXTS) and stats["steps"] > 0
    engine.warmup()


def test_engine_imports_no_torch(tiny: TinyBundle):
    code = (
        "import sys; from server.engine import Engine, DecodingOptions; "
        f"e = Engine({str(tiny.bundle)!r}, intra_op_threads=1); "
        "r = e.translate(['Open the file.'], DecodingOptions(beam_size=2)); "
        "assert r[0][0].score < 0, r; "
        "assert 'torch' not in sys.modules and 'grpc' not in sys.modules; print('ok')"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


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
    monkeypatch.setattr(engine_module, "settled", lambda fin, *rest: [False] * len(fin))
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


def brute_force(model, src: list[int], max_len: int, alpha: float) -> list[tuple[list[int], float]]:
    """Every hypothesis beam search can produce (EOS-terminated up to max_len, or max_len tokens without
    EOS), scored by a full teacher-forced pass, best first."""
    cfg = model.config
    others = [v for v in range(cfg.vocab_size) if v != cfg.eos_id]
    hyps = [(list(p), True) for n in range(max_len) for p in itertools.product(others, repeat=n)]
    hyps += [(list(p), False) for p in itertools.product(others, repeat=max_len)]
    scored = []
    with torch.no_grad():
        memory, pad_mask = model.encode(torch.tensor([src]))
        for prefix, eos in hyps:
            target = prefix + [cfg.eos_id] if eos else prefix
            tgt_in = torch.tensor([[cfg.bos_id] + target[:-1]]) if target else None
            total = 0.0
            if target:
                lp = F.log_softmax(model.decode(tgt_in, memory, pad_mask)[0].float(), dim=-1)
                total = float(lp[torch.arange(len(target)), torch.tensor(target)].sum())
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
    assert rb.beam.on_device
    opts = DecodingOptions(beam_size=3, num_hypotheses=2)
    rb.admit([BatchItem(i, t, opts) for i, t in enumerate(TEXTS[:3])])
    results = {f.key: f.hypotheses for _ in range(2) for f in rb.step()}
    rb.admit([BatchItem(i, t, opts) for i, t in enumerate(TEXTS[3:6], start=3)])
    while len(rb):
        results |= {f.key: f.hypotheses for f in rb.step()}
    assert set(results) == set(range(6))
    for key, hyps in results.items():
        same(hyps, eng.translate([TEXTS[key]], opts)[0])


def test_int8_is_weight_only_and_batch_invariant(tiny: TinyBundle):
    # quantize_dynamic's DynamicQuantizeLinear used one activation scale for the whole batch, so a
    # sentence's int8 output depended on its batch mates; MatMulNBits (accuracy_level 4) is row-local.
    import onnx

    graphs = [onnx.load(str(tiny.bundle / "int8" / f"{g}.onnx")) for g in ("encoder", "decoder")]
    ops = {n.op_type for g in graphs for n in g.graph.node}
    assert "MatMulNBits" in ops
    assert not ops & {"DynamicQuantizeLinear", "MatMulInteger", "DynamicQuantizeMatMul"}
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
    assert type(bound.generator.cache).__name__ == "_BoundCache" and bound.generator.cache_graph
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


# ------------------------------------------------------------------------------------- real text


def test_whitespace_and_empty_segments(engine: Engine):
    texts = ["", "   ", "\n", " \t\n ", "  Open the file.\n", "\tSettings  ", "Yes"]
    out = engine.translate(texts, DecodingOptions(beam_size=2))
    for i in range(4):
        assert out[i] == [Hypothesis(text=texts[i], score=0.0, tokens=[])]
    core = engine.translate(["Open the file.", "Settings"], DecodingOptions(beam_size=2))
    assert out[4][0].text == "  " + core[0][0].text + "\n" and out[4][0].tokens == core[0][0].tokens
    assert out[5][0].text == "\t" + core[1][0].text + "  "
    assert out[6][0].text == engine.tokenizer.decode(out[6][0].tokens)
    assert engine.translate([], DecodingOptions()) == []
    assert engine.count_tokens(["", "  Open the file. ", "Open the file."])[0] == 0
    counts = engine.count_tokens(["  Open the file. ", "Open the file."])
    assert counts[0] == counts[1] == len(engine.tokenizer.encode("Open the file."))


def test_input_too_long(engine: Engine):
    long_text = " ".join(["information"] * 40)
    n = engine.count_tokens([long_text])[0]
    assert n > MAX_SOURCE_TOKENS
    with pytest.raises(InputTooLongError) as err:
        engine.translate(["Yes", long_text, ""], DecodingOptions())
    msg = str(err.value)
    assert "segment 1" in msg and str(n) in msg and str(MAX_SOURCE_TOKENS) in msg and "split" in msg
    assert isinstance(err.value, ValueError)


def test_placeholders_are_single_tokens(engine: Engine):
    tok = engine.tokenizer
    for ph in ("%s", "{0}", "%1$s", "<b>", "%d"):
        assert ph in tok.pieces(f"Delete {ph} now")  # one atom, never split into sub-pieces
    text = "Delete %s from {0}?"
    assert tok.decode(tok.encode(text)) == text
    (hyp,) = engine.translate([text], DecodingOptions(beam_size=1))[0]
    assert hyp.text == tok.decode(hyp.tokens)


def test_options_validation_and_length_cap(engine: Engine):
    with pytest.raises(ValueError, match="beam_size"):
        engine.translate(["Yes"], DecodingOptions(beam_size=9))
    with pytest.raises(ValueError, match="num_hypotheses"):
        engine.translate(["Yes"], DecodingOptions(beam_size=2, num_hypotheses=3))
    with pytest.raises(ValueError, match="max_length"):
        engine.translate(["Yes"], DecodingOptions(max_length=-1))
    short = engine.translate(TEXTS, DecodingOptions(beam_size=2, max_length=3))
    assert all(len(r[0].tokens) <= 3 for r in short)
    capped = engine.translate(TEXTS, DecodingOptions(beam_size=1, max_length=10_000))
    assert max(len(r[0].tokens) for r in capped) <= MAX_LENGTH_CAP
    assert engine.max_output_length(100, DecodingOptions()) == MAX_LENGTH_CAP
    assert engine.max_output_length(4, DecodingOptions()) == max_output_length(4, cap=MAX_LENGTH_CAP) == 16


# ---------------------------------------------------------------------------------- corrupt bundles


@pytest.fixture()
def bundle_copy(tiny: TinyBundle, tmp_path: Path) -> Path:
    dst = tmp_path / "bundle"
    shutil.copytree(tiny.bundle, dst)
    return dst


def test_flipped_byte_is_a_checksum_error(bundle_copy: Path):
    path = bundle_copy / "fp32" / "decoder.onnx"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"decoder\.onnx.*sha256"):
        Engine(bundle_copy, intra_op_threads=1)


def test_missing_file_is_named(bundle_copy: Path):
    (bundle_copy / "tokenizer.model").unlink()
    with pytest.raises(BundleError, match=r"tokenizer\.model.*missing"):
        Engine(bundle_copy, intra_op_threads=1)


def test_wrong_format_version_and_bad_manifest(bundle_copy: Path):
    path = bundle_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps(manifest | {"format_version": 99}))
    with pytest.raises(BundleError, match="format_version 99"):
        Engine(bundle_copy, intra_op_threads=1)
    path.write_text("{not json")
    with pytest.raises(BundleError, match="manifest.json"):
        Engine(bundle_copy, intra_op_threads=1)
    path.unlink()
    with pytest.raises(BundleError, match="missing manifest"):
        Engine(bundle_copy, intra_op_threads=1)


def test_unknown_variant_and_truncated_file(bundle_copy: Path):
    with pytest.raises(BundleError, match="variant 'int4'"):
        Engine(bundle_copy, variant="int4", intra_op_threads=1)
    path = bundle_copy / "int8" / "encoder.onnx"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(BundleError, match=r"int8/encoder\.onnx: size"):
        Engine(bundle_copy, variant="int8", intra_op_threads=1)


# ------------------------------------------------------------------- in-flight batching (RunningBatch)
# Every sentence's output is exactly (bit for bit) what it gets alone, whatever joins or leaves.

MORE = [
    "Save changes?",
    "Print",
    "  Open the file.  ",
    "",
    "Delete the selected messages permanently?",
    "The printer is out of paper.",
]
OPTIONS = [
    DecodingOptions(beam_size=1, num_hypotheses=1),
    DecodingOptions(beam_size=2, num_hypotheses=2),
    DecodingOptions(beam_size=4, num_hypotheses=1),
    DecodingOptions(beam_size=3, num_hypotheses=3, length_penalty=1.0),
    DecodingOptions(beam_size=5, num_hypotheses=2, max_length=7),
    DecodingOptions(beam_size=1, max_length=3),
    DecodingOptions(beam_size=4, num_hypotheses=2, length_penalty=0.0),  # the settled() stop fires
]


@pytest.fixture(scope="module")
def solo(engine: Engine) -> dict:
    """(text, options) -> the result of translating that text alone."""
    out = {}
    for text in TEXTS + MORE:
        for opts in OPTIONS:
            out[text, opts] = engine.translate([text], opts)[0]
    return out


def same(got, want) -> None:
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert [h.text for h in got] == [h.text for h in want]
    # Bit-identical scores (not merely close): same numbers as alone.
    assert [h.score for h in got] == [h.score for h in want]


def test_graph_takes_per_row_positions(engine: Engine):
    assert engine.supports_inflight
    assert len(engine.running_batch()) == 0


@pytest.fixture(scope="module")
def bound_engine(tiny: TinyBundle) -> Engine:
    """IOBinding on the CPU provider: the in-flight batch keeps K/V as OrtValues and changes them with
    the bundle's kv_rows graph, as on CUDA (where it saves copying the cache over the bus each step)."""
    return Engine(tiny.bundle, intra_op_threads=1, io_binding=True)


@pytest.mark.parametrize("storage", ["host", "device"])
@pytest.mark.parametrize("seed", range(6))
def test_random_arrivals_and_drops_match_solo(
    engine: Engine, bound_engine: Engine, solo: dict, seed: int, storage: str
):
    rng = random.Random(seed)
    pending = [(text, rng.choice(OPTIONS)) for text in rng.sample(TEXTS + MORE, 10)]
    pending += [(rng.choice(TEXTS), rng.choice(OPTIONS)) for _ in range(6)]
    rb = (engine if storage == "host" else bound_engine).running_batch()
    assert rb.beam.on_device == (storage == "device") == rb.greedy.on_device
    items = {}
    results = {}
    dropped = set()
    key = 0
    steps = 0
    max_rows = 0
    while pending or len(rb):
        if pending and (not len(rb) or rng.random() < 0.3):
            n = rng.randint(1, 3)
            batch = []
            for text, opts in pending[:n]:
                items[key] = (text, opts)
                batch.append(BatchItem(key, text, opts))
                key += 1
            del pending[:n]
            for f in rb.admit(batch):
                assert f.error is None
                results[f.key] = f.hypotheses
        if len(rb) > 1 and rng.random() < 0.05:
            victim = rng.choice(rb.keys)
            assert rb.drop([victim]) == 1
            dropped.add(victim)
        max_rows = max(max_rows, rb.rows)
        for f in rb.step():
            assert f.key not in results
            results[f.key] = f.hypotheses
        steps += 1
        assert steps < 2000
    assert set(results) | dropped == set(items) and not set(results) & dropped
    for k, hyps in results.items():
        same(hyps, solo[items[k]])
    assert max_rows > 4  # the batch really mixed sentences


def test_mixed_beams_join_a_running_long_decode(engine: Engine):
    """Short sentences (greedy and beam 2) admitted while a beam-5 one decodes leave before it; all
    match their solo translations."""
    rb = engine.running_batch()
    long_opts = DecodingOptions(beam_size=5, num_hypotheses=2)
    rb.admit([BatchItem("long", TEXTS[1], long_opts)])
    for _ in range(3):
        assert rb.step() == []
    greedy, beam2 = DecodingOptions(beam_size=1, max_length=3), DecodingOptions(beam_size=2, max_length=4)
    wanted = {"long": (TEXTS[1], long_opts)}
    items = []
    for i, t in enumerate(TEXTS[:4]):
        wanted[i] = (t, greedy if i % 2 else beam2)
        items.append(BatchItem(i, *wanted[i]))
    rb.admit(items)
    assert rb.rows == 5 * 3 + 2  # beam sentences share Kc = 5 rows each; greedy ones run apart
    order = []
    while len(rb):
        for f in rb.step():
            order.append(f.key)
            same(f.hypotheses, engine.translate([wanted[f.key][0]], wanted[f.key][1])[0])
    assert order[-1] == "long" and len(order) == 5
    assert rb.rows == 0


@pytest.mark.parametrize("storage", ["host", "device"])
def test_settled_sentences_leave_the_running_batch(
    engine: Engine, bound_engine: Engine, solo: dict, storage: str
):
    """The settled() stop in flight: sentences joining every other step, some with alpha 0 (where it
    fires most), each leaves as soon as its n-best is settled, with its solo result."""
    rb = (engine if storage == "host" else bound_engine).running_batch()
    alpha0, beam4 = OPTIONS[-1], OPTIONS[2]
    plan = [(i, t, alpha0 if i % 2 else beam4) for i, t in enumerate(TEXTS + MORE[:2])]
    pending = list(plan)
    results = {}
    while pending or len(rb):
        if pending:
            i, text, opts = pending.pop(0)
            rb.admit([BatchItem(i, text, opts)])
        for f in rb.step():
            results[f.key] = f.hypotheses
    assert rb.beam.settled > 0
    for i, text, opts in plan:
        same(results[i], solo[text, opts])


def test_admit_refuses_bad_items_and_passes_blank(engine: Engine):
    rb = engine.running_batch()
    out = rb.admit(
        [
            BatchItem(1, "  ", DecodingOptions(beam_size=2)),
            BatchItem(2, "word " * 200, DecodingOptions(beam_size=2)),
            BatchItem(3, "Open", DecodingOptions(beam_size=2, num_hypotheses=3)),
        ]
    )
    by = {f.key: f for f in out}
    assert by[1].hypotheses[0].text == "  " and by[1].error is None
    assert "max_source_tokens" in str(by[2].error)
    assert isinstance(by[3].error, ValueError)
    assert len(rb) == 0


def test_old_graph_is_refused(engine: Engine, monkeypatch):
    monkeypatch.setattr(engine.generator, "row_positions", False)
    with pytest.raises(BundleError, match="per-row positions"):
        engine.running_batch()


@pytest.mark.parametrize("storage", ["host", "device"])
def test_cache_is_compacted(engine: Engine, bound_engine: Engine, storage: str):
    rb = (engine if storage == "host" else bound_engine).running_batch()
    opts = DecodingOptions(beam_size=3)
    rb.admit([BatchItem(i, t, opts) for i, t in enumerate(TEXTS)])
    assert rb.rows == 3 * len(TEXTS)
    rb.step()
    rb.drop([0, 1, 2])
    assert rb.rows == 3 * (len(TEXTS) - 3)
    past = [p if isinstance(p, np.ndarray) else p.numpy() for p in rb.beam.past]
    assert past[0].shape[0] == rb.rows and past[0].shape[2] % 16 == 0
    assert np.isfinite(past[0]).all()
    if storage == "device":  # exactly the live sentences on the device, nothing spare
        bias, cross = rb.beam._store.sources(len(rb))
        assert cross[0].shape()[0] == bias.shape[0] == len(rb)
    while len(rb):
        rb.step()
    assert rb.beam.past == []


def test_bundle_without_kv_rows_graph_keeps_the_cache_on_the_host(
    engine: Engine, tiny: TinyBundle, tmp_path: Path
):
    """Bundles exported before the kv_rows graph still batch in flight with IOBinding, from host memory."""
    old = Engine(copy_without_kv_rows(tiny.bundle, tmp_path / "bundle"), intra_op_threads=1, io_binding=True)
    rb = old.running_batch()
    assert old.generator.kv_rows_graph is None and not rb.beam.on_device
    opts = DecodingOptions(beam_size=2, num_hypotheses=2)
    rb.admit([BatchItem(0, TEXTS[1], opts)])
    while len(rb):
        out = rb.step()
    same(out[0].hypotheses, engine.translate([TEXTS[1]], opts)[0])


@pytest.mark.parametrize("storage", ["host", "device"])
def test_leaving_sentences_cost_a_row_move_not_a_cache_copy(
    engine: Engine, bound_engine: Engine, solo: dict, storage: str
):
    """Greedy group: a sentence leaving (dropped here) is replaced by the last live one (on the host in
    place: the cache storage is not re-laid out); the source axis shrinks once the widest sentence has
    left; the others' results are unchanged."""
    rb = (engine if storage == "host" else bound_engine).running_batch()
    greedy = OPTIONS[0]
    wide = "Delete the selected messages permanently? " * 4
    texts = [wide, TEXTS[0], TEXTS[2], "Print", "Save changes?"]  # 24 source tokens vs <= 4
    rb.admit([BatchItem(i, t, greedy) for i, t in enumerate(texts)])
    g = rb.greedy
    results: dict = {}
    before = list(g.keys)
    assert before[-1] == 0  # admitted in order of source width: the widest joins last
    kv, width = g._store.kv[0], g.source_width
    assert rb.drop([before[0]]) == 1  # position 0: the last sentence moves into its place
    assert (g._store.kv[0] is kv) == (storage == "host")  # host: rows moved in place
    assert g.keys == [before[-1], *before[1:-1]] and g.rows == len(before) - 1
    assert g.source_width == width
    assert rb.drop([0]) == 1  # the widest leaves: the source axis shrinks
    assert g.source_width < width  # 24 -> 8 positions
    while len(rb):
        for f in rb.step():
            results[f.key] = f.hypotheses
    for key, hyps in results.items():
        same(hyps, solo[texts[key], greedy])
    assert set(results) == set(range(1, len(texts))) - {before[0]}
