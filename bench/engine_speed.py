"""Throughput/latency benchmark: the ONNX engine against PyTorch (with and without KV cache) and
CTranslate2 with the same weights, on the same test sentences, in one run.

    python -m bench.engine_speed --model models/en-es-small --bundle bundles/en-es-small \\
        [--sentences 64] [--reps 3] [--threads 2] [--json bench.json] [--profile]

Every system translates text to text (tokenization and detokenization included) with the same thread
count, after a warm-up pass; each repetition visits every system in turn (so background load is shared
out evenly), and the median repetition is reported. Settings: batch 1 and batch 32, greedy and beam 4,
max length derived from the source (min(256, 1.5 * src_len + 10)), length penalty 0.6.

Columns: generated tokens/s (output tokens of the best hypothesis, EOS excluded, over the median total
time) and per-batch latency (median and p90 over all batches of all repetitions). Greedy outputs of the
engine, PyTorch and CTranslate2 are compared token for token and the mismatches counted (beam outputs
are only reported: CTranslate2's beam search has its own stopping rules).

`--profile` adds where each engine system's time goes, per setting: `engine.last_stats` if the engine
exposes it (and from it a table of time per decoder step: ONNX Runtime against host), and a cProfile of
`Engine.translate` grouped into ONNX Runtime runs (by calling method), NumPy, tokenizer and Python
overhead. Without an engine, the PyTorch KV-cache decoder is profiled instead, as an example.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import multiprocessing
import os
import pstats
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from bench.machine import SAMPLE_TEXTS, cpu_info, describe, sample_texts
from model.decode import beam_search, greedy_decode, max_output_length
from model.model import KV, Transformer
from model.tokenizer import Tokenizer
from runtime.bundle import sha256_file

LENGTH_PENALTY = 0.6
SETTINGS = {  # name -> (batch size, beam size)
    "b1-greedy": (1, 1),
    "b1-beam4": (1, 4),
    "b32-greedy": (32, 1),
    "b32-beam4": (32, 4),
}
SYSTEMS = [
    "engine-fp32",
    "engine-fp32-text",
    "engine-int8",
    "torch-nocache",
    "torch-kv",
    "ct2-fp32",
    "ct2-int8",
    "peer-fp32",  # --peer-bundle: another model's bundle (a candidate architecture against the shipped one)
    "peer-int8",
]
ENGINE_SYSTEMS = ("engine-fp32", "engine-int8", "peer-fp32", "peer-int8")  # what --profile profiles
LABELS = {
    "engine-fp32": "ONNX engine fp32",
    "engine-fp32-text": "ONNX engine fp32 + text layer",
    "engine-int8": "ONNX engine int8",
    "torch-nocache": "PyTorch, no KV cache",
    "torch-kv": "PyTorch, KV cache",
    "ct2-fp32": "CTranslate2 float32",
    "ct2-int8": "CTranslate2 int8",
    "peer-fp32": "peer bundle, ONNX engine fp32",
    "peer-int8": "peer bundle, ONNX engine int8",
}
# (numerator, denominator) pairs of tokens/s ratios; > 1 means the numerator is faster.
RATIOS = [
    ("engine-fp32", "ct2-fp32"),
    ("engine-int8", "ct2-int8"),
    ("engine-int8", "ct2-fp32"),
    ("engine-fp32", "torch-kv"),
    ("torch-kv", "ct2-fp32"),
    ("torch-kv", "torch-nocache"),
    ("peer-fp32", "engine-fp32"),
    ("peer-int8", "engine-int8"),
]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------
# Systems: each maps a batch of texts and a beam size to the best hypothesis' token ids per text.


class System:
    name: str

    def translate(self, texts: list[str], beam: int) -> list[list[int]]:
        raise NotImplementedError

    def run_pass(self, texts: list[str], batch: int, beam: int) -> tuple[float, list[float], list]:
        """One timed pass over `texts` in batches: (seconds in all, seconds per batch, token ids)."""
        outputs: list[list[int]] = []
        lats = []
        t_start = time.perf_counter()
        for chunk in batches(texts, batch):
            t0 = time.perf_counter()
            outputs.extend(self.translate(chunk, beam))
            lats.append(time.perf_counter() - t0)
        return time.perf_counter() - t_start, lats, outputs


class NoCacheModel:
    """Stands in for a Transformer in the reference decoders, but recomputes the whole target prefix
    with a teacher-forced `model.decode` pass at every step (no self-attention K/V cache, no cached
    cross-attention K/V). The token prefix travels in the decoders' `self_kv` slot, so beam reordering
    (`index_select` on dim 0) reorders prefixes exactly as it would reorder a cache."""

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.config = model.config

    @property
    def training(self) -> bool:
        return self.model.training

    def eval(self) -> NoCacheModel:
        self.model.eval()
        return self

    def train(self, mode: bool = True) -> NoCacheModel:
        self.model.train(mode)
        return self

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        return self.model.encode(src)

    def cross_kv(self, memory: Tensor) -> list[KV]:
        return [(memory, memory)] * self.config.n_decoder_layers  # just carries the memory

    def decode_step(
        self, tokens: Tensor, position: Tensor, self_kv: list[KV], cross_kv: list[KV], src_pad_mask: Tensor
    ) -> tuple[Tensor, list[KV]]:
        past = self_kv[0][0]
        prefix = tokens if past.dim() != 2 else torch.cat([past, tokens], dim=1)  # (B, T)
        logits = self.model.decode(prefix, cross_kv[0][0], src_pad_mask)[:, -1]  # (B, V)
        new = (prefix, prefix)
        return torch.log_softmax(logits.float(), dim=-1), [new] * self.config.n_decoder_layers


def encode_texts(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    """One text at a time, as the engine does: sentencepiece's list calls start a thread pool per call
    (milliseconds of wall time on a busy machine), which would penalise the peers at small batches."""
    return [tok.encode(t) for t in texts]


def decode_texts(tok: Tokenizer, seqs: list[list[int]]) -> list[str]:
    return [tok.decode(s) for s in seqs]


def _pad(src: list[list[int]], pad_id: int) -> Tensor:
    width = max((len(s) for s in src), default=0) or 1
    t = torch.full((len(src), width), pad_id, dtype=torch.long)
    for row, s in enumerate(src):
        t[row, : len(s)] = torch.tensor(s, dtype=torch.long)
    return t


class TorchSystem(System):
    def __init__(self, name: str, model: Transformer, tok: Tokenizer, cache: bool) -> None:
        self.name, self.tok = name, tok
        self.model = model if cache else NoCacheModel(model)
        self.max_src = model.config.max_positions - 2

    def translate(self, texts: list[str], beam: int) -> list[list[int]]:
        ids = [s[: self.max_src] for s in encode_texts(self.tok, texts)]
        src = _pad(ids, self.tok.pad_id)
        limits = torch.tensor([max_output_length(len(s)) for s in ids])
        if beam == 1:
            out = greedy_decode(self.model, src, limits)  # type: ignore[arg-type]
        else:
            hyps = beam_search(self.model, src, beam, limits, LENGTH_PENALTY)  # type: ignore[arg-type]
            out = [h[0][0] for h in hyps]
        decode_texts(self.tok, out)
        return out


def _child_system(kind: str, name: str, path: str, option: str, threads: int, tokenizer: str) -> System:
    """What a ProcessSystem runs: ``torch`` (`path` the model snapshot, `option` "kv" or "nocache") or
    ``ct2`` (`path` the converted model, `option` the compute type)."""
    tok = Tokenizer(Path(tokenizer))
    if kind == "torch":
        from model.train import load_release

        torch.set_num_threads(threads)
        return TorchSystem(name, load_release(Path(path)), tok, cache=option == "kv")
    return CT2System(name, Path(path), option, tok, threads)


def _serve(conn, *spec: str | int) -> None:  # noqa: ANN001 (a multiprocessing Connection)
    """A ProcessSystem's child: builds the system, then answers ("pass", (texts, batch, beam)) with
    System.run_pass's timings measured here and ("translate", (texts, beam)) with tokens, until None."""
    system = _child_system(*spec)  # type: ignore[arg-type]
    conn.send("ready")
    while (request := conn.recv()) is not None:
        op, payload = request
        conn.send(system.run_pass(*payload) if op == "pass" else system.translate(*payload))


class ProcessSystem(System):
    """A system measured in a spawned process of its own, timed there. A process holding more than
    one multi-threaded OpenMP user slows CTranslate2 several-fold (2 threads on the 2-core build
    machine, session 49: 64 sentences at batch 1 in 0.40 s alone, 2.4 s once a second CTranslate2
    translator or PyTorch's threads have run, even after that one is deleted), so each CTranslate2
    compute type and PyTorch get a process, as each would in a deployment; the parent keeps PyTorch at
    one thread and runs ONNX Runtime only."""

    START_TIMEOUT_S = 300

    def __init__(self, kind: str, name: str, path: Path, option: str, threads: int, tokenizer: Path) -> None:
        context = multiprocessing.get_context("spawn")
        self.name = name
        self.conn, child = context.Pipe()
        spec = (kind, name, str(path), option, threads, str(tokenizer))
        self.process = context.Process(target=_serve, args=(child, *spec), daemon=True)
        self.process.start()
        child.close()
        if not self.conn.poll(self.START_TIMEOUT_S) or self.conn.recv() != "ready":
            self.close()
            raise RuntimeError(f"{name}: its process did not start")

    def translate(self, texts: list[str], beam: int) -> list[list[int]]:
        self.conn.send(("translate", (texts, beam)))
        return self.conn.recv()

    def run_pass(self, texts: list[str], batch: int, beam: int) -> tuple[float, list[float], list]:
        """Timed in the child, so the pipe is not in the figures."""
        self.conn.send(("pass", (texts, batch, beam)))
        return self.conn.recv()

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=10)


class CT2System(System):
    def __init__(self, name: str, ct2_dir: Path, compute_type: str, tok: Tokenizer, threads: int) -> None:
        from export.ctranslate2_spec import CT2Translator

        self.name, self.tok = name, tok
        self.ct2 = CT2Translator(ct2_dir, compute_type=compute_type, intra_threads=threads)

    def translate(self, texts: list[str], beam: int) -> list[list[int]]:
        ids = encode_texts(self.tok, texts)
        hyps = self.ct2.translate_ids(ids, beam_size=beam, length_penalty=LENGTH_PENALTY)
        out = [h[0].tokens for h in hyps]
        decode_texts(self.tok, out)
        return out


class EngineSystem(System):
    """The engine's raw model path (Engine.translate), or with text_layer the service's path
    (Engine.translate_texts: segmentation, masking, restoring; its tokens are the segments' tokens)."""

    def __init__(self, name: str, bundle: Path, variant: str, threads: int, text_layer: bool = False) -> None:
        from server.engine import DecodingOptions, Engine, use_shared_pool

        self.name = name
        self.text_layer = text_layer
        use_shared_pool(threads)  # as the server runs its engines: one ONNX Runtime pool for all
        self.engine = Engine(bundle, variant=variant, device="cpu", intra_op_threads=threads)
        self.options = {
            b: DecodingOptions(beam_size=b, num_hypotheses=1, max_length=0, length_penalty=LENGTH_PENALTY)
            for b in (1, 4)
        }
        self.engine.warmup()

    def translate(self, texts: list[str], beam: int) -> list[list[int]]:
        if self.text_layer:
            results = self.engine.translate_texts(texts, self.options[beam])
        else:
            results = self.engine.translate(texts, self.options[beam])
        return [r[0].tokens if r else [] for r in results]


# ----------------------------------------------------------------------------------------------------------
# Measurement


@dataclass
class Cell:
    system: str
    setting: str
    totals: list[float] = field(default_factory=list)  # seconds per repetition (all batches)
    latencies: list[float] = field(default_factory=list)  # seconds per batch, all repetitions
    tokens: int = 0
    outputs: list[list[int]] = field(default_factory=list)

    def summary(self) -> dict:
        total = statistics.median(self.totals)
        lat = sorted(self.latencies)
        return {
            "system": self.system,
            "setting": self.setting,
            "batch_size": SETTINGS[self.setting][0],
            "beam_size": SETTINGS[self.setting][1],
            "tokens": self.tokens,
            "total_s_median": round(total, 4),
            "total_s_all": [round(t, 4) for t in self.totals],
            "tokens_per_s": round(self.tokens / total, 1) if total > 0 else None,
            "latency_ms_p50": round(1000 * statistics.median(lat), 2),
            "latency_ms_p90": round(1000 * lat[min(len(lat) - 1, int(0.9 * len(lat)))], 2),
        }


def batches(texts: list[str], size: int) -> list[list[str]]:
    return [texts[i : i + size] for i in range(0, len(texts), size)]


def compare(a: list[list[int]], b: list[list[int]]) -> int:
    return sum(x != y for x, y in zip(a, b, strict=True))


def markdown_table(rows: list[dict], systems: list[str], settings: list[str]) -> str:
    head = "| system | " + " | ".join(f"{s} tok/s | {s} p50 ms" for s in settings) + " |"
    sep = "|---|" + "---:|---:|" * len(settings)
    by = {(r["system"], r["setting"]): r for r in rows}
    lines = [head, sep]
    for sys_name in systems:
        cells = []
        for s in settings:
            r = by.get((sys_name, s))
            cells += [f"{r['tokens_per_s']:.0f}", f"{r['latency_ms_p50']:.1f}"] if r else ["–", "–"]
        lines.append(f"| {LABELS[sys_name]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_table(
    ratios: dict[str, dict[str, Any]],
    settings: list[str],
    head: str = "tokens/s ratio",
    cell: Callable[[Any], str] = "{:.2f}".format,
) -> str:
    lines = [f"| {head} | " + " | ".join(settings) + " |", "|---|" + "---:|" * len(settings)]
    for key, per in ratios.items():
        lines.append(f"| {key} | " + " | ".join(cell(per[s]) if s in per else "–" for s in settings) + " |")
    return "\n".join(lines)


def paired_ratio(a: Cell, b: Cell) -> dict[str, float]:
    """a's tokens/s over b's, repetition by repetition (the two ran back to back in each): the median
    and range of those ratios. Robust where the machine's speed drifts between repetitions, which the
    ratio of the two medians is not."""
    per_rep = [(a.tokens / ta) / (b.tokens / tb) for ta, tb in zip(a.totals, b.totals, strict=True)]
    return {
        "median": round(statistics.median(per_rep), 3),
        "min": round(min(per_rep), 3),
        "max": round(max(per_rep), 3),
    }


def paired_cell(p: dict[str, float]) -> str:
    return f"{p['median']:.2f} ({p['min']:.2f}-{p['max']:.2f})"


# ----------------------------------------------------------------------------------------------------------
# Profile


def profile_system(system: System, texts: list[str], batch: int, beam: int, top: int = 18) -> dict:
    """cProfile one pass; group the time into ONNX Runtime runs (per calling function), NumPy, tokenizer,
    torch ops and Python overhead; include engine.last_stats when the engine exposes it."""
    system.run_pass(texts, batch, beam)  # warm
    engine = getattr(system, "engine", None)
    last_stats = []  # from the unprofiled pass, so the engine's own timers are undisturbed
    t0 = time.perf_counter()
    for chunk in batches(texts, batch):
        system.translate(chunk, beam)
        if engine is not None and getattr(engine, "last_stats", None) is not None:
            st = engine.last_stats
            last_stats.append(dict(st) if isinstance(st, dict) else getattr(st, "__dict__", repr(st)))
    wall_plain = time.perf_counter() - t0
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for chunk in batches(texts, batch):
        system.translate(chunk, beam)
    prof.disable()
    wall_prof = time.perf_counter() - t0
    st = pstats.Stats(prof)
    groups: dict[str, float] = {}
    ort_by_caller: dict[str, float] = {}
    rows = []
    for (filename, line, func), (_cc, _nc, tt, ct, callers) in st.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(filename).name}:{line}({func})" if filename != "~" else func
        rows.append((tt, ct, where))
        if "onnxruntime" in func or "InferenceSession" in func or "onnxruntime" in filename:
            group = "onnxruntime"
            if filename == "~" and "run" in func:  # the C++ InferenceSession.run*: attribute to callers
                for (cf, cl, cfn), caller_stats in callers.items():
                    _attribute(st.stats, (cf, cl, cfn), caller_stats[3], ort_by_caller)  # type: ignore[attr-defined]
        elif "sentencepiece" in filename or "sentencepiece" in func or "tokenizer.py" in filename:
            group = "tokenizer"
        elif "numpy" in filename or "numpy" in func:
            group = "numpy"
        elif "torch" in filename or "torch" in func or "Tensor" in func:
            group = "torch ops"
        elif "ctranslate2" in func:
            group = "ctranslate2"
        elif "engine" in filename:
            group = "engine python"
        else:
            group = "other python"
        groups[group] = groups.get(group, 0.0) + tt
    total_tt = sum(groups.values()) or 1.0
    rows.sort(reverse=True)
    report = {
        "system": system.name,
        "setting": f"batch {batch}, beam {beam}",
        "wall_s_unprofiled": round(wall_plain, 4),
        "wall_s_profiled": round(wall_prof, 4),
        "groups_s": {k: round(v, 4) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
        "groups_share": {k: round(v / total_tt, 3) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
        "onnxruntime_run_by_caller_s": {
            k: round(v, 4) for k, v in sorted(ort_by_caller.items(), key=lambda kv: -kv[1])
        },
        "top_functions_tottime": [
            {"tottime_s": round(tt, 4), "cumtime_s": round(ct, 4), "function": w} for tt, ct, w in rows[:top]
        ],
    }
    if last_stats:
        merged = _merge_stats(last_stats)
        report["engine_last_stats"] = merged
        if isinstance(merged, dict) and "total_s" in merged:
            report["engine_breakdown_s"] = _breakdown(merged)
            steps = max(int(merged.get("steps", 0)), 1)
            host = merged.get("generate_s", 0.0) - merged.get("encoder_s", 0.0) - merged.get("decoder_s", 0.0)
            report["per_step"] = {
                "steps": steps,
                "rows_per_step": merged.get("row_steps", 0) / steps,
                "decoder_us": 1e6 * merged.get("decoder_s", 0.0) / steps,
                "host_us": 1e6 * max(host, 0.0) / steps,
                "encoder_share": merged.get("encoder_s", 0.0) / max(merged["total_s"], 1e-9),
            }
    return report


def _breakdown(st: dict) -> dict[str, float]:
    """The engine's own timers, summed over batches, as a partition of its total time."""
    parts = {
        "tokenize": st.get("tokenize_s", 0.0),
        "encoder (ORT)": st.get("encoder_s", 0.0),
        "decoder steps (ORT)": st.get("decoder_s", 0.0),
        "candidate selection": st.get("select_s", 0.0),
        "cache reorder/compaction": st.get("reorder_s", 0.0),
        "detokenize": st.get("detokenize_s", 0.0),
    }
    parts["other Python overhead"] = max(0.0, st["total_s"] - sum(parts.values()))
    return {k: round(v, 4) for k, v in parts.items()}


def _attribute(stats: dict, key: tuple, seconds: float, out: dict[str, float], depth: int = 0) -> None:
    """Charge `seconds` to the first caller outside onnxruntime's own Python wrapper, walking up the
    call graph and splitting by each caller's share of the cumulative time."""
    filename, line, func = key
    if "onnxruntime" not in filename or depth > 8 or key not in stats:
        name = f"{Path(filename).name}:{line}({func})"
        out[name] = out.get(name, 0.0) + seconds
        return
    callers = stats[key][4]
    total = sum(c[3] for c in callers.values()) or 1.0
    for caller, c in callers.items():
        _attribute(stats, caller, seconds * c[3] / total, out, depth + 1)


def _merge_stats(stats: list) -> object:
    """Sum numeric fields of per-batch engine stats dicts (other fields: last value)."""
    if not all(isinstance(s, dict) for s in stats):
        return stats[-1]
    merged: dict = {}
    for s in stats:
        for k, v in s.items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                merged[k] = merged.get(k, 0) + v
            else:
                merged[k] = v
    return merged


def print_profile(rep: dict) -> None:
    log(f"\n== profile: {rep['system']}, {rep['setting']} ==")
    log(f"wall {rep['wall_s_unprofiled']:.3f}s unprofiled, {rep['wall_s_profiled']:.3f}s under cProfile")
    if "engine_last_stats" in rep:
        log("engine.last_stats (summed over batches): " + json.dumps(rep["engine_last_stats"], default=str))
    if "engine_breakdown_s" in rep:
        total = sum(rep["engine_breakdown_s"].values()) or 1.0
        log("engine time by phase (its own timers, unprofiled pass):")
        for k, v in rep["engine_breakdown_s"].items():
            log(f"  {k:<26} {v:8.3f}s  {100 * v / total:5.1f}%")
    log("self time by group:")
    for k, v in rep["groups_s"].items():
        log(f"  {k:<16} {v:8.3f}s  {100 * rep['groups_share'][k]:5.1f}%")
    if rep["onnxruntime_run_by_caller_s"]:
        log("InferenceSession.run time by calling function (encoder vs decoder step vs ...):")
        for k, v in rep["onnxruntime_run_by_caller_s"].items():
            log(f"  {v:8.3f}s  {k}")
    log("top functions by self time:")
    for r in rep["top_functions_tottime"]:
        log(f"  {r['tottime_s']:8.3f}s self {r['cumtime_s']:8.3f}s cum  {r['function']}")


# ----------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=Path("models/en-es-small"))
    parser.add_argument("--bundle", type=Path, default=Path("bundles/en-es-small"))
    parser.add_argument(
        "--texts",
        type=Path,
        default=SAMPLE_TEXTS,
        help="sentences to translate, one per line (default: "
        "the shipped sample, half UI strings, half one-to-three-sentence descriptions)",
    )
    parser.add_argument("--data", type=Path, help="sample the corpus' test split here instead of --texts")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-source-tokens", type=int, default=200, help="sample only test sentences up to this length"
    )
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions (median reported)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads for every system")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"subset of {','.join(SETTINGS)}")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"subset of {','.join(SYSTEMS)}")
    parser.add_argument(
        "--peer-bundle",
        type=Path,
        help="another model's bundle, timed in the same run as peer-fp32/peer-int8 (same sentences; "
        "its outputs are its own, so only its speed is compared)",
    )
    parser.add_argument("--json", type=Path, help="write results here")
    parser.add_argument("--profile", action="store_true", help="also profile the engine's translate")
    args = parser.parse_args(argv)

    settings = [s for s in args.settings.split(",") if s]
    wanted = [s for s in args.systems.split(",") if s]
    for s in settings:
        if s not in SETTINGS:
            parser.error(f"unknown setting {s}")
    for s in wanted:
        if s not in SYSTEMS:
            parser.error(f"unknown system {s}")

    torch.set_num_threads(1)  # PyTorch's timed decoders run in processes of their own (ProcessSystem)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    notes: list[str] = []
    load_before = os.getloadavg()
    machine = cpu_info()

    # Snapshot the model directory: training may rewrite it while we run.
    tmp = Path(tempfile.mkdtemp(prefix="bench-"))
    systems: dict[str, System] = {}
    try:
        snapshot = tmp / "model"
        shutil.copytree(args.model, snapshot)
        model_sha = sha256_file(snapshot / "model.safetensors")
        from model.corpus import read_split
        from model.train import load_release

        model = load_release(snapshot)
        tokenizer = snapshot / "tokenizer.model"
        tok = Tokenizer(tokenizer)
        # Stripped: the engine translates the stripped text (keeping the outer whitespace aside).
        if args.data is None:
            pool = sample_texts(args.texts)
            origin = str(args.texts)
        else:
            pool = [p[0].strip() for p in read_split(args.data, "test") if p[0].strip()]
            origin = f"{args.data} test split"
        pool = [
            t
            for t, ids in zip(pool, tok.encode_batch(pool), strict=True)
            if len(ids) <= args.max_source_tokens
        ]
        texts = random.Random(args.seed).sample(pool, min(args.sentences, len(pool)))
        src_lens = [len(s) for s in tok.encode_batch(texts)]
        log(
            f"{len(texts)} sentences of {origin} (seed {args.seed}), {sum(src_lens)} source tokens, "
            f"mean {statistics.mean(src_lens):.1f}; model {args.model} (sha256 {model_sha[:12]}), "
            f"{args.threads} threads, load average {load_before[0]:.2f}; CPU: {describe(machine)}"
        )

        if "torch-nocache" in wanted:
            systems["torch-nocache"] = ProcessSystem(
                "torch", "torch-nocache", snapshot, "nocache", args.threads, tokenizer
            )
        if "torch-kv" in wanted:
            systems["torch-kv"] = ProcessSystem("torch", "torch-kv", snapshot, "kv", args.threads, tokenizer)
        if any(s.startswith("ct2") for s in wanted):
            try:
                from export.ctranslate2_spec import convert_model, vocabulary_pieces

                ct2_dir = convert_model(model, vocabulary_pieces(tokenizer), tmp / "ct2")
                for name, ctype in (("ct2-fp32", "float32"), ("ct2-int8", "int8")):
                    if name in wanted:
                        systems[name] = ProcessSystem("ct2", name, ct2_dir, ctype, args.threads, tokenizer)
            except ImportError as e:
                notes.append(f"CTranslate2 skipped: {e}")
        engines = [("engine-fp32", args.bundle, "fp32"), ("engine-fp32-text", args.bundle, "fp32")]
        engines += [("engine-int8", args.bundle, "int8")]
        if args.peer_bundle is not None:
            engines += [("peer-fp32", args.peer_bundle, "fp32"), ("peer-int8", args.peer_bundle, "int8")]
        for name, bundle, variant in engines:
            if name not in wanted:
                continue
            try:
                systems[name] = EngineSystem(name, bundle, variant, args.threads, name.endswith("-text"))
            except Exception as e:  # noqa: BLE001 - engine or bundle not there (yet), or no such variant
                notes.append(f"{name} skipped: {type(e).__name__}: {e}")
        if any(n.startswith("engine") for n in systems):
            manifest = args.bundle / "manifest.json"
            if manifest.exists() and model_sha not in manifest.read_text():
                notes.append(
                    "the bundle's manifest does not mention this model.safetensors' sha256: the "
                    "engine may have been exported from another checkpoint (see greedy mismatches)"
                )
        for n in notes:
            log("note: " + n)
        order = [s for s in SYSTEMS if s in systems]

        cells: dict[tuple[str, str], Cell] = {}
        for setting in settings:
            batch, beam = SETTINGS[setting]
            log(f"\n[{setting}] batch {batch}, beam {beam}")
            for name in order:  # warm-up pass, also the outputs compared below
                t, _, out = systems[name].run_pass(texts, batch, beam)
                cell = cells[(name, setting)] = Cell(name, setting, outputs=out, tokens=sum(map(len, out)))
                log(f"  warm-up {name:<14} {t:7.2f}s  {cell.tokens} tokens")
            for rep in range(args.reps):
                for name in order:
                    t, lats, out = systems[name].run_pass(texts, batch, beam)
                    cell = cells[(name, setting)]
                    cell.totals.append(t)
                    cell.latencies.extend(lats)
                    if out != cell.outputs:
                        notes.append(f"{name} {setting}: outputs changed between passes")
                    log(f"  rep {rep + 1}/{args.reps} {name:<14} {t:7.2f}s  {cell.tokens / t:8.1f} tok/s")

        rows = [cells[(n, s)].summary() for s in settings for n in order if (n, s) in cells]

        # Output agreement.
        agreement: dict[str, dict[str, int]] = {}
        pairs_to_check = [
            ("ct2-fp32", "torch-kv"),
            ("engine-fp32", "ct2-fp32"),
            ("engine-fp32", "torch-kv"),
            ("torch-nocache", "torch-kv"),
            ("engine-int8", "ct2-int8"),
            ("engine-int8", "engine-fp32"),
            ("ct2-int8", "ct2-fp32"),
        ]
        for s in settings:
            for a, b in pairs_to_check:
                if (a, s) in cells and (b, s) in cells:
                    agreement.setdefault(s, {})[f"{a} vs {b}"] = compare(
                        cells[(a, s)].outputs, cells[(b, s)].outputs
                    )
        # Batch invariance: the same text must get the same output alone and inside a batch of 32.
        batch_variance: dict[str, dict[str, int]] = {}
        for name in order:
            for beam, (s1, s32) in {
                "greedy": ("b1-greedy", "b32-greedy"),
                "beam4": ("b1-beam4", "b32-beam4"),
            }.items():
                if (name, s1) in cells and (name, s32) in cells:
                    batch_variance.setdefault(name, {})[beam] = compare(
                        cells[(name, s1)].outputs, cells[(name, s32)].outputs
                    )
        ratios: dict[str, dict[str, float]] = {}
        paired: dict[str, dict[str, dict[str, float]]] = {}
        for a, b in RATIOS:
            for s in settings:
                if (a, s) in cells and (b, s) in cells:
                    ra, rb = cells[(a, s)].summary(), cells[(b, s)].summary()
                    ratios.setdefault(f"{a} / {b}", {})[s] = round(ra["tokens_per_s"] / rb["tokens_per_s"], 3)
                    paired.setdefault(f"{a} / {b}", {})[s] = paired_ratio(cells[(a, s)], cells[(b, s)])
        # The text layer's cost: time per repetition with it over without it (same texts, same passes).
        text_cost = {
            s: round(100 * (cells[("engine-fp32-text", s)].summary()["total_s_median"]
                            / cells[("engine-fp32", s)].summary()["total_s_median"] - 1), 1)
            for s in settings
            if ("engine-fp32-text", s) in cells and ("engine-fp32", s) in cells
        }  # fmt: skip
        load_after = os.getloadavg()
        md = markdown_table(rows, order, settings)
        md_ratios = ratio_table(ratios, settings)

        print(
            f"\n{len(texts)} sentences, {args.threads} threads, median of {args.reps} reps "
            f"(load average {load_before[0]:.2f} -> {load_after[0]:.2f}); CPU: {describe(machine)}\n"
        )
        print(md)
        print()
        print(md_ratios)
        if args.reps > 1 and paired:
            print("\npaired tokens/s ratios (median of the repetitions' own ratios, min-max): each")
            print("repetition times the systems back to back, so a machine whose speed drifts between")
            print("repetitions moves both sides of a repetition's ratio alike\n")
            print(ratio_table(paired, settings, "paired ratio", paired_cell))
        print("\ngreedy/beam output mismatches (sentences whose best hypothesis differs):")
        for s, d in agreement.items():
            print(f"  {s}: " + ", ".join(f"{k}: {v}" for k, v in d.items()))
        if text_cost:
            print(
                "text layer cost (time with / without - 1): "
                + ", ".join(f"{s} {v:+.1f}%" for s, v in text_cost.items())
            )
        if batch_variance:
            print("batch 1 vs batch 32 output differences (same system, same beam; 0 = batch-invariant):")
            print("  " + ", ".join(f"{n} {b}: {v}" for n, d in batch_variance.items() for b, v in d.items()))

        profile = None
        if args.profile:
            targets = [systems[n] for n in ENGINE_SYSTEMS if n in systems]
            if not targets:
                log("\nno engine to profile; profiling the PyTorch KV-cache decoder instead, as an example")
                torch.set_num_threads(args.threads)  # in this process: cProfile sees only its own calls
                targets = [TorchSystem("torch-kv", model, tok, cache=True)]
            profile = []
            for setting in settings:
                batch, beam = SETTINGS[setting]
                for target in targets:
                    rep = profile_system(target, texts, batch, beam)
                    print_profile(rep)
                    profile.append(rep)
            steps_table = [r for r in profile if "per_step" in r]
            if steps_table:
                print(
                    "\nper decoder step (engine timers, unprofiled pass; host = selection + cache + Python):"
                )
                print(
                    "| system | setting | steps | rows per step | ORT decoder us | host us | encoder share |"
                )
                print("|---|---|---:|---:|---:|---:|---:|")
                for r in steps_table:
                    ps = r["per_step"]
                    print(
                        f"| {r['system']} | {r['setting']} | {ps['steps']} | {ps['rows_per_step']:.1f} | "
                        f"{ps['decoder_us']:.0f} | {ps['host_us']:.0f} | {100 * ps['encoder_share']:.0f}% |"
                    )

        key_pairs = ("engine-fp32 vs ct2-fp32", "ct2-fp32 vs torch-kv", "engine-fp32 vs torch-kv")
        greedy_mm = [
            f"{s} {k} {v}/{len(texts)}"
            for s, d in agreement.items()
            if SETTINGS[s][1] == 1
            for k, v in d.items()
            if k in key_pairs
        ]
        engine_ratios = [
            f"{k} = " + ", ".join(f"{s} {v:.2f}" for s, v in per.items())
            for k, per in ratios.items()
            if (k.startswith("engine") and "ct2" in k) or k.startswith("peer")
        ]
        summary = (
            f"Summary: {len(order)} systems x {len(settings)} settings on {len(texts)} sentences, "
            f"{args.threads} threads, median of {args.reps} reps.\n  tokens/s ratios: "
            + ("; ".join(engine_ratios) if engine_ratios else "(no engine against CTranslate2 or peer)")
            + "\n  greedy mismatches: "
            + ("; ".join(greedy_mm) or "(not checked)")
        )
        variant_rows = [f"{n} {b} {v}" for n, d in batch_variance.items() for b, v in d.items() if v]
        if batch_variance:
            summary += "\n  batch-dependent outputs (b1 vs b32): " + ("; ".join(variant_rows) or "none")
        if text_cost:
            summary += "\n  text layer cost: " + ", ".join(f"{s} {v:+.1f}%" for s, v in text_cost.items())
        if notes:
            summary += "\nNotes: " + " | ".join(notes)
        print("\n" + summary)

        if args.json:
            result = {
                "meta": {
                    "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "model": str(args.model),
                    "model_sha256": model_sha,
                    "bundle": str(args.bundle),
                    "peer_bundle": str(args.peer_bundle) if args.peer_bundle else None,
                    "sentences": len(texts),
                    "source_tokens": sum(src_lens),
                    "seed": args.seed,
                    "max_source_tokens": args.max_source_tokens,
                    "reps": args.reps,
                    "threads": args.threads,
                    "length_penalty": LENGTH_PENALTY,
                    "loadavg_before": load_before,
                    "loadavg_after": load_after,
                    "texts": origin,
                    "cpu": machine,
                    "torch": torch.__version__,
                    "versions": _versions(),
                },
                "results": rows,
                "ratios_tokens_per_s": ratios,
                "paired_ratios_tokens_per_s": paired,
                "mismatches": agreement,
                "batch1_vs_batch32_differences": batch_variance,
                "text_layer_cost_percent": text_cost,
                "notes": notes,
                "markdown": md + "\n\n" + md_ratios,
                "profile": profile,
                "summary": summary,
            }
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=2) + "\n")
            log(f"wrote {args.json}")
    finally:
        for system in systems.values():
            if isinstance(system, ProcessSystem):
                system.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _versions() -> dict[str, str]:
    out = {}
    for mod in ("ctranslate2", "onnxruntime", "numpy"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            pass
    return out


if __name__ == "__main__":
    main()
