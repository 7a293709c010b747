#!/usr/bin/env bash
# One-call GPU check (see scripts/gpu_check.py): writes results/gpu-check.md in <= 10 minutes.
# Always runs THIS checkout's code, without installing dfbench (no setuptools, no network for it):
# a throw-away shim folder holds dfbench/ as symlinks into the checkout and goes first on
# PYTHONPATH (PYTHONSAFEPATH=1 keeps the working directory off the import path), so neither a stale
# installed dfbench nor the checkout's bare dfbench/ folder can shadow it; checked before the run.
# Interpreter: $PYTHON, else .venv/bin/python when it exists, else python3 (a GPU machine's python
# with CUDA torch works as it is). Dependencies ([project].dependencies of pyproject.toml) that the
# interpreter lacks are pip-installed into it (pip honours PIP_NO_INDEX / PIP_FIND_LINKS, so a folder
# of wheels works offline); only when python3 (PYTHON unset, no .venv) refuses that install is a
# .venv created, with --system-site-packages, to install into. Otherwise it says what to provide.
#   scripts/gpu_check.sh                 # CUDA
#   DEVICE=cpu scripts/gpu_check.sh      # dry run of the script on the CPU (small budgets)
#   PYTHON=/usr/bin/python3 scripts/gpu_check.sh
#   PIP_NO_INDEX=1 PIP_FIND_LINKS=/path/to/wheels scripts/gpu_check.sh
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd -P)
say() { echo "[gpu-check] $*" >&2; }

if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
elif [ -x "$ROOT/.venv/bin/python" ]; then
    PY=$ROOT/.venv/bin/python
else
    PY=python3
fi
if ! command -v "$PY" >/dev/null 2>&1; then
    say "no interpreter $PY (set PYTHON=/path/to/python3.11+)"
    exit 1
fi
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    say "$PY is not Python >= 3.11 (dfbench needs 3.11+); set PYTHON=/path/to/python3.11+"
    exit 1
fi

# -- the checkout as the importable dfbench ---------------------------------------------------
SHIM=$(mktemp -d "${TMPDIR:-/tmp}/dfbench-gpu-check.XXXXXX") || exit 1
trap 'rm -rf "$SHIM"' EXIT  # rm -rf removes the links, never what they point at
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir "$SHIM/dfbench" || exit 1
for f in __init__.py __main__.py; do ln -s "$ROOT/dfbench/$f" "$SHIM/dfbench/$f" || exit 1; done
for d in benchmark methods datasets; do ln -s "$ROOT/$d" "$SHIM/dfbench/$d" || exit 1; done
export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONSAFEPATH=1  # `python -m dfbench` run from the checkout would import its bare dfbench/ first

# every subprocess (python -m dfbench, torchrun's workers) inherits the two variables above
verify_shim() {  # the checkout is what "$PY" imports as dfbench, or an error naming both paths
    local where module path want
    where=$("$PY" scripts/gpu_check.py --where) || { say "could not import dfbench from the checkout with $PY"; return 1; }
    while read -r module path; do
        case $module in
            dfbench) want=$ROOT/dfbench/__init__.py ;;
            dfbench.*) want=$ROOT/${module#dfbench.}/__init__.py ;;
            *) continue ;;
        esac
        if [ "$path" != "$want" ]; then
            say "$module resolves to $path, not to the checkout's $want (a stale dfbench is imported first); refusing to check other code"
            return 1
        fi
    done <<< "$where"
    say "dfbench code: $ROOT (python: $PY; shim: $SHIM, removed at exit)"
}

install_missing() {  # pip-installs what "$PY" lacks of [project].dependencies; 1 (and $missing set) when some stay missing
    missing=$("$PY" scripts/gpu_check.py --missing) || { say "could not read pyproject.toml's dependencies"; missing="?"; return 1; }
    [ -z "$missing" ] && return 0
    say "installing into $PY: $missing"
    # shellcheck disable=SC2086  # one word per package
    "$PY" -m pip install --quiet $missing || return 1
    missing=$("$PY" scripts/gpu_check.py --missing) || missing="?"
    [ -z "$missing" ]
}

verify_shim || exit 1
if ! install_missing; then
    if [ -z "${PYTHON:-}" ] && [ "$PY" = python3 ] && [ "$missing" != "?" ]; then
        # no .venv and python3 refused the install (e.g. an externally managed system python):
        # a venv on top of the system's packages reuses a CUDA torch the machine already has
        say "creating .venv (--system-site-packages) to install into"
        if python3 -m venv --system-site-packages "$ROOT/.venv"; then
            PY=$ROOT/.venv/bin/python
            verify_shim || exit 1
            install_missing
        fi
    fi
    if [ -n "$missing" ]; then
        say "missing for $PY: $missing"
        say "\`$PY -m pip install $missing\` failed (no package index reachable, no pip, or an externally managed python)."
        say "Provide them, then rerun, e.g.:"
        say "  PIP_NO_INDEX=1 PIP_FIND_LINKS=/path/to/wheels make gpu-check   # a folder of wheels (\`pip download -d /path/to/wheels $missing\` where online)"
        say "  PYTHON=/path/to/python make gpu-check                          # an interpreter that has them (e.g. the system python with CUDA torch)"
        say "  python3 -m venv --system-site-packages .venv && make gpu-check   # a venv on top of the system's torch (used when PYTHON is unset)"
        exit 1
    fi
fi

"$PY" scripts/gpu_check.py "$@"
