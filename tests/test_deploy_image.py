"""The container image, checked without a container engine: the Dockerfile's stages against
pyproject.toml (one dependency list, torch only in the build stage), the build context, the wheel that
`pip install .` builds, and the image's health probe against real servers.

The stack around the image (compose, Prometheus, Grafana, nginx, Kubernetes) is in tests/test_deploy.py.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import fields
from pathlib import Path

import pytest

from tests import test_service
from tests.conftest import REPO_ROOT, free_port

pki = test_service.pki  # fixture: a CA, a server and a client certificate

DEPLOY = REPO_ROOT / "deploy"
DOCKERFILE = REPO_ROOT / "Dockerfile"
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())

# The env variables the probe reads besides the server's own.
HEALTHCHECK_VARIABLES = {
    "TRANSLATOR_HEALTHCHECK_CA",
    "TRANSLATOR_HEALTHCHECK_SERVER_NAME",
    "TRANSLATOR_HEALTHCHECK_CERT",
    "TRANSLATOR_HEALTHCHECK_KEY",
}


def server_variables() -> set[str]:
    from server.config import ServerConfig, env_name

    return {env_name(f.name) for f in fields(ServerConfig)}


def need(binary: str, package: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.skip(f"{binary} not installed (apt-get install {package}; make system-deps)")
    return path


def run(cmd: list[str], cwd: Path = REPO_ROOT, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, **kwargs)


# ---- Dockerfile ---------------------------------------------------------------------------------------


def dockerfile_stages(text: str) -> list[dict]:
    """[{name, base, instructions: [(KEYWORD, args)]}], continuation lines joined, comments dropped."""
    logical, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if current and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    stages: list[dict] = []
    for line in logical:
        keyword, _, args = line.strip().partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            m = re.match(r"(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", args.strip(), re.IGNORECASE)
            stages.append({"base": m.group(1), "name": m.group(2), "instructions": []})
        elif stages:
            stages[-1]["instructions"].append((keyword, args.strip()))
        else:
            stages.append({"base": None, "name": "(global)", "instructions": [(keyword, args.strip())]})
    return stages


@pytest.fixture(scope="module")
def stages() -> dict[str, dict]:
    return {s["name"]: s for s in dockerfile_stages(DOCKERFILE.read_text())}


def global_args() -> dict[str, str]:
    out = {}
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("FROM"):
            break
        m = re.match(r"ARG\s+(\w+)=(\S+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def runs(stage: dict) -> list[str]:
    return [args for keyword, args in stage["instructions"] if keyword == "RUN"]


def shell_commands(command: str) -> list[list[str]]:
    """A RUN line as simple commands (split at &&, ||, ;, |), words unquoted."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    out: list[list[str]] = [[]]
    for word in lexer:
        if word in ("&&", "||", ";", "|"):
            out.append([])
        else:
            out[-1].append(word)
    return [c for c in out if c]


def pip_installs(stage: dict) -> list[list[str]]:
    """Argument lists of every `pip install` in the stage's RUN commands."""
    out = []
    for command in runs(stage):
        for words in shell_commands(command):
            if len(words) >= 2 and words[0] in ("pip", "pip3") and words[1] == "install":
                out.append(words[2:])
            elif words[1:4] == ["-m", "pip", "install"]:
                out.append(words[4:])
    return out


def copy_destination_of(stage: dict, filename: str) -> str | None:
    """The directory a COPY of `filename` (from the context) lands in."""
    for keyword, args in stage["instructions"]:
        if keyword == "COPY" and "--from" not in args:
            words = args.split()
            if filename in words[:-1]:
                return words[-1].rstrip("/") or "/"
    return None


def test_dockerfile_stages(stages):
    assert {"build", "runtime", "runtime-gpu"} <= set(stages), sorted(stages)
    order = [s["name"] for s in dockerfile_stages(DOCKERFILE.read_text())]
    assert order[-1] == "runtime", "the CPU runtime must be the last stage (the default target)"
    args = global_args()
    assert stages["runtime"]["base"] == "${PYTHON_IMAGE}" and stages["build"]["base"] == "${PYTHON_IMAGE}"
    # Fully qualified: podman has no default search registries.
    assert args["PYTHON_IMAGE"].startswith("docker.io/library/python:3.11-slim"), args
    assert stages["runtime-gpu"]["base"] == "${CUDA_IMAGE}"
    assert args["CUDA_IMAGE"].startswith("docker.io/nvidia/cuda:")
    assert "cudnn" in args["CUDA_IMAGE"] and "runtime" in args["CUDA_IMAGE"]


def test_dockerfile_runtime_installs_the_project_from_pyproject(stages):
    """Runtime dependencies come from [project.dependencies] by installing the project itself: one
    `pip install <dir with pyproject.toml>`, no requirements file, no package list of its own."""
    text = DOCKERFILE.read_text()
    assert not re.search(r"requirements[\w.-]*\.txt|\s-r\s|--requirement", text), "a second dependency list"
    for name in ("runtime", "runtime-gpu"):
        stage = stages[name]
        project_dir = copy_destination_of(stage, "pyproject.toml")
        assert project_dir, f"{name}: pyproject.toml is not copied"
        installs = pip_installs(stage)
        assert [project_dir] in installs, f"{name}: no `pip install {project_dir}` in {installs}"
        # Dependencies first from pyproject.toml alone, then the sources without touching them.
        assert ["--no-deps", "--force-reinstall", project_dir] in installs, f"{name}: {installs}"
        project = ([project_dir], ["--no-deps", "--force-reinstall", project_dir])
        others = [args for args in installs if args not in project]
        # The GPU wheel's version comes from deploy/build/constraints.txt (PIP_CONSTRAINT).
        allowed = [] if name == "runtime" else [["onnxruntime-gpu"]]
        assert others == allowed, f"{name}: extra packages installed outside pyproject.toml: {others}"
        assert not any("torch" in a for args in installs for a in args), f"{name}: torch in the runtime"
        copies = [args for keyword, args in stage["instructions"] if keyword == "COPY"]
        # Only the packages are copied for the install: no models, tests or data.
        for args in copies:
            assert not re.search(r"\b(models|tests|data)/", args), f"{name}: copies {args}"
    # The build stage: torch pinned by pyproject's `train` extra, from the PyTorch CPU index, and the
    # rest of that extra the export imports, with pyproject's own specifiers (no CTranslate2).
    build = " ".join(runs(stages["build"]))
    assert "pip install . ${export_needs}" in build
    assert '["optional-dependencies"]["train"]' in build and "torch==" in build
    assert "(onnx|safetensors|sacrebleu)" in build and "ctranslate2" not in build
    assert re.search(r"--index-url \"?\$\{TORCH_INDEX_URL\}", build)
    assert "download.pytorch.org/whl/cpu" in text
    assert "python -m export" in build
    torch_pins = [r for r in PYPROJECT["project"]["optional-dependencies"]["train"] if r.startswith("torch")]
    assert len(torch_pins) == 1 and "==" in torch_pins[0], f"pyproject must pin torch exactly: {torch_pins}"
    runtime_deps = " ".join(PYPROJECT["project"]["dependencies"])
    assert "torch" not in runtime_deps and "onnxruntime" in runtime_deps


def test_dockerfile_gpu_swaps_onnxruntime(stages):
    command = " && ".join(runs(stages["runtime-gpu"]))
    install = command.index("pip install /tmp/src ")
    uninstall = command.index("pip uninstall -y onnxruntime")
    install_gpu = command.index("pip install onnxruntime-gpu")
    assert install < uninstall < install_gpu, "order: pip install ., uninstall onnxruntime, onnxruntime-gpu"
    assert "CUDAExecutionProvider" in command
    env = " ".join(args for keyword, args in stages["runtime-gpu"]["instructions"] if keyword == "ENV")
    assert "TRANSLATOR_DEVICE=cuda" in env


@pytest.mark.parametrize("name", ["runtime", "runtime-gpu"])
def test_dockerfile_runtime_image(stages, name):
    stage = stages[name]
    instructions = stage["instructions"]
    keywords = [k for k, _ in instructions]
    users = [args for k, args in instructions if k == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), f"runs as {users}"
    assert "HEALTHCHECK" in keywords
    healthcheck = next(args for k, args in instructions if k == "HEALTHCHECK")
    probe = copy_destination_of(stage, "deploy/healthcheck.py")
    assert probe and probe in healthcheck, (
        f"HEALTHCHECK {healthcheck!r} does not run the copied probe {probe}"
    )
    assert re.search(r"--start-period=\d+s", healthcheck)
    entry = json.loads(next(args for k, args in instructions if k == "ENTRYPOINT"))
    assert entry == ["python", "-m", "server"]
    exposed = " ".join(args for k, args in instructions if k == "EXPOSE").split()
    assert {"50051", "8000"} <= set(exposed)
    assert any(k == "COPY" and "--from=build" in args and "/bundles/" in args for k, args in instructions)
    env_text = " ".join(args for k, args in instructions if k == "ENV")
    env_names = set(re.findall(r"\b(TRANSLATOR_\w+)=", env_text))
    assert "TRANSLATOR_MODEL_DIR" in env_names
    assert env_names <= server_variables(), f"unknown server variables {env_names - server_variables()}"


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore matching (last match wins, `!` re-includes, `**` any depth)."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        regex = fnmatch.translate(pattern).replace(".*", "[^/]*").replace("[^/]*[^/]*", ".*")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(re.fullmatch(regex, p) for p in prefixes):
            ignored = not negate
    return ignored


def test_dockerfile_copies_exist_in_the_build_context(stages):
    patterns = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert dockerignored("data/train.jsonl", patterns) and dockerignored(".venv/bin/python", patterns)
    assert dockerignored("bundles/en-es-small/manifest.json", patterns)
    assert not dockerignored("deploy/healthcheck.py", patterns)
    args = global_args()
    for stage in stages.values():
        for keyword, line in stage["instructions"]:
            if keyword != "COPY" or "--from" in line:
                continue
            for source in line.split()[:-1]:
                if source.startswith("--"):
                    continue
                source = source.replace("${MODEL_NAME}", args.get("MODEL_NAME", "en-es-small")).rstrip("/")
                path = REPO_ROOT / source
                assert path.exists(), f"COPY {source}: not in the repository"
                files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
                kept = [p for p in files if not dockerignored(str(p.relative_to(REPO_ROOT)), patterns)]
                assert kept, f"COPY {source}: everything is excluded by .dockerignore"
    # The shipped checkpoint the build stage exports must be in the context.
    model = f"models/{args.get('MODEL_NAME', 'en-es-small')}"
    for name in ("config.json", "model.safetensors", "tokenizer.model"):
        assert not dockerignored(f"{model}/{name}", patterns), f"{model}/{name} excluded"


def test_pyproject_builds_a_wheel_with_the_runtime_packages(tmp_path):
    """`pip install .` (what the images run) must work: the packages the server imports are in the
    wheel, tests are not. Built offline from a copy of the sources."""
    pytest.importorskip("setuptools", reason="the build backend (setuptools) is not installed")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, src / name)
    packages = [p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]]
    assert {"runtime", "server", "proto", "client"} <= set(packages), packages
    for package in packages:
        shutil.copytree(REPO_ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    proc = run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            ".",
        ],
        cwd=src,
        timeout=120,
    )
    assert proc.returncode == 0, f"`pip install .` would fail:\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}"
    wheel = next(tmp_path.glob("translator-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    # Every module the server runs on (server/ and the torch-free runtime/ it imports), and the rest.
    serving = [REPO_ROOT / "server", REPO_ROOT / "runtime"]
    modules = [str(f.relative_to(REPO_ROOT)) for d in serving for f in d.rglob("*.py")]
    for needed in (
        *modules,
        "proto/gen/translator/v1/translator_pb2.py",
        "proto/gen/translator/v1/translator_pb2_grpc.py",
        "model/tokenizer.py",
        "client/core.py",
    ):
        assert needed in names, f"{needed} missing from the wheel"
    assert not any(n.startswith("tests/") for n in names)


# ---- health probe -------------------------------------------------------------------------------------


def test_healthcheck_probe(tiny_server, tmp_path):
    """deploy/healthcheck.py as the image runs it: a standalone script (cwd elsewhere), exit 0 only
    when SERVING."""
    probe = str(DEPLOY / "healthcheck.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSLATOR_")}
    ok = run([sys.executable, probe, "--target", tiny_server.target], cwd=tmp_path, env=env, timeout=30)
    assert ok.returncode == 0 and "SERVING" in ok.stdout, ok.stdout + ok.stderr
    env["TRANSLATOR_PORT"] = str(tiny_server.server.port)  # the default target follows the server's port
    ok = run([sys.executable, probe, "-q", "--service", ""], cwd=tmp_path, env=env, timeout=30)
    assert ok.returncode == 0 and not ok.stdout, ok.stdout + ok.stderr
    down = run(
        [sys.executable, probe, "--target", f"127.0.0.1:{free_port()}", "--timeout", "1"],
        cwd=tmp_path,
        env=env,
        timeout=30,
    )
    assert down.returncode == 1 and "UNREACHABLE" in down.stdout, down.stdout + down.stderr


def test_healthcheck_probe_tls(start_server, tiny_bundle, pki):
    from deploy import healthcheck

    server = start_server(
        tiny_bundle,
        tls_cert=str(pki["server_pem"]),
        tls_key=str(pki["server_key"]),
        tls_client_ca=str(pki["ca_pem"]),
        auth_token="s3cret",
    )
    env = {
        "TRANSLATOR_TLS_CERT": str(pki["server_pem"]),
        "TRANSLATOR_HEALTHCHECK_CA": str(pki["ca_pem"]),
        "TRANSLATOR_HEALTHCHECK_CERT": str(pki["client_pem"]),
        "TRANSLATOR_HEALTHCHECK_KEY": str(pki["client_key"]),
    }
    assert healthcheck.check(server.target, env=env) == "SERVING"  # mTLS, and no token needed
    no_client_cert = {k: env[k] for k in ("TRANSLATOR_TLS_CERT", "TRANSLATOR_HEALTHCHECK_CA")}
    assert healthcheck.check(server.target, env=no_client_cert, timeout=2).startswith("UNREACHABLE")
    assert healthcheck.check(server.target, env={}, timeout=2).startswith("UNREACHABLE")  # plaintext
