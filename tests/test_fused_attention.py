"""The fused-attention decoder step (export/fused_step.py, `python -m export --fused-attention`): the
traced step's interface, parity with PyTorch and with the traced step, the engine decoding a fused bundle
as the reference decoders do, batch invariance, and the int8 variant built on it (tiny models)."""

from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from export import fused_step, int8, verify
from export import onnx_export as ox
from export.__main__ import main as export_main
from model.model import Transformer
from model.tokenizer import Tokenizer
from model.train import load_release, save_release
from server.engine import DecodingOptions, Engine
from tests.test_export import (
    MAX_LENGTH_CAP,
    MAX_SOURCE_TOKENS,
    TEXTS,
    TOKENIZER,
    _varied,
    assert_engine_decodes_as_the_reference,
    tiny_model,
)

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@dataclass
class Fused:
    model: Transformer  # the reloaded release: the PyTorch reference
    tokenizer: Tokenizer
    bundle: Path  # exported with --fused-attention (fp32, int8)
    traced: Path  # the traced step of the same model (export/onnx_export.py)


def _session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _release(root: Path, norm_first: bool) -> tuple[Path, Transformer, Tokenizer]:
    tokenizer = Tokenizer(TOKENIZER)
    depths = {"encoder_layers": 2, "layers": 1} if norm_first else {}
    for seed in range(1, 20):  # the first seed whose greedy outputs end at varied lengths
        model = tiny_model(tokenizer.vocab_size, seed, norm_first=norm_first, **depths)
        if _varied(model, tokenizer):
            break
    checkpoint = root / "tiny-en-es"
    save_release(model, checkpoint, tokenizer, {"best": {"step": 0}})
    return checkpoint, load_release(checkpoint), tokenizer


@pytest.fixture(scope="module")
def fused(tmp_path_factory: pytest.TempPathFactory) -> Fused:
    root = tmp_path_factory.mktemp("fused")
    checkpoint, model, tokenizer = _release(root, norm_first=False)
    bundle = root / "bundle"
    out = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out):
        warnings.simplefilter("ignore")
        rc = export_main(
            [
                "--checkpoint", str(checkpoint), "--out", str(bundle), "--variants", "fp32,int8",
                "--max-source-tokens", str(MAX_SOURCE_TOKENS), "--max-length-cap", str(MAX_LENGTH_CAP),
                "--data", str(root / "no-data"), "--parity-sentences", "4", "--fused-attention",
            ]
        )  # fmt: skip
    assert rc == 0, out.getvalue()
    traced = root / "traced.onnx"
    ox.export_decoder(model, traced)
    return Fused(model, tokenizer, bundle, traced)


def _step_feed(model: Transformer, encoder: Path, tokenizer: Tokenizer) -> dict[str, np.ndarray]:
    """A step of 3 sentences x 2 beam rows: padded sources, per-row positions, spare cache capacity with
    large finite junk past each row's position."""
    cfg = model.config
    n, h, dh = cfg.n_decoder_layers, cfg.n_heads, cfg.d_model // cfg.n_heads
    src = verify.pad_batch(tokenizer.encode_batch(TEXTS[:3]))
    out = _session(encoder).run(None, {"src_ids": src})
    rng = np.random.default_rng(0)
    rows, capacity = 6, 9
    position = np.array([0, 3, 5, 5, 8, 2], dtype=np.int64)
    past = []
    for _ in range(2 * n):
        kv = rng.standard_normal((rows, h, capacity, dh)).astype(np.float32)
        spare = np.arange(capacity)[None, :] >= position[:, None]  # (rows, capacity)
        kv.transpose(0, 2, 1, 3)[spare] = 1e3  # spare slots: any finite values, ignored
        past.append(kv)
    feed = {"input_ids": rng.integers(3, 50, (rows, 1)), "position": position, "src_bias": out[1]}
    feed |= dict(zip(ox.cross_names(n), out[2:], strict=True))
    feed |= dict(zip(ox.past_names(n), past, strict=True))
    feed |= {"beam_scores": np.array([[0, -1], [0, -0.5], [0, -np.inf]], np.float32)}
    return feed | {"num_candidates": np.array([4], dtype=np.int64)}


def test_same_interface_as_the_traced_step_in_fewer_nodes(fused: Fused):
    dec = fused.bundle / "fp32" / "decoder.onnx"
    traced = _session(fused.traced)
    got = _session(dec)
    assert [(i.name, i.type, i.shape) for i in got.get_inputs()] == [
        (i.name, i.type, i.shape) for i in traced.get_inputs()
    ]
    assert [(o.name, o.type) for o in got.get_outputs()] == [(o.name, o.type) for o in traced.get_outputs()]
    for variant in ("fp32", "int8"):
        ops = [node.op_type for node in onnx.load(str(fused.bundle / variant / "decoder.onnx")).graph.node]
        assert ops.count("MultiHeadAttention") == fused.model.config.n_decoder_layers  # cross-attention
    assert fused_step.optimized_node_count(dec) < fused_step.optimized_node_count(fused.traced)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("self_attention", fused_step.SELF_ATTENTION)
def test_parity_with_pytorch_and_the_traced_step(tmp_path: Path, norm_first: bool, self_attention: str):
    _, model, tokenizer = _release(tmp_path, norm_first)
    enc, dec, traced = tmp_path / "encoder.onnx", tmp_path / "fused.onnx", tmp_path / "traced.onnx"
    ox.export_encoder(model, enc)
    fused_step.export_fused_decoder(model, dec, self_attention)
    verify.check_graph(dec)
    p = verify.parity(model, enc, dec, tokenizer.encode_batch(TEXTS))
    assert p["step_logprob_max_abs"] <= 1e-4 and p["step_vs_full_pass_logprob_max_abs"] <= 1e-4
    assert p["top1_agreement"] == 1.0 and p["steps"] > 5
    # One step against the traced graph: per-row positions, beams grouped per sentence, spare capacity.
    ox.export_decoder(model, traced)
    feed = _step_feed(model, enc, tokenizer)
    want, got = _session(traced).run(None, feed), _session(dec).run(None, feed)
    for a, b in zip(got[:-1], want[:-1], strict=True):  # log_probs, new K/V, top-k scores
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_array_equal(got[-1], want[-1])  # top-k candidates


def test_the_engine_decodes_a_fused_bundle_as_the_reference_decoders(fused: Fused):
    assert_engine_decodes_as_the_reference(fused.model, fused.tokenizer, fused.bundle)


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_a_fused_bundle_is_batch_invariant(fused: Fused, variant: str):
    """Each sentence alone == inside a batch, bit for bit (tokens and scores), greedy and beam 4."""
    engine = Engine(fused.bundle, variant=variant, intra_op_threads=1)
    for k in (1, 4):
        opts = DecodingOptions(beam_size=k, num_hypotheses=k)
        alone = [[(h.tokens, h.score) for h in engine.translate([t], opts)[0]] for t in TEXTS]
        mixed = engine.translate(TEXTS[::-1] + TEXTS[:3], opts)
        assert [[(h.tokens, h.score) for h in r] for r in mixed] == alone[::-1] + alone[:3]


def test_int8_of_the_fused_step_matches_int8_of_the_traced_step(fused: Fused, tmp_path: Path):
    """export/int8.py quantizes the fused step's Gemms as the traced step's: the same int8 weights, and
    the two int8 graphs agree more closely than either agrees with fp32 (their fp32 parts differ in the
    last bits only, which can still move an activation across an int8 rounding boundary)."""
    traced_int8 = tmp_path / "traced-int8.onnx"
    int8.quantize_int8(fused.traced, traced_int8)
    graphs = [onnx.load(str(path)) for path in (fused.bundle / "int8" / "decoder.onnx", traced_int8)]

    def int8_weights(g: onnx.ModelProto) -> list[bytes]:
        return sorted(t.raw_data for t in g.graph.initializer if t.data_type == onnx.TensorProto.INT8)

    assert int8_weights(graphs[0]) == int8_weights(graphs[1])
    feed = _step_feed(fused.model, fused.bundle / "fp32" / "encoder.onnx", fused.tokenizer)
    got = _session(fused.bundle / "int8" / "decoder.onnx").run(None, feed)
    want = _session(traced_int8).run(None, feed)
    fp32 = _session(fused.traced).run(None, feed)
    assert np.abs(got[0] - want[0]).max() < np.abs(want[0] - fp32[0]).max() / 2
    np.testing.assert_array_equal(got[-1], want[-1])


def test_static_int8_scales_reach_the_fused_step_by_the_same_layer_names(fused: Fused, tmp_path: Path):
    """The fused step names its weights after the model's modules, so the ranges measured on valid
    (export/calibrate.py) give its int8 graph the same scales and int8 weights as the traced step's."""
    from export.calibrate import measure_ranges

    pairs = [(fused.tokenizer.encode(t), fused.tokenizer.encode(t)) for t in TEXTS]
    ranges = measure_ranges(fused.model, pairs)
    paths = [tmp_path / "fused-int8.onnx", tmp_path / "traced-int8.onnx"]
    int8.quantize_int8(fused.bundle / "fp32" / "decoder.onnx", paths[0], ranges)
    int8.quantize_int8(fused.traced, paths[1], ranges)
    weights = [
        sorted(
            t.raw_data for t in onnx.load(str(p)).graph.initializer if t.data_type == onnx.TensorProto.INT8
        )
        for p in paths
    ]
    assert weights[0] == weights[1] and len(weights[0]) == 3 * len(fused.model.decoder_layers) * 2 + 1
