"""The corpus split files (`data/{split}.en` / `.es`): one segment a line, newlines escaped.

Written by `model.corpus`; read by training, evaluation, benchmarks and the load generator, none of which
needs the corpus builder for it.
"""

from __future__ import annotations

import re
from pathlib import Path


def escape_line(text: str) -> str:
    """One segment per line: a real newline inside a message is stored as backslash + n."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def unescape_line(line: str) -> str:
    return re.sub(r"\\([\\nr])", lambda m: {"n": "\n", "r": "\r", "\\": "\\"}[m.group(1)], line)


def read_split(data_dir: Path, split: str) -> list[tuple[str, str]]:
    """Read back (English, Spanish) pairs of one split."""
    en = (data_dir / f"{split}.en").read_text(encoding="utf-8").split("\n")[:-1]
    es = (data_dir / f"{split}.es").read_text(encoding="utf-8").split("\n")[:-1]
    if len(en) != len(es):
        raise ValueError(f"{split}: {len(en)} English lines but {len(es)} Spanish lines")
    return [(unescape_line(a), unescape_line(b)) for a, b in zip(en, es, strict=True)]


def source_sentences(data_dir: Path, fallback: Path, max_chars: int = 200) -> list[str]:
    """English sentences for load tests and benchmarks: the test split of data_dir when it exists, else
    the lines of `fallback`; blank ones and those over max_chars dropped (unless that drops all)."""
    sentences: list[str] = []
    if (data_dir / "test.en").is_file() and (data_dir / "test.es").is_file():
        sentences = [en for en, _ in read_split(data_dir, "test")]
    if not sentences:
        sentences = [line for line in fallback.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept = [s for s in sentences if s.strip() and len(s) <= max_chars]
    return kept or sentences
