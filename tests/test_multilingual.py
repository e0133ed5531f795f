"""model.multilingual: the tagged corpus of several languages, a tokenizer that keeps each tag one piece, a
tiny multilingual run, and its per-language score beside the per-pair runs at equal compute."""

import json
from pathlib import Path

import pytest

from model import multilingual
from model.corpus import Pair, write_splits
from model.tokenizer import main as tokenizer_main
from model.train import main as train_main
from runtime.splits import read_split
from runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("torch_single_thread")

WORDS = ["Open", "Save", "Close", "Print", "Delete", "Copy", "Paste", "Quit"]
TRANSLATIONS = {
    "fr": ["Ouvrir", "Enregistrer", "Fermer", "Imprimer", "Supprimer", "Copier", "Coller", "Quitter"],
    "de": ["Öffnen", "Speichern", "Schließen", "Drucken", "Löschen", "Kopieren", "Einfügen", "Beenden"],
}


def _corpus(root: Path, code: str) -> Path:
    out = root / f"data-{code}"
    words = TRANSLATIONS[code]
    train = [Pair(f"{w} the file {i}", f"{t} {i}", "a", "1", "x.mo", ("a", "b"))
             for i in range(12) for w, t in zip(WORDS, words, strict=True)]  # fmt: skip
    train += [Pair(w, t, "a", "1", "x.mo", ("a", "b")) for w, t in zip(WORDS, words, strict=True)]
    valid = [Pair(f"{w} all", t, "v", "1", "x.mo", novel=True) for w, t in zip(WORDS, words, strict=True)]
    test = valid[:2]
    write_splits(out, {"train": train, "valid": valid, "test": test}, target=code)
    (out / "manifest.json").write_text(json.dumps({"language": {"code": code}}), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("multilingual")
    fr, de = _corpus(root, "fr"), _corpus(root, "de")
    return fr, de, root / "data-mul"


def test_the_corpus_puts_each_language_s_tag_on_its_sources(corpora):
    fr, de, mul = corpora
    manifest = multilingual.build_corpus([fr, de], mul)
    assert manifest["languages"] == ["fr", "de"] and manifest["tags"] == {"fr": ">>fr<<", "de": ">>de<<"}
    assert manifest["counts"]["train"] == {"fr": 104, "de": 104}
    pairs = read_split(mul, "train")
    assert pairs[0] == (">>fr<< Open the file 0", "Ouvrir 0") and pairs[104] == (
        ">>de<< Open the file 0",
        "Öffnen 0",
    )
    records = [json.loads(line) for line in (mul / "valid.jsonl").open(encoding="utf-8")]
    assert [r["language"] for r in records] == ["fr"] * 8 + ["de"] * 8
    assert records[8]["source"] == ">>de<< Open all" and records[8]["novel"] is True
    # one corpus per language: two French corpora are refused
    with pytest.raises(SystemExit, match="one corpus per target language"):
        multilingual.build_corpus([fr, fr], mul.parent / "twice")


def test_a_multilingual_run_is_scored_per_language_beside_its_per_pair_runs(corpora, tmp_path, monkeypatch):
    import model.train as train_module

    fr, de, mul = corpora
    if not (mul / "manifest.json").exists():
        multilingual.build_corpus([fr, de], mul)
    tokenizer_main(["--data", str(mul), "--out", str(tmp_path / "tok"), "--vocab-size", "400"])
    tokenizer = Tokenizer(tmp_path / "tok" / "tokenizer.model")
    assert tokenizer.pieces(">>de<< Open the file")[:2] == ["▁", ">>de<<"]
    assert ">>fr<<" in tokenizer.pieces(">>fr<< Quit")
    monkeypatch.setattr(
        train_module.TransformerConfig, "small", classmethod(
            lambda cls, v: cls(vocab_size=v, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
                               n_decoder_layers=1, max_positions=64)
        ),
    )  # fmt: skip
    run = tmp_path / "run"
    train_main(
        ["--data", str(mul), "--tokenizer", str(tmp_path / "tok" / "tokenizer.model"), "--run-dir", str(run),
         "--release-dir", str(run / "rel"), "--config", "small", "--max-tokens", "60", "--max-sentences", "4",
         "--valid-every", "4", "--valid-bleu-sentences", "4", "--warmup", "2", "--threads", "1",
         "--max-steps", "4"]
    )  # fmt: skip
    assert json.loads((run / "rel" / "training.json").read_text())["target_language"] == "mul"
    # a per-pair run's record at half the steps (two languages): equal compute
    per_pair = tmp_path / "fr-run"
    per_pair.mkdir()
    history = [
        {"step": s, "valid_loss": 5.0 - s, "valid_bleu": float(s), "valid_chrf": 2.0 * s} for s in (1, 2, 3)
    ]
    (per_pair / "training.json").write_text(json.dumps({"history": history}), encoding="utf-8")
    rows = multilingual.score(mul, run / "rel", {"fr": per_pair}, threads=1)
    assert [r["language"] for r in rows] == ["fr", "de"]
    assert rows[0]["step"] == 4 and rows[0]["equal_compute_step"] == 2
    assert rows[0]["per_pair"]["step"] == 2 and "per_pair" not in rows[1]
    for row in rows:
        measured = row["multilingual"]
        assert measured["valid_loss"] > 0 and 0 <= measured["valid_bleu"] <= 100


def test_compare_measures_both_final_models_on_each_language_s_test_split(corpora, tmp_path, monkeypatch):
    import model.train as train_module

    fr, de, mul = corpora
    if not (mul / "manifest.json").exists():
        multilingual.build_corpus([fr, de], mul)
    tokenizer_main(["--data", str(mul), "--out", str(tmp_path / "tok"), "--vocab-size", "400"])
    monkeypatch.setattr(
        train_module.TransformerConfig, "small", classmethod(
            lambda cls, v: cls(vocab_size=v, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
                               n_decoder_layers=1, max_positions=64)
        ),
    )  # fmt: skip
    tok = str(tmp_path / "tok" / "tokenizer.model")
    for data, run in ((mul, tmp_path / "mul"), (fr, tmp_path / "fr")):
        train_main(
            ["--data", str(data), "--tokenizer", tok, "--run-dir", str(run),
             "--release-dir", str(run / "rel"), "--config", "small", "--max-tokens", "60",
             "--max-sentences", "4", "--valid-every", "2", "--valid-bleu-sentences", "4", "--warmup", "2",
             "--threads", "1", "--max-steps", "2"]
        )  # fmt: skip
    rows = multilingual.compare(mul, tmp_path / "mul" / "rel", {"fr": tmp_path / "fr" / "rel"}, "test", 10, 1)
    assert [(r["language"], r["split"]) for r in rows] == [("fr", "test"), ("de", "test")]
    assert "per_pair" in rows[0] and "per_pair" not in rows[1]
    for measured in (rows[0]["multilingual"], rows[0]["per_pair"], rows[1]["multilingual"]):
        assert measured["step"] == 2 and measured["valid_loss"] > 0
        assert measured["target_pieces_per_sentence"] > 1
        assert 0 <= measured["valid_bleu"] <= 100 and 0 <= measured["common_accepted_percent"] <= 100
    # the two models saw different inputs: the multilingual one its tag, the per-pair one none
    assert rows[0]["multilingual"]["valid_loss"] != rows[0]["per_pair"]["valid_loss"]
