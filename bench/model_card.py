"""Write a model's MODEL_CARD.md from what was measured: data counts, training curve, hardware, scores.

    python -m bench.model_card --model models/en-es-small --data data --bundle bundles/en-es-small

One command (`make model-card`) produces every number in the card: it runs `bench.evaluate` on the
test split (PyTorch reference decoder, side by side with Apertium), then the same sample through the
serving engine's fp32 and int8 variants, then the first-five-minutes set of everyday inputs through the
service's text layer (`bench.everyday`), then a held-out package's catalog filled and checked with
`msgfmt -c` (`bench.held_out_catalog`), and renders the card from those reports, `data/manifest.json`
and the model's `training.json` / `decoding.json`. The reports are kept next to the card
(`eval.json`, `eval-fp32.json`, `eval-int8.json`, `eval-service.json`, `eval-everyday.json`,
`eval-catalog.json`).
`--no-evaluate` re-renders from the kept reports.
"""

# ruff: noqa: E501 - the card is prose; its lines are kept whole to read like the Markdown they write
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench import evaluate, everyday, held_out_catalog, unseen_words
from model.languages import Language, corpus_language, manifest_language
from runtime.faithful.dictionary import DICTIONARY_FILE
from runtime.faithful.terms import read_term_list

REPORTS = {
    "torch": "eval.json",
    "fp32": "eval-fp32.json",
    "int8": "eval-int8.json",
    "service": "eval-service.json",  # fp32 through the text layer: what the service returns
    "everyday": "eval-everyday.json",  # the first five minutes (bench.everyday), through the text layer too
    "catalog": "eval-catalog.json",  # a held-out package's catalog as `client po` fills it (msgfmt -c)
}


def run_evaluations(args: argparse.Namespace) -> None:
    common = ["--data", str(args.data), "--split", "test", "--n", str(args.n), "--beam", str(args.beam)]
    lang = corpus_language(args.data)  # model/languages.py has what differs per language
    # Apertium is the peer where Debian has an English pair for the language (Spanish only, here).
    apertium = (
        [] if args.no_apertium or not lang.apertium else ["--apertium", "--apertium-pair", lang.apertium]
    )
    evaluate.main(
        ["--model", str(args.model), *common, *apertium, "--json", str(args.model / REPORTS["torch"])]
    )
    variants = json.loads((args.bundle / "manifest.json").read_text())["variants"]
    for variant in [v for v in ("fp32", "int8") if v in variants]:
        evaluate.main(
            ["--bundle", str(args.bundle), "--variant", variant, *common, "--common", str(args.common),
             "--json", str(args.model / REPORTS[variant])]
        )  # fmt: skip
    evaluate.main(
        ["--bundle", str(args.bundle), "--variant", "fp32", "--text-layer", *common, "--common", str(args.common),
         "--json", str(args.model / REPORTS["service"])]
    )  # fmt: skip
    everyday_set = everyday.set_for(lang.code)
    if everyday_set is not None:
        everyday.main(
            ["--bundle", str(args.bundle), "--variant", "fp32", "--data", str(args.data),
             "--set", str(everyday_set), "--json", str(args.model / REPORTS["everyday"])]
        )  # fmt: skip
    catalog = ["--data", str(args.data), "--bundle", str(args.bundle)]
    held_out_catalog.main([*catalog, "--json", str(args.model / REPORTS["catalog"])])


def _int8_activations(bundle: Path) -> str:
    """How the bundle's int8 variant scales activations (export/int8.py), as its manifest records it."""
    manifest = bundle / "manifest.json"
    scales = json.loads(manifest.read_text()).get("int8_activation_scales", "") if manifest.is_file() else ""
    if scales and not scales.startswith("per row"):
        return "fixed per-channel activation scales measured on valid"
    return "activations quantized per row at run time"


def _shipped_weights(best: dict) -> str:
    """'Best checkpoint: step N', or the steps an averaged release (model.average) is the mean of."""
    if "averaged" in best:
        steps = [p.rsplit("step-", 1)[-1].split(".")[0].lstrip("0") for p in best["averaged"]]
        return f"Shipped weights: the mean of the checkpoints at steps {', '.join(steps)} (`model.average`)"
    return f"Best checkpoint: step {best['step']:,}"


def _recipe(train_config: dict, lang: Language, args: argparse.Namespace) -> list[str]:
    """The `make model` line that makes this model, for a run that ended with the recipe's cooldown."""
    steps, cooldown = train_config.get("max_steps", 0), train_config.get("cooldown", 0)
    if not steps or not cooldown:
        return []
    return [
        f"Recipe: `make model CORPUS_LANG={lang.code} MODEL_STEPS={steps} MODEL_COOLDOWN={cooldown}` "
        f"(README, *The model pipeline*): {steps - cooldown:,} steps, then the learning rate down to 0 over "
        f"{cooldown:,} more; `model.pick` then ships the run's best checkpoint or the mean of its last "
        "snapshots, whichever scores higher on novel valid BLEU (a tie within 0.05 goes to the lower valid loss)."
    ]


def _training_hours(training: dict) -> float:
    """Hours to the shipped weights, the runs a continued model started from included."""
    seconds, run = training["best"]["train_seconds"], training.get("gpu_train") or {}
    while run.get("init_from"):
        seconds += run["init_from"].get("best", {}).get("train_seconds", 0)
        run = run["init_from"].get("gpu_train") or {}
    return seconds / 3600


def _gpu_run(training: dict) -> list[str]:
    """How a `model.gpu_train` run went (docs/gpu.md): budget, throughput, schedule, and the release it
    continued, with that release's own curve."""
    run, config = training["gpu_train"], training["train_config"]
    lines = [
        f"Trained with `model.gpu_train` (docs/gpu.md) from a data pack of {run['pack']['pairs']['train']:,} "
        f"train pairs (the ones many packages ship repeated, as in `model.train`): {run['steps']:,} steps ({run['epochs']} epochs) in {run['train_seconds'] / 60:.1f} min, "
        f"{run['target_tokens'] / 1e6:.1f}M target tokens ({run['target_tokens_per_s']:,}/s), batches of at most "
        f"{config['max_tokens']:,} tokens and {config['max_sentences']} rows{', bf16 autocast' if config.get('bf16') else ''}; "
        f"learning rate {config['lr']:g} after {config['warmup']} warm-up steps, then linearly to 0 over the last "
        f"{config['cooldown_fraction']:.0%} of the time budget (stopped: {run['stop_reason']}).",
    ]  # fmt: skip
    init = run.get("init_from")
    if init:
        best = init.get("best", {})
        lines += [
            "",
            f"It continued the previous release (`{init['path']}`, trained on "
            f"{init.get('hardware', 'an unrecorded machine')}: {_shipped_weights(best).lower()}, valid loss "
            f"{best.get('valid_loss', float('nan')):.3f}, novel valid BLEU {best.get('valid_bleu', float('nan')):.2f}); "
            "the curve below counts steps from the continuation's start. The previous release's curve:",
            "",
            *_curve(init.get("history", [])),
            "",
            "This run's curve:",
        ]  # fmt: skip
    return lines


def _row(name: str, s: dict) -> str:
    ph = s["placeholders"]
    kept = (
        f"{ph['rate']:.1f}% ({ph['preserved']}/{ph['with_placeholders']})"
        if ph["rate"] is not None
        else "n/a"
    )
    common = s["common_strings"]
    return (
        f"| {name} | {s['bleu']:.2f} | {s['chrf']:.2f} | {s['novel']['bleu']:.2f} | {s['novel']['chrf']:.2f} | "
        f"{common['accepted_percent']:.1f}% ({common['accepted']}/{common['n']}) | {common['repeated_word']} | "
        f"{s['repeated_word']['percent']:.1f}% | {kept} | {s['seconds']:.1f} |"
    )


def _rate(r: dict) -> str:
    return f"{r['percent']:.1f}% ({r['count']}/{r['n']})"


def _non_words(reports: dict) -> list[str]:
    """Outputs with a word in no dictionary of the bundle's lexicon, beside the human side's rate, on the
    test sample and on the everyday set (issue 30's measure of invented words)."""
    test = reports.get("service") or reports.get("fp32") or {}
    if test.get("reference_non_words") is None:
        return []
    rows = [
        (label, reports[key]["systems"]["model"].get("non_words"))
        for key, label in (
            ("fp32", "ONNX fp32"),
            ("int8", "ONNX int8"),
            ("service", "ONNX fp32 + text layer"),
        )
        if key in reports
    ]
    apertium = reports.get("torch", {}).get("systems", {}).get("apertium", {}).get("non_words")
    parts = [f"{label} {_rate(r)}" for label, r in rows if r] + (
        [f"Apertium {_rate(apertium)}"] if apertium else []
    )
    out = [
        "",
        "Non-words (outputs holding a word in no dictionary of the bundle's lexicon, Debian's hunspell dictionaries expanded, "
        "and not copied from the source), test sample: "
        + ", ".join(parts)
        + f"; human references {_rate(test['reference_non_words'])}.",
    ]
    everyday_rates = (reports.get("everyday") or {}).get("non_words")
    if everyday_rates:
        out.append(
            f"First five minutes: the service {_rate(everyday_rates['outputs'])}, the first accepted "
            f"translations {_rate(everyday_rates['accepted'])}."
        )
    return out


def _first_five_minutes(report: dict) -> list[str]:
    """The everyday set (bench.everyday): the accepted share per category and overall, the first misses."""
    overall, overlap = report["overall"], report.get("overlap")
    set_name = "bench/data/" + Path(report.get("set", {}).get("path", "everyday.jsonl")).name
    seen = (
        f" {overlap['in_train']} of the {overlap['n']} sources occur verbatim among the training sources."
        if overlap
        else ""
    )
    out = [
        "",
        f"## First five minutes ({overall['n']} everyday inputs, what the service returns)",
        "",
        f"`python -m bench.everyday --set {set_name}`: greetings, politeness, app strings (sign in/up/out, like, share, "
        "follow, unmute, cart), short sentences and short texts of two or three sentences, written by hand (not taken "
        "from any catalog), each with the translations a professional would accept (both registers: tú/usted, "
        "tu/vous, du/Sie, tu/Lei, você/o senhor; and the regional variants). Translated through the text layer with the decoding defaults; accepted "
        "when the output is one of them, case, quotes, whitespace, opening ¡¿ and final punctuation aside (and the "
        f"space French puts before ! ? : ;).{seen}",
        "",
        "| category | items | accepted |",
        "| --- | --- | --- |",
    ]
    for category, share in report["categories"].items():
        out.append(
            f"| {category} | {share['n']} | {share['percent']:.1f}% ({share['accepted']}/{share['n']}) |"
        )
    out.append(
        f"| **all** | {overall['n']} | **{overall['percent']:.1f}%** ({overall['accepted']}/{overall['n']}) |"
    )
    missed = everyday.failures(report)
    if missed:
        # a few of each category, so the app strings and the texts show beside the greetings
        firsts = [row for c in report["categories"] for row in [r for r in missed if r["category"] == c][:3]]
        shown = "; ".join(f"`{row['source']}` → `{row['output']}`" for row in firsts)
        out += ["", f"Not accepted ({len(missed)}), the first of each category: {shown}."]
    return out


def _convergence(history: list[dict], train_config: dict) -> str:
    """The trainer's convergence rule (model.train.converged) applied to the shipped weights' history."""
    from model.train import TrainConfig, converged, loss_windows

    patience = train_config.get("patience", TrainConfig.patience)
    delta = train_config.get("min_delta", TrainConfig.min_delta)
    if not patience:
        return "The trainer's convergence rule was off (`--patience 0`)."
    condition = (
        f"none of the last {patience} validations lowers the best valid loss of the earlier ones by {delta}"
    )
    rule = f"Convergence rule (`model.train.converged`): {condition}."
    windows = loss_windows(history, patience)
    if windows is None:
        own = sum(not _other_depth(r) for r in history)
        return f"{rule} Too few validations to judge ({own})."
    cooldown = train_config.get("cooldown", 0)
    if cooldown and history[-1].get("lr") == 0.0:
        return (
            f"The run ended with a cooldown (`--cooldown {cooldown}`): the learning rate fell linearly to 0 "
            f"over its last {cooldown:,} steps, to step {history[-1]['step']:,}, the usual end of a "
            f"warmup-stable-decay schedule. Before it, the convergence rule ({condition}) was not met: the "
            "inverse-square-root tail alone kept lowering the loss slowly."
        )
    old, new = windows
    recent = history[-patience:]
    state = "met" if converged(history, patience, delta) else "not met yet"
    return (
        f"{rule} At step {history[-1]['step']:,} it is {state}: the last {patience} validations "
        f"(steps {recent[0]['step']:,}-{recent[-1]['step']:,}) took the best loss from {old:.3f} to {new:.3f}."
    )


def _old_split(row: dict) -> bool:
    """Whether a validation row was on an earlier split of the corpus (model.train's labels)."""
    from model.train import OLD_SPLIT_RUNS

    return row.get("run") in OLD_SPLIT_RUNS


def _other_depth(row: dict) -> bool:
    """Whether a validation row is of the model a grown one started from (model.train's label)."""
    from model.train import OTHER_DEPTH_RUN

    return row.get("run") == OTHER_DEPTH_RUN


def _curve(history: list[dict]) -> list[str]:
    lines = [
        "| step | epoch | valid loss | novel valid BLEU (greedy) | novel chrF | all valid BLEU | common UI strings "
        "| hours |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in history:
        if _old_split(r):
            lines.append(
                f"| {r['step']:,} | {r['epoch']} | {r['valid_loss']:.2f} | ({r['valid_bleu']:.1f}: old split) | "
                f"({r['valid_chrf']:.1f}) | | | {r['train_seconds'] / 3600:.2f} |"
            )
            continue
        lines.append(
            f"| {r['step']:,} | {r['epoch']} | {r['valid_loss']:.3f} | {r['valid_bleu']:.2f} | {r['valid_chrf']:.2f} | "
            f"{r.get('valid_bleu_all', float('nan')):.2f} | {r.get('common_accepted_percent', float('nan')):.1f}% "
            f"({r.get('common_repeated_word', '?')} repeated) | {r['train_seconds'] / 3600:.2f} |"
        )
    return lines


def _unseen_words_note(model_dir: Path, report: dict) -> list[str]:
    """For each package where Apertium is ahead: how its pairs with a word no training source holds
    score, against the rest (bench.unseen_words)."""
    words_file = model_dir / "source_words.txt"
    behind = [p for p, r in report["by_package"].items() if r["apertium"]["chrf"] > r["model"]["chrf"]]
    if not behind or not words_file.exists() or not report.get("segments"):
        return []
    segments = [s for s in report["segments"] if s["package"] in behind]
    table = unseen_words.split_by_package(segments, set(read_term_list(words_file)))
    out = [""]
    for package, row in table.items():
        u, s = row["unseen"], row["seen"]
        if not u["pairs"]:
            continue
        out.append(
            f"{package}: {u['pairs']} of {row['pairs']} pairs hold a word no training source contains "
            f"({', '.join(f'`{w}`' for w in row['words'][:6])}, ...): chrF {u['model']} against Apertium's "
            f"{u['apertium']} there, {s['model']} against {s['apertium']} on the other {s['pairs']} "
            "(`python -m bench.unseen_words`)."
        )
    return out


def corpus_command(manifest: dict, code: str, data: Path) -> str:
    """The `model.corpus` command that builds the corpus `manifest` describes, opt-in sources and their
    limits included, so that the card's command reproduces the data."""
    command = f"python -m model.corpus --lang {code} --out {data}"
    if "extra_catalogs" in manifest:
        limits = manifest["extra_catalogs"]["limits"]
        command += (
            f" --extra-catalogs --max-extra-packages {limits['max_packages']} "
            f"--max-extra-bytes {limits['max_bytes']}"
        )
    if "extra_docs" in manifest:
        command += f" --extra-docs --max-docs-bytes {manifest['extra_docs']['limits']['max_bytes']}"
    if "extra_qt" in manifest:
        command += " --extra-qt"
    return command


def _dictionary_terms_lines(path: Path) -> list[str]:
    """The text layer's dictionary terms (runtime/faithful/dictionary.py), as their file's header says."""
    if not path.is_file():
        return []
    header = [line[2:] for line in path.read_text(encoding="utf-8").splitlines()[:3] if line.startswith("# ")]
    command = next((h for h in header if h.startswith("python -m")), "")
    counts = header[-1] if len(header) == 3 else ""
    return [
        f"Dictionary terms of the text layer (`{DICTIONARY_FILE}`, `{command}`): {counts}; the service writes "
        'their translation in place of such a word (docs/service.md, "Dictionary terms").'
    ]


def render(args: argparse.Namespace) -> str:
    reports = {
        k: json.loads((args.model / v).read_text()) for k, v in REPORTS.items() if (args.model / v).exists()
    }
    main = reports["torch"]
    model, apertium = main["systems"]["model"], main["systems"].get("apertium")
    training = json.loads((args.model / "training.json").read_text())
    manifest = json.loads((args.data / "manifest.json").read_text())
    decoding = (
        json.loads((args.model / "decoding.json").read_text())
        if (args.model / "decoding.json").exists()
        else {}
    )
    config = json.loads((args.model / "config.json").read_text())
    best, history = training["best"], training["history"]
    counts, novel = manifest["counts"], manifest.get("novel", {})
    sample = main["sample"]
    lang = manifest_language(manifest)
    out = [
        f"# {args.model.name} — English→{lang.name} Transformer ({training['parameters'] / 1e6:.1f}M parameters)",
        "",
        f"A model of the translation service (English to {lang.name}, `{lang.code}`), for software localisation: "
        "UI strings, messages and help text of free software, trained only on human translations shipped in "
        "Debian packages.",
        "Every number below comes from one command, `make model-card` (`python -m bench.model_card`), "
        "which evaluates the model and renders this file.",
        "",
        f"## Scores (test split: held-out package families, {sample['n']:,} pairs, beam {model['beam']})",
        "",
        f"Sample: `random.Random({sample['seed']}).sample` over the {sample['total']:,} test pairs; **novel** = "
        f"the {sample['novel']} of them whose normalised source never occurs in train (train keeps every pair, "
        "so the commonest strings are in both views). **Common UI strings**: the "
        f"{main['common_strings']['n']} sources shipped by the most training packages, accepted when the output "
        "is a translation at least two packages give (case and final punctuation ignored). "
        "**Repeated word**: a 3+ letter word repeated more often than in the reference.",
        "",
        "| system | BLEU | chrF | novel BLEU | novel chrF | common UI strings accepted | common: repeated word "
        "| test: repeated word | placeholders kept | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        _row(f"**{args.model.name}** (PyTorch reference)", model),
    ]
    for variant in ("fp32", "int8"):
        if variant in reports:
            out.append(_row(f"ONNX engine, {variant}", reports[variant]["systems"]["model"]))
    if "service" in reports:
        out.append(
            _row(
                "**ONNX fp32 + text layer** (what the service returns)",
                reports["service"]["systems"]["model"],
            )
        )
    if apertium:
        out.append(_row(f"Apertium ({apertium.get('version', apertium.get('pair'))})", apertium))
    out += [
        "",
        f"sacrebleu: BLEU `{main['signatures']['bleu']}`, chrF `{main['signatures']['chrf']}`.",
        f"Model BLEU detail: `{model['bleu_detail']}`.",
    ]
    if "int8" in reports and "fp32" in reports:
        delta = reports["int8"]["systems"]["model"]["bleu"] - reports["fp32"]["systems"]["model"]["bleu"]
        out.append(
            f"int8 (integer GEMMs, {_int8_activations(args.bundle)}) vs fp32 engine: {delta:+.2f} BLEU."
        )
    if apertium:
        out += ["", "chrF by test package (model / Apertium):", "", "| package | pairs | model | Apertium |",
                "| --- | --- | --- | --- |"]  # fmt: skip
        for package, row in main["by_package"].items():
            flag = " ◀ Apertium ahead" if row["apertium"]["chrf"] > row["model"]["chrf"] else ""
            out.append(
                f"| {package} | {row['n']} | {row['model']['chrf']:.1f} | {row['apertium']['chrf']:.1f}{flag} |"
            )
        out += _unseen_words_note(args.model, main)
    out += _non_words(reports)
    misses = model["common_strings"]["misses"]
    if misses:
        shown = "; ".join(
            f"`{m['source']}` → `{m['output']}` (accepted: {', '.join(m['accepted'])})" for m in misses[:12]
        )
        out += ["", f"Common UI strings missed ({len(misses)}): {shown}."]
    if "everyday" in reports:
        out += _first_five_minutes(reports["everyday"])
    elif everyday.set_for(lang.code) is None:
        out += [
            "",
            f"First five minutes: no everyday set in {lang.name} yet (`bench/data/everyday-{lang.code}.jsonl`).",
        ]
    if "catalog" in reports:
        out += held_out_catalog.card_lines(reports["catalog"])
    out += [
        "",
        "## Data",
        "",
        f"`{corpus_command(manifest, lang.code, args.data)}`: {manifest['sources']}, from the top {manifest['top_packages']} "
        "packages of `shared/data/debian-l10n-packages.tsv`; the packages ranked past that stay out of training "
        "(unseen material for tests and evaluations).",
        f"{manifest['pairs_after_cleaning']:,} pairs after cleaning, {manifest['pairs_after_dedupe']:,} after "
        f"dedupe within each split. Split by package family: train {counts['train']:,}, valid {counts['valid']:,} "
        f"({novel.get('valid', '?'):,} novel), test {counts['test']:,} ({novel.get('test', '?'):,} novel).",
        f"Test families: {', '.join(manifest['families']['test'])}; valid: {', '.join(manifest['families']['valid'])}.",
        *_dictionary_terms_lines(args.model / DICTIONARY_FILE),
        "",
        "## Model",
        "",
        f"d_model {config['d_model']}, {config['n_heads']} heads, FFN {config['d_ff']}, "
        f"{config['n_encoder_layers']}+{config['n_decoder_layers']} layers, vocabulary {config['vocab_size']:,} "
        "(SentencePiece unigram shared by both languages, one tied embedding matrix), "
        f"{'pre-norm (a final LayerNorm per stack)' if config.get('norm_first') else 'post-norm as in the paper'}, "
        f"max {config['max_positions']} positions. Weights: fp16 safetensors, loaded as fp32.",
        "",
        "## Training",
        "",
        f"Settings: {json.dumps(training['train_config'])}.",
        *_recipe(training["train_config"], lang, args),
        f"Hardware: {training.get('hardware', 'CPU (not recorded)')}, {training.get('threads', '?')} threads, "
        f"device {training.get('device', 'cpu')}. {_shipped_weights(best)} (epoch {best['epoch']}), "
        f"{_training_hours(training):.2f} h of training in all, {training['train_pairs']:,} training pairs.",
        "Validation: loss on 4,000 valid pairs; greedy BLEU/chrF on 400 *novel* valid pairs (the checkpoint "
        "criterion) and on 400 of all valid pairs; the common UI strings' accepted share.",
        *(
            [
                "Rows marked old split (`run: old-split`) were trained and validated on an earlier split of the "
                "corpus (train without held-out sources); their BLEU is on the old valid sample, not comparable."
            ]
            if any(_old_split(row) for row in history)
            else []
        ),
        *(
            [
                f"Steps up to {max(r['step'] for r in history if r.get('run') == 'parent'):,} are the model this "
                "run continued (`--init-from`, `run: parent`), validated on the same split."
            ]
            if any(row.get("run") == "parent" for row in history)
            else []
        ),  # fmt: skip
        *(
            [
                f"Steps up to {max(r['step'] for r in history if _other_depth(r)):,} are the model this one "
                "was grown from, with other layer counts (`model/depth.py`, `run: other-depth`); the "
                "convergence rule leaves them out."
            ]
            if any(_other_depth(row) for row in history)
            else []
        ),  # fmt: skip
        *(
            _gpu_run(training)
            if "gpu_train" in training
            else [_convergence(history, training["train_config"])]
        ),
        "",
        *_curve(history),
        "",
        "## Decoding defaults",
        "",
        f"{json.dumps(decoding.get('defaults', {}))}, chosen on the valid split: "
        f"{json.dumps(decoding.get('tuning', {}).get('bleu_by_alpha', {}))} (BLEU by length penalty alpha).",
        "",
        "## Limitations",
        "",
        "- Domain: software UI and help text; general prose, idioms and long documents are out of domain.",
        "- Segments are limited to the bundle's max_source_tokens (the server says so; split longer text).",
        "- Placeholders are protected in the tokenizer but not masked: the model can still drop or reorder one.",
    ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=Path("models/en-es-small"))
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--bundle", type=Path, default=Path("bundles/en-es-small"))
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--common", type=int, default=200)
    parser.add_argument("--no-apertium", action="store_true", help="leave Apertium out (tests)")
    parser.add_argument("--no-evaluate", action="store_true", help="render from the kept reports")
    args = parser.parse_args(argv)
    if not args.no_evaluate:
        run_evaluations(args)
    card = render(args)
    (args.model / "MODEL_CARD.md").write_text(card, encoding="utf-8")
    print(f"model card: {args.model / 'MODEL_CARD.md'} ({len(card.splitlines())} lines)", file=sys.stderr)


if __name__ == "__main__":
    main()
