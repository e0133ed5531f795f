# syntax=docker/dockerfile:1
# Images of the English->Spanish translation service (docs/deploy.md).
#
#   docker build -t translator:cpu .                           # CPU runtime (the default, last stage)
#   docker build -t translator:gpu --target runtime-gpu .      # CUDA runtime with onnxruntime-gpu
#
# Stages:
#   build        installs the project with its `train` extra (PyTorch, CPU wheel) and exports the
#                shipped checkpoint models/$MODEL_NAME to an ONNX bundle. PyTorch lives only here.
#   runtime-gpu  CUDA + cuDNN base, Python 3.11, `pip install .` then onnxruntime swapped for
#                onnxruntime-gpu (see below), the bundle from `build`.
#   runtime      python:3.11-slim, `pip install .` (the runtime dependencies of pyproject.toml and
#                nothing else), the bundle from `build`, a non-root user, a gRPC health check.
#
# Both runtime stages install the dependencies from pyproject.toml's [project.dependencies] by
# installing the project itself: there is no second requirements list to drift.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# onnxruntime-gpu 1.22 wheels on PyPI are built for CUDA 12.x and cuDNN 9; keep the pair in step
# (https://onnxruntime.ai/docs/execution-providers/CUDA-ExecutionProvider.html#requirements).
ARG CUDA_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu22.04

# ---- build: PyTorch + export ----------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build
# torch comes from the PyTorch CPU index: the version pinned in pyproject's `train` extra
# (torch==X) with the +cpu local tag, which satisfies the pin without the CUDA wheels that PyPI's
# torch pulls in. Point TORCH_INDEX_URL at a mirror (or a directory with --find-links) offline.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG MODEL_NAME=en-es-small
ARG EXPORT_VARIANTS=fp32,int8
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
RUN python3 -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY runtime/ runtime/
COPY model/ model/
COPY export/ export/
COPY server/ server/
COPY proto/ proto/
COPY client/ client/
RUN torch_pin="$(python -c 'import tomllib; extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["train"]; print(next(r for r in extra if r.replace(" ", "").startswith("torch==")))')" \
 && echo "installing ${torch_pin} from ${TORCH_INDEX_URL}" \
 && pip install --index-url "${TORCH_INDEX_URL}" "${torch_pin}" \
 && pip install ".[train]" \
 && python -c "import torch; print('torch', torch.__version__)"
COPY models/${MODEL_NAME}/ models/${MODEL_NAME}/
RUN python -m export --checkpoint "models/${MODEL_NAME}" --out "/bundles/${MODEL_NAME}" --variants "${EXPORT_VARIANTS}"

# ---- runtime-gpu: CUDA + onnxruntime-gpu ----------------------------------------------------------
FROM ${CUDA_IMAGE} AS runtime-gpu
ARG MODEL_NAME=en-es-small
ARG ONNXRUNTIME_GPU_VERSION=1.22.0
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
COPY runtime/ /tmp/src/runtime/
COPY model/ /tmp/src/model/
COPY export/ /tmp/src/export/
COPY server/ /tmp/src/server/
COPY proto/ /tmp/src/proto/
COPY client/ /tmp/src/client/
# The same `pip install .` as the CPU image, then the one swap: onnxruntime (CPU) out,
# onnxruntime-gpu in. Both wheels install the `onnxruntime` Python package, so the CPU one is
# removed first (removing it afterwards would delete files of the GPU one). `pip check` reports the
# missing `onnxruntime` distribution afterwards: expected, onnxruntime-gpu provides the module.
RUN pip install /tmp/src \
 && pip uninstall -y onnxruntime \
 && pip install "onnxruntime-gpu==${ONNXRUNTIME_GPU_VERSION}" \
 && python -c "import onnxruntime as ort; p = ort.get_available_providers(); print(p); assert 'CUDAExecutionProvider' in p" \
 && rm -rf /tmp/src
RUN groupadd --system --gid 10001 translator \
 && useradd --system --uid 10001 --gid translator --no-create-home --shell /usr/sbin/nologin translator
COPY --from=build /bundles/ /opt/translator/bundles/
COPY deploy/healthcheck.py /opt/translator/healthcheck.py
ENV TRANSLATOR_MODEL_DIR=/opt/translator/bundles/${MODEL_NAME} \
    TRANSLATOR_BUNDLES_DIR=/opt/translator/bundles \
    TRANSLATOR_HOST=0.0.0.0 \
    TRANSLATOR_PORT=50051 \
    TRANSLATOR_METRICS_PORT=8000 \
    TRANSLATOR_DEVICE=cuda \
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
ARG MODEL_NAME=en-es-small
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
RUN python3 -m venv /opt/venv
COPY pyproject.toml README.md /tmp/src/
COPY runtime/ /tmp/src/runtime/
COPY model/ /tmp/src/model/
COPY export/ /tmp/src/export/
COPY server/ /tmp/src/server/
COPY proto/ /tmp/src/proto/
COPY client/ /tmp/src/client/
# The runtime dependencies are [project.dependencies] of pyproject.toml, installed with the project.
RUN pip install /tmp/src \
 && python -c "import importlib.util as u; assert u.find_spec('torch') is None, 'torch leaked into the runtime'" \
 && rm -rf /tmp/src
RUN groupadd --system --gid 10001 translator \
 && useradd --system --uid 10001 --gid translator --no-create-home --shell /usr/sbin/nologin translator
COPY --from=build /bundles/ /opt/translator/bundles/
COPY deploy/healthcheck.py /opt/translator/healthcheck.py
# The bundle is baked in (the image's model store is /opt/translator/bundles); TRANSLATOR_MODEL_DIR can
# point at a mounted bundle instead. The server serves bundles only: a checkpoint dir fails the start
# with the `python -m export` command to run (exporting needs torch, which only the build stage has).
ENV TRANSLATOR_MODEL_DIR=/opt/translator/bundles/${MODEL_NAME} \
    TRANSLATOR_BUNDLES_DIR=/opt/translator/bundles \
    TRANSLATOR_HOST=0.0.0.0 \
    TRANSLATOR_PORT=50051 \
    TRANSLATOR_METRICS_PORT=8000 \
    TRANSLATOR_DEVICE=cpu
WORKDIR /opt/translator
USER 10001:10001
EXPOSE 50051 5000 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/opt/translator/healthcheck.py", "--quiet"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "server"]
