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
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load(name, folder=REPO / "tools" / "device"):
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


kit, gpu_check = _load("device_kit"), _load("gpu_check")


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
    # rlrec's own imports travel in both calls; sapien and mani_skill in Call 2, beside them
    core = {"gymnasium", "hydra-core", "omegaconf", "antlr4-python3-runtime", "imageio-ffmpeg"}
    assert {kit._name(r) for r in kit.CORE} == core
    one, two = ({kit._name(r) for r in kit.BUNDLES[n]} for n in (1, 2))
    assert one == core and core | {"sapien", "mani-skill"} <= two
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
    (split,) = report["split"]
    assert split["member"] == "imageio_ffmpeg/binaries/ffmpeg-linux-x" and split["mode"] == 0o755
    assert lzma.decompress((out / split["file"]).read_bytes()) == binary


def _bundle(tmp_path: Path, n: int, binary: bytes = b"#!/bin/sh\necho ok\n") -> Path:
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
    manifest = {"bundle": n, "files": entries, "bytes": 0}
    (d / "MANIFEST.json").write_text(json.dumps(manifest))
    return d


def test_install_checks_the_manifest_then_installs_with_no_deps(tmp_path):
    d = _bundle(tmp_path, 1)
    site = tmp_path / "site"
    kit.install(1, tmp_path / "kit", site, sys.executable)
    assert (site / "rlrec_kit_probe1" / "__init__.py").read_text() == "X = 1\n"
    tool = site / "rlrec_kit_probe1" / "bin" / "tool"
    assert tool.read_bytes() == b"#!/bin/sh\necho ok\n"
    assert stat.S_IMODE(tool.stat().st_mode) == 0o755
    probe = [sys.executable, "-c", "import rlrec_kit_probe1 as m; print(m.X)"]
    env = {**os.environ, "PYTHONPATH": str(site)}
    assert subprocess.check_output(probe, env=env, text=True, timeout=60).strip() == "1"
    assert kit.install(1, tmp_path / "kit", site, sys.executable) == 0.0  # already there
    # a call installs its own bundle, and runs
    assert kit.installed_bundles(site) == [1]
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


def test_run_sets_the_device_environment_once_a_bundle_is_installed(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    with pytest.raises(kit.KitError, match="install 1 or 2 first"):
        kit.run_command(["true"], 10, site)
    (site / ".installed-bundle-2").write_text("digest\n")
    assert kit.installed_bundles(site) == [2]
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


# the device tool's limits (its README): device time in all, one command, and no machine started
# with less device time left than this
DEVICE_S, COMMAND_S, NO_START_UNDER_S = 15 * 60, 600, 4 * 60


def test_the_tools_import_one_way():
    """gpu_check imports physx_parts and gpu_common, physx_parts gpu_common: no circle."""
    code_size = _load("code_size", REPO / "scripts")
    files = {p.name: p.read_text() for p in (REPO / "tools").rglob("*.py")}
    graph = code_size.imports(files)
    assert graph["gpu_check"] == {"physx_parts", "gpu_common"} and not code_size.mutual(graph)


def test_the_plan_fits_the_device_tool_with_a_fifth_of_each_call_spare():
    """Each call's planned time (its install, gpu_check's start, its parts' --budget, each part's
    budget and cut grace within it) is at most 80% of its timeout; the calls fit 15 minutes even if
    each starts a machine (none with under 4 minutes left) and idles warm after it (but the last,
    given back)."""
    calls = kit.plan_calls()
    assert kit.CALL_PARTS == gpu_check.CALL_PARTS and kit.CHECK_BUDGET_S == gpu_check.CALL_BUDGET
    assert kit.MACHINE_START_S >= 120 and kit.WARM_S >= 30
    left = DEVICE_S
    for n, call in enumerate(calls, 1):
        timeout = call["timeout_s"]
        assert 1 <= timeout <= COMMAND_S and len(call["command"]) <= 2000
        assert call["command"].startswith(f"python3 tools/device/device_kit.py install {n} && ")
        assert (
            f"gpu_check.py --call {n} --out $OUT --budget {kit.CHECK_BUDGET_S[n]}"
            in call["command"]
        )
        planned = kit.INSTALL_S[n] + kit.START_S + kit.CHECK_BUDGET_S[n]
        assert planned <= 0.8 * timeout, f"call {n}: {planned} s planned of {timeout}"
        parts = gpu_check.CALL_PARTS[n]
        assert call["parts"] == parts
        cut = sum(gpu_check.PARTS[p].budget + gpu_check.CUT_GRACE_S for p in parts)
        assert cut <= kit.CHECK_BUDGET_S[n], "every part fits, cut at its budget"
        assert all(gpu_check.PARTS[p].min_start <= gpu_check.PARTS[p].budget for p in parts)
        assert left >= NO_START_UNDER_S, f"call {n} could not start a machine"
        left -= kit.MACHINE_START_S + timeout + (kit.WARM_S if n < len(calls) else 0)
        assert left >= 0, f"call {n} outlasts the device time"
    assert [r["left_after"] for r in kit.device_timeline()][-1] == left


def test_the_most_valuable_parts_run_first():
    """Call 1 opens with the compiled PPO.update() and the built-in env on CUDA with a recorder;
    Call 2 with ManiSkill under SAPIEN's renderer on CUDA; every part runs in exactly one call and
    none needs the PhysX GPU library."""
    assert gpu_check.CALL_PARTS[1][:2] == ["compiled_update", "train_cuda"]
    assert gpu_check.CALL_PARTS[2][0] == "maniskill_render"
    named = [p for n in (1, 2) for p in gpu_check.CALL_PARTS[n]]
    assert sorted(named) == sorted(gpu_check.PARTS)
    assert not set(named) & set(gpu_check.PHYSX_NAMES)
    assert gpu_check.parse_args(["--call", "1"]).parts == gpu_check.CALL_PARTS[1]


def test_each_call_carries_what_its_parts_need():
    """A call never relies on an earlier call's install (the machine may have gone back): the
    distributions its parts need are pinned in its own bundle; what else they need is one of the
    things the preflight checks on the machine."""
    for n, call in enumerate(kit.plan_calls(), 1):
        assert call["carry"] == [f"build/device_kit/bundle-{n}"]
        pinned = {kit._name(r) for r in kit.BUNDLES[n]}
        for part in gpu_check.CALL_PARTS[n]:
            needs = set(gpu_check.PARTS[part].needs)
            assert needs, part
            assert needs - set(gpu_check.SYSTEM) <= pinned, (n, part, needs - pinned)
        for path in call["carry"]:
            ignored = subprocess.run(["git", "-C", REPO, "check-ignore", "-q", path], timeout=30)
            assert ignored.returncode == 0, f"{path} must be ignored by git to travel by carry"
    assert "sapien" in gpu_check.PARTS["maniskill_render"].needs


def test_each_call_carries_under_the_limit():
    """Each bundle as last built (``BUNDLE_MIB``, checked by ``build``) and the working tree as it
    is now fit one call's 64 MiB with the build's margin; where a kit is built here, its bundles
    as they are, too."""
    tree = kit.working_tree_bytes()
    for n, mib in kit.BUNDLE_MIB.items():
        assert tree + mib * kit.MIB + kit.MARGIN <= kit.CALL_LIMIT, (n, tree / kit.MIB, mib)
    built = kit.KIT / "kit.json"
    if built.is_file():
        for b in json.loads(built.read_text())["bundles"]:
            manifest = json.loads((kit.KIT / f"bundle-{b['bundle']}" / "MANIFEST.json").read_text())
            assert tree + manifest["bytes"] <= kit.CALL_LIMIT, (b["bundle"], manifest["bytes"])


def test_plan_prints_the_calls_and_the_build_command_before_a_build(tmp_path, capsys):
    assert kit.print_plan(tmp_path / "no_kit") is False
    out = capsys.readouterr().out
    assert "python3 tools/device/gpu_check.py --call 1" in out and "--call 2" in out
    assert "run `python tools/device/device_kit.py build`" in out


def test_the_rehearsal_parses_and_the_physx_parts_are_named_only():
    args = gpu_check.parse_args(["--device", "cpu", "--quick"])
    assert args.parts == [*gpu_check.CALL_PARTS[1], *gpu_check.CALL_PARTS[2]]
    assert gpu_check.parse_args(["--call", "2"]).parts == gpu_check.CALL_PARTS[2]
    assert gpu_check.parse_args(["--parts", "physx_pushcube"]).parts == ["physx_pushcube"]
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--call", "1", "--parts", "train_cuda"])


def test_the_preflight_names_what_this_machine_lacks(tmp_path, monkeypatch):
    """A distribution the bundle should have installed, and a Vulkan driver manifest whose library
    does not load, are named with the parts that need them (which then do not run)."""
    manifest = tmp_path / "icd.json"
    manifest.write_text(json.dumps({"ICD": {"library_path": "/nonexistent/libvulkan_x.so"}}))
    monkeypatch.setenv("VK_DRIVER_FILES", str(manifest))
    table = {
        "a": gpu_check.Part(1, 5, 1, 5, "a", ("gymnasium", "rlrec-no-such-dist")),
        "b": gpu_check.Part(1, 5, 1, 5, "b", ("vulkan",)),
    }
    rep = gpu_check.Report(None, {})
    rep.start("preflight")
    args = gpu_check.parse_args(["--device", "cpu"])
    missing = gpu_check.preflight(args, rep, ["a", "b"], table)
    assert sorted(missing) == ["rlrec-no-such-dist", "vulkan"]
    checks = {c["name"]: c for c in rep.data["parts"]["preflight"]["checks"]}
    assert checks["rlrec-no-such-dist is installed"]["ok"] is False
    assert "skipped: a" in checks["rlrec-no-such-dist is installed"]["detail"]
    assert "skipped: b" in checks["this machine has vulkan"]["skipped"]


def test_a_part_that_overruns_is_cut_and_the_next_keeps_its_time(tmp_path, monkeypatch):
    ran = {}

    def slow(args, rep, tmp, budget):
        time.sleep(60)

    def after(args, rep, tmp, budget):
        ran["budget"] = budget
        rep.check(True, "the next part ran")

    parts = {"slow": gpu_check.Part(1, 2, 1, 2, "sleeps"), "next": gpu_check.Part(1, 3, 3, 3, "")}
    monkeypatch.setattr(gpu_check, "PARTS", parts)
    monkeypatch.setattr(gpu_check, "FUNCS", {"slow": slow, "next": after})
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # main tees them into its log
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    t = time.perf_counter()
    rc = gpu_check.main(["--device", "cpu", "--parts", "slow", "next", "--out", str(tmp_path)])
    assert rc == 1 and time.perf_counter() - t < 20
    data = json.loads((tmp_path / "gpu_check.json").read_text())["parts"]
    assert data["slow"]["status"] == "cut" and data["slow"]["s"] < 10
    assert data["slow"]["checks"][0]["ok"] is False
    assert data["next"]["status"] == "done" and ran["budget"] > 2.9  # its 3 s


def test_the_rehearsal_runs_the_pixel_path_and_the_gpu_memory_refusal(tmp_path, monkeypatch):
    """Call 1's train_cuda (train.py from pixels, NatureCNN, recorder.view=both) and memory_budget
    (CUDA faked with 40 GiB of 80 free: the refusal names the free memory) on the CPU."""
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # main tees them into its log
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    argv = ["--device", "cpu", "--quick", "--parts", "train_cuda", "memory_budget"]
    assert gpu_check.main([*argv, "--out", str(tmp_path)]) == 0
    parts = json.loads((tmp_path / "gpu_check.json").read_text())["parts"]
    checks = {c["name"]: c for p in parts.values() for c in p["checks"]}
    assert any("recorder.view=both" in name and c["ok"] for name, c in checks.items())
    refusal = next(c for name, c in checks.items() if "free memory" in name)
    assert refusal["ok"] and "free of 85.9 GB on cuda:0" in refusal["detail"]
