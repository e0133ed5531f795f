# Images of the English->Spanish translation service (docs/deploy.md).
#
#   docker build -t translator:cpu .                                  # CPU runtime (the default, last stage)
#   docker build -t translator:gpu --target runtime-gpu .             # CUDA runtime with onnxruntime-gpu
#   podman build --format docker -t translator:cpu .                  # podman: keep the HEALTHCHECK
#   deploy/stack.sh images                                            # either engine, offline-capable
#
# Stages:
#   build        installs the project with the part of its `train` extra the export needs (PyTorch CPU
#                wheel, onnx, safetensors, sacrebleu) and exports the shipped checkpoint
#                models in models/ (every one, or those MODELS names) to ONNX bundles in /bundles/.
#                PyTorch lives only here.
#   runtime-gpu  CUDA + cuDNN base, Python 3.11, `pip install .` then onnxruntime swapped for
#                onnxruntime-gpu of the same version (deploy/build/constraints.txt), the bundle.
#   runtime      python:3.11-slim, `pip install .` (the runtime dependencies of pyproject.toml and
#                nothing else), the bundle from `build`, a non-root user, a gRPC health check.
#
# Both runtime stages install the dependencies from pyproject.toml's [project.dependencies] by
# installing the project itself: there is no second requirements list to drift. Every `pip install`
# sources deploy/build/pip-env.sh from a bind mount (BuildKit or podman): the constraints (one ONNX
# Runtime version for all images), wheels in deploy/build/wheelhouse/ (offline builds) and the optional
# secret `pip-ca` (a CA bundle for a TLS-intercepting proxy). Build args PIP_INDEX_URL,
# PIP_EXTRA_INDEX_URL and PIP_TRUSTED_HOST choose the index (no credentials: args show in the history).
# Nothing of these stays in an image.

ARG PYTHON_IMAGE=docker.io/library/python:3.11-slim-bookworm
# onnxruntime-gpu 1.26 wheels on PyPI are built for CUDA 12.x and cuDNN 9; keep the pair in step with
# deploy/build/constraints.txt (https://onnxruntime.ai/docs/execution-providers/CUDA-ExecutionProvider.html#requirements).
ARG CUDA_IMAGE=docker.io/nvidia/cuda:12.6.3-cudnn-runtime-ubuntu22.04

# ---- build: PyTorch + export ----------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build
# torch comes from the PyTorch CPU index: the version pinned in pyproject's `train` extra (torch==X)
# with the +cpu local tag, which satisfies the pin without the CUDA wheels that PyPI's torch pulls in.
# Offline or behind a mirror: put the torch-X+cpu wheel in deploy/build/wheelhouse/ and pass
# TORCH_INDEX_URL= (empty), or point TORCH_INDEX_URL at a mirror of that index.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_INDEX_URL=
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_TRUSTED_HOST=
# The shipped models to export (names in models/, space-separated); empty = every one there.
ARG MODELS=
ARG EXPORT_VARIANTS=fp32,int8
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
RUN python3 -m venv /opt/venv
WORKDIR /src
# Dependencies first, sources after: `pip install .` of pyproject.toml alone installs the dependencies
# (and an empty project), so a change of the sources rebuilds from the COPY below, not from PyPI.
COPY pyproject.toml README.md ./
# From the `train` extra only what `python -m export` imports (torch, onnx, safetensors, and sacrebleu
# through model/train.py), with pyproject's own version specifiers; not CTranslate2 or grpcio-tools.
RUN --mount=type=bind,source=deploy/build,target=/mnt/build --mount=type=secret,id=pip-ca \
    . /mnt/build/pip-env.sh \
 && torch_pin="$(python -c 'import tomllib; extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["train"]; print(next(r for r in extra if r.replace(" ", "").startswith("torch==")))')" \
 && export_needs="$(python -c 'import re, tomllib; extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["train"]; print(" ".join(r.replace(" ", "") for r in extra if re.match(r"(onnx|safetensors|sacrebleu)\b", r)))')" \
 && if [ -n "${TORCH_INDEX_URL}" ]; then \
      echo "installing ${torch_pin} from ${TORCH_INDEX_URL}" && pip install --index-url "${TORCH_INDEX_URL}" "${torch_pin}"; \
    else \
      echo "installing ${torch_pin} from the index and wheelhouse" && pip install "${torch_pin}"; \
    fi \
 && pip install . ${export_needs} \
 && python -c "import torch; print('torch', torch.__version__); assert torch.version.cuda is None, 'a CUDA torch'"
COPY runtime/ runtime/
COPY model/ model/
COPY export/ export/
COPY server/ server/
COPY proto/ proto/
COPY client/ client/
RUN --mount=type=bind,source=deploy/build,target=/mnt/build --mount=type=secret,id=pip-ca \
    . /mnt/build/pip-env.sh \
 && pip install --no-deps --force-reinstall .
COPY models/ models/
RUN names="${MODELS}"; \
    if [ -z "$names" ]; then for m in models/*/model.safetensors; do names="$names $(basename "$(dirname "$m")")"; done; fi; \
    for name in $names; do \
      python -m export --checkpoint "models/${name}" --out "/bundles/${name}" --variants "${EXPORT_VARIANTS}" || exit 1; \
    done

# ---- runtime-gpu: CUDA + onnxruntime-gpu ----------------------------------------------------------
FROM ${CUDA_IMAGE} AS runtime-gpu
ARG PIP_INDEX_URL=
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_TRUSTED_HOST=
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH
# Ubuntu 22.04 ships Python 3.10; the project targets 3.11 (deadsnakes builds of it).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates gpg-agent software-properties-common \
 && add-apt-repository -y ppa:deadsnakes/ppa \
 && apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
 && apt-get purge -y --auto-remove software-properties-common gpg-agent \
 && rm -rf /var/lib/apt/lists/* \
 && python3.11 -m venv /opt/venv
COPY pyproject.toml README.md /tmp/src/
# The same `pip install .` as the CPU image (dependencies first, see the build stage), then the one swap: onnxruntime (CPU) out, onnxruntime-gpu
# in, both at the version of deploy/build/constraints.txt. Both wheels install the `onnxruntime` Python
# package, so the CPU one is removed first (removing it afterwards would delete files of the GPU one).
# `pip check` reports the missing `onnxruntime` distribution afterwards: expected.
RUN --mount=type=bind,source=deploy/build,target=/mnt/build --mount=type=secret,id=pip-ca \
    . /mnt/build/pip-env.sh \
 && pip install /tmp/src \
 && pip uninstall -y onnxruntime \
 && pip install onnxruntime-gpu \
 && python -c "import onnxruntime as ort; p = ort.get_available_providers(); print(ort.__version__, p); assert 'CUDAExecutionProvider' in p"
COPY runtime/ /tmp/src/runtime/
COPY model/ /tmp/src/model/
COPY export/ /tmp/src/export/
COPY server/ /tmp/src/server/
COPY proto/ /tmp/src/proto/
COPY client/ /tmp/src/client/
RUN --mount=type=bind,source=deploy/build,target=/mnt/build --mount=type=secret,id=pip-ca \
    . /mnt/build/pip-env.sh \
 && pip install --no-deps --force-reinstall /tmp/src \
 && rm -rf /tmp/src
RUN groupadd --system --gid 10001 translator \
 && useradd --system --uid 10001 --gid translator --create-home --home-dir /home/translator \
      --shell /usr/sbin/nologin translator
COPY --from=build /bundles/ /opt/translator/bundles/
COPY deploy/healthcheck.py /opt/translator/healthcheck.py
ENV TRANSLATOR_MODEL_DIR=/opt/translator/bundles \
    TRANSLATOR_BUNDLES_DIR=/opt/translator/bundles \
    TRANSLATOR_HOST=0.0.0.0 \
    TRANSLATOR_PORT=50051 \
    TRANSLATOR_METRICS_PORT=8000 \
    TRANSLATOR_DEVICE=cuda \
    TRANSLATOR_DRAIN_DELAY_S=1 \
    TRANSLATOR_SHUTDOWN_GRACE_S=7 \
    HOME=/home/translator \
    XDG_CACHE_HOME=/tmp/.cache \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /opt/translator
USER 10001:10001
EXPOSE 50051 5000 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "/opt/translator/healthcheck.py", "--quiet"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "server"]

# ---- runtime: CPU (default target) ----------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG PIP_INDEX_URL=
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_TRUSTED_HOST=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
RUN python3 -m venv /opt/venv
COPY pyproject.toml README.md /tmp/src/
# The runtime dependencies are [project.dependencies] of pyproject.toml, installed with the project
# (onnxruntime at the version of deploy/build/constraints.txt): first from pyproject.toml alone (the
# dependencies, cached until pyproject.toml changes), then the sources.
RUN --mount=type=bind,source=deploy/build,target=/mnt/build --mount=type=secret,id=pip-ca \
    . /mnt/build/pip-env.sh \
 && pip install /tmp/src \
 && python -c "import importlib.util as u; assert u.find_spec('torch') is None, 'torch leaked into the runtime'"
COPY runtime/ /tmp/src/runtime/
COPY model/ /tmp/src/model/
COPY export/ /tmp/src/export/
COPY server/ /tmp/src/server/
COPY proto/ /tmp/src/proto/
COPY client/ /tmp/src/client/
RUN --mount=type=bind,source=deploy/build,target=/mnt/build --mount=type=secret,id=pip-ca \
    . /mnt/build/pip-env.sh \
 && pip install --no-deps --force-reinstall /tmp/src \
 && python -c "import server, runtime, client" \
 && rm -rf /tmp/src
# A home directory (ONNX Runtime keeps a device id under $XDG_CACHE_HOME, else ~/.cache): /tmp, which
# stays writable with a read-only root file system (podman mounts a tmpfs there; docker: --tmpfs /tmp).
RUN groupadd --system --gid 10001 translator \
 && useradd --system --uid 10001 --gid translator --create-home --home-dir /home/translator \
      --shell /usr/sbin/nologin translator
COPY --from=build /bundles/ /opt/translator/bundles/
COPY deploy/healthcheck.py /opt/translator/healthcheck.py
# The bundles are baked in (the image's model store is /opt/translator/bundles, all of it served, the
# default model en-es-small first); TRANSLATOR_MODEL_DIR can point at one bundle or a mounted one instead. The server serves bundles only: a checkpoint dir fails the start
# with the `python -m export` command to run (exporting needs torch, which only the build stage has).
# Drain delay + shutdown grace (1 + 7 s) fit the engines' default stop timeout of 10 s, so a plain
# `docker stop` / `podman stop` drains cleanly; compose raises both with stop_grace_period 30s.
ENV TRANSLATOR_MODEL_DIR=/opt/translator/bundles \
    TRANSLATOR_BUNDLES_DIR=/opt/translator/bundles \
    TRANSLATOR_HOST=0.0.0.0 \
    TRANSLATOR_PORT=50051 \
    TRANSLATOR_METRICS_PORT=8000 \
    TRANSLATOR_DEVICE=cpu \
    TRANSLATOR_DRAIN_DELAY_S=1 \
    TRANSLATOR_SHUTDOWN_GRACE_S=7 \
    HOME=/home/translator \
    XDG_CACHE_HOME=/tmp/.cache
WORKDIR /opt/translator
USER 10001:10001
EXPOSE 50051 5000 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/opt/translator/healthcheck.py", "--quiet"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "server"]
