"""This machine's CPU as Linux describes it: the one reader of /proc/cpuinfo (benchmarks name the CPU
they ran on, training records its hardware and whether bf16 is native)."""

from __future__ import annotations

from pathlib import Path


def read_cpuinfo(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, set[str]]:
    """(model name, flags) of the first CPU listed; ("", set()) where there is no /proc/cpuinfo."""
    model, flags = "", set()
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return model, flags
