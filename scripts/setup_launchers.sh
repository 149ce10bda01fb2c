#!/usr/bin/env bash
# Installs the Hydra launchers and sweepers rlrec's sweeps use (called by scripts/test.sh).
#   bash scripts/setup_launchers.sh
# 1. The `launchers` extra (joblib, submitit local/SLURM, Optuna) into the current Python.
# 2. The `ray` extra into its own virtual environment, .venv-ray (it sees this Python's packages,
#    rlrec included, whether this Python is a venv or not): hydra-ray-launcher pins cloudpickle 2.2.1 while joblib >= 1.6 needs
#    cloudpickle >= 3, so installing it here would break `pip check` for everything else.
#    About 70 s and 320 MB the first time; RLREC_SKIP_RAY=1 skips it (the Ray test then skips).
# Idempotent: returns in about a second when everything is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python.sh

# find_spec, not import: importing the plugins pulls in optuna, submitit, ...
has() { "$1" -c "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in sys.argv[1:]))" "${@:2}" 2>/dev/null; }

if ! has "$PY" hydra_plugins.hydra_joblib_launcher hydra_plugins.hydra_submitit_launcher hydra_plugins.hydra_optuna_sweeper; then
  "$PY" -m pip install -q -c scripts/constraints.txt -e ".[launchers]"
fi

if [ "${RLREC_SKIP_RAY:-0}" != "1" ]; then
  RAY_PY=.venv-ray/bin/python
  if [ ! -x "$RAY_PY" ]; then
    "$PY" -m venv .venv-ray
  fi
  # The venv sees $PY's packages (rlrec, torch, Hydra, ...) behind its own: a .pth line that adds
  # $PY's site-packages as a site dir (so their own .pth files, rlrec's editable install among
  # them, are read too), written anew each time so that it follows the Python this set-up uses.
  # Not --system-site-packages: that is the base interpreter's, not an active venv's.
  site=$("$RAY_PY" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
  "$PY" - "$site/rlrec-parent.pth" <<'PY'
import sys, sysconfig
dirs = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
with open(sys.argv[1], "w") as f:
    f.write("import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dirs) + "\n")
PY
  if ! has "$RAY_PY" hydra_plugins.hydra_ray_launcher ray; then
    # only the launcher and Ray land in the venv; torch and the rest come from $PY's site-packages
    "$RAY_PY" -m pip install -q -c scripts/constraints.txt "hydra-ray-launcher>=1.2"
  fi
fi
