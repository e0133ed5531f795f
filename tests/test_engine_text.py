"""server/engine's text layer (text.py: Engine) on a tiny exported bundle: metadata, whitespace and blank
texts, limits and options, bundle errors, and the server.contract protocols Engine and RunningBatch
satisfy."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from model.decode import max_output_length
from server.contract import InFlightBatch, TranslationEngine
from server.engine import BundleError, DecodingOptions, Engine, Hypothesis, InputTooLongError
from server.engine.sessions import Graphs
from server.engine.text import RunningBatch
from tests.test_export import MAX_LENGTH_CAP, MAX_SOURCE_TOKENS, ROOT, TEXTS, TinyBundle, build_tiny_bundle

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyBundle:
    return build_tiny_bundle(tmp_path_factory)


@pytest.fixture(scope="module")
def engine(tiny: TinyBundle) -> Engine:
    return Engine(tiny.bundle, intra_op_threads=1)


# ------------------------------------------------------------------------------------------ basics


def test_load_metadata_and_round_trip(engine: Engine, tiny: TinyBundle):
    assert (engine.name, engine.version) == ("tiny-en-es", "0.0.1-test")
    assert (engine.source_language, engine.target_language) == ("en", "es")
    assert engine.max_source_tokens == MAX_SOURCE_TOKENS and engine.max_length_cap == MAX_LENGTH_CAP
    assert engine.max_beam_size == 8
    assert engine.default_options == DecodingOptions(
        beam_size=4, num_hypotheses=1, max_length=0, length_penalty=0.6
    )
    assert engine.providers == ["CPUExecutionProvider"]
    assert engine.manifest["format_version"] == 1
    out = engine.translate(TEXTS, engine.default_options)
    assert len(out) == len(TEXTS)
    for nbest in out:
        assert nbest is not None and len(nbest) == 1
        h = nbest[0]
        assert isinstance(h, Hypothesis) and h.score < 0
        assert h.text == tiny.tokenizer.decode(h.tokens)
    stats = engine.last_stats
    for key in ("encoder_s", "decoder_s", "select_s", "reorder_s", "steps", "total_s", "tokenize_s"):
        assert key in stats
    assert stats["segments"] == len(TEXTS) and stats["steps"] > 0
    # warmup() runs the graphs for real (the last of its batches: two greedy segments) and changes no
    # result.
    engine.warmup()
    assert engine.last_stats["segments"] == 2 and engine.last_stats["steps"] > 0
    assert engine.translate(TEXTS, engine.default_options) == out


def test_batch_time_breakdown_adds_up(engine: Engine):
    """The phases of a batch's time (bench/engine_speed's breakdown) each lie within its total, and
    together take no more than it."""
    engine.translate(TEXTS, DecodingOptions(beam_size=2))
    st = engine.last_stats
    phases = ("tokenize_s", "encoder_s", "decoder_s", "select_s", "reorder_s", "detokenize_s")
    for key in phases:
        assert 0 <= st[key] <= st["total_s"], key
    assert sum(st[key] for key in phases) <= st["total_s"]


def test_engine_imports_no_torch(tiny: TinyBundle):
    code = (
        "import sys; from server.engine import Engine, DecodingOptions; "
        f"e = Engine({str(tiny.bundle)!r}, intra_op_threads=1); "
        "r = e.translate(['Open the file.'], DecodingOptions(beam_size=2)); "
        "assert r[0][0].score < 0, r; "
        "assert 'torch' not in sys.modules and 'grpc' not in sys.modules; print('ok')"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


# ------------------------------------------------------------------------------------- real text


def test_whitespace_and_empty_segments(engine: Engine):
    texts = ["", "   ", "\n", " \t\n ", "  Open the file.\n", "\tSettings  ", "Yes"]
    out = engine.translate(texts, DecodingOptions(beam_size=2))
    for i in range(4):
        assert out[i] == [Hypothesis(text=texts[i], score=0.0, tokens=[])]
    core = engine.translate(["Open the file.", "Settings"], DecodingOptions(beam_size=2))
    assert out[4][0].text == "  " + core[0][0].text + "\n" and out[4][0].tokens == core[0][0].tokens
    assert out[5][0].text == "\t" + core[1][0].text + "  "
    assert out[6][0].text == engine.tokenizer.decode(out[6][0].tokens)
    assert engine.translate([], DecodingOptions()) == []
    assert engine.count_tokens(["", "  Open the file. ", "Open the file."])[0] == 0
    counts = engine.count_tokens(["  Open the file. ", "Open the file."])
    assert counts[0] == counts[1] == len(engine.tokenizer.encode("Open the file."))


def test_input_too_long(engine: Engine):
    long_text = " ".join(["information"] * 40)
    n = engine.count_tokens([long_text])[0]
    assert n > MAX_SOURCE_TOKENS
    with pytest.raises(InputTooLongError) as err:
        engine.translate(["Yes", long_text, ""], DecodingOptions())
    msg = str(err.value)
    assert "segment 1" in msg and str(n) in msg and str(MAX_SOURCE_TOKENS) in msg and "split" in msg
    assert isinstance(err.value, ValueError)


def test_placeholders_are_single_tokens(engine: Engine):
    tok = engine.tokenizer
    for ph in ("%s", "{0}", "%1$s", "<b>", "%d"):
        assert ph in tok.pieces(f"Delete {ph} now")  # one atom, never split into sub-pieces
    text = "Delete %s from {0}?"
    assert tok.decode(tok.encode(text)) == text
    (hyp,) = engine.translate([text], DecodingOptions(beam_size=1))[0]
    assert hyp.text == tok.decode(hyp.tokens)


def test_options_validation_and_length_cap(engine: Engine):
    with pytest.raises(ValueError, match="beam_size"):
        engine.translate(["Yes"], DecodingOptions(beam_size=9))
    with pytest.raises(ValueError, match="num_hypotheses"):
        engine.translate(["Yes"], DecodingOptions(beam_size=2, num_hypotheses=3))
    with pytest.raises(ValueError, match="max_length"):
        engine.translate(["Yes"], DecodingOptions(max_length=-1))
    short = engine.translate(TEXTS, DecodingOptions(beam_size=2, max_length=3))
    assert all(len(r[0].tokens) <= 3 for r in short)
    capped = engine.translate(TEXTS, DecodingOptions(beam_size=1, max_length=10_000))
    assert max(len(r[0].tokens) for r in capped) <= MAX_LENGTH_CAP
    assert engine.max_output_length(100, DecodingOptions()) == MAX_LENGTH_CAP
    assert engine.max_output_length(4, DecodingOptions()) == max_output_length(4, cap=MAX_LENGTH_CAP) == 16


# ---------------------------------------------------------------------------------- corrupt bundles


@pytest.fixture()
def bundle_copy(tiny: TinyBundle, tmp_path: Path) -> Path:
    dst = tmp_path / "bundle"
    shutil.copytree(tiny.bundle, dst)
    return dst


def test_flipped_byte_is_a_checksum_error(bundle_copy: Path):
    path = bundle_copy / "fp32" / "decoder.onnx"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"decoder\.onnx.*sha256"):
        Engine(bundle_copy, intra_op_threads=1)


def test_missing_file_is_named(bundle_copy: Path):
    (bundle_copy / "tokenizer.model").unlink()
    with pytest.raises(BundleError, match=r"tokenizer\.model.*missing"):
        Engine(bundle_copy, intra_op_threads=1)


def test_wrong_format_version_and_bad_manifest(bundle_copy: Path):
    path = bundle_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps(manifest | {"format_version": 99}))
    with pytest.raises(BundleError, match="format_version 99"):
        Engine(bundle_copy, intra_op_threads=1)
    path.write_text("{not json")
    with pytest.raises(BundleError, match="manifest.json"):
        Engine(bundle_copy, intra_op_threads=1)
    path.unlink()
    with pytest.raises(BundleError, match="missing manifest"):
        Engine(bundle_copy, intra_op_threads=1)


def test_unknown_variant_and_truncated_file(bundle_copy: Path):
    with pytest.raises(BundleError, match="variant 'int4'"):
        Engine(bundle_copy, variant="int4", intra_op_threads=1)
    path = bundle_copy / "int8" / "encoder.onnx"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(BundleError, match=r"int8/encoder\.onnx: size"):
        Engine(bundle_copy, variant="int8", intra_op_threads=1)


def test_decoder_and_manifest_vocabularies_must_match(bundle_copy: Path):
    """A tokenizer and manifest that agree (one piece less) with a decoder that does not: the error names
    the decoder graph and both sizes."""
    from sentencepiece import sentencepiece_model_pb2

    tok = bundle_copy / "tokenizer.model"
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(tok.read_bytes())
    vocab = len(model.pieces)
    del model.pieces[-1]  # an ordinary piece
    tok.write_bytes(model.SerializeToString())
    path = bundle_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["vocab_size"] = vocab - 1
    manifest["files"]["tokenizer.model"] = {
        "sha256": hashlib.sha256(tok.read_bytes()).hexdigest(),
        "bytes": tok.stat().st_size,
    }
    path.write_text(json.dumps(manifest))
    with pytest.raises(BundleError) as e:
        Engine(bundle_copy, intra_op_threads=1)
    decoder = bundle_copy / "fp32" / "decoder.onnx"
    assert str(e.value) == f"{decoder}: vocabulary {vocab}, manifest says {vocab - 1}"


def test_unexpected_graph_interface_lists_every_problem(engine: Engine, tmp_path: Path):
    """An encoder graph where the decoder belongs: one error naming the bundle and each problem."""
    encoder = engine.generator.graphs.encoder
    with pytest.raises(BundleError) as e:
        Graphs.inspect({"encoder": encoder, "decoder": encoder}, tmp_path)
    message = str(e.value)
    assert message.startswith(f"{tmp_path}: unexpected graph interface: decoder has no past_key_* inputs; ")
    assert "; decoder lacks inputs [" in message and "; decoder lacks outputs [" in message


# ---------------------------------------------------------------------------------------- contract


def test_engine_and_running_batch_satisfy_the_contract(engine: Engine):
    """server.scheduler and server.service are typed against these protocols, never the engine."""
    assert isinstance(engine, TranslationEngine)
    rb = engine.running_batch()
    assert isinstance(rb, RunningBatch) and isinstance(rb, InFlightBatch)
