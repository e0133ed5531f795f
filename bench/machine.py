"""What machine a benchmark ran on: CPU model, vector extensions that matter for GEMMs, cores, load."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from runtime.machine import read_cpuinfo

# /proc/cpuinfo flags that decide which GEMM kernels ONNX Runtime and CTranslate2 can use.
VECTOR_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
)
SAMPLE_TEXTS = Path(__file__).parent / "data" / "speed.en"


def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """{"model": ..., "vector_extensions": [...], "logical_cpus": n, "machine": ...}; model and flags come
    from /proc/cpuinfo (Linux), else platform's best guess and no flags."""
    model, flags = read_cpuinfo(cpuinfo)
    return {
        "model": model or platform.processor() or platform.machine(),
        "vector_extensions": [f for f in VECTOR_FLAGS if f in flags],
        "logical_cpus": os.cpu_count(),
        "machine": platform.machine(),
    }


def describe(info: dict[str, Any]) -> str:
    """One line: 'AMD EPYC 7B13 (avx2, fma), 2 logical CPUs'."""
    ext = ", ".join(info["vector_extensions"]) or "no AVX2"
    return f"{info['model']} ({ext}), {info['logical_cpus']} logical CPUs"


def sample_texts(path: Path = SAMPLE_TEXTS) -> list[str]:
    """The shipped benchmark sentences: 64 real test-split strings, half short UI strings and half one-
    to-three-sentence descriptions (so `make bench` runs from a clean clone, without the corpus)."""
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
