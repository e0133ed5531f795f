"""int8 with static per-channel activation scales: the ranges measured on valid (export/calibrate.py),
the graphs built from them (export/int8.py), and the export choosing them (export/build.py)."""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from export.__main__ import main as export_main
from export.calibrate import RANGES_FILE, load_ranges, measure_ranges, write_ranges
from export.int8 import (
    ACTIVATION_LEVELS,
    OUTPUT_PROJECTION,
    ZERO_POINT,
    channel_scales,
    quantize_int8,
    quantize_weight,
    range_key,
    scale_folds,
)
from export.onnx_export import export_decoder
from model.tokenizer import Tokenizer
from model.train import save_release
from tests.test_export import TOKENIZER, tiny_model
from tests.test_int8 import _graph, _run

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _static_reference(
    x: np.ndarray, w: np.ndarray, ranges: np.ndarray, rows: np.ndarray, zero_point: int = ZERO_POINT
) -> np.ndarray:
    """The integer computation the static graph stands for, in numpy (int64; only uint8 saturates).
    rows: the largest |weight| of each input channel over the layers reading x. zero_point 0: a Relu's
    input, which the quantizer's saturation at 0 rectifies."""
    a = channel_scales(ranges, rows)
    scaled = x * (1.0 / a).astype(np.float32)
    xq = np.clip(np.rint(scaled) + zero_point, 0, 255).astype(np.int64) - zero_point  # rint: half to even
    wq, ws = quantize_weight(w.astype(np.float64) * a[:, None])
    return (xq @ wq.astype(np.int64)).astype(np.float32) * ws


def test_range_keys_name_the_model_layers():
    assert range_key("m.decoder_layers.0.ffn.fc1.weight_matmul_t") == "decoder_layers.0.ffn.fc1"
    assert range_key("decoder_layers.2.self_attn.qkv.weight") == "decoder_layers.2.self_attn.qkv"
    assert range_key("onnx::MatMul_398") == OUTPUT_PROJECTION
    assert range_key("embed.weight_matmul_t") == OUTPUT_PROJECTION


def test_static_graph_is_the_exact_integer_product_and_saturates_out_of_range(tmp_path: Path):
    rng = np.random.default_rng(5)
    k, n = 64, 24
    w = rng.standard_normal((k, n)).astype(np.float32)
    ranges = np.abs(rng.standard_normal(k)) + 0.5
    ranges[7] = 40.0  # an outlier channel, as layer-norm outputs have: the others keep their resolution
    _graph(tmp_path / "fp32.onnx", {"w": w})
    stats = quantize_int8(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", {"w": ranges})
    assert stats == {"quantized": 1, "activations": 1, "bias_added": 0, "folded": 0}
    x = (rng.standard_normal((6, k)) * ranges * 0.5).astype(np.float32)
    x[3, 0] = 10 * ranges[0]  # beyond the measured range: clipped to the largest level, not wrapped
    (got,) = _run(tmp_path / "int8.onnx", x)
    want = _static_reference(x, w, ranges, np.abs(w).max(axis=1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    fine = [i for i in range(len(x)) if i != 3]
    exact = x[fine] @ w
    assert np.abs(got[fine] - exact).max() <= 0.03 * np.abs(exact).max()
    # a fixed scale: a row's result is the same alone and in any batch
    for i in range(len(x)):
        (alone,) = _run(tmp_path / "int8.onnx", x[i : i + 1])
        assert np.array_equal(alone[0], got[i])


def test_static_shared_input_is_quantized_once_with_the_bias_inside_the_product(tmp_path: Path):
    rng = np.random.default_rng(6)
    ws = {f"w{j}": rng.standard_normal((32, 16)).astype(np.float32) for j in range(3)}
    bias = rng.standard_normal(16).astype(np.float32)
    ranges = {name: np.abs(rng.standard_normal(32)) + 0.2 for name in ws}
    _graph(tmp_path / "fp32.onnx", ws, bias)
    stats = quantize_int8(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", ranges)
    assert stats == {"quantized": 3, "activations": 1, "bias_added": 1, "folded": 0}
    ops = [node.op_type for node in onnx.load(str(tmp_path / "int8.onnx")).graph.node]
    assert ops.count("QuantizeLinear") == 1 and ops.count("MatMulIntegerToFloat") == 3
    assert {"MatMul", "Add", "ReduceMax", "Div"}.isdisjoint(ops)
    joined = np.maximum.reduce(list(ranges.values()))  # one activation, one scale: the readers' max
    rows = np.maximum.reduce([np.abs(w).max(axis=1) for w in ws.values()])
    x = (rng.standard_normal((4, 32)) * 0.5).astype(np.float32)
    got = _run(tmp_path / "int8.onnx", x)
    for j, w in enumerate(ws.values()):
        want = _static_reference(x, w, joined, rows) + (bias if j == 0 else 0)
        np.testing.assert_allclose(got[j], want, rtol=1e-5, atol=1e-5)


def _ffn_graph(path: Path, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray) -> None:
    """x -> MatMul(w1) -> Add(b1) -> Relu -> MatMul(w2) -> y: the Transformer's feed-forward sublayer."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["mm1"]),
        helper.make_node("Add", ["mm1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    inits = [numpy_helper.from_array(a, n) for n, a in (("w1", w1), ("b1", b1), ("w2", w2))]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", w1.shape[0]])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", w2.shape[1]])
    graph = helper.make_graph(nodes, "ffn", [x], [y], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_the_scale_of_a_relu_activation_is_folded_into_the_product_before_it(tmp_path: Path):
    rng = np.random.default_rng(8)
    w1 = rng.standard_normal((32, 64)).astype(np.float32)
    b1 = rng.standard_normal(64).astype(np.float32)
    w2 = (rng.standard_normal((64, 16)) * 0.2).astype(np.float32)
    x = (rng.standard_normal((5, 32)) * (np.abs(rng.standard_normal(32)) + 0.5)).astype(np.float32)
    ranges = {"w1": np.abs(x).max(axis=0), "w2": np.maximum(x @ w1 + b1, 0).max(axis=0)}  # "calibrated" on x
    _ffn_graph(tmp_path / "fp32.onnx", w1, b1, w2)
    stats = quantize_int8(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", ranges)
    assert stats == {"quantized": 2, "activations": 2, "bias_added": 1, "folded": 1}
    graph = onnx.load(str(tmp_path / "int8.onnx")).graph
    ops = [node.op_type for node in graph.node]
    # x's quantizer keeps its Mul; relu(h)'s 1 / a rides in fc1's column scales and bias, and the Relu
    # is the second quantizer's saturation at its zero point 0
    assert ops == ["Mul", "QuantizeLinear", "MatMulIntegerToFloat", "QuantizeLinear", "MatMulIntegerToFloat"]
    x[0] *= 2.5  # past the calibrated range: relu(h) / a now goes beyond 127 (up to 255)
    (got,) = _run(tmp_path / "int8.onnx", x)
    # the integer computation without the fold: relu(fc1) rescaled by 1 / a, then quantized (numpy)
    h = _static_reference(x, w1, ranges["w1"], np.abs(w1).max(axis=1)) + b1
    want = _static_reference(np.maximum(h, 0), w2, ranges["w2"], np.abs(w2).max(axis=1), zero_point=0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=0.02 * np.abs(want).max())
    a2 = channel_scales(ranges["w2"], np.abs(w2).max(axis=1))
    assert (np.maximum(h[0], 0) / a2).max() > 140  # the row really reaches past the old limit
    x = x[1:]
    (got,) = _run(tmp_path / "int8.onnx", x)
    exact = np.maximum(x @ w1 + b1, 0) @ w2
    assert np.abs(got - exact).max() <= 0.05 * np.abs(exact).max()
    for i in range(len(x)):  # still batch-invariant
        (alone,) = _run(tmp_path / "int8.onnx", x[i : i + 1])
        assert np.array_equal(alone[0], got[i])


def _norm_graph(path: Path, gamma: np.ndarray, beta: np.ndarray, ws: dict, residual: bool) -> None:
    """x -> LayerNormalization -> n -> MatMul(w) per weight (-> y_w); residual: y = n + MatMul(n, w0)."""
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5)]
    nodes += [helper.make_node("MatMul", ["n", name], [f"y_{name}"]) for name in ws]
    outs = [f"y_{name}" for name in ws]
    if residual:
        nodes.append(helper.make_node("Add", ["n", outs[0]], ["res"]))
        outs[0] = "res"
    inits = [numpy_helper.from_array(a, n) for n, a in (("gamma", gamma), ("beta", beta), *ws.items())]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", gamma.size])
    ys = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs]
    graph = helper.make_graph(nodes, "norm", [x], ys, inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.mark.parametrize("residual", [False, True])
def test_the_scale_of_a_norm_read_only_by_products_is_folded_into_the_norm(tmp_path: Path, residual: bool):
    """A layer norm's output read by constant-weight products only (the last decoder layer's before the
    output projection, the encoder's last before the cross-attention K/V) carries its 1 / a in gamma and
    beta: no Mul. One a residual also reads keeps its Mul."""
    rng = np.random.default_rng(9)
    d = 32
    gamma = (rng.standard_normal(d) + 1.0).astype(np.float32)
    gamma[3] = 8.0  # an outlier channel
    beta = (rng.standard_normal(d) * 0.3).astype(np.float32)
    ws = {f"w{j}": rng.standard_normal((d, d)).astype(np.float32) for j in range(2)}
    x = (rng.standard_normal((6, d)) * 3 + 1).astype(np.float32)
    mean, var = x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)
    n = ((x - mean) / np.sqrt(var + 1e-5) * gamma + beta).astype(np.float32)
    ranges = {name: np.abs(n).max(axis=0) for name in ws}
    _norm_graph(tmp_path / "fp32.onnx", gamma, beta, ws, residual)
    stats = quantize_int8(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", ranges)
    assert stats["folded"] == (0 if residual else 1)
    model = onnx.load(str(tmp_path / "int8.onnx"))
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("Mul") == (1 if residual else 0) and ops.count("QuantizeLinear") == 1
    assert ops.count("LayerNormalization") == 1
    names = {t.name for t in model.graph.initializer}
    assert ("gamma" in names) == residual  # a replaced gamma and beta do not stay behind
    got = _run(tmp_path / "int8.onnx", x)
    rows = np.maximum.reduce([np.abs(w).max(axis=1) for w in ws.values()])
    joined = np.maximum.reduce(list(ranges.values()))
    for j, w in enumerate(ws.values()):
        want = _static_reference(n, w, joined, rows) + (n if residual and j == 0 else 0)
        # the fold rounds gamma / a instead of LN(x) * (1 / a): a level apart at most, rarely
        assert np.abs(got[j] - want).max() <= 2 * np.abs(quantize_weight(w * 1.0)[1]).max() * joined.max()
        assert np.abs(got[j] - want).mean() <= 1e-3 * np.abs(want).max()
    for i in range(len(x)):  # still batch-invariant
        alone = _run(tmp_path / "int8.onnx", x[i : i + 1])
        assert all(np.array_equal(a[0], g[i]) for a, g in zip(alone, got, strict=True))


def test_the_attention_scale_in_the_queries_leaves_the_integer_weights_as_trained(tmp_path: Path):
    """The export multiplies the query columns by 1/sqrt(Dh) (no score is scaled in the graph) and records
    it; int8's SmoothQuant reads those columns as trained, so with Dh a power of 4 the integer weights are
    those of the trained weights and only the query columns' scales and bias carry the factor."""
    model = tiny_model(48, seed=3)
    d, dh = model.config.d_model, model.config.d_model // model.config.n_heads
    export_decoder(model, tmp_path / "decoder.onnx")
    raw = onnx.load(str(tmp_path / "decoder.onnx"))
    folds = scale_folds(raw)
    n, m = model.config.n_decoder_layers, model.config.n_encoder_layers
    want = {f"decoder_layers.{i}.{a}" for i in range(n) for a in ("self_attn.qkv", "cross_attn.q")}
    assert set(folds) == want | {f"encoder_layers.{i}.self_attn.qkv" for i in range(m)}
    assert all(f == [0, d, 1 / dh**0.5] for f in folds.values())
    rng = np.random.default_rng(4)
    linears = [(k, mod.in_features) for k, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)]
    ranges = {key: np.abs(rng.standard_normal(k)) + 0.5 for key, k in linears}
    ranges[OUTPUT_PROJECTION] = np.abs(rng.standard_normal(d)) + 0.5
    quantize_int8(tmp_path / "decoder.onnx", tmp_path / "int8.onnx", ranges)
    inits = {
        t.name: numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / "int8.onnx")).graph.initializer
    }
    trained = model.decoder_layers[0].self_attn.qkv  # its input (the embeddings) feeds no other GEMM
    w = trained.weight.detach().numpy().T.astype(np.float64)  # (K, N) as trained, no fold
    a = channel_scales(ranges["decoder_layers.0.self_attn.qkv"], np.abs(w).max(axis=1))
    wq, ws = quantize_weight(w * a[:, None])
    (got_wq,) = [
        v for k, v in inits.items() if "decoder_layers.0.self_attn.qkv" in k and k.endswith("_int8_w")
    ]
    (got_ws,) = [
        v for k, v in inits.items() if "decoder_layers.0.self_attn.qkv" in k and k.endswith("_int8_s")
    ]
    np.testing.assert_array_equal(got_wq, wq)
    np.testing.assert_array_equal(got_ws[:d], ws[:d] / dh**0.5)  # a power of 2: exact
    np.testing.assert_array_equal(got_ws[d:], ws[d:])


def test_ranges_that_do_not_fit_the_graph_are_refused(tmp_path: Path):
    w = np.ones((16, 4), np.float32)
    _graph(tmp_path / "fp32.onnx", {"w": w})
    with pytest.raises(ValueError, match=r"w \(missing\)"):
        quantize_int8(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", {"other": np.ones(16)})
    with pytest.raises(ValueError, match="8 channels, weight has 16"):
        quantize_int8(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", {"w": np.ones(8)})


def test_quiet_channels_get_a_floor_and_scales_cover_the_range():
    a = channel_scales(np.array([0.0, 1e-9, 2.0, 100.0]))
    assert (a > 0).all() and a[0] == a[1] == pytest.approx(1.0 / ACTIVATION_LEVELS)  # 1% of 100
    assert a[3] * ACTIVATION_LEVELS == pytest.approx(100.0)
    assert (channel_scales(np.zeros(4)) > 0).all()
    # with weights: no channel's range / scale passes 127 (nothing measured saturates), and the loud
    # channel's scale grows by less than its range (part of it moves into the weight's row)
    r, rows = np.array([1.0, 1.0, 30.0]), np.array([0.5, 0.2, 0.4])
    a = channel_scales(r, rows)
    assert (r / a).max() == pytest.approx(ACTIVATION_LEVELS) and (r / a <= ACTIVATION_LEVELS + 1e-9).all()
    assert a[2] / a[0] < 30.0


def _tiny():
    tokenizer = Tokenizer(TOKENIZER)
    return tiny_model(tokenizer.vocab_size, seed=3), tokenizer


def test_measured_ranges_cover_every_layer_and_leave_padding_out():
    model, tokenizer = _tiny()
    texts = [
        ("Open the file.", "Abrir el archivo."),
        ("Cancel", "Cancelar"),
        ("Save all documents now?", "¿Guardar?"),
    ]
    pairs = [(tokenizer.encode(a), tokenizer.encode(b)) for a, b in texts]
    batched = measure_ranges(model, pairs, batch_size=8)
    linears = {name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(batched) == linears | {OUTPUT_PROJECTION}
    assert batched["encoder_layers.0.ffn.fc2"].shape == (model.config.d_ff,)
    alone = [measure_ranges(model, [p], batch_size=1) for p in pairs]  # no padding at all
    for name, r in batched.items():
        np.testing.assert_allclose(r, np.maximum.reduce([a[name] for a in alone]), rtol=1e-5, atol=1e-6)


def _corpus(root: Path) -> Path:
    data = root / "data"
    data.mkdir()
    pairs = [("Open the file.", "Abrir el archivo."), ("Cancel", "Cancelar"), ("Settings", "Configuración")]
    (data / "valid.en").write_text("".join(f"{a}\n" for a, _ in pairs * 4), encoding="utf-8")
    (data / "valid.es").write_text("".join(f"{b}\n" for _, b in pairs * 4), encoding="utf-8")
    return data


def _export(checkpoint: Path, out: Path) -> dict:
    buf = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        warnings.simplefilter("ignore")
        rc = export_main(
            ["--checkpoint", str(checkpoint), "--out", str(out), "--variants", "fp32,int8",
             "--max-source-tokens", "24", "--max-length-cap", "40", "--parity-sentences", "4"]
        )  # fmt: skip
    assert rc == 0, buf.getvalue()
    return json.loads((out / "manifest.json").read_text(encoding="utf-8"))


def test_export_uses_the_ranges_of_these_weights_and_falls_back_without_them(tmp_path: Path):
    model, tokenizer = _tiny()
    checkpoint = tmp_path / "tiny"
    save_release(model, checkpoint, tokenizer, {"best": {"step": 0}})
    assert load_ranges(checkpoint)[0] is None

    path = write_ranges(checkpoint, _corpus(tmp_path), n=100, seed=1)
    report = json.loads(path.read_text(encoding="utf-8"))
    assert path.name == RANGES_FILE and report["split"] == "valid" and report["pairs"] == 12
    ranges, where = load_ranges(checkpoint)
    assert ranges is not None and where == str(path)

    m = _export(checkpoint, tmp_path / "bundle")
    assert "fixed per-channel scales" in m["variants"]["int8"]["precision"]
    assert m["int8_activation_scales"] == str(path)
    assert m["parity"]["int8"]["top1_agreement"] >= 0.5
    dec = onnx.load(str(tmp_path / "bundle" / "int8" / "decoder.onnx"))
    ops = [node.op_type for node in dec.graph.node if not node.name.startswith("topk/")]
    assert "QuantizeLinear" in ops and "ReduceMax" not in ops  # no per-row scales (candidate selection aside)

    # retrained weights: the file is stale, the export says so and quantizes per row at run time
    with torch.no_grad():
        model.embed.weight.mul_(1.01)
    save_release(model, checkpoint, tokenizer, {"best": {"step": 1}})
    ranges, why = load_ranges(checkpoint)
    assert ranges is None and "stale" in why
    m = _export(checkpoint, tmp_path / "bundle2")
    assert "per row" in m["variants"]["int8"]["precision"]
    assert m["int8_activation_scales"].startswith("per row at run time")


def test_calibrate_names_what_is_missing(tmp_path: Path, capsys):
    from export.calibrate import main

    for argv, why in (
        (["--checkpoint", str(tmp_path), "--data", str(tmp_path)], "no model.safetensors"),
        (["--checkpoint", str(Path(TOKENIZER).parent), "--data", str(tmp_path)], "make corpus"),
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and why in capsys.readouterr().err
