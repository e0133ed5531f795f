"""Export a released Transformer (model/train.py `save_release`) to an ONNX inference bundle.

Graphs (opset 17, dynamic batch and length axes, TorchScript exporter ``dynamo=False``):

encoder.onnx
    in   src_ids (B, S) int64, right-padded with pad id 0
    out  memory (B, S, D) float32
         src_bias (B, S) float32: 0 = attend, -inf = padding (a source made only of padding attends to
              every position, like `key_padding_attn_mask`); the decoder adds it to cross-attention scores
         cross_key_i, cross_value_i (B, H, S, Dh) for every decoder layer i: computed once per sentence

decoder.onnx (one KV-cached step; N = B * Kc rows, Kc beam rows per sentence, sentence-major)
    in   input_ids (N, 1) int64: the previous token of each row (BOS at step 0)
         position (N,) int64: 0-based position of each row's token (= its step index and the number of
              valid entries in its cache row), or (1,): the same for every row. Per-row positions let
              rows at different steps share one call (in-flight batching, server/engine.py RunningBatch)
         src_bias (B, S), cross_key_i / cross_value_i (B, H, S, Dh): per *sentence*, not per beam row;
              the Kc beam rows of a sentence attend to its keys as Kc queries (no repeated cross K/V)
         past_key_i, past_value_i (N, H, C, Dh), C >= position (zero-length at the first step): row r
              attends to its first position[r] entries only, the rest is spare capacity (any finite values),
              so the caller can keep a preallocated cache and write each step's K/V in place. Read
              only, never concatenated: the graph attends to [past; new] as two parts of one softmax
         beam_scores (B, Kc) float32: cumulative log-prob of each beam row (-inf = dead beam)
         num_candidates (1,) int64: how many candidates to return per sentence (<= Kc * V)
    out  log_probs (N, V) float32: full next-token log-probabilities (parity checks)
         new_key_i, new_value_i (N, H, 1, Dh): this step's self-attention K/V; the caller appends them
              to the cache (together with the beam reorder: one copy per step instead of two)
         topk_scores (B, C) float32, topk_indices (B, C) int64: the C best of beam_scores + log_probs over
              the Kc * V candidates of each sentence, flat index = beam * V + token, sorted descending with
              ties to the lower flat index (ONNX TopK), i.e. exactly the stable sort of model/decode.py

    The step is exported from `LeanDecoderStepForExport` (2-D rows, Gemm per Linear, constant-shape head
    reshapes: ~220 nodes instead of the ~500 of a straightforward trace of `Transformer.decode_step`).

int8 variant (`quantize_int8`): weight-only 8-bit com.microsoft MatMulNBits (symmetric blocks of 32 along
    K, accuracy_level 4: activations quantized per row and block), so outputs do not depend on the batch.

cache.onnx
    in   idx (M,) int64, x_j (N, H, T, Dh), n_j (N, H, T', Dh) for j < 2 * layers
    out  y_j = concat(x_j[idx], n_j[idx], axis=2): device-side cache reorder + append (IOBinding path);
         with T' = 0 it is a plain row gather (compaction of the cross K/V)

kv_rows.onnx (the in-flight batch on the device: sentences joining, an axis growing or shrinking)
    in   idx, n_idx, pos (M,) int64, t_out (1,) int64, a_j (Na, H, Ta, Dh), b_j (Nb, H, Tb, Dh),
         n_j (Nn, H, 1, Dh) for j < 2 * layers
    out  y_j = rows idx of [a_j; b_j] sliced / zero-padded to t_out slots, n_j[n_idx] written at pos

kv_step.onnx (the in-flight batch on the device after a plain step)
    in   idx (M,) int64, write (M * H, 3) int64, a_j (N, H, T, Dh), n_j (N, H, 1, Dh)
    out  y_j = a_j[idx] with n_j[idx] scattered to [row, head, slot] of `write`
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch import Tensor, nn
from torch.onnx.operators import reshape_from_tensor_shape

from model.decode import greedy_decode, max_output_length
from model.model import MultiHeadAttention, Transformer

OPSET = 17


# --------------------------------------------------------------------------------------------- modules


def _attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    """softmax(q k^T / sqrt(Dh) + bias) v; q (..., Tq, Dh), k/v (..., Tk, Dh), bias broadcastable."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.size(-1)))
    if bias is not None:
        scores = scores + bias
    return torch.matmul(torch.softmax(scores, dim=-1), v)


class LeanEncoderForExport(nn.Module):
    """src_ids -> memory, src_bias, per decoder layer cross K/V: the maths of Transformer.encode +
    cross_kv in few ONNX nodes: Linears on (B*S, D) rows (one Gemm each), heads split with one Reshape +
    Transpose from a shape tensor computed once."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.m = model

    def forward(self, src_ids: Tensor) -> tuple[Tensor, ...]:
        m = self.m
        cfg = m.config
        d, h = cfg.d_model, cfg.n_heads
        dh = d // h
        pad = src_ids.eq(cfg.pad_id)  # (B, S)
        masked = pad & ~pad.all(dim=-1, keepdim=True)  # all-pad rows attend everywhere
        src_bias = torch.zeros(pad.shape, dtype=torch.float32).masked_fill(masked, float("-inf"))  # (B, S)
        bias4 = src_bias[:, None, None, :]  # (B, 1, 1, S)
        bs = torch._shape_as_tensor(src_ids)  # [B, S]
        shape3 = torch.cat([bs, torch.tensor([3, h, dh])])
        shape2 = torch.cat([bs, torch.tensor([2, h, dh])])
        x = m.embed(src_ids) * m.embed_scale + m.pe[: src_ids.size(1)]  # (B, S, D)
        x = x.reshape(-1, d)  # (B*S, D)
        for layer in m.encoder_layers:
            sa = layer.self_attn
            qkv = reshape_from_tensor_shape(F.linear(x, sa.qkv.weight, sa.qkv.bias), shape3)  # (B,S,3,H,Dh)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)  # 3 x (B, H, S, Dh)
            y = _attention(q, k, v, bias4).transpose(1, 2).reshape(-1, d)  # (B*S, D)
            x = layer.ln1(x + F.linear(y, sa.out.weight, sa.out.bias))
            x = layer.ln2(x + layer.ffn.fc2(F.relu(layer.ffn.fc1(x))))
        outputs: list[Tensor] = [reshape_from_tensor_shape(x, torch.cat([bs, torch.tensor([d])])), src_bias]
        for layer in m.decoder_layers:
            ca = layer.cross_attn
            kv = reshape_from_tensor_shape(F.linear(x, ca.kv.weight, ca.kv.bias), shape2)  # (B, S, 2, H, Dh)
            k, v = kv.permute(2, 0, 3, 1, 4)  # 2 x (B, H, S, Dh)
            outputs += [k, v]
        return tuple(outputs)


class LeanDecoderStepForExport(nn.Module):
    """One KV-cached decoder step (the maths of Transformer.decode_step, beams grouped per sentence for
    cross-attention; top-k is appended to the graph by `add_topk`) written for few ONNX nodes: rows kept
    2-D (N, D) so that
    every Linear is one Gemm, heads split/merged with constant-shape Reshapes (with one query per row the
    head transpose is a no-op), the spare-capacity mask built once for all layers, the cross-attention
    query reshape built from one shape tensor."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.m = model
        self.n_layers = model.config.n_decoder_layers

    def forward(
        self, input_ids: Tensor, position: Tensor, src_bias: Tensor, *kv: Tensor
    ) -> tuple[Tensor, ...]:
        m, n = self.m, self.n_layers
        cross, past = kv[: 2 * n], kv[2 * n :]
        cfg = m.config
        d, h = cfg.d_model, cfg.n_heads
        dh = d // h
        scale = 1.0 / math.sqrt(dh)
        x = m.embed(input_ids.reshape(-1)) * m.embed_scale + m.pe[position]  # (N, D)
        bias4 = src_bias[:, None, None, :]  # (B, 1, 1, S)
        # Per-row positions (N,) (or one shared (1,)): row r attends to its first position[r] cache
        # entries; the rest (other rows' longer histories, spare capacity) is masked. Built once.
        spare = torch.arange(past[0].size(2))[None, :] >= position[:, None]  # (N or 1, C)
        spare_bias = torch.zeros(spare.shape).masked_fill(spare, float("-inf"))[:, None, None, :]
        q_shape = torch.cat([torch._shape_as_tensor(src_bias)[:1], torch.tensor([-1, h, dh])])  # B, Kc, H, Dh
        new_kv: list[Tensor] = []
        for i, layer in enumerate(m.decoder_layers):
            sa: MultiHeadAttention = layer.self_attn
            qkv = F.linear(x, sa.qkv.weight, sa.qkv.bias).reshape(-1, 3, h, 1, dh)  # (N, 3, H, 1, Dh)
            q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # (N, H, 1, Dh)
            new_kv += [k, v]
            s_past = torch.matmul(q, past[2 * i].transpose(-1, -2)) * scale + spare_bias  # (N, H, 1, C)
            s_new = (q * k).sum(dim=-1, keepdim=True) * scale  # (N, H, 1, 1)
            p = torch.softmax(torch.cat([s_past, s_new], dim=-1), dim=-1)
            y = torch.matmul(p[..., :-1], past[2 * i + 1]) + p[..., -1:] * v  # (N, H, 1, Dh)
            x = layer.ln1(x + F.linear(y.reshape(-1, d), sa.out.weight, sa.out.bias))  # (N, D)
            ca: MultiHeadAttention = layer.cross_attn
            ck, cv = cross[2 * i], cross[2 * i + 1]  # (B, H, S, Dh)
            q = reshape_from_tensor_shape(F.linear(x, ca.q.weight, ca.q.bias), q_shape).transpose(1, 2)
            y = _attention(q, ck, cv, bias4).transpose(1, 2).reshape(-1, d)  # (N, D)
            x = layer.ln2(x + F.linear(y, ca.out.weight, ca.out.bias))
            x = layer.ln3(x + layer.ffn.fc2(F.relu(layer.ffn.fc1(x))))
        logits = F.linear(x, m.embed.weight)  # (N, V), tied projection (Gemm transB=1)
        return (F.log_softmax(logits.float(), dim=-1), *new_kv)


# ----------------------------------------------------------------------------------------- io names


def encoder_output_names(n_layers: int) -> list[str]:
    names = ["memory", "src_bias"]
    for i in range(n_layers):
        names += [f"cross_key_{i}", f"cross_value_{i}"]
    return names


def cross_names(n_layers: int) -> list[str]:
    return [n for i in range(n_layers) for n in (f"cross_key_{i}", f"cross_value_{i}")]


def past_names(n_layers: int) -> list[str]:
    return [n for i in range(n_layers) for n in (f"past_key_{i}", f"past_value_{i}")]


def new_kv_names(n_layers: int) -> list[str]:
    return [n for i in range(n_layers) for n in (f"new_key_{i}", f"new_value_{i}")]


def decoder_input_names(n_layers: int) -> list[str]:
    return ["input_ids", "position", "src_bias", *cross_names(n_layers), *past_names(n_layers)]


def graph_io(path: Path) -> dict[str, list[str]]:
    """{'inputs': ['name: type[dims]', ...], 'outputs': [...]} for the manifest and reports."""
    model = onnx.load(str(path), load_external_data=False)

    def describe(v: onnx.ValueInfoProto) -> str:
        t = v.type.tensor_type
        dims = ",".join(d.dim_param or str(d.dim_value) for d in t.shape.dim)
        return f"{v.name}: {TensorProto.DataType.Name(t.elem_type).lower()}[{dims}]"

    return {
        "inputs": [describe(v) for v in model.graph.input],
        "outputs": [describe(v) for v in model.graph.output],
    }


# ------------------------------------------------------------------------------------------- export


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence exporter deprecation/tracer warnings and onnxruntime tooling log chatter."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)


def export_encoder(model: Transformer, path: Path, opset: int = OPSET) -> None:
    n = model.config.n_decoder_layers
    v = model.config.vocab_size
    src = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]], dtype=torch.long).clamp(max=v - 1)
    names = encoder_output_names(n)
    dyn: dict[str, dict[int, str]] = {"src_ids": {0: "batch", 1: "src_len"}}
    dyn["memory"] = {0: "batch", 1: "src_len"}
    dyn["src_bias"] = {0: "batch", 1: "src_len"}
    for name in cross_names(n):
        dyn[name] = {0: "batch", 2: "src_len"}
    with torch.no_grad(), quiet():
        torch.onnx.export(
            LeanEncoderForExport(model).eval(),
            (src,),
            str(path),
            input_names=["src_ids"],
            output_names=names,
            dynamic_axes=dyn,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )


def export_decoder(model: Transformer, path: Path, opset: int = OPSET) -> None:
    cfg = model.config
    n, h, dh = cfg.n_decoder_layers, cfg.n_heads, cfg.d_model // cfg.n_heads
    b, kc, s, t = 2, 2, 5, 3
    ids = torch.tensor([[5], [6], [7], [8]], dtype=torch.long).clamp(max=cfg.vocab_size - 1)
    pos = torch.tensor([t - 1], dtype=torch.long)  # one spare cache entry
    bias = torch.zeros(b, s)
    bias[1, 3:] = float("-inf")
    cross = [torch.randn(b, h, s, dh) for _ in range(2 * n)]
    past = [torch.randn(b * kc, h, t, dh) for _ in range(2 * n)]
    dyn: dict[str, dict[int, str]] = {
        "input_ids": {0: "rows"},
        "position": {0: "position_rows"},
        "src_bias": {0: "batch", 1: "src_len"},
        "log_probs": {0: "rows"},
    }
    for name in cross_names(n):
        dyn[name] = {0: "batch", 2: "src_len"}
    for name in past_names(n):
        dyn[name] = {0: "rows", 2: "cache_len"}
    for name in new_kv_names(n):
        dyn[name] = {0: "rows"}
    with torch.no_grad(), quiet():
        torch.onnx.export(
            LeanDecoderStepForExport(model).eval(),
            (ids, pos, bias, *cross, *past),
            str(path),
            input_names=decoder_input_names(n),
            output_names=["log_probs", *new_kv_names(n)],
            dynamic_axes=dyn,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
    add_topk(path)


def add_topk(path: Path) -> None:
    """Append candidate selection to the decoder graph: topk over beam_scores + log_probs per sentence."""
    model = onnx.load(str(path))
    g = model.graph
    g.input.extend(
        [
            helper.make_tensor_value_info("beam_scores", TensorProto.FLOAT, ["batch", "beams"]),
            helper.make_tensor_value_info("num_candidates", TensorProto.INT64, [1]),
        ]
    )
    g.initializer.extend(
        [
            numpy_helper.from_array(np.array([-1], dtype=np.int64), "topk_minus_one"),
            numpy_helper.from_array(np.array([0, -1], dtype=np.int64), "topk_rows_flat"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "topk_axis2"),
        ]
    )
    g.node.extend(
        [
            helper.make_node("Shape", ["beam_scores"], ["topk_beam_shape"], name="topk/shape"),
            helper.make_node(
                "Concat",
                ["topk_beam_shape", "topk_minus_one"],
                ["topk_bkv_shape"],
                axis=0,
                name="topk/concat",
            ),
            helper.make_node("Reshape", ["log_probs", "topk_bkv_shape"], ["topk_lp3"], name="topk/lp3"),
            helper.make_node("Unsqueeze", ["beam_scores", "topk_axis2"], ["topk_bs3"], name="topk/bs3"),
            helper.make_node("Add", ["topk_bs3", "topk_lp3"], ["topk_cand3"], name="topk/add"),
            helper.make_node("Reshape", ["topk_cand3", "topk_rows_flat"], ["topk_cand"], name="topk/flat"),
            helper.make_node(
                "TopK",
                ["topk_cand", "num_candidates"],
                ["topk_scores", "topk_indices"],
                axis=-1,
                largest=1,
                sorted=1,
                name="topk/topk",
            ),
        ]
    )
    g.output.extend(
        [
            helper.make_tensor_value_info("topk_scores", TensorProto.FLOAT, ["batch", "candidates"]),
            helper.make_tensor_value_info("topk_indices", TensorProto.INT64, ["batch", "candidates"]),
        ]
    )
    onnx.save(model, str(path))


def save_graph(path: Path, graph: onnx.GraphProto, opset: int = OPSET) -> None:
    """Check and save a graph built node by node (the bundle's small cache graphs)."""
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="export", ir_version=8
    )
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def make_cache_graph(path: Path, n_tensors: int, elem_type: int, opset: int = OPSET) -> None:
    """y_j = Concat(Gather(x_j, idx), Gather(n_j, idx), axis=2) for j < n_tensors: reorders K/V rows by
    beam origin, drops finished rows and appends this step's K/V, on the device (IOBinding path)."""
    inputs = [helper.make_tensor_value_info("idx", TensorProto.INT64, ["m"])]
    outputs, nodes = [], []
    for j in range(n_tensors):
        inputs.append(helper.make_tensor_value_info(f"x_{j}", elem_type, ["n", f"h{j}", f"t{j}", f"d{j}"]))
        inputs.append(helper.make_tensor_value_info(f"n_{j}", elem_type, ["n", f"h{j}", f"u{j}", f"d{j}"]))
        outputs.append(helper.make_tensor_value_info(f"y_{j}", elem_type, ["m", f"h{j}", f"tu{j}", f"d{j}"]))
        nodes += [
            helper.make_node("Gather", [f"x_{j}", "idx"], [f"gx_{j}"], axis=0, name=f"gather_x_{j}"),
            helper.make_node("Gather", [f"n_{j}", "idx"], [f"gn_{j}"], axis=0, name=f"gather_n_{j}"),
            helper.make_node("Concat", [f"gx_{j}", f"gn_{j}"], [f"y_{j}"], axis=2, name=f"append_{j}"),
        ]
    save_graph(path, helper.make_graph(nodes, "cache_update", inputs, outputs), opset)


def make_kv_rows_graph(path: Path, n_tensors: int, elem_type: int, opset: int = OPSET) -> None:
    """Row storage of the in-flight batch on the device (IOBinding path), for j < n_tensors:

        y_j = Where(slot == pos, Gather(n_j, n_idx), Gather(Concat(Fit(a_j), Fit(b_j), axis=0), idx))

    a_j (Na, H, Ta, D), b_j (Nb, H, Tb, D): rows to pick from (b: rows joining the batch, or zero rows);
    Fit slices or zero-pads axis 2 to `t_out`; idx (M,) picks the output rows; n_j (Nn, H, 1, D) with
    n_idx, pos (M,): output row m gets n_j[n_idx[m]] written at slot pos[m] (none when pos[m] < 0).
    One graph covers every change of the running batch: beam reorders + this step's K/V at per-row
    positions, sentences leaving or joining, growing or trimming the time / source axis."""
    i64 = TensorProto.INT64
    inputs = [
        helper.make_tensor_value_info("idx", i64, ["m"]),
        helper.make_tensor_value_info("n_idx", i64, ["m"]),
        helper.make_tensor_value_info("pos", i64, ["m"]),
        helper.make_tensor_value_info("t_out", i64, [1]),
    ]
    outputs = []

    def const(name: str, values: list[int]) -> Any:
        return helper.make_node(
            "Constant", [], [name], value=helper.make_tensor(name, i64, [len(values)], values), name=name
        )

    nodes = [
        const("zero", [0]),
        const("one", [1]),
        const("axis2", [2]),
        const("pads_head", [0, 0, 0, 0, 0, 0]),
        const("slot_shape", [1, 1, -1, 1]),
        const("row_shape", [-1, 1, 1, 1]),
        # hit (M, 1, t_out, 1): where each output row takes the written K/V.
        helper.make_node("Squeeze", ["zero"], ["zero_s"], name="zero_s"),
        helper.make_node("Squeeze", ["one"], ["one_s"], name="one_s"),
        helper.make_node("Squeeze", ["t_out"], ["t_out_s"], name="t_out_s"),
        helper.make_node("Range", ["zero_s", "t_out_s", "one_s"], ["slots"], name="slots"),
        helper.make_node("Reshape", ["slots", "slot_shape"], ["slots4"], name="slots4"),
        helper.make_node("Reshape", ["pos", "row_shape"], ["pos4"], name="pos4"),
        helper.make_node("Equal", ["slots4", "pos4"], ["hit"], name="hit"),
    ]
    # Fit: the same slice end and pads for every tensor of one side (a or b): they share the time axis.
    for side in ("a", "b"):
        nodes += [
            helper.make_node("Shape", [f"{side}_0"], [f"{side}_t"], start=2, end=3, name=f"{side}_t"),
            helper.make_node("Min", [f"{side}_t", "t_out"], [f"{side}_keep"], name=f"{side}_keep"),
            helper.make_node("Sub", ["t_out", f"{side}_t"], [f"{side}_short"], name=f"{side}_short"),
            helper.make_node("Max", [f"{side}_short", "zero"], [f"{side}_pad"], name=f"{side}_pad"),
            helper.make_node(
                "Concat", ["pads_head", f"{side}_pad", "zero"], [f"{side}_pads"], axis=0, name=f"{side}_pads"
            ),
        ]
    for j in range(n_tensors):
        for side, rows, t in (("a", "na", "ta"), ("b", "nb", "tb")):
            inputs.append(helper.make_tensor_value_info(f"{side}_{j}", elem_type, [rows, "h", t, "d"]))
            sliced, fitted = f"{side}s_{j}", f"{side}f_{j}"
            nodes += [
                helper.make_node(
                    "Slice", [f"{side}_{j}", "zero", f"{side}_keep", "axis2"], [sliced], name=f"{side}_sl_{j}"
                ),
                helper.make_node("Pad", [sliced, f"{side}_pads"], [fitted], name=f"{side}_pad_{j}"),
            ]
        inputs.append(helper.make_tensor_value_info(f"n_{j}", elem_type, ["nn", "h", 1, "d"]))
        outputs.append(helper.make_tensor_value_info(f"y_{j}", elem_type, ["m", "h", "t_out", "d"]))
        nodes += [
            helper.make_node("Concat", [f"af_{j}", f"bf_{j}"], [f"ab_{j}"], axis=0, name=f"concat_{j}"),
            helper.make_node("Gather", [f"ab_{j}", "idx"], [f"g_{j}"], axis=0, name=f"gather_{j}"),
            helper.make_node("Gather", [f"n_{j}", "n_idx"], [f"gn_{j}"], axis=0, name=f"gather_n_{j}"),
            helper.make_node("Where", ["hit", f"gn_{j}", f"g_{j}"], [f"y_{j}"], name=f"write_{j}"),
        ]
    save_graph(path, helper.make_graph(nodes, "kv_rows", inputs, outputs), opset)


def make_kv_step_graph(path: Path, n_tensors: int, elem_type: int, opset: int = OPSET) -> None:
    """The in-flight batch's cache after a decoder step, on the device (IOBinding path), for j < n_tensors:

        y_j = ScatterND(Gather(a_j, idx), write, Reshape(Gather(n_j, idx), (M * H, D)))

    a_j (N, H, T, D): the cache; n_j (N, H, 1, D): this step's K/V; idx (M,): each output row's origin
    (beam reorder, sentences leaving); write (M * H, 3): [m, h, position of row m] for every m, h. Two
    passes over the cache where the general kv_rows graph makes five: the steady state of decoding."""
    i64 = TensorProto.INT64
    inputs = [
        helper.make_tensor_value_info("idx", i64, ["m"]),
        helper.make_tensor_value_info("write", i64, ["mh", 3]),
    ]
    outputs = []
    minus_one = helper.make_tensor("minus_one", i64, [1], [-1])
    nodes = [
        helper.make_node("Constant", [], ["minus_one"], value=minus_one, name="minus_one"),
        helper.make_node("Shape", ["a_0"], ["d"], start=3, end=4, name="d"),
        helper.make_node("Concat", ["minus_one", "d"], ["flat"], axis=0, name="flat"),
    ]
    for j in range(n_tensors):
        inputs.append(helper.make_tensor_value_info(f"a_{j}", elem_type, ["n", "h", "t", "d"]))
        inputs.append(helper.make_tensor_value_info(f"n_{j}", elem_type, ["n", "h", 1, "d"]))
        outputs.append(helper.make_tensor_value_info(f"y_{j}", elem_type, ["m", "h", "t", "d"]))
        nodes += [
            helper.make_node("Gather", [f"a_{j}", "idx"], [f"g_{j}"], axis=0, name=f"gather_{j}"),
            helper.make_node("Gather", [f"n_{j}", "idx"], [f"gn_{j}"], axis=0, name=f"gather_n_{j}"),
            helper.make_node("Reshape", [f"gn_{j}", "flat"], [f"u_{j}"], name=f"updates_{j}"),
            helper.make_node("ScatterND", [f"g_{j}", "write", f"u_{j}"], [f"y_{j}"], name=f"write_{j}"),
        ]
    save_graph(path, helper.make_graph(nodes, "kv_step", inputs, outputs), opset)


# ------------------------------------------------------------------------------------------ variants


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


def node_count(path: Path) -> int:
    return len(onnx.load(str(path), load_external_data=False).graph.node)


def check_graph(path: Path) -> None:
    onnx.checker.check_model(str(path), full_check=True)


# -------------------------------------------------------------------------------------------- parity


def _cpu_session(path: Path, threads: int = 1):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def pad_batch(seqs: list[list[int]], pad_id: int = 0) -> np.ndarray:
    out = np.full((len(seqs), max(len(s) for s in seqs)), pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out


def parity(
    model: Transformer, encoder_path: Path, decoder_path: Path, sources: list[list[int]], threads: int = 1
) -> dict[str, Any]:
    """ORT vs PyTorch on a batch of real sources, teacher-forced with PyTorch's own greedy outputs.

    Returns max abs differences: encoder memory and cross K/V; per-step log-probs of the ORT decoder (its
    own KV cache) vs `Transformer.decode_step` (PyTorch KV cache) and vs a full `Transformer.decode` pass
    over the whole prefix (cache == recompute); plus the greedy-token agreement on the top-1 candidate.
    """
    cfg = model.config
    n = cfg.n_decoder_layers
    enc, dec = _cpu_session(encoder_path, threads), _cpu_session(decoder_path, threads)
    src = pad_batch(sources, cfg.pad_id)
    src_t = torch.from_numpy(src)
    with torch.no_grad():
        limits = torch.tensor([max_output_length(len(s)) for s in sources])
        hyps = greedy_decode(model, src_t, limits)
        memory_t, pad_mask_t = model.encode(src_t)
        cross_t = model.cross_kv(memory_t)
        steps = max(len(h) for h in hyps) + 1
        tgt_in = torch.full((len(sources), steps), cfg.pad_id, dtype=torch.long)
        tgt_in[:, 0] = cfg.bos_id
        for i, h in enumerate(hyps):
            tgt_in[i, 1 : len(h) + 1] = torch.tensor(h, dtype=torch.long)
        full = F.log_softmax(model.decode(tgt_in, memory_t, pad_mask_t).float(), dim=-1)  # (B, T, V)

    fp16_io = any(i.type == "tensor(float16)" for i in dec.get_inputs())
    kv_dtype = np.float16 if fp16_io else np.float32
    enc_out = enc.run(None, {"src_ids": src})
    memory, src_bias, cross = enc_out[0], enc_out[1], enc_out[2:]
    diff_mem = float(np.abs(memory.astype(np.float32) - memory_t.numpy()).max())
    diff_cross = max(
        float(np.abs(c.astype(np.float32) - ref.numpy()).max())
        for c, ref in zip(cross, [t for kv in cross_t for t in kv], strict=True)
    )
    dh = cfg.d_model // cfg.n_heads
    past = [np.zeros((len(sources), cfg.n_heads, 0, dh), dtype=kv_dtype) for _ in range(2 * n)]
    past_t = [(torch.zeros(len(sources), cfg.n_heads, 0, dh),) * 2 for _ in range(n)]
    d_step = d_full = 0.0
    top1_agree = top1_total = 0
    beam_scores = np.zeros((len(sources), 1), dtype=np.float32)
    for t in range(steps):
        feed = {"input_ids": tgt_in[:, t : t + 1].numpy(), "position": np.array([t], dtype=np.int64)}
        feed["src_bias"] = src_bias
        feed.update(zip(cross_names(n), cross, strict=True))
        feed.update(zip(past_names(n), past, strict=True))
        feed["beam_scores"] = beam_scores
        feed["num_candidates"] = np.array([1], dtype=np.int64)
        out = dec.run(None, feed)
        lp, new, top_idx = out[0], out[1 : 1 + 2 * n], out[-1]
        past = [np.concatenate([p, x], axis=2) for p, x in zip(past, new, strict=True)]
        with torch.no_grad():
            lp_t, new_kv = model.decode_step(
                tgt_in[:, t : t + 1], torch.tensor([t]), past_t, cross_t, pad_mask_t
            )
        past_t = new_kv
        live = [i for i, h in enumerate(hyps) if t <= len(h)]  # rows still producing their hypothesis
        d_step = max(d_step, float(np.abs(lp[live] - lp_t.numpy()[live]).max()))
        d_full = max(d_full, float(np.abs(lp[live] - full[live, t].numpy()).max()))
        ref_top = lp_t.argmax(-1).numpy()
        top1_agree += int((top_idx[live, 0] == ref_top[live]).sum())
        top1_total += len(live)
    return {
        "sentences": len(sources),
        "steps": steps,
        "encoder_memory_max_abs": diff_mem,
        "cross_kv_max_abs": diff_cross,
        "step_logprob_max_abs": d_step,
        "step_vs_full_pass_logprob_max_abs": d_full,
        "top1_agreement": top1_agree / max(top1_total, 1),
    }
