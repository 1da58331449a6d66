#!/usr/bin/env bash
# Development certificates for TLS and mTLS between RollArt services (compose, tests, a first cluster).
#
#   deploy/tls/make-certs.sh OUT_DIR [EXTRA_NAME ...]
#
# Writes into OUT_DIR (created; existing files are replaced):
#   ca.crt ca.key            a throwaway CA (2 days unless DAYS is set)
#   server.crt server.key    one server certificate for every service: localhost, 127.0.0.1, the service
#                            names of docker-compose.yml / deploy/k8s (and their <name>.<namespace>.svc forms
#                            for NAMESPACE, default rollart), plus EXTRA_NAMEs (a DNS name or an IP)
#   client.crt client.key    the client certificate services and the CLI present under mTLS
# Keys are mode 0644 so that the images' unprivileged user (uid 10001) can read a bind mount: these are
# development certificates. Use your own PKI (cert-manager, a site CA) for anything else.
set -euo pipefail

out=${1:?usage: make-certs.sh OUT_DIR [EXTRA_NAME ...]}
shift
DAYS=${DAYS:-2}
NAMESPACE=${NAMESPACE:-rollart}
SERVICES=(resource-manager ledger relay trainer actor actor-2 llmproxy envmanager reward redis mooncake)

mkdir -p "$out"
cd "$out"

san="DNS:localhost,IP:127.0.0.1"
for s in "${SERVICES[@]}"; do
  san+=",DNS:$s,DNS:$s.$NAMESPACE,DNS:$s.$NAMESPACE.svc"
done
for name in "$@"; do
  if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then san+=",IP:$name"; else san+=",DNS:$name"; fi
done

ossl() { openssl "$@" 2>/dev/null; }
ossl req -x509 -newkey rsa:2048 -nodes -days "$DAYS" -subj "/CN=rollart-dev-ca" -keyout ca.key -out ca.crt
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" > server.ext
printf 'extendedKeyUsage=clientAuth\n' > client.ext
for name in server client; do
  ossl req -newkey rsa:2048 -nodes -subj "/CN=rollart-$name" -keyout "$name.key" -out "$name.csr"
  ossl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$DAYS" \
    -extfile "$name.ext" -out "$name.crt"
done
rm -f server.csr client.csr server.ext client.ext ca.srl
chmod 0644 ./*.crt ./*.key
echo "$out: ca.crt server.crt server.key client.crt client.key"
