#!/usr/bin/env bash
# Installs rlrec (editable) with the given extras into the Python that scripts/python.sh chooses
# (the active venv, else the machine's python when pip may install into it, else .venv), e.g.
#   bash scripts/setup.sh                        # just rlrec
#   bash scripts/setup.sh dev maniskill          # + what the tests and env=maniskill need
# torch is taken from scripts/constraints.txt (CPU build) when it is not installed yet; all
# extras are resolved by one pip call. Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python.sh
extras=$(IFS=,; echo "$*")
spec="."
[ -n "$extras" ] && spec=".[${extras}]"
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q -c scripts/constraints.txt torch
fi
"$PY" -m pip install -q -c scripts/constraints.txt -e "$spec"
