"""Precision variants of the exported fp32 graphs: fp16 (GPUs), the onnxruntime.transformers optimizer
pass, and `gemm_to_matmul`, which the int8 variant (export/int8.py) starts from.
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
    replace_nodes(g, new_nodes)
    return model


def replace_nodes(g: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
    """Make `nodes` the graph's nodes and drop the initializers no node reads any more."""
    del g.node[:]
    g.node.extend(nodes)
    used = {i for n in g.node for i in n.input}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)


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
