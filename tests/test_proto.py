"""The API definition: checked-in stubs are current, buf lint is clean, the contract's shape holds."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from proto.gen.translator.v1 import translator_pb2 as pb
from proto.generate import PROTO_ROOT, stale_files

BUF_VERSION = "1.75.0"


def test_checked_in_stubs_are_current():
    stale = stale_files()
    assert not stale, f"regenerate with `python -m proto.generate`: {stale}"


def test_generate_writes_importable_package(tmp_path):
    from proto.generate import generate

    files = generate(tmp_path)
    assert {f.name for f in files} == {"translator_pb2.py", "translator_pb2.pyi", "translator_pb2_grpc.py"}
    grpc_stub = (tmp_path / "translator" / "v1" / "translator_pb2_grpc.py").read_text()
    assert "from . import translator_pb2" in grpc_stub  # relative import: no sys.path tricks needed
    assert (tmp_path / "translator" / "v1" / "__init__.py").exists()


def _buf_command() -> list[str] | None:
    if shutil.which("buf"):
        return ["buf"]
    local = Path(__file__).resolve().parents[1] / "node_modules" / ".bin" / "buf"
    if local.exists():
        return [str(local)]
    if shutil.which("npx"):
        return ["npx", "--yes", f"@bufbuild/buf@{BUF_VERSION}"]
    return None


def test_buf_lint():
    """Skipped only when there is no buf to run (no buf, no npx, or npx cannot fetch it: offline); once
    buf runs, any failure fails the test: lint findings (exit 100) and a broken buf.yaml alike."""
    cmd = _buf_command()
    if cmd is None:
        pytest.skip("neither buf nor npx is installed (npm install -g @bufbuild/buf)")
    try:
        probe = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.skip(f"{' '.join(cmd)} --version took over 180 s (fetching buf)")
    if probe.returncode != 0:
        pytest.skip(
            f"buf unavailable ({' '.join(cmd)} exited {probe.returncode}): {probe.stderr.strip()[-300:]}"
        )
    assert probe.stdout.strip() == BUF_VERSION or cmd[0] != "npx", probe.stdout
    proc = subprocess.run([*cmd, "lint"], cwd=PROTO_ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"buf lint exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"


def test_service_shape():
    service = pb.DESCRIPTOR.services_by_name["Translator"]
    assert service.full_name == "translator.v1.Translator"
    methods = {m.name: m for m in service.methods}
    assert set(methods) == {"Translate", "TranslateStream", "GetModelInfo", "ListModels"}
    for name, m in methods.items():
        assert m.input_type.name == f"{name}Request"
        assert m.output_type.name == f"{name}Response"
    assert not methods["Translate"].client_streaming and not methods["Translate"].server_streaming
    assert methods["TranslateStream"].client_streaming and methods["TranslateStream"].server_streaming


def test_message_fields():
    opts = pb.DecodingOptions.DESCRIPTOR.fields_by_name
    assert {"beam_size", "num_hypotheses", "max_length", "length_penalty", "return_scores"} <= set(opts)
    # length_penalty is `optional`: 0 is expressible and distinct from unset.
    o = pb.DecodingOptions()
    assert not o.HasField("length_penalty")
    o.length_penalty = 0.0
    assert o.HasField("length_penalty")
    assert set(pb.TranslateRequest.DESCRIPTOR.fields_by_name) == {
        "texts",
        "options",
        "glossary",
        "literal_markers",
        "source_language",
        "target_language",
    }
    # The pair: new numbers, the same on a stream item as on a request of its own.
    numbers = {f.name: f.number for f in pb.TranslateRequest.DESCRIPTOR.fields}
    assert (numbers["source_language"], numbers["target_language"]) == (5, 6)
    assert {"source_language", "target_language"} <= set(pb.TranslateStreamRequest.DESCRIPTOR.fields_by_name)
    assert {"pairs"} <= set(pb.GetModelInfoResponse.DESCRIPTOR.fields_by_name)
    models = pb.ListModelsResponse.DESCRIPTOR.fields_by_name["models"]
    assert models.message_type.name == "GetModelInfoResponse"
    assert set(pb.Hypothesis.DESCRIPTOR.fields_by_name) == {"text", "score"}
    assert {"request_id", "texts", "options"} <= set(pb.TranslateStreamRequest.DESCRIPTOR.fields_by_name)
    assert {"request_id", "translations", "status"} <= set(
        pb.TranslateStreamResponse.DESCRIPTOR.fields_by_name
    )
    info = set(pb.GetModelInfoResponse.DESCRIPTOR.fields_by_name)
    assert {
        "name",
        "version",
        "source_language",
        "target_language",
        "limits",
        "default_options",
        "execution_providers",
        "variant",
        "batching",
        "batching_mode",
    } <= info
    # Field numbers are the wire contract: new fields get new numbers, old ones never move.
    numbers = {f.name: f.number for f in pb.GetModelInfoResponse.DESCRIPTOR.fields}
    assert (numbers["variant"], numbers["batching"], numbers["batching_mode"]) == (8, 9, 10)
    assert pb.GetModelInfoResponse(batching_mode="request").batching_mode == "request"
    assert {"max_texts_per_request", "max_source_tokens", "max_beam_size"} <= set(
        pb.Limits.DESCRIPTOR.fields_by_name
    )


def test_stub_check_with_another_grpcio_tools_compares_descriptors(monkeypatch):
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "0.0.0" if name == "grpcio-tools" else real(name)
    )
    assert stale_files() == []
