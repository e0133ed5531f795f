"""Deployment files around the image, checked without a container engine: the compose files
(Debian's docker-compose and the compose-spec schema), Prometheus config and rules (promtool, with unit
tests for every alert), the Grafana dashboard and provisioning, nginx's config (`nginx -t`), the
Kubernetes manifests (rendered per overlay, validated against the Kubernetes OpenAPI schemas of
kubernetes-validate), the Makefile and scripts.

The image itself (Dockerfile, wheel, health probe) is checked in tests/test_deploy_image.py; tests that
drive a real Prometheus and nginx are in tests/test_deploy_live.py. Binaries come from the Debian
packages in `make system-deps` (prometheus, nginx, docker-compose); a test whose binary is missing
skips and says which package has it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests import test_deploy_image
from tests.conftest import REPO_ROOT, free_port
from tests.test_deploy_image import HEALTHCHECK_VARIABLES, copy_destination_of, need, run, server_variables

stages = test_deploy_image.stages  # fixture: the Dockerfile's stages by name

yaml = pytest.importorskip("yaml", reason="PyYAML is needed (pip install pyyaml)")

DEPLOY = REPO_ROOT / "deploy"
COMPOSE = REPO_ROOT / "docker-compose.yml"
COMPOSE_OVERRIDES = [DEPLOY / "compose.gpu.yml", DEPLOY / "compose.tls.yml"]
PROMETHEUS_DIR = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "translator.json"
K8S = DEPLOY / "k8s"
K8S_OVERLAYS = ["overlays/cpu", "overlays/gpu"]


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
    assert {p.rsplit(":", 1)[-1] for p in translator["ports"]} == {"50051", "5000", "8000"}
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
    assert ports == {"grpc": 50051, "metrics": 8000, "http": 5000}
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
