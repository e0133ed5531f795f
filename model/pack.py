"""A compact training pack: what `model.gpu_train` needs from a corpus directory, in one small file.

    python -m model.pack --data data --tokenizer models/en-es-small/tokenizer.model --out runs/pack-es.tar
    python -m model.pack --data runs/data-fr --tokenizer runs/tokenizer-fr/tokenizer.model \\
        --out runs/pack-fr.tar

Why: the GPU machine gets a copy of the working tree plus at most 64 MiB of carried paths, and a corpus
directory is far larger (data/train.jsonl alone is 75 MB: provenance that training reads for two things
only). The pack keeps exactly what training uses:

* train and valid pairs as written in the corpus (one escaped line each, runtime.splits' format);
* per train pair, how many packages ship it and whether only bilingual dictionaries give it
  (model.dictionaries.pair_provenance: the 1 + log2(n) repeats, `--repeat-dictionaries`);
* per valid pair, whether its source is novel (the checkpoint criterion);
* the commonest UI strings of train with their accepted answers (model.common_strings);
* the tokenizer model and a pack.json naming the language, the counts and the source files' sha256.

It is an xz-compressed tar (Python's tarfile reads it; nothing else needed there). `read_pack` gives the
contents back as Python objects. Shows progress on stderr and ends with a one-line summary.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from model.common_strings import CommonString, load_common_strings
from model.dictionaries import pair_provenance
from runtime.splits import escape_line, unescape_line

FORMAT_VERSION = 1
SOURCE_SUFFIX = "en"
# Splits the pack carries: test stays home (evaluation runs on the CPU machine, against the released model).
SPLITS = ("train", "valid")


@dataclass
class Pack:
    """A pack read back: pairs per split, train repeat counts, valid novel flags, the common strings."""

    meta: dict[str, Any]
    train: list[tuple[str, str]]
    valid: list[tuple[str, str]]
    train_packages: list[int]
    train_dictionary: list[bool]  # only bilingual dictionaries give the pair (packs of before: empty)
    valid_novel: list[bool]
    common: list[CommonString]
    tokenizer_model: bytes


def target_suffix(data: Path) -> str:
    """The target language's file suffix of a corpus directory (`es`, `fr`, `pt_BR`): the one besides
    `en` that train has (`train.es`), so packs of every language are made the same way."""
    found = sorted(
        p.suffix[1:]
        for p in data.glob("train.*")
        if p.suffix not in (".en", ".jsonl", ".json", ".gz", ".tmp") and p.is_file()
    )
    if len(found) != 1:
        raise SystemExit(f"{data}: expected one train.<lang> file besides train.en, found {found or 'none'}")
    return found[0]


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def split_pairs(data: Path, split: str, target: str) -> list[tuple[str, str]]:
    """(source, target) pairs of one split (newlines unescaped), for any target language."""
    src, tgt = read_lines(data / f"{split}.{SOURCE_SUFFIX}"), read_lines(data / f"{split}.{target}")
    if len(src) != len(tgt):
        raise SystemExit(f"{data}: {split}.en has {len(src)} lines, {split}.{target} {len(tgt)}")
    return [(unescape_line(a), unescape_line(b)) for a, b in zip(src, tgt, strict=True)]


def _jsonl_field(path: Path, read: Any) -> list[Any]:
    with path.open(encoding="utf-8") as handle:
        return [read(json.loads(line)) for line in handle]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644  # mtime 0: the same inputs give the same pack
    tar.addfile(info, io.BytesIO(data))


def _lines(values: list[Any]) -> bytes:
    return "".join(f"{v}\n" for v in values).encode("utf-8")


def make_pack(data: Path, tokenizer: Path, out: Path, log: Any = None) -> dict[str, Any]:
    """Write the pack of corpus directory `data` with `tokenizer` to `out`; returns pack.json."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    started = time.perf_counter()
    target = target_suffix(data)
    members: dict[str, bytes] = {}
    counts: dict[str, int] = {}
    for split in SPLITS:
        pairs = split_pairs(data, split, target)
        counts[split] = len(pairs)
        members[f"{split}.src"] = _lines([escape_line(s) for s, _ in pairs])
        members[f"{split}.tgt"] = _lines([escape_line(t) for _, t in pairs])
        log(f"{split}: {len(pairs)} pairs")
    train_jsonl, valid_jsonl = data / "train.jsonl", data / "valid.jsonl"
    packages, dictionary_only = pair_provenance(train_jsonl) if train_jsonl.exists() else ([], [])
    novel = _jsonl_field(valid_jsonl, lambda r: int(bool(r.get("novel")))) if valid_jsonl.exists() else []
    if novel and len(novel) != counts["valid"]:
        raise SystemExit(f"{valid_jsonl}: {len(novel)} records for {counts['valid']} valid pairs")
    members["train.packages"] = _lines(packages)
    members["train.dictionary"] = _lines([int(d) for d in dictionary_only])
    members["valid.novel"] = _lines(novel or [1] * counts["valid"])  # no provenance: all count as novel
    log(
        f"provenance: {len(packages)} package counts ({sum(dictionary_only)} dictionary pairs), "
        f"{sum(novel)} novel valid pairs"
    )
    common = load_common_strings(data) if train_jsonl.exists() else []
    members["common.json"] = (json.dumps([asdict(c) for c in common], ensure_ascii=False) + "\n").encode()
    log(f"common UI strings: {len(common)}")
    members["tokenizer.model"] = tokenizer.read_bytes()
    manifest = json.loads((data / "manifest.json").read_text()) if (data / "manifest.json").exists() else {}
    meta = {
        "format_version": FORMAT_VERSION,
        "source_language": SOURCE_SUFFIX,
        "target_language": target,
        "language": manifest.get("language", target),
        "pairs": counts,
        "common_strings": len(common),
        "data": str(data),
        "tokenizer": str(tokenizer),
        "sha256": {name: _sha256(blob) for name, blob in members.items()},
    }
    members = {"pack.json": (json.dumps(meta, indent=2) + "\n").encode(), **members}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    log(f"compressing {sum(map(len, members.values())) / 2**20:.1f} MiB (xz)...")
    with tarfile.open(tmp, "w:xz", preset=6) as tar:
        for name, blob in members.items():
            _add(tar, name, blob)
    tmp.replace(out)
    meta["bytes"] = out.stat().st_size
    meta["seconds"] = round(time.perf_counter() - started, 1)
    return meta


def read_pack(path: Path) -> Pack:
    """The pack's contents; SystemExit naming the member whose checksum does not match."""
    with tarfile.open(path, "r:xz") as tar:
        blobs = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    meta = json.loads(blobs.pop("pack.json"))
    if meta.get("format_version") != FORMAT_VERSION:
        raise SystemExit(
            f"{path}: pack format {meta.get('format_version')}, this code reads {FORMAT_VERSION}"
        )
    for name, digest in meta["sha256"].items():
        if _sha256(blobs.get(name, b"")) != digest:
            raise SystemExit(f"{path}: member {name} is missing or damaged (sha256 mismatch)")

    def text(name: str) -> list[str]:
        return blobs[name].decode("utf-8").split("\n")[:-1]

    def pairs(split: str) -> list[tuple[str, str]]:
        src, tgt = text(f"{split}.src"), text(f"{split}.tgt")
        return [(unescape_line(a), unescape_line(b)) for a, b in zip(src, tgt, strict=True)]

    common = [
        CommonString(c["source"], tuple(c["accepted"]), c["packages"])
        for c in json.loads(blobs["common.json"])
    ]
    return Pack(
        meta=meta,
        train=pairs("train"),
        valid=pairs("valid"),
        train_packages=[int(x) for x in text("train.packages")],
        train_dictionary=[x == "1" for x in text("train.dictionary")] if "train.dictionary" in blobs else [],
        valid_novel=[x == "1" for x in text("valid.novel")],
        common=common,
        tokenizer_model=blobs["tokenizer.model"],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=Path("data"), help="corpus directory (make corpus)")
    parser.add_argument("--tokenizer", type=Path, required=True, help="SentencePiece model to train with")
    parser.add_argument("--out", type=Path, required=True, help="the pack (.tar, xz-compressed)")
    args = parser.parse_args(argv)
    if not (args.data / "train.en").is_file():
        raise SystemExit(f"{args.data}/train.en is missing: run `make corpus` first")
    meta = make_pack(args.data, args.tokenizer, args.out)
    print(
        f"pack {args.out}: {meta['bytes'] / 2**20:.1f} MiB, en->{meta['target_language']}, "
        f"{meta['pairs']['train']} train + {meta['pairs']['valid']} valid pairs, "
        f"{meta['common_strings']} common strings, {meta['seconds']} s"
    )


if __name__ == "__main__":
    main()
