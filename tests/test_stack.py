"""The container path: the files deploy/stack.sh and the Dockerfile rely on (static), and the whole compose
stack run for real by deploy/stack_test.py (`make stack-test`) wherever podman or Docker can run
containers: images, health, translations through the published ports, Prometheus scraping every
container, calls through nginx, drain on SIGTERM, a clean `down`.

The live test is skipped, with the reason, where no engine can run containers (`make stack-test` installs
podman & co on Debian as root); TRANSLATOR_STACK_TEST=0 skips it on purpose.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

yaml = pytest.importorskip("yaml", reason="PyYAML is needed (pip install pyyaml)")

DEPLOY = REPO_ROOT / "deploy"
STACK = DEPLOY / "stack.sh"
COMPOSE = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())


def constraints() -> dict[str, str]:
    out = {}
    for line in (DEPLOY / "build" / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            out[name] = version
    return out


def test_one_onnxruntime_version_for_cpu_and_gpu_images():
    pins = constraints()
    assert pins["onnxruntime"] == pins["onnxruntime-gpu"], pins
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    # Every stage that installs with pip reads the constraints (pip-env.sh sets PIP_CONSTRAINT).
    stages = re.split(r"\nFROM ", dockerfile)[1:]
    for stage in stages:
        for run in re.findall(r"\nRUN (.*?)(?=\n[A-Z]+ |\Z)", stage, re.S):
            if re.search(r"\bpip install\b", run):
                assert "--mount=type=bind,source=deploy/build,target=/mnt/build" in run, stage[:40]
                assert ". /mnt/build/pip-env.sh" in run and "id=pip-ca" in run, stage[:40]
    assert "PIP_CONSTRAINT=/mnt/build/constraints.txt" in (DEPLOY / "build" / "pip-env.sh").read_text()
    assert "ONNXRUNTIME_GPU_VERSION" not in dockerfile, "a second ONNX Runtime pin"
    # The CUDA major of the base image is the one the pinned onnxruntime-gpu is built for (12 up to 1.26).
    cuda = re.search(r"ARG CUDA_IMAGE=\S+:(\d+)\.", dockerfile).group(1)
    major, minor = map(int, pins["onnxruntime-gpu"].split(".")[:2])
    assert cuda == ("12" if (major, minor) <= (1, 26) else "13"), (cuda, pins)


def test_build_context_keeps_the_build_mount_and_nothing_big():
    from tests.test_deploy_image import dockerignored

    patterns = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for path in ("deploy/build/pip-env.sh", "deploy/build/constraints.txt", "deploy/build/wheelhouse/x.whl"):
        assert not dockerignored(path, patterns), path
    assert dockerignored("deploy/stack.sh", patterns) and dockerignored("deploy/nginx/nginx.conf", patterns)
    assert "# syntax=" not in (REPO_ROOT / "Dockerfile").read_text(), "a frontend image to pull"


def test_image_names_are_fully_qualified():
    """podman on Debian has no default search registries: `prom/prometheus` does not resolve."""
    names = []
    for service in COMPOSE["services"].values():
        image = service["image"]
        default = re.fullmatch(r"\$\{\w+:-(.+)\}", image)
        names.append(default.group(1) if default else image)
    names += re.findall(r"ARG \w+_IMAGE=(\S+)", (REPO_ROOT / "Dockerfile").read_text())
    names += re.findall(r"^OFFICIAL_\w+=(\S+)", STACK.read_text(), re.M)
    for image in names:
        first = image.split("/")[0]
        assert "/" in image and ("." in first or first == "localhost") or image == "translator:cpu", image


def test_compose_for_podman_compose():
    services = COMPOSE["services"]
    assert services["translator-replica"]["deploy"] == {"mode": "replicated", "replicas": 2}
    nginx = services["nginx"]
    assert nginx["command"] == ["/bin/sh", "/etc/nginx/translator/start.sh"]
    assert "./deploy/nginx:/etc/nginx/translator:ro" in nginx["volumes"]
    translator = services["translator"]
    assert translator["stop_grace_period"] == "30s" and translator["read_only"] is True
    start = (DEPLOY / "nginx" / "start.sh").read_text()
    assert "/etc/resolv.conf" in start and "127\\.0\\.0\\.11" in start


def test_stack_script():
    for script in (STACK, DEPLOY / "podman-up.sh"):
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert os.access(script, os.X_OK), script
    text = STACK.read_text()
    assert "podman build --format docker" in text  # HEALTHCHECK survives
    assert "compose --profile scale down" in text  # the replicas go too
    assert not re.search(r"^\s*exec podman-compose", text, re.M)  # the cleanup still runs
    assert "trap 'rm -rf \"$rootfs\"' EXIT" in text
    sh = subprocess.run(["sh", "-n", str(DEPLOY / "nginx" / "start.sh")], capture_output=True, text=True)
    assert sh.returncode == 0, sh.stderr


def engine_problem() -> str | None:
    """Why no container can run here, or None."""
    if os.environ.get("TRANSLATOR_STACK_TEST") == "0":
        return "TRANSLATOR_STACK_TEST=0"
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "info"], capture_output=True, timeout=30).returncode == 0:
        return None
    if not shutil.which("podman"):
        return "neither Docker (a running engine) nor podman is here: `make stack-test` installs podman"
    if os.geteuid() != 0:
        return "podman needs root here (debootstrap of the base image, cgroupfs)"

    def stack(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(STACK), command], capture_output=True, text=True, cwd=REPO_ROOT, timeout=900
        )

    proc = stack("env")
    if proc.returncode != 0:
        # podman is here: what else it needs (podman-compose from PyPI into .venv, a plugin) is small.
        deps = stack("deps")
        proc = stack("env")
        if proc.returncode != 0:
            return f"deploy/stack.sh cannot run: {(deps.stderr + proc.stderr).strip()[-300:]}"
    return None


def test_stack_end_to_end():
    """deploy/stack_test.py: the stack with its scale profile, end to end (minutes; see docs/deploy.md)."""
    problem = engine_problem()
    if problem:
        pytest.skip(problem)
    proc = subprocess.run(
        [sys.executable, "-m", "deploy.stack_test"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    tail = proc.stdout[-6000:] + "\n" + proc.stderr[-6000:]
    assert proc.returncode == 0, tail
    assert re.search(r"^\d+ passed, 0 failed$", proc.stdout, re.M), tail


def test_stop_timeouts_cover_the_drain():
    """A plain `docker stop` / `podman stop` (10 s) covers the image's drain delay + grace; compose's
    stop_grace_period covers its own (defaults 2 + 20 s)."""
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    for stage in re.split(r"\nFROM ", dockerfile)[2:]:  # the two runtime stages
        drain = float(re.search(r"TRANSLATOR_DRAIN_DELAY_S=(\d+)", stage).group(1))
        grace = float(re.search(r"TRANSLATOR_SHUTDOWN_GRACE_S=(\d+)", stage).group(1))
        assert drain + grace < 10, (drain, grace)
    env = COMPOSE["x-translator-environment"]
    drain = float(re.search(r":-(\d+)", env["TRANSLATOR_DRAIN_DELAY_S"]).group(1))
    grace = float(re.search(r":-(\d+)", env["TRANSLATOR_SHUTDOWN_GRACE_S"]).group(1))
    assert drain + grace < int(COMPOSE["services"]["translator"]["stop_grace_period"].rstrip("s"))
    assert "stop_timeout = 30" in STACK.read_text()
