#!/usr/bin/env bash
# Installs everything the tests need on a fresh machine, then runs the whole suite with the Python
# that scripts/python.sh chooses:  bash scripts/test.sh [pytest args]
# Two pytest-xdist workers, worksteal (RLREC_TEST_WORKERS=N; 0: one process). Set-up steps already
# done are skipped; their time is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python.sh
start=$SECONDS
step() {  # runs a set-up step and says how long it took
  local t=$SECONDS
  "$@"
  echo "scripts/test.sh: $* took $((SECONDS - t)) s"
}
# rlrec and every extra the tests use, in one pip resolve: the setup_*.sh below then find their
# extra installed and do only their system packages (one apt-get update for all) and warm-ups
step bash scripts/setup.sh dev maniskill genesis genesis-forge launchers export dataset
step bash scripts/setup_genesis.sh --install
# Genesis's kernel compile (minutes on one core, the longest step) runs beside the other steps
step bash scripts/setup_genesis.sh --warm-up &
genesis=$!
trap 'kill "$genesis" 2>/dev/null || true' EXIT  # a failed step below ends it too
step bash scripts/setup_maniskill.sh
step bash scripts/setup_browser.sh
step bash scripts/setup_launchers.sh   # the Ray launcher's venv
step "$PY" -m tests.base_venv          # the venvs of test_dependencies.py, test_onnx_policy.py, tests/dataset (LeRobot)
wait "$genesis"
trap - EXIT
echo "scripts/test.sh: set-up took $((SECONDS - start)) s"
"$PY" -m ruff check .            # lint (pyproject.toml [tool.ruff])
"$PY" -m ruff format --check .   # the code is formatted as ruff formats it
exec "$PY" -m pytest -n "${RLREC_TEST_WORKERS:-2}" --dist worksteal "$@"
