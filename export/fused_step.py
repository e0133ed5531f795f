"""The decoder step written node by node with ONNX Runtime's contrib attention operator (opt-in:
`python -m export --fused-attention [split|mha]`): fewer, bigger nodes than the traced step of
export/onnx_export.py, for the CPU provider, where every node has a fixed cost.

Same inputs, outputs, shapes and cache layout as the traced step (`export_decoder`; the names come from
export/onnx_export.py), so the engine runs either graph unchanged. Inside, per decoder layer:

* cross-attention is one ``com.microsoft.MultiHeadAttention``: the query is a sentence's Kc beam rows as
  Kc query positions (B, Kc, D) against the per-sentence cross K/V (B, H, S, Dh), the source padding an
  int32 ``key_padding_mask`` (its -10000 filter underflows to an exact 0 weight, as -inf does);
* masked self-attention, `self_attention="split"` (default): as the traced step, the cache is read in
  place, scored apart from this step's key and both joined in one softmax, but with q and the new K/V
  (N, H, 1, Dh) straight out of one Split and the scores scaled inside FusedMatMul;
  `self_attention="mha"`: one MultiHeadAttention with ``past_key``/``past_value`` = the read-only cache and
  an ``attention_bias`` (N or 1, 1, 1, C + 1) masking each row's spare slots. Fewer nodes, but the node
  copies the whole cache into ``present_key``/``present_value`` at every step, and those outputs cannot
  be left out: ONNX Runtime 1.32's CPU kernel then returns wrong outputs (measured: errors of 1e5);
* residual adds and LayerNorms stay Add + LayerNormalization: ``SkipLayerNormalization`` is slower on
  ONNX Runtime 1.32's CPU provider than the two nodes it replaces (measured on a 2-core EPYC: 4.6 against
  1.7 us at 1 row, 247 against 34 us at 128 rows).

Measured on that machine (ORT 1.32, 1 thread, en-es-small, 64 sentences, bundles interleaved): after
ORT's optimisations the fp32 step has 107 nodes (split) or 88 (mha) instead of 149, the int8 step 280 or
261 instead of 322; a tiny node costs about 0.5 us there, and the fp32 step at batch 1 is dominated by
streaming its 19 MB of GEMM weights. Engine tokens per CPU-second, split (mha) against the traced step:
fp32 1.03 (1.05) at batch 1 greedy, 1.02 (1.05) beam 4, 1.05 (1.00) batch 32 greedy, 0.93 (0.98) batch 32
beam 4; int8 1.02 (1.03), 1.07 (1.00), 0.97 (0.99), 0.94 (0.91); outputs identical. Not faster, hence
opt-in: a measured alternative for other CPUs, ONNX Runtime versions and providers.

The projections stay Gemms on 2-D rows (N, D), so export/int8.py quantizes this graph as the traced one.
Parity against PyTorch is checked by export/verify.py like every exported graph.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from export.onnx_export import OPSET, add_topk, cross_names, decoder_input_names, new_kv_names, past_names
from model.model import Transformer

MS = "com.microsoft"
SELF_ATTENTION = ("split", "mha")
DESCRIPTION = "decoder step with com.microsoft MultiHeadAttention nodes (export/fused_step.py)"


class _Graph:
    """Nodes, initializers and fresh names for one graph."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0
        self._consts: set[str] = set()

    def const(self, name: str, value: np.ndarray) -> str:
        if name not in self._consts:
            self._consts.add(name)
            self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, domain: str = "", **attrs) -> list[str]:
        self._n += 1
        base = f"{op_type.lower()}_{self._n}"
        outs = [f"{base}_out{j}" for j in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=base, domain=domain, **attrs))
        return outs

    def op1(self, op_type: str, inputs: list[str], domain: str = "", **attrs) -> str:
        return self.op(op_type, inputs, 1, domain, **attrs)[0]


def _w(t: nn.Parameter | np.ndarray) -> np.ndarray:
    return t.detach().float().numpy() if hasattr(t, "detach") else np.asarray(t, dtype=np.float32)


def build_fused_decoder(model: Transformer, self_attention: str = "split") -> onnx.ModelProto:
    """The decoder step (without the top-k tail that `add_topk` appends) as an ONNX model.

    self_attention: "split" (default) scores the cache and this step's key apart and joins them in one
    softmax, reading the cache in place, as the traced step does; "mha" is one MultiHeadAttention node
    with past K/V, which copies the whole cache into its present outputs at every step (see the module
    docstring)."""
    if self_attention not in SELF_ATTENTION:
        raise ValueError(f"self_attention must be one of {SELF_ATTENTION}, got {self_attention!r}")
    cfg = model.config
    n, d, h = cfg.n_decoder_layers, cfg.d_model, cfg.n_heads
    dh, v, eps = d // h, cfg.vocab_size, cfg.layer_norm_eps
    scale = 1.0 / float(np.sqrt(dh))
    pre = cfg.norm_first
    g = _Graph()
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64

    embed = g.const("embed.weight", _w(model.embed.weight))  # (V, D): lookup and tied projection
    pe = g.const("pe", _w(model.pe))
    shape_rows = g.const("shape_rows", np.array([-1], np.int64))
    shape_2d = g.const("shape_2d", np.array([-1, d], np.int64))
    shape_pos = g.const("shape_pos", np.array([-1, 1, 1, 1], np.int64))
    minus_d = g.const("minus_one_d", np.array([-1, d], np.int64))
    zero_i, one_i = g.const("zero_i", np.array(0, np.int64)), g.const("one_i", np.array(1, np.int64))
    zero_f = g.const("zero_f", np.array(0.0, np.float32))
    minus_inf = g.const("minus_inf", np.array(-np.inf, np.float32))
    last_slot = g.const("pads_last_slot", np.array([0, 0, 0, 0, 0, 0, 0, 1], np.int64))

    # x = embed[ids] * sqrt(D) + pe[position]: (N, D), as LeanDecoderStepForExport
    ids = g.op1("Reshape", ["input_ids", shape_rows])
    emb = g.op1("Gather", [embed, ids], axis=0)
    scaled = g.op1("Mul", [emb, g.const("embed_scale", np.array(model.embed_scale, np.float32))])
    x = g.op1("Add", [scaled, g.op1("Gather", [pe, "position"], axis=0)])

    # Self-attention bias (N or 1, 1, 1, C + 1), built once for all layers: -inf on cache slots at or past
    # a row's position (other rows' longer histories, spare capacity), 0 on its history and on this
    # step's key, which MultiHeadAttention appends after the C cache slots.
    cache_len_1d = g.op1("Shape", [past_names(n)[0]], start=2, end=3)
    cache_len = g.op1("Squeeze", [cache_len_1d])
    slots = g.op1("Range", [zero_i, cache_len, one_i])  # (C,)
    spare = g.op1("GreaterOrEqual", [slots, g.op1("Reshape", ["position", shape_pos])])  # (N|1, 1, 1, C)
    self_bias = g.op1("Pad", [g.op1("Where", [spare, minus_inf, zero_f]), last_slot])
    if self_attention == "split":  # where the softmax over [cache; new key] splits again
        split_sizes = g.op1("Concat", [cache_len_1d, g.const("one_1d", np.array([1], np.int64))], axis=0)
    # Source padding for cross-attention: src_bias is 0 (attend) or -inf (padding).
    pad_mask = g.op1("Cast", [g.op1("Equal", ["src_bias", zero_f])], to=TensorProto.INT32)  # (B, S)
    # (B, Kc, D): a sentence's beam rows are its Kc queries (rows are sentence-major).
    q_shape = g.op1("Concat", [g.op1("Shape", ["src_bias"], start=0, end=1), minus_d], axis=0)

    def gemm(inp: str, lin: nn.Linear, name: str) -> str:
        w = g.const(f"{name}.weight", _w(lin.weight))
        b = g.const(f"{name}.bias", _w(lin.bias))
        return g.op1("Gemm", [inp, w, b], transB=1)

    def layer_norm(inp: str, ln: nn.Module, name: str) -> str:
        gamma, beta = g.const(f"{name}.weight", _w(ln.weight)), g.const(f"{name}.bias", _w(ln.bias))
        return g.op1("LayerNormalization", [inp, gamma, beta], axis=-1, epsilon=eps)

    def residual(y: str, x: str, ln: nn.Module, name: str) -> tuple[str, str]:
        """A sublayer's output y joins the residual stream x: returns (what the next sublayer reads, the
        new residual stream), i.e. (LN(x + y), x + y) pre-norm, where LN is the next sublayer's
        LayerNorm, and (LN(x + y), LN(x + y)) post-norm. Not SkipLayerNormalization: slower (see above)."""
        total = g.op1("Add", [x, y])
        out = layer_norm(total, ln, name)
        return out, total if pre else out

    layers = list(model.decoder_layers)
    # Sublayers read u: x itself (post-norm) or LN(x) (pre-norm).
    u = x
    if pre:
        u = layer_norm(x, layers[0].ln1, "decoder_layers.0.ln1")
    outputs_kv: list[str] = []
    for i, layer in enumerate(layers):
        p = f"decoder_layers.{i}"  # the module names: int8 ranges are keyed by them
        sa, ca = layer.self_attn, layer.cross_attn
        # The LayerNorm after each sublayer's residual add: its own (post-norm), or the next sublayer's
        # (pre-norm: the next layer's ln1 after the FFN, decoder_ln after the last layer).
        if pre:
            nxt = (model.decoder_ln, "decoder_ln")
            if i + 1 < n:
                nxt = (layers[i + 1].ln1, f"decoder_layers.{i + 1}.ln1")
            lns = [(layer.ln2, f"{p}.ln2"), (layer.ln3, f"{p}.ln3"), nxt]
        else:
            lns = [(layer.ln1, f"{p}.ln1"), (layer.ln2, f"{p}.ln2"), (layer.ln3, f"{p}.ln3")]

        past_k, past_v = past_names(n)[2 * i : 2 * i + 2]
        new_k, new_v = new_kv_names(n)[2 * i : 2 * i + 2]
        outputs_kv += [new_k, new_v]
        qkv = gemm(u, sa.qkv, f"{p}.self_attn.qkv")  # (N, 3D)
        if self_attention == "mha":
            shape_qkv = g.const("shape_qkv", np.array([-1, 1, 3 * d], np.int64))
            shape_heads = g.const("shape_heads", np.array([-1, h, 1, dh], np.int64))
            q, k, val = g.op("Split", [g.op1("Reshape", [qkv, shape_qkv])], 3, axis=2)  # 3 x (N, 1, D)
            y, _, _ = g.op(
                "MultiHeadAttention", [q, k, val, "", "", self_bias, past_k, past_v], 3, MS, num_heads=h
            )  # (N, 1, D)
            g.nodes.append(helper.make_node("Reshape", [k, shape_heads], [new_k], name=f"{p}/new_key"))
            g.nodes.append(helper.make_node("Reshape", [val, shape_heads], [new_v], name=f"{p}/new_value"))
        else:
            # q, new_key, new_value (N, H, 1, Dh) straight from one Split; softmax over [cache; new key]
            # with the two score parts concatenated (C + 1 scores per row and head, not the cache).
            q = f"{p}/q"
            shape_qkv_heads = g.const("shape_qkv_heads", np.array([-1, 3 * h, 1, dh], np.int64))
            split = helper.make_node(
                "Split",
                [g.op1("Reshape", [qkv, shape_qkv_heads])],
                [q, new_k, new_v],
                axis=1,
                name=f"{p}/qkv",
            )
            g.nodes.append(split)
            s_past = g.op1("FusedMatMul", [q, past_k], MS, transB=1, alpha=scale)  # (N, H, 1, C)
            s_new = g.op1("FusedMatMul", [q, new_k], MS, transB=1, alpha=scale)  # (N, H, 1, 1)
            scores = g.op1("Add", [g.op1("Concat", [s_past, s_new], axis=-1), self_bias])
            p_past, p_new = g.op("Split", [g.op1("Softmax", [scores], axis=-1), split_sizes], 2, axis=-1)
            y = g.op1("Add", [g.op1("MatMul", [p_past, past_v]), g.op1("Mul", [p_new, new_v])])
        attn = gemm(g.op1("Reshape", [y, shape_2d]), sa.out, f"{p}.self_attn.out")
        u, x = residual(attn, x, *lns[0])

        cq = g.op1("Reshape", [gemm(u, ca.q, f"{p}.cross_attn.q"), q_shape])  # (B, Kc, D)
        ck, cv = cross_names(n)[2 * i : 2 * i + 2]
        y = g.op1("MultiHeadAttention", [cq, ck, cv, "", pad_mask], MS, num_heads=h)  # (B, Kc, D)
        attn = gemm(g.op1("Reshape", [y, shape_2d]), ca.out, f"{p}.cross_attn.out")
        u, x = residual(attn, x, *lns[1])

        hidden = g.op1("Relu", [gemm(u, layer.ffn.fc1, f"{p}.ffn.fc1")])
        u, x = residual(gemm(hidden, layer.ffn.fc2, f"{p}.ffn.fc2"), x, *lns[2])

    # u is the final hidden state: decoder_ln's output (pre-norm) or the last post-norm LayerNorm's.
    logits = g.op1("Gemm", [u, embed], transB=1)  # (N, V), tied output projection
    g.nodes.append(helper.make_node("LogSoftmax", [logits], ["log_probs"], axis=-1, name="log_softmax"))

    inputs = [
        helper.make_tensor_value_info("input_ids", i64, ["rows", 1]),
        helper.make_tensor_value_info("position", i64, ["position_rows"]),
        helper.make_tensor_value_info("src_bias", f32, ["batch", "src_len"]),
    ]
    inputs += [helper.make_tensor_value_info(c, f32, ["batch", h, "src_len", dh]) for c in cross_names(n)]
    inputs += [helper.make_tensor_value_info(c, f32, ["rows", h, "cache_len", dh]) for c in past_names(n)]
    assert [i.name for i in inputs] == decoder_input_names(n)
    outputs = [helper.make_tensor_value_info("log_probs", f32, ["rows", v])]
    outputs += [helper.make_tensor_value_info(name, f32, ["rows", h, 1, dh]) for name in outputs_kv]
    graph = helper.make_graph(g.nodes, "decoder_step_fused", inputs, outputs, initializer=g.inits)
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS, 1)],
        producer_name="export.fused_step",
        ir_version=8,
    )


def export_fused_decoder(model: Transformer, path: Path, self_attention: str = "split") -> None:
    """Write the fused decoder step graph, with the same top-k tail as `export_decoder`, to `path`."""
    onnx.save(build_fused_decoder(model.eval(), self_attention), str(path))
    add_topk(path)


def optimized_node_count(path: Path) -> int:
    """Nodes of `path` after ONNX Runtime's CPU graph optimisations (what a session really runs)."""
    import tempfile

    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        return len(onnx.load(so.optimized_model_filepath, load_external_data=False).graph.node)
