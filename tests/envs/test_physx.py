"""SAPIEN's PhysX GPU library (rlrec/envs/physx.py): ``sim=gpu env=maniskill`` is refused before
anything is built when the library is missing, without a network call; ``rlrec-fetch-physx``
unpacks it where SAPIEN looks, or into ``--dest``. No test here touches the network."""

from __future__ import annotations

import inspect
import io
import socket
import subprocess
import sys
import time
import zipfile

import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.envs import physx
from rlrec.envs.config import SimConfig
from rlrec.envs.maniskill import ManiSkillEnvConfig
from tests.helpers import REPO

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
    assert "rlrec-fetch-physx" in message and "python -m rlrec.envs.physx" in message


def test_train_refuses_before_the_process_group_and_the_runner(monkeypatch, home, no_network):
    """``train.py env=maniskill sim=gpu``: the entry point refuses right after resolving the
    device, before it joins a process group or builds the runner (which loads checkpoints and
    builds envs)."""
    pytest.importorskip("sapien.physx")
    from rlrec import distributed
    from rlrec.run import cli
    from rlrec.train import runner
    from tests.helpers import compose_cfg

    _fake_cuda(monkeypatch)
    started = []
    monkeypatch.setattr(runner, "Runner", lambda *a, **k: started.append("runner"))
    monkeypatch.setattr(distributed, "init", lambda *a, **k: started.append("process group"))
    cfg = compose_cfg(["env=maniskill", "sim=gpu"])
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"^sim=gpu env=maniskill needs SAPIEN's PhysX GPU"):
        cli._build(cfg, home / "run")
    assert time.monotonic() - start < 2.0
    assert started == [] and no_network == [] and not (home / "run").exists()


def test_the_library_in_place_passes_the_check(monkeypatch, home):
    monkeypatch.setattr(physx, "require_libcuda", lambda: None)  # a driver is there (below)
    monkeypatch.setattr(physx, "physx_version", lambda: VERSION)
    monkeypatch.setattr(physx, "gpu_enabled", lambda: False)
    monkeypatch.setattr(physx, "this_platform", lambda: "linux-x86_64")
    with pytest.raises(
        ConfigError, match=f"{home}/.sapien/physx/{VERSION}/{LIB}, which is missing"
    ):
        physx.require_gpu_library()
    (home / ".sapien" / "physx" / VERSION).mkdir(parents=True)
    (home / ".sapien" / "physx" / VERSION / LIB).write_bytes(b"x")
    physx.require_gpu_library()  # no error


def test_the_path_and_url_are_the_ones_sapien_uses():
    """rlrec's copy of SAPIEN's path and URL, read against the installed sapien's own source."""
    sapien_physx = pytest.importorskip("sapien.physx")
    source = inspect.getsource(sapien_physx.enable_gpu)
    assert 'parent = Path.home() / ".sapien" / "physx" / physx_version' in source
    assert 'dll = parent / "libPhysXGpu_64.so"' in source
    for zip_name in ("linux-so.zip", "linux-aarch64-so.zip", "windows-dll.zip"):
        assert f'url = f"{physx.RELEASES}/{{physx_version}}/{zip_name}"' in source


def test_fetch_unpacks_a_local_zip_where_sapien_looks(monkeypatch, home, tmp_path, no_network):
    monkeypatch.setattr(physx, "require_libcuda", lambda: None)  # a driver is there (below)
    archive = tmp_path / "linux-so.zip"
    archive.write_bytes(_zip({LIB: b"the library", "LICENSE.txt": b"license"}))
    monkeypatch.setattr(physx, "physx_version", lambda: VERSION)
    monkeypatch.setattr(physx, "gpu_enabled", lambda: False)
    monkeypatch.setattr(physx, "this_platform", lambda: "linux-x86_64")
    assert physx.main(["--zip", str(archive)]) == 0
    target = home / ".sapien" / "physx" / VERSION
    assert (target / LIB).read_bytes() == b"the library"
    assert (target / "LICENSE.txt").read_bytes() == b"license"
    assert sorted(p.name for p in target.iterdir()) == ["LICENSE.txt", LIB]  # no temporaries
    physx.require_gpu_library()  # the check now passes
    assert physx.main(["--zip", str(archive)]) == 0  # already there: left as it is
    assert no_network == []


def test_sapien_loads_the_driver_by_the_unversioned_name():
    """What require_libcuda mirrors, read against the installed sapien's own source."""
    sapien_physx = pytest.importorskip("sapien.physx")
    source = inspect.getsource(sapien_physx.enable_gpu)
    assert 'ctypes.CDLL("libcuda.so", ctypes.RTLD_GLOBAL)' in source


def _loader(available):
    """A stand-in for ctypes.CDLL that loads only the names in ``available``."""

    def load(name, mode=0):
        if name not in available:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        return object()

    return load


def test_libcuda_by_its_unversioned_name_passes():
    physx.require_libcuda(load=_loader({"libcuda.so", "libcuda.so.1"}))


def test_only_libcuda_so_1_gives_the_symlink_to_make(monkeypatch):
    """A container with the driver mounted as libcuda.so.1 only (ManiSkill issue #647)."""
    lib = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    monkeypatch.setattr(physx, "_loaded_path", lambda name: lib if name == "libcuda.so.1" else None)
    with pytest.raises(ConfigError) as err:
        physx.require_libcuda(load=_loader({"libcuda.so.1"}))
    message = str(err.value)
    assert "\n" not in message and "ctypes.CDLL('libcuda.so')" in message
    assert f"ln -s {lib} /usr/lib/x86_64-linux-gnu/libcuda.so" in message


def test_no_driver_at_all_is_refused_before_anything_is_built(monkeypatch, home):
    """This machine has no CUDA driver: with the PhysX library in place, the real ctypes finds
    neither name, and the check names the packages that bring the driver."""
    monkeypatch.setattr(physx, "physx_version", lambda: VERSION)
    monkeypatch.setattr(physx, "gpu_enabled", lambda: False)
    monkeypatch.setattr(physx, "this_platform", lambda: "linux-x86_64")
    (home / ".sapien" / "physx" / VERSION).mkdir(parents=True)
    (home / ".sapien" / "physx" / VERSION / LIB).write_bytes(b"x")
    import ctypes.util

    if ctypes.util.find_library("cuda"):
        pytest.skip("this machine has a CUDA driver")
    with pytest.raises(ConfigError, match=r"no libcuda\.so\.1 either: install .*libcuda1"):
        physx.require_gpu_library()


def test_fetch_into_dest_says_where_to_copy_it(tmp_path, capsys, no_network):
    archive = tmp_path / "linux-so.zip"
    archive.write_bytes(_zip({LIB: b"the library"}))
    dest = tmp_path / "for-the-node"
    args = ["--zip", str(archive), "--dest", str(dest), "--version", VERSION]
    assert physx.main([*args, "--platform", "linux-x86_64"]) == 0
    assert (dest / LIB).read_bytes() == b"the library"
    out = capsys.readouterr().out
    assert f"mkdir -p ~/.sapien/physx/{VERSION}/ && cp -- {dest / LIB}" in out
    assert no_network == []


def test_path_arguments_are_paths_never_options_or_urls(monkeypatch, tmp_path, capsys, no_network):
    """A path that starts with ``-`` stays a path (made absolute in what is printed); a path that
    looks like a URL is a local file name, never fetched."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-x.zip").write_bytes(_zip({LIB: b"lib"}))
    common = ["--version", VERSION, "--platform", "linux-x86_64"]
    assert physx.main(["--zip=-x.zip", "--dest=-rf", *common]) == 0
    assert (tmp_path / "-rf" / LIB).read_bytes() == b"lib"
    out = capsys.readouterr().out
    assert f"cp -- {tmp_path / '-rf' / LIB} " in out  # absolute: no word of it starts with "-"
    url_like = "https://example.invalid/linux-so.zip"
    assert physx.main(["--zip", url_like, "--dest", str(tmp_path / "d"), *common]) == 1
    assert f"could not read {tmp_path / 'https:'}" in capsys.readouterr().err  # a local path
    assert no_network == []


@pytest.mark.parametrize("name", ["../evil.so", "/abs/evil.so"])
def test_a_zip_member_outside_the_folder_is_refused(tmp_path, name):
    with pytest.raises(ValueError, match="outside"):
        physx.unpack(_zip({LIB: b"lib", name: b"evil"}), tmp_path / "dest", LIB)
    assert not (tmp_path / "evil.so").exists()
    assert not (tmp_path / "dest" / LIB).exists()


def test_a_zip_without_the_library_is_refused(tmp_path):
    with pytest.raises(ValueError, match=f"no {LIB}"):
        physx.unpack(_zip({"other.so": b"x"}), tmp_path / "dest", LIB)
    assert list((tmp_path / "dest").iterdir()) == []


def test_the_download_is_bounded(monkeypatch):
    """Each read waits at most 60 s, and the whole download at most --timeout."""
    import urllib.request

    seen = {}

    class Endless:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, n):
            return b"x" * 16

    def urlopen(request, timeout):
        seen["timeout"] = timeout
        return Endless()

    clock = iter(range(0, 10**6, 7))
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(physx.time, "monotonic", lambda: float(next(clock)))
    with pytest.raises(TimeoutError, match="--timeout 100"):
        physx._download("https://example.invalid/linux-so.zip", 100.0)
    assert seen["timeout"] == 60.0


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9"])
def test_bad_timeout_is_refused(tmp_path, value, capsys):
    assert physx.main(["--timeout", value, "--version", VERSION, "--dest", str(tmp_path)]) == 2
    assert "--timeout" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_command_is_installed_and_runs_as_a_module():
    pyproject = (REPO / "pyproject.toml").read_text()
    scripts = pyproject.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    assert 'rlrec-fetch-physx = "rlrec.envs.physx:main"' in scripts.splitlines()
    proc = subprocess.run(
        [sys.executable, "-m", "rlrec.envs.physx", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "--dest DIR" in proc.stdout, proc.stderr
