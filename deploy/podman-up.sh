#!/usr/bin/env bash
# Run the compose stack with podman + podman-compose instead of Docker (docs/deploy.md).
#
# The Python base image of the Dockerfile (python:3.11-slim) is replaced by a Debian 12 root file
# system made with debootstrap (Debian 12's python3 is 3.11) and imported into podman, so the
# translator images need no image registry, only Debian and PyPI mirrors (and the PyTorch CPU index
# for the build stage: TORCH_INDEX_URL). Prometheus, Grafana and nginx still come from their images.
#
#   sudo apt-get install podman podman-compose debootstrap
#   sudo deploy/podman-up.sh                 # base image, translator:cpu, then podman-compose up -d
#   sudo deploy/podman-up.sh --profile scale # ... with the replicas behind nginx
#   sudo deploy/podman-up.sh down
#
# Variables: DEBIAN_MIRROR (default http://deb.debian.org/debian), BASE_IMAGE (default
# localhost/translator-base:bookworm), TORCH_INDEX_URL (passed to the build).
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_IMAGE=${BASE_IMAGE:-localhost/translator-base:bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if [ "${1:-}" = down ]; then
  exec podman-compose down
fi
for tool in podman podman-compose debootstrap; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install podman podman-compose debootstrap" >&2; exit 1; }
done

if ! podman image exists "$BASE_IMAGE"; then
  rootfs=$(mktemp -d)
  trap 'rm -rf "$rootfs"' EXIT
  echo "debootstrap bookworm -> $BASE_IMAGE"
  # python3-venv: the Dockerfile makes /opt/venv; passwd: useradd for the non-root user.
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd \
    bookworm "$rootfs" "$DEBIAN_MIRROR"
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
  tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' \
    --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$BASE_IMAGE"
fi

build_args=(--build-arg "PYTHON_IMAGE=$BASE_IMAGE")
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  build_args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
fi
podman build "${build_args[@]}" --target runtime -t translator:cpu .

# podman-compose reads the same docker-compose.yml; the image exists, so nothing is rebuilt.
exec podman-compose "$@" up -d --no-build
