#!/bin/sh
# `pip` of the image builds (installed as /usr/local/bin/rollart-pip; runs the image's virtualenv pip).
#
# With PIP_CONFIG_URL set (deploy/docker/build-images.sh does, pointing at a loopback server on the build
# host, reached with `docker build --network host`), pip uses the build host's package index settings:
# PIP_CONFIG_URL/pip.conf (indexes, find-links and constraints rewritten to that server) and the host's CA
# bundle PIP_CONFIG_URL/ca.crt. Both live in a temporary folder for this one command, so no layer keeps
# them. Without it, pip's defaults (PyPI) apply.
set -eu
if [ -n "${PIP_CONFIG_URL:-}" ]; then
  conf=$(mktemp -d)
  trap 'rm -rf "$conf"' EXIT
  python3.11 - "$PIP_CONFIG_URL" "$conf" <<'EOF'
import sys
import urllib.request

base, out = sys.argv[1].rstrip("/"), sys.argv[2]
for name in ("pip.conf", "ca.crt"):
    urllib.request.urlretrieve(f"{base}/{name}", f"{out}/{name}")
EOF
  # Also the process-wide trust store: pip's isolated build-dependency installs and truststore read it.
  printf 'cert = %s\n' "$conf/ca.crt" >>"$conf/pip.conf"
  export PIP_CONFIG_FILE="$conf/pip.conf" PIP_CERT="$conf/ca.crt" SSL_CERT_FILE="$conf/ca.crt"
fi
"${VIRTUAL_ENV:-/opt/rollart/venv}/bin/python" -m pip "$@"
