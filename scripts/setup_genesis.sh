#!/usr/bin/env bash
# Installs what env=genesis needs: Debian's headless OpenGL libraries (EGL, OSMesa fallback) and
# the `genesis` and `genesis-forge` extras; then compiles Genesis's kernels once per version and
# install (one tiny train.py run, a marker under ~/.cache/rlrec; about 100 s on 2 cores, cached in
# ~/.cache), so that two test workers do not compile them at once. Each step is skipped when done.
#   bash scripts/setup_genesis.sh [--install | --warm-up]   # all; libraries and extras; compile
set -euo pipefail
mode=${1:-all}
case "$mode" in all | --install | --warm-up) ;; *) echo "usage: $0 [--install | --warm-up]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
. scripts/python.sh
. scripts/apt.sh

if [ "$mode" != --warm-up ]; then
  need_apt=()
  libs=$(ldconfig -p 2>/dev/null || true)  # read once: `ldconfig -p | grep -q` can die of SIGPIPE under pipefail
  for lib in libEGL.so.1 libOSMesa.so.8 libGL.so.1; do
    grep -q "$lib" <<<"$libs" || need_apt+=("$lib")
  done
  if [ ${#need_apt[@]} -gt 0 ]; then
    rlrec_apt_install --no-install-recommends libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri libosmesa6 libglu1-mesa
  fi

  # find_spec, not import: importing genesis_forge costs seconds (genesis, skrl, rsl_rl)
  if ! "$PY" -c "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ('genesis', 'genesis_forge', 'rsl_rl')))" 2>/dev/null; then
    "$PY" -m pip install -q -c scripts/constraints.txt -e ".[genesis,genesis-forge]"
  fi
fi
[ "$mode" = --install ] && exit 0

# A lock older than 10 minutes was left by a process killed while writing Quadrants's kernel cache
# (a write takes seconds); while it is there every process skips the cache and compiles again.
lock="${XDG_CACHE_HOME:-$HOME/.cache}/quadrants/qdcache/kernel_compilation_manager/qdcache.lock"
if [ -n "$(find "$lock" -mmin +10 2>/dev/null)" ]; then
  echo "setup_genesis.sh: removing Quadrants's stale kernel-cache lock $lock (left by a killed process)"
  rm -f "$lock"
fi

# the cache is keyed by the kernels' source files: the marker names the versions and the install
versions=$("$PY" -c "
import hashlib, importlib.util as u
from importlib.metadata import version as v
where = hashlib.sha256(u.find_spec('genesis').origin.encode()).hexdigest()[:12]
print(v('genesis-world') + '-' + v('quadrants') + '-' + where)")
marker="${XDG_CACHE_HOME:-$HOME/.cache}/rlrec/genesis-kernels-$versions"
if [ ! -e "$marker" ]; then
  echo "setup_genesis.sh: compiling Genesis's kernels once (about 100 s on 2 cores)"
  work=$(mktemp -d)
  bound=()  # a bounded wait: a hung warm-up must not hold the test run
  command -v timeout >/dev/null 2>&1 && bound=(timeout 900)
  if ${bound[@]+"${bound[@]}"} "$PY" train.py env=genesis env.num_envs=2 env.max_episode_steps=20 env.render_width=64 \
      env.render_height=64 eval_env.num_envs=2 eval_env.every=1 algo.num_steps=8 \
      algo.num_minibatches=1 total_steps=16 logger=none logger.progress=false report.enabled=false \
      "hydra.run.dir=$work/run" >"$work/log" 2>&1; then
    mkdir -p "$(dirname "$marker")" && touch "$marker"
  else  # not fatal here: the Genesis tests then compile (and fail where Genesis is broken)
    echo "setup_genesis.sh: the warm-up run failed; its log:" >&2
    tail -20 "$work/log" >&2
  fi
  rm -rf "$work"  # made just above, by mktemp
fi
