#!/usr/bin/env bash
# The main job on a fresh machine: installs rlrec (scripts/setup.sh), then runs train.py with the
# Python it installed into (scripts/python.sh says which); arguments go to train.py.
#   bash scripts/train.sh                      # the built-in env on the CPU, 200k steps
#   bash scripts/train.sh +experiment=smoke    # any train.py overrides
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python.sh
bash scripts/setup.sh
exec "$PY" train.py "$@"
