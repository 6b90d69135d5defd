#!/bin/sh
# Fetch the InferencePool CRD (inference.networking.k8s.io/v1) at the pinned version of the
# Gateway API Inference Extension's Go module and check it against the recorded sha256.
#
#   tests/data/crds/fetch-inferencepool-crd.sh          verify the vendored copy against upstream
#   tests/data/crds/fetch-inferencepool-crd.sh --write  (re)write the vendored copy
#
# To move the pin: change VERSION, run with --write, and record the new sha256 printed in
# SHA256 below and in README.md next to this script.
set -eu
MODULE=sigs.k8s.io/gateway-api-inference-extension
VERSION=v1.2.0
SHA256=87d5eb89eabd776a1936b0df8e6c144e086d743374bd91c6b865cfb28dbd6b60
FILE=inference.networking.k8s.io_inferencepools.yaml

here=$(cd "$(dirname "$0")" && pwd)
vendored="$here/$FILE"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A throwaway module: `go mod download` needs one to resolve the version.
(cd "$work" && go mod init genpool.dev/fetch-crd >/dev/null 2>&1 \
  && GOFLAGS=-mod=mod go mod download -json "$MODULE@$VERSION" >download.json)
dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' "$work/download.json")
upstream="$dir/config/crd/bases/$FILE"
test -f "$upstream" || { echo "not in $MODULE@$VERSION: config/crd/bases/$FILE" >&2; exit 1; }

got=$(sha256sum "$upstream" | cut -d' ' -f1)
if [ "$got" != "$SHA256" ]; then
  echo "sha256 mismatch for $MODULE@$VERSION $FILE: got $got, pinned $SHA256" >&2
  exit 1
fi
if [ "${1:-}" = "--write" ]; then
  cp "$upstream" "$vendored"
  chmod 644 "$vendored"
  echo "wrote $vendored ($MODULE@$VERSION, sha256 $got)"
else
  mine=$(sha256sum "$vendored" | cut -d' ' -f1)
  if [ "$mine" != "$SHA256" ]; then
    echo "vendored $FILE differs from $MODULE@$VERSION (sha256 $mine); rerun with --write" >&2
    exit 1
  fi
  echo "ok: $FILE is $MODULE@$VERSION (sha256 $got)"
fi
