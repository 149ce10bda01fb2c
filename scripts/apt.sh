# Sourced: rlrec_apt_install [APT OPTIONS] PKG... installs with apt-get (root, else sudo), fetching
# the lists at most once an hour; without apt-get it says what to install and returns 0.

rlrec_apt_install() {
  local sudo=""
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "rlrec set-up: no apt-get here: install the Debian packages $* (or their equivalents) yourself" >&2
    return 0
  fi
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo="sudo"
  # `apt-get update` unless this user's stamp says the lists were fetched within the hour and no
  # sources file is newer than that (setup_maniskill.sh adds one)
  local stamp="${XDG_CACHE_HOME:-$HOME/.cache}/rlrec/apt-updated"
  if [ -z "$(find "$stamp" -mmin -60 2>/dev/null)" ] ||
    [ -n "$(find /etc/apt/sources.list /etc/apt/sources.list.d -newer "$stamp" 2>/dev/null | head -1)" ]; then
    $sudo apt-get update -qq
    mkdir -p "$(dirname "$stamp")" && touch "$stamp"
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}
