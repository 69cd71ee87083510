#!/usr/bin/env bash
# What `make test` needs on the machine itself: the Debian packages of .ci/apt-packages.txt (the tests run the
# real nginx, nft, ip netns, docker, sshd, openssl…) and a running Docker engine. Installs what is missing and
# starts dockerd when it is not answering; does nothing when both are there.
#
# Needs root: the tests create network namespaces, nftables tables and tmpfs mounts, and install packages.
set -euo pipefail
cd "$(dirname "$0")/.."

packages="$(grep -v '^#' .ci/apt-packages.txt | tr '\n' ' ')"
missing=""
for p in $packages; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done

if [ "$(id -u)" -ne 0 ]; then
  echo "make test needs root (uid 0): the tests create network namespaces, nftables tables and tmpfs mounts," >&2
  echo "start containers in the local Docker engine and install Debian packages. This is uid $(id -u)." >&2
  echo "Run it as root on a throwaway machine or VM:  sudo make test" >&2
  if [ -n "$missing" ]; then echo "Debian packages still missing:$missing (apt-get install$missing)" >&2; fi
  exit 2
fi

if [ -n "$missing" ]; then
  echo "test services: installing Debian packages:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# The Docker tests import their images (`docker import`): no registry is reached.
if ! docker info >/dev/null 2>&1; then
  echo "test services: starting dockerd (log: /tmp/dockerd.log)"
  (setsid dockerd >/tmp/dockerd.log 2>&1 &)
  for _ in $(seq 120); do docker info >/dev/null 2>&1 && break; sleep 1; done
  if ! docker info >/dev/null 2>&1; then
    echo "dockerd did not answer within 120 s; the end of /tmp/dockerd.log:" >&2
    tail -20 /tmp/dockerd.log >&2
    exit 1
  fi
fi
echo "test services: Debian packages present, Docker $(docker info --format '{{.ServerVersion}}') answering"
