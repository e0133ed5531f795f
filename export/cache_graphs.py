"""The bundle's small cache graphs, built node by node with onnx.helper (no PyTorch): they move K/V
rows on the device for the IOBinding path of the engine (server/engine, `BoundCache`).

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

from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto, helper

from export.onnx_export import OPSET


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
