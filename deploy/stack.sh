#!/usr/bin/env bash
# The compose stack (docker-compose.yml) with Docker or podman, whichever runs here (docs/deploy.md).
#
#   deploy/stack.sh images            build translator:cpu; find (pull) or build the other images
#   deploy/stack.sh up [--profile scale] [SERVICE...]
#                                     images, then `compose up -d` (services whose image can't be had
#                                     are left out, with a line saying so)
#   deploy/stack.sh down [-v]         stop and remove every service, the `scale` profile's too; exits 1
#                                     when a container, pod or network of the project is left
#   deploy/stack.sh compose ARGS...   the engine's compose with this script's settings (ps, logs, ...)
#   deploy/stack.sh engine ARGS...    the engine itself (podman with the generated containers.conf)
#   deploy/stack.sh env               those settings, as shell assignments
#   deploy/stack.sh deps              install podman & co (apt, root) and podman-compose (.venv) unless
#                                     Docker runs here
#
# Engine: CONTAINER_ENGINE=docker|podman, else Docker when `docker info` answers, else podman. Compose:
# `docker compose` (or docker-compose) for Docker; podman-compose >= 1.1 for podman (Debian 12's
# 1.0.3 breaks this file: `pip install podman-compose`; found on PATH or in .venv/bin).
#
# Images: the Python base of the Dockerfile is docker.io/library/python:3.11-slim-bookworm when it can
# be had, else a Debian 12 root file system made with debootstrap (needs root) and imported as
# $BASE_IMAGE. Prometheus and nginx come from their registries, else they are built from Debian's
# packages on that base (deploy/images/); Grafana has no Debian package: without its image the stack
# runs without Grafana. Set PYTHON_IMAGE, PROMETHEUS_IMAGE, NGINX_IMAGE, GRAFANA_IMAGE to choose;
# STACK_PULL=never skips every pull.
#
# The build gets the host's pip settings without baking them into the images: http(s) index URLs as
# build args, the CA bundle (PIP_CERT / pip's `cert`) as the BuildKit secret `pip-ca`, and the wheels
# of local find-links directories linked into deploy/build/wheelhouse/ (a bind mount of the build;
# with a torch wheel there, TORCH_INDEX_URL is left empty so that wheel is used).
#
# podman without systemd (containers, CI, WSL) never runs health checks by itself, and crun fails on
# hybrid cgroups: the script writes a containers.conf (runc, cgroupfs, file events, stop_timeout 30,
# default_ulimits at the host's own limits, nproc at most pid_max) and points CONTAINERS_CONF at it, unless that is set.
set -euo pipefail
cd "$(dirname "$0")/.."

STATE_DIR=${STACK_STATE_DIR:-/var/tmp/translator-stack}
BASE_IMAGE=${BASE_IMAGE:-localhost/translator-base:bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TRANSLATOR_IMAGE=${TRANSLATOR_IMAGE:-translator:cpu}
OFFICIAL_PYTHON=docker.io/library/python:3.11-slim-bookworm
OFFICIAL_PROMETHEUS=docker.io/prom/prometheus:v2.53.2
OFFICIAL_NGINX=docker.io/library/nginx:1.28-alpine
OFFICIAL_GRAFANA=docker.io/grafana/grafana:11.2.0
export TRANSLATOR_IMAGE

say() { echo "stack $(date +%T): $*" >&2; }
die() { say "$*"; exit 1; }

# ---- deps: what `make stack-test` installs when no engine runs here ------------------------------
if [ "${1:-}" = deps ]; then
  if [ "${CONTAINER_ENGINE:-}" != podman ] && command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    exit 0
  fi
  # podman with runc (crun fails on hybrid cgroups), catatonit (compose's init: true), the CNI plugins
  # and CNI's dnsname (service names; named, or apt may pick netavark without its DNS server), iptables
  # (published ports), debootstrap (the base image without a registry).
  missing=()
  for pair in podman:podman runc:runc catatonit:catatonit debootstrap:debootstrap iptables:iptables \
      /usr/lib/cni/bridge:containernetworking-plugins \
      /usr/lib/cni/dnsname:golang-github-containernetworking-plugin-dnsname; do
    command -v "${pair%%:*}" >/dev/null || [ -x "${pair%%:*}" ] || missing+=("${pair#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "needs root to install: ${missing[*]} (apt-get install ${missing[*]})"
    say "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  # Debian 12's podman-compose is 1.0.3, which breaks this compose file: the one from PyPI.
  have=$({ podman-compose version || .venv/bin/podman-compose version; } 2>/dev/null \
    | sed -n 's/^podman-compose version \([0-9.]*\).*/\1/p' | head -1) || true
  case $have in
    ""|0.*|1.0.*)
      [ -x .venv/bin/python ] || die "podman-compose >= 1.1 is missing: pip install podman-compose"
      say "pip install podman-compose into .venv"
      .venv/bin/python -m pip install -q "podman-compose==${PODMAN_COMPOSE_VERSION:-1.6.0}" ;;
  esac
  exit 0
fi

# ---- engine and compose ---------------------------------------------------------------------------
ENGINE=${CONTAINER_ENGINE:-}
if [ -z "$ENGINE" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker
  elif command -v podman >/dev/null; then ENGINE=podman
  else die "no container engine: install Docker, or podman (apt-get install podman runc catatonit debootstrap)"
  fi
fi

podman_conf() {
  local nofile nproc
  nofile=$(ulimit -n); nproc=$(ulimit -u)
  [ "$nofile" = unlimited ] && nofile=1048576
  [ "$nproc" = unlimited ] && nproc=1048576
  # Without CAP_SYS_RESOURCE runc cannot raise a limit, and an nproc above the kernel's pid_max fails too.
  pid_max=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo "$nproc")
  [ "$nproc" -gt "$pid_max" ] && nproc=$pid_max
  # podman build ignores default_ulimits and asks for more than such hosts allow (EPERM on nproc).
  ULIMITS=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
  [ -n "${CONTAINERS_CONF:-}" ] && return
  mkdir -p "$STATE_DIR"
  cat > "$STATE_DIR/containers.conf" <<EOF
# Written by deploy/stack.sh for podman on hosts without systemd or with hybrid cgroups.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
# Drain delay + shutdown grace of the server + margin (compose's stop_grace_period says the same).
stop_timeout = 30
EOF
  export CONTAINERS_CONF="$STATE_DIR/containers.conf"
}

if [ "$ENGINE" = podman ]; then
  podman_conf
  COMPOSE=()
  for candidate in "${PODMAN_COMPOSE:-}" podman-compose .venv/bin/podman-compose; do
    [ -n "$candidate" ] && command -v "$candidate" >/dev/null || continue
    version=$("$candidate" version 2>/dev/null | sed -n 's/^podman-compose version \([0-9.]*\).*/\1/p' | head -1) || true
    case $version in
      0.*|1.0.*|"") say "ignoring $candidate ${version:-(no version)}: podman-compose >= 1.1 is needed" ;;
      *) COMPOSE=("$candidate"); break ;;
    esac
  done
  [ ${#COMPOSE[@]} -gt 0 ] || die "podman-compose >= 1.1 is missing (Debian 12's 1.0.3 ignores profiles and \${VAR:-}): pip install podman-compose"
  BUILD=(podman build --format docker "${ULIMITS[@]}")
else
  if docker compose version >/dev/null 2>&1; then COMPOSE=(docker compose)
  elif command -v docker-compose >/dev/null; then COMPOSE=(docker-compose)
  else die "docker compose is missing"
  fi
  BUILD=(docker build)
  export DOCKER_BUILDKIT=1
fi

engine() { "$ENGINE" "$@"; }
image_exists() { engine image inspect "$1" >/dev/null 2>&1; }
try_pull() {  # IMAGE: pulled (or already here)?
  image_exists "$1" && return 0
  [ "${STACK_PULL:-auto}" = never ] && return 1
  say "pulling $1"
  timeout 600 "$ENGINE" pull -q "$1" >/dev/null 2>&1 || { say "cannot pull $1"; return 1; }
}

# ---- images ---------------------------------------------------------------------------------------
base_image() {  # the debootstrapped Debian 12 base, made once
  image_exists "$BASE_IMAGE" && return
  command -v debootstrap >/dev/null || die "debootstrap is missing (apt-get install debootstrap)"
  say "debootstrap bookworm -> $BASE_IMAGE"
  # A subshell whose EXIT trap removes the root file system on success and failure alike.
  (
    rootfs=$(mktemp -d /var/tmp/translator-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    # python3-venv: the Dockerfile makes /opt/venv; passwd: useradd for the non-root user.
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd \
      bookworm "$rootfs" "$DEBIAN_MIRROR" >"$STATE_DIR/debootstrap.log" 2>&1 \
      || { tail -20 "$STATE_DIR/debootstrap.log" >&2; exit 1; }
    printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
      "$DEBIAN_MIRROR" "$DEBIAN_MIRROR" "${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}" \
      > "$rootfs/etc/apt/sources.list"
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
    tar -C "$rootfs" -c . | engine import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      - "$BASE_IMAGE" >/dev/null
  ) || die "could not make the base image $BASE_IMAGE (log: $STATE_DIR/debootstrap.log)"
}

pip_setting() {  # KEY: pip's setting from the environment (PIP_KEY) or pip's configuration
  local env_name value py
  env_name=PIP_$(echo "$1" | tr 'a-z-' 'A-Z_')
  value=${!env_name:-}
  if [ -z "$value" ]; then
    py=python3; [ -x .venv/bin/python ] && py=.venv/bin/python
    value=$("$py" -m pip config list 2>/dev/null | sed -n "s/^[a-z]*\.$1='\(.*\)'$/\1/p" | head -1) || true
  fi
  echo "$value"
}

BUILD_OPTIONS=()
pip_build_options() {
  local key value url dir urls
  for key in index-url extra-index-url trusted-host; do
    value=$(pip_setting "$key"); urls=()
    for url in $value; do
      case $key:$url in trusted-host:*|*:http://*|*:https://*) urls+=("$url") ;; esac
    done
    [ ${#urls[@]} -gt 0 ] && BUILD_OPTIONS+=(--build-arg "PIP_$(echo "$key" | tr 'a-z-' 'A-Z_')=${urls[*]}")
  done
  value=$(pip_setting cert)
  [ -n "$value" ] && [ -f "$value" ] && BUILD_OPTIONS+=(--secret "id=pip-ca,src=$value")
  rm -f deploy/build/wheelhouse/*.whl
  for dir in $(pip_setting find-links); do
    dir=${dir#file://}
    [ -d "$dir" ] || continue
    for wheel in "$dir"/*.whl; do
      [ -f "$wheel" ] && { ln -f "$wheel" deploy/build/wheelhouse/ 2>/dev/null || cp "$wheel" deploy/build/wheelhouse/; }
    done
  done
  local torch_pin
  torch_pin=$(sed -n 's/.*"torch==\([^"]*\)".*/\1/p' pyproject.toml | head -1)
  if [ -z "${TORCH_INDEX_URL+set}" ] && compgen -G "deploy/build/wheelhouse/torch-${torch_pin}+cpu-*.whl" >/dev/null; then
    say "torch $torch_pin+cpu from the local find-links directory"
    BUILD_OPTIONS+=(--build-arg TORCH_INDEX_URL=)
  elif [ -n "${TORCH_INDEX_URL+set}" ]; then
    BUILD_OPTIONS+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
  fi
}

build_translator() {
  local python_image=${PYTHON_IMAGE:-}
  if [ -z "$python_image" ]; then
    if try_pull "$OFFICIAL_PYTHON"; then python_image=$OFFICIAL_PYTHON
    else base_image; python_image=$BASE_IMAGE
    fi
  fi
  pip_build_options
  say "building $TRANSLATOR_IMAGE on $python_image"
  "${BUILD[@]}" --build-arg "PYTHON_IMAGE=$python_image" "${BUILD_OPTIONS[@]}" \
    --target runtime -t "$TRANSLATOR_IMAGE" . || { rm -f deploy/build/wheelhouse/*.whl; die "image build failed"; }
  rm -f deploy/build/wheelhouse/*.whl
}

third_party() {  # VAR OFFICIAL LOCAL CONTAINERFILE: sets VAR to an image that is here, or to ""
  local var=$1 official=$2 local_name=$3 containerfile=$4
  if [ -n "${!var:-}" ]; then export "${var?}"; return; fi
  if image_exists "$official"; then export "$var=$official"
  elif image_exists "$local_name"; then export "$var=$local_name"
  elif try_pull "$official"; then export "$var=$official"
  elif [ -n "$containerfile" ]; then
    base_image
    say "building $local_name from Debian's packages ($containerfile)"
    "${BUILD[@]}" --build-arg "BASE_IMAGE=$BASE_IMAGE" -f "$containerfile" -t "$local_name" deploy/images >/dev/null \
      || die "building $local_name failed"
    export "$var=$local_name"
  else
    say "no image for ${var%_IMAGE} ($official cannot be pulled, and Debian has no package of it): left out"
    export "$var="
  fi
}

images() {
  mkdir -p "$STATE_DIR"
  image_exists "$TRANSLATOR_IMAGE" && [ "${STACK_REBUILD:-1}" = 0 ] || build_translator
  third_party PROMETHEUS_IMAGE "$OFFICIAL_PROMETHEUS" localhost/translator-prometheus:debian deploy/images/prometheus.Containerfile
  third_party NGINX_IMAGE "$OFFICIAL_NGINX" localhost/translator-nginx:debian deploy/images/nginx.Containerfile
  third_party GRAFANA_IMAGE "$OFFICIAL_GRAFANA" "" ""
}

# ---- commands -------------------------------------------------------------------------------------
compose() { "${COMPOSE[@]}" "$@"; }

leftovers() {  # the project's containers, pods and networks still there
  local project=${COMPOSE_PROJECT_NAME:-$(basename "$PWD")}
  engine ps -a --filter "label=com.docker.compose.project=$project" --format '{{.Names}}' 2>/dev/null || true
  engine ps -a --filter "label=io.podman.compose.project=$project" --format '{{.Names}}' 2>/dev/null || true
  if [ "$ENGINE" = podman ]; then
    engine pod ls --filter "name=^pod_${project}$" --format '{{.Name}}' 2>/dev/null || true
  fi
  engine network ls --filter "name=^${project}_default$" --format '{{.Name}}' 2>/dev/null || true
}

command=${1:-up}
shift || true
case $command in
  images) images ;;
  up)
    images
    globals=(); flags=(); services=(); scale=0
    while [ $# -gt 0 ]; do
      case $1 in
        --profile) globals+=("$1" "$2"); [ "$2" = scale ] && scale=1; shift 2 ;;
        -*) flags+=("$1"); shift ;;
        *) services+=("$1"); shift ;;
      esac
    done
    if [ -z "$GRAFANA_IMAGE" ] && [ ${#services[@]} = 0 ]; then
      # No Grafana: name the other services (a named service of a profile starts with it).
      services=(translator prometheus)
      [ $scale = 1 ] && services+=(translator-replica nginx)
    fi
    compose "${globals[@]}" up -d --no-build "${flags[@]}" "${services[@]}" ;;
  down)
    compose --profile scale down "$@" || true
    left=$(leftovers | sort -u)
    [ -z "$left" ] || die "left after down: $(echo "$left" | tr '\n' ' ')" ;;
  compose) compose "$@" ;;
  engine) engine "$@" ;;
  env)
    echo "CONTAINER_ENGINE=$ENGINE"
    [ -n "${CONTAINERS_CONF:-}" ] && echo "CONTAINERS_CONF=$CONTAINERS_CONF"
    echo "COMPOSE='${COMPOSE[*]}'" ;;
  *) die "unknown command $command (images, up, down, compose, engine, env)" ;;
esac
