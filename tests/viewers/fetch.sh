#!/usr/bin/env bash
# Fetches the trace viewers the tests load weft's output into: speedscope's
# web app (from npm; its registry checks the tarball's integrity). Chromium
# itself comes from Debian (chromium-headless-shell, see scripts/test).
#
#   tests/viewers/fetch.sh      fills ${CARGO_TARGET_DIR:-<repo>/target}/viewers
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
dir=${CARGO_TARGET_DIR:-$repo/target}/viewers
version=1.25.0
want=$dir/speedscope-$version/dist/release/index.html
[[ -s $want ]] && exit 0
command -v npm >/dev/null || { echo "fetch.sh: npm is needed (apt-get install npm)" >&2; exit 1; }
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack -q "speedscope@$version" >/dev/null)
mkdir -p "$tmp/x"
tar -xzf "$tmp/speedscope-$version.tgz" -C "$tmp/x"
rm -rf "$dir/speedscope-$version"
mv "$tmp/x/package" "$dir/speedscope-$version"
[[ -s $want ]] || { echo "fetch.sh: no $want in speedscope's package" >&2; exit 1; }
echo "fetch.sh: speedscope $version in $dir/speedscope-$version"
