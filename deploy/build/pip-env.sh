# Sourced by the Dockerfile's RUN steps, which bind-mount this directory at /mnt/build: the build's pip
# settings. Nothing here stays in an image (bind mounts and secrets are not layers).
#   constraints.txt     the versions every image installs (one ONNX Runtime for the CPU and GPU images)
#   wheelhouse/         wheels for offline builds (deploy/stack.sh links the host's find-links wheels here)
#   secret pip-ca       a CA bundle for pip (a TLS-intercepting proxy): --secret id=pip-ca,src=FILE
# Index URLs come as the build args PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST (no credentials:
# build args show in the image history).
# Build args declared without a value may arrive empty: an empty PIP_INDEX_URL would mean no index.
for name in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST; do
  eval "[ -n \"\${$name:-}\" ]" || unset "$name"
done
export PIP_CONSTRAINT=/mnt/build/constraints.txt
if [ -s /run/secrets/pip-ca ]; then
  export PIP_CERT=/run/secrets/pip-ca
fi
if ls /mnt/build/wheelhouse/*.whl >/dev/null 2>&1; then
  export PIP_FIND_LINKS="/mnt/build/wheelhouse${PIP_FIND_LINKS:+ $PIP_FIND_LINKS}"
fi
