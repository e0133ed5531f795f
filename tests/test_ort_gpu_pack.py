"""onnxruntime-gpu cut down and into parts for the GPU machine (bench/ort_gpu_pack.py), and the working
tree slimmed for a device call (bench/gpu_run.sh slim/unslim): on a synthetic ELF and a scratch repo."""

import hashlib
import json
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path

import pytest

from bench.ort_gpu_pack import (
    ENTRY_HEADER,
    FATBIN_HEADER,
    FATBIN_MAGIC,
    fatbin_entries,
    join_parts,
    split_parts,
    thin_fatbins,
)

REPO = Path(__file__).resolve().parents[1]


def fatbin(entries: list[tuple[int, int, bytes]]) -> bytes:
    """A fatbin as nvcc writes it: header, then per entry a 64-byte header and the payload."""
    body = b""
    for kind, sm, payload in entries:
        header = bytearray(64)
        ENTRY_HEADER.pack_into(header, 0, kind, 0x101, 64, len(payload))
        struct.pack_into("<I", header, 28, sm)
        body += bytes(header) + payload
    return FATBIN_HEADER.pack(FATBIN_MAGIC, 1, 16, len(body)) + body


@pytest.fixture
def elf_with_fatbins(tmp_path: Path) -> Path:
    objcopy = shutil.which("objcopy")
    if objcopy is None:
        pytest.skip("binutils' objcopy is not installed")
    blob = tmp_path / "fatbin.bin"
    # two fatbins (two compilation units) with 8 bytes of padding between them, as in the real library
    first = fatbin([(2, 80, b"\x28\xb5\x2f\xfd" + b"A" * 60), (2, 90, b"B" * 48), (2, 120, b"C" * 32)])
    second = fatbin([(2, 75, b"D" * 16), (1, 90, b"ptx90" * 8), (2, 90, b"E" * 24)])
    blob.write_bytes(first + bytes(8) + second)
    elf = tmp_path / "libfake.so"
    shutil.copy(shutil.which("true") or "/bin/true", elf)
    subprocess.run([objcopy, "--add-section", f".nv_fatbin={blob}", str(elf)], check=True, timeout=60)
    return elf


def test_fatbin_entries_are_read_with_their_architectures(elf_with_fatbins):
    entries = fatbin_entries(elf_with_fatbins.read_bytes())
    assert [(e.kind, e.sm, e.payload_size) for e in entries] == [
        (2, 80, 64),
        (2, 90, 48),
        (2, 120, 32),
        (2, 75, 16),
        (1, 90, 40),
        (2, 90, 24),
    ]


def test_thinning_zeroes_the_other_architectures_and_keeps_every_header(elf_with_fatbins):
    before = elf_with_fatbins.read_bytes()
    data = bytearray(before)
    stats = thin_fatbins(data, {90})
    assert stats == {"kept_bytes": 48 + 40 + 24, "zeroed_bytes": 64 + 32 + 16}
    assert len(data) == len(before)
    after = fatbin_entries(data)
    assert [(e.kind, e.sm, e.payload_size) for e in after] == [
        (e.kind, e.sm, e.payload_size) for e in fatbin_entries(before)
    ]
    for e in after:
        payload = bytes(data[e.payload_offset : e.payload_offset + e.payload_size])
        original = before[e.payload_offset : e.payload_offset + e.payload_size]
        assert payload == (original if e.sm == 90 else bytes(e.payload_size))
    # nothing outside the zeroed payloads changed
    changed = [i for i in range(len(data)) if data[i] != before[i]]
    zeroed = {
        i for e in after if e.sm != 90 for i in range(e.payload_offset, e.payload_offset + e.payload_size)
    }
    assert set(changed) <= zeroed


def test_a_file_without_a_fatbin_section_is_refused(tmp_path):
    elf = tmp_path / "true"
    shutil.copy(shutil.which("true") or "/bin/true", elf)
    with pytest.raises(ValueError, match="nv_fatbin"):
        fatbin_entries(elf.read_bytes())
    with pytest.raises(ValueError, match="ELF"):
        fatbin_entries(b"not an elf file at all" * 4)


def test_parts_join_back_into_the_archive_once_all_are_there(tmp_path):
    site = tmp_path / "site"
    (site / "onnxruntime").mkdir(parents=True)
    (site / "onnxruntime" / "__init__.py").write_text("__version__ = 'fake'\n")
    (site / "onnxruntime" / "blob.bin").write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    archive = tmp_path / "ort-site.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(site / "onnxruntime", arcname="onnxruntime")
    folders = split_parts(archive, tmp_path / "out", part_mib=archive.stat().st_size / 2**20 / 2.5)
    assert [f.name for f in folders] == ["part-1", "part-2", "part-3"]
    manifest = json.loads((folders[0] / "ort-part-1.json").read_text())
    assert manifest["parts"] == 3 and manifest["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()

    # on the device: one call per part, all copied into one folder (bench/gpu_run.sh ort-part)
    parts = tmp_path / "parts"
    parts.mkdir()
    for folder in folders[:2]:
        for f in folder.iterdir():
            shutil.copy(f, parts)
    assert join_parts(parts, tmp_path / "ort-site") == f"2 of 3 parts of ort-site.tar.xz in {parts}"
    for f in folders[2].iterdir():
        shutil.copy(f, parts)
    assert join_parts(parts, tmp_path / "ort-site").startswith("unpacked ort-site.tar.xz (3 parts)")
    assert (tmp_path / "ort-site" / "onnxruntime" / "blob.bin").read_bytes() == bytes(range(256)) * 4096

    # a part of another pack (another sha256) is refused, not unpacked
    (parts / "ort-site.tar.xz.02").write_bytes(b"something else")
    assert "sha256 mismatch" in join_parts(parts, tmp_path / "elsewhere")
    assert not (tmp_path / "elsewhere").exists()


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True, timeout=60
    ).stdout


def test_slim_untracks_the_models_the_check_does_not_serve_and_unslim_restores(tmp_path):
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    shutil.copy(REPO / "bench" / "gpu_run.sh", repo / "bench" / "gpu_run.sh")
    for model in ("en-es-small", "en-fr-small", "in-training/en-xx-small"):
        (repo / "models" / model).mkdir(parents=True)
        (repo / "models" / model / "model.safetensors").write_bytes(b"w" * 1000)
    (repo / "README.md").write_text("readme\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("/.mine/\n")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "bench/gpu_run.sh", *args], cwd=repo, capture_output=True, text=True, timeout=60
        )

    assert run("slim").returncode == 0
    assert sorted(git(repo, "ls-files").split()) == [
        "README.md",
        "bench/gpu_run.sh",
        "models/en-es-small/model.safetensors",
    ]
    assert git(repo, "status", "--short", "--untracked-files=all").split("\n")[0].startswith("D ")
    assert not [line for line in git(repo, "status", "--short").splitlines() if line.startswith("??")]
    assert run("slim").returncode != 0  # twice would lose what the first one recorded
    assert (repo / "models" / "en-fr-small" / "model.safetensors").exists()  # the files stay

    assert run("unslim").returncode == 0
    assert git(repo, "status", "--short") == ""
    assert (repo / ".git" / "info" / "exclude").read_text() == "/.mine/\n"

    assert run("slim", "all").returncode == 0
    assert git(repo, "ls-files") == ""
    assert run("unslim").returncode == 0
    assert git(repo, "status", "--short") == ""
