#!/usr/bin/env bash
# Launch the 2-rank gloo run of tests/runs/test_distributed.py (its worker mode, with the environment
# torchrun gives its workers) N times and count how each launch ended. Every launch must end
# with exit codes "0 0"; the old shutdown race ended some with rank 0 killed by SIGABRT
# ("terminate called without an active exception", exit code 134 / -6) after all jobs returned.
#
#     scripts/repeat_dist_launch.sh [N=20] [EVAL_SAMPLES=64]
#
# EVAL_SAMPLES sets how long rank 0 evaluates after the last round while rank 1 has nothing
# left to do: the window in which the race happened. Logs of failed launches are kept.
set -u
N=${1:-20}
EVAL_SAMPLES=${2:-64}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-${ROOT}/.venv/bin/python}
WORK=$(mktemp -d)
trap 'rm -rf "${WORK}"' EXIT
declare -A COUNTS=()
for i in $(seq 1 "${N}"); do
    PORT=$("${PY}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    SPEC="{\"world\": 2, \"root\": \"${WORK}/launch${i}\", \"jobs\": [{\"method\": \"fedavg\", \"over\": {\"data.clients\": 4, \"eval.samples\": ${EVAL_SAMPLES}}}]}"
    pids=()
    for rank in 0 1; do
        MASTER_ADDR=127.0.0.1 MASTER_PORT=${PORT} RANK=${rank} LOCAL_RANK=${rank} WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 \
        DFBENCH_DIST_TIMEOUT=60 OMP_NUM_THREADS=1 PYTHONPATH="${ROOT}/tests:${PYTHONPATH:-}" \
            timeout 300 "${PY}" "${ROOT}/tests/runs/test_distributed.py" "${SPEC}" > "${WORK}/rank${rank}.log" 2>&1 &
        pids+=($!)
    done
    codes=()
    for p in "${pids[@]}"; do wait "${p}"; codes+=($?); done
    key="${codes[0]} ${codes[1]}"
    COUNTS[${key}]=$(( ${COUNTS[${key}]:-0} + 1 ))
    echo "launch ${i}/${N}: exit codes ${key}"
    if [[ "${key}" != "0 0" ]]; then
        mkdir -p "${ROOT}/repeat_dist_logs/launch${i}"
        cp "${WORK}"/rank*.log "${ROOT}/repeat_dist_logs/launch${i}/"
    fi
done
echo "summary over ${N} launches (exit codes rank0 rank1: count):"
for key in "${!COUNTS[@]}"; do echo "  ${key}: ${COUNTS[${key}]}"; done
[[ "${COUNTS[0 0]:-0}" == "${N}" ]]
