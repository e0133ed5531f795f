#!/usr/bin/env bash
# One entry for the lent GPU machine (docs/gpu.md). Here, before a GPU session:
#   bash bench/gpu_run.sh wheels        # .whl/site-cp312.tar.xz: the Python packages the GPU image lacks
#   make gpu-pack                       # runs/pack-es.tar: the training pack
# There, as the device tool's command (carry .whl and runs/pack-*.tar; outputs go to $OUT):
#   bash bench/gpu_run.sh check [bench.gpu_check args]                      -> $OUT/gpu-check.json, .log
#   bash bench/gpu_run.sh train PACK NAME [model.gpu_train args]            -> $OUT/NAME/, $OUT/NAME.log
#   bash bench/gpu_run.sh env           # only what the environment set-up finds (seconds)
#   bash bench/gpu_run.sh ort-part .ort/part-N   # keep one part of onnxruntime-gpu (bench/ort_gpu_pack.py)
# Here, around the device calls (the tracked tree alone is over the 64 MiB a call may carry):
#   bash bench/gpu_run.sh slim [all]    # untrack (index only) the models the check does not serve
#   bash bench/gpu_run.sh unslim        # track them again
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
  echo "$PACKAGES" >"$site/.gpu-run-packages"  # setup_env compares it: a stale archive says so
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
    if [ "$(cat /tmp/site/.gpu-run-packages 2>/dev/null)" != "$PACKAGES" ]; then
      echo "note: $SITE_TAR is stale (made for another package list): bash bench/gpu_run.sh wheels"
    fi
    export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
  else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
    echo "note: no $SITE_TAR (bash bench/gpu_run.sh wheels, then carry .whl): packages the image lacks stay missing"
  fi
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  fi
  ort_site
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

ORT_PARTS=${GPU_RUN_ORT_PARTS:-/tmp/ort-parts}
ORT_SITE=${GPU_RUN_ORT_SITE:-/tmp/ort-site}

ort_site() {
  # onnxruntime-gpu, when earlier calls on this warm machine left all its parts (ort-part): unpacked
  # once, first on PYTHONPATH (ahead of the image's CPU build), with the CUDA and cuDNN libraries of
  # the image's nvidia-* wheels on LD_LIBRARY_PATH.
  [ -d "$ORT_PARTS" ] || return 0
  [ -d "$ORT_SITE/onnxruntime" ] || "$PY" -m bench.ort_gpu_pack --join "$ORT_PARTS" --site "$ORT_SITE"
  [ -d "$ORT_SITE/onnxruntime" ] || return 0
  export PYTHONPATH=$ORT_SITE:$PYTHONPATH
  local libs
  libs=$("$PY" -c 'import glob, os, site
dirs = {os.path.dirname(p) for r in site.getsitepackages()
        for p in glob.glob(os.path.join(r, "nvidia", "**", "lib*.so*"), recursive=True)}
print(":".join(sorted(dirs)))')
  [ -n "$libs" ] && export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "onnxruntime-gpu from $ORT_SITE"
}

# The models a device call does not need, untracked in the index only (the working tree keeps every
# file) and ignored through .git/info/exclude between two marker lines; `all`: every tracked path, for
# a call that carries one ort part and nothing else. unslim undoes both. Commit before slim.
SLIM_BEGIN="# gpu_run.sh slim begin"
SLIM_END="# gpu_run.sh slim end"
slim() {
  local keep=${GPU_RUN_KEEP_MODEL:-models/en-es-small} paths
  grep -qx "$SLIM_BEGIN" .git/info/exclude 2>/dev/null && { echo "already slim: bash bench/gpu_run.sh unslim"; exit 1; }
  if [ "${1:-}" = all ]; then
    paths=$(git ls-files | cut -d/ -f1 | sort -u)
  else
    paths=$(git ls-files models | grep -v '^models/in-training/' | cut -d/ -f1-2 | sort -u | grep -vx "$keep")
    paths="$paths $(git ls-files models/in-training | cut -d/ -f1-3 | sort -u)"
  fi
  # shellcheck disable=SC2086 # one path per word
  git rm -r -q --cached $paths || exit 1
  { echo "$SLIM_BEGIN"; for p in $paths; do echo "/$p"; done; echo "$SLIM_END"; } >>.git/info/exclude
  echo "travels: $( (git ls-files -z; git ls-files -z --others --exclude-standard) |
    du -cb --files0-from=- | tail -1 | cut -f1) bytes, and the carried paths"
}

unslim() {
  git reset -q -- . 2>/dev/null || git reset -q
  [ -f .git/info/exclude ] && sed -i "/^$SLIM_BEGIN\$/,/^$SLIM_END\$/d" .git/info/exclude
  git status --short | head -5
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
  slim) slim "$@" ;;
  unslim) unslim ;;
  ort-part)
    [ $# -ge 1 ] || { echo "usage: bash bench/gpu_run.sh ort-part .ort/part-N"; exit 2; }
    mkdir -p "$ORT_PARTS" && cp "$1"/* "$ORT_PARTS"/ && ls -la "$ORT_PARTS"
    ;;
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
    echo "usage: bash bench/gpu_run.sh wheels | env | check [args] | train PACK NAME [args] | ort-part DIR | slim [all] | unslim"
    exit 2
    ;;
esac
