"""int8 variant: integer GEMMs with activations quantized per row (per token), weights per column.

Every MatMul with a constant (K, N) weight (the tied output projection included, via `gemm_to_matmul`)
becomes

    scale = max|x_row| / 127 + eps                      (M, 1)   Abs, ReduceMax, Mul, Add
    x_q   = round(x / scale) + 128  as uint8            (M, K)   Div, Add, Cast (floor of +128.5)
    y     = (x_q - 128) @ w_q * w_scale * scale (+ b)   (M, N)   MatMulIntegerToFloat, Mul, [Add]

with `w_q` int8 and one scale per output column. The quantized activation of an input shared by several
weights (the encoder's cross-attention K/V projections) is computed once.

Why per row: ONNX Runtime's own dynamic quantization (DynamicQuantizeLinear, DynamicQuantizeMatMul) has
one activation scale for the whole tensor, i.e. for all rows of the batch, so a sentence's output would
depend on its batch mates. Here every row has its own scale, so outputs are batch-invariant, and the
products run in ONNX Runtime's u8 x s8 integer kernels (MLAS: AVX2 vpmaddubsw, AVX-VNNI / AVX512-VNNI
vpdpbusd, AMX where present), like CTranslate2's int8 GEMMs.

Why 7-bit weights (|w_q| <= 63): AVX2's vpmaddubsw adds two u8 x s8 products into a saturating int16;
with 8-bit weights 255 * 127 * 2 overflows it and the results are wrong on AVX2 only (measured: 16% max
relative error on a random 256x1024 product, against 1.3% with 7-bit weights). 63 keeps every pair sum
below 2^15 on every CPU, so all machines compute the same integers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from export.precision import gemm_to_matmul, replace_nodes

WEIGHT_LEVELS = 63  # 7-bit symmetric weights: no int16 saturation in AVX2 u8 x s8 kernels
ACTIVATION_LEVELS = 127  # 8-bit activations, stored as uint8 with zero point 128
ZERO_POINT = 128
SCALE_EPS = 1e-12  # an all-zero row gets a tiny scale instead of a division by zero

DESCRIPTION = (
    "int8 integer GEMMs (MatMulIntegerToFloat): activations quantized per row (per token, 8-bit), "
    "weights per output channel (7-bit symmetric); batch-invariant; float32 K/V cache"
)

QUANT_CONSTANTS = {
    "int8_inv_levels": np.array([1.0 / ACTIVATION_LEVELS], np.float32),
    "int8_eps": np.array([SCALE_EPS], np.float32),
    "int8_offset": np.array([ZERO_POINT + 0.5], np.float32),
    "int8_zero_point": np.array(ZERO_POINT, np.uint8),
    "int8_one": np.array(1.0, np.float32),
}


def quantize_weight(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-column quantization of a (K, N) weight: int8 values in [-63, 63] and (N,) scales."""
    w64 = w.astype(np.float64)
    scale = np.abs(w64).max(axis=0) / WEIGHT_LEVELS
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(w64 / scale), -WEIGHT_LEVELS, WEIGHT_LEVELS).astype(np.int8)
    return q, scale.astype(np.float32)


def row_quantizer(x: str) -> tuple[list[onnx.NodeProto], str, str]:
    """Nodes quantizing activation `x` per row: (nodes, uint8 tensor name, (M, 1) scale name)."""
    p = f"{x}_int8"
    nodes = [
        helper.make_node("Abs", [x], [f"{p}_abs"]),
        helper.make_node("ReduceMax", [f"{p}_abs"], [f"{p}_amax"], axes=[-1], keepdims=1),
        helper.make_node("Mul", [f"{p}_amax", "int8_inv_levels"], [f"{p}_s"]),
        helper.make_node("Add", [f"{p}_s", "int8_eps"], [f"{p}_scale"]),
        helper.make_node("Div", [x, f"{p}_scale"], [f"{p}_div"]),
        # x / scale lies in [-127, 127]; + 128.5 then truncation is round-half-up into [1, 255]
        helper.make_node("Add", [f"{p}_div", "int8_offset"], [f"{p}_shift"]),
        helper.make_node("Cast", [f"{p}_shift"], [f"{p}_u8"], to=TensorProto.UINT8),
    ]
    return nodes, f"{p}_u8", f"{p}_scale"


def quantize_int8(src: Path, dst: Path) -> dict[str, int]:
    """Write the int8 version of the fp32 graph `src` to `dst` (see the module docstring).

    A bias Add that follows a quantized MatMul is kept after the row rescale. Returns
    {"quantized": matmuls, "activations": distinct quantized inputs, "bias_added": biases}."""
    model = gemm_to_matmul(onnx.load(str(src)))
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in g.output}
    g.initializer.extend(numpy_helper.from_array(v, k) for k, v in QUANT_CONSTANTS.items())
    quantized: dict[str, tuple[str, str]] = {}  # activation -> (uint8 tensor, row scale)
    new_nodes: list[onnx.NodeProto] = []
    dropped: set[int] = set()
    stats = {"quantized": 0, "activations": 0, "bias_added": 0}
    for node in g.node:
        if id(node) in dropped:
            continue
        w_init = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if w_init is None or len(w_init.dims) != 2:
            new_nodes.append(node)
            continue
        x = node.input[0]
        if x not in quantized:
            nodes, xq, sa = row_quantizer(x)
            new_nodes += nodes
            quantized[x] = (xq, sa)
            stats["activations"] += 1
        xq, sa = quantized[x]
        wq, ws = quantize_weight(numpy_helper.to_array(w_init))
        base = f"{node.input[1]}_int8"
        g.initializer.extend(
            [numpy_helper.from_array(wq, f"{base}_w"), numpy_helper.from_array(ws, f"{base}_s")]
        )
        out, bias = node.output[0], None
        users = consumers.get(out, [])
        if len(users) == 1 and users[0].op_type == "Add" and out not in graph_outputs:
            add = users[0]
            other = add.input[1] if add.input[0] == out else add.input[0]
            b = inits.get(other)
            if b is not None and tuple(b.dims) == (wq.shape[1],):
                bias, out = other, add.output[0]
                dropped.add(id(add))
        # (x_q - 128) @ w_q * 1.0 * w_scale: the per-row scale is not an input this op takes
        new_nodes.append(
            helper.make_node(
                "MatMulIntegerToFloat",
                [xq, f"{base}_w", "int8_one", f"{base}_s", "int8_zero_point"],
                [f"{base}_acc"],
                name=f"{node.name or base}_int8",
                domain="com.microsoft",
            )
        )
        if bias is None:
            new_nodes.append(helper.make_node("Mul", [f"{base}_acc", sa], [out]))
        else:
            new_nodes.append(helper.make_node("Mul", [f"{base}_acc", sa], [f"{base}_rows"]))
            new_nodes.append(helper.make_node("Add", [f"{base}_rows", bias], [out]))
            stats["bias_added"] += 1
        stats["quantized"] += 1
    replace_nodes(g, new_nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(dst))
    return stats
