#!/usr/bin/env bash
# Verifies a quictun release directory: the signature of SHA256SUMS by a key
# in ALLOWED_SIGNERS for IDENTITY, then every file SHA256SUMS lists that is
# present (archives and provenance.json; at least one archive).
#
#   bash scripts/verify-release.sh [-a] DIR ALLOWED_SIGNERS [IDENTITY]
#
# ALLOWED_SIGNERS is the release signer's line, taken from somewhere other than
# the release (SECURITY.md, "Verifying a release"): `IDENTITY namespaces="file"
# ssh-ed25519 AAAA...`. IDENTITY defaults to the file's first one. -a: every
# file SHA256SUMS lists must be present. The same by hand:
#   ssh-keygen -Y verify -f ALLOWED_SIGNERS -I IDENTITY -n file -s SHA256SUMS.sig < SHA256SUMS
#   sha256sum -c --ignore-missing SHA256SUMS
set -euo pipefail
all=
if [ "${1:-}" = -a ]; then all=1; shift; fi
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: $0 [-a] DIR ALLOWED_SIGNERS [IDENTITY]" >&2
  exit 2
fi
dir=$1
signers=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
identity=${3:-$(awk '!/^[[:space:]]*(#|$)/ { print $1; exit }' "$signers")}
if [ -z "$identity" ]; then
  echo "verify-release: $signers names no signer" >&2
  exit 1
fi
cd "$dir"
for f in SHA256SUMS SHA256SUMS.sig; do
  if [ ! -f "$f" ]; then
    echo "verify-release: no $f in $dir: the release is not signed, so who made it cannot be checked" >&2
    exit 1
  fi
done
if ! ssh-keygen -Y verify -f "$signers" -I "$identity" -n file -s SHA256SUMS.sig < SHA256SUMS; then
  echo "verify-release: SHA256SUMS is not signed by $identity's key in $signers" >&2
  exit 1
fi
if command -v sha256sum >/dev/null; then sums=(sha256sum); else sums=(shasum -a 256); fi  # macOS: shasum
if [ -n "$all" ]; then
  "${sums[@]}" -c --strict SHA256SUMS
else
  # --ignore-missing passes when nothing listed is present: at least one archive must be
  present=0
  while read -r _ f; do
    if [ -f "$f" ] && [ "$f" != provenance.json ]; then present=$((present + 1)); fi
  done < SHA256SUMS
  if [ "$present" -eq 0 ]; then
    echo "verify-release: none of the archives SHA256SUMS lists is in $dir" >&2
    exit 1
  fi
  "${sums[@]}" -c --ignore-missing SHA256SUMS
fi
