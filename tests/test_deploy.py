"""Deployment files, checked without a container engine: the Dockerfile against pyproject.toml, the
compose files (Debian's docker-compose and the compose-spec schema), Prometheus config and rules
(promtool, with unit tests for every alert), the Grafana dashboard and provisioning, the Kubernetes
manifests (rendered per overlay, validated against the Kubernetes OpenAPI schemas of
kubernetes-validate), nginx's config (`nginx -t`) and the container health probe against real servers.

Tests that drive a real Prometheus and nginx are in tests/test_deploy_live.py. Binaries come from the
Debian packages in `make system-deps` (prometheus, nginx, docker-compose); a test whose binary is
missing skips and says which package has it.
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

yaml = pytest.importorskip("yaml", reason="PyYAML is needed (pip install pyyaml)")

DEPLOY = REPO_ROOT / "deploy"
DOCKERFILE = REPO_ROOT / "Dockerfile"
COMPOSE = REPO_ROOT / "docker-compose.yml"
COMPOSE_OVERRIDES = [DEPLOY / "compose.gpu.yml", DEPLOY / "compose.tls.yml"]
PROMETHEUS_DIR = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "translator.json"
K8S = DEPLOY / "k8s"
K8S_OVERLAYS = ["overlays/cpu", "overlays/gpu"]
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
    assert args["PYTHON_IMAGE"].startswith("python:3.11-slim"), args
    assert stages["runtime-gpu"]["base"] == "${CUDA_IMAGE}" and args["CUDA_IMAGE"].startswith("nvidia/cuda:")
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
        others = [args for args in installs if args != [project_dir]]
        allowed = [] if name == "runtime" else [["onnxruntime-gpu==${ONNXRUNTIME_GPU_VERSION}"]]
        assert others == allowed, f"{name}: extra packages installed outside pyproject.toml: {others}"
        assert not any("torch" in a for args in installs for a in args), f"{name}: torch in the runtime"
        copies = [args for keyword, args in stage["instructions"] if keyword == "COPY"]
        # Only the packages are copied for the install: no models, tests or data.
        for args in copies:
            assert not re.search(r"\b(models|tests|data)/", args), f"{name}: copies {args}"
    # The build stage: torch pinned by pyproject's `train` extra, from the PyTorch CPU index.
    build = " ".join(runs(stages["build"]))
    assert 'pip install ".[train]"' in build
    assert '["optional-dependencies"]["train"]' in build and "torch==" in build
    assert re.search(r"--index-url \"?\$\{TORCH_INDEX_URL\}", build)
    assert "download.pytorch.org/whl/cpu" in text
    assert "python -m export" in build
    torch_pins = [r for r in PYPROJECT["project"]["optional-dependencies"]["train"] if r.startswith("torch")]
    assert len(torch_pins) == 1 and "==" in torch_pins[0], f"pyproject must pin torch exactly: {torch_pins}"
    runtime_deps = " ".join(PYPROJECT["project"]["dependencies"])
    assert "torch" not in runtime_deps and "onnxruntime" in runtime_deps


def test_dockerfile_gpu_swaps_onnxruntime(stages):
    command = " && ".join(runs(stages["runtime-gpu"]))
    install = command.index("pip install /tmp/src")
    uninstall = command.index("pip uninstall -y onnxruntime")
    install_gpu = command.index('pip install "onnxruntime-gpu==')
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
    for package in ("model", "export", "server", "proto", "client"):
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
    for needed in (
        "server/__main__.py",
        "server/engine.py",
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


# ---- compose ------------------------------------------------------------------------------------------


def compose_variants() -> list[tuple[list[Path], list[str]]]:
    """(files, profile args): the default stack, scale-out, GPU with scale-out, TLS."""
    gpu, tls = COMPOSE_OVERRIDES
    scale = ["--profile", "scale"]
    return [([COMPOSE], []), ([COMPOSE], scale), ([COMPOSE, gpu], scale), ([COMPOSE, tls], [])]


def test_compose_config_validates_with_docker_compose(tmp_path):
    """Debian's docker-compose parses, interpolates and validates without a Docker engine."""
    binary = need("docker-compose", "docker-compose")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "COMPOSE_"))}
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-engine.sock"  # proves no engine is needed
    procs = []
    for files, profile in compose_variants():
        cmd = [binary, "--project-directory", str(REPO_ROOT)]
        for f in files:
            cmd += ["-f", str(f)]
        cmd += [*profile, "config", "-q"]
        proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        procs.append((cmd, proc))
    for cmd, proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"{' '.join(cmd[1:])}:\n{out}{err}"


def compose_spec_schema() -> dict:
    candidates = [Path("/usr/lib/python3/dist-packages/compose/config/compose_spec.json")]
    try:
        import compose.config  # type: ignore[import-not-found]

        candidates.insert(0, Path(compose.config.__file__).parent / "compose_spec.json")
    except ImportError:
        pass
    for path in candidates:
        if path.is_file():
            return json.loads(path.read_text())
    pytest.skip("compose-spec schema not found (apt-get install docker-compose ships compose_spec.json)")


def test_compose_files_match_the_compose_spec_schema():
    jsonschema = pytest.importorskip(
        "jsonschema", reason="pip install jsonschema (kubernetes-validate has it)"
    )

    schema = compose_spec_schema()
    # The file names its draft with a trailing '#' ("http://json-schema.org/draft/2019-09/schema#").
    schema["$schema"] = schema.get("$schema", "").rstrip("#")
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft201909Validator)(schema)
    for path in [COMPOSE, *COMPOSE_OVERRIDES]:
        errors = [
            f"{'/'.join(map(str, e.path))}: {e.message}"
            for e in validator.iter_errors(yaml.safe_load(path.read_text()))
        ]
        assert not errors, f"{path.name}: {errors}"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_services(compose, stages):
    services = compose["services"]
    assert {"translator", "prometheus", "grafana", "translator-replica", "nginx"} <= set(services)
    for name, service in services.items():
        assert service.get("init") is True, f"{name}: init"
        assert service.get("restart") in ("unless-stopped", "always", "on-failure"), f"{name}: restart"
        assert service.get("healthcheck", {}).get("test"), f"{name}: healthcheck"
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith("./"):
                assert (REPO_ROOT / source).exists(), f"{name}: mounts missing {source}"
        if "build" in service:
            assert service["build"]["target"] in stages
    # Default `docker compose up`: translator + Prometheus + Grafana; scale-out only with the profile.
    default = {n for n, s in services.items() if not s.get("profiles")}
    assert default == {"translator", "prometheus", "grafana"}
    assert services["translator-replica"]["profiles"] == ["scale"] == services["nginx"]["profiles"]
    translator = services["translator"]
    assert {p.rsplit(":", 1)[-1] for p in translator["ports"]} == {"50051", "8000"}
    probe = translator["healthcheck"]["test"]
    assert probe[:2] == ["CMD", "python"] and probe[2] == copy_destination_of(
        stages["runtime"], "deploy/healthcheck.py"
    )
    # depends_on with conditions along the chain.
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"
    assert services["nginx"]["depends_on"]["translator-replica"]["condition"] == "service_healthy"
    assert "condition" in services["prometheus"]["depends_on"]["translator"]
    assert "translator-replica" not in str(services["translator-replica"].get("ports", ""))
    assert not services["translator-replica"].get("ports"), "replicas are reached through nginx only"


def test_compose_environment_is_the_servers(compose):
    """Every TRANSLATOR_* variable set in compose is one the server (or the probe) reads, and the
    documented knobs (model dir, batching budget and wait, queue, threads, TLS, token) are there."""
    known = server_variables() | HEALTHCHECK_VARIABLES
    for path in [COMPOSE, *COMPOSE_OVERRIDES]:
        for name, service in yaml.safe_load(path.read_text())["services"].items():
            env = service.get("environment", {})
            names = {k for k in env if k.startswith("TRANSLATOR_")}
            assert names <= known, f"{path.name} {name}: unknown {names - known}"
    env = compose["services"]["translator"]["environment"]
    for needed in (
        "TRANSLATOR_MODEL_DIR",
        "TRANSLATOR_MAX_BATCH_TOKENS",
        "TRANSLATOR_MAX_WAIT_MS",
        "TRANSLATOR_MAX_QUEUE_SEGMENTS",
        "TRANSLATOR_THREADS",
        "TRANSLATOR_TLS_CERT",
        "TRANSLATOR_TLS_KEY",
        "TRANSLATOR_AUTH_TOKEN",
    ):
        assert needed in env, needed
    assert str(env["TRANSLATOR_PORT"]) == "50051" and str(env["TRANSLATOR_METRICS_PORT"]) == "8000"


def test_compose_gpu_override(stages):
    gpu = yaml.safe_load((DEPLOY / "compose.gpu.yml").read_text())["services"]
    for name in ("translator", "translator-replica"):
        service = gpu[name]
        assert service["build"]["target"] == "runtime-gpu" and "runtime-gpu" in stages
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
        assert service["environment"]["TRANSLATOR_DEVICE"] == "cuda"


def test_prometheus_discovers_every_compose_replica(compose):
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "translator")
    (sd,) = job["dns_sd_configs"]
    assert set(sd["names"]) == {"translator", "translator-replica"} <= set(compose["services"])
    assert sd["type"] == "A" and sd["port"] == int(
        compose["services"]["translator"]["environment"]["TRANSLATOR_METRICS_PORT"]
    )
    prometheus = compose["services"]["prometheus"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]


# ---- Prometheus ---------------------------------------------------------------------------------------


def test_promtool_check_config_and_rules():
    promtool = need("promtool", "prometheus")
    proc = run([promtool, "check", "config", "prometheus.yml"], cwd=PROMETHEUS_DIR)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rule_files = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
    assert rule_files
    proc = run([promtool, "check", "rules", *map(str, rule_files)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_rule_unit_tests_cover_every_alert():
    promtool = need("promtool", "prometheus")
    tests = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))
    proc = run([promtool, "test", "rules", *map(str, tests)])
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr
    alerts = {
        rule["alert"]
        for path in (PROMETHEUS_DIR / "rules").glob("*.yml")
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    assert {
        "TranslatorInstanceDown",
        "TranslatorHighErrorRate",
        "TranslatorHighLatency",
        "TranslatorQueueSaturated",
    } <= alerts
    fired = {
        case["alertname"]
        for path in tests
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts <= fired, f"alerts without a firing unit test: {alerts - fired}"


# ---- Grafana ------------------------------------------------------------------------------------------


def exported_metric_names() -> set[str]:
    """Sample names the server exports (a fresh Metrics registry, with histogram/counter suffixes)."""
    from server.metrics import Metrics

    names = set()
    for family in Metrics().registry.collect():
        for sample in family.samples:
            names.add(sample.name)
        names.add(family.name)
    # Histograms without observations still have _bucket/_sum/_count, labelled ones no samples yet.
    for family in Metrics().registry.collect():
        if family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count")}
        if family.type == "counter":
            names.add(family.name + "_total")
    return names


def referenced_metrics(expr: str) -> set[str]:
    expr = re.sub(r"\{[^}]*\}", "{}", expr)  # label matchers are not metric names
    return set(re.findall(r"\b((?:translator|process)_[a-z_]+)\b", expr))


def test_dashboard_panels_and_queries():
    from deploy.promstack import grafana_to_promql, panel_targets

    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24 and g["w"] > 0 and g["h"] > 0, panel["title"]
        assert panel.get("targets"), f"{panel['title']}: no queries"
    titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
    for needed in (
        "request rate by status",
        "latency",
        "queue depth",
        "queue wait",
        "batch size",
        "tokens / s",
        "in-flight",
        "errors",
    ):
        assert needed in titles, f"no {needed!r} panel in {titles}"
    latency = next(p for p in dashboard["panels"] if p["title"].startswith("Latency"))
    quantiles = {re.search(r"histogram_quantile\((0\.\d+)", t["expr"]).group(1) for t in latency["targets"]}
    assert {"0.50", "0.95", "0.99"} <= quantiles
    exported = exported_metric_names()
    for panel, target in panel_targets(dashboard):
        assert target["datasource"]["uid"] == "${datasource}"
        promql = grafana_to_promql(target["expr"])  # raises on unknown Grafana variables
        unknown = referenced_metrics(promql) - exported
        assert not unknown, f"{panel['title']}: the server exports no {unknown}"


def test_rules_reference_exported_metrics():
    from deploy.promstack import rule_expressions

    exported = exported_metric_names()
    for name, expr in rule_expressions():
        unknown = referenced_metrics(expr) - exported
        assert not unknown, f"{name}: the server exports no {unknown}"


def test_grafana_provisioning(compose):
    grafana = compose["services"]["grafana"]
    mounts = dict(m.rsplit(":", 1)[0].split(":", 1) for m in grafana["volumes"] if m.startswith("./"))
    datasources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (ds,) = datasources["datasources"]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090" and ds["uid"] == "prometheus"
    dashboard = json.loads(DASHBOARD.read_text())
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "datasource")
    assert variable["query"] == "prometheus" and variable["current"]["value"] == ds["uid"]
    providers = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/translator.yml").read_text())
    path = providers["providers"][0]["options"]["path"]
    assert mounts["./deploy/grafana/dashboards"] == path
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == f"{path}/translator.json"
    assert "GRAFANA_ADMIN_PASSWORD" in grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert any(p.endswith(":3000") for p in grafana["ports"])


# ---- nginx --------------------------------------------------------------------------------------------


def test_nginx_config_syntax(tmp_path):
    from tests.test_deploy_live import loopback_nginx_config

    nginx = need("nginx", "nginx")
    conf = loopback_nginx_config(tmp_path, [free_port(), free_port()], free_port(), free_port())
    proc = run([nginx, "-t", "-p", f"{tmp_path}/", "-c", str(conf), "-e", "stderr"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (DEPLOY / "nginx" / "nginx.conf").read_text()
    assert "grpc_pass grpc://translator;" in text and re.search(r"listen 50051 http2", text)
    upstream = (DEPLOY / "nginx" / "upstream.compose.conf").read_text()
    assert re.search(r"keepalive \d+;", upstream) and "server translator-replica:50051 resolve" in upstream
    assert "127.0.0.11" in upstream  # Docker's DNS


# ---- Kubernetes ---------------------------------------------------------------------------------------


def render_k8s(directory: str) -> list[dict]:
    from deploy.k8s.render import render

    return render(K8S / directory)


def by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


@pytest.mark.parametrize("overlay", K8S_OVERLAYS)
def test_k8s_manifests_validate(overlay):
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    from kubernetes_validate import utils

    docs = render_k8s(overlay)
    # gRPC probes are GA since 1.27: validate against that and the newest schemas shipped.
    versions = sorted(
        {v for v in utils.all_versions() if tuple(map(int, v.split(".")[:2])) >= (1, 27)},
        key=lambda v: tuple(map(int, v.split("."))),
    )
    for version in (versions[0], versions[-1]):
        for doc in docs:
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as e:
                pytest.fail(f"{overlay} {doc['kind']}/{doc['metadata']['name']} (Kubernetes {version}): {e}")


@pytest.mark.parametrize("overlay", K8S_OVERLAYS)
def test_k8s_workload(overlay):
    docs = by_kind(render_k8s(overlay))
    assert set(docs) >= {
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "ConfigMap",
        "PodDisruptionBudget",
    }
    (deployment,) = docs["Deployment"]
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 50051, "metrics": 8000}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["grpc"]["port"] == 50051, probe
    assert container["readinessProbe"]["grpc"]["service"] == "translator.v1.Translator"
    annotations = pod["metadata"]["annotations"]
    assert (
        annotations["prometheus.io/scrape"] == "true"
        and int(annotations["prometheus.io/port"]) == ports["metrics"]
    )
    requests = container["resources"]["requests"]
    assert "cpu" in requests and "memory" in requests
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] != 0
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    # Configuration: known server variables only.
    (config,) = docs["ConfigMap"]
    env_names = set(config["data"]) | {e["name"] for e in container["env"]}
    assert env_names <= server_variables(), env_names - server_variables()
    grace = float(config["data"]["TRANSLATOR_DRAIN_DELAY_S"]) + float(
        config["data"]["TRANSLATOR_SHUTDOWN_GRACE_S"]
    )
    assert pod["spec"]["terminationGracePeriodSeconds"] > grace
    for service in docs["Service"]:
        assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
    (hpa,) = docs["HorizontalPodAutoscaler"]
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 1 and hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    if overlay.endswith("gpu"):
        assert container["image"].endswith(":gpu")
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert any(t["key"] == "nvidia.com/gpu" for t in pod["spec"]["tolerations"])
        assert config["data"]["TRANSLATOR_DEVICE"] == "cuda"
    else:
        assert container["image"].endswith(":cpu") and "nvidia.com/gpu" not in str(container["resources"])
        assert config["data"]["TRANSLATOR_DEVICE"] == "cpu"


def test_k8s_service_monitor():
    docs = by_kind(render_k8s("monitoring"))
    (monitor,) = docs["ServiceMonitor"]
    services = by_kind(render_k8s("base"))["Service"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    matched = [s for s in services if all(s["metadata"]["labels"].get(k) == v for k, v in selector.items())]
    assert matched
    port_names = {p["name"] for s in matched for p in s["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= port_names


@pytest.mark.parametrize("overlay", ["base", *K8S_OVERLAYS, "monitoring"])
def test_k8s_render_matches_kubectl_kustomize(overlay):
    kubectl = need("kubectl", "kubectl")
    proc = run([kubectl, "kustomize", str(K8S / overlay)], timeout=60)
    assert proc.returncode == 0, proc.stderr

    def key(d):
        return d["kind"], d["metadata"]["name"]

    expected = {key(d): d for d in yaml.safe_load_all(proc.stdout) if d}
    assert {key(d): d for d in render_k8s(overlay)} == expected


# ---- Makefile and scripts -----------------------------------------------------------------------------


def test_makefile_system_deps():
    text = (REPO_ROOT / "Makefile").read_text()
    block = text[text.index("\nsystem-deps:") :].split("\n\n")[0]
    for package in ("prometheus", "apertium", "apertium-eng-spa", "nginx", "docker-compose"):
        assert re.search(rf"\s{re.escape(package)}(\s|$)", block), f"system-deps lacks {package}"


def test_podman_script_syntax():
    script = DEPLOY / "podman-up.sh"
    proc = run(["bash", "-n", str(script)])
    assert proc.returncode == 0, proc.stderr
    assert os.access(script, os.X_OK)
