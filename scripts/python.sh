# Sourced by the set-up scripts: sets PY (and exports PYTHON) to the first of $PYTHON, the active
# venv, the repo's .venv, `python`/`python3` on PATH when pip may install into it (not externally
# managed, PEP 668; site-packages writable), else a new .venv made with it. Where none can work it
# says what to install and exits 1 before installing anything; never --break-system-packages.

_rlrec_fail() {
  echo "rlrec set-up: $*" >&2
  exit 1
}

# exit 0 when $1 runs Python >= 3.10 (rlrec's requires-python)
_rlrec_new_enough() {
  "$1" -c "import sys; sys.exit(sys.version_info < (3, 10))" 2>/dev/null
}

# exit 0 when pip may install into $1's own site-packages
_rlrec_pip_may_install() {
  "$1" - <<'PY' 2>/dev/null
import os, sys, sysconfig
in_venv = sys.prefix != sys.base_prefix
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
writable = os.access(sysconfig.get_path("purelib"), os.W_OK)
import pip  # noqa: F401  (a Python without pip cannot install)
sys.exit(not (writable and (in_venv or not managed)))
PY
}

_rlrec_pick_python() {
  local repo=$1 cand base=""
  [ -n "${PYTHON:-}" ] && { PY=$PYTHON; return; }
  [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ] && { PY=$VIRTUAL_ENV/bin/python; return; }
  [ -x "$repo/.venv/bin/python" ] && { PY=$repo/.venv/bin/python; return; }
  for cand in python python3; do
    command -v "$cand" >/dev/null 2>&1 || continue
    _rlrec_new_enough "$cand" || continue
    [ -n "$base" ] || base=$(command -v "$cand")
    if _rlrec_pip_may_install "$cand"; then
      PY=$(command -v "$cand")
      return
    fi
  done
  [ -n "$base" ] || _rlrec_fail "no Python >= 3.10 on PATH: install one (Debian/Ubuntu: apt-get install python3 python3-venv), or set PYTHON=/path/to/python"
  # an externally managed or read-only Python: rlrec goes into its own venv, .venv in the repo
  [ ! -e "$repo/.venv" ] || _rlrec_fail "$repo/.venv exists but holds no bin/python: move it aside (set-up makes its own there), or set PYTHON=/path/to/python"
  if ! "$base" -m venv "$repo/.venv" >/dev/null 2>&1; then
    rm -rf "$repo/.venv"  # made just now by the failed command (it did not exist before it)
    _rlrec_fail "$base cannot make a virtual environment (its venv module or ensurepip is missing): install it (Debian/Ubuntu: apt-get install python3-venv), or activate a virtual environment, then run this again"
  fi
  echo "rlrec set-up: $base is externally managed (PEP 668); rlrec goes into $repo/.venv (source .venv/bin/activate gives its python)"
  PY=$repo/.venv/bin/python
}

_rlrec_pick_python "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_rlrec_new_enough "$PY" || _rlrec_fail "$PY is not a Python >= 3.10 (rlrec needs 3.10 or newer): set PYTHON to one"
export PYTHON=$PY
