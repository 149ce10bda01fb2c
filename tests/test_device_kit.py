"""scripts/device_kit.py: what it bundles, how it slims and packs, and how the device installs.

The kit's own end-to-end check (a clean Python 3.12 venv with the device image's packages, the
bundles installed as on the device, ManiSkill built there) downloads gigabytes and takes minutes:
it is ``python scripts/device_kit.py check``, not a test. These tests run its pieces on small
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
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
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
    # the imports the issue names are all there; torch and numpy come from the device
    for needed in ("mani-skill", "sapien", "gymnasium", "hydra-core", "omegaconf"):
        assert needed in names
    assert {"antlr4-python3-runtime", "imageio-ffmpeg", "dacite", "transforms3d", "trimesh"} <= set(
        names
    )
    assert "torch" not in names and "numpy" not in names
    # the check venv installs from the device image's list only
    assert {kit._name(r) for r in kit.CHECK_BASE} <= kit.DEVICE_HAS


def test_pack_fits_each_bundle_into_one_call_and_keeps_groups_together():
    items = {"ffmpeg.xz": 46, "imageio_ffmpeg.whl": 1, "sapien.whl": 39, "mani_skill.whl": 9}
    items.update({f"small{i}.whl": 1 for i in range(8)})
    bundles = kit.pack(items, 60, together=[["ffmpeg.xz", "imageio_ffmpeg.whl"]])
    flat = [n for b in bundles for n in b]
    assert sorted(flat) == sorted(items)  # each file once
    assert all(sum(items[n] for n in b) <= 60 for b in bundles)
    assert any({"ffmpeg.xz", "imageio_ffmpeg.whl"} <= set(b) for b in bundles)
    assert len(bundles) == 2  # first-fit decreasing: 47 + 9 + 4 | 39 + 4
    with pytest.raises(kit.KitError, match="sapien.whl .* cannot fit one call"):
        kit.pack({"sapien.whl": 70}, 60)


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
    # one bundle of two: run refuses, naming the missing install
    with pytest.raises(kit.KitError, match="install 2 first"):
        kit.run_command(["true"], 10, site)
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
    with pytest.raises(kit.KitError, match="install 1 first"):
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
    """The device lends 15 minutes in all, a machine start included: the calls' limits sum to at
    most 11 minutes, each at most 600 s; every gpu_check part runs once, and the parts' own
    budgets fit in their call's --budget, which ends well inside the call's limit."""
    gpu_check = _load("gpu_check")
    assert list(kit.CHECK_PARTS) == gpu_check.PARTS
    calls = kit.plan_calls(2)
    named = []
    for call in calls:
        assert len(call["command"]) <= 2000 and len(call["carry"]) <= 8
        assert 1 <= call["timeout_s"] <= 600
        if "--parts" in call["command"]:
            parts = call["command"].split("--parts ")[1].split(" --")[0].split()
            named += parts
            budget = float(call["command"].split("--budget ")[1].split()[0])
            assert budget <= call["timeout_s"] - 30, "the command ends well inside its limit"
            assert sum(gpu_check.BUDGET[p] for p in parts) <= budget, "no part is left out"
            assert all(gpu_check.MIN_START[p] <= gpu_check.BUDGET[p] for p in parts)
        for path in call["carry"]:
            ignored = subprocess.run(
                ["git", "-C", str(REPO), "check-ignore", "-q", path], timeout=30
            )
            assert ignored.returncode == 0, f"{path} must be ignored by git to travel by carry"
    assert sum(c["timeout_s"] for c in calls) <= kit.DEVICE_COMMAND_S <= 11 * 60
    assert sorted(named) == sorted(gpu_check.PARTS), "every gpu_check part runs exactly once"
    assert [c["command"].split()[2:4] for c in calls[:2]] == [["install", "1"], ["install", "2"]]
