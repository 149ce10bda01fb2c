#!/usr/bin/env bash
# Installs rlrec (editable) with the given extras into the Python scripts/python.sh chooses, torch
# from scripts/constraints.txt (CPU) when missing, in one pip resolve; idempotent:
#   bash scripts/setup.sh [dev maniskill ...]
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
