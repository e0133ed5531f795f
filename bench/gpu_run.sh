#!/usr/bin/env bash
# One entry for the lent GPU machine (docs/gpu.md). Here, before a GPU session:
#   bash bench/gpu_run.sh wheels        # .whl/site-cp312.tar.xz: the Python packages the GPU image lacks
#   make gpu-pack                       # runs/pack-es.tar: the training pack
# There, as the device tool's command (carry .whl and runs/pack-*.tar; outputs go to $OUT):
#   bash bench/gpu_run.sh check [bench.gpu_check args]                      -> $OUT/gpu-check.json, .log
#   bash bench/gpu_run.sh train PACK NAME [model.gpu_train args]            -> $OUT/NAME/, $OUT/NAME.log
#   bash bench/gpu_run.sh env           # only what the environment set-up finds (seconds)
# At most 8 files come back from one call: GPU_RUN_LOGS=0 keeps the logs on stdout only (the device tool
# returns its last 12,000 characters), for a call that runs check and train together.
# The logic is in the Python scripts; this sets up the environment they run in.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-out}
mkdir -p "$OUT"
log_to() {  # log_to FILE: stdout, and FILE unless GPU_RUN_LOGS=0
  if [ "${GPU_RUN_LOGS:-1}" = 0 ]; then cat; else tee "$1"; fi
}
# The GPU image's Python is 3.12 with torch, onnx, onnxruntime, numpy, sentencepiece, safetensors,
# sacrebleu, aiohttp, prometheus-client (KINDS.md); what it lacks is carried, unpacked, stripped.
PACKAGES="ctranslate2==4.8.5 grpcio==1.85.3 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1
grpcio-status==1.85.1 googleapis-common-protos==1.76.0 protobuf==7.36.2 sentencex==1.0.32 polib==1.2.0"
SITE_TAR=${GPU_RUN_SITE:-.whl/site-cp312.tar.xz}  # GPU_RUN_SITE=none: the current environment only

wheels() {
  # Installed for CPython 3.12 on manylinux x86-64 into a folder, shared libraries stripped of their
  # symbols (CTranslate2's two are 148 MB with them), xz-compressed: about 20 MiB to carry.
  local py=${PYTHON:-.venv/bin/python} site
  site=$(mktemp -d)
  # shellcheck disable=SC2086 # the package list is meant to split
  "$py" -m pip install -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --target "$site" $PACKAGES || exit 1
  find "$site" -name '*.so*' -type f -exec strip --strip-unneeded {} \;
  find "$site" -name __pycache__ -prune -exec rm -rf {} \;
  mkdir -p .whl
  tar -C "$site" -cf - . | xz -6 -T0 >"$SITE_TAR.tmp" && mv "$SITE_TAR.tmp" "$SITE_TAR"
  rm -rf "$site"
  echo "$SITE_TAR: $(du -m "$SITE_TAR" | cut -f1) MiB ($PACKAGES)" | tr '\n' ' '
  echo
}

setup_env() {
  export PYTHONUNBUFFERED=1
  PY=${PYTHON:-python3}  # the GPU image: python3 is the one with torch
  if [ -f "$SITE_TAR" ]; then
    mkdir -p /tmp/site && tar -xJf "$SITE_TAR" -C /tmp/site || exit 1
    export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
  else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
    echo "note: no $SITE_TAR (bash bench/gpu_run.sh wheels, then carry .whl): packages the image lacks stay missing"
  fi
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  fi
  cublas_for_ctranslate2
  "$PY" - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0])
for m in ("torch", "onnxruntime", "ctranslate2", "grpc", "google.protobuf", "sentencepiece"):
    try:
        mod = importlib.import_module(m)
        extra = ""
        if m == "torch":
            extra = f" cuda={mod.cuda.is_available()}" + (f" {mod.cuda.get_device_name(0)}" if mod.cuda.is_available() else "")
        if m == "onnxruntime":
            extra = f" providers={mod.get_available_providers()}"
        if m == "ctranslate2":
            extra = f" cuda_devices={mod.get_cuda_device_count()}"
        print(f"{m} {getattr(mod, '__version__', '?')}{extra}")
    except Exception as e:
        print(f"{m} MISSING: {type(e).__name__}: {e}")
EOF
}

cublas_for_ctranslate2() {
  # CTranslate2 4.x (CUDA 12 build) dlopens libcublas.so.12; the image's CUDA is 13 (torch cu130). Use a
  # real cuBLAS 12 when there is one, else cuBLAS 13 under that name: CTranslate2 looks its functions
  # up by name (dlsym), and the check's CTranslate2 probe runs in a subprocess in case that fails.
  local lib
  lib=$("$PY" - <<'EOF'
import glob, os, site, sys
roots = [p for p in {*site.getsitepackages(), *sys.path} if p and os.path.isdir(p)]
found = {v: [] for v in ("12", "13")}
for v in found:
    for r in roots:
        found[v] += glob.glob(os.path.join(r, "nvidia", "**", f"libcublas.so.{v}*"), recursive=True)
    found[v] += glob.glob(f"/usr/local/cuda*/lib64/libcublas.so.{v}*")
print((found["12"] or found["13"] or [""])[0])
EOF
)
  if [ -z "$lib" ]; then
    echo "note: no libcublas.so.12 or .13 found: CTranslate2 cannot use the GPU"
    return
  fi
  mkdir -p /tmp/cublas12
  case "$lib" in
    *libcublas.so.12*) ;;
    *) ln -sf "$lib" /tmp/cublas12/libcublas.so.12 ;;
  esac
  # the real folder too: cuBLAS finds its libcublasLt there
  export LD_LIBRARY_PATH=/tmp/cublas12:$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export GPU_CHECK_CUBLAS="$lib"
  echo "CTranslate2 cuBLAS: $lib"
}

cmd=${1:-check}
shift || true
case "$cmd" in
  wheels) wheels ;;
  env) setup_env ;;
  check)
    setup_env
    "$PY" -m bench.gpu_check --json "$OUT/gpu-check.json" --work bundles/gpu-check "$@" 2>&1 |
      log_to "$OUT/gpu-check.log"
    ;;
  train)
    [ $# -ge 2 ] || { echo "usage: bash bench/gpu_run.sh train PACK NAME [model.gpu_train args]"; exit 2; }
    pack=$1 name=$2
    shift 2
    setup_env
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null
    "$PY" -m model.gpu_train --pack "$pack" --out "$OUT/$name" "$@" 2>&1 | log_to "$OUT/$name.log"
    ;;
  *)
    echo "usage: bash bench/gpu_run.sh wheels | env | check [args] | train PACK NAME [args]"
    exit 2
    ;;
esac
