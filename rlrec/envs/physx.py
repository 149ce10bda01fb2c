"""SAPIEN's PhysX GPU library: where SAPIEN looks for it, where SAPIEN downloads it from, and the
check rlrec runs before a ManiSkill GPU env is built.

ManiSkill's GPU sim (``physx_cuda``) calls ``sapien.physx.enable_gpu()`` (mani_skill 3.0.1,
while its ``BaseEnv`` sets up the sim). In sapien 3.0.3 that function looks for
``Path.home() / ".sapien" / "physx" / version()`` / ``libPhysXGpu_64.so`` and, when the file is
missing, downloads
``https://github.com/sapien-sim/physx-precompiled/releases/download/<version>/linux-so.zip`` with
``requests.get(url)`` (no timeout) and unpacks it there. On a node without internet that hangs or
fails deep inside ManiSkill, once per process. So rlrec refuses ``sim=gpu env=maniskill`` before
anything is built when the file is missing (:func:`require_gpu_library`), naming the file, the URL
and the shell command that fetches and unpacks it where SAPIEN looks, to run on a machine with
internet. SAPIEN reads no setting for another location: only ``~`` (``$HOME``) decides where it
looks.
"""

from __future__ import annotations

import os
import platform
import shlex
from pathlib import Path
from typing import Optional, Tuple

from rlrec.checks import ConfigError

# the release SAPIEN downloads from (its sapien.physx.enable_gpu)
RELEASES = "https://github.com/sapien-sim/physx-precompiled/releases/download"
# platform -> (the library file SAPIEN loads, the zip it downloads), as enable_gpu names them
PLATFORMS = {
    "linux-x86_64": ("libPhysXGpu_64.so", "linux-so.zip"),
    "linux-aarch64": ("libPhysXGpu_64.so", "linux-aarch64-so.zip"),
    "windows": ("PhysXGpu_64.dll", "windows-dll.zip"),
}
DOCS = "docs/maniskill.md, section 'Offline GPU nodes'"


def this_platform() -> Optional[str]:
    """This machine's key of :data:`PLATFORMS` (as SAPIEN tells them apart), or None."""
    arch = {"x86_64": "x86_64", "AMD64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
    if platform.system() != "Linux" or platform.machine() not in arch:
        return "windows" if platform.system() == "Windows" else None
    return f"linux-{arch[platform.machine()]}"


def sapien_physx() -> Optional[Tuple[str, bool]]:
    """``sapien.physx.version()`` (the folder name SAPIEN looks in) and whether SAPIEN's GPU PhysX
    is already loaded in this process (then nothing is fetched); None without sapien."""
    try:
        import sapien.physx
    except ImportError:
        return None
    return str(sapien.physx.version()), bool(sapien.physx.is_gpu_enabled())


def require_gpu_library() -> None:
    """ConfigError (one line, before anything is built) when SAPIEN's PhysX GPU library is not
    where SAPIEN looks for it, so that building a ``physx_cuda`` env never starts SAPIEN's
    download. A no-op without sapien (the maniskill extra's own error comes next) and when GPU
    PhysX is already loaded in this process. Reads one path; touches no network."""
    sapien = sapien_physx()
    if sapien is None or sapien[1]:
        return
    version = sapien[0]
    plat = this_platform()
    if plat is None:
        raise ConfigError(
            f"sim=gpu env=maniskill needs SAPIEN's PhysX GPU library, which SAPIEN has for Linux "
            f"(x86_64, aarch64) and Windows only, not {platform.system()} {platform.machine()}: "
            "use sim=cpu"
        )
    library, zip_name = PLATFORMS[plat]
    folder = Path.home() / ".sapien" / "physx" / version  # where SAPIEN looks
    if (folder / library).is_file():
        if plat.startswith("linux"):
            require_libcuda()
        return
    url = f"{RELEASES}/{version}/{zip_name}"
    where, archive = shlex.quote(str(folder)), shlex.quote(str(folder / zip_name))
    fetch = (
        f"mkdir -p {where} && curl -fL --max-time 600 -o {archive} {url} && "
        f"python3 -m zipfile -e {archive} {where} && rm {archive}"
    )
    raise ConfigError(
        f"sim=gpu env=maniskill needs SAPIEN's PhysX GPU library {folder / library}, which is "
        f"missing; SAPIEN would download it from {url} (no timeout) while the env is built. "
        f"Fetch it once, on a machine with internet: `{fetch}` (for a node with another home, "
        f"copy the files of {folder} to ~/.sapien/physx/{version}/ there); see {DOCS}"
    )


_MAPS = "/proc/self/maps"  # the files this process mapped (a test's stand-in replaces it)


def _loaded_path(name):
    """Where the shared library ``name`` this process loaded lies, or None. The map shows the
    file a symlink resolves to, so ``name`` matches its versioned names too: libcuda.so.1 is
    usually a link to libcuda.so.<driver version> (e.g. libcuda.so.550.54.15)."""
    try:
        with open(_MAPS) as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                base = os.path.basename(path)
                if base == name or base.startswith(name + "."):
                    return path
    except OSError:
        return None
    return None


def require_libcuda(load=None) -> None:
    """ConfigError (one line, before anything is built) when the CUDA driver cannot be loaded by
    the unversioned name SAPIEN loads it by: ``ctypes.CDLL("libcuda.so", ctypes.RTLD_GLOBAL)``
    (sapien 3.0.3's ``sapien.physx.enable_gpu``), which a driver that ships only
    ``libcuda.so.1`` (a container with the driver mounted, ManiSkill issue #647) fails. The
    message gives the fix: the symlink next to the ``libcuda.so.1`` found, or the package that
    provides the driver. ``load``: ``ctypes.CDLL`` (a test's stand-in)."""
    import ctypes

    load = load or ctypes.CDLL
    try:
        load("libcuda.so", ctypes.RTLD_GLOBAL)
        return
    except OSError as e:
        missing = str(e)
    try:
        load("libcuda.so.1", ctypes.RTLD_GLOBAL)
        found = _loaded_path("libcuda.so")
    except OSError:
        found = None
    if found:
        folder = os.path.dirname(found)
        if os.path.exists(os.path.join(folder, "libcuda.so.1")):  # the link ldconfig keeps
            found = os.path.join(folder, "libcuda.so.1")
        link = os.path.join(folder, "libcuda.so")
        fix = (
            f"the driver's {found} is there: link it under that name (as root: ln -s {found} "
            f"{link}; without root: ln -s {found} DIR/libcuda.so and add DIR to LD_LIBRARY_PATH)"
        )
    else:
        fix = (
            "no libcuda.so.1 either: install the NVIDIA driver's CUDA library (Debian: "
            "libcuda1; Ubuntu: libnvidia-compute-<driver version>) or, in a container, run it "
            "with the NVIDIA container toolkit's compute capability"
        )
    raise ConfigError(
        "sim=gpu env=maniskill: SAPIEN loads the CUDA driver as libcuda.so "
        f"(sapien/physx/__init__.py: ctypes.CDLL('libcuda.so')), which fails here ({missing}); "
        + fix
    )
