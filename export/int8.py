"""int8 variant: integer GEMMs, weights quantized per output column, activations in one of two ways.

**Static per-channel activation scales** (when the model has `int8_ranges.json`, export/calibrate.py):
every MatMul with a constant (K, N) weight becomes

    x_q = QuantizeLinear(x * (1 / a), 1, 128)           (M, K)   Mul, QuantizeLinear (round, saturate)
    y   = (x_q - 128) @ w_q * w_scale (+ b)              (M, N)   MatMulIntegerToFloat (bias inside)

where a_k is channel k's scale, from the range of channel k measured on the valid split and the
weights' row k (`channel_scales`), and w_q quantizes diag(a) W per column, so the product needs no
activation scale of its own. Three nodes per GEMM instead of ten (a decoder step at batch 1 runs 169
nodes instead of 322; README, Performance, for the time). Per-channel because a few channels of the
layer-norm outputs run 5-10x larger than the rest (a per-tensor scale would leave the others a handful
of levels). A fixed scale computes the same thing for a row alone or in any batch. Where the activation
is the FFN's relu(fc1(x)), its 1 / a is folded into fc1's column scales and bias (`relu_folds`) and the
Relu into the quantizer (zero point 0: QuantizeLinear saturates at 0), so fc2's quantizer is one
QuantizeLinear in place of Relu, Mul, QuantizeLinear; where it is a layer norm's output read by products
only (the last decoder layer's, before the output projection), 1 / a goes into gamma and beta
(`norm_folds`).

**Per-row activation scales computed at run time** (the fallback without ranges):
every MatMul with a constant (K, N) weight (the tied output projection included, via `gemm_to_matmul`)
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

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from export.onnx_export import SCALE_FOLDS_KEY
from export.precision import gemm_to_matmul, replace_nodes

WEIGHT_LEVELS = 63  # 7-bit symmetric weights: no int16 saturation in AVX2 u8 x s8 kernels
ACTIVATION_LEVELS = 127  # 8-bit activations, stored as uint8 with zero point 128
ZERO_POINT = 128
SCALE_EPS = 1e-12  # an all-zero row gets a tiny scale instead of a division by zero
STATIC_MARGIN = 1.0  # headroom over the measured range: none (a larger value saturates at 127)
CHANNEL_FLOOR = 0.01  # a channel quiet on valid still gets 1% of the layer's largest range
SMOOTHING = 0.75  # static scales: share of a channel's range its activation scale takes (chosen on valid)
OUTPUT_PROJECTION = "output_projection"  # ranges key of the tied projection (export/calibrate.py)

DESCRIPTION = (
    "int8 integer GEMMs (MatMulIntegerToFloat): activations quantized per row (per token, 8-bit), "
    "weights per output channel (7-bit symmetric); batch-invariant; float32 K/V cache"
)
DESCRIPTION_STATIC = (
    "int8 integer GEMMs (MatMulIntegerToFloat): activations quantized with fixed per-channel scales "
    "measured on valid (8-bit, int8_ranges.json), weights per output channel (7-bit symmetric); "
    "batch-invariant; float32 K/V cache"
)

ZERO_POINT_NAME = "int8_zero_point"  # the shared activation zero point's initializer
QUANT_CONSTANTS = {
    "int8_inv_levels": np.array([1.0 / ACTIVATION_LEVELS], np.float32),
    "int8_eps": np.array([SCALE_EPS], np.float32),
    "int8_offset": np.array([ZERO_POINT + 0.5], np.float32),
    ZERO_POINT_NAME: np.array(ZERO_POINT, np.uint8),
    "int8_one": np.array(1.0, np.float32),
}
RELU_ZERO_POINT = "int8_relu_zero_point"  # 0: QuantizeLinear's saturation at 0 is the Relu itself


def range_key(weight_name: str) -> str:
    """The ranges key (a module name of model.model) of the layer whose weight initializer this is:
    `m.decoder_layers.0.ffn.fc1.weight_matmul_t` (traced graphs) or `decoder_layers.0.ffn.fc1.weight`
    (export/fused_step.py) -> `decoder_layers.0.ffn.fc1`; the tied output projection's weight (the
    embedding, or an anonymous `onnx::` constant when traced) -> OUTPUT_PROJECTION."""
    name = weight_name.removesuffix("_matmul_t").removeprefix("m.")
    if name.startswith("onnx::") or name == "embed.weight":
        return OUTPUT_PROJECTION
    return name.removesuffix(".weight")


def channel_scales(ranges: np.ndarray, weight_rows: np.ndarray | None = None) -> np.ndarray:
    """Static per-channel activation scales a (K,) from the measured ranges (K,) and the largest |weight|
    of each input channel's row over the layers reading it (K,).

    The product needs x / a in 8 bits and diag(a) W per column in 7: a_k proportional to range_k alone
    would spend the weights' few levels on the outlier channels' rows, so (SmoothQuant, Xiao et al.
    2023) a_k = t * range_k^SMOOTHING / weight_row_k^(1 - SMOOTHING), with t making max(range / a) 127."""
    r = np.maximum(ranges.astype(np.float64), CHANNEL_FLOOR * float(ranges.max()))
    r = np.where(r > 0, r, 1.0) * STATIC_MARGIN  # a layer whose input was all zeros on valid: any scale
    if weight_rows is None:
        return r / ACTIVATION_LEVELS
    wr = np.maximum(weight_rows.astype(np.float64), 1e-12)
    s = r**SMOOTHING / wr ** (1.0 - SMOOTHING)
    return s * float((r / s).max()) / ACTIVATION_LEVELS


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


def static_quantizer(
    x: str, scales: np.ndarray, prescaled: bool = False, zero_point: str = ZERO_POINT_NAME
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    """Nodes quantizing activation `x` with fixed per-channel scales: (nodes, initializers, uint8 name).
    `prescaled`: x already carries 1 / scales (folded into the GEMM or LayerNormalization that makes
    it: `relu_folds`, `norm_folds`)."""
    p = f"{x}_int8"
    inits, nodes, scaled = [], [], x
    if not prescaled:
        inits = [numpy_helper.from_array((1.0 / scales).astype(np.float32), f"{p}_inv_scale")]
        nodes = [helper.make_node("Mul", [x, f"{p}_inv_scale"], [f"{p}_scaled"])]
        scaled = f"{p}_scaled"
    # round half to even, + zero point, saturated to [0, 255]: one vectorised kernel
    nodes.append(helper.make_node("QuantizeLinear", [scaled, "int8_one", zero_point], [f"{p}_u8"]))
    return nodes, inits, f"{p}_u8"


def bias_add(
    node: onnx.NodeProto,
    inits: dict[str, onnx.TensorProto],
    consumers: dict[str, list[onnx.NodeProto]],
    outputs: set[str],
) -> tuple[onnx.NodeProto, onnx.TensorProto] | None:
    """(the Add, its (N,) bias initializer) when a quantized GEMM's output goes only to an Add of a
    constant bias as wide as the weight's columns (the bias then joins the product); else None."""
    w = constant_weight(node, inits)
    users = consumers.get(node.output[0], [])
    if w is None or len(users) != 1 or users[0].op_type != "Add" or node.output[0] in outputs:
        return None
    add = users[0]
    b = inits.get(add.input[1] if add.input[0] == node.output[0] else add.input[0])
    return (add, b) if b is not None and tuple(b.dims) == (w.dims[1],) else None


def relu_folds(
    g: onnx.GraphProto,
    inits: dict[str, onnx.TensorProto],
    static: dict[str, np.ndarray],
    consumers: dict[str, list[onnx.NodeProto]],
) -> dict[str, str]:
    """{output of a biased GEMM: the Relu activation it feeds} where the static quantizer's 1 / a can be
    folded into that GEMM's column scales and bias (relu(y) / a = relu(y / a) for a > 0, per channel):
    MatMul (constant weight) -> Add (constant bias, `bias_add`) -> Relu, each read only by the next, and
    the Relu read only by GEMMs with constant weights (the FFN's fc1 -> relu -> fc2). Saves one Mul per
    FFN, and the Relu too: its readers quantize the Relu's input with zero point 0 instead of 128, and
    QuantizeLinear's saturation at 0 is the Relu (relu(y) / a in [0, 127.5) gives the same integers as
    before; larger values, which saturated at 127, now reach 255)."""
    outputs = {o.name for o in g.output}
    folds = {}
    for node in g.node:
        biased = bias_add(node, inits, consumers, outputs)
        relus = consumers.get(biased[0].output[0], []) if biased else []
        if not biased or biased[0].output[0] in outputs or len(relus) != 1 or relus[0].op_type != "Relu":
            continue
        act = relus[0].output[0]
        readers = consumers.get(act, [])
        if (
            act in static
            and act not in outputs
            and readers
            and all(constant_weight(r, inits) is not None and r.input[0] == act for r in readers)
        ):
            folds[node.output[0]] = act
    return folds


def norm_folds(
    g: onnx.GraphProto,
    inits: dict[str, onnx.TensorProto],
    static: dict[str, np.ndarray],
    consumers: dict[str, list[onnx.NodeProto]],
) -> dict[str, onnx.NodeProto]:
    """{activation: the LayerNormalization making it} where the static quantizer's 1 / a can be folded
    into that layer norm's scale and bias (LN(x) / a = LN with gamma / a and beta / a, per channel): the
    output is read only by GEMMs with constant weights (the last decoder layer's norm before the output
    projection, the encoder's last norm before the cross-attention K/V) and is no graph output, and
    gamma and beta are constants read by no other node. A residual reads every other norm's output."""
    outputs = {o.name for o in g.output}
    folds = {}
    for node in g.node:
        if node.op_type != "LayerNormalization" or len(node.input) != 3 or len(node.output) != 1:
            continue
        act = node.output[0]
        readers = consumers.get(act, [])
        params = node.input[1:]
        if (
            act in static
            and act not in outputs
            and readers
            and all(constant_weight(r, inits) is not None and r.input[0] == act for r in readers)
            and all(p in inits and len(consumers.get(p, [])) == 1 for p in params)
        ):
            folds[act] = node
    return folds


def constant_weight(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> onnx.TensorProto | None:
    """The (K, N) initializer a MatMul multiplies by, i.e. a GEMM this module quantizes; else None."""
    w = inits.get(node.input[1]) if node.op_type == "MatMul" else None
    return w if w is not None and len(w.dims) == 2 else None


def scale_folds(model: onnx.ModelProto) -> dict[str, list[float]]:
    """{range key: [first column, end column, factor]}: output columns of a weight that carry a factor
    the trained weight does not (the attention scale in the queries, export/onnx_export.py records it)."""
    props = {p.key: p.value for p in model.metadata_props}
    return json.loads(props[SCALE_FOLDS_KEY]) if SCALE_FOLDS_KEY in props else {}


def trained_row_maxima(w: np.ndarray, fold: list[float] | None) -> np.ndarray:
    """The largest |weight| of each input channel's row (K,) of a (K, N) weight, as trained: a folded
    column range divided by its factor first, so SmoothQuant picks the same channel scales whether or
    not the graph carries the fold (a power-of-2 fold then leaves the integer weights unchanged)."""
    w = np.abs(w.astype(np.float64))
    if fold is not None:
        start, end, factor = int(fold[0]), int(fold[1]), float(fold[2])
        w[:, start:end] /= factor
    return w.max(axis=1)


def activation_scales(
    g: onnx.GraphProto,
    inits: dict[str, onnx.TensorProto],
    ranges: dict[str, np.ndarray],
    folds: dict[str, list[float]] | None = None,
) -> dict[str, np.ndarray]:
    """Static per-channel scales of every quantized activation: the ranges of the layers reading it (one
    activation may feed several, e.g. the encoder output and every cross-attention K/V) joined by max.
    `folds` (scale_folds): weights whose rows are read as trained. Raises ValueError naming the layers
    the ranges do not cover or cover with the wrong width."""
    folds = folds or {}
    joined: dict[str, np.ndarray] = {}
    weight_rows: dict[str, np.ndarray] = {}
    problems = []
    for node in g.node:
        w = constant_weight(node, inits)
        if w is None:
            continue
        key = range_key(node.input[1])
        r = ranges.get(key)
        if r is None or r.shape != (w.dims[0],):
            why = "missing" if r is None else f"{r.shape[0]} channels, weight has {w.dims[0]}"
            problems.append(f"{key} ({why})")
            continue
        x = node.input[0]
        rows = trained_row_maxima(numpy_helper.to_array(w), folds.get(key))  # (K,)
        joined[x] = r if x not in joined else np.maximum(joined[x], r)
        weight_rows[x] = rows if x not in weight_rows else np.maximum(weight_rows[x], rows)
    if problems:
        raise ValueError(f"int8 ranges do not fit this graph: {', '.join(problems)}")
    return {x: channel_scales(r, weight_rows[x]) for x, r in joined.items()}


def quantize_int8(src: Path, dst: Path, ranges: dict[str, np.ndarray] | None = None) -> dict[str, int]:
    """Write the int8 version of the fp32 graph `src` to `dst` (see the module docstring): with `ranges`
    (export/calibrate.py: module name -> per-channel max |input|) static per-channel activation scales,
    else per-row scales computed at run time.

    A bias Add that follows a quantized MatMul joins the product (static) or follows the row rescale.
    Returns {"quantized": matmuls, "activations": distinct quantized inputs, "bias_added": biases}."""
    model = gemm_to_matmul(onnx.load(str(src)))
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in g.output}
    static = activation_scales(g, inits, ranges, scale_folds(model)) if ranges is not None else None
    folds = relu_folds(g, inits, static, consumers) if static is not None else {}
    norms = norm_folds(g, inits, static, consumers) if static is not None else {}
    prescaled = set(folds.values()) | set(norms)  # activations whose 1 / a their maker already applied
    g.initializer.extend(numpy_helper.from_array(v, k) for k, v in QUANT_CONSTANTS.items())
    dropped: set[int] = set()
    relu_input = {}  # Relu output -> its input, quantized in its place (the Relu node goes)
    for node in g.node:
        if node.op_type == "Relu" and node.output[0] in prescaled:
            relu_input[node.output[0]] = node.input[0]
            dropped.add(id(node))
    if relu_input:
        g.initializer.append(numpy_helper.from_array(np.array(0, np.uint8), RELU_ZERO_POINT))
    replaced = set()
    for act, norm in norms.items():  # gamma / a and beta / a, in place of gamma and beta
        inv = 1.0 / static[act]
        for i, suffix in ((1, "scale"), (2, "bias")):
            v = numpy_helper.to_array(inits[norm.input[i]]).astype(np.float64) * inv
            g.initializer.append(numpy_helper.from_array(v.astype(np.float32), f"{act}_int8_norm_{suffix}"))
            replaced.add(norm.input[i])
            norm.input[i] = f"{act}_int8_norm_{suffix}"
    if replaced:  # read by that norm alone (norm_folds)
        kept = [t for t in g.initializer if t.name not in replaced]
        del g.initializer[:]
        g.initializer.extend(kept)
    # activation -> (uint8 tensor, row scale or None, zero point)
    quantized: dict[str, tuple[str, str | None, str]] = {}
    new_nodes: list[onnx.NodeProto] = []
    stats = {"quantized": 0, "activations": 0, "bias_added": 0, "folded": len(norms) + len(relu_input)}
    for node in g.node:
        if id(node) in dropped:
            continue
        w_init = constant_weight(node, inits)
        if w_init is None:
            new_nodes.append(node)
            continue
        x = node.input[0]
        if x not in quantized:
            if static is None:
                nodes, xq, sa = row_quantizer(x)
                quantized[x] = (xq, sa, ZERO_POINT_NAME)
            else:
                zp = RELU_ZERO_POINT if x in relu_input else ZERO_POINT_NAME
                nodes, extra, xq = static_quantizer(
                    relu_input.get(x, x), static[x], prescaled=x in prescaled, zero_point=zp
                )
                g.initializer.extend(extra)
                quantized[x] = (xq, None, zp)
            new_nodes += nodes
            stats["activations"] += 1
        xq, sa, zp = quantized[x]
        w = numpy_helper.to_array(w_init).astype(np.float64)
        if static is not None:
            w = w * static[x][:, None]  # x_q carries x / a: the weight's rows carry a
        wq, ws = quantize_weight(w)
        base = f"{node.input[1]}_int8"
        act = folds.get(node.output[0])
        fold = static[act] if act is not None and static is not None else None
        if fold is not None:  # the Relu after this GEMM feeds a quantizer: its 1 / a goes in here
            ws = (ws / fold).astype(np.float32)
        g.initializer.extend(
            [numpy_helper.from_array(wq, f"{base}_w"), numpy_helper.from_array(ws, f"{base}_s")]
        )
        out, bias = node.output[0], None
        biased = bias_add(node, inits, consumers, graph_outputs)
        if biased is not None:
            add, b = biased
            bias, out = b.name, add.output[0]
            if fold is not None:
                bias = f"{base}_bias"
                scaled_b = numpy_helper.to_array(b).astype(np.float64) / fold
                g.initializer.append(numpy_helper.from_array(scaled_b.astype(np.float32), bias))
            dropped.add(id(add))
            stats["bias_added"] += 1
        # (x_q - 128) @ w_q * 1.0 * w_scale: static scales live in w_q and the bias joins the op; a per-row
        # scale is not an input this op takes, so the rescale (and then the bias) follows the product.
        inputs = [xq, f"{base}_w", "int8_one", f"{base}_s", zp]
        if sa is None:
            inputs += ["", *([bias] if bias else [])]
        new_nodes.append(
            helper.make_node(
                "MatMulIntegerToFloat",
                inputs,
                [out if sa is None else f"{base}_acc"],
                name=f"{node.name or base}_int8",
                domain="com.microsoft",
            )
        )
        if sa is not None and bias is None:
            new_nodes.append(helper.make_node("Mul", [f"{base}_acc", sa], [out]))
        elif sa is not None:
            new_nodes.append(helper.make_node("Mul", [f"{base}_acc", sa], [f"{base}_rows"]))
            new_nodes.append(helper.make_node("Add", [f"{base}_rows", bias], [out]))
        stats["quantized"] += 1
    replace_nodes(g, new_nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(dst))
    return stats
