#!/usr/bin/env bash
# Installs what the report's browser test needs (called by scripts/test.sh): Debian's headless
# Chromium and its driver (/usr/bin/chromium, /usr/bin/chromedriver; Debian's build plays H.264),
# and selenium (the `dev` extra) into the current Python.
#   bash scripts/setup_browser.sh
# Idempotent: returns at once when everything is there. RLREC_SKIP_BROWSER=1 skips it (the
# browser test then skips, saying why). Installing the packages needs root (or sudo) and apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
[ "${RLREC_SKIP_BROWSER:-0}" = "1" ] && exit 0

if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  if ! command -v apt-get >/dev/null; then
    echo "setup_browser: no apt-get here: install Chromium and chromedriver yourself" >&2
    exit 0
  fi
  SUDO=""
  [ "$(id -u)" = "0" ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
fi

if ! "$PY" -c "import selenium" 2>/dev/null; then
  "$PY" -m pip install -q -c scripts/constraints.txt "selenium>=4.10"
fi
