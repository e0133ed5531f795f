"""Inference bundle format: layout, manifest and integrity checks (no torch, no onnx, no grpc).

A bundle is a directory written by ``python -m export``::

    manifest.json             format_version, model identity, dimensions, limits, decoding defaults,
                              variants and their graphs, graph I/O, parity numbers, sha256 of every file
    tokenizer.model           SentencePiece model (shared English/Spanish vocabulary)
    fp32/encoder.onnx         src_ids -> memory, src_bias, cross_key_i/cross_value_i for every decoder layer
    fp32/decoder.onnx         one KV-cached decoder step with in-graph candidate selection (top-k)
    fp32/cache.onnx           K/V cache reorder + append on the device (IOBinding path)
    fp32/kv_rows.onnx         the in-flight batch's K/V rows on the device: gather, join, write at per-row
                              positions (IOBinding path; bundles exported before it lack it)
    fp32/kv_step.onnx         the same after a plain decoder step (reorder + write), in fewer passes
    int8/...  fp16/...        the same graphs per extra variant

`load_manifest` verifies the format version and the sha256 of every listed file and raises `BundleError`
with a message naming the file on any mismatch.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.model"
GRAPHS = ("encoder", "decoder", "cache")
OPTIONAL_GRAPHS = ("kv_rows", "kv_step")  # newer than format 1's first bundles: checked when listed


class BundleError(Exception):
    """The bundle is corrupt, incomplete or not of a format this code understands."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_entry(bundle_dir: Path, rel: str) -> dict[str, Any]:
    path = bundle_dir / rel
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def load_manifest(bundle_dir: str | Path, variant: str | None = None, verify: bool = True) -> dict[str, Any]:
    """Read and check `bundle_dir/manifest.json`.

    Checks the format version, that the required keys are present, that `variant` (if given) is listed,
    and (with `verify`) that every file listed under "files" exists with the recorded size and sha256.
    """
    bundle_dir = Path(bundle_dir)
    path = bundle_dir / MANIFEST
    if not bundle_dir.is_dir():
        raise BundleError(f"bundle directory {bundle_dir} does not exist")
    if not path.is_file():
        raise BundleError(f"{path}: missing manifest")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BundleError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(manifest, dict):
        raise BundleError(f"{path}: expected a JSON object")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise BundleError(
            f"{path}: format_version {version!r} is not supported (this engine reads {FORMAT_VERSION}); "
            "re-export the bundle with the matching `python -m export`"
        )
    required = (
        "name", "version", "source_language", "target_language", "vocab_size", "special_ids", "dims",
        "max_source_tokens", "max_beam_size", "max_length_cap", "decoding", "variants", "files", "tokenizer",
    )  # fmt: skip
    missing = [k for k in required if k not in manifest]
    if missing:
        raise BundleError(f"{path}: missing keys {missing}")
    files = manifest["files"]
    if variant is not None:
        if variant not in manifest["variants"]:
            raise BundleError(
                f"{path}: variant {variant!r} not in bundle (available: {sorted(manifest['variants'])})"
            )
        for graph in GRAPHS:
            rel = manifest["variants"][variant].get(graph)
            if rel is None or rel not in files:
                raise BundleError(f"{path}: variant {variant!r} has no checksummed {graph} graph")
        for graph in OPTIONAL_GRAPHS:
            rel = manifest["variants"][variant].get(graph)
            if rel is not None and rel not in files:
                raise BundleError(f"{path}: variant {variant!r} has no checksum for its {graph} graph")
    if manifest["tokenizer"] not in files:
        raise BundleError(f"{path}: tokenizer {manifest['tokenizer']!r} has no checksum entry")
    if verify:
        for rel, entry in files.items():
            verify_file(bundle_dir, rel, entry)
    return manifest


def manifest_pairs(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """The language pairs (source, target) a bundle serves, as its manifest declares them: "pairs"
    ([[source, target], ...]), or for bundles exported before it existed the one pair
    source_language -> target_language. A pair is data: the server routes by it and never by code."""
    pairs = manifest.get("pairs")
    if pairs is None:
        return [(str(manifest["source_language"]), str(manifest["target_language"]))]
    ok = (
        isinstance(pairs, list)
        and pairs
        and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(c, str) and c for c in p) for p in pairs
        )
    )
    if not ok:
        raise BundleError(f"manifest pairs must be a non-empty list of [source, target] codes, got {pairs!r}")
    return [(p[0], p[1]) for p in pairs]


def verify_file(bundle_dir: Path, rel: str, entry: dict[str, Any]) -> None:
    path = bundle_dir / rel
    if not path.is_file():
        raise BundleError(f"{path}: file listed in the manifest is missing")
    size = path.stat().st_size
    if "bytes" in entry and size != entry["bytes"]:
        raise BundleError(f"{path}: size {size} bytes, manifest says {entry['bytes']} (corrupt or replaced)")
    digest = sha256_file(path)
    if digest != entry.get("sha256"):
        raise BundleError(
            f"{path}: sha256 mismatch (file {digest[:16]}..., manifest {str(entry.get('sha256'))[:16]}...); "
            "the file is corrupt or does not belong to this bundle"
        )
