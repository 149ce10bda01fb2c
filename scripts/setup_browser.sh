#!/usr/bin/env bash
# Installs what the report's browser test needs (called by scripts/test.sh): Debian's Chromium and
# chromedriver (its build plays H.264; root or sudo) and selenium. Idempotent; RLREC_SKIP_BROWSER=1
# skips it (the browser test then skips, saying why).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python.sh
. scripts/apt.sh
[ "${RLREC_SKIP_BROWSER:-0}" = "1" ] && exit 0

if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  rlrec_apt_install chromium chromium-driver
fi

if ! "$PY" -c "import selenium" 2>/dev/null; then
  "$PY" -m pip install -q -c scripts/constraints.txt "selenium>=4.10"
fi
