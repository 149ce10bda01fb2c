#!/usr/bin/env bash
# Installs the Hydra launchers rlrec's sweeps use (called by scripts/test.sh): the `launchers` extra
# (joblib, submitit, Optuna) into this Python, and the Ray launcher into .venv-ray, which sees this
# Python's packages (hydra-ray-launcher pins cloudpickle 2.2.1, joblib >= 1.6 needs >= 3). About
# 70 s the first time; RLREC_SKIP_RAY=1 skips Ray (its test then skips). Idempotent.
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
  # $PY's site-packages as a site dir behind the venv's own (their .pth files read too: rlrec's
  # editable install), written anew each time (not --system-site-packages: the base's, not $PY's)
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
