#!/usr/bin/env bash
# Local base images for machines that cannot pull from a registry (air-gapped sites, CI runners without
# Docker Hub): built from Debian packages with mmdebstrap and imported into the local daemon.
#
#   deploy/docker/local-base.sh [python|redis|all]     (default: all; root, needs mmdebstrap and docker)
#
#   local/bookworm-py:3.11   Debian bookworm minbase + python3.11, venv, CA bundle   (BASE_IMAGE of every service)
#   local/redis:7            Debian bookworm minbase + redis-server 7                (the compose file's redis)
#
# An image that already exists is kept (delete it to rebuild). The mirror is the first Debian URI of the
# host's apt sources (MIRROR overrides it), so a site mirror works the same way.
set -euo pipefail

PY_IMAGE=${PY_IMAGE:-local/bookworm-py:3.11}
REDIS_IMAGE=${REDIS_IMAGE:-local/redis:7}
SUITE=${SUITE:-bookworm}
what=${1:-all}

say() { printf '[local-base] %s\n' "$*" >&2; }

mirror() {
  if [[ -n "${MIRROR:-}" ]]; then echo "$MIRROR"; return; fi
  local uri
  uri=$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
        | grep -E 'debian/?$|debian ' | grep -v security | head -1 \
        | sed -E 's/^URIs:[[:space:]]*//; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^ ]+).*/\2/')
  echo "${uri:-http://deb.debian.org/debian}"
}

have() { docker image inspect "$1" >/dev/null 2>&1; }

# build IMAGE PACKAGES CHANGES...: one mmdebstrap tarball imported as IMAGE with the given Dockerfile changes.
build() {
  local image=$1 packages=$2; shift 2
  if have "$image"; then say "$image exists"; return; fi
  command -v mmdebstrap >/dev/null || { say "mmdebstrap is not installed (apt-get install mmdebstrap)"; exit 1; }
  local tmp; tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  say "building $image from $SUITE ($(mirror)): $packages"
  # Without documentation and apt lists: they are a third of a minbase tree.
  mmdebstrap --quiet --variant=minbase --include="$packages" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    "$SUITE" "$tmp/root.tar" "$(mirror)"
  local changes=()
  for c in "$@"; do changes+=(--change "$c"); done
  docker import "${changes[@]}" "$tmp/root.tar" "$image" >/dev/null
  say "$image: $(docker image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"
}

if [[ $what == python || $what == all ]]; then
  build "$PY_IMAGE" python3.11,python3.11-venv,ca-certificates \
    'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' 'ENV LANG=C.UTF-8' 'CMD ["python3.11"]'
fi
if [[ $what == redis || $what == all ]]; then
  # Runs as root in /data like the official image's default command does (AOF lives there).
  build "$REDIS_IMAGE" redis-server \
    'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' 'WORKDIR /data' 'EXPOSE 6379' \
    'CMD ["redis-server", "--protected-mode", "no"]'
fi
