"""Precision variants of the exported fp32 graphs: int8 (weight-only MatMulNBits), fp16 (GPUs) and the
onnxruntime.transformers optimizer pass.

int8 variant (`quantize_int8`): weight-only 8-bit com.microsoft MatMulNBits (symmetric blocks of 32 along
    K, accuracy_level 4: activations quantized per row and block), so outputs do not depend on the batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from export.onnx_export import quiet
from model.model import Transformer


def gemm_to_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite Gemm(A, W^T, c) with an initializer W as MatMul(A, W^T-initializer) [+ Add], so that
    dynamic int8 quantization (which handles MatMul, not Gemm) also covers the tied output projection."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    new_nodes = []
    for node in g.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (
            node.op_type != "Gemm"
            or node.input[1] not in inits
            or attrs.get("transA", 0)
            or attrs.get("alpha", 1.0) != 1.0
            or attrs.get("beta", 1.0) != 1.0
        ):
            new_nodes.append(node)
            continue
        w = numpy_helper.to_array(inits[node.input[1]])
        if attrs.get("transB", 0):
            w = w.T
        w_name = f"{node.input[1]}_matmul_t"
        g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w), w_name))
        has_bias = len(node.input) > 2 and node.input[2]
        mm_out = f"{node.output[0]}_mm" if has_bias else node.output[0]
        new_nodes.append(
            helper.make_node("MatMul", [node.input[0], w_name], [mm_out], name=f"{node.name}_mm")
        )
        if has_bias:
            new_nodes.append(
                helper.make_node("Add", [mm_out, node.input[2]], [node.output[0]], name=f"{node.name}_bias")
            )
    del g.node[:]
    g.node.extend(new_nodes)
    used = {i for n in g.node for i in n.input}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    return model


INT8_BLOCK_SIZE = 32
INT8_ACCURACY_LEVEL = 4  # int8 compute: activations quantized per row and K-block (row-local)


def _int8_blocks(w: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric 8-bit block quantization of a (K, N) weight along K: MatMulNBits' B (N, K/bs, bs) uint8
    (zero point 128, the default for 8 bits) and scales (N, K/bs) float32."""
    k, n = w.shape
    blocks = w.astype(np.float64).reshape(k // block_size, block_size, n)
    scale = np.abs(blocks).max(axis=1) / 127.0  # (K/bs, N)
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(blocks / scale[:, None, :]), -127, 127).astype(np.int16) + 128
    packed = np.ascontiguousarray(q.transpose(2, 0, 1).astype(np.uint8))  # (N, K/bs, bs)
    return packed, np.ascontiguousarray(scale.T.astype(np.float32))


def quantize_int8(
    src: Path,
    dst: Path,
    block_size: int = INT8_BLOCK_SIZE,
    accuracy_level: int = INT8_ACCURACY_LEVEL,
) -> dict[str, int]:
    """Weight-only 8-bit quantization: every MatMul with a constant (K, N) weight (the tied output
    projection included, via `gemm_to_matmul`) becomes com.microsoft MatMulNBits (bits=8, symmetric
    blocks of `block_size` along K), with a following bias Add folded into its bias input.

    Unlike DynamicQuantizeLinear (quantize_dynamic: one activation scale over the whole tensor, i.e.
    over all rows of the batch), MatMulNBits with accuracy_level 4 quantizes activations per row and
    K-block, so each row's result does not depend on the other rows: int8 decoding stays batch-invariant.
    Returns {"quantized": n, "bias_folded": m}."""
    if block_size not in (16, 32, 64, 128, 256):
        raise ValueError(f"int8 block size must be 16, 32, 64, 128 or 256 (MatMulNBits), got {block_size}")
    model = gemm_to_matmul(onnx.load(str(src)))
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in g.output}
    new_nodes: list[onnx.NodeProto] = []
    dropped: set[int] = set()
    stats = {"quantized": 0, "bias_folded": 0}
    for node in g.node:
        if id(node) in dropped:
            continue
        w_init = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if w_init is None or len(w_init.dims) != 2 or w_init.dims[0] % block_size:
            new_nodes.append(node)
            continue
        w = numpy_helper.to_array(w_init)
        k, n = w.shape
        packed, scales = _int8_blocks(w, block_size)
        base = f"{node.input[1]}_q8"
        g.initializer.extend(
            [numpy_helper.from_array(packed, f"{base}_B"), numpy_helper.from_array(scales, f"{base}_scales")]
        )
        inputs = [node.input[0], f"{base}_B", f"{base}_scales"]
        output = node.output[0]
        users = consumers.get(output, [])
        if len(users) == 1 and users[0].op_type == "Add" and output not in graph_outputs:
            add = users[0]
            other = add.input[1] if add.input[0] == output else add.input[0]
            b = inits.get(other)
            if b is not None and tuple(b.dims) == (n,):
                inputs += ["", "", other]  # zero_points, g_idx absent; bias
                output = add.output[0]
                dropped.add(id(add))
                stats["bias_folded"] += 1
        new_nodes.append(
            helper.make_node(
                "MatMulNBits",
                inputs,
                [output],
                name=f"{node.name or base}_q8",
                domain="com.microsoft",
                K=k,
                N=n,
                bits=8,
                block_size=block_size,
                accuracy_level=accuracy_level,
            )
        )
        stats["quantized"] += 1
    del g.node[:]
    g.node.extend(new_nodes)
    used = {i for nd in g.node for i in nd.input}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(dst))
    return stats


FP16_KEEP_FP32_IO = ["src_ids", "memory", "src_bias", "beam_scores", "log_probs", "topk_scores"]


def convert_fp16(src: Path, dst: Path) -> None:
    """fp16 weights and K/V cache (for GPUs); ids, masks, scores and log-probs stay fp32 at the I/O,
    and the softmax over the vocabulary plus candidate selection run in fp32."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    model = onnx.load(str(src))
    io_names = {v.name for v in model.graph.input} | {v.name for v in model.graph.output}
    keep = [n for n in FP16_KEEP_FP32_IO if n in io_names]
    block = sorted(set(DEFAULT_OP_BLOCK_LIST) | {"LogSoftmax", "TopK"})
    with quiet():
        fp16 = convert_float_to_float16(model, keep_io_types=keep, op_block_list=block)
    from onnxruntime.transformers.onnx_model import OnnxModel

    wrapped = OnnxModel(fp16)
    wrapped.topological_sort()  # the converter appends its input casts after their consumers
    onnx.save(wrapped.model, str(dst))


def optimize_graph(src: Path, dst: Path, model: Transformer) -> dict[str, Any]:
    """onnxruntime.transformers optimizer (bart fusions: LayerNorm/SkipLayerNorm/bias fusions...)."""
    from onnxruntime.transformers.optimizer import optimize_model

    cfg = model.config
    with quiet():
        opt = optimize_model(
            str(src),
            model_type="bart",
            num_heads=cfg.n_heads,
            hidden_size=cfg.d_model,
            opt_level=1,
            use_gpu=False,
        )
    opt.save_model_to_file(str(dst))
    return opt.get_fused_operator_statistics()
