"""The HTTP API's port in the deployment files: compose, the image, the Kubernetes Service, Deployment
and ConfigMap (static, no engine)."""

from __future__ import annotations

import pytest

from tests.conftest import REPO_ROOT

yaml = pytest.importorskip("yaml", reason="PyYAML is needed (pip install pyyaml)")

HTTP_PORT = 5000  # LibreTranslate's usual port


def test_compose_publishes_the_http_port():
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    translator = compose["services"]["translator"]
    assert translator["environment"]["TRANSLATOR_HTTP_PORT"] == HTTP_PORT
    assert {p.rsplit(":", 1)[-1] for p in translator["ports"]} == {"50051", str(HTTP_PORT), "8000"}
    assert not compose["services"]["translator-replica"].get("ports")


def test_image_exposes_the_http_port():
    exposed = [
        line.split()[1:]
        for line in (REPO_ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("EXPOSE")
    ]
    assert exposed and all(str(HTTP_PORT) in ports for ports in exposed)


@pytest.mark.parametrize("overlay", ["overlays/cpu", "overlays/gpu"])
def test_k8s_service_and_deployment_carry_the_http_port(overlay):
    from deploy.k8s.render import render

    docs = render(REPO_ROOT / "deploy" / "k8s" / overlay)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 50051, "metrics": 8000, "http": HTTP_PORT}
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "translator")
    http = [p for p in service["spec"]["ports"] if p["name"] == "http"]
    assert http == [
        {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP", "appProtocol": "http"}
    ]
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert config["data"]["TRANSLATOR_HTTP_PORT"] == str(HTTP_PORT)
