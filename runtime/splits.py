"""The corpus split files (`data/{split}.en` and `.es` or the target language's suffix): one segment a line,
newlines escaped.

Written by `model.corpus`; read by training, evaluation, benchmarks and the load generator, none of which
needs the corpus builder for it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path


def escape_line(text: str) -> str:
    """One segment per line: a real newline inside a message is stored as backslash + n."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def unescape_line(line: str) -> str:
    return re.sub(r"\\([\\nr])", lambda m: {"n": "\n", "r": "\r", "\\": "\\"}[m.group(1)], line)


def target_language(data_dir: Path) -> str:
    """The corpus's target language: its manifest's ``language.code`` (model.corpus --lang), else ``es``
    (corpora built before other languages, and test fixtures without a manifest)."""
    manifest = data_dir / "manifest.json"
    if manifest.is_file():
        record = json.loads(manifest.read_text(encoding="utf-8")).get("language")
        if isinstance(record, dict) and record.get("code"):
            return str(record["code"])
    return "es"


def read_split(data_dir: Path, split: str) -> list[tuple[str, str]]:
    """Read back (English, target) pairs of one split: ``{split}.en`` and ``{split}.<target language>``."""
    lang = target_language(data_dir)
    en = (data_dir / f"{split}.en").read_text(encoding="utf-8").split("\n")[:-1]
    tgt = (data_dir / f"{split}.{lang}").read_text(encoding="utf-8").split("\n")[:-1]
    if len(en) != len(tgt):
        raise ValueError(f"{split}: {len(en)} English lines but {len(tgt)} lines in {split}.{lang}")
    return [(unescape_line(a), unescape_line(b)) for a, b in zip(en, tgt, strict=True)]


def source_sentences(data_dir: Path, fallback: Path, max_chars: int = 200) -> list[str]:
    """English sentences for load tests and benchmarks: the test split of data_dir when it exists, else
    the lines of `fallback`; blank ones and those over max_chars dropped (unless that drops all)."""
    sentences: list[str] = []
    if (data_dir / "test.en").is_file() and (data_dir / f"test.{target_language(data_dir)}").is_file():
        sentences = [en for en, _ in read_split(data_dir, "test")]
    if not sentences:
        sentences = [line for line in fallback.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept = [s for s in sentences if s.strip() and len(s) <= max_chars]
    return kept or sentences
