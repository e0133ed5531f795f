"""The compose stack for real (`make stack-test`): images, start, health, traffic, scrape, scale-out, stop.

    python -m deploy.stack_test [--no-scale] [--keep] [--json FILE]

Runs deploy/stack.sh with Docker or podman, whichever runs here (podman from Debian with a debootstrapped
base image and Prometheus/nginx built from Debian packages when no registry can be reached; Docker with
the registry images elsewhere), as compose project `translator-stacktest` with every port published on
127.0.0.1 at a free port, and checks:

1. the images: built, translator's HEALTHCHECK kept (podman needs `--format docker`), uid 10001;
2. health: every translator container passes its image's health check (run here: podman without
   systemd never runs health checks itself) and Prometheus / nginx / Grafana answer theirs;
3. a translation through the published ports: HTTP `POST /translate` and gRPC `Translate`;
4. Prometheus scrapes every translator container: `/api/v1/targets` lists exactly one healthy target
   per container (no stale series from an earlier run: the volume is dropped before and after), and
   every rule group loads;
5. scale-out (profile `scale`): 16 gRPC calls through nginx all answer, served by both replicas;
6. SIGTERM drains: the translator stops with status 0 well inside its stop timeout;
7. a clean `down -v`: no container, pod, network or volume of the project is left.

Exit status 0 when everything passed; the last line is `N passed, N failed`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STACK = REPO / "deploy" / "stack.sh"
PROJECT = "translator-stacktest"
SENTENCE = "Open the file"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    def __init__(self, scale: bool) -> None:
        self.scale = scale
        self.ports = {
            name: free_port() for name in ("grpc", "http", "metrics", "lb", "prometheus", "grafana")
        }
        self.env = dict(os.environ, COMPOSE_PROJECT_NAME=PROJECT)
        for var, name in [
            ("TRANSLATOR_GRPC_PUBLISH", "grpc"),
            ("TRANSLATOR_HTTP_PUBLISH", "http"),
            ("TRANSLATOR_METRICS_PUBLISH", "metrics"),
            ("TRANSLATOR_LB_PUBLISH", "lb"),
            ("PROMETHEUS_PUBLISH", "prometheus"),
            ("GRAFANA_PUBLISH", "grafana"),
        ]:
            self.env[var] = f"127.0.0.1:{self.ports[name]}"
        settings = self.sh("env", capture=True).stdout
        self.env.update(dict(shlex.split(line)[0].split("=", 1) for line in settings.splitlines() if line))
        self.engine = self.env["CONTAINER_ENGINE"]
        self.passed: list[str] = []
        self.failed: list[str] = []
        self.times: dict[str, float] = {}

    def sh(self, *args: str, capture: bool = False, timeout: float = 1800) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(STACK), *args],
            cwd=REPO,
            env=self.env,
            text=True,
            timeout=timeout,
            capture_output=capture,
            check=not capture,
        )

    def engine_run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.sh("engine", *args, capture=True, timeout=timeout)

    def containers(self, service: str) -> list[str]:
        out = self.engine_run(
            "ps",
            "--filter",
            f"label=com.docker.compose.project={PROJECT}",
            "--filter",
            f"label=com.docker.compose.service={service}",
            "--format",
            "{{.Names}}",
        ).stdout
        return sorted(out.split())

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        (self.passed if ok else self.failed).append(name)
        print(
            f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail[-3000:] if detail and not ok else ''}",
            flush=True,
        )
        return ok

    # ---- probes ------------------------------------------------------------------------------------

    def healthy(self, container: str) -> bool:
        """The image's own health check, run now (podman) or as last reported (Docker)."""
        if self.engine == "podman":
            return self.engine_run("healthcheck", "run", container, timeout=60).returncode == 0
        out = self.engine_run("inspect", "-f", "{{.State.Health.Status}}", container).stdout.strip()
        return out == "healthy"

    def wait(self, what: str, predicate, timeout: float) -> bool:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            try:
                if predicate():
                    self.times[what] = round(time.monotonic() - start, 1)
                    return True
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(1)
        return False

    def http(self, port_name: str, path: str, data: dict | None = None, timeout: float = 10) -> dict:
        body = json.dumps(data).encode() if data is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.ports[port_name]}{path}",
            data=body,
            headers={"Content-Type": "application/json"} if body else {},
        )
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            text = reply.read().decode()
        return json.loads(text) if text.strip().startswith(("{", "[")) else {"text": text}

    def logs(self, container: str) -> str:
        proc = self.engine_run("logs", container)
        return proc.stdout + proc.stderr

    # ---- the run -----------------------------------------------------------------------------------

    def up(self) -> None:
        start = time.monotonic()
        self.sh("images")
        self.times["images"] = round(time.monotonic() - start, 1)
        start = time.monotonic()
        self.env["STACK_REBUILD"] = "0"  # built just now
        self.sh("up", *(["--profile", "scale"] if self.scale else []))
        self.times["up"] = round(time.monotonic() - start, 1)

    def checks(self) -> None:
        image = self.env.get("TRANSLATOR_IMAGE", "translator:cpu")
        inspect = json.loads(self.engine_run("image", "inspect", image).stdout)[0]
        # Docker: Config.Healthcheck; podman: Healthcheck (an OCI-format build drops it).
        health = inspect.get("Healthcheck") or inspect["Config"].get("Healthcheck") or {}
        self.check(
            "image keeps its HEALTHCHECK",
            "/opt/translator/healthcheck.py" in health.get("Test", []),
            str(inspect),
        )
        self.times["image size MB"] = round(inspect["Size"] / 1e6)
        (translator,) = self.containers("translator")
        ok = self.wait("translator healthy", lambda: self.healthy(translator), 180)
        if not self.check("translator healthy (image health check)", ok, self.logs(translator)[-2000:]):
            return
        uid = self.engine_run("exec", translator, "id", "-u").stdout.strip()
        self.check("runs as uid 10001", uid == "10001", uid)

        reply = self.http("http", "/translate", {"q": SENTENCE, "source": "en", "target": "es"})
        text = reply.get("translatedText", "")
        self.check("HTTP POST /translate through the published port", bool(text) and text != SENTENCE, text)
        sys.path.insert(0, str(REPO))
        from client import TranslatorClient

        with TranslatorClient(f"127.0.0.1:{self.ports['grpc']}", timeout=30) as client:
            grpc_text = client.translate_text(SENTENCE)
        self.check(
            "gRPC Translate through the published port", grpc_text == text, f"{grpc_text!r} vs {text!r}"
        )
        self.check("health of HTTP /health", "status" in json.dumps(self.http("http", "/health")).lower())

        translators = [translator, *(self.containers("translator-replica") if self.scale else [])]
        if self.scale:
            replicas = translators[1:]
            self.check("two replicas started (deploy.mode: replicated)", len(replicas) == 2, str(replicas))
            ok = all(self.wait(f"{r} healthy", lambda r=r: self.healthy(r), 180) for r in replicas)
            self.check("replicas healthy", ok)
        self.prometheus(len(translators))
        if self.scale:
            self.nginx()
        if self.env.get("GRAFANA_IMAGE") != "" and self.containers("grafana"):
            ok = self.wait(
                "grafana", lambda: self.http("grafana", "/api/health").get("database") == "ok", 120
            )
            self.check("Grafana healthy", ok)
        self.check(
            "no ONNX Runtime telemetry warning (home directory)",
            "Failed to persist telemetry" not in self.logs(translator),
        )
        self.drain(translator)

    def prometheus(self, expected: int) -> None:
        (container,) = self.containers("prometheus")
        ok = self.wait("prometheus ready", lambda: self.http("prometheus", "/-/ready").get("text", ""), 120)
        self.check("Prometheus ready", ok and self.healthy(container) or ok and self.engine == "docker")

        def targets() -> list[dict]:
            data = self.http("prometheus", "/api/v1/targets?state=active")["data"]["activeTargets"]
            return [t for t in data if t["labels"]["job"] == "translator"]

        def all_up() -> bool:
            found = targets()
            return len(found) == expected and all(t["health"] == "up" for t in found)

        ok = self.wait("prometheus scrapes", all_up, 120)
        found = [(t["labels"]["instance"], t["health"]) for t in targets()]
        self.check(f"Prometheus scrapes all {expected} translator containers", ok, str(found))
        result = self.http(
            "prometheus", "/api/v1/query?query=" + urllib.request.quote('up{job="translator"}')
        )
        series = result["data"]["result"]
        self.check("one `up` series per container", len(series) == expected, str(series))
        groups = self.http("prometheus", "/api/v1/rules")["data"]["groups"]
        bad = [r["name"] for g in groups for r in g["rules"] if r.get("health") not in ("ok", "unknown")]
        self.check("every rule loads", bool(groups) and not bad, str(bad))

    def nginx(self) -> None:
        (container,) = self.containers("nginx")
        self.wait("nginx ready", lambda: self.healthy(container), 60)
        from client import TranslatorClient

        answers = []
        with TranslatorClient(f"127.0.0.1:{self.ports['lb']}", timeout=30) as client:
            for _ in range(16):
                answers.append(client.translate_text(SENTENCE))
        self.check("16 calls through nginx", len(answers) == 16 and all(answers), str(set(answers)))
        upstreams = set()
        for line in self.logs(container).splitlines():
            if line.startswith("{") and "Translate" in line:
                upstreams.add(json.loads(line).get("upstream"))
        self.check("nginx spread the calls over both replicas", len(upstreams) >= 2, str(upstreams))

    def drain(self, translator: str) -> None:
        start = time.monotonic()
        self.engine_run("stop", translator, timeout=60)
        took = time.monotonic() - start
        self.times["translator stop"] = round(took, 1)
        state = json.loads(self.engine_run("inspect", translator).stdout)[0]["State"]
        logs = self.logs(translator)
        ok = state.get("ExitCode") == 0 and took < 20 and '"stopped"' in logs
        self.check(
            "SIGTERM drains: exit 0, within the stop timeout", ok, f"{took:.1f} s, {state.get('ExitCode')}"
        )

    def down(self) -> None:
        start = time.monotonic()
        proc = self.sh("down", "-v", capture=True, timeout=300)
        self.times["down"] = round(time.monotonic() - start, 1)
        volumes = self.engine_run("volume", "ls", "--format", "{{.Name}}").stdout.split()
        left = [v for v in volumes if v.startswith(PROJECT)]
        self.check("clean down -v", proc.returncode == 0 and not left, proc.stderr[-1000:] + str(left))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stack_test", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--no-scale", action="store_true", help="without the `scale` profile (replicas, nginx)"
    )
    parser.add_argument("--keep", action="store_true", help="leave the stack running")
    parser.add_argument("--json", help="write checks and timings here")
    args = parser.parse_args(argv)
    start = time.monotonic()
    stack = Stack(scale=not args.no_scale)
    print(f"stack test: {stack.engine}, project {PROJECT}, ports {stack.ports}", flush=True)
    stack.sh("down", "-v", capture=True, timeout=300)  # a clean start: no stale Prometheus series
    try:
        stack.up()
        stack.checks()
    except (subprocess.SubprocessError, OSError, ValueError, KeyError) as e:
        stack.check("stack ran", False, repr(e))
    finally:
        if stack.failed:
            for service in ("translator", "translator-replica", "prometheus", "nginx", "grafana"):
                for container in stack.containers(service):
                    print(f"---- {container}\n{stack.logs(container)[-3000:]}", file=sys.stderr)
        if not args.keep:
            stack.down()
    stack.times["total"] = round(time.monotonic() - start, 1)
    print(f"times (s): {stack.times}")
    if args.json:
        Path(args.json).write_text(json.dumps(vars(stack) | {"env": None}, indent=2, default=str))
    print(f"{len(stack.passed)} passed, {len(stack.failed)} failed")
    return 1 if stack.failed else 0


if __name__ == "__main__":
    sys.exit(main())
