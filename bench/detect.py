"""Which language identifier backs the HTTP API's /detect and `source=auto`: accuracy on short UI strings,
per-call latency, load time and wheel size of each candidate, on the corpora's valid splits only.

    python -m bench.detect [--per-bucket 300] [--seed 0] [--json out.json]

Strings: the human translations of each language's valid split (`data/valid.jsonl` for es,
`runs/data-{fr,de,it,pt_BR}/valid.jsonl`) and the English sources of `data/valid.jsonl`, sampled per
length bucket (1 word, 2-3, 4-8, 9+), at most --per-bucket each. A guess counts when its primary
subtag is the language's (pt for pt_BR). Each candidate runs with all the languages it knows ("all"),
with the ones LibreTranslate's models cover ("lt": server.detect.CANDIDATES, those the tool knows) and,
where it can, with the corpora's six ("six": the best it could do if it only had to tell those apart).
Latency is the median and p99 of one call, single-threaded, with the model loaded; load is a fresh
process's import, load and first call (and its peak memory), measured in a subprocess.

Then the server's rule for `source=auto` (server.detect.choose_source, py3langid over the "lt" set) on a
server that translates from English only: the share of English strings it routes (the rest are refused
wrongly) and of the other languages' strings it refuses (the rest are translated as if English).

Candidates that are not installed are listed as such: `pip install py3langid lingua-language-detector
langdetect` to measure all three. Results: docs/service.md, "Language detection".
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SIX = ("en", "es", "fr", "de", "it", "pt")
CORPORA = {  # language -> (valid split, field holding that language)
    "en": (ROOT / "data/valid.jsonl", "source"),
    "es": (ROOT / "data/valid.jsonl", "target"),
    "fr": (ROOT / "runs/data-fr/valid.jsonl", "target"),
    "de": (ROOT / "runs/data-de/valid.jsonl", "target"),
    "it": (ROOT / "runs/data-it/valid.jsonl", "target"),
    "pt": (ROOT / "runs/data-pt_BR/valid.jsonl", "target"),
}
BUCKETS = (("1 word", 1, 1), ("2-3 words", 2, 3), ("4-8 words", 4, 8), ("9+ words", 9, 10**9))
WORD = re.compile(r"[^\W\d_]+")
DISTRIBUTIONS = {  # candidate -> the PyPI distribution whose wheel carries it
    "py3langid": "py3langid",
    "lingua": "lingua-language-detector",
    "langdetect": "langdetect",
}

Detect = Callable[[str], str]


def sample(path: Path, field: str, per_bucket: int, seed: int) -> dict[str, list[str]]:
    """Up to per_bucket distinct strings per length bucket (words of letters; none = skipped)."""
    texts = list(dict.fromkeys(json.loads(line)[field] for line in path.open(encoding="utf-8")))
    random.Random(seed).shuffle(texts)
    out: dict[str, list[str]] = {name: [] for name, _, _ in BUCKETS}
    for text in texts:
        words = len(WORD.findall(text))
        for name, low, high in BUCKETS:
            if low <= words <= high and len(out[name]) < per_bucket:
                out[name].append(text)
    return out


def py3langid_detector(languages: tuple[str, ...] | None) -> Detect:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    if languages:
        identifier.set_languages(list(languages))
    return lambda text: identifier.classify(text)[0]


def lingua_detector(languages: tuple[str, ...] | None) -> Detect:
    from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

    if languages:
        # Bokmål is "nb" to lingua, "no" to py3langid; codes lingua lacks (ky, gl) are left out.
        codes = [getattr(IsoCode639_1, {"no": "NB"}.get(c, c.upper()), None) for c in languages]
        chosen = [Language.from_iso_code_639_1(c) for c in codes if c is not None]
        builder = LanguageDetectorBuilder.from_languages(*chosen)
    else:
        builder = LanguageDetectorBuilder.from_all_languages()
    detector = builder.build()

    def detect(text: str) -> str:
        found = detector.detect_language_of(text)
        code = found.iso_code_639_1.name.lower() if found else "?"
        return {"nb": "no"}.get(code, code)

    return detect


def langdetect_detector(languages: tuple[str, ...] | None) -> Detect:
    if languages:
        raise NotImplementedError("langdetect cannot be limited to a set of languages")
    import langdetect

    langdetect.DetectorFactory.seed = 0  # otherwise two calls on one text may disagree

    def detect(text: str) -> str:
        try:
            return langdetect.detect(text).split("-")[0]
        except langdetect.LangDetectException:  # no features (digits, punctuation)
            return "?"

    return detect


FACTORIES: dict[str, Callable[[tuple[str, ...] | None], Detect]] = {
    "py3langid": py3langid_detector,
    "lingua": lingua_detector,
    "langdetect": langdetect_detector,
}


def wheel_size(distribution: str) -> str:
    """Installed size of the distribution's files (what its wheel unpacks to), in MB."""
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
    total = sum(f.locate().stat().st_size for f in files if f.locate().is_file())
    return f"{total / 1e6:.1f} MB installed"


LOAD = """
import resource, sys, time
t = time.perf_counter()
from bench.detect import FACTORIES
FACTORIES[sys.argv[1]](None)("Open the file")
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def load_cost(name: str) -> tuple[float, float]:
    """(seconds, peak MB) of a fresh process that imports, loads and calls the candidate once."""
    out = subprocess.run(
        [sys.executable, "-c", LOAD, name], cwd=ROOT, capture_output=True, text=True, check=True, timeout=600
    ).stdout.split()
    return round(float(out[0]), 2), round(float(out[1]))


def measure(detect: Detect, sets: dict[str, dict[str, list[str]]]) -> dict[str, Any]:
    detect("Open the file")  # loaded before the clock starts
    right: dict[str, int] = {}
    total: dict[str, int] = {}
    times: list[float] = []
    for lang, buckets in sets.items():
        for bucket, texts in buckets.items():
            for text in texts:
                t = time.perf_counter()
                guess = detect(text)
                times.append(time.perf_counter() - t)
                for key in (f"{lang}", f"bucket:{bucket}", "all"):
                    total[key] = total.get(key, 0) + 1
                    right[key] = right.get(key, 0) + (guess == lang)
    times.sort()
    return {
        "accuracy": {k: round(100 * right[k] / total[k], 1) for k in total},
        "counts": total,
        "median_ms": round(1000 * statistics.median(times), 3),
        "p99_ms": round(1000 * times[int(0.99 * (len(times) - 1))], 3),
    }


def auto_rule(sets: dict[str, dict[str, list[str]]], thresholds: tuple[float, ...]) -> dict[str, Any]:
    """server.detect.choose_source on an English-source server, per threshold (the `sure` it refuses
    at): per bucket, the % of English strings it routes (the rest are refused wrongly) and the mean % of
    the other languages' strings it refuses (the rest are translated as if English)."""
    from server.detect import LanguageIdentifier, choose_source  # not in load_cost's subprocess

    identifier = LanguageIdentifier()
    ranked = {
        lang: {b: [identifier.rank(t) for t in texts] for b, texts in bs.items()} for lang, bs in sets.items()
    }
    out: dict[str, Any] = {}
    for sure in thresholds:
        rows: dict[str, dict[str, float]] = {}
        for lang, buckets in ranked.items():
            rows[lang] = {
                b: round(
                    100 * sum(choose_source(r, ["en"], sure).source == "en" for r in rs) / max(1, len(rs)), 1
                )
                for b, rs in buckets.items()
            }
        others = [lang for lang in rows if lang != "en"]
        out[f"{sure:g}"] = {
            "en routed": rows.get("en", {}),
            "others refused": {
                b: round(100 - statistics.mean(rows[lang][b] for lang in others), 1) for b in rows["en"]
            },
            "per language routed": rows,
        }
    return out


def print_table(head: list[str], rows: list[list[Any]]) -> None:
    print("| " + " | ".join(head) + " |")
    print("| --- " + "| ---: " * (len(head) - 1) + "|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")


def main() -> None:
    # Imported here: load_cost's subprocess imports this module and must measure the candidate alone.
    from server.detect import CANDIDATES, SURE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-bucket", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sets = {
        lang: sample(path, field, args.per_bucket, args.seed)
        for lang, (path, field) in CORPORA.items()
        if path.is_file()
    }
    missing = sorted(set(CORPORA) - set(sets))
    if missing:
        print(f"no valid split for {', '.join(missing)} (make corpus CORPUS_LANG=...): left out")
    results: dict[str, Any] = {}
    for name, factory in FACTORIES.items():
        try:
            seconds, peak_mb = load_cost(name)
        except subprocess.CalledProcessError:
            results[name] = {"error": "not installed"}
            continue
        for label, languages in (("all", None), ("lt", tuple(CANDIDATES)), ("six", SIX)):
            try:
                detect = factory(languages)
            except NotImplementedError as e:
                results[f"{name} ({label})"] = {"error": str(e)}
                continue
            results[f"{name} ({label})"] = measure(detect, sets) | {
                "load_s": seconds,
                "peak_mb": peak_mb,
                "size": wheel_size(DISTRIBUTIONS[name]),
            }
    langs = list(sets)
    buckets = [b for b, _, _ in BUCKETS]
    rows = []
    for key, r in results.items():
        if "error" in r:
            rows.append([key, r["error"]])
            continue
        acc = r["accuracy"]
        cells = [acc["all"], *(acc[x] for x in langs), *(acc[f"bucket:{b}"] for b in buckets)]
        rows.append([key, *cells, r["median_ms"], r["p99_ms"], r["load_s"], r["peak_mb"], r["size"]])
    print("Accuracy (% of strings whose language is named), latency, cost:")
    print_table(["candidate", "all", *langs, *buckets, "ms p50", "ms p99", "load s", "peak MB", "size"], rows)
    counts = next((r["counts"] for r in results.values() if "counts" in r), {})
    print("strings: " + ", ".join(f"{x} {counts.get(x, 0)}" for x in langs))
    rule = auto_rule(sets, tuple(sorted({10.0, 20.0, 30.0, 40.0, 50.0, SURE})))
    print(f"\nsource=auto on an English-source server (server.detect.choose_source, shipped sure={SURE:g}):")
    print("% of English strings routed / % of fr, de, it, es, pt strings refused (mean), per length")
    rows = [
        [sure, *(f"{r['en routed'][b]} / {r['others refused'][b]}" for b in buckets)]
        for sure, r in rule.items()
    ]
    print_table(["sure", *buckets], rows)
    if args.json:
        args.json.write_text(json.dumps({"candidates": results, "auto_rule": rule}, indent=1) + "\n")


if __name__ == "__main__":
    main()
