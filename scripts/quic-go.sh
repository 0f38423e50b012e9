#!/usr/bin/env bash
# Builds the patched quic-go tree that go.mod's replace directive points at:
# takes the exact quic-go version go.mod requires from the module proxy
# (checked against the pinned checksum in third_party/quic-go/BASE and by the
# go command against the checksum database), copies it to
# third_party/quic-go/run-make-quic-go (git-ignored) and applies
# third_party/quic-go/patches/*.patch in order. Every entry point (make build,
# test, demo, bench, .ci/run, the Dockerfile) runs it first; it does nothing
# when the tree is already up to date.
#
# Usage: scripts/quic-go.sh [--force]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
export GOFLAGS="${GOFLAGS:-} -mod=mod"

dir=third_party/quic-go
out=$dir/run-make-quic-go
module=github.com/quic-go/quic-go

read -r base_mod base_ver base_sum < <(grep -v '^#' "$dir/BASE")
want=$(awk -v m="$module" '$1 == m && $2 ~ /^v/ { print $2; exit }' go.mod)
if [ "$want" != "$base_ver" ] || [ "$base_mod" != "$module" ]; then
  echo "quic-go.sh: go.mod requires $module ${want:-(none)}, but the patches in $dir/patches were made for $base_ver." >&2
  echo "quic-go.sh: rebase the patches onto $want first (see $dir/README.md), then update $dir/BASE." >&2
  exit 1
fi

stamp=$(cat "$dir/BASE" "$dir"/patches/*.patch "$0" | sha256sum | cut -d' ' -f1)
if [ "${1:-}" != "--force" ] && [ -f "$out/.quictun-stamp" ] && [ "$(cat "$out/.quictun-stamp")" = "$stamp" ]; then
  exit 0
fi

json=$(go mod download -json "$module@$base_ver")
src=$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
sum=$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Sum": "\(.*\)",\{0,1\}$/\1/p')
if [ -z "$src" ] || [ ! -d "$src" ]; then
  echo "quic-go.sh: go mod download gave no directory for $module@$base_ver:" >&2
  printf '%s\n' "$json" >&2
  exit 1
fi
if [ "$sum" != "$base_sum" ]; then
  echo "quic-go.sh: $module@$base_ver has checksum $sum, expected $base_sum (from $dir/BASE); refusing to build on it." >&2
  exit 1
fi

tmp=$(mktemp -d "$dir/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp -R "$src/." "$tmp/"
chmod -R u+w "$tmp"
for p in "$dir"/patches/*.patch; do
  if ! git apply --unsafe-paths -p1 --whitespace=nowarn --directory="$tmp" "$p" 2>"$tmp.err"; then
    echo "quic-go.sh: $(basename "$p") does not apply to $module@$base_ver:" >&2
    cat "$tmp.err" >&2
    rm -f "$tmp.err"
    exit 1
  fi
done
rm -f "$tmp.err"
printf '%s\n' "$stamp" >"$tmp/.quictun-stamp"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "quic-go.sh: $out is $module@$base_ver with $(ls "$dir"/patches/*.patch | wc -l) patches applied"
