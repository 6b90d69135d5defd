#!/bin/sh
# Copy the GenPool CRD into the chart. The chart's copy must stay byte-identical to
# crds/genpool.dev_genpools.yaml (tests/chart/test_chart_render.py checks it), and helm
# reads crds/ only from inside the chart directory, so a symlink would not survive
# `helm package`.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cp "$here/../crds/genpool.dev_genpools.yaml" "$here/genpool/crds/genpool.dev_genpools.yaml"
echo "synced charts/genpool/crds/genpool.dev_genpools.yaml"
