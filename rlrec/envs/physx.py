"""SAPIEN's PhysX GPU library: where SAPIEN looks for it, where SAPIEN downloads it from, the check
rlrec runs before a ManiSkill GPU env is built, and the command that fetches it.

ManiSkill's GPU sim (``physx_cuda``) calls ``sapien.physx.enable_gpu()`` (mani_skill 3.0.1
``mani_skill/envs/sapien_env.py`` lines 243-245). In sapien 3.0.3 (``sapien/physx/__init__.py``,
lines 32-56) that function looks for ``Path.home() / ".sapien" / "physx" / version()`` /
``libPhysXGpu_64.so`` and, when the file is missing, downloads
``https://github.com/sapien-sim/physx-precompiled/releases/download/<version>/linux-so.zip`` with
``requests.get(url)`` (no timeout) and unpacks it there. On a node without internet that hangs or
fails deep inside ManiSkill, once per process. So rlrec refuses ``sim=gpu env=maniskill`` before
anything is built when the file is missing (:func:`require_gpu_library`), naming the file, the URL
and the command that fetches it on a machine with internet::

    rlrec-fetch-physx                 # into ~/.sapien/physx/<version>/, where SAPIEN looks
    rlrec-fetch-physx --dest DIR      # into DIR, to copy to ~/.sapien/physx/<version>/ elsewhere
    rlrec-fetch-physx --zip FILE      # unpack a linux-so.zip downloaded by other means
    python -m rlrec.envs.physx ...    # the same command

SAPIEN reads no setting for another location: only ``~`` (``$HOME``) decides where it looks.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import shlex
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import List, Optional, Sequence

from rlrec.checks import ConfigError

# the release SAPIEN downloads from (sapien/physx/__init__.py lines 38, 41, 44)
RELEASES = "https://github.com/sapien-sim/physx-precompiled/releases/download"
# platform -> (the library file SAPIEN loads, the zip it downloads); sapien/physx/__init__.py
# lines 36-46
PLATFORMS = {
    "linux-x86_64": ("libPhysXGpu_64.so", "linux-so.zip"),
    "linux-aarch64": ("libPhysXGpu_64.so", "linux-aarch64-so.zip"),
    "windows": ("PhysXGpu_64.dll", "windows-dll.zip"),
}
COMMAND = "rlrec-fetch-physx"
DOCS = "docs/maniskill.md, section 'Offline GPU nodes'"
TIMEOUT_SEC = 600.0  # the whole download (the zip is tens of MB)
MAX_ZIP_BYTES = 1 << 30  # a download larger than this is not SAPIEN's zip


def this_platform() -> Optional[str]:
    """This machine's key of :data:`PLATFORMS` (as SAPIEN tells them apart), or None."""
    if platform.system() == "Windows":
        return "windows"
    arch = {"x86_64": "x86_64", "AMD64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
    linux = platform.system() == "Linux" and platform.machine() in arch
    return f"linux-{arch[platform.machine()]}" if linux else None


def physx_version() -> Optional[str]:
    """``sapien.physx.version()`` (the folder name SAPIEN looks in), or None without sapien."""
    try:
        import sapien.physx
    except ImportError:
        return None
    return str(sapien.physx.version())


def gpu_enabled() -> bool:
    """Whether SAPIEN's GPU PhysX is already loaded in this process (then nothing is fetched)."""
    try:
        import sapien.physx
    except ImportError:
        return False
    return bool(sapien.physx.is_gpu_enabled())


def library_dir(version: str) -> Path:
    """The folder SAPIEN looks in: ``Path.home() / ".sapien" / "physx" / version``."""
    return Path.home() / ".sapien" / "physx" / version


def download_url(version: str, plat: str = "linux-x86_64") -> str:
    """The URL SAPIEN downloads the library's zip from."""
    return f"{RELEASES}/{version}/{PLATFORMS[plat][1]}"


def require_gpu_library() -> None:
    """ConfigError (one line, before anything is built) when SAPIEN's PhysX GPU library is not
    where SAPIEN looks for it, so that building a ``physx_cuda`` env never starts SAPIEN's
    download. A no-op without sapien (the maniskill extra's own error comes next) and when GPU
    PhysX is already loaded in this process. Reads one path; touches no network."""
    version = physx_version()
    if version is None or gpu_enabled():
        return
    plat = this_platform()
    if plat is None:
        raise ConfigError(
            f"sim=gpu env=maniskill needs SAPIEN's PhysX GPU library, which SAPIEN has for Linux "
            f"(x86_64, aarch64) and Windows only, not {platform.system()} {platform.machine()}: "
            "use sim=cpu"
        )
    path = library_dir(version) / PLATFORMS[plat][0]  # the file SAPIEN loads for GPU PhysX
    if path.is_file():
        if plat.startswith("linux"):
            require_libcuda()
        return
    raise ConfigError(
        f"sim=gpu env=maniskill needs SAPIEN's PhysX GPU library {path}, which is missing; "
        f"SAPIEN would download it from {download_url(version, plat)} (no timeout) while the env "
        f"is built. On a machine with internet run `{COMMAND}` (or `python -m rlrec.envs.physx`; "
        f"`{COMMAND} --dest DIR` fetches it for another machine: copy DIR's files to "
        f"~/.sapien/physx/{version}/ there); see {DOCS}"
    )


def _loaded_path(name: str) -> Optional[str]:
    """Where the shared library ``name`` this process loaded lies (/proc/self/maps), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if os.path.basename(path) == name:
                    return path
    except OSError:
        return None
    return None


def require_libcuda(load=None) -> None:
    """ConfigError (one line, before anything is built) when the CUDA driver cannot be loaded by
    the unversioned name SAPIEN loads it by: ``ctypes.CDLL("libcuda.so", ctypes.RTLD_GLOBAL)``
    (sapien 3.0.3 ``sapien/physx/__init__.py`` line 64), which a driver that ships only
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
        found = _loaded_path("libcuda.so.1")
    except OSError:
        found = None
    if found:
        link = os.path.join(os.path.dirname(found), "libcuda.so")
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


# --------------------------------------------------------------------------- fetching


def _download(url: str, timeout_sec: float) -> bytes:
    """The body at ``url``, at most :data:`MAX_ZIP_BYTES`: given up once ``timeout_sec`` seconds
    have passed (checked between reads of 1 MiB, each of which waits at most 60 s)."""
    import urllib.request

    deadline = time.monotonic() + timeout_sec
    request = urllib.request.Request(url, headers={"User-Agent": "rlrec-fetch-physx"})
    chunks: List[bytes] = []
    size = 0
    with urllib.request.urlopen(request, timeout=min(60.0, timeout_sec)) as response:
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} took longer than --timeout {timeout_sec:g} s")
            chunk = response.read(1 << 20)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_ZIP_BYTES:
                raise ValueError(f"{url} is larger than {MAX_ZIP_BYTES} bytes: not SAPIEN's zip")
            chunks.append(chunk)
    return b"".join(chunks)


def unpack(data: bytes, dest: Path, library: str) -> Path:
    """Unpacks the zip ``data`` into ``dest`` (created if needed) and returns the library's path.
    Refuses a member that would land outside ``dest`` and a zip without ``library`` at its top;
    writes into a temporary folder of ``dest`` first, so a failure leaves only what was there."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = archive.namelist()
        for name in names:
            parts = Path(name).parts
            if name.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
                raise ValueError(f"the zip holds {name!r}, a path outside the folder it unpacks to")
        if library not in names:
            raise ValueError(f"the zip holds no {library} at its top (it holds: {names[:10]})")
        with tempfile.TemporaryDirectory(dir=dest, prefix=".rlrec-physx-") as tmp:
            archive.extractall(tmp)
            for top in sorted({Path(n).parts[0] for n in names if Path(n).parts}):
                if not (dest / top).exists():  # what was there stays as it was
                    os.replace(Path(tmp) / top, dest / top)
    return dest / library


def _parser() -> argparse.ArgumentParser:
    where = "~/.sapien/physx/<version>/, where SAPIEN looks"
    p = argparse.ArgumentParser(
        prog=COMMAND,
        description=f"Fetch SAPIEN's PhysX GPU library (needed by ManiSkill's GPU sim, sim=gpu "
        f"env=maniskill) into {where}, or into --dest DIR to copy there on a machine without "
        "internet.",
    )
    p.add_argument("--dest", metavar="DIR", help=f"folder to unpack into (default: {where})")
    p.add_argument(
        "--version",
        dest="physx_version",
        metavar="VERSION",
        help="the PhysX version folder, as sapien.physx.version() gives it (default: the "
        "installed sapien's)",
    )
    p.add_argument(
        "--platform",
        choices=sorted(PLATFORMS),
        help="the GPU node's platform (default: this machine's)",
    )
    p.add_argument("--zip", dest="zip_file", metavar="FILE", help="unpack this zip, not a download")
    p.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT_SEC,
        help=f"seconds the whole download may take (default {TIMEOUT_SEC:g})",
    )
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``rlrec-fetch-physx``: 0 when the library is in place, 2 on bad input, 1 when the download
    or the zip failed."""
    args = _parser().parse_args(argv)

    def fail(message: str, status: int = 2) -> int:
        print(f"{COMMAND}: {message}", file=sys.stderr, flush=True)
        return status

    if not (0 < args.timeout <= 86400):  # also refuses nan
        return fail(f"--timeout {args.timeout} is invalid: give seconds in (0, 86400]")
    version = args.physx_version or physx_version()
    if not version:
        return fail(
            "sapien is not installed here, so its PhysX version is unknown: install the "
            "maniskill extra, or give --version (python -c 'import sapien.physx as p; "
            "print(p.version())' on the GPU node prints it)"
        )
    if "/" in version or "\\" in version or version in (".", ".."):
        return fail(f"--version {version!r} is invalid: a version is one folder name")
    plat = args.platform or this_platform()
    if plat is None:
        return fail(
            f"SAPIEN has no PhysX GPU library for {platform.system()} "
            f"{platform.machine()}: give --platform {{{','.join(sorted(PLATFORMS))}}}"
        )
    library = PLATFORMS[plat][0]
    # paths are made absolute: one that starts with "-" stays a path in the commands printed
    dest = Path(os.path.abspath(args.dest)) if args.dest else library_dir(version)
    if (dest / library).is_file():
        print(f"{COMMAND}: {dest / library} is there already (remove it to fetch it again)")
        return 0
    url = download_url(version, plat)
    source = str(Path(os.path.abspath(args.zip_file))) if args.zip_file else url
    try:
        if args.zip_file:
            data = Path(source).read_bytes()
        else:
            print(f"{COMMAND}: downloading {url} (at most {args.timeout:g} s)", flush=True)
            data = _download(url, args.timeout)
    except (OSError, ValueError) as e:  # URLError and TimeoutError are OSErrors
        return fail(f"could not read {source}: {type(e).__name__}: {e}", 1)
    try:
        path = unpack(data, dest, library)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        return fail(f"could not unpack {source} into {dest}: {type(e).__name__}: {e}", 1)
    print(f"{COMMAND}: {path} ({path.stat().st_size} bytes)")
    if dest != library_dir(version):
        target = f"~/.sapien/physx/{shlex.quote(version)}/"
        print(
            f"{COMMAND}: on the GPU node, SAPIEN looks in {target}: copy it there, e.g.\n"
            f"  mkdir -p {target} && cp -- {shlex.quote(str(path))} {target}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
