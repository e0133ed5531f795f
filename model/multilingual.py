"""One model for several target languages, measured against one model per pair at equal training compute.

A multilingual model reads a target-language tag in front of its source (``>>fr<< Open the file``, the
OPUS-MT convention) and shares one vocabulary, one encoder and one decoder between its pairs. Whether
that beats a model per pair at this size is a question of numbers (issue 31), so this module builds
the experiment from the per-language corpora and scores it the way training scores a pair:

    python -m model.multilingual corpus --data runs/data-fr runs/data-de runs/data-it --out runs/data-mul
    python -m model.tokenizer --data runs/data-mul --out runs/en-mul-small/tokenizer
    python -m model.train --data runs/data-mul --tokenizer runs/en-mul-small/tokenizer/tokenizer.model \\
        --run-dir runs/en-mul-small --release-dir runs/en-mul-small/release --config small \\
        --max-tokens 3000 --lr 1.5e-3 --warmup 1000 --max-steps 22200      # 3 x 7,400: equal compute
    python -m model.multilingual score --data runs/data-mul --model runs/en-mul-small/release \\
        --per-pair fr=runs/en-fr-small/release de=runs/en-de-small/release it=runs/en-it-small/release
    python -m model.multilingual compare --data runs/data-mul --model runs/en-mul-small/release \\
        --models fr=runs/en-fr-small/release de=runs/en-de-small/release --split test

`corpus` concatenates the splits of every language with its tag on the source (``{split}.en``,
``{split}.mul``, ``{split}.jsonl`` with each record's ``language``); the manifest names the tags (the
tokenizer makes each one piece) and every source corpus with its own manifest's checksums. `score`
measures the model on each language's own validation set, the same pairs its per-pair run was
measured on (loss on 4,000 valid pairs, greedy BLEU/chrF on 400 novel valid pairs, the 200 common UI
strings), and puts beside it that run's record at the step with equal compute: the multilingual step
divided by the number of languages (each step of either run is one batch of --max-tokens). `compare`
measures both final models the same way on each language's test split (its held-out packages).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from runtime.bundle import sha256_file
from runtime.splits import escape_line, read_split, target_language

CODE = "mul"  # ISO 639-2 "multiple languages": the suffix of the target split files
SPLITS = ("train", "valid", "test")


def tag(language: str) -> str:
    """The token in front of a source that names the target language."""
    return f">>{language}<<"


def tagged(language: str, source: str) -> str:
    return f"{tag(language)} {source}"


def build_corpus(datas: list[Path], out: Path) -> dict:
    """Write the tagged splits of every corpus in `datas` into `out`; returns the manifest written."""
    languages = [target_language(d) for d in datas]
    if len(set(languages)) != len(languages):
        raise SystemExit(f"one corpus per target language, got {languages}")
    out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, dict[str, int]] = {}
    for split in SPLITS:
        counts[split] = {}
        with (
            (out / f"{split}.en").open("w", encoding="utf-8") as en,
            (out / f"{split}.{CODE}").open("w", encoding="utf-8") as tgt,
            (out / f"{split}.jsonl").open("w", encoding="utf-8") as records,
        ):
            for data, language in zip(datas, languages, strict=True):
                pairs = read_split(data, split)
                with (data / f"{split}.jsonl").open(encoding="utf-8") as handle:
                    for (source, target), line in zip(pairs, handle, strict=True):
                        record = json.loads(line)
                        record["source"] = tagged(language, record["source"])
                        record["language"] = language
                        en.write(escape_line(tagged(language, source)) + "\n")
                        tgt.write(escape_line(target) + "\n")
                        records.write(json.dumps(record, ensure_ascii=False) + "\n")
                counts[split][language] = len(pairs)
                print(f"  {split} {language}: {len(pairs)} pairs", file=sys.stderr, flush=True)
    manifest = {
        "language": {"code": CODE, "name": "multilingual (" + ", ".join(languages) + ")"},
        "languages": languages,
        "tags": {language: tag(language) for language in languages},
        "sources": {
            language: {"data": str(data), "manifest_sha256": sha256_file(data / "manifest.json")}
            for data, language in zip(datas, languages, strict=True)
        },
        "counts": counts,
        "rule": "every split of every source corpus, its source behind its language's tag; splits as the "
        "source corpora made them (held-out packages stay held out)",
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest


def tags_of(data: Path) -> list[str]:
    """The language tags a corpus manifest declares (none for a one-pair corpus)."""
    manifest = data / "manifest.json"
    if not manifest.is_file():
        return []
    return list(json.loads(manifest.read_text(encoding="utf-8")).get("tags", {}).values())


def per_pair_record(run: Path, step: int) -> dict | None:
    """The validation record of a per-pair run (its release's training.json history) at `step`, or at the
    last step recorded before it."""
    history = json.loads((run / "training.json").read_text(encoding="utf-8")).get("history", [])
    before = [r for r in history if r.get("step", 0) <= step and "valid_bleu" in r]
    return before[-1] if before else None


def _release_step(model_dir: Path) -> int:
    """The step of a release's weights (its training.json's best record)."""
    training = json.loads((model_dir / "training.json").read_text(encoding="utf-8"))
    return int(training.get("best", training).get("step", 0))


def _language_sets(manifest: dict, language: str, split: str, with_tag: bool) -> tuple[list, list, list]:
    """A language's `split` pairs, their novel flags and its common UI strings, from its own corpus; with
    its tag in front of every source for the multilingual model, as they are for a per-pair one without."""
    from model.common_strings import load_common_strings
    from model.corpus import read_novel

    source = Path(manifest["sources"][language]["data"])
    pairs, common = read_split(source, split), load_common_strings(source)
    if with_tag:
        pairs = [(tagged(language, s), t) for s, t in pairs]
        common = [replace(c, source=tagged(language, c.source)) for c in common]
    return pairs, read_novel(source, split), common


class _Release:
    """A released model directory loaded once: its model, tokenizer and step."""

    def __init__(self, model_dir: Path) -> None:
        from model.train import load_release
        from runtime.tokenizer import Tokenizer

        self.tokenizer = Tokenizer(model_dir / "tokenizer.model")
        self.model = load_release(model_dir)
        self.step = _release_step(model_dir)

    def measure(self, sets: tuple[list, list, list], bleu_sentences: int) -> dict:
        """What model.train.Validation measures, on these sets."""
        import torch

        from model.train import Validation

        pairs, novel, common = sets
        validation = Validation.from_pairs(pairs, novel, common, self.tokenizer, 128, 3000, bleu_sentences)
        return validation.measure(self.model, self.tokenizer, torch.device("cpu"))


def score(data: Path, model_dir: Path, per_pair: dict[str, Path], threads: int) -> list[dict]:
    """Each language's validation of the multilingual model at `model_dir`, beside its per-pair run."""
    import torch

    torch.set_num_threads(threads)
    manifest = json.loads((data / "manifest.json").read_text(encoding="utf-8"))
    release = _Release(model_dir)
    equal = release.step // len(manifest["languages"])
    rows = []
    for language in manifest["languages"]:
        started = time.perf_counter()
        measured = release.measure(_language_sets(manifest, language, "valid", with_tag=True), 400)
        row = {
            "language": language,
            "step": release.step,
            "multilingual": measured,
            "equal_compute_step": equal,
        }
        if language in per_pair:
            row["per_pair"] = per_pair_record(per_pair[language], equal)
        rows.append(row)
        print(f"  {language}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return rows


def compare(
    data: Path,
    model_dir: Path,
    per_pair_models: dict[str, Path],
    split: str,
    bleu_sentences: int,
    threads: int,
) -> list[dict]:
    """The multilingual model and each language's own model, measured the same way on that language's
    `split` (``test``: its held-out packages): the final comparison, once both runs have ended."""
    import torch

    torch.set_num_threads(threads)
    manifest = json.loads((data / "manifest.json").read_text(encoding="utf-8"))

    def measure(release: _Release, sets: tuple[list, list, list]) -> dict:
        # Serving cost: a decoder step per target piece, so a vocabulary shared between languages that
        # cuts their words finer makes every translation longer to generate.
        pairs = sets[0]
        pieces = sum(len(ids) for ids in release.tokenizer.encode_batch([t for _, t in pairs])) / max(
            len(pairs), 1
        )
        return release.measure(sets, bleu_sentences) | {
            "step": release.step,
            "target_pieces_per_sentence": round(pieces, 3),
        }

    multilingual = _Release(model_dir)
    rows = []
    for language in manifest["languages"]:
        started = time.perf_counter()
        row = {
            "language": language,
            "split": split,
            "multilingual": measure(multilingual, _language_sets(manifest, language, split, with_tag=True)),
        }
        if language in per_pair_models:
            sets = _language_sets(manifest, language, split, with_tag=False)
            row["per_pair"] = measure(_Release(per_pair_models[language]), sets)
        rows.append(row)
        print(f"  {language}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    print("| language | run | step | valid loss | novel BLEU | novel chrF | common UI strings |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        for run, r in (
            ("multilingual", {"step": row.get("step")} | row["multilingual"]),  # compare's rows: inside
            ("one pair", row.get("per_pair")),
        ):
            if r:
                print(
                    f"| {row['language']} | {run} | {r['step']} | {r['valid_loss']:.3f} "
                    f"| {r['valid_bleu']:.2f} | {r['valid_chrf']:.2f} "
                    f"| {r.get('common_accepted_percent', '?')}% |"
                )


def _language_dirs(items: list[str]) -> dict[str, Path]:
    """``LANG=DIR`` arguments as a mapping."""
    return {k: Path(v) for k, v in (item.split("=", 1) for item in items)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    corpus = commands.add_parser("corpus", help="the tagged corpus of several languages")
    corpus.add_argument("--data", type=Path, nargs="+", required=True, help="per-language corpora")
    corpus.add_argument("--out", type=Path, required=True)
    scoring = commands.add_parser("score", help="each language's validation beside its per-pair run")
    scoring.add_argument("--data", type=Path, required=True, help="the tagged corpus (its manifest)")
    scoring.add_argument("--model", type=Path, required=True, help="a released model directory")
    scoring.add_argument(
        "--per-pair", nargs="*", default=[], metavar="LANG=DIR", help="per-pair release dirs (training.json)"
    )
    scoring.add_argument("--threads", type=int, default=2)
    scoring.add_argument("--json", type=Path, help="also write the rows here")
    final = commands.add_parser("compare", help="both runs' final models on each language's test split")
    final.add_argument("--data", type=Path, required=True, help="the tagged corpus (its manifest)")
    final.add_argument("--model", type=Path, required=True, help="the multilingual release")
    final.add_argument("--models", nargs="*", default=[], metavar="LANG=DIR", help="per-pair releases")
    final.add_argument("--split", default="test", choices=SPLITS[1:])
    final.add_argument("--bleu-sentences", type=int, default=1000, help="greedy BLEU on up to N pairs")
    final.add_argument("--threads", type=int, default=2)
    final.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.command == "corpus":
        manifest = build_corpus(args.data, args.out)
        total = {split: sum(c.values()) for split, c in manifest["counts"].items()}
        print(f"wrote {args.out}: {total} pairs of {', '.join(manifest['languages'])} "
              f"in {time.perf_counter() - started:.0f} s")  # fmt: skip
        return
    if args.command == "compare":
        models = _language_dirs(args.models)
        rows = compare(args.data, args.model, models, args.split, args.bleu_sentences, args.threads)
    else:
        rows = score(args.data, args.model, _language_dirs(args.per_pair), args.threads)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    done = (
        f"compared {len(rows)} languages on {args.split}"
        if args.command == "compare"
        else f"scored {len(rows)} languages"
    )
    print(f"{done} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
