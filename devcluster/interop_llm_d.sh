#!/usr/bin/env bash
# llm-d interop run (docs/llm-d-interop-notes.md): llm-d's unmodified pd-sidecar and epp in
# front of GenPool workers. Fetch-free: the llm-d-router source must already be on disk.
#
#   LLMD_SRC=/tmp/llm-d-router devcluster/interop_llm_d.sh [capture|local|run|precise-prefix] [options]
#
#   capture         the sidecar between recording fakes (+ a synthetic worker): the exact legs it sends
#   local           prefill + decode workers on loopback, the sidecar in front of the decode worker
#   run             (default) the devcluster: a P/D GenPool, llm-d's epp for its InferencePool, the sidecar
#   precise-prefix  the devcluster: a GenPool with KV events, llm-d's epp with its precise
#                   prefix-cache scorer, a multi-turn load (and a control run, events off)
#
# Builds pd-sidecar and epp (CGO off, -trimpath) into ~/.cache/genpool/llm-d/<version>/bin
# when absent (precise-prefix: the epp only); <version> is `git describe --tags --always` of
# $LLMD_SRC. LLMD_BIN names another directory (an epp built by hand: LLMD_COMMIT records
# its llm-d-router commit when $LLMD_SRC is not a git checkout).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LLMD_SRC="${LLMD_SRC:-/tmp/llm-d-router}"
PY="${PY:-$ROOT/.venv/bin/python}"

if [[ ! -f "$LLMD_SRC/go.mod" ]] || ! grep -q '^module github.com/llm-d/llm-d-router' "$LLMD_SRC/go.mod"; then
  echo "LLMD_SRC=$LLMD_SRC is not an llm-d-router checkout (module github.com/llm-d/llm-d-router)" >&2
  exit 2
fi
VERSION="$(git -C "$LLMD_SRC" describe --tags --always 2>/dev/null || echo unknown)"
COMMIT="${LLMD_COMMIT:-$(git -C "$LLMD_SRC" rev-parse HEAD 2>/dev/null || echo unknown)}"
BIN="${LLMD_BIN:-$HOME/.cache/genpool/llm-d/$VERSION/bin}"
mkdir -p "$BIN"

build() {  # build NAME PKG LDFLAGS: atomically, only when absent
  local name="$1" pkg="$2" ldflags="$3"
  [[ -x "$BIN/$name" ]] && return 0
  echo "[interop llm-d] building $name ($VERSION) into $BIN" >&2
  (cd "$LLMD_SRC" && CGO_ENABLED=0 nice go build -trimpath -ldflags "$ldflags" \
     -o "$BIN/$name.partial" "$pkg")
  mv "$BIN/$name.partial" "$BIN/$name"
}

cmd="run"
if [[ $# -gt 0 && "$1" != -* ]]; then
  cmd="$1"
  shift
fi

(
  flock -x 9
  if [[ "$cmd" != precise-prefix ]]; then
    build pd-sidecar ./cmd/pd-sidecar \
      "-X github.com/llm-d/llm-d-router/pkg/sidecar/version.CommitSHA=$COMMIT"
  fi
  build epp ./cmd/epp "-X github.com/llm-d/llm-d-router/version.CommitSHA=$COMMIT"
) 9>"$BIN/../build.lock"

extra=()
if [[ "$cmd" == precise-prefix ]]; then
  extra=(--epp-source-commit "$COMMIT")  # a later --epp-source-commit in "$@" wins
fi
cd "$ROOT"
# The pod runner runs llm-d's sidecar and epp, built above, as local processes; a real
# node would need images of them.
export GENPOOL_DEVCLUSTER_RUNTIME=podrunner
exec "$PY" -m genpool_devcluster.interop "$cmd" --bin "$BIN" "${extra[@]}" "$@"
