#!/usr/bin/env bash
# Installs what env=maniskill needs on a Debian machine without a GPU: a Vulkan driver (SAPIEN needs
# one even for state-only sims: Mesa's lavapipe >= 23; on bookworm from bookworm-backports, its
# sources file derived from the machine's own, no mirror named here), then the `maniskill` extra.
# Idempotent: about a second when everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python.sh
MIN_MESA_MAJOR=23
SUDO=""
[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO="sudo"
. scripts/apt.sh

mesa_major() {  # major version of the installed mesa-vulkan-drivers, 0 when absent
  local v
  v=$(dpkg-query -W -f='${db:Status-Abbrev} ${Version}' mesa-vulkan-drivers 2>/dev/null || true)
  case "$v" in ii*) v=${v#* }; v=${v#*:}; echo "${v%%.*}" ;; *) echo 0 ;; esac
}

has_libvulkan() { dpkg-query -W -f='${db:Status-Abbrev}' libvulkan1 2>/dev/null | grep -q '^ii'; }

install_vulkan() {
  if ! command -v apt-get >/dev/null; then
    echo "setup_maniskill: no apt-get here; install a Vulkan driver (Mesa >= ${MIN_MESA_MAJOR} lavapipe, or a GPU driver) yourself" >&2
    return 0
  fi
  if has_libvulkan && [ "$(mesa_major)" -ge "$MIN_MESA_MAJOR" ]; then
    return 0
  fi
  local codename=""
  [ -r /etc/os-release ] && codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  local target=()
  if [ "$codename" = "bookworm" ]; then
    local dst=/etc/apt/sources.list.d/rlrec-bookworm-backports.sources
    if [ ! -e "$dst" ]; then
      local src=""
      for f in /etc/apt/sources.list.d/*.sources; do
        [ -e "$f" ] || continue
        # the Debian sources file: a stanza whose Suites include bookworm and that uses the Debian keyring
        if grep -qE '^Suites:.*\bbookworm\b' "$f" && grep -q 'debian-archive-keyring' "$f"; then src=$f; break; fi
      done
      if [ -z "$src" ]; then
        echo "setup_maniskill: found no deb822 Debian sources file in /etc/apt/sources.list.d; enable bookworm-backports yourself" >&2
        exit 1
      fi
      # first stanza only (up to the first blank line), with its Suites replaced
      awk 'NF==0{exit} /^Suites:/{print "Suites: bookworm-backports"; next} {print}' "$src" \
        | $SUDO tee "$dst" >/dev/null
      echo "setup_maniskill: wrote $dst (from $src)"
    fi
    target=(-t bookworm-backports)
  fi
  rlrec_apt_install --no-install-recommends libvulkan1
  rlrec_apt_install "${target[@]}" mesa-vulkan-drivers
  echo "setup_maniskill: mesa-vulkan-drivers $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers)"
}

install_vulkan
# find_spec, not import: importing mani_skill costs seconds (torch, sapien)
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('mani_skill') and u.find_spec('sapien')))"; then
  "$PY" -m pip install -q -c scripts/constraints.txt -e ".[maniskill]"
fi
