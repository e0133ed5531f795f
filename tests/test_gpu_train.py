"""The GPU training path on the CPU, tiny: the pack round trip, a time-boxed run from a pack, and the
weights' trip back (fp16 parts, int8 rows) restored to a model directory."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from model.corpus import Pair, write_splits
from model.dictionaries import pair_provenance
from model.gpu_train import build_parser, dequantize_int8, main, model_config, quantize_int8
from model.pack import make_pack, read_pack
from model.train import load_release, repeat_by_counts

pytestmark = pytest.mark.usefixtures("torch_single_thread")
TOKENIZER = Path(__file__).resolve().parent.parent / "models" / "en-es-small" / "tokenizer.model"
WORDS = ["Open", "Save", "Close", "Print", "Delete", "Copy", "Paste", "Quit"]
SPANISH = ["Abrir", "Guardar", "Cerrar", "Imprimir", "Eliminar", "Copiar", "Pegar", "Salir"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu-train-data")
    train = [
        Pair(f"{w} the file\nnow", f"{s} el archivo\nahora", "a", "1", "x.mo", ("a",))
        for w, s in zip(WORDS, SPANISH, strict=True)
    ]
    train += [Pair(w, s, "a", "1", "x.mo", ("a", "b", "c", "d")) for w, s in zip(WORDS, SPANISH, strict=True)]
    valid = [
        Pair(f"{w} all files", f"{s} todos los archivos", "v", "1", "x.mo", ("v",), novel=i % 2 == 0)
        for i, (w, s) in enumerate(zip(WORDS, SPANISH, strict=True))
    ]
    write_splits(out, {"train": train, "valid": valid}, target="it")
    # Not Spanish, the default: the pack's language must reach training.json (the export labels the pair).
    (out / "manifest.json").write_text(json.dumps({"language": "it"}))
    return out


@pytest.fixture(scope="module")
def pack(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pack") / "pack-it.tar"
    make_pack(corpus, TOKENIZER, out, log=lambda _msg: None)
    return out


def test_the_pack_keeps_what_training_reads(corpus, pack):
    p = read_pack(pack)
    assert p.meta["target_language"] == "it" and p.meta["pairs"] == {"train": 16, "valid": 8}
    assert p.train[0] == ("Open the file\nnow", "Abrir el archivo\nahora")  # newlines survive
    assert p.train_packages == pair_provenance(corpus / "train.jsonl")[0] == [1] * 8 + [4] * 8
    # 1 + log2(4) = 3 copies of each four-package pair, as model.train's repeat_frequent gives
    assert len(repeat_by_counts(p.train, p.train_packages)) == 8 + 3 * 8
    assert p.train_dictionary == [False] * 16  # no dictionary among the fixture's packages
    assert len(repeat_by_counts(p.train, p.train_packages, [True] * 8 + [False] * 8, 2)) == 2 * 8 + 3 * 8
    assert p.valid_novel == [i % 2 == 0 for i in range(8)]
    assert {c.source for c in p.common} == set(WORDS)  # shipped by >= 2 packages with one answer
    assert p.tokenizer_model == TOKENIZER.read_bytes()


def test_a_damaged_pack_is_refused(pack, tmp_path):
    import tarfile

    with tarfile.open(pack, "r:xz") as tar:
        blobs = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    blobs["train.tgt"] = blobs["train.tgt"].replace(b"Abrir", b"Xbrir")
    bad = tmp_path / "bad.tar"
    import io

    with tarfile.open(bad, "w:xz") as tar:
        for name, blob in blobs.items():
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    with pytest.raises(SystemExit, match="train.tgt"):
        read_pack(bad)


def _train(pack: Path, out: Path, *extra: str) -> None:
    main(
        ["--pack", str(pack), "--out", str(out), "--config", "tiny", "--device", "cpu", "--threads", "1",
         "--minutes", "2", "--max-steps", "6", "--valid-every", "3", "--valid-bleu-sentences", "2",
         "--max-tokens", "60", "--max-sentences", "4", "--warmup", "2", *extra]
    )  # fmt: skip


def test_a_run_from_the_pack_writes_a_model_directory_that_fits_the_trip_back(pack, tmp_path, capsys):
    out = tmp_path / "es-tiny"
    _train(pack, out)
    assert "done: 6 steps" in capsys.readouterr().out
    names = {p.name for p in out.iterdir()}
    assert names == {"model.safetensors", "config.json", "training.json", "tokenizer.model"}
    training = json.loads((out / "training.json").read_text())
    run = training["gpu_train"]
    assert run["steps"] == 6 and run["stop_reason"] == "max steps" and run["return"]["fits"]
    assert [r["step"] for r in training["history"]] == [3, 6]
    assert training["train_config"]["config"] == "tiny" and training["device"] == "cpu"
    assert training["target_language"] == "it"
    model = load_release(out)  # what export and bench read
    assert model.config.d_model == 32 and model.config.n_encoder_layers == 1


def test_depths_of_encoder_and_decoder_are_set_apart(pack, tmp_path):
    out = tmp_path / "deep-shallow"
    _train(
        pack, out, "--encoder-layers", "3", "--decoder-layers", "1", "--max-steps", "2", "--valid-every", "0"
    )
    config = json.loads((out / "config.json").read_text())
    assert (config["n_encoder_layers"], config["n_decoder_layers"]) == (3, 1)


def test_layer_norm_placement_is_the_presets_or_the_flags():
    """deep-shallow is pre-norm (a 12-layer post-norm encoder does not train), the others post-norm;
    --norm-first / --no-norm-first override any preset."""
    assert model_config("deep-shallow", 100).norm_first
    assert not any(model_config(p, 100).norm_first for p in ("tiny", "small", "base"))
    assert model_config("small", 100, 12, 2, norm_first=True).norm_first
    assert not model_config("deep-shallow", 100, norm_first=False).norm_first
    for argv, norm_first in (([], None), (["--norm-first"], True), (["--no-norm-first"], False)):
        assert build_parser().parse_args(argv).norm_first is norm_first


def test_a_pre_norm_run_writes_a_pre_norm_model_that_init_from_keeps(pack, tmp_path):
    out = tmp_path / "pre-norm"
    _train(pack, out, "--encoder-layers", "3", "--norm-first", "--max-steps", "2", "--valid-every", "0")
    assert json.loads((out / "config.json").read_text())["norm_first"] is True
    model = load_release(out)
    assert isinstance(model.encoder_ln, torch.nn.LayerNorm) and model.config.n_encoder_layers == 3
    # continued without the flag, or against it: the model's own config wins
    more = tmp_path / "more"
    _train(pack, more, "--init-from", str(out), "--no-norm-first", "--max-steps", "2", "--valid-every", "0")
    assert json.loads((more / "config.json").read_text())["norm_first"] is True
    # and its training.json keeps where it started: the earlier run's curve, for the model card
    init = json.loads((more / "training.json").read_text())["gpu_train"]["init_from"]
    assert init["path"] == str(out) and init["gpu_train"]["steps"] == 2 and init["best"]["step"] == 2
    assert json.loads((more / "training.json").read_text())["train_config"]["config"] == f"{out}/config.json"


def test_too_large_weights_come_back_as_int8_parts_and_restore_to_fp16(pack, tmp_path):
    out = tmp_path / "big"
    # a 0.3 MiB budget for the tiny model's 0.5 MiB of fp16: int8 rows, cut into 0.1 MiB parts
    _train(pack, out, "--max-steps", "2", "--valid-every", "0", "--return-mib", "0.3", "--part-mib", "0.1")
    info = json.loads((out / "training.json").read_text())["gpu_train"]["return"]
    assert info["precision"].startswith("int8") and len(info["parts"]) >= 2
    assert all((out / p).stat().st_size <= 0.1 * 2**20 for p in info["parts"])
    home = tmp_path / "home"
    main(["--restore", str(out), "--to", str(home)])
    restored = load_file(str(home / "model.safetensors"))
    assert all(t.dtype == torch.float16 for t in restored.values())
    assert load_release(home).config.d_model == 32


def test_int8_rows_are_within_half_a_step_of_the_weights():
    torch.manual_seed(0)
    state = {"w": torch.randn(64, 128), "b": torch.randn(64)}
    back = dequantize_int8(quantize_int8(state))
    step = state["w"].abs().amax(dim=1, keepdim=True) / 127
    assert ((back["w"].float() - state["w"]).abs() <= step / 2 + 1e-3).all()
    assert torch.allclose(back["b"].float(), state["b"], atol=1e-3)


def test_the_run_stops_itself_inside_its_time_budget(pack, tmp_path):
    """No step limit: the clock ends training (cooldown over the last fifth), then it validates and
    writes, all inside --minutes."""
    out = tmp_path / "timed"
    main(
        ["--pack", str(pack), "--out", str(out), "--config", "tiny", "--device", "cpu", "--threads", "1",
         "--minutes", "0.5", "--reserve-s", "5", "--valid-every", "0", "--valid-bleu-sentences", "2",
         "--max-tokens", "60", "--max-sentences", "4", "--warmup", "2"]
    )  # fmt: skip
    run = json.loads((out / "training.json").read_text())["gpu_train"]
    assert run["stop_reason"] in ("cooldown finished", "time budget") and run["steps"] > 10
    assert run["cooldown"] is not None and run["total_seconds"] < 30


def test_the_device_entry_trains_into_out(pack, tmp_path):
    """bash bench/gpu_run.sh train, as the device tool runs it: the model directory and its log in $OUT."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    env = os.environ | {"OUT": str(tmp_path), "PYTHON": sys.executable, "GPU_RUN_SITE": "none"}
    proc = subprocess.run(
        ["bash", "bench/gpu_run.sh", "train", str(pack), "es-tiny", "--config", "tiny", "--device", "cpu",
         "--threads", "1", "--max-steps", "2", "--valid-every", "0", "--valid-bleu-sentences", "2",
         "--max-tokens", "60", "--max-sentences", "4"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (tmp_path / "es-tiny" / "config.json").is_file()
    assert "done: 2 steps" in (tmp_path / "es-tiny.log").read_text()


def test_a_teacher_distills_the_train_sources_and_a_student_trains_on_them(pack, tmp_path):
    import lzma

    teacher = tmp_path / "teacher"
    _train(pack, teacher, "--max-steps", "2", "--valid-every", "0", "--distill", "--distill-batch", "4")
    run = json.loads((teacher / "training.json").read_text())["gpu_train"]
    assert run["distill"]["translated"] == run["distill"]["sources"] == 16 and run["return"]["fits"]
    lines = lzma.decompress((teacher / "distilled.tgt.xz").read_bytes()).decode().split("\n")[:-1]
    assert len(lines) == 16 and all("\n" not in line for line in lines)  # escaped, one per pair
    student = tmp_path / "student"
    _train(pack, student, "--max-steps", "2", "--valid-every", "0", "--config", "tiny",
           "--encoder-layers", "2", "--targets-from", str(teacher / "distilled.tgt.xz"))  # fmt: skip
    assert json.loads((student / "training.json").read_text())["gpu_train"]["steps"] == 2
