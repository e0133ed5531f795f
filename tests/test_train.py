"""Training loop pieces: batching, the learning-rate schedule, and a stopped run resuming exactly."""

import contextlib
import io
import json
import random
import shutil
import time
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from export.__main__ import main as export_main
from model.corpus import Pair, write_splits
from model.train import converged, learning_rate, load_release, main, make_batches

pytestmark = pytest.mark.usefixtures("torch_single_thread")
TOKENIZER = Path(__file__).resolve().parent.parent / "models" / "en-es-small" / "tokenizer.model"


def test_batches_cover_every_example_once_within_both_caps():
    rng = random.Random(0)
    lengths = [(rng.randint(1, 3), rng.randint(1, 4)) for _ in range(500)] + [(40, 50)] * 20
    batches = make_batches(lengths, max_tokens=300, rng=random.Random(1), max_sentences=16)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) <= 16 for b in batches)
    assert all(max(max(lengths[i]) for i in b) * len(b) <= 300 for b in batches)
    # without the row cap the short examples crowd into a few batches (what the cap is for)
    uncapped = make_batches(lengths, max_tokens=300, rng=random.Random(1))
    assert max(len(b) for b in uncapped) > 16 and len(uncapped) < len(batches)


def test_learning_rate_warms_up_decays_and_rewarms_a_continued_run():
    assert learning_rate(500, 1e-3, 1000) == pytest.approx(5e-4)
    assert learning_rate(1000, 1e-3, 1000) == pytest.approx(1e-3)
    assert learning_rate(4000, 1e-3, 1000) == pytest.approx(5e-4)
    # continued from step 4000: ramps back to the schedule over 100 steps, then follows it
    assert learning_rate(4001, 1e-3, 1000, start_step=4000, rewarm=100) == pytest.approx(
        learning_rate(4001, 1e-3, 1000) / 100
    )
    assert learning_rate(4200, 1e-3, 1000, start_step=4000, rewarm=100) == learning_rate(4200, 1e-3, 1000)
    # a cooldown from step 9000: linear from the schedule's rate there to 0 over 1000 steps
    at_9000 = learning_rate(9000, 1e-3, 1000)
    assert learning_rate(9000, 1e-3, 1000, cooldown_start=9000, cooldown=1000) == at_9000
    assert learning_rate(9250, 1e-3, 1000, cooldown_start=9000, cooldown=1000) == pytest.approx(
        0.75 * at_9000
    )
    assert learning_rate(10000, 1e-3, 1000, cooldown_start=9000, cooldown=1000) == 0.0
    assert learning_rate(12000, 1e-3, 1000, cooldown_start=9000, cooldown=1000) == 0.0
    # a fine-tune whose cooldown starts with it: re-warmed, then linear from the release's rate to 0
    fine_tune = {"start_step": 9000, "rewarm": 100, "cooldown_start": 9000, "cooldown": 1000}
    assert learning_rate(9001, 1e-3, 1000, **fine_tune) == pytest.approx(at_9000 * 0.999 / 100)
    assert learning_rate(9100, 1e-3, 1000, **fine_tune) == pytest.approx(0.9 * at_9000)
    assert learning_rate(9500, 1e-3, 1000, **fine_tune) == pytest.approx(0.5 * at_9000)
    assert learning_rate(10000, 1e-3, 1000, **fine_tune) == 0.0


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("train-data")
    words = ["Open", "Save", "Close", "Print", "Delete", "Copy", "Paste", "Quit"]
    spanish = ["Abrir", "Guardar", "Cerrar", "Imprimir", "Eliminar", "Copiar", "Pegar", "Salir"]
    train = [
        Pair(f"{w} the file", f"{s} el archivo", "a", "1", "x.mo", ("a", "b"))
        for w, s in zip(words, spanish, strict=True)
    ]
    train += [Pair(w, s, "a", "1", "x.mo", ("a", "b")) for w, s in zip(words, spanish, strict=True)]
    valid = [
        Pair(f"{w} all files", f"{s} todos los archivos", "v", "1", "x.mo", novel=True)
        for w, s in zip(words, spanish, strict=True)
    ]
    write_splits(out, {"train": train, "valid": valid})
    return out


@pytest.fixture
def tiny_model(monkeypatch):
    """The trainer's "small" config shrunk to a 16-dim, one-layer model: seconds per run."""
    import model.train as train_module

    monkeypatch.setattr(
        train_module.TransformerConfig, "small", classmethod(
            lambda cls, v: cls(vocab_size=v, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
                               n_decoder_layers=1, max_positions=64)
        ),
    )  # fmt: skip


def _run(data: Path, run: Path, *extra: str) -> None:
    main(
        ["--data", str(data), "--tokenizer", str(TOKENIZER), "--run-dir", str(run),
         "--release-dir", str(run / "rel"), "--config", "small", "--max-tokens", "40", "--max-sentences", "4",
         "--valid-every", "1000",
         "--valid-bleu-sentences", "2", "--warmup", "2", "--threads", "1", *extra]
    )  # fmt: skip


def test_a_stopped_run_resumes_exactly(tiny_data, tiny_model, tmp_path):
    """Three steps, stop, resume to six == six steps in one go: same batches, same dropout, same weights."""
    _run(tiny_data, tmp_path / "once", "--max-steps", "6")
    _run(tiny_data, tmp_path / "twice", "--max-steps", "3")
    _run(tiny_data, tmp_path / "twice", "--max-steps", "6", "--resume")
    once = torch.load(tmp_path / "once" / "last.pt", weights_only=False)
    twice = torch.load(tmp_path / "twice" / "last.pt", weights_only=False)
    assert once["step"] == twice["step"] == 6
    for name, tensor in once["model"].items():
        assert torch.equal(tensor, twice["model"][name]), name
    history = twice["history"]
    assert [r["step"] for r in history] == [3, 6]
    assert {"valid_bleu", "valid_bleu_all", "common_accepted_percent", "common_repeated_word"} <= set(
        history[-1]
    )
    assert set(load_file(str(tmp_path / "twice" / "rel" / "model.safetensors")))  # a release was written
    # the last validated checkpoint can be released whatever the criterion said
    main(["--tokenizer", str(TOKENIZER), "--run-dir", str(tmp_path / "twice"), "--release-dir",
          str(tmp_path / "last"), "--release-last"])  # fmt: skip
    released = load_file(str(tmp_path / "last" / "model.safetensors"))
    for name, tensor in twice["model"].items():
        assert torch.equal(released[name], tensor.half()), name
    info = json.loads((tmp_path / "last" / "training.json").read_text())
    assert info["best"]["step"] == 6 and info["hardware"]
    assert info["target_language"] == "es"  # a corpus without a manifest is Spanish


def test_a_bf16_run_trains_in_bf16_and_resumes_exactly(tiny_data, tiny_model, tmp_path, capsys):
    """--bf16: the training steps under bf16 autocast (weights stay fp32), recorded in the run's
    settings; a stopped bf16 run resumes to the same weights as one in one go, and differs from fp32."""
    _run(tiny_data, tmp_path / "once", "--max-steps", "4", "--bf16")
    assert "bf16 autocast" in capsys.readouterr().err
    _run(tiny_data, tmp_path / "twice", "--max-steps", "2", "--bf16")
    _run(tiny_data, tmp_path / "twice", "--max-steps", "4", "--bf16", "--resume")
    _run(tiny_data, tmp_path / "fp32", "--max-steps", "4")
    once, twice, fp32 = (
        torch.load(tmp_path / run / "last.pt", weights_only=False) for run in ("once", "twice", "fp32")
    )
    assert once["train_config"]["bf16"] and not fp32["train_config"]["bf16"]
    assert all(t.dtype == torch.float32 for t in once["model"].values())
    for name, tensor in once["model"].items():
        assert torch.equal(tensor, twice["model"][name]), name
    assert any(not torch.equal(t, fp32["model"][n]) for n, t in once["model"].items())


@pytest.mark.parametrize("native", [False, True])
def test_bf16_native_trains_in_bf16_only_on_a_cpu_that_computes_it(
    tiny_data, tiny_model, tmp_path, capsys, monkeypatch, native
):
    """--bf16-native (make grow's default): bf16 autocast where the CPU has AVX512-BF16 or AMX, fp32 where
    bf16 would be emulated; the run records which."""
    import model.train as train_module

    monkeypatch.setattr(train_module, "cpu_has_bf16", lambda: native)
    _run(tiny_data, tmp_path / "run", "--max-steps", "1", "--bf16-native", "--device", "cpu")
    err = capsys.readouterr().err
    assert ("--bf16-native: bf16" in err) == native and ("bf16 autocast" in err) == native
    saved = torch.load(tmp_path / "run" / "last.pt", weights_only=False)["train_config"]
    assert saved["bf16"] is native and saved["bf16_native"]


def test_a_pre_norm_run_keeps_its_model_through_resume_init_from_and_average(
    tiny_data, tiny_model, tmp_path, capsys
):
    """--norm-first trains a pre-norm model; --resume and --init-from keep the model's own architecture
    without the flag (its config wins); model.average makes a pre-norm release of pre-norm checkpoints."""
    from model.average import main as average_main

    _run(tiny_data, tmp_path / "once", "--max-steps", "4", "--norm-first")
    _run(tiny_data, tmp_path / "twice", "--max-steps", "2", "--norm-first")
    _run(tiny_data, tmp_path / "twice", "--max-steps", "4", "--resume")  # no flag: last.pt's model
    once, twice = (torch.load(tmp_path / run / "last.pt", weights_only=False) for run in ("once", "twice"))
    assert once["model_config"]["norm_first"] and twice["train_config"]["norm_first"]
    assert "encoder_ln.weight" in once["model"] and "decoder_ln.bias" in once["model"]
    for name, tensor in once["model"].items():
        assert torch.equal(tensor, twice["model"][name]), name
    release = tmp_path / "once" / "rel"
    assert json.loads((release / "config.json").read_text())["norm_first"] is True
    assert load_release(release).config.norm_first
    _run(tiny_data, tmp_path / "more", "--init-from", str(release), "--max-steps", "6")  # no flag
    more = torch.load(tmp_path / "more" / "last.pt", weights_only=False)
    assert more["step"] == 6 and more["model_config"]["norm_first"] and more["train_config"]["norm_first"]
    assert "pre-norm" in capsys.readouterr().err
    # the release's validations come along labelled as the parent's; this run's own rows are not
    parent = json.loads((release / "training.json").read_text())["history"]
    labels = [(r["step"], r.get("run")) for r in more["history"]]
    assert labels[: len(parent)] == [(r["step"], "parent") for r in parent] and labels[-1] == (6, None)
    out = tmp_path / "avg"
    checkpoints = [str(tmp_path / run / "last.pt") for run in ("once", "more")]
    argv = ["--checkpoints", *checkpoints, "--tokenizer", str(TOKENIZER), "--data", str(tiny_data)]
    assert average_main([*argv, "--valid-bleu-sentences", "2", "--out", str(out)]) == 0
    averaged = load_release(out)
    assert averaged.config.norm_first
    state = load_file(str(out / "model.safetensors"))
    assert set(state) == set(averaged.state_dict())
    mean = (once["model"]["encoder_ln.weight"] + more["model"]["encoder_ln.weight"]) / 2
    assert torch.equal(state["encoder_ln.weight"], mean.half())


def test_a_finished_stage_run_again_trains_nothing(tiny_data, tmp_path):
    """make model reruns its stages after an interruption: a stage already at its --max-steps, or a
    cooldown already over, must not take one more step."""
    run = tmp_path / "run"
    _run(tiny_data, run, "--max-steps", "3")
    _run(tiny_data, run, "--max-steps", "5", "--resume", "--cooldown", "2")
    done = torch.load(run / "last.pt", weights_only=False)
    assert done["step"] == 5 and done["cooldown_start"] == 3
    for extra in (("--max-steps", "3"), ("--max-steps", "5", "--cooldown", "2")):
        _run(tiny_data, run, "--resume", *extra)
        again = torch.load(run / "last.pt", weights_only=False)
        assert again["step"] == 5
        for name, tensor in done["model"].items():
            assert torch.equal(tensor, again["model"][name]), name


def test_a_run_stopped_by_a_signal_exits_as_the_signal_would(tiny_data, tmp_path):
    """make model runs its stages one after the other: a stage stopped by SIGTERM must not look done."""
    import signal
    import subprocess
    import sys

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "model.train", "--data", str(tiny_data), "--tokenizer", str(TOKENIZER),
           "--run-dir", str(run), "--release-dir", str(run / "rel"), "--config", "small",
           "--max-tokens", "40", "--max-sentences", "4", "--valid-every", "100000", "--save-every", "1",
           "--warmup", "2", "--threads", "1", "--max-steps", "100000"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[1], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run / "last.pt").is_file() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)  # a step is checkpointed: training is under way
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped by signal 15" in err and "resume with --resume" in err


def test_a_release_records_its_corpus_target_language_for_the_export(tiny_data, tmp_path):
    french = tmp_path / "data-fr"
    shutil.copytree(tiny_data, french)
    for path in french.glob("*.es"):
        path.rename(path.with_suffix(".fr"))
    (french / "manifest.json").write_text(json.dumps({"language": {"code": "fr"}}))
    _run(french, tmp_path / "run", "--max-steps", "2")
    info = json.loads((tmp_path / "run" / "rel" / "training.json").read_text())
    assert info["target_language"] == "fr"
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=False)["target_language"] == "fr"
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        rc = export_main(
            ["--checkpoint", str(tmp_path / "run" / "rel"), "--out", str(tmp_path / "bundle"),
             "--variants", "fp32", "--data", str(tmp_path / "no-data"), "--parity-sentences", "0"]
        )  # fmt: skip
    assert rc == 0
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["target_language"] == "fr" and manifest["pairs"] == [["en", "fr"]]


def test_convergence_is_no_better_loss_within_the_last_validations():
    def history(*losses):
        return [{"step": 250 * (i + 1), "valid_loss": v} for i, v in enumerate(losses)]

    still_learning = history(1.30, 1.28, 1.27, 1.26, 1.25)
    assert not converged(still_learning, patience=2, min_delta=0.005)
    # the last 2 validations are no better than 1.25 - 0.005: converged, even with a new (tiny) best
    assert converged(history(1.30, 1.25, 1.249, 1.252), patience=2, min_delta=0.005)
    assert not converged(history(1.30, 1.25, 1.244, 1.252), patience=2, min_delta=0.005)
    assert not converged(history(1.30, 1.30), patience=2, min_delta=0.005)  # too few validations to tell
    assert not converged(history(1.30, 1.30, 1.30, 1.30), patience=0, min_delta=0.005)  # rule off


def test_a_run_stops_when_it_has_converged(tiny_data, tiny_model, tmp_path, capsys):
    """With a zero learning rate the valid loss never moves: the rule stops the run after patience + 1
    validations, long before --max-steps, and the run still releases and checkpoints."""
    run = tmp_path / "run"
    _run(tiny_data, run, "--max-steps", "50", "--valid-every", "1", "--lr", "0", "--patience", "2")
    state = torch.load(run / "last.pt", weights_only=False)
    assert state["step"] == 3 and [r["step"] for r in state["history"]] == [1, 2, 3]
    assert "converged at step 3" in capsys.readouterr().err
    assert (run / "rel" / "model.safetensors").exists()


def test_a_cooldown_ends_the_run_and_goes_on_after_a_resume(tiny_data, tiny_model, tmp_path, capsys):
    """--cooldown 4 from step 0: stopped at step 2 and resumed without the flag, the run still cools
    down and ends at step 4 with a validation, however many steps it was allowed."""
    run = tmp_path / "run"
    _run(tiny_data, run, "--max-steps", "2", "--cooldown", "4", "--patience", "0")
    _run(tiny_data, run, "--max-steps", "50", "--resume", "--patience", "0")
    state = torch.load(run / "last.pt", weights_only=False)
    assert state["step"] == 4 and state["cooldown_start"] == 0 and state["train_config"]["cooldown"] == 4
    assert [r["step"] for r in state["history"]] == [2, 4]
    assert "cooldown finished at step 4" in capsys.readouterr().err


def test_the_convergence_rule_does_not_cut_a_cooldown_short(tiny_data, tiny_model, tmp_path, capsys):
    """With a zero learning rate the loss never moves, so the rule alone would stop at step 3 (the test
    above); under --cooldown 6 the run goes on to the cooldown's end."""
    run = tmp_path / "run"
    flags = ["--valid-every", "1", "--lr", "0", "--patience", "2", "--cooldown", "6"]
    _run(tiny_data, run, "--max-steps", "50", *flags)
    state = torch.load(run / "last.pt", weights_only=False)
    assert state["step"] == 6 and "converged" not in capsys.readouterr().err


def test_frequent_pairs_repeat_by_log_of_their_package_count(tmp_path):
    from model.train import repeat_frequent

    pairs = [("Cancel", "Cancelar"), ("Quit", "Salir"), ("Rare", "Raro")]
    rows = [{"packages": [f"p{i}" for i in range(82)]}, {"packages": ["a", "b", "c"]}, {"packages": ["a"]}]
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = repeat_frequent(pairs, jsonl)
    assert out.count(("Cancel", "Cancelar")) == 7 and out.count(("Quit", "Salir")) == 2
    assert out.count(("Rare", "Raro")) == 1 and len(out) == 10
    assert repeat_frequent(pairs, tmp_path / "missing.jsonl") == pairs


def test_dictionary_pairs_repeat_as_asked(tmp_path):
    """--repeat-dictionaries N: a pair only bilingual dictionaries give comes N times as often; a pair
    a program ships too (a dictionary among its packages) and a pair without provenance do not."""
    from model.train import repeat_frequent

    pairs = [("pharmacy", "farmacia"), ("Cancel", "Cancelar"), ("Open", "Abrir"), ("kitchen", "cocina")]
    rows = [
        {"packages": ["apertium-eng-spa"]},
        {"packages": ["gtk", "qt", "apertium-eng-spa", "dict-freedict-eng-spa"]},
        {"packages": ["gtk"]},
        {"packages": ["apertium-eng-spa", "dict-freedict-eng-spa"]},
    ]
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    once = repeat_frequent(pairs, jsonl)
    assert [once.count(p) for p in pairs] == [1, 3, 1, 2]  # 1 + log2(n), dictionaries as any package
    thrice = repeat_frequent(pairs, jsonl, dictionaries=3)
    assert [thrice.count(p) for p in pairs] == [3, 3, 1, 6]
    flat = repeat_frequent(pairs + [("Extra", "Extra")], jsonl, dictionaries=4, by_packages=False)
    assert [flat.count(p) for p in pairs] == [4, 1, 1, 4] and flat.count(("Extra", "Extra")) == 1


def test_snapshots_of_the_last_validations_average_into_a_release(tiny_data, tiny_model, tmp_path, capsys):
    """--keep-snapshots N keeps the newest N validations' weights; model.average scores each and their mean
    and writes the mean as a release."""
    from model.average import main as average_main

    run = tmp_path / "run"
    _run(tiny_data, run, "--max-steps", "3", "--valid-every", "1", "--keep-snapshots", "2")
    capsys.readouterr()
    snaps = sorted((run / "snapshots").glob("step-*.safetensors"))
    assert [p.name for p in snaps] == ["step-0000002.safetensors", "step-0000003.safetensors"]
    last = torch.load(run / "last.pt", weights_only=False)["model"]
    for name, tensor in load_file(str(snaps[-1])).items():
        assert torch.equal(tensor, last[name]), name
    out = tmp_path / "avg"
    argv = ["--run-dir", str(run), "--last", "2", "--tokenizer", str(TOKENIZER), "--data", str(tiny_data)]
    assert average_main([*argv, "--valid-bleu-sentences", "4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("novel BLEU") == 4 and "average of 2: valid loss" in printed
    a, b = (load_file(str(p)) for p in snaps)
    averaged = load_file(str(out / "model.safetensors"))
    for name in a:
        assert torch.equal(averaged[name], ((a[name] + b[name]) / 2).half()), name
    info = json.loads((out / "training.json").read_text())
    assert info["best"]["averaged"] == [str(p) for p in snaps] and len(info["checkpoints"]) == 2
    assert info["best"]["step"] == 3 and [r["step"] for r in info["history"]] == [1, 2, 3]
    assert {"valid_loss", "valid_bleu", "common_accepted_percent", "train_seconds"} <= set(info["best"])
    assert info["train_config"]["keep_snapshots"] == 2
    assert json.loads((out / "config.json").read_text())["dropout"] == 0.1  # the run's, for --init-from
    with pytest.raises(SystemExit):
        average_main(["--checkpoints", str(snaps[0]), "--tokenizer", str(TOKENIZER)])


def test_inherited_validations_keep_an_old_split_label():
    from model.train import inherited_run

    assert inherited_run({"step": 1, "run": "old-split"}) == "old-split"
    assert inherited_run({"step": 1, "run": "init"}) == "old-split"  # the label's former name
    assert inherited_run({"step": 1, "run": "parent"}) == "parent"
    assert inherited_run({"step": 1}) == "parent"
