"""The serving check for a CUDA machine, in one command and one JSON report (issue 32, item 1).

    python -m bench.gpu_check --json $OUT/gpu-check.json            # on the GPU machine (bench/gpu_run.sh)
    python -m bench.gpu_check --cpu-only --json runs/gpu-check.json  # anywhere: the same path on the CPU

Stages, each timed, each one's outcome or the reason it was skipped in the report:

1. env: Python, torch, ONNX Runtime (and its providers), CTranslate2 (and its CUDA devices), gRPC,
   protobuf; the GPU (name, memory, driver, from nvidia-smi and torch); every package the GPU path
   needs that is missing, named. The report is written even then, and the command exits 2.
2. bundle: the shipped checkpoint exported with fp32 and fp16 variants (`export.build.export_bundle`),
   or `--bundle` as given.
3. parity: the engine on the device against the engine on the CPU provider (fp32), on the test sample
   (bench/data/speed.en): max |difference| of the per-step log-probs teacher-forced on the CPU's
   greedy output (each engine with its own encoder and K/V cache), and the greedy and beam-4 outputs
   that differ; for fp32 and fp16.
4. inflight: the in-flight batch on the device (K/V on the device through the bundle's kv_rows/kv_step
   graphs when the sessions run on CUDA): its outputs against request-level decoding (must be
   identical), then `bench.saturation.measure` (sentences/s of request batches in arrival order, sorted
   by length, and in flight; host time per step).
5. grpc: `python -m server --device DEVICE` per batching mode (bench.batching.Server) under a closed
   loop of `--concurrency` clients for `--grpc-seconds` (client.load.run_load, the real client):
   requests/s, p50/p95/p99 latency, errors, GPU memory while it serves.
6. speed: bench.engine_speed's systems and timing (System.run_pass, median of `--reps`) for the engine (fp32,
   fp16) and CTranslate2 (float32, float16) with the same weights on the device, at b1/b32 x greedy/beam 4
   and b128 greedy; tokens/s, latency p50, engine/CTranslate2 ratios, output mismatches.

`--cpu-only` runs every stage on the CPU provider with tiny counts (what `make test` runs: about half a
minute); the CUDA-only parts (fp16, GPU memory, CTranslate2 on CUDA) are reported as skipped. On a
CUDA machine the whole check is sized to finish in about 5 minutes (`--budget-s` bounds it: a stage
that would start after the budget is skipped and says so). CTranslate2 on CUDA is first tried in a
subprocess (`--ct2-probe`): a failing CUDA library then costs that stage, not the report.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import itertools
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
SETTINGS = {  # name -> (batch size, beam size); engine_speed's four plus batch 128 greedy
    "b1-greedy": (1, 1),
    "b1-beam4": (1, 4),
    "b32-greedy": (32, 1),
    "b32-beam4": (32, 4),
    "b128-greedy": (128, 1),
}
# Import name -> pip name of everything the GPU path imports (server, client, export, bench).
NEEDED = {
    "torch": "torch",
    "onnx": "onnx",
    "onnxruntime": "onnxruntime-gpu",
    "sentencepiece": "sentencepiece",
    "safetensors": "safetensors",
    "sacrebleu": "sacrebleu",
    "grpc": "grpcio",
    "grpc_health": "grpcio-health-checking",
    "grpc_reflection": "grpcio-reflection",
    "grpc_status": "grpcio-status",
    "google.rpc": "googleapis-common-protos",
    "google.protobuf": "protobuf",
    "prometheus_client": "prometheus-client",
    "aiohttp": "aiohttp",
    "sentencex": "sentencex",
    "polib": "polib",
    "tqdm": "tqdm",
    "ctranslate2": "ctranslate2",
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- stage 1: environment ------------------------------------------------------------------------------


def nvidia_smi(query: str, what: str = "--query-gpu") -> list[list[str]]:
    """Rows of `nvidia-smi {what}={query} --format=csv,noheader,nounits` ([] without nvidia-smi)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", f"{what}={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def gpu_memory_mib() -> dict[str, int] | None:
    """Used and total memory of GPU 0, MiB (None without a GPU)."""
    rows = nvidia_smi("memory.used,memory.total")
    if not rows:
        return None
    try:
        return {"used": int(rows[0][0]), "total": int(rows[0][1])}
    except (ValueError, IndexError):
        return None


def versions() -> tuple[dict[str, str], dict[str, str]]:
    """(module -> version, pip name -> why it is missing) for NEEDED."""
    found, missing = {}, {}
    for module, pip_name in NEEDED.items():
        try:
            mod = importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - a broken install raises more than ImportError
            missing[pip_name] = f"{type(e).__name__}: {e}"
            continue
        found[module] = str(getattr(mod, "__version__", "?"))
    return found, missing


def environment(cpu_only: bool) -> dict[str, Any]:
    """What this machine has; `missing` names the pip packages the check needs and lacks."""
    found, missing = versions()
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "versions": found,
        "missing": missing,
    }
    try:
        import onnxruntime as ort

        env["onnxruntime_providers"] = ort.get_available_providers()
        if "CUDAExecutionProvider" in env["onnxruntime_providers"] and hasattr(ort, "preload_dlls"):
            # onnxruntime-gpu finds CUDA and cuDNN of the nvidia-* wheels (what torch brings) this way
            try:
                ort.preload_dlls()
            except Exception as e:  # noqa: BLE001 - the sessions will say what is missing
                env["preload_dlls"] = f"{type(e).__name__}: {e}"
        if not cpu_only and "CUDAExecutionProvider" not in env["onnxruntime_providers"]:
            missing["onnxruntime-gpu"] = (
                f"onnxruntime {ort.__version__} has no CUDAExecutionProvider "
                f"({env['onnxruntime_providers']}): the engine cannot run on the GPU"
            )
    except ImportError:
        env["onnxruntime_providers"] = []
    try:
        import ctranslate2

        env["ctranslate2_cuda_devices"] = ctranslate2.get_cuda_device_count()
        # bench/gpu_run.sh: which cuBLAS CTranslate2's dlopen("libcublas.so.12") gets
        env["ctranslate2_cublas"] = os.environ.get("GPU_CHECK_CUBLAS", "system")
    except Exception:  # noqa: BLE001
        env["ctranslate2_cuda_devices"] = 0
    try:
        import torch

        env["torch_cuda"] = torch.cuda.is_available()
        if env["torch_cuda"]:
            props = torch.cuda.get_device_properties(0)
            env["gpu"] = {
                "name": props.name,
                "memory_mib": props.total_memory // 2**20,
                "multiprocessors": props.multi_processor_count,
                "torch_cuda_version": torch.version.cuda,
            }
    except ImportError:
        env["torch_cuda"] = False
    smi = nvidia_smi("name,driver_version,memory.total")
    if smi:
        env.setdefault("gpu", {}).update({"nvidia_smi": smi[0]})
    if not cpu_only and not env.get("torch_cuda") and not smi:
        missing["a CUDA GPU"] = "neither torch nor nvidia-smi sees one (run with --cpu-only elsewhere)"
    return env


# ---- stage 2: bundle -----------------------------------------------------------------------------------


def bundle_variants(bundle: Path) -> list[str]:
    return list(json.loads((bundle / "manifest.json").read_text())["variants"])


def prepare_bundle(
    model: Path, bundle: Path | None, out: Path, variants: tuple[str, ...], fused_attention: str | None = None
) -> dict[str, Any]:
    """`bundle` when it has every variant asked for, else `model` exported to `out` with them
    (`fused_attention`: the decoder step of export --fused-attention)."""
    if bundle is not None and (bundle / "manifest.json").is_file():
        have = bundle_variants(bundle)
        if all(v in have for v in variants):
            return {"path": str(bundle), "variants": have, "exported": False}
    from export.build import export_bundle

    t0 = time.perf_counter()
    manifest = export_bundle(
        model, out, variants=variants, parity_sentences=4, threads=min(8, os.cpu_count() or 1),
        fused_attention=fused_attention,
    )  # fmt: skip
    return {
        "path": str(out),
        "variants": list(manifest["variants"]),
        "exported": True,
        "export_seconds": round(time.perf_counter() - t0, 1),
        "export_parity": manifest.get("parity"),
    }


# ---- stage 3: parity -----------------------------------------------------------------------------------


def step_logprobs(engine: Any, sources: list[list[int]], targets: list[list[int]]) -> list[np.ndarray]:
    """Per step t, the log-probs (rows, V) of the engine's own graphs teacher-forced on `targets`
    (each row BOS + target), with its own encoder output and K/V cache, as float32."""
    gen = engine.generator
    gr = gen.graphs
    width = int(gen.source_width(np.array([len(s) for s in sources])))
    src = np.full((len(sources), width), gen.pad_id, dtype=np.int64)
    for row, s in enumerate(sources):
        src[row, : len(s)] = s
    enc = dict(zip(gr.encoder_outputs, gr.encoder.run(gr.encoder_outputs, {"src_ids": src}), strict=True))
    steps = max(len(t) for t in targets) + 1
    tokens = np.full((len(sources), steps), gen.pad_id, dtype=np.int64)
    tokens[:, 0] = gen.bos_id
    for row, t in enumerate(targets):
        tokens[row, 1 : len(t) + 1] = t
    past = [gr.empty_kv(len(sources)) for _ in gr.past_names]
    out = []
    for t in range(steps):
        feed = {
            "input_ids": tokens[:, t : t + 1],
            "position": np.full((len(sources),) if gr.row_positions else (1,), t, dtype=np.int64),
            "beam_scores": np.zeros((len(sources), 1), dtype=np.float32),
            "num_candidates": np.array([1], dtype=np.int64),
            "src_bias": enc["src_bias"],
            **{name: enc[name] for name in gr.cross_names},
            **dict(zip(gr.past_names, past, strict=True)),
        }
        lp, *new = gr.decoder.run(["log_probs", *gr.new_kv_names], feed)
        past = [np.concatenate([p, n], axis=2) for p, n in zip(past, new, strict=True)]
        out.append(lp.astype(np.float32))
    return out


def logprob_diff(ref: Any, test: Any, texts: list[str], batch: int = 16) -> float:
    """max |log-prob difference| over the live rows of every step, teacher-forced on ref's greedy output."""
    from server.engine import DecodingOptions

    greedy = DecodingOptions(beam_size=1, num_hypotheses=1)
    worst = 0.0
    for i in range(0, len(texts), batch):
        chunk = texts[i : i + batch]
        sources = ref.encode_texts(chunk)
        targets = [r[0].tokens for r in ref.translate(chunk, greedy)]
        a, b = step_logprobs(ref, sources, targets), step_logprobs(test, sources, targets)
        for t, (x, y) in enumerate(zip(a, b, strict=True)):
            live = [r for r, tgt in enumerate(targets) if t <= len(tgt)]
            worst = max(worst, float(np.abs(x[live] - y[live]).max()))
    return worst


def outputs(engine: Any, texts: list[str], beam: int, batch: int = 32) -> list[tuple[list[int], float]]:
    from server.engine import DecodingOptions

    options = DecodingOptions(beam_size=beam, num_hypotheses=1, length_penalty=0.6)
    result = []
    for i in range(0, len(texts), batch):
        result += [(r[0].tokens, r[0].score) for r in engine.translate(texts[i : i + batch], options)]
    return result


def parity(ref: Any, test: Any, texts: list[str]) -> dict[str, Any]:
    """The device engine against the CPU engine on `texts`: log-probs, greedy and beam-4 outputs."""
    report: dict[str, Any] = {"sentences": len(texts), "providers": test.providers}
    report["step_logprob_max_abs"] = logprob_diff(ref, test, texts)
    for name, beam in (("greedy", 1), ("beam4", 4)):
        a, b = outputs(ref, texts, beam), outputs(test, texts, beam)
        report[f"{name}_mismatches"] = sum(x[0] != y[0] for x, y in zip(a, b, strict=True))
        report[f"{name}_score_max_abs"] = max(
            (abs(x[1] - y[1]) for x, y in zip(a, b, strict=True)), default=0.0
        )
    return report


# ---- stage 4: in-flight --------------------------------------------------------------------------------


def inflight_outputs(engine: Any, texts: list[str], beam: int, rows: int) -> list[list[int]]:
    """Every text through one in-flight batch, refilled before each step (at most `rows` decoder rows)."""
    from server.contract import BatchItem
    from server.engine import DecodingOptions

    options = DecodingOptions(beam_size=beam, num_hypotheses=1, length_penalty=0.6)
    rb = engine.running_batch()
    done: dict[int, list[int]] = {}
    nxt = 0

    def collect(finished: list[Any]) -> None:
        for f in finished:
            if f.error is not None:
                raise f.error
            done[f.key] = f.hypotheses[0].tokens

    while nxt < len(texts) or len(rb):
        room = (rows - rb.rows) // beam
        if room > 0 and nxt < len(texts):
            take = texts[nxt : nxt + room]
            collect(rb.admit([BatchItem(nxt + j, t, options) for j, t in enumerate(take)]))
            nxt += len(take)
        collect(rb.step())
    return [done[i] for i in range(len(texts))]


def inflight(engine: Any, texts: list[str], rows: int, reps: int) -> dict[str, Any]:
    from bench.saturation import measure, time_sessions

    report: dict[str, Any] = {
        "on_cuda": engine.on_cuda,
        "device_cache": bool(engine.generator.inflight_on_device),
        "rows": rows,
        "sentences": len(texts),
    }
    for beam in (1, 4):
        got = inflight_outputs(engine, texts, beam, rows)
        want = [tokens for tokens, _ in outputs(engine, texts, beam)]
        report[f"beam{beam}_differ_from_request_level"] = sum(a != b for a, b in zip(got, want, strict=True))
    clock = time_sessions(engine)
    for beam in (1, 4):
        best = measure(engine, clock, texts, beam, batch=32, rows=rows, reps=reps)
        report[f"beam{beam}"] = {
            mode: {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
            for mode, r in best.items()
        }
    report["gpu_memory_mib"] = gpu_memory_mib()
    return report


# ---- stage 5: gRPC -------------------------------------------------------------------------------------


def grpc_load(
    bundle: Path,
    device: str,
    modes: list[str],
    seconds: float,
    concurrency: int,
    texts: list[str],
    work: Path,
) -> dict[str, Any]:
    """One server per batching mode on 127.0.0.1, a closed loop of the real client against it."""
    from dataclasses import asdict

    from bench.batching import Server
    from client.core import AsyncTranslatorClient, TranslatorClient
    from client.load import run_load

    report: dict[str, Any] = {"device": device, "concurrency": concurrency, "seconds": seconds}
    for mode in modes:
        server = Server(mode, str(bundle), 4, ["--device", device, "--variant", "fp32"], work, None)
        t0 = time.perf_counter()
        try:
            with TranslatorClient(server.target) as client:
                client.wait_until_serving(timeout=240)
            ready_s = time.perf_counter() - t0

            async def drive(target: str = server.target, mode: str = mode) -> Any:
                async with AsyncTranslatorClient(target, timeout=60, retries=0) as client:
                    await run_load(client, texts, duration=min(2.0, seconds / 4), concurrency=concurrency)
                    return await run_load(
                        client, texts, duration=seconds, concurrency=concurrency, label=mode
                    )

            result = asdict(asyncio.run(drive()))
            result["ready_s"] = round(ready_s, 1)
            result["gpu_memory_mib"] = gpu_memory_mib()
            report[mode] = result
            log(
                f"  grpc {mode}: {result['throughput_rps']:.1f} req/s, "
                f"p95 {result['latency_ms'].get('p95', 0):.0f} ms"
            )
        except Exception as e:  # noqa: BLE001 - the server's log says why; keep the other modes
            log_tail = (work / f"server-{mode}.log").read_text(errors="replace")[-1500:]
            report[mode] = {"error": f"{type(e).__name__}: {e}", "server_log": log_tail}
        finally:
            server.stop()
    return report


# ---- stage 6: speed ------------------------------------------------------------------------------------


def ct2_probe(ct2_dir: Path, device: str) -> None:
    """--ct2-probe: load the converted model on `device` and translate one sentence (a subprocess, so a
    CUDA library that crashes takes only this process)."""
    import ctranslate2

    translator = ctranslate2.Translator(str(ct2_dir), device=device, compute_type="float32")
    pieces = json.loads((ct2_dir / "shared_vocabulary.json").read_text(encoding="utf-8"))
    out = translator.translate_batch([[pieces[10], pieces[20]]], beam_size=1, max_decoding_length=5)
    print(json.dumps({"ok": True, "tokens": len(out[0].hypotheses[0])}))


def speed(
    bundle: Path,
    model_dir: Path,
    device: str,
    variants: list[str],
    pool: list[str],
    sizes: dict[str, int],
    reps: int,
    threads: int,
    work: Path,
    fused: Path | None = None,
) -> dict[str, Any]:
    """engine_speed's passes for the engine and CTranslate2 on `device`, per SETTINGS; with `fused`, that
    bundle (export --fused-attention) as engine-fused-<variant> in the same passes."""
    from bench.engine_speed import CT2System, EngineSystem, compare
    from model.tokenizer import Tokenizer
    from model.train import load_release
    from server.engine import DecodingOptions, Engine

    notes: list[str] = []
    systems: dict[str, Any] = {}
    engines = [("engine", bundle)] + ([("engine-fused", fused)] if fused is not None else [])
    for (prefix, path), variant in itertools.product(engines, variants):
        system = EngineSystem.__new__(EngineSystem)  # engine_speed's system, on `device`
        system.name, system.text_layer = f"{prefix}-{variant}", False
        system.engine = Engine(path, variant=variant, device=device, intra_op_threads=threads)
        system.options = {
            b: DecodingOptions(beam_size=b, num_hypotheses=1, max_length=0, length_penalty=0.6)
            for b in (1, 4)
        }
        system.engine.warmup()
        systems[system.name] = system
    tok = Tokenizer(model_dir / "tokenizer.model")
    try:
        from export.ctranslate2_spec import convert_model, vocabulary_pieces

        ct2_dir = convert_model(
            load_release(model_dir), vocabulary_pieces(model_dir / "tokenizer.model"), work / "ct2"
        )
        usable = True
        if device != "cpu":
            probe = subprocess.run(
                [sys.executable, "-m", "bench.gpu_check", "--ct2-probe", str(ct2_dir), "--device", device],
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                timeout=180,
            )
            usable = probe.returncode == 0
            if not usable:
                notes.append(f"CTranslate2 on {device} failed (rc {probe.returncode}): {probe.stderr[-800:]}")
        if usable:
            import ctranslate2

            for ctype in ("float32", "float16") if device != "cpu" else ("float32",):
                system = CT2System(f"ct2-{ctype}", ct2_dir, "float32", tok, threads)
                # engine_speed's CT2 system is built for the CPU: the same translator, on the device
                system.ct2.translator = ctranslate2.Translator(
                    str(ct2_dir), device=device, compute_type=ctype, intra_threads=threads
                )
                systems[system.name] = system
    except ImportError as e:
        notes.append(f"CTranslate2 skipped: {e}")
    if not systems:
        raise RuntimeError("nothing to time: " + " | ".join(notes or ["no engine variant, no CTranslate2"]))
    rows, outs = [], {}
    for setting, (batch, beam) in SETTINGS.items():
        texts = pool[: sizes[setting]]
        for name, system in systems.items():
            _, _, out = system.run_pass(texts, batch, beam)  # warm-up; the outputs compared below
            outs[(name, setting)] = out
            totals, lats = [], []
            for _ in range(reps):
                total, lat, _ = system.run_pass(texts, batch, beam)
                totals.append(total)
                lats += lat
            tokens = sum(map(len, out))
            median = statistics.median(totals)
            rows.append({
                "system": name, "setting": setting, "batch_size": batch, "beam_size": beam,
                "sentences": len(texts), "tokens": tokens, "total_s_median": round(median, 4),
                "tokens_per_s": round(tokens / median, 1),
                "latency_ms_p50": round(1000 * statistics.median(lats), 2),
            })  # fmt: skip
            log(
                f"  {setting:<12} {name:<14} {tokens / median:9.0f} tok/s  "
                f"p50 {1000 * statistics.median(lats):7.1f} ms"
            )
    by = {(r["system"], r["setting"]): r for r in rows}
    ratios: dict[str, dict[str, float]] = {}
    mismatches: dict[str, dict[str, int]] = {}
    pairs = [("engine-fp32", "ct2-float32"), ("engine-fp16", "ct2-float16"), ("engine-fp16", "engine-fp32")]
    pairs += [("engine-fused-fp32", "engine-fp32"), ("engine-fused-fp16", "engine-fp16")]
    pairs += [("engine-fused-fp32", "ct2-float32"), ("engine-fused-fp16", "ct2-float16")]
    for a, b in pairs:
        for setting in SETTINGS:
            if (a, setting) in by and (b, setting) in by:
                ratios.setdefault(f"{a} / {b}", {})[setting] = round(
                    by[(a, setting)]["tokens_per_s"] / by[(b, setting)]["tokens_per_s"], 3
                )
                mismatches.setdefault(f"{a} vs {b}", {})[setting] = compare(
                    outs[(a, setting)], outs[(b, setting)]
                )
    return {
        "rows": rows,
        "ratios_tokens_per_s": ratios,
        "mismatches": mismatches,
        "notes": notes,
        "gpu_memory_mib": gpu_memory_mib(),
    }


# ---- the run -------------------------------------------------------------------------------------------


def text_pool() -> list[str]:
    """The test sample first (bench/data/speed.en, 64 real test-split strings), then more distinct real
    strings for the large batches (faithful set, everyday set, client sample), in a fixed order."""
    from bench.machine import sample_texts

    pool = sample_texts()
    extra: list[str] = []
    for name in ("faithful.jsonl", "everyday.jsonl"):
        with (DATA / name).open(encoding="utf-8") as handle:
            extra += [json.loads(line)["source"].strip() for line in handle]
    extra += sample_texts(REPO_ROOT / "client" / "sample.en")
    random.Random(0).shuffle(extra)
    seen = set(pool)
    return pool + [t for t in extra if t and len(t) <= 400 and not (t in seen or seen.add(t))]


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The short table printed last (the device tool returns the end of the output)."""
    lines = [f"gpu_check ({report['mode']}) on {report['env'].get('gpu', {}).get('name', 'no GPU')}:"]
    for stage, info in report["stages"].items():
        lines.append(
            f"  {stage:<9} {info['status']:<8} {info.get('seconds', 0):6.1f} s  {info.get('reason', '')}"
        )
    for variant, p in report.get("parity", {}).items():
        if "step_logprob_max_abs" in p:
            lines.append(
                f"  parity {variant}: max|dlogp| {p['step_logprob_max_abs']:.2e}, greedy mismatches "
                f"{p['greedy_mismatches']}/{p['sentences']}, beam4 {p['beam4_mismatches']}/{p['sentences']}"
            )
    inf = report.get("inflight", {})
    for beam in (1, 4):
        if f"beam{beam}" in inf:
            modes = inf[f"beam{beam}"]
            lines.append(
                f"  in-flight beam {beam}: "
                + ", ".join(f"{m} {r['sentences_per_s']:.1f}/s" for m, r in modes.items())
                + f"; outputs differing from request-level {inf[f'beam{beam}_differ_from_request_level']}"
            )
    for mode, r in report.get("grpc", {}).items():
        if isinstance(r, dict) and "latency_ms" in r:
            lat = r["latency_ms"]
            lines.append(
                f"  grpc {mode}: {r['throughput_rps']:.1f} req/s, p50 {lat.get('p50', 0):.0f} ms, "
                f"p95 {lat.get('p95', 0):.0f} ms, errors {sum(r['errors'].values())}"
            )
    for key, per in report.get("speed", {}).get("ratios_tokens_per_s", {}).items():
        lines.append(f"  {key}: " + ", ".join(f"{s} {v:.2f}" for s, v in per.items()))
    if report["env"]["missing"]:
        lines.append("  MISSING: " + "; ".join(f"{k} ({v})" for k, v in report["env"]["missing"].items()))
    return lines


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    deadline = started + args.budget_s
    device = "cpu" if args.cpu_only else "cuda"
    report: dict[str, Any] = {
        "mode": "cpu-only" if args.cpu_only else "cuda",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "stages": {},
    }
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    state: dict[str, Any] = {}

    def stage(name: str, fn: Callable[[], Any], needs: str = "", minimum_s: float = 0.0) -> None:
        """Run one stage into the report, or say why not; an exception is the stage's, not the run's."""
        info: dict[str, Any] = {}
        report["stages"][name] = info
        if needs:
            info.update(status="skipped", reason=needs)
        elif time.perf_counter() + minimum_s > deadline:
            info.update(status="skipped", reason=f"time budget ({args.budget_s:.0f} s) nearly spent")
        else:
            log(f"[{name}]")
            t0 = time.perf_counter()
            try:
                result = fn()
                if result is not None:
                    report[name] = result
                info["status"] = "ok"
            except Exception as e:  # noqa: BLE001 - reported, and the next stages still run
                info.update(status="failed", reason=f"{type(e).__name__}: {str(e)[:600]}")
            info["seconds"] = round(time.perf_counter() - t0, 1)
        log(f"[{name}] {info['status']} {info.get('reason', '')}")

    try:
        env = environment(args.cpu_only)
        report["env"] = env
        report["stages"]["env"] = {"status": "ok", "seconds": round(time.perf_counter() - started, 1)}
        no_engine = ""
        if not args.cpu_only and "CUDAExecutionProvider" not in env.get("onnxruntime_providers", []):
            no_engine = "no CUDAExecutionProvider in this onnxruntime (install onnxruntime-gpu)"
        variants = ("fp32",) if args.cpu_only else ("fp32", "fp16")

        def do_bundle() -> dict[str, Any]:
            out = args.work / "bundle" if args.work else work / "bundle"
            state["bundle"] = prepare_bundle(args.model, args.bundle, out, variants)
            if args.fused_attention:  # the same weights with the fused decoder step, beside it
                fused_out = (args.work or work) / f"bundle-fused-{args.fused_attention}"
                state["bundle"]["fused"] = prepare_bundle(
                    args.model, None, fused_out, variants, fused_attention=args.fused_attention
                )
            return state["bundle"]

        stage("bundle", do_bundle, needs=no_engine, minimum_s=30)
        bundle_missing = "" if "bundle" in state else "no bundle (see the bundle stage)"
        pool = text_pool()
        sample = pool[: args.sentences]
        engines: dict[str, Any] = {}

        def engine(variant: str, on: str, tf32: bool = True, fused: bool = False) -> Any:
            from server.engine import Engine

            key = f"{variant}@{on}{'' if tf32 else '-no-tf32'}{'-fused' if fused else ''}"
            if key not in engines:
                engines[key] = Engine(
                    state["bundle"]["fused"]["path"] if fused else state["bundle"]["path"],
                    variant=variant, device=on, intra_op_threads=args.threads, cuda_tf32=tf32,
                )  # fmt: skip
            return engines[key]

        def do_parity() -> dict[str, Any]:
            ref = engine("fp32", "cpu")
            result = {}
            for variant in state["bundle"]["variants"]:
                if variant == "int8":
                    continue  # a CPU variant: integer GEMMs, not what a GPU runs
                if variant == "fp16" and args.cpu_only:
                    result[variant] = {"skipped": "fp16 is a GPU variant"}
                    continue
                # in --cpu-only mode a second CPU engine: the comparison's code path, difference 0
                result[variant] = parity(ref, engine(variant, device), sample)
            # fp32 without TF32 (TRANSLATOR_CUDA_TF32=false): tells TF32 rounding from a defect
            result["fp32-no-tf32"] = parity(ref, engine("fp32", device, tf32=False), sample)
            if "fused" in state["bundle"]:  # the fused step on the device against the traced one on the CPU
                result["fused-fp32"] = parity(ref, engine("fp32", device, fused=True), sample)
            return result

        stage("parity", do_parity, needs=no_engine or bundle_missing, minimum_s=20)
        stage(
            "inflight",
            lambda: inflight(engine("fp32", device), sample, args.rows, args.reps),
            needs=no_engine or bundle_missing,
            minimum_s=20,
        )
        engines.clear()  # the server stage's process needs the GPU memory

        stage(
            "grpc",
            lambda: grpc_load(
                Path(state["bundle"]["path"]), device, args.grpc_modes.split(","), args.grpc_seconds,
                args.concurrency, pool, work,
            ),
            needs=no_engine or bundle_missing,
            minimum_s=30,
        )  # fmt: skip

        def do_speed() -> dict[str, Any]:
            have = state["bundle"]["variants"] if "bundle" in state else []
            engine_variants = [
                v for v in ("fp32", "fp16") if v in have and not (v == "fp16" and args.cpu_only)
            ]
            sizes = {s: args.speed_sentences * (1 if SETTINGS[s][0] == 1 else 4) for s in SETTINGS}
            sizes["b128-greedy"] = args.speed_sentences * 8
            fused = state.get("bundle", {}).get("fused")
            result = speed(
                Path(state["bundle"]["path"]) if engine_variants else Path(),
                args.model, device, engine_variants, pool, sizes, args.reps, args.threads, work,
                Path(fused["path"]) if fused and engine_variants else None,
            )  # fmt: skip
            if not engine_variants:
                result["notes"].append(f"engine skipped: {no_engine or bundle_missing}")
            return result

        stage("speed", do_speed, needs="" if no_engine else bundle_missing, minimum_s=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["summary"] = summary_lines(report)
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.gpu_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cpu-only", action="store_true", help="CPU provider, tiny counts (make test)")
    p.add_argument("--model", type=Path, default=REPO_ROOT / "models" / "en-es-small")
    p.add_argument("--bundle", type=Path, help="use this bundle when it has the variants (else export)")
    p.add_argument("--work", type=Path, help="where to export the bundle (default: a temporary directory)")
    p.add_argument("--json", type=Path, help="the report (default $OUT/gpu-check.json, else runs/)")
    p.add_argument("--sentences", type=int, default=0, help="parity and in-flight sample (64; cpu-only 6)")
    p.add_argument("--speed-sentences", type=int, default=0, help="b1 settings; b32 x4, b128 x8 (64; 4)")
    p.add_argument("--reps", type=int, default=0, help="timed repetitions (3; cpu-only 1)")
    p.add_argument("--rows", type=int, default=0, help="in-flight decoder rows (512; cpu-only 16)")
    p.add_argument("--grpc-modes", default="", help="batching modes to serve (request,inflight; inflight)")
    p.add_argument("--grpc-seconds", type=float, default=0, help="load per mode (15; cpu-only 2)")
    p.add_argument("--concurrency", type=int, default=0, help="closed-loop clients (32; cpu-only 4)")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime / CTranslate2 threads (4; 1)")
    p.add_argument("--budget-s", type=float, default=0, help="no stage starts after this (300; 120)")
    p.add_argument(
        "--fused-attention",
        choices=("split", "mha"),
        help="also export the decoder step with ONNX Runtime's MultiHeadAttention (export --fused-attention) "
        "and time it beside the traced one as engine-fused-<variant>",
    )
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--ct2-probe", type=Path, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.ct2_probe:
        ct2_probe(args.ct2_probe, args.device)
        return 0
    cpu = args.cpu_only
    defaults = {
        "sentences": (64, 6), "speed_sentences": (64, 4), "reps": (3, 1), "rows": (512, 16),
        "grpc_modes": ("request,inflight", "inflight"), "grpc_seconds": (15.0, 2.0),
        "concurrency": (32, 4), "threads": (4, 1), "budget_s": (300.0, 120.0),
    }  # fmt: skip
    for name, (gpu_value, cpu_value) in defaults.items():
        if not getattr(args, name):
            setattr(args, name, cpu_value if cpu else gpu_value)
    if args.json is None:
        args.json = (
            Path(os.environ["OUT"]) / "gpu-check.json"
            if os.environ.get("OUT")
            else REPO_ROOT / "runs" / "gpu-check.json"
        )
    report = run(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print("\n".join(report["summary"]))
    failed = [n for n, s in report["stages"].items() if s["status"] == "failed"]
    print(f"report: {args.json} ({report['seconds']:.0f} s); failed stages: {', '.join(failed) or 'none'}")
    return 2 if report["env"]["missing"] or failed else 0


if __name__ == "__main__":
    sys.exit(main())
