#!/usr/bin/env bash
# One-call GPU check (see scripts/gpu_check.py): writes results/gpu-check.md in <= 10 minutes.
# Works from a bare clone: creates .venv and installs dfbench when they are missing.
#   scripts/gpu_check.sh                 # CUDA
#   DEVICE=cpu scripts/gpu_check.sh      # dry run of the script on the CPU (small budgets)
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    # --system-site-packages: reuse the CUDA torch a GPU machine already has instead of downloading one.
    echo "[gpu-check] creating $VENV" >&2
    "$PY" -m venv --system-site-packages "$VENV" || exit 1
fi
if ! "$VENV/bin/python" -c "import dfbench.benchmark.cli" 2>/dev/null; then
    echo "[gpu-check] installing dfbench into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet -e . \
        || "$VENV/bin/python" -m pip install --quiet --no-build-isolation --no-deps -e . \
        || { echo "[gpu-check] could not install dfbench (torch and the other dependencies must be installable or present)" >&2; exit 1; }
fi
exec "$VENV/bin/python" scripts/gpu_check.py "$@"
