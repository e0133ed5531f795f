"""The GPU serving check in its CPU mode (what make test runs), and what it says on a machine that lacks
the GPU path: the stages skipped with the reason, the missing package named, exit status 2."""

import json

import onnxruntime as ort
import pytest

from bench.gpu_check import SETTINGS, main


def test_cpu_mode_runs_every_stage_on_the_shipped_bundle(shipped_bundle, tmp_path, capsys):
    report_path = tmp_path / "gpu-check.json"
    argv = ["--cpu-only", "--bundle", str(shipped_bundle), "--json", str(report_path)]
    assert main([*argv, "--fused-attention", "split"]) == 0
    report = json.loads(report_path.read_text())
    assert report["mode"] == "cpu-only"
    assert {n: s["status"] for n, s in report["stages"].items()} == dict.fromkeys(
        ("env", "bundle", "parity", "inflight", "grpc", "speed"), "ok"
    ), report["stages"]
    assert report["env"]["missing"] == {} and "CPUExecutionProvider" in report["env"]["onnxruntime_providers"]
    # a second engine on the same provider: the comparison's code path, and nothing may differ
    fp32 = report["parity"]["fp32"]
    assert fp32["step_logprob_max_abs"] == 0.0 and fp32["greedy_mismatches"] == fp32["beam4_mismatches"] == 0
    # and one asked for full fp32 (TRANSLATOR_CUDA_TF32=false; on the CPU the same arithmetic)
    assert report["parity"]["fp32-no-tf32"]["step_logprob_max_abs"] == 0.0
    # the fused decoder step (export --fused-attention) beside the traced one: close, same outputs
    fused = report["parity"]["fused-fp32"]
    assert fused["step_logprob_max_abs"] < 1e-3 and fused["greedy_mismatches"] == 0, fused
    assert "engine-fused-fp32 / engine-fp32" in report["speed"]["ratios_tokens_per_s"]
    inflight = report["inflight"]
    assert inflight["beam1_differ_from_request_level"] == inflight["beam4_differ_from_request_level"] == 0
    assert set(inflight["beam4"]) == {"request-arrival", "request-sorted", "inflight"}
    grpc = report["grpc"]["inflight"]
    assert grpc["ok"] > 0 and grpc["errors"] == {} and grpc["latency_ms"]["p95"] > 0, grpc
    speed = report["speed"]
    timed = {(r["system"], r["setting"]) for r in speed["rows"]}
    systems = ("engine-fp32", "engine-fused-fp32", "ct2-float32")
    assert timed == {(s, setting) for s in systems for setting in SETTINGS}
    assert set(speed["ratios_tokens_per_s"]["engine-fp32 / ct2-float32"]) == set(SETTINGS)
    # same weights, and CTranslate2's greedy fp32 is exact (export.ctranslate2_spec)
    assert speed["mismatches"]["engine-fp32 vs ct2-float32"]["b1-greedy"] == 0, speed["mismatches"]
    out = capsys.readouterr().out
    assert "gpu_check (cpu-only)" in out and "failed stages: none" in out


@pytest.mark.skipif(
    "CUDAExecutionProvider" in ort.get_available_providers(), reason="this machine has the GPU path"
)
def test_without_the_gpu_path_it_names_what_is_missing(tmp_path, capsys):
    report_path = tmp_path / "gpu-check.json"
    rc = main(["--json", str(report_path), "--sentences", "1", "--speed-sentences", "1", "--reps", "1"])
    report = json.loads(report_path.read_text())
    assert rc == 2 and "onnxruntime-gpu" in report["env"]["missing"]
    for stage in ("bundle", "parity", "inflight", "grpc"):
        assert report["stages"][stage]["status"] == "skipped"
        assert "onnxruntime-gpu" in report["stages"][stage]["reason"]
    assert "MISSING: onnxruntime-gpu" in capsys.readouterr().out


def test_fp16_parity_runs_each_engine_with_its_own_half_precision_cache(tiny_checkpoint, tmp_path):
    """The comparison the GPU run makes for fp16 (fp16 K/V and cross-attention inputs), on the CPU
    provider, which has the fp16 kernels of the tiny model: close to fp32, not equal."""
    from bench.gpu_check import parity
    from server.engine import Engine
    from tests.conftest import run_export

    bundle = run_export(tiny_checkpoint, tmp_path / "tiny-fp16", "--variants", "fp32,fp16")
    ref = Engine(bundle, variant="fp32", device="cpu", intra_op_threads=1)
    half = Engine(bundle, variant="fp16", device="cpu", intra_op_threads=1)
    assert half.generator.kv_dtype.__name__ == "float16"
    report = parity(ref, half, ["Open the file.", "Save all documents now, please.", "Quit"])
    assert 0 < report["step_logprob_max_abs"] < 0.05
    assert report["sentences"] == 3 and report["greedy_mismatches"] <= 1
