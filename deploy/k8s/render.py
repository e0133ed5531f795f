"""Render a kustomization of deploy/k8s without kubectl: the small subset of Kustomize these
manifests use (resources, strategic-merge patches, images, namespace).

    python deploy/k8s/render.py deploy/k8s/overlays/cpu > translator.yaml   # then kubectl apply -f
    kubectl kustomize deploy/k8s/overlays/cpu                                # the same objects

Strategic merge as Kubernetes does it for these fields: maps merge recursively; the lists
`containers`, `initContainers`, `env`, `volumes` and `volumeMounts` merge by name (`ports` by
containerPort); other lists are replaced; a null value deletes a key. tests/test_deploy.py checks
that the output equals `kubectl kustomize` where kubectl is installed.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
}
SUPPORTED = {"apiVersion", "kind", "resources", "patches", "patchesStrategicMerge", "images", "namespace"}


def strategic_merge(base: Any, patch: Any, key: str | None = None) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = strategic_merge(out[k], v, k)
            else:
                out[k] = copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        mk = MERGE_KEYS[key]
        # Service ports have no containerPort: replaced, as Kubernetes merges those by `port`.
        if all(isinstance(x, dict) and mk in x for x in base + patch):
            out = [copy.deepcopy(x) for x in base]
            index = {x[mk]: i for i, x in enumerate(out)}
            for item in patch:
                if item[mk] in index:
                    out[index[item[mk]]] = strategic_merge(out[index[item[mk]]], item, None)
                else:
                    out.append(copy.deepcopy(item))
            return out
    return copy.deepcopy(patch)


def _load_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _set_image(doc: dict, images: list[dict]) -> None:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        image = container.get("image", "")
        name, _, tag = image.partition(":") if "@" not in image else (image, "", "")
        for rule in images:
            if rule["name"] == name:
                container["image"] = f"{rule.get('newName', name)}:{rule.get('newTag', tag)}".rstrip(":")


def render(directory: str | Path) -> list[dict]:
    """The objects a kustomization directory produces."""
    directory = Path(directory)
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(k) - SUPPORTED
    if unknown:
        raise ValueError(f"{directory}/kustomization.yaml: fields {sorted(unknown)} need kubectl kustomize")
    docs: list[dict] = []
    for resource in k.get("resources", []):
        path = directory / resource
        docs.extend(render(path) if path.is_dir() else _load_docs(path))
    patch_files = [p["path"] if isinstance(p, dict) else p for p in k.get("patches", [])]
    patch_files += k.get("patchesStrategicMerge", [])
    for patch_file in patch_files:
        for patch in _load_docs(directory / patch_file):
            targets = [
                i
                for i, d in enumerate(docs)
                if d["kind"] == patch["kind"] and d["metadata"]["name"] == patch["metadata"]["name"]
            ]
            if len(targets) != 1:
                raise ValueError(f"{patch_file}: patch matches {len(targets)} objects")
            docs[targets[0]] = strategic_merge(docs[targets[0]], patch)
    for doc in docs:
        _set_image(doc, k.get("images", []))
        if "namespace" in k:
            doc["metadata"]["namespace"] = k["namespace"]
    return docs


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    sys.stdout.write(yaml.safe_dump_all(render(argv[0]), sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
