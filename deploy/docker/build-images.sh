#!/usr/bin/env bash
# `make images`: every RollArt image from deploy/docker/Dockerfile, on machines with or without a registry.
#
#   deploy/docker/build-images.sh [TARGET ...]   (default: every service, devtools; TAG=dev)
#
# 1. Base images. BASE_IMAGE (default python:3.11-slim) is used when it is present or can be pulled;
#    otherwise local/bookworm-py:3.11 is built from Debian packages (local-base.sh, mmdebstrap) and used.
#    The compose file's redis likewise falls back to local/redis:7 (REDIS_IMAGE is printed for compose).
# 2. Python packages come through the build host's pip settings (`pip config list`: index, extra indexes,
#    find-links such as a local wheelhouse with the CPU torch wheel, constraints, CA bundle): a loopback
#    HTTP server on 127.0.0.1:$PIP_PROXY_PORT serves them, rewritten, to `docker build --network host`,
#    and deploy/docker/pip.sh uses them for one command at a time (nothing of it stays in a layer). The
#    host virtualenv's versions (`pip freeze`, when $VENV exists) are constraints too: images run what
#    the tests ran. A host without pip settings builds with pip's defaults.
# 3. The build context is a tar of libs/, services/, tools/ and deploy/docker/pip.sh (the classic builder
#    ignores Dockerfile.dockerignore, and the repository holds a multi-GB .venv).
#
# Environment: TAG, BASE_IMAGE, REDIS_IMAGE, VENV (default .venv), PIP_PROXY_PORT (default 58080),
# TORCH_INDEX_URL (default: the Dockerfile's PyTorch CPU index, empty when the host's pip settings exist),
# DOCKER_BUILD_ARGS (more `docker build` flags). Images: rollart/<target>:$TAG.
set -euo pipefail
cd "$(dirname "$0")/../.."

TAG=${TAG:-dev}
VENV=${VENV:-.venv}
PORT=${PIP_PROXY_PORT:-58080}
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(resource-manager ledger relay trainer actor llmproxy envmanager reward devtools)

say() { printf '[images] %s\n' "$*" >&2; }
have() { docker image inspect "$1" >/dev/null 2>&1; }
pullable() { have "$1" || timeout "${PULL_TIMEOUT:-60}" docker pull -q "$1" >/dev/null 2>&1; }

# ------------------------------------------------------------------------------------------- 1. bases
BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim}
if ! pullable "$BASE_IMAGE"; then
  say "$BASE_IMAGE cannot be pulled: using local/bookworm-py:3.11 (Debian packages)"
  deploy/docker/local-base.sh python
  BASE_IMAGE=local/bookworm-py:3.11
fi
REDIS_IMAGE=${REDIS_IMAGE:-redis:7}
if ! pullable "$REDIS_IMAGE"; then
  say "$REDIS_IMAGE cannot be pulled: using local/redis:7 (Debian packages)"
  deploy/docker/local-base.sh redis
  REDIS_IMAGE=local/redis:7
fi

# ------------------------------------------------------------------------------ 2. host pip settings
work=$(mktemp -d)
server=""
cleanup() {
  [[ -n "$server" ]] && kill "$server" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

PY=python3
[[ -x "$VENV/bin/python" ]] && PY="$VENV/bin/python"
PIP_CONFIG_URL=""
host_pip=$("$PY" -m pip config list 2>/dev/null || true)   # (not piped into grep -q: SIGPIPE + pipefail)
if [[ -n "$host_pip" ]]; then
  mkdir -p "$work/srv"
  "$PY" - "$work/srv" "http://127.0.0.1:$PORT" "$PY" <<'EOF'
"""Rewrite the host's pip settings for a build container that reaches the host only on 127.0.0.1:PORT."""
import os, shutil, subprocess, sys
from urllib.parse import unquote, urlparse

srv, base, py = sys.argv[1:4]
raw = subprocess.run([py, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True).stdout
conf: dict[str, str] = {}
for line in raw.splitlines():  # "global.find-links='/opt/wheels'" or ":env:.cert='...'"; env wins
    key, _, value = line.partition("=")
    conf[key.rpartition(".")[2]] = value.strip("'\"")
links = 0

def serve(path: str, keep_parent: bool) -> str:
    """A URL on the loopback server for a local path (an index keeps its parent: its links are relative)."""
    global links
    links += 1
    path = os.path.abspath(path.rstrip("/"))
    name = f"p{links}"
    if keep_parent:
        os.symlink(os.path.dirname(path), f"{srv}/{name}")
        return f"{base}/{name}/{os.path.basename(path)}/"
    os.symlink(path, f"{srv}/{name}")
    return f"{base}/{name}/" if os.path.isdir(path) else f"{base}/{name}"

def local(value: str) -> str | None:
    if value.startswith("file://"):
        return unquote(urlparse(value).path)
    return None if "://" in value else value

out = ["[global]"]
for key in ("index-url", "extra-index-url", "find-links", "constraint"):
    if key not in conf:
        continue
    urls = []
    for item in conf[key].split():
        path = local(item)
        urls.append(item if path is None else serve(path, keep_parent=key.endswith("index-url")))
    out.append(f"{key} = {' '.join(urls)}")
for key in ("default-timeout", "retries", "timeout", "trusted-host"):
    if key in conf:
        out.append(f"{key} = {conf[key]}")
# The versions the host's tests ran with (editable local packages left out: the build installs them).
if os.path.isfile(os.path.join(os.path.dirname(py), "activate")):
    frozen = subprocess.run([py, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True).stdout
    pins = [ln for ln in frozen.splitlines() if "==" in ln and not ln.startswith(("-e", "#"))]
    with open(f"{srv}/venv-constraints.txt", "w") as f:
        f.write("\n".join(pins) + "\n")
    line = next((i for i, ln in enumerate(out) if ln.startswith("constraint =")), None)
    if line is None:
        out.append(f"constraint = {base}/venv-constraints.txt")
    else:
        out[line] += f" {base}/venv-constraints.txt"
with open(f"{srv}/pip.conf", "w") as f:
    f.write("\n".join(out) + "\n")
shutil.copyfile(conf.get("cert") or "/etc/ssl/certs/ca-certificates.crt", f"{srv}/ca.crt")
EOF
  say "host pip settings served on 127.0.0.1:$PORT: $(grep -v '^\[' "$work/srv/pip.conf" | tr '\n' ' ')"
  "$PY" -m http.server --bind 127.0.0.1 --directory "$work/srv" "$PORT" >"$work/http.log" 2>&1 &
  server=$!
  for _ in $(seq 50); do
    "$PY" -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=1)" \
      "http://127.0.0.1:$PORT/pip.conf" 2>/dev/null && break
    sleep 0.1
  done
  PIP_CONFIG_URL="http://127.0.0.1:$PORT"
  TORCH_INDEX_URL=${TORCH_INDEX_URL-}
fi

# ----------------------------------------------------------------------------------------- 3. builds
args=(--network host --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "PIP_CONFIG_URL=$PIP_CONFIG_URL")
[[ -v TORCH_INDEX_URL ]] && args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
# shellcheck disable=SC2206
args+=(${DOCKER_BUILD_ARGS:-})
tar -cf "$work/context.tar" --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' --exclude=.venv \
  --exclude=node_modules --exclude=build libs services tools deploy/docker/Dockerfile deploy/docker/pip.sh
say "context: $(du -h "$work/context.tar" | cut -f1); base $BASE_IMAGE"
for target in "${TARGETS[@]}"; do
  start=$SECONDS
  say "building rollart/$target:$TAG"
  if ! docker build -f deploy/docker/Dockerfile --target "$target" -t "rollart/$target:$TAG" "${args[@]}" \
      - <"$work/context.tar" >"$work/build-$target.log" 2>&1; then
    tail -30 "$work/build-$target.log" >&2
    say "rollart/$target:$TAG failed"
    exit 1
  fi
  say "rollart/$target:$TAG built in $((SECONDS - start))s"
done
# What compose needs besides the service images (build/images.env; docker-compose.local.yml reads them).
mkdir -p build
printf 'REDIS_IMAGE=%s\nBASE_IMAGE=%s\nROLLART_TAG=%s\n' "$REDIS_IMAGE" "$BASE_IMAGE" "$TAG" >build/images.env
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E "^rollart/|^local/" >&2 || true
