"""Held-out faithfulness benchmark: does a translation keep what must not change?

Real EN/ES strings from gettext catalogs the model never trained on (packages ranked past 150 in
``shared/data/debian-l10n-packages.tsv``; training uses the top 150), picked by category, plus hand-written
adversarial cases without a reference:

    python -m bench.faithful build [--every 7] [--extra meld make psmisc man-db] [--cap 80]
    python -m bench.faithful run --bundle bundles/en-es-small [--json out.json]   # raw engine, in-process
    python -m bench.faithful run --bundle bundles/en-es-small --text-layer        # engine + text layer
    python -m bench.faithful run --bundle bundles/en-es-small --compare           # both, before -> after
    python -m bench.faithful run --target localhost:50051 [--json out.json]       # a running server (gRPC)

``build``: every Nth package ranked 151+ whose package family (``model.corpus.package_family``) is not
one of the top 150's (``gnome-*``, ``wesnoth-*``, ``mate-*``... share vocabulary with training), plus
``--extra`` packages for rare categories (braces: meld; tabs: make, psmisc; shell variables: man-db),
downloaded with ``model.corpus.download_packages`` into ``data/cache/debs-heldout/``; pairs read with the
corpus' own catalog reader and cleaning (``clean_pair``; sources up to 400 characters, tabs inside a
message kept verbatim, which ``clean_pair`` would collapse, and a bug-report address the source itself
carries not taken for a translator credit). Sources are deduplicated and labelled with categories
(``CATEGORIES``); a balanced set is drawn (seeded, rarest category first, round-robin over packages, at
most ``--cap`` items per category) and written one JSON object a line: source, target, package, rank,
kinds, seen_in_train (the normalised source occurs in ``data/train.en``; ``null`` when unknown). The
hand-written cases follow with ``package: "handwritten"`` and ``target: null``.

``run`` translates every source (model defaults: the bundle manifest's or the server's) and reports, per
category and overall:
  * protected spans: placeholders (``runtime.tokenizer.PLACEHOLDER_PATTERN``, the pattern of
    ``find_placeholders``), URLs, e-mails, numbers and versions (``1,000`` and ``1.000`` count as the
    same number), file paths, command-line options, product names (CamelCase words and ``KNOWN_NAMES``),
    emoji, runs of non-Latin script and tab characters, found by ``protected_spans``. A text passes when
    each of its spans occurs in the output exactly as many times as in the source (missing and extra
    copies both fail); also the share of spans kept (``min(source, output)`` counts). The same check on
    the human references is printed alongside, as a ceiling: translators do reformat some numbers;
  * markup: among sources whose tags are balanced and nested, the share of outputs whose tags are too;
  * multi-sentence sources (``sentencex``): the share of outputs with fewer sentences than the source and
    the share shorter than 0.6 x the reference (characters): dropped sentences;
  * BLEU and chrF (sacrebleu defaults) against the references, where there is one;
  * the hand-written cases, source -> output, for a human to read.
``--json OUT`` writes all figures and per-item outputs. With ``--bundle``, translation is
``bench.evaluate.translate_onnx`` (the raw ``Engine.translate``: no text layer): a text over the model's
``max_source_tokens`` is not translated and counts as an empty output (``error: skipped_too_long`` per
item); ``--text-layer`` goes through ``Engine.translate_texts`` instead, as the service does. With
``--target``, a batch the server refuses is retried text by text and a refused text counts as an empty
output (``error`` per item). ``--threads`` defaults to 1: the machine is shared with training.

``--compare`` (``--bundle``): the raw engine, then the text layer, on the same items, both through
``bench.evaluate.translate_onnx`` (same settings and length-sorted batches; ``--text-layer`` alone batches
in set order): both tables, then per group before -> after and each pass's wall time with the text
layer's throughput cost (end to end: it also dedupes and splits). JSON: ``raw``, ``text_layer``, ``delta``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

from bench.faithful_check import HANDWRITTEN, SHORT_RATIO, aggregate, groups_of, score_item, sentence_splitter
from bench.faithful_set import DEFAULT_SET, add_build_arguments

# --compare: the figures shown before -> after (report["groups"][name] keys) and their headings
COMPARED = (
    ("spans_all_kept", "spans ok %"), ("tags_ok", "tags ok %"), ("fewer_sentences", "fewer %"),
    ("short_vs_reference", "short %"), ("bleu", "BLEU"), ("chrf", "chrF"),
)  # fmt: skip

# --------------------------------------------------------------------------------------------
# Running


def load_items(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def bundle_decoding(args: argparse.Namespace) -> tuple[dict, int, float]:
    """(manifest, beam, length penalty) for --bundle: --beam / --length-penalty, else the model's."""
    from bench.evaluate import default_length_penalty
    from runtime.bundle import load_manifest

    manifest = load_manifest(args.bundle, args.variant)
    beam = args.beam or int(manifest["decoding"].get("beam_size", 4))
    alpha = (
        args.length_penalty if args.length_penalty is not None else default_length_penalty(None, args.bundle)
    )
    return manifest, beam, alpha


def translate_bundle(args: argparse.Namespace, texts: list[str]) -> tuple[list[str], list[str | None], dict]:
    """bench.evaluate's ONNX path; texts over max_source_tokens come back empty, marked here."""
    from bench.evaluate import translate_onnx
    from runtime.tokenizer import Tokenizer

    manifest, beam, alpha = bundle_decoding(args)
    tokenizer = Tokenizer(args.bundle / manifest["tokenizer"])
    limit = int(manifest["max_source_tokens"])
    errors = [
        "skipped_too_long" if len(tokenizer.encode(t.strip())) > limit else None for t in texts
    ]  # as translate_onnx decides (Engine.count_tokens)
    if args.text_layer:
        return translate_text_layer(args, texts, beam, alpha)
    result = translate_onnx(
        args.bundle, args.variant, texts, beam, alpha, args.batch_size, args.device, args.threads
    )
    return result.hypotheses, errors, result.info | {"seconds": round(result.seconds, 2)}


def translate_text_layer(
    args: argparse.Namespace, texts: list[str], beam: int, alpha: float
) -> tuple[list[str], list[str | None], dict]:
    """In-process, through the engine's text layer (``Engine.translate_texts``: segmentation, masking...)
    rather than bench.evaluate's raw ``Engine.translate``: what the service does, without a server."""
    from server.engine import DecodingOptions, Engine

    engine = Engine(args.bundle, variant=args.variant, device=args.device, intra_op_threads=args.threads)
    if not hasattr(engine, "translate_texts"):
        raise SystemExit("--text-layer: this server.engine.Engine has no translate_texts (no text layer)")
    engine.warmup()
    options = DecodingOptions(beam_size=beam, num_hypotheses=1, max_length=0, length_penalty=alpha)
    outputs: list[str] = []
    errors: list[str | None] = []
    started = time.perf_counter()
    with tqdm(
        total=len(texts), desc=f"text layer (onnx {args.variant}, beam {beam})", file=sys.stderr
    ) as bar:
        for at in range(0, len(texts), args.batch_size):
            batch = texts[at : at + args.batch_size]
            try:
                results = [engine.translate_texts(batch, options)]
            except ValueError:  # InputTooLongError and invalid options are ValueErrors: one by one
                results = []
                for text in batch:
                    try:
                        results.append(engine.translate_texts([text], options))
                    except ValueError as e:
                        results.append([[]])
                        errors.append(f"{type(e).__name__}: {e}")
                        continue
                    errors.append(None)
            else:
                errors += [None] * len(batch)
            outputs += [nbest[0].text if nbest else "" for result in results for nbest in result]
            bar.update(len(batch))
    info = {
        "backend": "onnx+text_layer",
        "bundle": str(args.bundle),
        "variant": args.variant,
        "name": engine.name,
        "version": engine.version,
        "beam": beam,
        "length_penalty": alpha,
        "seconds": round(time.perf_counter() - started, 2),
    }
    return outputs, errors, info


def translate_passes(args: argparse.Namespace, texts: list[str]) -> dict[str, tuple]:
    """--compare: {"raw": ..., "text_layer": ...}, each (outputs, errors, system) as translate_bundle's, both
    through bench.evaluate.translate_onnx (same settings, same length-sorted batches), raw first."""
    from bench.evaluate import translate_onnx

    _, beam, alpha = bundle_decoding(args)
    passes = {}
    for key, text_layer in (("raw", False), ("text_layer", True)):
        result = translate_onnx(
            args.bundle, args.variant, texts, beam, alpha, args.batch_size, args.device, args.threads,
            text_layer=text_layer,
        )  # fmt: skip
        skipped = set(result.skipped)
        errors = ["skipped_too_long" if i in skipped else None for i in range(len(texts))]
        passes[key] = (result.hypotheses, errors, result.info | {"seconds": round(result.seconds, 2)})
    return passes


def translate_server(args: argparse.Namespace, texts: list[str]) -> tuple[list[str], list[str | None], dict]:
    """The service over gRPC (client.TranslatorClient), model defaults unless --beam/--length-penalty."""
    from client import TranslatorClient, TranslatorError

    options = {"beam_size": args.beam, "length_penalty": args.length_penalty}
    outputs: list[str] = []
    errors: list[str | None] = []
    started = time.perf_counter()
    with TranslatorClient(args.target, timeout=args.timeout, token=args.token) as client:
        client.wait_until_serving(timeout=args.timeout)
        info = client.model_info()
        batches = client.batches(texts, args.batch_size, **options)
        with tqdm(total=len(texts), desc="translating (gRPC)", unit="text", file=sys.stderr) as bar:
            for batch in batches:
                try:
                    outputs += [t.text for t in client.translate(batch, **options)]
                    errors += [None] * len(batch)
                except TranslatorError:
                    for text in batch:  # find the text the server refuses; the others still count
                        try:
                            outputs.append(client.translate([text], **options)[0].text)
                            errors.append(None)
                        except TranslatorError as e:
                            outputs.append("")
                            errors.append(f"{e.code.name}: {e.details}")
                bar.update(len(batch))
    meta = {
        "backend": "grpc",
        "target": args.target,
        "name": info.name if hasattr(info, "name") else None,
        "version": info.version if hasattr(info, "version") else None,
        "seconds": round(time.perf_counter() - started, 2),
    }
    return outputs, errors, meta


def _cell(value: float | None, n: int | None = None, width: int = 7) -> str:
    if value is None:
        return f"{'-':>{width}}"
    text = f"{value:.1f}" if n is None else f"{value:.1f} ({n})"
    return f"{text:>{width}}"


def print_summary(report: dict, title: str | None = None, legend: bool = True) -> None:
    if legend:
        print(
            "\nspans ok: every protected span occurs in the output as often as in the source (reference: "
            "the same check on the human translation); tags ok: well-formed output tags when the source's "
            "are; fewer: multi-sentence outputs with fewer sentences than the source; short: output < 0.6 x "
            "reference chars\n"
        )
    if title:
        print(f"\n{title}")
    header = (
        f"{'group':<16} {'n':>4}  {'spans ok %':>12} {'kept %':>7} {'ref ok %':>8}  {'tags ok %':>11}  "
        f"{'fewer %':>10} {'short %':>10}  {'BLEU':>6} {'chrF':>6}"
    )
    print(header)
    print("-" * len(header))
    for name, f in report["groups"].items():
        if not f["n"]:
            continue
        if name == "catalog":
            print("-" * len(header))
        print(
            f"{name:<16} {f['n']:>4}  {_cell(f['spans_all_kept'], f['with_spans'], 12)} "
            f"{_cell(f['spans_kept'])} {_cell(f['reference_spans_all_kept'], None, 8)}  "
            f"{_cell(f['tags_ok'], f['with_tags'], 11)}  "
            f"{_cell(f['fewer_sentences'], f['multi_sentence'], 10)} "
            f"{_cell(f['short_vs_reference'], f['multi_with_reference'], 10)}  "
            f"{_cell(f['bleu'], None, 6)} {_cell(f['chrf'], None, 6)}"
        )
    print(f"\nBLEU: {report['signatures']['bleu']}\nchrF: {report['signatures']['chrf']}")
    print(f"sentences: {report['sentence_splitter']}; system: {json.dumps(report['system'], default=str)}")


def _show(text: str, width: int = 240) -> str:
    text = text.replace("\n", "\u23ce").replace("\t", "\u21e5")
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def _flags(seg: dict) -> str:
    flags = []
    if seg["spans"]["missing"]:
        flags.append(f"missing {seg['spans']['missing']}")
    if seg["spans"]["extra"]:
        flags.append(f"extra {seg['spans']['extra']}")
    if seg["tags_ok"] is False:
        flags.append("tags broken")
    if seg["sentences"] and seg["sentences"]["fewer"]:
        flags.append(f"sentences {seg['sentences']['source']} -> {seg['sentences']['output']}")
    if seg.get("error"):
        flags.append(seg["error"])
    return f"   [{'; '.join(flags)}]" if flags else ""


def print_handwritten(report: dict) -> None:
    print("\nhand-written cases (source -> output; spans: missing / extra copies):")
    for seg in report["items"]:
        if seg["package"] == HANDWRITTEN:
            print(f"  {_show(seg['source'])}\n    -> {_show(seg['output'])}{_flags(seg)}")


def measure(
    args: argparse.Namespace, items: list[dict], outputs: list[str], errors: list, system: dict
) -> dict:
    """The report of one system's outputs: figures per group and per item."""
    rows = [score_item(item, output) for item, output in zip(items, outputs, strict=True)]
    groups = {
        name: aggregate([items[p] for p in pos], [outputs[p] for p in pos], [rows[p] for p in pos])
        for name, pos in groups_of(items).items()
    }
    return {
        "set": str(args.set),
        "system": system,
        "sentence_splitter": sentence_splitter(),
        "signatures": groups["overall"].get("signatures", {"bleu": None, "chrf": None}),
        "rules": {
            "spans": "protected_spans(source) keys (numbers: ',' == '.') occur in the output as often",
            "tags": "sources whose markup tags are balanced and nested: the output's are too",
            "sentences": f"sentencex (en source, es output); short: output chars < {SHORT_RATIO} x reference",
        },
        "groups": groups,
        "errors": sum(e is not None for e in errors),
        "items": [
            {
                "index": i,
                "package": item["package"],
                "kinds": item["kinds"],
                "source": item["source"],
                "reference": item.get("target"),
                "output": output,
                **({"error": error} if error else {}),
                **row,
            }
            for i, (item, output, error, row) in enumerate(zip(items, outputs, errors, rows, strict=True))
        ],
    }


def _print_errors(report: dict, what: str = "") -> None:
    if report["errors"]:
        print(f"{report['errors']} texts not translated{what} (too long / refused): counted as empty outputs")


def _load(args: argparse.Namespace) -> list[dict]:
    items = load_items(args.set)
    if args.limit:
        items = items[: args.limit]
    print(f"{len(items)} texts from {args.set}", file=sys.stderr)
    return items


def run(args: argparse.Namespace) -> dict:
    items = _load(args)
    texts = [item["source"] for item in items]
    started = time.perf_counter()
    if args.bundle:
        outputs, errors, system = translate_bundle(args, texts)
    else:
        outputs, errors, system = translate_server(args, texts)
    report = measure(args, items, outputs, errors, system)
    report["seconds"] = round(time.perf_counter() - started, 1)
    print_handwritten(report)
    print_summary(report)
    _print_errors(report)
    return report


# --------------------------------------------------------------------------------------------
# --compare: raw engine -> text layer


def compare_figures(raw: dict, text_layer: dict) -> dict:
    """The "delta" section: per group (with items) before / after / change of each COMPARED figure, and
    the wall time of each pass with the text layer's throughput cost."""
    groups = {}
    for name, before in raw["groups"].items():
        if not before["n"]:
            continue
        after = text_layer["groups"][name]
        groups[name] = {
            key: {
                "before": before[key],
                "after": after[key],
                "change": None if None in (before[key], after[key]) else round(after[key] - before[key], 2),
            }
            for key, _ in COMPARED
        }
    t_raw, t_layer = raw["system"]["seconds"], text_layer["system"]["seconds"]
    return {
        "groups": groups,
        "seconds": {
            "raw": t_raw,
            "text_layer": t_layer,
            "throughput_cost_percent": round(100.0 * (t_layer / t_raw - 1), 1) if t_raw else None,
            "rule": "time_after / time_before - 1, translation wall time of each pass (engine loaded and "
            "warmed up): end to end, the text layer also segments, masks, dedupes and restores",
        },
    }


def _arrow(before: float | None, after: float | None) -> str:
    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    if before is None and after is None:
        return f"{'-':^13}"
    return f"{fmt(before):>5} \u2192 {fmt(after):<5}"


def print_compare(delta: dict) -> None:
    print("\nraw engine \u2192 text layer, same items (n per figure as in the tables above):")
    header = f"{'group':<16} " + " ".join(f"{title:^13}" for _, title in COMPARED)
    print(header.rstrip())
    print("-" * len(header))
    for name, figures in delta["groups"].items():
        if name == "catalog":
            print("-" * len(header))
        cells = " ".join(_arrow(figures[key]["before"], figures[key]["after"]) for key, _ in COMPARED)
        print(f"{name:<16} {cells}".rstrip())
    t = delta["seconds"]
    cost = "-" if t["throughput_cost_percent"] is None else f"{t['throughput_cost_percent']:+.1f}%"
    print(
        f"\nwall time: raw {t['raw']:.1f} s \u2192 text layer {t['text_layer']:.1f} s; text layer throughput "
        f"cost {cost} (time_after / time_before - 1; end to end: the text layer also dedupes and splits)"
    )


def print_handwritten_compare(raw: dict, text_layer: dict) -> None:
    print(
        "\nhand-written cases (source; raw -> output; text layer -> output; spans: missing / extra copies):"
    )
    for before, after in zip(raw["items"], text_layer["items"], strict=True):
        if before["package"] == HANDWRITTEN:
            print(
                f"  {_show(before['source'])}\n    raw  -> {_show(before['output'])}{_flags(before)}"
                f"\n    text -> {_show(after['output'])}{_flags(after)}"
            )


def run_compare(args: argparse.Namespace) -> dict:
    items = _load(args)
    started = time.perf_counter()
    passes = translate_passes(args, [item["source"] for item in items])
    raw, text_layer = (measure(args, items, *passes[key]) for key in ("raw", "text_layer"))
    delta = compare_figures(raw, text_layer)
    print_handwritten_compare(raw, text_layer)
    print_summary(raw, "raw engine (Engine.translate):")
    print_summary(text_layer, "text layer (Engine.translate_texts):", legend=False)
    _print_errors(raw, " by the raw engine")
    _print_errors(text_layer, " by the text layer")
    print_compare(delta)
    seconds = round(time.perf_counter() - started, 1)
    return {"set": str(args.set), "raw": raw, "text_layer": text_layer, "delta": delta, "seconds": seconds}


# --------------------------------------------------------------------------------------------
# CLI


def main(argv: list[str] | None = None) -> None:
    from bench.evaluate import write_report

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_build_arguments(
        sub.add_parser("build", help="download held-out packages and write the benchmark set")
    )
    r = sub.add_parser("run", help="translate the set and measure faithfulness")
    where = r.add_mutually_exclusive_group(required=True)
    where.add_argument("--target", help="HOST:PORT of a running Translator service (gRPC)")
    where.add_argument("--bundle", type=Path, help="exported bundle: server.engine.Engine in-process")
    r.add_argument(
        "--text-layer",
        action="store_true",
        help="--bundle through Engine.translate_texts (the text layer) instead of the raw Engine.translate",
    )
    r.add_argument(
        "--compare",
        action="store_true",
        help="--bundle: measure the raw engine and the text layer on the same items, then before -> after",
    )
    r.add_argument("--set", type=Path, default=DEFAULT_SET)
    r.add_argument("--variant", default="fp32", help="bundle variant (fp32, int8)")
    r.add_argument("--beam", type=int, default=0, help="beam size (0: the model's default)")
    r.add_argument("--length-penalty", type=float, default=None, help="(default: the model's)")
    r.add_argument("--batch-size", type=int, default=16)
    r.add_argument("--device", default="auto")
    r.add_argument("--threads", type=int, default=1, help="engine CPU threads (--bundle; 0: library default)")
    r.add_argument("--timeout", type=float, default=120.0, help="per-call timeout, seconds (--target)")
    r.add_argument("--token", default=None, help="bearer token (--target)")
    r.add_argument("--limit", type=int, default=0, help="only the first N items (0: all)")
    r.add_argument("--json", type=Path, help="write all figures and per-item outputs here")
    args = parser.parse_args(argv)
    if args.command == "build":
        from bench.faithful_set import build

        build(args)
        return
    if args.compare and not args.bundle:
        r.error("--compare needs --bundle (both passes run the engine in-process)")
    if args.compare and args.text_layer:
        r.error("--compare already runs the text layer (after the raw engine); drop --text-layer")
    report = run_compare(args) if args.compare else run(args)
    report["command"] = sys.argv if argv is None else ["python", "-m", "bench.faithful", *argv]
    if args.json:
        write_report(args.json, report)
    print(f"done in {report['seconds']} s")


if __name__ == "__main__":
    main()
