"""Which int8 GEMM formulation is fastest on this CPU? One ONNX Runtime session per candidate, each a
single (M, K) x (K, N) product with the model's weight shapes, timed side by side (best of --reps,
candidates interleaved, one thread):

* `fp32`: plain MatMul (the fp32 bundle);
* `row-int8`: the int8 bundle's formulation (export/int8.py): activations quantized per row in 7 small
  ops, u8 x s8 MatMulIntegerToFloat, row rescale;
* `nbits8` / `nbits4`: com.microsoft MatMulNBits with 8- or 4-bit weights in blocks of --block and
  accuracy_level 4 (MLAS quantizes the activations to int8 per block and uses integer dot products).

Per candidate: microseconds per product, the largest error relative to the fp32 product's largest
value, and whether row 0 comes out the same alone and in the batch (batch invariance: the service's
outputs must not depend on batch mates).

    python -m bench.int8_gemm [--shapes 256x768,256x1024,1024x256,256x8000] [--rows 1,4,32,128]
        [--block 32] [--reps 3] [--json out.json]

On AVX2 the bundle's row-int8 wins from 4 rows up; CPUs with VNNI or AMX may order them differently.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from bench.machine import cpu_info, describe
from export.int8 import QUANT_CONSTANTS, ZERO_POINT, quantize_weight, row_quantizer

SHAPES = "256x768,256x256,256x1024,1024x256,256x8000"  # en-es-small: QKV, out, FFN in/out, vocabulary
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


def _model(nodes: list, inits: list, k: int, n: int) -> onnx.ModelProto:
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])
    graph = helper.make_graph(nodes, "gemm", [a], [y], initializer=inits)
    return helper.make_model(graph, opset_imports=OPSETS)


def fp32_gemm(w: np.ndarray) -> onnx.ModelProto:
    k, n = w.shape
    return _model([helper.make_node("MatMul", ["A", "W"], ["Y"])], [numpy_helper.from_array(w, "W")], k, n)


def row_int8_gemm(w: np.ndarray) -> onnx.ModelProto:
    """The int8 bundle's product, built with export/int8.py's own quantizers."""
    k, n = w.shape
    quant, xq, scale = row_quantizer("A")
    wq, ws = quantize_weight(w)
    inits = [numpy_helper.from_array(v, name) for name, v in QUANT_CONSTANTS.items()]
    inits += [numpy_helper.from_array(wq, "wq"), numpy_helper.from_array(ws, "ws")]
    nodes = [
        *quant,
        helper.make_node(
            "MatMulIntegerToFloat",
            [xq, "wq", "int8_one", "ws", "int8_zero_point"],
            ["acc"],
            domain="com.microsoft",
        ),
        helper.make_node("Mul", ["acc", scale], ["Y"]),
    ]
    return _model(nodes, inits, k, n)


def nbits_gemm(w: np.ndarray, bits: int, block: int) -> onnx.ModelProto:
    """MatMulNBits: weights per (column, block of K) symmetric, stored unsigned around 2^(bits-1)."""
    k, n = w.shape
    blocks = k // block
    wt = w.T.reshape(n, blocks, block).astype(np.float64)
    levels = 2 ** (bits - 1) - 1
    scale = np.abs(wt).max(axis=-1) / levels
    scale[scale == 0] = 1.0
    q = (np.clip(np.rint(wt / scale[..., None]), -levels - 1, levels) + 2 ** (bits - 1)).astype(np.uint8)
    packed = q if bits == 8 else (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    scales = scale.astype(np.float32).ravel()
    inits = [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales, "S")]
    node = helper.make_node(
        "MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft",
        K=k, N=n, bits=bits, block_size=block, accuracy_level=4,
    )  # fmt: skip
    return _model([node], inits, k, n)


def candidates(w: np.ndarray, block: int) -> dict[str, onnx.ModelProto]:
    out = {"fp32": fp32_gemm(w), "row-int8": row_int8_gemm(w)}
    if w.shape[0] % block == 0:
        out |= {"nbits8": nbits_gemm(w, 8, block), "nbits4": nbits_gemm(w, 4, block)}
    return out


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def measure(w: np.ndarray, rows: list[int], block: int, reps: int, seed: int = 0) -> list[dict[str, Any]]:
    sessions = {name: session(m) for name, m in candidates(w, block).items()}
    rng = np.random.default_rng(seed)
    results = []
    for m in rows:
        x = rng.standard_normal((m, w.shape[0])).astype(np.float32)
        ref = x @ w
        runs = max(3, 400 // m)
        best = dict.fromkeys(sessions, float("inf"))
        for _ in range(reps):
            for name, s in sessions.items():
                t0 = time.perf_counter()
                for _ in range(runs):
                    s.run(None, {"A": x})
                best[name] = min(best[name], (time.perf_counter() - t0) / runs)
        for name, s in sessions.items():
            y = s.run(None, {"A": x})[0]
            alone = s.run(None, {"A": x[:1]})[0]
            results.append({
                "k": w.shape[0], "n": w.shape[1], "rows": m, "candidate": name, "us": 1e6 * best[name],
                "rel_error": float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-12)),
                "batch_invariant": bool(np.array_equal(alone[0], y[0])),
            })  # fmt: skip
    return results


def _cell(r: dict[str, Any]) -> str:
    return f"{r['us']:.0f} ({r['rel_error']:.3f}{'' if r['batch_invariant'] else ', varies'})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.int8_gemm", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=SHAPES, help="KxN weight shapes, comma-separated")
    p.add_argument("--rows", default="1,4,32,128", help="activation rows M (sentences x beam)")
    p.add_argument("--block", type=int, default=32, help="MatMulNBits block size along K")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    info = cpu_info()
    print(f"{describe(info)}; onnxruntime {ort.__version__}, 1 thread", file=sys.stderr)
    rng = np.random.default_rng(0)
    results = []
    for k, n in shapes:
        w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
        results += measure(w, rows, args.block, args.reps)
        print(f"{k}x{n} done", file=sys.stderr, flush=True)
    names = list(dict.fromkeys(r["candidate"] for r in results))
    print(f"\n{describe(info)}, onnxruntime {ort.__version__}, 1 thread: us per product (max rel. error)\n")
    print("| K x N | rows | " + " | ".join(names) + " | fastest |")
    print("|---|---:|" + "---:|" * len(names) + "---|")
    for k, n in shapes:
        for m in rows:
            row = {r["candidate"]: r for r in results if (r["k"], r["n"], r["rows"]) == (k, n, m)}
            cells = [_cell(row[c]) if c in row else "-" for c in names]
            fastest = min(row.values(), key=lambda r: r["us"])["candidate"]
            print(f"| {k}x{n} | {m} | " + " | ".join(cells) + f" | {fastest} |")
    print("\n'varies': row 0 differs alone and in the batch (not batch-invariant).")
    if args.json:
        report = {"cpu": info, "onnxruntime": ort.__version__, "zero_point": ZERO_POINT, "results": results}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
