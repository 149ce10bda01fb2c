#!/usr/bin/env bash
# Installs everything the tests need on a fresh machine, then runs the whole suite.
#   bash scripts/test.sh [pytest args]
# Two pytest-xdist workers; an idle worker takes tests queued for the other (worksteal: the long
# end-to-end runs do not pile up on one worker). RLREC_TEST_WORKERS=N for N workers, 0 for one
# process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
for extra in scripts/setup_*.sh; do
  [ -e "$extra" ] && bash "$extra"
done
python -m ruff check .            # lint (pyproject.toml [tool.ruff])
python -m ruff format --check .   # the code is formatted as ruff formats it
exec python -m pytest -n "${RLREC_TEST_WORKERS:-2}" --dist worksteal "$@"
