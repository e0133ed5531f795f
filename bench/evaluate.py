"""Evaluate a model the way its users meet it, side by side with Apertium, in one run.

    python -m bench.evaluate --model models/en-es-small --data data --split test --n 1000 --beam 4 \\
        [--apertium] [--bundle bundles/en-es-small --variant int8] [--json out.json]

What it reports, for the model and (``--apertium``) for Apertium on the very same inputs:
  * BLEU / chrF (sacrebleu defaults; signatures printed and stored) on a sample of the split, on all of
    it and on its *novel* part: pairs whose normalised source never occurs in train (the corpus labels
    them; train keeps every pair, so common strings are in both views); and chrF/BLEU by package;
  * the commonest UI strings: the 200 sources shipped by the most training packages
    (``model.common_strings``), exact match against any translation >= 2 packages give (case and final
    punctuation ignored);
  * the share of outputs with a repeated word (``Guardar Guardar``, ``Archivo de archivo``: a 3+ letter
    word repeated more often than in the reference), on the sample and on the common strings;
  * placeholder preservation: among sources with placeholders (``runtime.tokenizer.find_placeholders``:
    printf/Qt/brace/Python/shell placeholders, markup tags, entities), the share whose placeholders all
    appear unchanged in the output, as a multiset;
  * non-words, for each system and for the human references side by side: the share of outputs with a
    word in no dictionary of the lexicon (``runtime.faithful.lexicon.non_words``: Debian's hunspell-es
    expanded, the bundle's or the model directory's ``lexicon.txt.gz``), not copied from the source.

Sample: ``--n`` pairs drawn with ``random.Random(seed).sample`` over the split's line indices (default
seed 20240607, kept in the output), evaluated in corpus order; ``--n 0`` takes the whole split.

Backends for the model: ``torch`` (default; ``model.train.load_release`` on a snapshot of ``--model``,
then the reference ``model.decode`` search) or, with ``--bundle``, the serving engine
(``server.engine.Engine``) with ``--variant`` (fp32, int8); ``--text-layer`` translates through its
text layer (``Engine.translate_texts``: segmentation, span masking, restoring, as the service does)
instead of the raw ``Engine.translate``. Decoding defaults are the model's own
(``decoding.json`` / the bundle manifest), chosen on valid. Apertium: ``bench.apertium``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import sacrebleu
from tqdm import tqdm

from bench.apertium import Apertium
from model.common_strings import load_common_strings, repeated_word, score_common_strings
from model.corpus import read_split
from runtime.bundle import sha256_file
from runtime.faithful.lexicon import LEXICON_FILE, Lexicon, is_guard_note, non_word_rate, read_lexicon
from runtime.tokenizer import MODEL_FILE, find_placeholders

DEFAULT_SEED = 20240607
RELEASE_FILES = ("config.json", "model.safetensors", MODEL_FILE, "training.json")


# --------------------------------------------------------------------------------------------
# Sample and metrics


def sample_indices(total: int, n: int, seed: int = DEFAULT_SEED) -> list[int]:
    """`n` distinct indices out of `total`, reproducible from `seed`, in ascending order (n <= 0: all)."""
    if n <= 0 or n >= total:
        return list(range(total))
    return sorted(random.Random(seed).sample(range(total), n))


def placeholders_preserved(source: str, hypothesis: str) -> bool | None:
    """None when the source has no placeholders; else whether all of them survive (as a multiset)."""
    wanted = Counter(find_placeholders(source))
    if not wanted:
        return None
    return not wanted - Counter(find_placeholders(hypothesis))


def placeholder_stats(sources: Sequence[str], hypotheses: Sequence[str]) -> dict:
    """Counts and rate (percent, None when no source has placeholders) of placeholder preservation."""
    verdicts = [placeholders_preserved(s, h) for s, h in zip(sources, hypotheses, strict=True)]
    with_placeholders = sum(v is not None for v in verdicts)
    preserved = sum(v is True for v in verdicts)
    rate = 100.0 * preserved / with_placeholders if with_placeholders else None
    return {"with_placeholders": with_placeholders, "preserved": preserved, "rate": rate}


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """Corpus BLEU and chrF (sacrebleu defaults) with their signatures."""
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    return {
        "bleu": bleu_score.score,
        "chrf": chrf_score.score,
        "bleu_detail": str(bleu_score),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }


def repeated_word_share(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """Outputs repeating a word more often than their reference (`model.common_strings.repeated_word`)."""
    hits = [repeated_word(h, r) for h, r in zip(hypotheses, references, strict=True)]
    count = sum(hit is not None for hit in hits)
    return {"count": count, "percent": round(100.0 * count / max(len(hits), 1), 2)}


def score_system(sources: Sequence[str], references: Sequence[str], hypotheses: Sequence[str]) -> dict:
    scores = corpus_scores(hypotheses, references)
    scores["placeholders"] = placeholder_stats(sources, hypotheses)
    scores["repeated_word"] = repeated_word_share(hypotheses, references)
    return scores


# --------------------------------------------------------------------------------------------
# Model backends


def _progress(total: int, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit="seg", file=sys.stderr, mininterval=2, dynamic_ncols=True)


@contextmanager
def snapshot_model_dir(model_dir: Path, attempts: int = 5) -> Iterator[Path]:
    """Copy a release directory to a temporary one, retrying while the trainer is rewriting it."""
    with tempfile.TemporaryDirectory(prefix="evaluate-model-") as tmp:
        copy = Path(tmp)
        for attempt in range(attempts):
            before = {n: (model_dir / n).stat() for n in RELEASE_FILES if (model_dir / n).exists()}
            for name in before:
                shutil.copyfile(model_dir / name, copy / name)
            after = {n: (model_dir / n).stat() for n in RELEASE_FILES if (model_dir / n).exists()}
            stable = before.keys() == after.keys() and all(
                (before[n].st_mtime_ns, before[n].st_size) == (after[n].st_mtime_ns, after[n].st_size)
                for n in before
            )
            if stable and time.time() - max((s.st_mtime for s in after.values()), default=0) > 1.0:
                break
            time.sleep(1.0 + attempt)
        missing = [n for n in ("config.json", "model.safetensors", MODEL_FILE) if not (copy / n).exists()]
        if missing:
            raise FileNotFoundError(f"{model_dir}: missing {', '.join(missing)} (no checkpoint saved yet?)")
        yield copy


def _length_batches(lengths: Sequence[int], batch_size: int, max_tokens: int) -> list[list[int]]:
    """Indices sorted by length, cut into batches of <= batch_size rows and <= max_tokens padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) >= batch_size or (len(current) + 1) * lengths[i] > max_tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


@dataclass
class Translation:
    hypotheses: list[str]
    seconds: float
    info: dict = field(default_factory=dict)
    skipped: list[int] = field(default_factory=list)  # positions not translated (empty hypotheses)


def translate_torch(
    model_dir: Path,
    texts: list[str],
    beam: int,
    length_penalty: float,
    batch_size: int,
    device: str,
) -> Translation:
    import torch

    from model.decode import beam_search, greedy_decode, max_output_length
    from model.tokenizer import Tokenizer
    from model.train import load_release

    with snapshot_model_dir(model_dir) as snapshot:
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        torch_device = torch.device(device)
        model = load_release(snapshot, torch_device)
        tokenizer = Tokenizer(snapshot / MODEL_FILE)
        info: dict = {
            "backend": "torch",
            "model_dir": str(model_dir),
            "model_sha256": sha256_file(snapshot / "model.safetensors"),
            "device": str(torch_device),
            "threads": torch.get_num_threads(),
            "beam": beam,
            "length_penalty": length_penalty,
            "parameters": model.num_parameters(),
        }
        if (snapshot / "training.json").exists():
            best = json.loads((snapshot / "training.json").read_text()).get("best", {})
            info["checkpoint"] = {k: best.get(k) for k in ("step", "epoch", "valid_bleu", "valid_chrf")}

    limit = model.config.max_positions - 2
    encoded = tokenizer.encode_batch(texts)
    info["truncated_sources"] = sum(len(ids) > limit for ids in encoded)  # as model.train.translate does
    encoded = [ids[:limit] for ids in encoded]
    outputs = [""] * len(texts)
    started = time.perf_counter()
    with torch.inference_mode(), _progress(len(texts), f"model (torch, beam {beam})") as bar:
        for idx in _length_batches([max(len(e), 1) for e in encoded], batch_size, 64 * batch_size):
            ids = [encoded[i] for i in idx]
            src = torch.full((len(ids), max(1, *map(len, ids))), tokenizer.pad_id, dtype=torch.long)
            for row, seq in enumerate(ids):
                src[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            max_len = torch.tensor([max_output_length(len(seq)) for seq in ids])
            src, max_len = src.to(torch_device), max_len.to(torch_device)
            if beam == 1:
                hyps = greedy_decode(model, src, max_len)
            else:
                nbest = beam_search(model, src, beam, max_len, length_penalty=length_penalty)
                hyps = [best[0][0] if best else [] for best in nbest]
            for i, text in zip(idx, tokenizer.decode_batch(hyps), strict=True):
                outputs[i] = text
            bar.update(len(idx))
    return Translation(outputs, time.perf_counter() - started, info)


def translate_onnx(
    bundle: Path,
    variant: str,
    texts: list[str],
    beam: int,
    length_penalty: float,
    batch_size: int,
    device: str,
    threads: int,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    text_layer: bool = False,
    memory: bool = True,
    lexical_guard: bool = True,
    dictionary_terms: bool = True,
) -> Translation:
    """The serving engine in-process: ``Engine.translate`` (the raw model path: a text over
    max_source_tokens is skipped, an empty output) or, with `text_layer`, ``Engine.translate_texts`` (what
    the service does: segmentation, masking, restoring; long texts are split, so none is skipped unless
    the text layer refuses it). Same length-sorted batches either way. `memory`: the text layer answers
    from the bundle's translation memory, as the service does by default; `lexical_guard`: its lexical
    guard (a hypothesis with a word in no dictionary gives way) is on, likewise, and so are its dictionary
    terms (`dictionary_terms`: words the catalogs seldom hold, as the dictionaries translate them)."""
    from server.engine import DecodingOptions, Engine, use_shared_pool  # lazy: torch needs none of it

    use_shared_pool(threads)  # as the server runs its engines: one ONNX Runtime pool for all
    engine = Engine(
        bundle, variant=variant, device=device, intra_op_threads=threads, memory=memory,
        lexical_guard=lexical_guard, dictionary_terms=dictionary_terms,
    )  # fmt: skip
    engine.warmup()
    options = DecodingOptions(
        beam_size=beam, num_hypotheses=1, max_length=0, length_penalty=length_penalty,
        repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
    )  # fmt: skip
    lengths = engine.count_tokens(texts)
    too_long = [] if text_layer else [i for i, n in enumerate(lengths) if n > engine.max_source_tokens]
    info = {
        "backend": "onnx",
        "text_layer": text_layer,
        "memory": text_layer and bool(engine.memory),
        "lexical_guard": text_layer and engine.lexicon is not None,
        "dictionary_terms": len(engine.dictionary_terms or ()) if text_layer else 0,
        "bundle": str(bundle),
        "variant": variant,
        "name": getattr(engine, "name", None),
        "version": getattr(engine, "version", None),
        "providers": list(getattr(engine, "providers", [])),
        "beam": beam,
        "length_penalty": length_penalty,
        "repetition_penalty": repetition_penalty,
        "no_repeat_ngram_size": no_repeat_ngram_size,
        "skipped_too_long": len(too_long),
    }
    skip = set(too_long)
    keep = [i for i in range(len(texts)) if i not in skip]
    outputs = [""] * len(texts)  # too-long segments count as empty translations
    skipped = list(too_long)
    notes: list[tuple] = []  # the text layer's notes on each best hypothesis
    started = time.perf_counter()
    desc = f"model (onnx {variant}{' + text layer' if text_layer else ''}, beam {beam})"
    with _progress(len(texts), desc) as bar:
        bar.update(len(too_long))
        for batch in _length_batches([max(lengths[i], 1) for i in keep], batch_size, 64 * batch_size):
            idx = [keep[j] for j in batch]
            if text_layer:
                results, refused = _translate_texts(engine, [texts[i] for i in idx], options)
                skipped += [idx[j] for j in refused]
            else:
                results = engine.translate([texts[i] for i in idx], options)
            for i, nbest in zip(idx, results, strict=True):
                outputs[i] = nbest[0].text if nbest else ""
                notes.append(nbest[0].notes if nbest else ())
            bar.update(len(idx))
    if text_layer:
        info["skipped_too_long"] = len(skipped)  # refused by the text layer (over its character limit)
        # How often the lexical guard fired: texts whose best hypothesis it changed, and texts it only noted.
        info["lexical_guard_notes"] = {
            "used_another": sum(any(is_guard_note(n.reason, True) for n in ns) for ns in notes),
            "none_left": sum(any(is_guard_note(n.reason, False) for n in ns) for ns in notes),
        }
    return Translation(outputs, time.perf_counter() - started, info, sorted(skipped))


def _translate_texts(engine, texts: list[str], options) -> tuple[list[list], list[int]]:
    """``Engine.translate_texts`` on a batch; if it refuses a text (InputTooLongError) the batch goes
    text by text and each refused text comes back with an empty n-best list. Returns (results, refused
    positions)."""
    from server.engine import InputTooLongError

    try:
        return engine.translate_texts(texts, options), []
    except InputTooLongError:
        results: list[list] = []
        refused: list[int] = []
        for pos, text in enumerate(texts):
            try:
                results += engine.translate_texts([text], options)
            except InputTooLongError:
                results.append([])
                refused.append(pos)
        return results, refused


def translate_apertium(texts: list[str], pair: str | None, mode: str) -> Translation:
    with Apertium(pair, mode) as apertium, _progress(len(texts), f"apertium ({mode})") as bar:
        started = time.perf_counter()
        outputs = apertium.translate_all(texts, bar.update)
        seconds = time.perf_counter() - started
        info = {"backend": "apertium", "pair": apertium.pair, "mode": mode, "version": apertium.version()}
    return Translation(outputs, seconds, info)


# --------------------------------------------------------------------------------------------
# Report


def _short(text: str, width: int = 150) -> str:
    text = text.replace("\n", "\u23ce")
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def pick_examples(sources: Sequence[str], k: int) -> list[int]:
    """First k//2 sample positions whose source has placeholders, then the first others up to k."""
    with_ph = [i for i, s in enumerate(sources) if find_placeholders(s)][: k // 2]
    rest = [i for i in range(len(sources)) if i not in set(with_ph)][: k - len(with_ph)]
    return sorted(with_ph + rest)


def _fmt_rate(stats: dict) -> str:
    if stats["rate"] is None:
        return "n/a"
    return f"{stats['rate']:.1f}% ({stats['preserved']}/{stats['with_placeholders']})"


def print_report(report: dict, sources: list[str], references: list[str], hyps: dict[str, list[str]]) -> None:
    systems = report["systems"]
    sample = report["sample"]
    print(
        f"\n{report['split']} split of {report['data']}: {sample['n']} of {sample['total']} pairs "
        f"(seed {sample['seed']}), {sample['novel']} novel, {sample['with_placeholders']} with placeholders"
    )
    names = list(systems)
    width = max(12, *map(len, names))
    header = (
        f"{'BLEU':>6}  {'chrF':>6}  {'novel BLEU':>10}  {'novel chrF':>10}  {'placeholders kept':>22}  "
        f"{'repeats':>7}  {'common UI':>9}  {'seconds':>8}"
    )
    print(f"\n{'system':<{width}}  {header}")
    for name in names:
        s, novel, common = systems[name], systems[name]["novel"], systems[name]["common_strings"]
        print(
            f"{name:<{width}}  {s['bleu']:6.2f}  {s['chrf']:6.2f}  "
            f"{novel['bleu']:10.2f}  {novel['chrf']:10.2f}  "
            f"{_fmt_rate(s['placeholders']):>22}  {s['repeated_word']['percent']:6.1f}%  "
            f"{common['accepted_percent']:8.1f}%  {s['seconds']:8.1f}"
        )
    print(
        f"{'reference':<{width}}  {'':>6}  {'':>6}  {'':>10}  {'':>10}  "
        f"{_fmt_rate(report['reference_placeholders']):>22}"
    )
    if report.get("reference_non_words") is not None:
        rates = [(name, systems[name]["non_words"]) for name in names]
        rates.append(("reference", report["reference_non_words"]))
        print(
            "non-words (outputs with a word in no dictionary, not copied from the source): "
            + ", ".join(f"{name} {r['percent']:.1f}% ({r['count']}/{r['n']})" for name, r in rates)
        )
    for name in names:
        if systems[name].get("lexical_guard") and (fired := systems[name].get("lexical_guard_notes")):
            print(
                f"lexical guard ({name}): another hypothesis used for {fired['used_another']} texts, "
                f"none without a non-word for {fired['none_left']}"
            )
    common = report["common_strings"]
    print(
        f"\ncommon UI strings: {common['n']} sources shipped by the most training packages; accepted = a "
        f"translation >= 2 packages give (case, final punctuation ignored). Outputs with a repeated word: "
        + ", ".join(f"{name} {systems[name]['common_strings']['repeated_word']}" for name in names)
    )
    for name in names:
        misses = systems[name]["common_strings"]["misses"]
        shown = "; ".join(f"{m['source']!r} -> {m['output']!r}" for m in misses[:8])
        print(f"  {name} misses ({len(misses)}): {shown}")
    print(f"\nBLEU: {report['signatures']['bleu']}\nchrF: {report['signatures']['chrf']}")
    by_package = report["by_package"]
    if by_package:
        print(f"\nchrF by package ({' / '.join(names)}):")
        for package, row in by_package.items():
            scores = " / ".join(f"{row[name]['chrf']:5.1f}" for name in names)
            print(f"  {package:<32} n={row['n']:<5} {scores}")
    print("\nexamples:")
    for i in report["example_positions"]:
        print(f"  SRC  {_short(sources[i])}\n  REF  {_short(references[i])}")
        for name in names:
            print(f"  {name[:4].upper():<4} {_short(hyps[name][i])}")
        print()


def _split_meta(data: Path, split: str, n_pairs: int) -> tuple[list[str | None], list[bool | None]]:
    """Package and novel flag of each pair of a split, from {split}.jsonl (None where unknown)."""
    meta_path = data / f"{split}.jsonl"
    if not meta_path.exists():
        return [None] * n_pairs, [None] * n_pairs
    rows = [json.loads(line) for line in meta_path.read_text(encoding="utf-8").splitlines()]
    if len(rows) != n_pairs:
        return [None] * n_pairs, [None] * n_pairs
    return [r.get("package") for r in rows], [r.get("novel") for r in rows]


def find_lexicon(args: argparse.Namespace) -> Lexicon | None:
    """The lexicon the non-words are counted with: --lexicon, else the bundle's, else the model
    directory's (None: no non-word count)."""
    candidates = [args.lexicon] if args.lexicon else []
    candidates += [d / LEXICON_FILE for d in (args.bundle, args.model) if d is not None]
    for path in candidates:
        if path.is_file():
            return read_lexicon(path)
    if args.lexicon:
        raise SystemExit(f"{args.lexicon}: no such lexicon (python -m model.lexicon writes one)")
    return None


def translate_model(args: argparse.Namespace, texts: list[str]) -> Translation:
    if args.bundle:
        return translate_onnx(
            args.bundle, args.variant, texts, args.beam, args.length_penalty, args.batch_size, args.device,
            args.threads, args.repetition_penalty, args.no_repeat_ngram_size, text_layer=args.text_layer,
            memory=not args.no_memory, lexical_guard=not args.no_lexical_guard,
            dictionary_terms=not args.no_dictionary_terms,
        )  # fmt: skip
    if args.model is None:
        raise SystemExit("--model (or --bundle) is required")
    return translate_torch(args.model, texts, args.beam, args.length_penalty, args.batch_size, args.device)


def evaluate(args: argparse.Namespace) -> dict:
    pairs = read_split(args.data, args.split)
    packages, novel_flags = _split_meta(args.data, args.split, len(pairs))
    indices = sample_indices(len(pairs), args.n, args.seed)
    sources = [pairs[i][0] for i in indices]
    references = [pairs[i][1] for i in indices]
    novel = [pos for pos, i in enumerate(indices) if novel_flags[i]]
    common = load_common_strings(args.data, args.common) if (args.data / "train.jsonl").exists() else []
    print(
        f"evaluating on {len(indices)} of {len(pairs)} {args.split} pairs (seed {args.seed}; {len(novel)} "
        f"novel) and {len(common)} common UI strings",
        file=sys.stderr,
    )
    inputs = sources + [c.source for c in common]  # one call per system: the timing covers both
    runs: dict[str, Translation] = {"model": translate_model(args, inputs)}
    if args.apertium:
        runs["apertium"] = translate_apertium(inputs, args.apertium_pair, args.apertium_mode)

    systems, signatures = {}, {}
    lexicon = find_lexicon(args)
    # each system's outputs for the sample, then for the common strings
    hyps_of = {name: run.hypotheses[: len(sources)] for name, run in runs.items()}
    for name, run in runs.items():
        hyps, common_hyps = hyps_of[name], run.hypotheses[len(sources) :]
        scores = score_system(sources, references, hyps)
        novel_scores = corpus_scores([hyps[p] for p in novel], [references[p] for p in novel])
        systems[name] = {
            "bleu": round(scores["bleu"], 2),
            "chrf": round(scores["chrf"], 2),
            "bleu_detail": scores["bleu_detail"],
            "novel": {
                "n": len(novel),
                "bleu": round(novel_scores["bleu"], 2),
                "chrf": round(novel_scores["chrf"], 2),
                "bleu_detail": novel_scores["bleu_detail"],
            },
            "placeholders": scores["placeholders"],
            "repeated_word": scores["repeated_word"],
            "common_strings": score_common_strings(common, common_hyps),
            "non_words": non_word_rate(list(zip(sources, hyps, strict=True)), lexicon) if lexicon else None,
            "seconds": round(run.seconds, 2),
            **run.info,
        }
        signatures = {"bleu": scores["bleu_signature"], "chrf": scores["chrf_signature"]}

    groups: dict[str, list[int]] = defaultdict(list)
    for pos, i in enumerate(indices):
        if packages[i] is not None:
            groups[packages[i]].append(pos)
    by_package = {}
    for package, positions in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        row: dict = {"n": len(positions)}
        for name, hyps in hyps_of.items():
            scores = corpus_scores([hyps[p] for p in positions], [references[p] for p in positions])
            row[name] = {"bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2)}
        by_package[package] = row

    reference_placeholders = placeholder_stats(sources, references)
    report = {
        "split": args.split,
        "data": str(args.data),
        "sample": {
            "n": len(indices),
            "requested": args.n,
            "total": len(pairs),
            "seed": args.seed,
            "novel": len(novel),
            "rule": "sorted(random.Random(seed).sample(range(total), n)); n <= 0 or n >= total: all",
            "novel_rule": "the sample's pairs whose normalised source never occurs in train (corpus label)",
            "with_placeholders": reference_placeholders["with_placeholders"],
        },
        "signatures": signatures,
        "placeholder_rule": "share of sources with placeholders (runtime.tokenizer.find_placeholders) whose "
        "placeholders all appear in the output, as a multiset",
        "repeated_word_rule": "outputs with a 3+ letter word repeated more often than in the reference",
        "common_strings": {
            "n": len(common),
            "rule": "sources shipped by the most training packages; accepted = any translation >= 2 "
            "packages give, case and final punctuation ignored (model.common_strings)",
            "items": [
                {"source": c.source, "packages": c.packages, "accepted": list(c.accepted)} for c in common
            ],
        },
        "systems": systems,
        "reference_placeholders": reference_placeholders,
        "non_word_rule": "outputs with a word (2+ letters, no digit, not all capitals) in no dictionary of "
        "the lexicon (runtime.faithful.lexicon), not copied from the source, outside protected spans",
        "reference_non_words": non_word_rate(list(zip(sources, references, strict=True)), lexicon)
        if lexicon
        else None,
        "by_package": by_package,
        "example_positions": pick_examples(sources, args.examples),
        "segments": [
            {
                "index": i,
                "package": packages[i],
                "novel": novel_flags[i],
                "source": sources[pos],
                "reference": references[pos],
                **{name: hyps[pos] for name, hyps in hyps_of.items()},
            }
            for pos, i in enumerate(indices)
        ],
    }
    print_report(report, sources, references, hyps_of)
    return report


def default_length_penalty(model_dir: str | Path | None, bundle_dir: str | Path | None) -> float:
    """The alpha the server would use: the bundle manifest's decoding defaults, else the checkpoint's
    decoding.json, else 0.6."""
    if bundle_dir and (Path(bundle_dir) / "manifest.json").exists():
        decoding = json.loads((Path(bundle_dir) / "manifest.json").read_text()).get("decoding", {})
        if "length_penalty" in decoding:
            return float(decoding["length_penalty"])
    if model_dir and (Path(model_dir) / "decoding.json").exists():
        defaults = json.loads((Path(model_dir) / "decoding.json").read_text()).get("defaults", {})
        return float(defaults.get("length_penalty", 0.6))
    return 0.6


def write_report(path: Path, report: dict) -> None:
    """Write a bench report as indented UTF-8 JSON (parent folders created) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"report: {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="release directory (config.json + model.safetensors)")
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--split", default="test", choices=["train", "valid", "test"])
    parser.add_argument("--n", type=int, default=1000, help="sample size; 0 = the whole split")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="sampling seed")
    parser.add_argument("--beam", type=int, default=4, help="beam size; 1 = greedy")
    parser.add_argument(
        "--length-penalty",
        type=float,
        default=None,
        help="GNMT alpha (default: the model's decoding.json, as the server uses it, else 0.6)",
    )
    parser.add_argument(
        "--repetition-penalty", type=float, default=1.0, help="decoding guard, --bundle only (1.0 = off)"
    )
    parser.add_argument(
        "--no-repeat-ngram-size", type=int, default=0, help="decoding guard, --bundle only (0 = off)"
    )
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0 = library default)")
    parser.add_argument("--bundle", type=Path, help="exported bundle: use the ONNX engine instead of torch")
    parser.add_argument("--variant", default="fp32", help="bundle variant (fp32, int8, ...)")
    parser.add_argument(
        "--text-layer",
        action="store_true",
        help="--bundle only: translate through Engine.translate_texts (the service's text layer: "
        "segmentation, masking, restoring) instead of the raw Engine.translate",
    )
    parser.add_argument(
        "--no-memory",
        action="store_true",
        help="--text-layer: leave the bundle's translation memory out (the model translates every text)",
    )
    parser.add_argument(
        "--no-lexical-guard",
        action="store_true",
        help="--text-layer: turn the lexical guard off (a hypothesis with a word in no dictionary is kept)",
    )
    parser.add_argument(
        "--no-dictionary-terms",
        action="store_true",
        help="--text-layer: leave the bundle's dictionary terms out (the model translates every word)",
    )
    parser.add_argument(
        "--lexicon",
        type=Path,
        help="word list the non-words are counted with (default: the bundle's, else --model's)",
    )
    parser.add_argument("--apertium", action="store_true", help="also translate the sample with Apertium")
    parser.add_argument("--apertium-pair", default=None, help="Apertium mode (default: en-es or eng-spa)")
    parser.add_argument("--apertium-mode", choices=["stream", "per-segment"], default="stream")
    parser.add_argument("--common", type=int, default=200, help="common UI strings to check (0: none)")
    parser.add_argument("--examples", type=int, default=6, help="example translations to print")
    parser.add_argument("--json", type=Path, help="write the full report (scores and outputs) here")
    args = parser.parse_args(argv)
    if args.length_penalty is None:
        args.length_penalty = default_length_penalty(args.model, args.bundle)
    if args.beam < 1:
        parser.error("--beam must be >= 1")
    if (args.repetition_penalty != 1.0 or args.no_repeat_ngram_size != 0) and not args.bundle:
        parser.error("--repetition-penalty / --no-repeat-ngram-size need --bundle (torch search has none)")
    if args.text_layer and not args.bundle:
        parser.error(
            "--text-layer needs --bundle: the text layer is the serving engine's (Engine.translate_texts); "
            "the torch backend translates raw model inputs only"
        )
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    report = evaluate(args)
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    report["command"] = sys.argv if argv is None else ["python", "-m", "bench.evaluate", *argv]
    if args.json:
        write_report(args.json, report)
    print(f"done in {report['total_seconds']} s")


if __name__ == "__main__":
    main()
