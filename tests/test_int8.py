"""export/int8.py: the integer GEMM graphs compute exactly the quantized product, per row, on any CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export.int8 import (
    ACTIVATION_LEVELS,
    SCALE_EPS,
    WEIGHT_LEVELS,
    ZERO_POINT,
    quantize_int8,
    quantize_weight,
)


def _graph(path: Path, weights: dict[str, np.ndarray], bias: np.ndarray | None = None) -> None:
    """x (M, K) -> one MatMul per weight (the first with an optional bias Add) -> outputs y0, y1, ..."""
    k = next(iter(weights.values())).shape[0]
    nodes, outs, inits = [], [], []
    for j, (name, w) in enumerate(weights.items()):
        inits.append(numpy_helper.from_array(w, name))
        out = f"y{j}"
        if j == 0 and bias is not None:
            inits.append(numpy_helper.from_array(bias, "b"))
            nodes += [
                helper.make_node("MatMul", ["x", name], ["mm"]),
                helper.make_node("Add", ["mm", "b"], [out]),
            ]
        else:
            nodes.append(helper.make_node("MatMul", ["x", name], [out]))
        outs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, ["M", w.shape[1]]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], outs, inits), opset_imports=[helper.make_opsetid("", 17)]
    )
    onnx.save(model, str(path))


def _run(path: Path, x: np.ndarray) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})


def _reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The exact integer computation the graph stands for, in numpy (int64: no saturation anywhere)."""
    scale = np.abs(x).max(axis=-1, keepdims=True).astype(np.float32) * np.float32(1 / ACTIVATION_LEVELS)
    scale = scale + np.float32(SCALE_EPS)
    xq = np.floor(x / scale + np.float32(ZERO_POINT + 0.5)).astype(np.int64) - ZERO_POINT
    wq, ws = quantize_weight(w)
    return (xq @ wq.astype(np.int64)).astype(np.float32) * ws * scale


def test_weights_are_7_bit_per_column():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 16)).astype(np.float32)
    w[:, 3] = 0.0
    q, s = quantize_weight(w)
    assert q.dtype == np.int8 and q.shape == w.shape and s.shape == (16,)
    assert np.abs(q).max() == WEIGHT_LEVELS
    assert (np.abs(q).max(axis=0)[[0, 1, 2, 4]] == WEIGHT_LEVELS).all()  # every column uses its range
    assert (q[:, 3] == 0).all() and s[3] == 1.0
    assert np.abs(q * s - w).max() <= s.max() / 2 + 1e-6


def test_graph_matches_the_exact_integer_product_even_where_avx2_would_saturate(tmp_path: Path):
    # Adjacent inputs at full scale times adjacent weights at full scale: with 8-bit weights, AVX2's
    # vpmaddubsw would saturate its int16 pair sums (255*127*2 > 32767) and return wrong values.
    rng = np.random.default_rng(1)
    k, n = 128, 48
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    w[:, :8] = np.abs(w[:, :8]).max()  # columns quantized to +63 everywhere
    x = rng.standard_normal((5, k)).astype(np.float32)
    x[0] = np.abs(x[0]).max()  # a row at +127 everywhere
    x[1] = 0.0  # an all-zero row: tiny scale, no NaN
    _graph(tmp_path / "fp32.onnx", {"w": w})
    stats = quantize_int8(tmp_path / "fp32.onnx", tmp_path / "int8.onnx")
    assert stats == {"quantized": 1, "activations": 1, "bias_added": 0, "folded": 0}
    (got,) = _run(tmp_path / "int8.onnx", x)
    want = _reference(x, w)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert (got[1] == 0).all()
    exact = x @ w
    assert np.abs(got - exact).max() <= 0.03 * np.abs(exact).max()  # and close to the float product


def test_rows_are_independent_of_their_batch_mates(tmp_path: Path):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    _graph(tmp_path / "fp32.onnx", {"w": w})
    quantize_int8(tmp_path / "fp32.onnx", tmp_path / "int8.onnx")
    x = rng.standard_normal((6, 64)).astype(np.float32)
    x[2] *= 1000.0  # one loud row must not coarsen the others' quantization
    (batch,) = _run(tmp_path / "int8.onnx", x)
    for i in range(len(x)):
        (alone,) = _run(tmp_path / "int8.onnx", x[i : i + 1])
        assert np.array_equal(alone[0], batch[i])


def test_shared_input_is_quantized_once_and_bias_is_kept(tmp_path: Path):
    rng = np.random.default_rng(3)
    ws = {f"w{j}": rng.standard_normal((32, 16)).astype(np.float32) for j in range(3)}
    bias = rng.standard_normal(16).astype(np.float32)
    _graph(tmp_path / "fp32.onnx", ws, bias)
    stats = quantize_int8(tmp_path / "fp32.onnx", tmp_path / "int8.onnx")
    assert stats == {"quantized": 3, "activations": 1, "bias_added": 1, "folded": 0}
    ops = [n.op_type for n in onnx.load(str(tmp_path / "int8.onnx")).graph.node]
    assert ops.count("ReduceMax") == 1 and ops.count("MatMulIntegerToFloat") == 3 and "MatMul" not in ops
    x = rng.standard_normal((4, 32)).astype(np.float32)
    got = _run(tmp_path / "int8.onnx", x)
    for j, w in enumerate(ws.values()):
        want = _reference(x, w) + (bias if j == 0 else 0)
        np.testing.assert_allclose(got[j], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(3, 64), (2, 5, 64)])
def test_any_leading_shape(tmp_path: Path, shape: tuple[int, ...]):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 8)).astype(np.float32)
    _graph(tmp_path / "fp32.onnx", {"w": w})
    m = onnx.load(str(tmp_path / "fp32.onnx"))
    m.graph.input[0].CopyFrom(
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [None] * (len(shape) - 1) + [64])
    )
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y0", TensorProto.FLOAT, None))
    onnx.save(m, str(tmp_path / "fp32.onnx"))
    quantize_int8(tmp_path / "fp32.onnx", tmp_path / "int8.onnx")
    x = rng.standard_normal(shape).astype(np.float32)
    (got,) = _run(tmp_path / "int8.onnx", x)
    np.testing.assert_allclose(got, _reference(x, w), rtol=1e-5, atol=1e-5)
