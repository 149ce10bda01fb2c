#!/usr/bin/env bash
# Installs rlrec (editable) with the given extras into the current Python, e.g.
#   bash scripts/setup.sh            # just rlrec
#   bash scripts/setup.sh dev        # + what the tests need
# torch is taken from scripts/constraints.txt (CPU build) when it is not installed yet.
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
extras=$(IFS=,; echo "$*")
spec="."
[ -n "$extras" ] && spec=".[${extras}]"
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q -c scripts/constraints.txt torch
fi
"$PY" -m pip install -q -c scripts/constraints.txt -e "$spec"
