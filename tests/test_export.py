"""ONNX export: bundle layout and manifest, graph checks, ORT vs PyTorch parity (tiny models)."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from export import cache_graphs, precision, verify
from export import onnx_export as ox
from export.__main__ import main as export_main
from model.decode import greedy_decode
from model.model import Transformer, TransformerConfig
from model.tokenizer import Tokenizer
from model.train import load_release, save_release
from runtime.bundle import FORMAT_VERSION, sha256_file

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "models" / "en-es-small" / "tokenizer.model"
MAX_SOURCE_TOKENS = 24
MAX_LENGTH_CAP = 40

TEXTS = [
    "Open the file.",
    "Could not save the document %s because the disk is full.",
    "Settings",
    "Are you sure you want to delete {0} items?",
    "Do you want to continue?",
    "Yes",
    "The connection to the server was lost.",
    "Cancel",
]


@dataclass
class TinyBundle:
    checkpoint: Path
    bundle: Path
    model: Transformer  # the reloaded release (fp16-rounded weights), the PyTorch reference
    tokenizer: Tokenizer
    stdout: str


def tiny_model(
    vocab_size: int,
    seed: int,
    d_model: int = 32,
    layers: int = 2,
    eos_gain: float = 0.8,
    norm_first: bool = False,
    encoder_layers: int = 0,
) -> Transformer:
    """Random tiny Transformer made less degenerate than plain random init: random decoder LayerNorm
    gains/biases (so it does not just copy its input token) and an EOS embedding aligned with the final
    LayerNorm bias (so hypotheses end at varied lengths). Pre-norm (norm_first): all LayerNorms random,
    the final ones included, so that a misplaced or missing one shows."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(
        vocab_size=vocab_size, d_model=d_model, n_heads=2, d_ff=2 * d_model,
        n_encoder_layers=encoder_layers or layers, n_decoder_layers=layers, dropout=0.0, max_positions=64,
        norm_first=norm_first,
    )  # fmt: skip
    model = Transformer(cfg).eval()
    with torch.no_grad():
        lns = [ln for layer in model.decoder_layers for ln in (layer.ln1, layer.ln2, layer.ln3)]
        if norm_first:
            lns += [ln for layer in model.encoder_layers for ln in (layer.ln1, layer.ln2)]
            lns += [model.encoder_ln, model.decoder_ln]
        for ln in lns:
            ln.weight.normal_(0.0, 2.0)
            ln.bias.normal_(0.0, 0.5)
        if vocab_size > 8:
            bias = (model.decoder_ln if norm_first else model.decoder_layers[-1].ln3).bias
            scale = model.embed.weight[3:].norm(dim=1).mean() * 3
            model.embed.weight[cfg.eos_id] = eos_gain * bias / bias.norm() * scale
    return model


def batch(seqs: list[list[int]]) -> torch.Tensor:
    src = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    for i, s in enumerate(seqs):
        src[i, : len(s)] = torch.tensor(s)
    return src


def _varied(model: Transformer, tokenizer: Tokenizer) -> bool:
    """Greedy outputs on TEXTS end at several different lengths, some by EOS and some at the cap."""
    lengths = [len(h) for h in greedy_decode(model, batch(tokenizer.encode_batch(TEXTS)), 20)]
    return len(set(lengths)) >= 3 and any(n == 20 for n in lengths) and any(0 < n < 20 for n in lengths)


_CACHE: dict[str, TinyBundle] = {}


def build_tiny_bundle(tmp_path_factory: pytest.TempPathFactory, norm_first: bool = False) -> TinyBundle:
    """Tiny model (real 8k tokenizer, d_model 32) -> save_release -> `python -m export` (once per session).
    norm_first: a pre-norm model, 4 encoder layers + 1 decoder layer (a deep-shallow one in miniature)."""
    key = "pre-norm" if norm_first else "bundle"
    if key in _CACHE:
        return _CACHE[key]
    torch.set_num_threads(1)
    tokenizer = Tokenizer(TOKENIZER)
    depths = {"encoder_layers": 4, "layers": 1} if norm_first else {}
    for seed in range(1, 20):
        model = tiny_model(tokenizer.vocab_size, seed, norm_first=norm_first, **depths)
        if _varied(model, tokenizer):
            break
    root = tmp_path_factory.mktemp(key)
    checkpoint = root / "tiny-en-es"
    save_release(model, checkpoint, tokenizer, {"best": {"step": 0}})
    bundle = root / "bundle"
    import contextlib
    import io

    out = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out):
        warnings.simplefilter("ignore")
        rc = export_main(
            [
                "--checkpoint", str(checkpoint), "--out", str(bundle), "--variants", "fp32,int8,fp16",
                "--max-source-tokens", str(MAX_SOURCE_TOKENS), "--max-length-cap", str(MAX_LENGTH_CAP),
                "--data", str(root / "no-data"), "--parity-sentences", "8", "--version", "0.0.1-test",
            ]
        )  # fmt: skip
    assert rc == 0, out.getvalue()
    _CACHE[key] = TinyBundle(checkpoint, bundle, load_release(checkpoint), tokenizer, out.getvalue())
    return _CACHE[key]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyBundle:
    return build_tiny_bundle(tmp_path_factory)


pytestmark = pytest.mark.usefixtures("torch_single_thread")


def session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


# ---------------------------------------------------------------------------------------------- tests


def test_bundle_layout_and_manifest(tiny: TinyBundle):
    m = json.loads((tiny.bundle / "manifest.json").read_text())
    assert m["format_version"] == FORMAT_VERSION
    assert (m["name"], m["version"]) == ("tiny-en-es", "0.0.1-test")
    assert (m["source_language"], m["target_language"]) == ("en", "es")
    assert m["vocab_size"] == tiny.tokenizer.vocab_size
    assert m["special_ids"] == {"pad": 0, "bos": 1, "eos": 2, "unk": 3}
    assert m["dims"]["d_model"] == 32 and m["dims"]["n_heads"] == 2 and m["dims"]["n_decoder_layers"] == 2
    assert m["max_source_tokens"] == MAX_SOURCE_TOKENS and m["max_length_cap"] == MAX_LENGTH_CAP
    assert m["max_beam_size"] == 8
    assert m["decoding"]["beam_size"] == 4 and m["decoding"]["length_penalty"] == 0.6
    assert m["opset"] == ox.OPSET
    assert m["onnxruntime_version"] == ort.__version__ and m["onnx_version"] == onnx.__version__
    assert set(m["variants"]) == {"fp32", "int8", "fp16"}
    on_disk = {str(p.relative_to(tiny.bundle)) for p in tiny.bundle.rglob("*") if p.is_file()}
    assert on_disk == set(m["files"]) | {"manifest.json"}
    for rel, entry in m["files"].items():
        assert sha256_file(tiny.bundle / rel) == entry["sha256"]
        assert (tiny.bundle / rel).stat().st_size == entry["bytes"]
    for variant, graphs in m["variants"].items():
        names = ("encoder", "decoder", "cache", "kv_rows", "kv_step")
        assert {g: graphs[g] for g in names} == {g: f"{variant}/{g}.onnx" for g in names}
    assert "per row" in m["variants"]["int8"]["precision"]
    assert "batch-invariant" in m["variants"]["int8"]["precision"]
    assert "bundle " in tiny.stdout.splitlines()[-1] and "parity fp32" in tiny.stdout.splitlines()[-1]


def test_graphs_pass_checker_and_have_expected_io(tiny: TinyBundle):
    for rel in json.loads((tiny.bundle / "manifest.json").read_text())["files"]:
        if rel.endswith(".onnx"):
            onnx.checker.check_model(str(tiny.bundle / rel), full_check=True)
    dec = session(tiny.bundle / "fp32" / "decoder.onnx")
    assert [i.name for i in dec.get_inputs()] == [
        *ox.decoder_input_names(2), "beam_scores", "num_candidates",
    ]  # fmt: skip
    assert [o.name for o in dec.get_outputs()] == [
        "log_probs",
        *ox.new_kv_names(2),
        "topk_scores",
        "topk_indices",
    ]
    enc = session(tiny.bundle / "fp32" / "encoder.onnx")
    assert [o.name for o in enc.get_outputs()] == ox.encoder_output_names(2)
    fp16 = session(tiny.bundle / "fp16" / "decoder.onnx")
    types = {i.name: i.type for i in fp16.get_inputs()}
    assert types["past_key_0"] == "tensor(float16)" and types["beam_scores"] == "tensor(float)"


def test_fp32_parity_recorded_in_manifest(tiny: TinyBundle):
    parity = json.loads((tiny.bundle / "manifest.json").read_text())["parity"]
    fp32 = parity["fp32"]
    assert fp32["step_logprob_max_abs"] <= 1e-4
    assert fp32["step_vs_full_pass_logprob_max_abs"] <= 1e-4
    assert fp32["top1_agreement"] == 1.0
    assert "step_logprob_max_abs" in parity["int8"]


def test_parity_on_varied_batch_and_kv_cache_equals_full_pass(tiny: TinyBundle):
    # Varied lengths in one padded batch, plus a source made only of padding-free single token.
    sources = tiny.tokenizer.encode_batch(TEXTS)
    p = verify.parity(
        tiny.model, tiny.bundle / "fp32" / "encoder.onnx", tiny.bundle / "fp32" / "decoder.onnx", sources
    )
    assert p["encoder_memory_max_abs"] <= 1e-4 and p["cross_kv_max_abs"] <= 1e-4
    assert p["step_logprob_max_abs"] <= 1e-4  # ORT step (own cache) vs decode_step (torch cache)
    assert p["step_vs_full_pass_logprob_max_abs"] <= 1e-4  # cached steps == recomputing the whole prefix
    assert p["top1_agreement"] == 1.0 and p["steps"] > 5


def test_topk_is_stable_descending_sort_of_beam_candidates(tiny: TinyBundle):
    """In-graph candidates == stable descending sort of beam_scores + log_probs over K * V, with ties
    (here: duplicated beams) going to the lower flat index, exactly as model/decode.py ranks them."""
    enc = session(tiny.bundle / "fp32" / "encoder.onnx")
    dec = session(tiny.bundle / "fp32" / "decoder.onnx")
    sources = tiny.tokenizer.encode_batch(TEXTS[:3])
    src = verify.pad_batch(sources)
    out = enc.run(None, {"src_ids": src})
    bias, cross = out[1], out[2:]
    k, n = 3, len(sources)
    ids = np.array([[1], [7], [7]] * n, dtype=np.int64)  # beams 1 and 2 identical -> exact ties
    scores = np.array([[0.0, -1.5, -1.5]] * n, dtype=np.float32)
    scores[1, 2] = -np.inf  # a dead beam
    feed = {"input_ids": ids, "position": np.array([0], dtype=np.int64), "src_bias": bias}
    feed.update(zip(ox.cross_names(2), cross, strict=True))
    feed.update({name: np.zeros((n * k, 2, 0, 16), np.float32) for name in ox.past_names(2)})
    feed |= {"beam_scores": scores, "num_candidates": np.array([2 * k], dtype=np.int64)}
    lp, *_, top_s, top_i = dec.run(None, feed)
    cand = (scores[:, :, None] + lp.reshape(n, k, -1)).reshape(n, -1)
    ref = np.argsort(-cand, axis=1, kind="stable")[:, : 2 * k]
    np.testing.assert_array_equal(top_i, ref)
    np.testing.assert_array_equal(top_s, np.take_along_axis(cand, ref, axis=1))
    assert np.allclose(lp.reshape(n, k, -1)[:, 1], lp.reshape(n, k, -1)[:, 2])


@pytest.mark.parametrize("vocab", [8000, 48, 37])
def test_chunked_topk_is_onnx_topk_ties_and_dead_candidates_included(vocab: int):
    """The two-stage candidate selection (chunk maxima, then the best chunks in index order) returns
    exactly what one ONNX TopK returns: the same scores and indices, ties to the lower index, -inf rows
    and k above the number of chunks included."""
    from onnx import TensorProto, helper, numpy_helper

    chunk = ox.topk_chunk(vocab)
    assert chunk and vocab % chunk == 0 and chunk <= ox.TOPK_CHUNK
    assert ox.topk_chunk(8191) == 0  # a prime vocabulary keeps the plain TopK
    nodes, inits = ox.chunked_topk_nodes("cand", "k", "scores", "indices", chunk)
    inits += [
        numpy_helper.from_array(np.array([0, -1], dtype=np.int64), "topk_rows_flat"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "topk_axis2"),
    ]
    ins = [
        helper.make_tensor_value_info("cand", TensorProto.FLOAT, ["B", "n"]),
        helper.make_tensor_value_info("k", TensorProto.INT64, [1]),
    ]
    outs = [
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("indices", TensorProto.INT64, None),
    ]
    plain = [helper.make_node("TopK", ["cand", "k"], ["scores", "indices"], axis=-1)]
    sessions = [
        ort.InferenceSession(
            helper.make_model(
                helper.make_graph(graph_nodes, "topk", ins, outs, graph_inits),
                opset_imports=[helper.make_opsetid("", ox.OPSET)],
            ).SerializeToString(),
            providers=["CPUExecutionProvider"],
        )
        for graph_nodes, graph_inits in ((plain, []), (nodes, inits))
    ]
    rng = np.random.default_rng(vocab)
    for _ in range(150):
        b, beams = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        n = beams * vocab
        k = int(rng.integers(1, min(n, 40) + 1))
        cand = rng.integers(-20, 5, (b, n)).astype(np.float32)  # few distinct values: many ties
        cand[rng.random((b, n)) < 0.3] = -np.inf
        cand[0, : n // 2] = -np.inf if rng.random() < 0.5 else cand[0, : n // 2]
        feed = {"cand": cand, "k": np.array([k], dtype=np.int64)}
        want, got = (s.run(None, feed) for s in sessions)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_spare_cache_capacity_is_ignored(tiny: TinyBundle):
    """Cache entries at index >= position (spare capacity, any finite values) do not change the step."""
    enc = session(tiny.bundle / "fp32" / "encoder.onnx")
    dec = session(tiny.bundle / "fp32" / "decoder.onnx")
    src = verify.pad_batch(tiny.tokenizer.encode_batch(TEXTS[:2]))
    out = enc.run(None, {"src_ids": src})
    rng = np.random.default_rng(0)
    past = [rng.standard_normal((2, 2, 5, 16)).astype(np.float32) for _ in range(4)]
    feed = {"input_ids": np.array([[7], [9]]), "position": np.array([5]), "src_bias": out[1]}
    feed |= dict(zip(ox.cross_names(2), out[2:], strict=True))
    feed |= {"beam_scores": np.zeros((2, 1), np.float32), "num_candidates": np.array([3])}
    exact = dec.run(None, feed | dict(zip(ox.past_names(2), past, strict=True)))
    spare = [
        np.concatenate([p, 1e3 * rng.standard_normal((2, 2, 11, 16)).astype(np.float32)], 2) for p in past
    ]
    padded = dec.run(None, feed | dict(zip(ox.past_names(2), spare, strict=True)))
    for a, b in zip(exact, padded, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_zero_length_source_row_is_finite(tiny: TinyBundle):
    enc = session(tiny.bundle / "fp32" / "encoder.onnx")
    out = enc.run(None, {"src_ids": np.array([[5, 6, 7], [0, 0, 0]], dtype=np.int64)})
    assert all(np.isfinite(x).all() for x in [out[0], *out[2:]])
    assert np.isneginf(out[1][0]).sum() == 0 and (out[1][1] == 0).all()  # all-pad rows attend everywhere


def test_cache_graphs_and_gemm_rewrite(tmp_path: Path):
    path = tmp_path / "cache.onnx"
    cache_graphs.make_cache_graph(path, 2, onnx.TensorProto.FLOAT)
    x = np.arange(24, dtype=np.float32).reshape(4, 1, 2, 3)
    n = np.arange(12, dtype=np.float32).reshape(4, 1, 1, 3) + 100
    idx = np.array([2, 2, 0], dtype=np.int64)
    y0, y1 = session(path).run(None, {"idx": idx, "x_0": x, "x_1": -x, "n_0": n, "n_1": n[:, :, :0]})
    np.testing.assert_array_equal(y0, np.concatenate([x, n], axis=2)[idx])  # reorder + append
    np.testing.assert_array_equal(y1, -x[idx])  # zero-length append: plain gather
    # kv_rows: rows of [a; b] fitted (sliced or zero-padded) to t_out slots, n[n_idx] written at pos.
    path = tmp_path / "kv_rows.onnx"
    cache_graphs.make_kv_rows_graph(path, 2, onnx.TensorProto.FLOAT)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 2, 5, 4)).astype(np.float32)
    b = rng.standard_normal((2, 2, 3, 4)).astype(np.float32)
    n = rng.standard_normal((3, 2, 1, 4)).astype(np.float32)
    idx, n_idx, pos = np.array([4, 0, 2, 3, 1]), np.array([0, 1, 2, 0, 1]), np.array([1, -1, 0, 7, 3])
    rows = session(path)
    for t_out in (2, 5, 8):
        feed = {"idx": idx, "n_idx": n_idx, "pos": pos, "t_out": np.array([t_out])}
        y0, y1 = rows.run(None, feed | {"a_0": a, "b_0": b, "n_0": n, "a_1": -a, "b_1": -b, "n_1": -n})
        want = np.zeros((5, 2, t_out, 4), dtype=np.float32)
        for m, r in enumerate(idx):
            src = a[r] if r < 3 else b[r - 3]
            keep = min(t_out, src.shape[1])
            want[m, :, :keep] = src[:, :keep]
            if 0 <= pos[m] < t_out:
                want[m, :, pos[m]] = n[n_idx[m], :, 0]
        np.testing.assert_array_equal(y0, want)
        np.testing.assert_array_equal(y1, -want)
    # kv_step: rows idx of a with n[idx] written at each row's slot (the [row, head, slot] list).
    path = tmp_path / "kv_step.onnx"
    cache_graphs.make_kv_step_graph(path, 2, onnx.TensorProto.FLOAT)
    idx, slot = np.array([2, 2, 0, 1]), np.array([4, 0, 3, 1])
    write = np.array([[m, h, slot[m]] for m in range(4) for h in range(2)], dtype=np.int64)
    y0, y1 = session(path).run(None, {"idx": idx, "write": write, "a_0": a, "n_0": n, "a_1": -a, "n_1": -n})
    want = a[idx].copy()
    want[np.arange(4), :, slot] = n[idx, :, 0]
    np.testing.assert_array_equal(y0, want)
    np.testing.assert_array_equal(y1, -want)
    # Gemm(transB) -> MatMul rewrite keeps the function (int8 quantization needs MatMul).
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    src = tmp_path / "gemm.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            lin, (torch.randn(2, 4),), str(src), input_names=["a"], output_names=["b"], dynamo=False
        )
    model = onnx.load(str(src))
    assert [n.op_type for n in model.graph.node] == ["Gemm"]
    rewritten = precision.gemm_to_matmul(model)
    assert [n.op_type for n in rewritten.graph.node] == ["MatMul", "Add"]
    a = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    got = ort.InferenceSession(rewritten.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"a": a}
    )
    np.testing.assert_allclose(got[0], lin(torch.from_numpy(a)).detach().numpy(), atol=1e-6)


def test_export_rejects_bad_arguments(tiny: TinyBundle, tmp_path: Path, capsys):
    assert export_main(["--checkpoint", str(tmp_path), "--out", str(tmp_path / "b")]) == 1
    assert "config.json" in capsys.readouterr().err
    args = ["--checkpoint", str(tiny.checkpoint), "--out", str(tmp_path / "b"), "--variants", "fp32,int4"]
    assert export_main(args) == 1
    assert "int4" in capsys.readouterr().err
    args = ["--checkpoint", str(tiny.checkpoint), "--out", str(tmp_path / "b"), "--max-source-tokens", "512"]
    assert export_main(args) == 1
    assert "max_positions" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


# ------------------------------------------------------------------------------ a pre-norm model (4+1)


@pytest.fixture(scope="module")
def pre_norm(tmp_path_factory: pytest.TempPathFactory) -> TinyBundle:
    return build_tiny_bundle(tmp_path_factory, norm_first=True)


def layer_norms(path: Path) -> int:
    return sum(n.op_type == "LayerNormalization" for n in onnx.load(str(path)).graph.node)


def test_a_pre_norm_model_exports_with_its_final_layer_norms_and_parity(pre_norm: TinyBundle):
    m = json.loads((pre_norm.bundle / "manifest.json").read_text())
    assert m["dims"]["norm_first"] is True
    assert (m["dims"]["n_encoder_layers"], m["dims"]["n_decoder_layers"]) == (4, 1)
    assert pre_norm.model.config.norm_first  # load_release of the checkpoint's config.json
    # A LayerNorm per sublayer plus the stack's final one: 2 * 4 + 1 in the encoder, 3 * 1 + 1 in the step.
    fp32 = pre_norm.bundle / "fp32"
    assert (layer_norms(fp32 / "encoder.onnx"), layer_norms(fp32 / "decoder.onnx")) == (9, 4)
    assert (
        m["parity"]["fp32"]["step_logprob_max_abs"] <= 1e-4 and m["parity"]["fp32"]["top1_agreement"] == 1.0
    )
    assert m["parity"]["int8"]["top1_agreement"] >= 0.5  # int8: the same MatMuls quantized as in post-norm
    p = verify.parity(
        pre_norm.model, fp32 / "encoder.onnx", fp32 / "decoder.onnx", pre_norm.tokenizer.encode_batch(TEXTS)
    )
    assert p["encoder_memory_max_abs"] <= 1e-4 and p["cross_kv_max_abs"] <= 1e-4
    assert p["step_logprob_max_abs"] <= 1e-4 and p["step_vs_full_pass_logprob_max_abs"] <= 1e-4
    assert p["top1_agreement"] == 1.0 and p["steps"] > 5


def assert_engine_decodes_as_the_reference(model: Transformer, tokenizer: Tokenizer, bundle: Path) -> None:
    """Greedy and beam outputs of the engine on `bundle` equal model/decode.py's with `model`, on the plain
    path and with the K/V kept on the device by the cache / kv_rows / kv_step graphs."""
    from model.decode import beam_search, max_output_length
    from server.engine import DecodingOptions, Engine

    ids = tokenizer.encode_batch(TEXTS)
    limits = torch.tensor([max_output_length(len(s), cap=MAX_LENGTH_CAP) for s in ids])
    greedy_ref = greedy_decode(model, batch(ids), limits)
    assert len({len(h) for h in greedy_ref}) >= 3  # not degenerate: varied lengths
    beam_ref = beam_search(model, batch(ids), 3, limits, 0.6, n_best=2)
    for io_binding in (False, True):
        engine = Engine(bundle, intra_op_threads=1, io_binding=io_binding)
        assert [r[0].tokens for r in engine.translate(TEXTS, DecodingOptions(beam_size=1))] == greedy_ref
        beams = engine.translate(TEXTS, DecodingOptions(beam_size=3, num_hypotheses=2))
        for got, want in zip(beams, beam_ref, strict=True):
            assert [h.tokens for h in got] == [t for t, _ in want]
            np.testing.assert_allclose([h.score for h in got], [s for _, s in want], atol=1e-4)


def test_a_pre_norm_bundle_decodes_through_the_engine_as_the_reference_decoders(pre_norm: TinyBundle):
    """The engine reads graphs only, whatever the layer-norm placement."""
    assert_engine_decodes_as_the_reference(pre_norm.model, pre_norm.tokenizer, pre_norm.bundle)
