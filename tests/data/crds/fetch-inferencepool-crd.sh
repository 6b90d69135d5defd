#!/bin/sh
# Fetch the Gateway API Inference Extension CRDs the tests use, at the pinned version of its Go
# module, and check each against its recorded sha256:
#   inference.networking.k8s.io_inferencepools.yaml        InferencePool (v1): what the operator writes
#   inference.networking.x-k8s.io_inferenceobjectives.yaml InferenceObjective: the endpoint picker
#                                                          watches it, so it must be served
#
#   tests/data/crds/fetch-inferencepool-crd.sh          verify the vendored copies against upstream
#   tests/data/crds/fetch-inferencepool-crd.sh --write  (re)write the vendored copies
#
# To move the pin: change VERSION, run with --write, and record the new sha256s here, in
# README.md next to this script and in tests/unit/operator/test_inference_pool.py.
set -eu
MODULE=sigs.k8s.io/gateway-api-inference-extension
VERSION=v1.2.0
PINS="
inference.networking.k8s.io_inferencepools.yaml 87d5eb89eabd776a1936b0df8e6c144e086d743374bd91c6b865cfb28dbd6b60
inference.networking.x-k8s.io_inferenceobjectives.yaml 499f80fe3b7d9a8be54e454f1d9e7defb90adbf679167039e7f6df611f3c97f5
"

here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A throwaway module: `go mod download` needs one to resolve the version.
(cd "$work" && go mod init genpool.dev/fetch-crd >/dev/null 2>&1 \
  && GOFLAGS=-mod=mod go mod download -json "$MODULE@$VERSION" >download.json)
dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' "$work/download.json")

echo "$PINS" | while read -r file sha; do
  [ -n "$file" ] || continue
  upstream="$dir/config/crd/bases/$file"
  test -f "$upstream" || { echo "not in $MODULE@$VERSION: config/crd/bases/$file" >&2; exit 1; }
  got=$(sha256sum "$upstream" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then
    echo "sha256 mismatch for $MODULE@$VERSION $file: got $got, pinned $sha" >&2
    exit 1
  fi
  if [ "${1:-}" = "--write" ]; then
    cp "$upstream" "$here/$file"
    chmod 644 "$here/$file"
    echo "wrote $file ($MODULE@$VERSION, sha256 $got)"
  else
    mine=$(sha256sum "$here/$file" | cut -d' ' -f1)
    if [ "$mine" != "$sha" ]; then
      echo "vendored $file differs from $MODULE@$VERSION (sha256 $mine); rerun with --write" >&2
      exit 1
    fi
    echo "ok: $file is $MODULE@$VERSION (sha256 $got)"
  fi
done
