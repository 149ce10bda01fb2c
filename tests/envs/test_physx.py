"""SAPIEN's PhysX GPU library (rlrec/envs/physx.py): ``sim=gpu env=maniskill`` is refused before
anything is built when the library is missing, without a network call; the shell command the
refusal names fetches and unpacks it where SAPIEN looks. No test here touches the network."""

from __future__ import annotations

import inspect
import io
import os
import shutil
import socket
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.envs import physx
from rlrec.envs.config import SimConfig
from rlrec.envs.maniskill import ManiSkillEnvConfig

VERSION = "105.1-physx-5.3.1.patch0"  # sapien 3.0.3's sapien.physx.version()
LIB = "libPhysXGpu_64.so"


@pytest.fixture
def no_network(monkeypatch):
    """Every attempt to open a connection is recorded and fails."""
    attempts = []

    def refuse(self, address, *args, **kwargs):
        attempts.append(address)
        raise OSError(f"test: no network ({address})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", lambda address, *a, **k: refuse(None, address))
    try:
        import requests
    except ImportError:
        pass
    else:

        def no_get(url, *args, **kwargs):
            attempts.append(url)
            raise OSError(f"test: no network ({url})")

        monkeypatch.setattr(requests, "get", no_get)
        monkeypatch.setattr(requests.Session, "request", lambda self, m, url, **k: no_get(url))
    return attempts


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty home (SAPIEN looks in ``Path.home()``, i.e. $HOME)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


@pytest.fixture
def sapien_here(monkeypatch):
    """SAPIEN of :data:`VERSION` on linux-x86_64, GPU PhysX not loaded, a CUDA driver there."""
    monkeypatch.setattr(physx, "require_libcuda", lambda: None)
    monkeypatch.setattr(physx, "sapien_physx", lambda: (VERSION, False))
    monkeypatch.setattr(physx, "this_platform", lambda: "linux-x86_64")


def _fake_cuda(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)


def _zip(members) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def test_gpu_maniskill_is_refused_in_seconds_without_a_network_call(monkeypatch, home, no_network):
    """With CUDA faked as present, building ``sim=gpu env=maniskill`` without the library fails
    with one line naming the setting, the exact path SAPIEN looks in, the URL it would download
    and the command that fetches it; nothing is built and no connection is attempted."""
    sapien_physx = pytest.importorskip("sapien.physx")  # imported before the clock starts
    from rlrec.envs import maniskill
    from rlrec.envs.factory import make_adapter

    _fake_cuda(monkeypatch)
    built = []
    monkeypatch.setattr(maniskill, "build_maniskill_env", lambda *a, **k: built.append(a))
    version = sapien_physx.version()
    start = time.monotonic()
    with pytest.raises(ConfigError) as err:
        make_adapter(ManiSkillEnvConfig(), SimConfig(name="gpu", device="cuda"), 2, seed=0)
    took = time.monotonic() - start
    message = str(err.value)
    assert took < 2.0, f"the refusal took {took:.2f} s"
    assert no_network == [] and built == []
    assert "\n" not in message and message.startswith("sim=gpu env=maniskill")
    assert str(home / ".sapien" / "physx" / version / LIB) in message
    assert f"{physx.RELEASES}/{version}/linux-so.zip" in message
    assert "curl -fL --max-time 600" in message and "python3 -m zipfile -e" in message


def test_train_refuses_before_the_process_group_and_the_runner(monkeypatch, home, no_network):
    """``train.py env=maniskill sim=gpu``: the entry point refuses right after resolving the
    device, before it joins a process group or builds the runner (which loads checkpoints and
    builds envs)."""
    pytest.importorskip("sapien.physx")
    from rlrec import distributed
    from rlrec.run import preflight
    from rlrec.train import runner
    from tests.helpers import compose_cfg

    _fake_cuda(monkeypatch)
    started = []
    monkeypatch.setattr(runner, "Runner", lambda *a, **k: started.append("runner"))
    monkeypatch.setattr(distributed, "init", lambda *a, **k: started.append("process group"))
    cfg = compose_cfg(["env=maniskill", "sim=gpu"])
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"^sim=gpu env=maniskill needs SAPIEN's PhysX GPU"):
        preflight.start(cfg, home / "run", stop=lambda: False)
    assert time.monotonic() - start < 2.0
    assert started == [] and no_network == [] and not (home / "run").exists()


def test_the_library_in_place_passes_the_check(sapien_here, home):
    with pytest.raises(
        ConfigError, match=f"{home}/.sapien/physx/{VERSION}/{LIB}, which is missing"
    ):
        physx.require_gpu_library()
    (home / ".sapien" / "physx" / VERSION).mkdir(parents=True)
    (home / ".sapien" / "physx" / VERSION / LIB).write_bytes(b"x")
    physx.require_gpu_library()  # no error


def test_the_path_url_and_driver_name_are_the_ones_sapien_uses():
    """rlrec's copy of SAPIEN's path and URL, and the name it loads the CUDA driver by (what
    require_libcuda mirrors), read against the installed sapien's own source."""
    sapien_physx = pytest.importorskip("sapien.physx")
    source = inspect.getsource(sapien_physx.enable_gpu)
    assert 'parent = Path.home() / ".sapien" / "physx" / physx_version' in source
    assert 'dll = parent / "libPhysXGpu_64.so"' in source
    for zip_name in ("linux-so.zip", "linux-aarch64-so.zip", "windows-dll.zip"):
        assert f'url = f"{physx.RELEASES}/{{physx_version}}/{zip_name}"' in source
    assert 'ctypes.CDLL("libcuda.so", ctypes.RTLD_GLOBAL)' in source


def _fetch_command(message: str) -> str:
    """The shell command a refusal names (between backquotes)."""
    return message.split("`")[1]


def _run_fetch(tmp_path, members):
    """The refusal's command, run as given with the release URL pointing at a local zip of
    ``members`` (curl reads file:// URLs: no network); returns the refusal's message."""
    if shutil.which("curl") is None or shutil.which("python3") is None:
        pytest.skip("needs curl and python3 on PATH")
    archive = tmp_path / "linux-so.zip"
    archive.write_bytes(_zip(members))
    with pytest.raises(ConfigError) as err:
        physx.require_gpu_library()
    message = str(err.value)
    url = f"{physx.RELEASES}/{VERSION}/linux-so.zip"
    command = _fetch_command(message)
    assert url in command and "--max-time 600" in command  # the download is bounded
    proc = subprocess.run(
        ["bash", "-c", command.replace(url, archive.as_uri())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return message


def test_the_named_command_fetches_the_library_where_sapien_looks(sapien_here, home, tmp_path):
    """The library lands where the check then finds it, with no zip left behind; a member named
    outside the folder stays inside it."""
    members = {LIB: b"the library", "LICENSE.txt": b"license", "../evil.so": b"evil"}
    message = _run_fetch(tmp_path, {**members, "/abs/evil.so": b"evil"})
    target = home / ".sapien" / "physx" / VERSION
    assert f"copy the files of {target} to ~/.sapien/physx/{VERSION}/ there" in message
    assert (target / LIB).read_bytes() == b"the library" and (target / "LICENSE.txt").is_file()
    assert not list(target.glob("*.zip"))
    assert not (target.parent / "evil.so").exists() and not (home / "evil.so").exists()
    assert not Path("/abs/evil.so").exists()
    physx.require_gpu_library()  # the check now passes


def test_a_zip_without_the_library_is_still_refused(sapien_here, home, tmp_path):
    _run_fetch(tmp_path, {"other.so": b"x"})
    with pytest.raises(ConfigError, match=f"{LIB}, which is missing"):
        physx.require_gpu_library()


def test_the_named_command_quotes_the_home_it_names(monkeypatch, tmp_path):
    """A home with a space or a shell character stays one word of the command."""
    home = tmp_path / "my home;x"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(physx, "sapien_physx", lambda: (VERSION, False))
    monkeypatch.setattr(physx, "this_platform", lambda: "linux-aarch64")
    with pytest.raises(ConfigError) as err:
        physx.require_gpu_library()
    command = _fetch_command(str(err.value))
    assert f"mkdir -p '{home}/.sapien/physx/{VERSION}' && " in command
    assert f"{physx.RELEASES}/{VERSION}/linux-aarch64-so.zip" in command


def _loader(available):
    """A stand-in for ctypes.CDLL that loads only the names in ``available``."""

    def load(name, mode=0):
        if name not in available:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        return object()

    return load


def test_libcuda_by_its_unversioned_name_passes():
    physx.require_libcuda(load=_loader({"libcuda.so", "libcuda.so.1"}))


def test_only_libcuda_so_1_gives_the_symlink_to_make(monkeypatch, tmp_path):
    """A container with the driver mounted as libcuda.so.1 only (ManiSkill issue #647), laid out
    as the driver installs it: libcuda.so.1 links to libcuda.so.<driver version>, the file the
    process's memory map shows once libcuda.so.1 is loaded."""
    lib = tmp_path / "libcuda.so.550.54.15"
    lib.write_bytes(b"")
    (tmp_path / "libcuda.so.1").symlink_to(lib.name)
    maps = tmp_path / "maps"
    maps.write_text(f"7f3a1c000000-7f3a1c200000 r-xp 00000000 08:01 1234    {lib}\n")
    monkeypatch.setattr(physx, "_MAPS", str(maps))
    with pytest.raises(ConfigError) as err:
        physx.require_libcuda(load=_loader({"libcuda.so.1"}))
    message = str(err.value)
    assert "\n" not in message and "ctypes.CDLL('libcuda.so')" in message
    assert f"ln -s {tmp_path}/libcuda.so.1 {tmp_path}/libcuda.so;" in message


def test_the_memory_map_names_the_file_a_soname_links_to():
    """What _loaded_path reads, on this machine: a library loaded by its soname (libz.so.1, a link
    to libz.so.1.<version>) is mapped under the file the link resolves to."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("z")
    if not Path("/proc/self/maps").is_file() or not name:
        pytest.skip("no /proc/self/maps or no zlib")
    ctypes.CDLL(name)
    path = physx._loaded_path("libz.so")
    assert path is not None and os.path.realpath(path) == path
    assert os.path.basename(path).startswith("libz.so.")


def test_no_driver_at_all_is_refused_before_anything_is_built(monkeypatch, home):
    """This machine has no CUDA driver: with the PhysX library in place, the real ctypes finds
    neither name, and the check names the packages that bring the driver."""
    monkeypatch.setattr(physx, "sapien_physx", lambda: (VERSION, False))
    monkeypatch.setattr(physx, "this_platform", lambda: "linux-x86_64")
    (home / ".sapien" / "physx" / VERSION).mkdir(parents=True)
    (home / ".sapien" / "physx" / VERSION / LIB).write_bytes(b"x")
    import ctypes.util

    if ctypes.util.find_library("cuda"):
        pytest.skip("this machine has a CUDA driver")
    with pytest.raises(ConfigError, match=r"no libcuda\.so\.1 either: install .*libcuda1"):
        physx.require_gpu_library()
