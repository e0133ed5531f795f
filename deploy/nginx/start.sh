#!/bin/sh
# Starts nginx for the compose profile `scale` (docker-compose.yml mounts deploy/nginx/ read-only at
# /etc/nginx/translator and runs this), whatever the engine and the nginx version:
#
# - the resolver is the container's own DNS server from /etc/resolv.conf (Docker: 127.0.0.11; podman:
#   the network's gateway), written into upstream.compose.conf in place of 127.0.0.11;
# - nginx >= 1.27.3 re-resolves `translator-replica` itself (`server ... resolve`), so replicas that
#   start later, restart or scale join the pool;
# - older nginx (Debian 12's 1.22) resolves names only when loading its configuration: the upstream
#   is written without `resolve` once the name resolves, and this script reloads nginx whenever the
#   replicas' addresses change (checked every 5 s).
#
# The configuration goes to /tmp/nginx (writable with a read-only root file system too).
set -eu
src=/etc/nginx/translator
run=/tmp/nginx
name=translator-replica
mkdir -p "$run"
cp "$src/nginx.conf" "$run/nginx.conf"
resolver=$(awk '$1 == "nameserver" { print $2; exit }' /etc/resolv.conf)
version=$(nginx -v 2>&1 | sed -n 's|.*nginx/\([0-9.]*\).*|\1|p')
start="nginx -p $run/ -c $run/nginx.conf -e stderr"

# (awk, not sort -V: busybox's sort has no -V)
if [ "$(echo "$version" | awk -F. '{ print ($1 * 1000000 + $2 * 1000 + $3 >= 1027003) }')" = 1 ]; then
  sed "s/127\.0\.0\.11/${resolver:-127.0.0.11}/" "$src/upstream.compose.conf" > "$run/upstream.conf"
  echo "nginx $version: resolver $resolver, $name re-resolved by nginx" >&2
  exec $start -g 'daemon off;'
fi

addresses() { getent ahostsv4 "$name" 2>/dev/null | awk '{ print $1 }' | sort -u | tr '\n' ' '; }
write_upstream() {
  sed -e '/^resolver /d' -e 's/ resolve / /' "$src/upstream.compose.conf" > "$run/upstream.conf"
}
# Start order does not matter: wait for the replicas' name (compose may start nginx first).
waited=0
until [ -n "$(addresses)" ]; do
  [ $waited = 0 ] && echo "nginx $version: waiting for $name to resolve" >&2
  waited=$((waited + 1))
  sleep 1
done
current=$(addresses)
write_upstream
echo "nginx $version (no upstream resolve): $name = $current; reloading when that changes" >&2
$start -g 'daemon off;' &
pid=$!
trap 'kill -QUIT $pid 2>/dev/null; wait $pid; exit 0' TERM INT QUIT
while kill -0 $pid 2>/dev/null; do
  sleep 5 &
  wait $! || true
  now=$(addresses)
  if [ -n "$now" ] && [ "$now" != "$current" ]; then
    echo "$name: $current-> $now: reloading" >&2
    current=$now
    $start -s reload || true
  fi
done
wait $pid
