#!/usr/bin/env bash
# Prepares the docker-compose.yml demo: generates the shared secret and the admin
# token (secrets/), creates the server's state (certificate and keys) in the
# server-state volume, and writes its fingerprint to .env for the client.
# Idempotent: existing secrets and state are kept.
set -euo pipefail
cd "$(dirname "$0")"
umask 077
mkdir -p secrets
chmod 0700 secrets
for f in secret admin-token; do
  if [ ! -s "secrets/$f" ]; then
    head -c 32 /dev/urandom | base64 > "secrets/$f"
  fi
  chmod 0644 "secrets/$f"   # readable by uid 65532 in the containers; the directory stays 0700
done
docker compose build server
fp=$(docker compose run --rm --no-deps server fingerprint --state-dir /var/lib/quictun-server | grep -o 'sha256:[0-9a-f]*' | head -n1)
if [ -z "$fp" ]; then
  echo "init.sh: could not read the server fingerprint" >&2
  exit 1
fi
echo "QUICTUN_SERVER_FINGERPRINT=$fp" > .env
echo "Server fingerprint $fp written to .env; now: docker compose up -d"
