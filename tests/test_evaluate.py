"""Evaluation: sampling, metric helpers, the torch backend and the ONNX engine backend (the real engine on
an exported tiny bundle) end to end, Apertium."""

import json
import shutil

import pytest
import torch

from bench import evaluate
from bench.apertium import Apertium, apertium_pair
from bench.evaluate import (
    corpus_scores,
    placeholder_stats,
    placeholders_preserved,
    sample_indices,
    score_system,
)
from model.corpus import Pair, write_splits
from tests.test_tokenizer import make_train_texts


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors; the machine is shared with training
    yield
    torch.set_num_threads(before)


# --------------------------------------------------------------------------------------------
# Sample and metrics


def test_sample_indices():
    a = sample_indices(1000, 50, seed=7)
    assert a == sample_indices(1000, 50, seed=7)
    assert a != sample_indices(1000, 50, seed=8)
    assert a == sorted(set(a)) and len(a) == 50 and all(0 <= i < 1000 for i in a)
    assert sample_indices(10, 0) == list(range(10))
    assert sample_indices(10, 25) == list(range(10))
    assert sample_indices(1000, 50) == sample_indices(1000, 50, seed=evaluate.DEFAULT_SEED)


@pytest.mark.parametrize(
    ("source", "hypothesis", "expected"),
    [
        ("Open the file", "Abrir el archivo", None),  # nothing to preserve
        ("Open the file", "Abrir %s", None),
        ("Copy %s to %s", "Copiar %s a %s", True),
        ("Copy %1$s to %2$s", "Copiar a %2$s el %1$s", True),  # order may change
        ("Copy %s to %s", "Copiar %s", False),  # multiset: both %s needed
        ("Copy %s", "Copiar %s %s", True),  # an extra one is not counted against it
        ("Hello {name}", "Hola {nombre}", False),  # translated placeholder
        ("Delete %1$s?", "¿Eliminar %1?", False),  # changed form
        ("<b>Warning:</b> %d left", "<b>Atención:</b> quedan %d", True),
        ("<b>Warning:</b> %d left", "Atención: quedan %d", False),  # markup lost
        ("Tom &amp; Jerry", "Tom &amp; Jerry", True),
        ("Tom &amp; Jerry", "Tom & Jerry", False),
        ("%(count)d items", "%(count)d elementos", True),
        ("%(count)d items", "%(cuenta)d elementos", False),
        ("Line\n%s", "Línea\n%s", True),
    ],
)
def test_placeholders_preserved(source, hypothesis, expected):
    assert placeholders_preserved(source, hypothesis) is expected


def test_placeholder_stats():
    sources = ["Open %s", "Close", "Copy %1 to %2", "Quit {0}"]
    hyps = ["Abrir %s", "Cerrar %s", "Copiar %1", "Salir {0}"]
    assert placeholder_stats(sources, hyps) == {"with_placeholders": 3, "preserved": 2, "rate": 200 / 3}
    assert placeholder_stats(["Close"], ["Cerrar"])["rate"] is None
    with pytest.raises(ValueError):
        placeholder_stats(["a", "b"], ["a"])


def test_corpus_scores_identical_is_100():
    refs = [
        "Abrir el archivo seleccionado",
        "¿Desea guardar los cambios?",
        "Copiar %s a %s",
        "Línea\nsiguiente",
    ]
    scores = corpus_scores(refs, refs)
    assert scores["bleu"] == pytest.approx(100.0)
    assert scores["chrf"] == pytest.approx(100.0)
    assert "nrefs:1" in scores["bleu_signature"] and "tok:13a" in scores["bleu_signature"]
    assert "nrefs:1" in scores["chrf_signature"]
    worse = corpus_scores(["Abrir el fichero", "¿Guardar?", "Copiar", "Línea"], refs)
    assert 0.0 <= worse["bleu"] < 100.0 and 0.0 < worse["chrf"] < 100.0
    assert corpus_scores(["xyz"] * 4, refs)["bleu"] == pytest.approx(0.0)


def test_score_system_combines_both():
    text = "Abrir %s en una ventana nueva"
    scores = score_system(["Open %s in a new window"], [text], [text])
    assert scores["bleu"] == pytest.approx(100.0) and scores["placeholders"]["rate"] == 100.0


def test_length_batches_cover_everything():
    lengths = [5, 1, 30, 2, 2, 7, 100, 3]
    batches = evaluate._length_batches(lengths, batch_size=3, max_tokens=64)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) <= 3 for b in batches)
    assert all(len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 64 for b in batches)
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat)


# --------------------------------------------------------------------------------------------
# End to end on a tiny random model: the torch backend, and the real ONNX engine on its exported bundle


PAIRS = [
    ("Open %s", "Abrir %s"),
    ("Close the window", "Cerrar la ventana"),
    ("Copy %1 to %2", "Copiar %1 a %2"),
    ("Line one\nline two", "Línea uno\nlínea dos"),
    ("<b>Warning</b>", "<b>Atención</b>"),
    ("Save changes?", "¿Guardar cambios?"),
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    # the first two test sources also occur in train (not novel); "Close" is a common string there
    pairs = [Pair(en, es, f"pkg{i % 2}", "1", "x.mo", novel=i >= 2) for i, (en, es) in enumerate(PAIRS)]
    train = [
        Pair("Open %s", "Abrir %s", "a", "1", "x.mo", packages=("a", "b", "c")),
        Pair("Close the window", "Cerrar la ventana", "a", "1", "x.mo", packages=("a", "b")),
        Pair("Close", "Cerrar", "a", "1", "x.mo", packages=("a", "b", "c", "d")),
    ]
    write_splits(out, {"train": train, "test": pairs})
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from model.model import Transformer, TransformerConfig
    from model.tokenizer import train_tokenizer
    from model.train import save_release

    out = tmp_path_factory.mktemp("release")
    texts = [t for pair in PAIRS for t in pair] * 30 + make_train_texts()
    tokenizer = train_tokenizer(texts, out, vocab_size=512)
    torch.manual_seed(0)
    config = TransformerConfig(
        vocab_size=tokenizer.vocab_size, d_model=32, n_heads=2, d_ff=64,
        n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, max_positions=64,
    )  # fmt: skip
    save_release(Transformer(config), out, tokenizer, {"best": {"step": 7, "valid_bleu": 1.5}})
    return out


@pytest.mark.parametrize("beam", [1, 3])
def test_torch_backend_end_to_end(data_dir, model_dir, tmp_path, beam, capsys):
    out = tmp_path / "report.json"
    evaluate.main(
        ["--model", str(model_dir), "--data", str(data_dir), "--n", "4", "--beam", str(beam),
         "--batch-size", "2", "--device", "cpu", "--json", str(out)]
    )  # fmt: skip
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["sample"]["n"] == 4 and report["sample"]["total"] == len(PAIRS)
    assert report["sample"]["seed"] == evaluate.DEFAULT_SEED
    model = report["systems"]["model"]
    assert model["backend"] == "torch" and model["beam"] == beam
    assert model["checkpoint"]["step"] == 7
    assert 0.0 <= model["bleu"] <= 100.0 and 0.0 <= model["chrf"] <= 100.0
    assert "nrefs:1" in report["signatures"]["bleu"]
    assert [s["index"] for s in report["segments"]] == sample_indices(len(PAIRS), 4)
    assert all(isinstance(s["model"], str) for s in report["segments"])
    assert set(report["by_package"]) <= {"pkg0", "pkg1"}
    # the novel view is the sample's pairs labelled novel by the corpus, scored on their own
    novel_positions = [pos for pos, seg in enumerate(report["segments"]) if seg["novel"]]
    assert model["novel"]["n"] == len(novel_positions) == report["sample"]["novel"]
    assert 0 < len(novel_positions) < 4
    # the commonest UI strings of train, ranked by packages, each with its accepted answers
    common = report["common_strings"]
    assert [item["source"] for item in common["items"]] == ["Close", "Open %s", "Close the window"]
    assert common["items"][0] == {"source": "Close", "packages": 4, "accepted": ["cerrar"]}
    scores = model["common_strings"]
    assert (
        scores["n"] == 3 and 0 <= scores["accepted"] <= 3 and len(scores["misses"]) == 3 - scores["accepted"]
    )
    assert model["repeated_word"]["count"] >= 0
    printed = capsys.readouterr().out
    assert "BLEU" in printed and "examples:" in printed and "common UI strings" in printed


def test_missing_checkpoint_is_reported(data_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        evaluate.main(["--model", str(tmp_path), "--data", str(data_dir), "--n", "2"])


def test_onnx_backend_matches_torch_backend(data_dir, tiny_checkpoint, tiny_bundle, tmp_path):
    """The engine path of the evaluator scores exactly what the PyTorch reference scores: the fp32
    engine is token-identical to model.decode, so every output and both metrics agree."""
    common = ["--data", str(data_dir), "--n", "0", "--beam", "2", "--length-penalty", "0.6"]
    evaluate.main(["--model", str(tiny_checkpoint), *common, "--json", str(tmp_path / "torch.json")])
    evaluate.main(
        ["--bundle", str(tiny_bundle), "--variant", "fp32", *common, "--json", str(tmp_path / "onnx.json")]
    )  # fmt: skip
    torch_report = json.loads((tmp_path / "torch.json").read_text(encoding="utf-8"))
    onnx_report = json.loads((tmp_path / "onnx.json").read_text(encoding="utf-8"))
    model = onnx_report["systems"]["model"]
    assert model["backend"] == "onnx" and model["variant"] == "fp32" and model["beam"] == 2
    assert model["text_layer"] is False
    assert [s["model"] for s in onnx_report["segments"]] == [s["model"] for s in torch_report["segments"]]
    assert model["bleu"] == torch_report["systems"]["model"]["bleu"]
    assert model["chrf"] == torch_report["systems"]["model"]["chrf"]


def test_onnx_backend_through_the_text_layer(data_dir, tiny_bundle, tmp_path):
    """--text-layer: Engine.translate_texts instead of Engine.translate; random weights, but the text layer
    restores (or keeps untranslated) every protected span, so every placeholder survives."""
    out = tmp_path / "layer.json"
    evaluate.main(
        ["--bundle", str(tiny_bundle), "--text-layer", "--data", str(data_dir), "--n", "0", "--beam", "2",
         "--batch-size", "4", "--json", str(out)]
    )  # fmt: skip
    report = json.loads(out.read_text(encoding="utf-8"))
    model = report["systems"]["model"]
    assert model["backend"] == "onnx" and model["text_layer"] is True and model["skipped_too_long"] == 0
    assert len(report["segments"]) == len(PAIRS)
    assert all(isinstance(s["model"], str) for s in report["segments"])
    assert model["placeholders"]["rate"] == 100.0


def test_text_layer_batch_with_a_refused_text_goes_text_by_text():
    from server.engine import Hypothesis, InputTooLongError

    class Engine:
        def translate_texts(self, texts, options):
            if any(len(t) > 5 for t in texts):
                raise InputTooLongError("too long")
            return [[Hypothesis(text=t.upper(), score=0.0, tokens=[])] for t in texts]

    results, refused = evaluate._translate_texts(Engine(), ["ab", "abcdefgh", "c"], None)
    assert [r[0].text if r else "" for r in results] == ["AB", "", "C"] and refused == [1]


def test_text_layer_needs_a_bundle(data_dir, model_dir, capsys):
    with pytest.raises(SystemExit):
        evaluate.main(["--model", str(model_dir), "--data", str(data_dir), "--n", "2", "--text-layer"])
    assert "--text-layer needs --bundle" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Apertium


def _apertium_or_skip() -> str:
    if shutil.which("apertium") is None:
        pytest.skip("Apertium is not installed (apt-get install -y apertium apertium-eng-spa)")
    try:
        return apertium_pair()
    except RuntimeError as error:
        pytest.skip(f"no English->Spanish Apertium pair: {error}")


def test_apertium_one_sentence():
    pair = _apertium_or_skip()
    assert pair in ("en-es", "eng-spa")
    with Apertium(pair) as apertium:
        out = apertium.translate("The house is big.")
        assert out == "La casa es grande."
        assert apertium.translate("") == ""


def test_the_spanish_apertium_peer_is_a_mode_debian_installs_and_a_missing_one_is_named():
    """model/languages.py names the card's peer; a mode that is not installed is an error naming it
    (it used to start an empty pipeline that died with bash's usage text)."""
    _apertium_or_skip()
    from model.languages import language

    with Apertium(language("es").apertium) as apertium:
        assert apertium.translate("The house is big.") == "La casa es grande."
    with pytest.raises(RuntimeError, match="no Apertium mode 'xx-yy'.*eng-spa"):
        Apertium("xx-yy")


def test_apertium_stream_matches_per_segment_on_multiline():
    _apertium_or_skip()
    segments = ["Open the file.", "Save the file?\nThe window is closed.", "Hello world", "Copy %s to {name}"]
    with Apertium(mode="stream") as stream:
        streamed = stream.translate_all(segments)
    with Apertium(mode="per-segment") as single:
        one_by_one = single.translate_all(segments)
    assert streamed == one_by_one
    assert len(streamed) == len(segments)
    assert streamed[1].count("\n") == 1  # a multi-line segment stays one segment with its newline
    assert "%s" in streamed[3]


def test_cli_with_apertium_side_by_side(data_dir, tiny_bundle, tmp_path, capsys):
    _apertium_or_skip()
    out = tmp_path / "report.json"
    evaluate.main(
        ["--bundle", str(tiny_bundle), "--data", str(data_dir), "--n", "3", "--apertium", "--json", str(out)]
    )
    report = json.loads(out.read_text(encoding="utf-8"))
    assert list(report["systems"]) == ["model", "apertium"]
    apertium = report["systems"]["apertium"]
    assert apertium["pair"] in ("en-es", "eng-spa") and apertium["seconds"] >= 0
    assert all(isinstance(s["apertium"], str) and s["apertium"] for s in report["segments"])
    printed = capsys.readouterr().out
    assert "apertium" in printed and "APER" in printed


# --------------------------------------------------------------------------------------------
# Model card: one command from the evaluations to the Markdown


def test_model_card_is_rendered_from_the_evaluations(data_dir, tiny_checkpoint, tiny_bundle, tmp_path):
    from bench import model_card

    model = tmp_path / "tiny-card"
    shutil.copytree(tiny_checkpoint, model)
    history = [
        {"step": 50, "epoch": 0, "valid_loss": 1.0, "valid_bleu": 30.0, "valid_chrf": 50.0,
         "valid_bleu_all": 31.0, "train_seconds": 30.0, "run": "other-depth"},
        {"step": 100, "epoch": 0, "valid_loss": 3.5, "valid_bleu": 10.0, "valid_chrf": 30.0,
         "train_seconds": 60.0, "run": "old-split"},
        {"step": 150, "epoch": 0, "valid_loss": 3.0, "valid_bleu": 15.25, "valid_chrf": 35.0,
         "valid_bleu_all": 16.0, "train_seconds": 90.0, "run": "parent"},
        {"step": 200, "epoch": 1, "valid_loss": 2.5, "valid_bleu": 20.5, "valid_chrf": 40.0,
         "valid_bleu_all": 25.0, "valid_chrf_all": 45.0, "common_accepted_percent": 50.0,
         "common_repeated_word": 1, "train_seconds": 120.0},
    ]  # fmt: skip
    training = {
        "best": history[3], "history": history, "train_config": {"max_tokens": 3000}, "parameters": 123456,
        "device": "cpu", "hardware": "Test CPU, 2 cores", "threads": 2, "train_pairs": 3,
    }  # fmt: skip
    (model / "training.json").write_text(json.dumps(training))
    manifest = {
        "sources": "test catalogs", "top_packages": 150, "pairs_after_cleaning": 12, "pairs_after_dedupe": 9,
        "counts": {"train": 3, "valid": 0, "test": 6}, "novel": {"valid": 0, "test": 4},
        "families": {"test": ["pkg"], "valid": []},
    }  # fmt: skip
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    (data / "manifest.json").write_text(json.dumps(manifest))
    model_card.main(
        [
            "--model",
            str(model),
            "--data",
            str(data),
            "--bundle",
            str(tiny_bundle),
            "--n",
            "0",
            "--no-apertium",
        ]
    )
    card = (model / "MODEL_CARD.md").read_text(encoding="utf-8")
    report = json.loads((model / "eval.json").read_text(encoding="utf-8"))
    fp32 = json.loads((model / "eval-fp32.json").read_text(encoding="utf-8"))
    assert f"| {report['systems']['model']['bleu']:.2f} |" in card
    assert f"| {fp32['systems']['model']['chrf']:.2f} |" in card and "ONNX engine, fp32" in card
    service = json.loads((model / "eval-service.json").read_text(encoding="utf-8"))
    assert service["systems"]["model"]["text_layer"] is True and "what the service returns" in card
    assert "Test CPU, 2 cores" in card and "| 200 | 1 | 2.500 | 20.50 |" in card
    assert "| 100 | 0 | 3.50 | (10.0: old split) |" in card and "| 150 | 0 | 3.000 | 15.25 |" in card
    assert "Steps up to 150 are the model this run continued" in card and "Rows marked old split" in card
    assert "Steps up to 50 are the model this one was grown from" in card
    assert "train 3, valid 0 (0 novel), test 6 (4 novel)" in card
    assert "none of the last 16 validations" in card and "Too few validations to judge (3)" in card
    # re-rendering from the kept reports gives the same card
    model_card.main(
        ["--model", str(model), "--data", str(data), "--bundle", str(tiny_bundle), "--no-evaluate"]
    )
    assert (model / "MODEL_CARD.md").read_text(encoding="utf-8") == card


def test_the_model_card_says_whether_the_run_has_converged():
    from bench.model_card import _convergence

    def history(*losses):
        return [{"step": 250 * (i + 1), "valid_loss": v} for i, v in enumerate(losses)]

    going = _convergence(history(1.30, 1.28, 1.25), {"patience": 2, "min_delta": 0.005})
    assert "At step 750 it is not met yet" in going and "from 1.300 to 1.250" in going
    done = _convergence(history(1.30, 1.25, 1.249, 1.252), {"patience": 2, "min_delta": 0.005})
    assert "At step 1,000 it is met" in done and "(steps 750-1,000)" in done
    assert "was off" in _convergence(history(1.3, 1.2, 1.1), {"patience": 0})
    cooled = history(1.30, 1.28, 1.25)
    cooled[-1]["lr"] = 0.0
    ended = _convergence(cooled, {"patience": 2, "min_delta": 0.005, "cooldown": 500})
    assert ended.startswith("The run ended with a cooldown (`--cooldown 500`)") and "to step 750" in ended


def test_the_model_card_tells_a_gpu_run_and_the_release_it_continued():
    from bench.model_card import _gpu_run, _training_hours

    cpu_best = {"step": 6500, "epoch": 2, "valid_loss": 1.7484, "valid_bleu": 34.88, "train_seconds": 9000.0}
    row = {"step": 2513, "epoch": 3, "valid_loss": 1.525, "valid_bleu": 39.25, "valid_chrf": 61.26,
           "train_seconds": 138.0}  # fmt: skip
    training = {
        "best": row, "history": [row],
        "train_config": {"max_tokens": 16384, "max_sentences": 512, "bf16": True, "lr": 8e-4, "warmup": 600,
                         "cooldown_fraction": 0.2},
        "gpu_train": {
            "pack": {"pairs": {"train": 315423, "valid": 15213}}, "steps": 2513, "epochs": 3,
            "train_seconds": 138.0, "target_tokens": 12_345_678, "target_tokens_per_s": 115659,
            "stop_reason": "cooldown finished",
            "init_from": {"path": "models/en-fr-small", "hardware": "AMD EPYC, 2 cores", "best": cpu_best,
                          "history": [cpu_best | {"valid_chrf": 57.6}]},
        },
    }  # fmt: skip
    text = "\n".join(_gpu_run(training))
    assert "2,513 steps (3 epochs) in 2.3 min, 12.3M target tokens (115,659/s)" in text
    assert "batches of at most 16,384 tokens and 512 rows, bf16 autocast" in text
    assert "learning rate 0.0008 after 600 warm-up steps, then linearly to 0 over the last 20%" in text
    assert "It continued the previous release (`models/en-fr-small`, trained on AMD EPYC, 2 cores" in text
    assert "best checkpoint: step 6,500, valid loss 1.748, novel valid BLEU 34.88" in text
    assert "| 6,500 | 2 | 1.748 | 34.88 |" in text  # the earlier run's curve
    assert _training_hours(training) == (9000.0 + 138.0) / 3600
    del training["gpu_train"]["init_from"]
    assert "continued" not in "\n".join(_gpu_run(training)) and _training_hours(training) == 138.0 / 3600


def test_tune_decoding_picks_the_smallest_alpha_near_the_best_on_valid(data_dir, tiny_checkpoint, tmp_path):
    from bench import tune_decoding

    assert tune_decoding.choose({0.6: 30.0, 1.0: 30.25, 1.4: 30.4, 2.0: 29.0}, 0.2) == 1.0
    assert tune_decoding.choose({0.6: 30.0, 1.0: 29.0}, 0.2) == 0.6
    assert (
        tune_decoding.brevity_penalty("BLEU = 35.82 67.5/45.9/33.6/24.5 (BP = 0.896 ratio = 0.901") == 0.896
    )
    model = tmp_path / "m"
    shutil.copytree(tiny_checkpoint, model)
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    shutil.copy(data / "test.en", data / "valid.en")
    shutil.copy(data / "test.es", data / "valid.es")
    shutil.copy(data / "test.jsonl", data / "valid.jsonl")
    tune_decoding.main(["--model", str(model), "--data", str(data), "--n", "3", "--alphas", "0.6", "1.4"])
    decoding = json.loads((model / "decoding.json").read_text())
    assert decoding["tuning"]["split"] == "valid"
    assert set(decoding["tuning"]["by_alpha"]) == {"0.6", "1.4"}
    assert decoding["defaults"]["length_penalty"] in (0.6, 1.4) and decoding["defaults"]["beam_size"] == 4
