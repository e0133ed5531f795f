#!/usr/bin/env bash
# The compose stack on podman (docs/deploy.md, "Podman"): deploy/stack.sh with CONTAINER_ENGINE=podman.
#
#   sudo apt-get install podman runc catatonit debootstrap iptables containernetworking-plugins \
#     golang-github-containernetworking-plugin-dnsname   # or: sudo bash deploy/stack.sh deps
#   pip install podman-compose                # >= 1.1: Debian 12's 1.0.3 breaks the compose file
#   sudo deploy/podman-up.sh                  # base image (debootstrap), translator:cpu built with
#                                             # --format docker (keeps HEALTHCHECK), then compose up -d
#   sudo deploy/podman-up.sh --profile scale  # ... with the replicas behind nginx
#   sudo deploy/podman-up.sh down [-v]        # every service, the scale profile's too; fails if any is left
#
# Variables: those of deploy/stack.sh (DEBIAN_MIRROR, BASE_IMAGE, TORCH_INDEX_URL, PIP_*, *_IMAGE, ...).
set -euo pipefail
here=$(dirname "$0")
export CONTAINER_ENGINE=podman
case ${1:-} in
  down) shift; exec "$here/stack.sh" down "$@" ;;
  *) exec "$here/stack.sh" up "$@" ;;
esac
