"""Debian packages as data: fetch them with ``apt-get download`` into a cache, read their files with
``dpkg-deb --fsys-tarfile`` without installing anything (the corpus builder's and the benchmarks' sources).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm


def cached_deb(cache_dir: Path, package: str) -> Path | None:
    hits = sorted(cache_dir.glob(f"{package}_*.deb"))
    return hits[-1] if hits else None


# A package download or an index update that takes longer is a stuck mirror, not a slow one.
APT_TIMEOUT_S = 600


def download_packages(packages: list[str], cache_dir: Path) -> dict[str, Path]:
    """apt-get download what is not cached yet; runs `apt-get update` once if lists are missing."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    missing = [p for p in packages if cached_deb(cache_dir, p) is None]
    if missing:
        print(f"downloading {len(missing)} packages into {cache_dir}", file=sys.stderr)
        updated = False
        for package in tqdm(missing, desc="apt-get download", unit="pkg"):
            for _attempt in range(2):
                result = subprocess.run(
                    ["apt-get", "download", "-q", package], cwd=cache_dir, capture_output=True, text=True,
                    timeout=APT_TIMEOUT_S,
                )  # fmt: skip
                if result.returncode == 0 or updated:
                    break
                subprocess.run(
                    ["apt-get", "update", "-qq"], check=False, capture_output=True, timeout=APT_TIMEOUT_S
                )
                updated = True
            if result.returncode != 0:
                print(f"  skipped {package}: {result.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    return {p: deb for p in packages if (deb := cached_deb(cache_dir, p)) is not None}


def deb_version(deb: Path) -> str:
    return subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


def iter_deb_members(deb: Path, wanted: re.Pattern[str]) -> Iterator[tuple[str, bytes]]:
    """Stream a package's file tree and yield (path, content) for members matching `wanted`."""
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as archive:
            for member in archive:
                if member.isfile() and wanted.search(member.name):
                    handle = archive.extractfile(member)
                    if handle is not None:
                        yield member.name, handle.read()
    finally:
        proc.stdout.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a dpkg-deb that no longer exits once its pipe is closed
            proc.kill()
            proc.wait()
