"""The translation memory of a model bundle: exact source strings that Debian's translators have already
translated, with the translation the most packages give (written by `model.memory`).

A text whose source is in the memory comes back as that human translation instead of the model's: on
the valid split's 1,780 texts whose source occurs in training, BLEU 60.96 -> 62.14 and chrF 75.61 ->
78.07 (the model, however well trained, misremembers some: `Modem` -> `Modelo`, `Clockwise` ->
`Desbloquear`).

File format: gzip-compressed JSON lines. The first line is a header object (`format`, `command`,
`entries`, and the selection rule); every other line is `[source, target, packages]`, packages being how
many packages of the training split ship that exact translation.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "FORMAT",
    "MEMORY_FILE",
    "NOTE_PREFIX",
    "MemoryEntry",
    "note_reason",
    "read_memory",
    "write_memory",
]

FORMAT = "translation-memory/1"
MEMORY_FILE = "memory.jsonl.gz"  # in a model directory (model.memory writes it) and in its bundle (export)
NOTE_PREFIX = "translation memory: "  # how the reason of such a text's note starts


@dataclass(frozen=True, slots=True)
class MemoryEntry:
    target: str
    packages: int  # packages that ship this exact translation of the source


def note_reason(entry: MemoryEntry) -> str:
    """What a text answered from the memory says: "translation memory: as 26 packages translate it"."""
    shipped = f"{entry.packages} package{'s' if entry.packages > 1 else ''}"
    return f"{NOTE_PREFIX}as {shipped} translate it"


def write_memory(path: Path, entries: Iterable[tuple[str, str, int]], header: dict) -> int:
    """Write (source, target, packages) entries sorted by source; returns how many were written."""
    rows = sorted(entries)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    # no name, mtime 0: the same entries give the same bytes (the file is committed with the model)
    with tmp.open("wb") as f, gzip.GzipFile("", "wb", compresslevel=9, fileobj=f, mtime=0) as raw:
        raw.write((json.dumps({"format": FORMAT, **header, "entries": len(rows)}) + "\n").encode())
        for row in rows:
            raw.write((json.dumps(list(row), ensure_ascii=False) + "\n").encode())
    tmp.replace(path)
    return len(rows)


def read_memory(path: Path) -> dict[str, MemoryEntry]:
    """source -> MemoryEntry. ValueError names the file when it is not a translation memory."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        header = json.loads(f.readline() or "{}")
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ValueError(f"{path}: not a translation memory (want format {FORMAT!r} in its first line)")
        memory = {}
        for line in f:  # line by line: the whole file parsed at once would double the peak memory
            source, target, packages = json.loads(line)
            memory[source] = MemoryEntry(target, int(packages))
    return memory
