"""tools/device/device_kit.py: what it bundles, how it slims and packs, how the device installs,
and the two calls' plan against the device tool's limits (tools/device/gpu_check.py's parts).

The kit's own end-to-end check (a clean Python 3.12 venv with the device image's packages, the
bundles installed as on the device, ManiSkill built there) downloads gigabytes and takes minutes:
it is ``python tools/device/device_kit.py check``, not a test. These tests run its pieces on small
wheels made here, with the real pip.
"""

import hashlib
import importlib.util
import json
import lzma
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / "device" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


kit = _load("device_kit")


def _wheel(path: Path, name: str, files: dict) -> Path:
    """A minimal valid wheel with ``files`` (archive path -> bytes) and a RECORD listing them."""
    dist = f"{name}-1.0.dist-info"
    files = {
        **files,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = [f"{p},sha256=x,{len(b)}" for p, b in files.items()] + [f"{dist}/RECORD,,"]
    whl = path / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for p, b in files.items():
            info = zipfile.ZipInfo(p)
            info.external_attr = 0o755 << 16 if "binaries/" in p else 0o644 << 16
            z.writestr(info, b)
        z.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return whl


def test_the_kit_bundles_only_what_the_device_image_lacks_pinned():
    names = [kit._name(r) for r in kit.NEEDS]
    assert all("==" in r for r in kit.NEEDS), "every bundled wheel is pinned"
    assert len(set(names)) == len(names)
    assert not set(names) & kit.DEVICE_HAS, "bundled, though the device image has it"
    assert kit.SDIST_ONLY <= set(names)
    assert "torch" not in names and "numpy" not in names
    # rlrec's own imports travel in both calls; sapien in Call 1 (the PhysX refusal reads its
    # version), mani_skill in Call 2 (the renderer part), each pin in a bundle
    core = {"gymnasium", "hydra-core", "omegaconf", "antlr4-python3-runtime", "imageio-ffmpeg"}
    assert {kit._name(r) for r in kit.CORE} == core
    one, two = ({kit._name(r) for r in kit.BUNDLES[n]} for n in (1, 2))
    assert core <= one and core <= two
    assert "sapien" in one and "mani-skill" not in one
    assert "mani-skill" in two and "sapien" not in two
    assert one | two == set(names)
    # the check venv installs from the device image's list only
    assert {kit._name(r) for r in kit.CHECK_BASE} <= kit.DEVICE_HAS


def test_each_bundle_must_fit_its_call():
    sizes = {"ffmpeg.xz": 18, "imageio_ffmpeg.whl": 1, "sapien.whl": 39, "mani_skill.whl": 9}
    members = {1: ["ffmpeg.xz", "imageio_ffmpeg.whl", "sapien.whl"], 2: ["mani_skill.whl"]}
    assert kit.bundle_bytes(sizes, members, 60) == {1: 58, 2: 9}
    with pytest.raises(kit.KitError, match="bundle-1 .* cannot fit one call.*sapien.whl"):
        kit.bundle_bytes(sizes, members, 50)


def test_slim_wheel_drops_unused_assets_and_splits_the_binary(tmp_path):
    src_dir, out = tmp_path / "src", tmp_path / "out"
    src_dir.mkdir()
    out.mkdir()
    keep = "mani_skill/assets/robots/panda/franka_description/meshes/visual/link0.glb"
    files = {
        "mani_skill/__init__.py": b"",
        "mani_skill/assets/robots/panda/panda_v2.urdf": b"<robot/>",
        keep: b"glb" * 100,
        "mani_skill/assets/robots/fetch/base.glb": b"x" * 1000,
        "mani_skill/assets/environment_maps/default.hdr": b"x" * 1000,
        "mani_skill/utils/scene_builder/table/assets/table.glb": b"t" * 10,
        "mani_skill/utils/scene_builder/table/assets/Dining_Table_204_1.glb": b"x" * 1000,
    }
    whl = _wheel(src_dir, "mani_skill", files)
    slim, report = kit.slim_wheel(whl, out, kit.SLIM["mani_skill"], cache=tmp_path / "c")
    with zipfile.ZipFile(slim) as z:
        names = set(z.namelist())
        record = z.read("mani_skill-1.0.dist-info/RECORD").decode().split()
    assert keep in names and "mani_skill/assets/robots/panda/panda_v2.urdf" in names
    assert "mani_skill/utils/scene_builder/table/assets/table.glb" in names
    assert not any(n.endswith(("base.glb", "default.hdr", "Dining_Table_204_1.glb")) for n in names)
    assert report["dropped_files"] == 3 and report["dropped_bytes"] == 3000
    # RECORD lists exactly the files left (and itself)
    assert {line.split(",")[0] for line in record} == names

    binary = bytes(range(256)) * 400
    ff = _wheel(
        src_dir,
        "imageio_ffmpeg",
        {"imageio_ffmpeg/__init__.py": b"", "imageio_ffmpeg/binaries/ffmpeg-linux-x": binary},
    )
    slim, report = kit.slim_wheel(ff, out, kit.SLIM["imageio_ffmpeg"], cache=tmp_path / "c")
    with zipfile.ZipFile(slim) as z:
        assert "imageio_ffmpeg/binaries/ffmpeg-linux-x" not in z.namelist()
    split = report["split"]
    assert split["member"] == "imageio_ffmpeg/binaries/ffmpeg-linux-x" and split["mode"] == 0o755
    assert lzma.decompress((out / split["file"]).read_bytes()) == binary


def _bundle(tmp_path: Path, n: int, of: int, binary: bytes = b"#!/bin/sh\necho ok\n") -> Path:
    """``tmp/kit/bundle-n`` as build() writes it: a tiny wheel, an xz file, MANIFEST.json."""
    d = tmp_path / "kit" / f"bundle-{n}"
    d.mkdir(parents=True)
    whl = _wheel(d, f"rlrec_kit_probe{n}", {f"rlrec_kit_probe{n}/__init__.py": b"X = 1\n"})
    xz = d / "tool.xz"
    xz.write_bytes(lzma.compress(binary))
    entries = []
    for p in (whl, xz):
        entry = {"file": p.name, "bytes": p.stat().st_size}
        entry["sha256"] = hashlib.sha256(p.read_bytes()).hexdigest()
        entries.append(entry)
    entries[1].update(unpack_to=f"rlrec_kit_probe{n}/bin/tool", mode=0o755)
    manifest = {"bundle": n, "of": of, "files": entries, "bytes": 0}
    (d / "MANIFEST.json").write_text(json.dumps(manifest))
    return d


def test_install_checks_the_manifest_then_installs_with_no_deps(tmp_path):
    d = _bundle(tmp_path, 1, 2)
    site = tmp_path / "site"
    kit.install(1, tmp_path / "kit", site, sys.executable)
    assert (site / "rlrec_kit_probe1" / "__init__.py").read_text() == "X = 1\n"
    tool = site / "rlrec_kit_probe1" / "bin" / "tool"
    assert tool.read_bytes() == b"#!/bin/sh\necho ok\n"
    assert stat.S_IMODE(tool.stat().st_mode) == 0o755
    out = subprocess.run(
        [sys.executable, "-c", "import rlrec_kit_probe1 as m; print(m.X)"],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "1"
    assert kit.install(1, tmp_path / "kit", site, sys.executable) == 0.0  # already there
    # one bundle of two: a call installs its own, and runs
    assert kit.installed_bundles(site) == ([1], [2])
    assert kit.run_command(["true"], 10, site) == 0
    # a damaged bundle is refused before anything is installed
    site2 = tmp_path / "site2"
    whl = next(d.glob("*.whl"))
    data = bytearray(whl.read_bytes())
    data[-30] ^= 0xFF
    whl.write_bytes(bytes(data))
    with pytest.raises(kit.KitError, match="does not match its manifest"):
        kit.install(1, tmp_path / "kit", site2, sys.executable)
    assert not site2.exists()
    with pytest.raises(kit.KitError, match="must carry"):
        kit.install(3, tmp_path / "kit", site2, sys.executable)


def test_run_sets_the_device_environment_once_every_bundle_is_installed(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    with pytest.raises(kit.KitError, match="install 1 or 2 first"):
        kit.run_command(["true"], 10, site)
    for n in (1, 2):
        (site / f".installed-bundle-{n}").write_text("digest 2\n")
    assert kit.installed_bundles(site) == ([1, 2], [])
    env = kit.device_env(site, {"PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"].split(":") == [str(site.resolve()), str(REPO), "/elsewhere"]
    assert env["PYTHONUNBUFFERED"] == "1"
    probe = tmp_path / "probe.py"
    probe.write_text("import os, sys; sys.exit(0 if os.environ['PYTHONUNBUFFERED'] == '1' else 3)")
    assert kit.run_command([sys.executable, str(probe)], 60, site) == 0
    probe.write_text("import time; time.sleep(30)")
    assert kit.run_command([sys.executable, str(probe)], 1, site) == 124  # bounded


def test_the_kit_never_deletes_a_directory_it_did_not_make(tmp_path):
    foreign = tmp_path / "bundle-1"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    with pytest.raises(kit.KitError, match="not made by the device kit"):
        kit._make_owned_dir(foreign)
    assert (foreign / "precious.txt").read_text() == "keep me"
    owned = kit._make_owned_dir(tmp_path / "owned")
    (owned / "old").write_text("x")
    assert not (kit._make_owned_dir(owned) / "old").exists()


def test_the_printed_calls_fit_the_device_tool():
    """The device lends 15 minutes in all, each machine start (a minute or two) included: two calls,
    Call 1 within 120 s and Call 2 within 420 s, each at most 600 s; each runs its own gpu_check
    parts, whose budgets fit the call's --budget, which leaves the call time for its install."""
    gpu_check = _load("gpu_check")
    calls = kit.plan_calls()
    assert [c["timeout_s"] for c in calls] == [120, 420]
    assert sum(c["timeout_s"] for c in calls) <= kit.DEVICE_COMMAND_S <= 15 * 60 - 2 * 150
    assert kit.CALL_PARTS == gpu_check.CALL_PARTS
    assert kit.CHECK_BUDGET_S == gpu_check.CALL_BUDGET
    named = []
    for n, call in enumerate(calls, 1):
        assert len(call["command"]) <= 2000 and len(call["carry"]) <= 8
        assert 1 <= call["timeout_s"] <= 600
        assert call["command"].startswith(f"python3 tools/device/device_kit.py install {n} && ")
        assert f"gpu_check.py --call {n} " in call["command"]
        budget = float(call["command"].split("--budget ")[1].split()[0])
        assert budget == gpu_check.CALL_BUDGET[n]
        assert budget + kit.INSTALL_S[n] + kit.START_S <= call["timeout_s"], "install + start"
        parts = gpu_check.CALL_PARTS[n]
        assert call["parts"] == parts
        assert sum(gpu_check.PARTS[p].budget for p in parts) <= budget, "no part is left out"
        assert all(gpu_check.PARTS[p].min_start <= gpu_check.PARTS[p].budget for p in parts)
        assert all(gpu_check.PARTS[p].call == n for p in parts)
        named += parts
        for path in call["carry"]:
            ignored = subprocess.run(
                ["git", "-C", str(REPO), "check-ignore", "-q", path], timeout=30
            )
            assert ignored.returncode == 0, f"{path} must be ignored by git to travel by carry"
    assert sorted(named) == sorted(gpu_check.PARTS), "every part runs in exactly one call"
    assert not set(named) & set(gpu_check.PHYSX_NAMES), "no call needs the PhysX GPU library"


def test_the_bundles_fit_beside_the_working_tree():
    """Each bundle as last built (``BUNDLE_MIB``, checked by ``build``) and the working tree as it
    is now fit one call's 64 MiB, with the build's margin."""
    tree = kit.working_tree_bytes()
    for n, mib in kit.BUNDLE_MIB.items():
        assert tree + mib * kit.MIB + kit.MARGIN <= kit.CALL_LIMIT, (n, tree / kit.MIB, mib)


def test_the_rehearsal_parses_and_the_physx_parts_are_named_only():
    gpu_check = _load("gpu_check")
    args = gpu_check.parse_args(["--device", "cpu", "--quick"])
    assert args.parts == [*gpu_check.CALL_PARTS[1], *gpu_check.CALL_PARTS[2]]
    assert gpu_check.parse_args(["--call", "2"]).parts == gpu_check.CALL_PARTS[2]
    assert gpu_check.parse_args(["--parts", "physx_pushcube"]).parts == ["physx_pushcube"]
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--call", "1", "--parts", "basics"])
