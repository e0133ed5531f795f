"""onnxruntime-gpu in parts small enough for the GPU machine (issue 32; docs/gpu.md).

    python -m bench.ort_gpu_pack [--version 1.31.1] [--sm 90] [--out .ort]     # here, ~3 min

The GPU image's onnxruntime is the CPU build, so the engine cannot run on the GPU there, and
onnxruntime-gpu's wheel (255 MB; 203 MB as xz) cannot travel in one call (64 MiB with the working tree).
Most of it is `libonnxruntime_providers_cuda.so`'s `.nv_fatbin` section (219 MB): the CUDA kernels,
once per GPU architecture (sm 75, 80, 86, 89, 90, 120), each zstd-compressed. The lent machines are
Hopper (sm 90), and a GPU runs only the cubins of its own major architecture, so this keeps the
sm 90 entries and fills every other entry's payload with zeros, headers untouched (the CUDA runtime
picks an entry by its header's architecture; zeros then cost nothing under xz). With the TensorRT
provider left out too, the wheel becomes one xz archive of about 66 MiB, cut into parts of at most
`--part-mib`, each in a folder of its own (`.ort/part-1/`, ...) with the whole archive's sha256 and
part count, so that each device call carries one folder.

There, `bash bench/gpu_run.sh ort-part .ort/part-N` keeps each part in /tmp/ort-parts (the warm
machine keeps /tmp between calls); once all are there and the sha256 matches it unpacks them into
/tmp/ort-site, which `bench/gpu_run.sh`'s set-up then puts first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from runtime.bundle import sha256_file

FATBIN_MAGIC = 0xBA55ED50
FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries that follow
ENTRY_HEADER = struct.Struct("<HHIQ")  # kind (1 PTX, 2 ELF), version, header size, payload size
ENTRY_SM_OFFSET = 28  # the entry's target architecture (75, 80, 90, ...), a uint32
PROVIDER = "onnxruntime/capi/libonnxruntime_providers_cuda.so"
LEFT_OUT = ("onnxruntime/capi/libonnxruntime_providers_tensorrt.so",)  # TensorRT is not in the image
MANIFEST = "ort-part-{n}.json"  # one name per part: all parts end up in one folder there


@dataclass
class FatbinEntry:
    kind: int  # 1 PTX, 2 ELF (cubin)
    sm: int
    payload_offset: int  # in the file
    payload_size: int


def elf_section(data: bytes | bytearray, name: str) -> tuple[int, int]:
    """(file offset, size) of a 64-bit little-endian ELF's section `name`."""
    if data[:6] != b"\x7fELF\x02\x01":
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i: int) -> tuple[int, ...]:
        return struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)

    strtab = header(shstrndx)[4]
    for i in range(shnum):
        h = header(i)
        start = strtab + h[0]
        if bytes(data[start : data.index(0, start)]).decode() == name:
            return h[4], h[5]
    raise ValueError(f"no {name} section")


def fatbin_entries(data: bytes | bytearray) -> list[FatbinEntry]:
    """Every PTX and cubin entry of the ELF's .nv_fatbin section, in file order."""
    offset, size = elf_section(data, ".nv_fatbin")
    entries: list[FatbinEntry] = []
    pos, end = offset, offset + size
    while pos + FATBIN_HEADER.size <= end:
        magic, _, header_size, body = FATBIN_HEADER.unpack_from(data, pos)
        if magic != FATBIN_MAGIC:  # fatbins are 8-byte aligned, padding between them
            pos += 8
            continue
        e, body_end = pos + header_size, pos + header_size + body
        while e < body_end:
            kind, _, entry_header, payload = ENTRY_HEADER.unpack_from(data, e)
            (sm,) = struct.unpack_from("<I", data, e + ENTRY_SM_OFFSET)
            entries.append(FatbinEntry(kind, sm, e + entry_header, payload))
            e += entry_header + payload
        pos = body_end
    return entries


def thin_fatbins(data: bytearray, keep_sm: set[int]) -> dict[str, int]:
    """Zero, in place, the payload of every entry whose architecture is not in keep_sm."""
    kept = zeroed = 0
    for entry in fatbin_entries(data):
        if entry.sm in keep_sm:
            kept += entry.payload_size
        else:
            data[entry.payload_offset : entry.payload_offset + entry.payload_size] = bytes(entry.payload_size)
            zeroed += entry.payload_size
    return {"kept_bytes": kept, "zeroed_bytes": zeroed}


def split_parts(archive: Path, out: Path, part_mib: float) -> list[Path]:
    """archive cut into out/part-1/, out/part-2/, ..., each with the manifest of the whole."""
    digest = sha256_file(archive)
    size = archive.stat().st_size
    step = int(part_mib * 2**20)
    count = (size + step - 1) // step
    folders = []
    with archive.open("rb") as f:
        for n in range(1, count + 1):
            folder = out / f"part-{n}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{archive.name}.{n:02d}").write_bytes(f.read(step))
            manifest = {"archive": archive.name, "sha256": digest, "bytes": size, "parts": count, "part": n}
            (folder / MANIFEST.format(n=n)).write_text(json.dumps(manifest, indent=1) + "\n")
            folders.append(folder)
    return folders


def join_parts(parts_dir: Path, site: Path) -> str:
    """Unpack the archive whose parts are all in parts_dir into site; a line saying what happened."""
    manifests = [json.loads(p.read_text()) for p in sorted(parts_dir.glob(MANIFEST.format(n="*")))]
    if not manifests:
        return f"no parts in {parts_dir}"
    want = manifests[0]
    have = sorted(parts_dir.glob(f"{want['archive']}.*"))
    if len(have) < want["parts"]:
        return f"{len(have)} of {want['parts']} parts of {want['archive']} in {parts_dir}"
    with tempfile.TemporaryDirectory() as tmp:
        whole = Path(tmp) / want["archive"]
        with whole.open("wb") as f:
            for part in have:
                f.write(part.read_bytes())
        if sha256_file(whole) != want["sha256"]:
            return f"sha256 mismatch for {want['archive']}: parts from different packs?"
        site.mkdir(parents=True, exist_ok=True)
        with tarfile.open(whole, "r:xz") as tar:
            try:
                tar.extractall(site, filter="data")
            except TypeError:  # Python before 3.11.4: no extraction filters
                tar.extractall(site)  # noqa: S202 - our own archive, checked by sha256 above
    return f"unpacked {want['archive']} ({want['parts']} parts) into {site}"


def build(wheel: Path, out: Path, keep_sm: set[int], part_mib: float) -> dict:
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        shutil.unpack_archive(str(wheel), site, format="zip")
        for name in LEFT_OUT:
            (site / name).unlink(missing_ok=True)
        provider = site / PROVIDER
        data = bytearray(provider.read_bytes())
        stats = thin_fatbins(data, keep_sm)
        provider.write_bytes(data)
        print(
            f"{PROVIDER}: kept {stats['kept_bytes'] / 1e6:.1f} MB of sm {sorted(keep_sm)} kernels, "
            f"zeroed {stats['zeroed_bytes'] / 1e6:.1f} MB",
            flush=True,
        )
        for lib in site.rglob("*.so*"):
            subprocess.run(["strip", "--strip-unneeded", str(lib)], check=False, timeout=300)
        archive = Path(tmp) / "ort-site.tar.xz"
        print("compressing (xz -9, ~2 min) ...", flush=True)
        with lzma.open(archive, "wb", preset=9) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
            for path in sorted(site.iterdir()):
                tar.add(path, arcname=path.name)
        if out.exists():
            shutil.rmtree(out)
        folders = split_parts(archive, out, part_mib)
        size = archive.stat().st_size
    summary = {
        "wheel": wheel.name,
        "keep_sm": sorted(keep_sm),
        **stats,
        "archive_bytes": size,
        "parts": [str(f) for f in folders],
        "seconds": round(time.time() - t0, 1),
    }
    print(
        f"{wheel.name} -> {len(folders)} part(s) under {out}/ ({size / 2**20:.1f} MiB in all, "
        f"at most {part_mib} MiB each); {summary['seconds']} s"
    )
    return summary


def download(version: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--platform",
        "manylinux_2_28_x86_64",
        "--platform",
        "manylinux_2_27_x86_64",
        "--platform",
        "manylinux_2_17_x86_64",
        "-d",
        str(dest),
        f"onnxruntime-gpu=={version}",
    ]
    subprocess.run(cmd, check=True, timeout=1800)
    (wheel,) = dest.glob(f"onnxruntime_gpu-{version}-cp312-*.whl")
    return wheel


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--version", default="1.31.1", help="onnxruntime-gpu (a CUDA 13 build, as the image)")
    p.add_argument("--wheel", type=Path, help="an onnxruntime-gpu wheel already here (else downloaded)")
    p.add_argument("--sm", default="90", help="architectures whose kernels stay, comma-separated")
    p.add_argument("--out", type=Path, default=Path(".ort"))
    p.add_argument(
        "--part-mib", type=float, default=60.0, help="largest part (a part call carries little else)"
    )
    p.add_argument("--join", type=Path, help="there: unpack the parts in this folder into --site")
    p.add_argument("--site", type=Path, default=Path("/tmp/ort-site"))
    args = p.parse_args(argv)
    if args.join:
        print(join_parts(args.join, args.site))
        return 0
    wheel = args.wheel or download(args.version, Path("runs") / "wheels")
    build(wheel, args.out, {int(s) for s in args.sm.split(",")}, args.part_mib)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
