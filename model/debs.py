"""Debian packages as data: fetch them with ``apt-get download`` into a cache, read their files with
``dpkg-deb --fsys-tarfile`` without installing anything (the corpus builder's and the benchmarks' sources);
and fetch an index file of bookworm (Contents, Sources) checked against apt's signed ``InRelease``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from runtime.bundle import sha256_file

MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
APT_LISTS = Path("/var/lib/apt/lists")


def cached_deb(cache_dir: Path, package: str) -> Path | None:
    hits = sorted(cache_dir.glob(f"{package}_*.deb"))
    return hits[-1] if hits else None


# A package download or an index update that takes longer is a stuck mirror, not a slow one.
APT_TIMEOUT_S = 600


DOWNLOAD_BATCH = 40  # packages per `apt-get download` call: one call per package costs a second each


def _apt_download(packages: list[str], cache_dir: Path) -> bool:
    try:
        result = subprocess.run(
            ["apt-get", "download", "-q", *packages], cwd=cache_dir, capture_output=True, text=True,
            timeout=APT_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


def download_packages(
    packages: list[str], cache_dir: Path, desc: str = "apt-get download"
) -> dict[str, Path]:
    """apt-get download what is not cached yet, DOWNLOAD_BATCH packages a call. A batch that fails (one
    unknown package fails the whole call) is retried one package at a time, once after `apt-get update`
    when the lists are stale; what still fails is reported and left out of the result."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    missing = [p for p in packages if cached_deb(cache_dir, p) is None]
    failed: list[str] = []
    updated = False
    if missing:
        print(f"downloading {len(missing)} packages into {cache_dir}", file=sys.stderr)
    progress = tqdm(total=len(missing), desc=desc, unit="pkg", disable=not missing)
    for start in range(0, len(missing), DOWNLOAD_BATCH):
        batch = missing[start : start + DOWNLOAD_BATCH]
        if len(batch) == 1 or not _apt_download(batch, cache_dir):
            for package in batch:
                if cached_deb(cache_dir, package) is not None:
                    continue
                if not _apt_download([package], cache_dir) and not updated:
                    updated = True
                    subprocess.run(
                        ["apt-get", "update", "-qq"], check=False, capture_output=True, timeout=APT_TIMEOUT_S
                    )
                    _apt_download([package], cache_dir)
                if cached_deb(cache_dir, package) is None:
                    failed.append(package)
        progress.update(len(batch))
    progress.close()
    if failed:
        print(f"  skipped {len(failed)}: {', '.join(failed[:10])}", file=sys.stderr)
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


# --------------------------------------------------------------------------------------------
# Debian's indexes (model/extra_catalogs.py: Contents; model/extra_docs.py: Contents and Sources)


def release_sha256(name: str) -> str | None:
    """The sha256 apt's signature-checked InRelease gives `name` (``main/Contents-all.gz``), if any."""
    releases = sorted(APT_LISTS.glob(f"*_dists_{SUITE}_InRelease"))
    for release in releases:
        if "security" in release.name:
            continue
        for line in release.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[2] == name and len(parts[0]) == 64:
                return parts[0]
    return None


def download_once(url: str, path: Path, timeout: float) -> Path:
    """`url` into `path` unless it is there already, streamed through ``<name>.part`` so that an
    interrupted download never passes for a complete file. An HTTP error propagates."""
    if not path.exists():
        partial = path.with_name(path.name + ".part")
        with urllib.request.urlopen(url, timeout=timeout) as response, partial.open("wb") as out:
            for block in iter(lambda: response.read(1 << 20), b""):
                out.write(block)
        partial.rename(path)
    return path


def fetch_release_file(name: str, cache: Path, mirror: str = MIRROR) -> str:
    """Download ``dists/<suite>/<name>`` into `cache` (once, under its base name) and check it against
    apt's InRelease, so that what is read comes from Debian's own index. Returns its sha256."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / name.rsplit("/", 1)[-1]
    if not path.exists():
        print(f"downloading {name} of {SUITE}", file=sys.stderr)
    download_once(f"{mirror}/dists/{SUITE}/{name}", path, timeout=120)
    digest = sha256_file(path)
    expected = release_sha256(name)
    if expected is not None and expected != digest:
        path.unlink()  # stale or damaged: the next run downloads it again
        raise RuntimeError(f"{name}: sha256 {digest} is not InRelease's {expected} (run apt-get update)")
    return digest
