#!/usr/bin/env python
"""The device kit: what rlrec's GPU check needs on a GPU machine that has Python 3.12 with torch
and a scientific image but no network, built on a connected machine and carried there in calls of
at most 64 MiB each (the working tree and the carried paths together). tools/device/README.md is
the walk-through, for that machine and for an offline cluster node.

The kit downloads pinned cp312 manylinux wheels here, slims the big ones (sapien without its C++
headers, its denoiser's CUDA module or its stereo-depth patterns; mani_skill with only the assets
PushCube-v1 and PickCube-v1 load), takes the largest binaries (imageio-ffmpeg's ffmpeg, sapien's
renderer libraries) out of their wheels xz-compressed, and packs two bundles, one per call, each
with everything its call's parts need (a call never relies on an earlier call's install: the
machine may have gone back in between):

- bundle-1 (Call 1): hydra-core, omegaconf, antlr4, gymnasium, imageio-ffmpeg and its ffmpeg.
- bundle-2 (Call 2): the same, sapien, and mani_skill with what it imports.

There every wheel is installed with ``--no-deps`` into ``build/device_kit/site``.

Here (any Python with pip; ``check`` needs a Python 3.12, found on PATH or under pyenv)::

    python tools/device/device_kit.py build   # downloads (cached), slims, packs; prints the calls
    python tools/device/device_kit.py plan    # prints the calls (a fresh clone: and the build
                                              # command), their time and carried bytes
    python tools/device/device_kit.py check   # installs each bundle into its own site of a clean
                                              # Python 3.12 venv as the device will, imports
                                              # everything, builds PushCube-v1 on the CPU sim and
                                              # runs each call's CPU rehearsal (gpu_check
                                              # --device cpu --quick --call N)

There, as the printed calls say (this file runs there on the standard library alone)::

    python3 tools/device/device_kit.py install N
    python3 tools/device/device_kit.py run -- python3 tools/device/gpu_check.py --call N --out $OUT

Why each wheel is bundled (the device image has every other import these need) is in ``NEEDS``.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "build" / "device_kit"  # ignored by git (.gitignore), so it travels only by carry
CACHE = KIT / "cache"
SITE = KIT / "site"  # where the device installs the bundles
SENTINEL = ".rlrec-device-kit"  # in every directory the kit made (and so may replace)
MIB = 1024 * 1024
CALL_LIMIT = 64 * MIB  # one call: the working tree plus its carried paths
MARGIN = 2 * MIB  # head room for the working tree growing between build and call
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
DEVICE_PYTHON = "3.12"
PIP_QUIET = ["--disable-pip-version-check", "--no-input", "-q"]

# What the device lacks, pinned, each with the import that needs it (found by installing into a
# clean Python 3.12 with the device image's packages and importing until nothing was missing).
CORE: Dict[str, str] = {
    "gymnasium==1.4.0": "rlrec's spaces and vector envs; mani_skill",
    "hydra-core==1.3.8": "train.py, rlrec.run.cli",
    "omegaconf==2.3.1": "hydra-core",
    "antlr4-python3-runtime==4.9.3": "hydra-core and omegaconf's grammars (sdist: wheel built)",
    # 0.4.9 carries ffmpeg 4.2.2 (74 MB, 18 MiB xz), which has libx264rgb; 0.8.1's 9.0.2 is
    # 172 MB (46 MiB xz), too big to travel beside sapien
    "imageio-ffmpeg==0.4.9": "rlrec's encoder runs its ffmpeg (binary carried xz-compressed)",
}
SAPIEN: Dict[str, str] = {
    "sapien==3.0.3": "the PhysX refusal (sapien.physx.version()); ManiSkill's renderer",
    "transforms3d==0.4.2": "sapien",
}
MANISKILL: Dict[str, str] = {
    "mani_skill==3.0.1": "the renderer part (slimmed: the assets PushCube/PickCube load)",
    "dacite==1.9.2": "mani_skill.utils (sim and scene configs)",
    "trimesh==5.2.0": "mani_skill.utils.building (meshes)",
    "defusedxml==0.7.1": "mani_skill.utils.building._mjcf_loader",
    "pytorch-kinematics==0.7.6": "mani_skill.agents.controllers.utils.kinematics",
    "arm-pytorch-utilities==0.5.0": "pytorch_kinematics",
    "pytorch-seed==0.2.0": "pytorch_kinematics",
    "ipython==8.12.3": "mani_skill.utils.visualization.jupyter_utils (imported by sapien_env)",
    "traitlets==5.15.0": "IPython",
    "decorator==5.2.1": "IPython",
    "pickleshare==0.7.5": "IPython 8.12",
    "backcall==0.2.0": "IPython 8.12",
    "prompt-toolkit==3.0.53": "IPython",
    "wcwidth==0.7.0": "prompt-toolkit",
    "pexpect==4.8.0": "IPython",
    "ptyprocess==0.7.0": "pexpect",
    "stack-data==0.6.3": "IPython",
    "executing==2.2.1": "stack-data",
    "asttokens==3.0.1": "stack-data",
    "pure-eval==0.2.3": "stack-data",
}
# the bundles: the pins each carries, call N carrying bundle-N (gpu_check's parts of a call need
# nothing else beside the device image: tests/test_device_kit.py checks their ``needs``)
BUNDLES: Dict[int, List[str]] = {1: [*CORE], 2: [*CORE, *SAPIEN, *MANISKILL]}
NEEDS: Dict[str, str] = {**CORE, **SAPIEN, **MANISKILL}
# each bundle's size as last built (MiB): tests/test_device_kit.py checks that it fits beside the
# working tree as it is now; build says when a bundle outgrew its figure here
BUNDLE_MIB: Dict[int, float] = {1: 18.8, 2: 58.2}
SDIST_ONLY = {"antlr4-python3-runtime"}  # no wheel on the registry: a pure-Python wheel built here

# The device image's Python packages (the tool library's list of them, 2026-11): nothing here
# may be bundled, and the check venv holds nothing else.
DEVICE_HAS = set(
    """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
    jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
    lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
    mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
    ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
    nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
    nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
    nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
    opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
    pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf
    psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
    pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
    pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
    scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
    shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
    tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz
    torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers
    treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
    werkzeug wheel wrapt xarray xxhash yarl zipp""".split()
)
# The check venv: the device image's versions where they are known, the imports' other needs.
CHECK_BASE = [
    "torch==2.11.0",
    "numpy==2.5.2",
    "scipy",
    "h5py",
    "pyyaml",
    "tqdm",
    "tabulate",
    "opencv-python-headless",
    "tensorboard",
    "rich",
    "pillow",
    "pytest",
    "pytest-timeout",
    "requests",
    "lxml",
    "networkx",
    "huggingface-hub==1.33.0",  # the device's (2.x pulls httpx2, which the image lacks)
    "imageio",
    "packaging",
    "matplotlib",
    "python-dateutil==2.9.0.post0",  # 4.x pulls tzdata, which the image lacks
    "psutil",
    "cloudpickle",
    "absl-py",
    "pygments",
    "typing-extensions",
    "setuptools",
]

# Slimming: files dropped from a wheel (fnmatch patterns over the archive path; "*" spans "/").
ASSET_EXTS = (".glb", ".gltf", ".obj", ".stl", ".dae", ".ply", ".png", ".jpg", ".jpeg", ".hdr")
ASSET_EXTS += (".exr", ".ktx", ".mtl", ".npy", ".npz", ".pkl", ".mp4", ".bin", ".usd", ".usda")
SLIM: Dict[str, dict] = {
    # mani_skill: every mesh, texture and map is dropped except those the checked tasks load
    "mani_skill": {
        "drop_ext": ASSET_EXTS,
        "keep": [
            "mani_skill/assets/robots/panda/franka_description/meshes/*",
            "mani_skill/utils/scene_builder/table/assets/table.glb",
            "mani_skill/utils/building/assets/grid_texture*.png",
        ],
    },
    # sapien: C++ headers, macOS libraries, the stereo-depth sensor's IR patterns and the
    # denoiser's CUDA module (loaded only when a ray-traced denoiser is made); its renderer
    # libraries travel xz-compressed (31 MB of libsvulkan2 -> 7.5 MiB, libsimsense 8 MB -> 0.6)
    "sapien": {
        "drop": [
            "sapien/include/*",
            "sapien/vulkan_library/*.dylib",
            "sapien/sensor/assets/*",
            "sapien/oidn_library/libOpenImageDenoise_device_cuda.so*",
        ],
        "split": ["sapien.libs/libs*.so", "sapien/vulkan_library/libvulkan.so*"],
    },
    "transforms3d": {"drop": ["transforms3d/tests/*"]},
    # imageio-ffmpeg: the ffmpeg binary travels beside the wheel, xz-compressed
    "imageio_ffmpeg": {"split": ["imageio_ffmpeg/binaries/ffmpeg-*"]},
}


class KitError(RuntimeError):
    """A kit step that cannot go on; the message says what to do."""


# --------------------------------------------------------------------------- small helpers


def _name(requirement: str) -> str:
    return requirement.split("==")[0].strip().lower().replace("_", "-")


def _wheel_name(path: Path) -> str:
    return path.name.split("-")[0].lower().replace("_", "-")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _abs(path: Path) -> str:
    """An absolute path, as handed to a subprocess: it cannot be read as an option or a URL."""
    out = str(Path(path).resolve())
    assert out.startswith("/"), out
    return out


def _rel(path: Path) -> str:
    """``path`` relative to the repo where it is inside it (as ``carry`` names it)."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


def _remove_owned(path: Path) -> None:
    """Removes a directory the kit made (it holds the sentinel); refuses any other."""
    if path.exists():
        if not (path.is_dir() and (path / SENTINEL).is_file()):
            raise KitError(
                f"{path} exists and was not made by the device kit (no {SENTINEL} in it): "
                "the kit deletes only what it made; move it away"
            )
        shutil.rmtree(path)


def _make_owned_dir(path: Path) -> Path:
    """An empty directory the kit owns: one it made before is replaced, anything else refused."""
    _remove_owned(path)
    path.mkdir(parents=True)
    (path / SENTINEL).write_text("made by tools/device/device_kit.py\n")
    return path


def _run(cmd: Sequence[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """A subprocess with a bounded wait; its output is shown when it fails."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise KitError(f"{cmd[0]} ... took over {timeout:.0f}s: {' '.join(cmd)[:300]}") from e
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise KitError(f"failed ({proc.returncode}): {' '.join(cmd)[:300]}\n{tail}")
    return proc


def _bounded(cmd: Sequence[str], env: Dict[str, str], timeout: float) -> Tuple[int, str, float]:
    """``(exit status, output, seconds)``; 124 when ``cmd`` ran over ``timeout``."""
    t = time.perf_counter()
    try:
        proc = subprocess.run(
            list(cmd), env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
        )
        return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - t
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\nstopped after {timeout:.0f}s", time.perf_counter() - t


def working_tree_bytes(repo: Path = REPO) -> int:
    """What travels with every call besides the carried paths: tracked files, untracked files
    git does not ignore, and shared/ where the checkout has one."""
    proc = _run(
        ["git", "-C", _abs(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        60,
    )
    total = 0
    for rel in filter(None, proc.stdout.split("\0")):
        p = repo / rel
        if p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    shared = repo / "shared"
    if shared.is_dir():
        total += sum(p.stat().st_size for p in shared.rglob("*") if p.is_file())
    return total


# --------------------------------------------------------------------------- build: download


def download(cache: Path, timeout: float = 1200) -> List[Path]:
    """The pinned wheels in ``cache`` (downloaded once): cp312 manylinux x86_64 binaries, and a
    wheel built here for each sdist-only pin."""
    cache.mkdir(parents=True, exist_ok=True)
    pins = list(NEEDS)
    missing = [r for r in pins if not _find_wheel(cache, r)]
    binaries = [r for r in missing if _name(r) not in SDIST_ONLY]
    if binaries:
        cmd = [sys.executable, "-m", "pip", "download", *PIP_QUIET, "--no-deps"]
        cmd += ["--only-binary=:all:", "--python-version", DEVICE_PYTHON, "--implementation", "cp"]
        for plat in PLATFORMS:
            cmd += ["--platform", plat]
        _run([*cmd, "-d", _abs(cache), *binaries], timeout)
    for r in missing:
        if _name(r) in SDIST_ONLY:
            cmd = [sys.executable, "-m", "pip", "wheel", *PIP_QUIET, "--no-deps"]
            _run([*cmd, "-w", _abs(cache), r], timeout)
    wheels = []
    for r in pins:
        w = _find_wheel(cache, r)
        if w is None:
            raise KitError(f"no wheel for {r} in {cache} after downloading it")
        wheels.append(w)
    return wheels


def _find_wheel(cache: Path, requirement: str) -> Optional[Path]:
    name, version = _name(requirement), requirement.split("==")[1]
    for w in sorted(cache.glob("*.whl")):
        parts = w.name.split("-")
        if _wheel_name(w) == name and parts[1] == version:
            return w
    return None


# --------------------------------------------------------------------------- build: slim


def slim_wheel(
    src: Path, dst_dir: Path, rules: dict, cache: Optional[Path] = None
) -> Tuple[Path, dict]:
    """A copy of wheel ``src`` in ``dst_dir`` without the files ``rules`` drop (its RECORD
    rewritten to match), and what was dropped or split out. ``rules``: ``drop`` (patterns),
    ``drop_ext`` (suffixes) with ``keep`` (patterns kept anyway), ``split`` (patterns: those
    files leave the wheel and are written beside it xz-compressed, as ``<name>.xz``, cached in
    ``cache``, by default the download cache)."""
    drop, drop_ext, keep = rules.get("drop", []), rules.get("drop_ext", ()), rules.get("keep", [])
    split = rules.get("split", [])
    dst = dst_dir / src.name
    dropped, kept_bytes, split_out = [], 0, []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, 9) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        removed = set()
        for info in zin.infolist():
            path = info.filename
            if path == record_name or path.endswith("/"):
                continue
            if any(fnmatch.fnmatch(path, p) for p in split):
                split_out.append(_split_xz(zin, info, dst_dir, CACHE if cache is None else cache))
                removed.add(path)
                continue
            if any(fnmatch.fnmatch(path, p) for p in drop) or (
                path.lower().endswith(drop_ext) and not any(fnmatch.fnmatch(path, p) for p in keep)
            ):
                dropped.append((path, info.file_size))
                removed.add(path)
                continue
            zout.writestr(info, zin.read(info), zipfile.ZIP_DEFLATED, 9)
            kept_bytes += info.file_size
        record = [
            line
            for line in zin.read(record_name).decode().splitlines()
            if line and line.split(",")[0] not in removed
        ]
        zout.writestr(record_name, "\n".join(record) + "\n")
    report = {
        "dropped_files": len(dropped),
        "dropped_bytes": sum(s for _, s in dropped),
        "kept_bytes_unpacked": kept_bytes,
        "split": split_out,
    }
    return dst, report


def _split_xz(zin: zipfile.ZipFile, info: zipfile.ZipInfo, dst_dir: Path, cache: Path) -> dict:
    """Writes the archive member as ``<basename>.xz`` (xz -9) in ``dst_dir``, once: the
    compressed copy is cached beside the downloads, since xz -9 of 170 MB takes minutes."""
    base = Path(info.filename).name
    cache.mkdir(parents=True, exist_ok=True)
    cached = cache / f"{base}.xz"
    meta = _meta(cached)
    fresh = cached.is_file() and meta.is_file()
    if not fresh or json.loads(meta.read_text()).get("size") != info.file_size:
        tmp = cached.with_suffix(".xz.partial")
        with zin.open(info) as src, lzma.open(tmp, "wb", preset=9) as out:
            shutil.copyfileobj(src, out, 1 << 20)
        os.replace(tmp, cached)
        meta.write_text(json.dumps({"size": info.file_size}))
    if cached.parent.resolve() != dst_dir.resolve():
        shutil.copyfile(cached, dst_dir / cached.name)
    return {
        "file": cached.name,
        "member": info.filename,
        "unpacked_bytes": info.file_size,
        "mode": (info.external_attr >> 16) & 0o777 or 0o755,
    }


def _meta(path: Path) -> Path:
    return path.with_name(path.name + ".json")


# --------------------------------------------------------------------------- build: pack


def bundle_bytes(
    sizes: Dict[str, int], members: Dict[int, List[str]], limit: int
) -> Dict[int, int]:
    """The bytes of each bundle (``members``: the files of each, ``sizes``: each file's bytes);
    raises when one exceeds ``limit`` (what a call may carry beside the working tree)."""
    out = {}
    for n, names in members.items():
        total = sum(sizes[name] for name in names)
        if total > limit:
            big = sorted(names, key=lambda name: -sizes[name])[:3]
            raise KitError(
                f"bundle-{n} ({_mib(total)}) cannot fit one call ({_mib(limit)} left beside the "
                f"working tree); its largest files: {', '.join(big)}: slim them further"
            )
        out[n] = total
    return out


def build(kit: Path = KIT, margin: int = MARGIN) -> dict:
    """Downloads, slims and packs; writes ``kit/bundle-N/`` (each with its MANIFEST.json) and
    ``kit/kit.json``; returns the kit description."""
    t0 = time.perf_counter()
    wheels = download(CACHE)
    stage = _make_owned_dir(kit / "stage")
    slimmed: Dict[str, dict] = {}  # wheel file -> what slimming dropped
    unpack: Dict[str, dict] = {}  # xz file -> where install unpacks it
    files: Dict[str, Path] = {}
    by_pin: Dict[str, List[str]] = {}  # pin -> the files it became
    for pin, w in zip(NEEDS, wheels):
        rules = SLIM.get(_wheel_name(w).replace("-", "_"))
        if rules is None:
            files[w.name] = Path(shutil.copy2(w, stage / w.name))
            by_pin[pin] = [w.name]
            continue
        out, report = slim_wheel(w, stage, rules)
        slimmed[out.name] = {"from_bytes": w.stat().st_size, **report}
        files[out.name] = out
        by_pin[pin] = [out.name]
        for split in report["split"]:
            files[split["file"]] = stage / split["file"]
            unpack[split["file"]] = split
            by_pin[pin].append(split["file"])
    tree = working_tree_bytes()
    members = {n: [f for pin in pins for f in by_pin[pin]] for n, pins in BUNDLES.items()}
    sizes = {n: p.stat().st_size for n, p in files.items()}
    for n, size in bundle_bytes(sizes, members, CALL_LIMIT - tree - margin).items():
        if round(size / MIB, 1) > BUNDLE_MIB[n]:
            print(f"bundle-{n} is {_mib(size)}: raise BUNDLE_MIB[{n}] in {_rel(Path(__file__))}")
    for old in sorted(kit.glob("bundle-*")):
        _remove_owned(old)  # refuses a directory the kit did not make
    bundles = []
    for i, names in sorted(members.items()):
        d = _make_owned_dir(kit / f"bundle-{i}")
        entries = []
        for n in names:
            shutil.copy2(files[n], d / n)
            entry = {"file": n, "bytes": (d / n).stat().st_size, "sha256": _sha256(d / n)}
            if n in slimmed:
                entry["slimmed"] = slimmed[n]
            if n in unpack:
                entry["unpack_to"] = unpack[n]["member"]
                entry["mode"] = unpack[n]["mode"]
            entries.append(entry)
        manifest = {
            "bundle": i,
            "pins": BUNDLES[i],
            "files": entries,
            "bytes": sum(e["bytes"] for e in entries),
        }
        (d / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
        bundles.append(manifest)
    shutil.rmtree(stage)
    desc = {
        "bundles": [
            {"bundle": b["bundle"], "bytes": b["bytes"], "files": len(b["files"])} for b in bundles
        ],
        "working_tree_bytes": tree,
        "call_limit_bytes": CALL_LIMIT,
        "pins": NEEDS,
        "built_in_s": round(time.perf_counter() - t0, 1),
    }
    (kit / "kit.json").write_text(json.dumps(desc, indent=1) + "\n")
    return desc


# --------------------------------------------------------------------------- the calls


# The device tool's limits (its README): 15 minutes of device time in all, each machine start,
# command and idle wait counted; at most 600 s a command; a machine stays warm 30 s after a call;
# no machine starts with under 4 minutes left. Each call may find the machine gone back and start
# a fresh one, so each carries and installs all its parts need, and the plan holds with every
# call starting a machine (device_timeline).
DEVICE_S = 15 * 60
COMMAND_MAX_S = 600
MACHINE_START_S = 150  # a cold start, assumed ("a minute or more")
WARM_S = 30  # the idle wait after a call (the last call is followed by give_back)
NO_START_UNDER_S = 4 * 60
SPARE = 0.2  # each call leaves this share of its timeout unallocated (a slow start or install)
INSTALL_S = {1: 15, 2: 30}  # each bundle's install (measured: tools/device/README.md)
START_S = 10  # gpu_check's imports and preflight, before its --budget clock runs
CALL_TIMEOUT_S = {1: 240, 2: 310}
CHECK_BUDGET_S = {1: 165, 2: 208}  # gpu_check's --budget in each call (gpu_check.CALL_BUDGET)
CALL_PARTS = {  # gpu_check.CALL_PARTS, most valuable first (this file runs on the stdlib alone)
    1: ["compiled_update", "train_cuda", "memory_budget", "recorder_cost", "frames_are_states"],
    2: ["maniskill_render", "physx_refusal", "compile_speedup", "two_ranks"],
}


def allocated_s(n: int) -> int:
    """Call ``n``'s planned seconds: its install, gpu_check's start and its --budget."""
    return INSTALL_S[n] + START_S + CHECK_BUDGET_S[n]


def device_timeline() -> List[dict]:
    """Device seconds left before and after each call, every call starting a machine and running
    to its timeout, then the warm wait (none after the last: give_back)."""
    left, rows = DEVICE_S, []
    for n in sorted(CALL_TIMEOUT_S):
        wait = WARM_S if n < len(CALL_TIMEOUT_S) else 0
        after = left - MACHINE_START_S - CALL_TIMEOUT_S[n] - wait
        rows.append({"call": n, "left_before": left, "left_after": after})
        left = after
    return rows


def plan_calls(kit_rel: str = "build/device_kit") -> List[dict]:
    """The ``run`` calls, in order: each installs its bundle, then runs its gpu_check parts
    bounded by ``--budget`` (each part cut at its own budget)."""
    calls = []
    for n in sorted(CALL_TIMEOUT_S):
        run = "python3 tools/device/device_kit.py run --"
        check = f"python3 tools/device/gpu_check.py --call {n} --out $OUT"
        calls.append(
            {
                "carry": [f"{kit_rel}/bundle-{n}"],
                "timeout_s": CALL_TIMEOUT_S[n],
                "command": f"python3 tools/device/device_kit.py install {n} && {run} {check} "
                f"--budget {CHECK_BUDGET_S[n]}",
                "parts": CALL_PARTS[n],
            }
        )
    return calls


def print_plan(kit: Path = KIT) -> bool:
    """Prints the calls with their time and carried bytes; False when the kit is not built (the
    last line then gives the command that builds it)."""
    desc_path = kit / "kit.json"
    sizes = {}
    if desc_path.is_file():
        sizes = {b["bundle"]: b["bytes"] for b in json.loads(desc_path.read_text())["bundles"]}
    tree = working_tree_bytes()
    print(
        f"The device calls, in order; each carries and installs all its parts need, and the times "
        f"hold if each starts a machine ({MACHINE_START_S} s assumed) in {DEVICE_S // 60} minutes "
        f"of device time. The working tree ({_mib(tree)}) travels with every call."
    )
    ready = True
    for call, row in zip(plan_calls(), device_timeline()):
        n, timeout = row["call"], call["timeout_s"]
        print(f"\n{n}. run(timeout_s={timeout}, carry={json.dumps(call['carry'])})")
        print(f"   {call['command']}")
        print(f"   parts: {' '.join(call['parts'])}")
        spare = timeout - allocated_s(n)
        print(
            f"   time: install {INSTALL_S[n]} + start {START_S} + parts {CHECK_BUDGET_S[n]} = "
            f"{allocated_s(n)} s of {timeout} ({spare} s, {spare / timeout:.0%} unallocated); "
            f"device time left {row['left_before']} s before, {row['left_after']} s after"
        )
        if n in sizes:
            total = tree + sizes[n]
            fits = "OK" if total <= CALL_LIMIT else "OVER THE LIMIT: slim the bundle"
            print(
                f"   carried: bundle-{n} {_mib(sizes[n])} + tree = {_mib(total)} of "
                f"{_mib(CALL_LIMIT)} {fits}"
            )
            ready = ready and total <= CALL_LIMIT
        else:
            print(f"   carried: bundle-{n} is not built")
            ready = False
    print(
        "\nThen give_back. Each call's $OUT brings back gpu_check.log and gpu_check.json; "
        "tools/device/README.md says what each part measures."
    )
    if not sizes:
        print(
            "NOT READY: the bundles are not built: run `python tools/device/device_kit.py build` "
            "(downloads about 180 MB once, then minutes)"
        )
    return ready


# --------------------------------------------------------------------------- device side


def install(n: int, kit: Path = KIT, site: Path = SITE, python: str = sys.executable) -> float:
    """Installs bundle ``n`` into ``site`` with ``--no-deps`` (after checking every file against
    its manifest), and unpacks the xz-compressed files into place. Returns the seconds taken."""
    t0 = time.perf_counter()
    bundle = kit / f"bundle-{n}"
    manifest_path = bundle / "MANIFEST.json"
    if not manifest_path.is_file():
        raise KitError(
            f"{manifest_path} is missing: this call must carry {_rel(bundle)} "
            "(the kit's plan names each call's carry)"
        )
    manifest = json.loads(manifest_path.read_text())
    marker = site / f".installed-bundle-{n}"
    digest = hashlib.sha256(manifest_path.read_bytes()).hexdigest()
    if marker.is_file() and marker.read_text().split()[:1] == [digest]:
        print(f"bundle-{n} already installed in {site}")
        return 0.0
    for entry in manifest["files"]:
        path = bundle / entry["file"]
        if not path.is_file() or path.stat().st_size != entry["bytes"]:
            raise KitError(f"{path} is missing or truncated: carry {bundle} again")
        if _sha256(path) != entry["sha256"]:
            raise KitError(f"{path} does not match its manifest (sha256): carry {bundle} again")
    site.mkdir(parents=True, exist_ok=True)
    wheels = [_abs(bundle / e["file"]) for e in manifest["files"] if e["file"].endswith(".whl")]
    if wheels:
        cmd = [python, "-m", "pip", "install", *PIP_QUIET, "--no-index", "--no-deps"]
        cmd += ["--no-compile", "--no-cache-dir", "--upgrade", "--target", _abs(site)]
        _run([*cmd, *wheels], 600)
    for entry in manifest["files"]:
        if "unpack_to" in entry:
            dst = site / entry["unpack_to"]
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(dst.name + ".partial")
            with lzma.open(bundle / entry["file"], "rb") as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            os.chmod(tmp, entry.get("mode", 0o755))
            os.replace(tmp, dst)
    marker.write_text(f"{digest}\n")
    took = time.perf_counter() - t0
    print(
        f"bundle-{n}: {len(manifest['files'])} files ({_mib(manifest['bytes'])}) installed into "
        f"{site} in {took:.1f}s"
    )
    return took


def device_env(site: Path = SITE, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment a command runs in there: the installed bundles and the repo on the path,
    unbuffered output, and the NVIDIA Vulkan driver's manifest where the image keeps it (its
    loader does not look there by itself)."""
    env = dict(os.environ if base is None else base)
    path = [_abs(site), _abs(REPO)] + [p for p in env.get("PYTHONPATH", "").split(":") if p]
    env["PYTHONPATH"] = ":".join(path)
    env["PYTHONUNBUFFERED"] = "1"
    icd = "/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json"
    if os.path.isfile(icd) and not (env.get("VK_ICD_FILENAMES") or env.get("VK_DRIVER_FILES")):
        env["VK_ICD_FILENAMES"] = icd
    egl = "/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json"
    if os.path.isfile(egl) and not env.get("__EGL_VENDOR_LIBRARY_FILENAMES"):
        env["__EGL_VENDOR_LIBRARY_FILENAMES"] = egl
    return env


def installed_bundles(site: Path = SITE) -> List[int]:
    """The bundles installed in ``site``, from the markers ``install`` leaves there."""
    return sorted(int(m.name.rsplit("-", 1)[1]) for m in site.glob(".installed-bundle-*"))


def run_command(cmd: Sequence[str], timeout: float, site: Path = SITE) -> int:
    """Runs ``cmd`` in :func:`device_env` after checking that a bundle is installed (each call
    installs its own, which holds all its parts need; gpu_check's preflight names anything
    missing)."""
    if not cmd:
        raise KitError("run needs a command after --: run -- python3 tools/device/gpu_check.py")
    if not installed_bundles(site):
        raise KitError(f"no bundle installed in {site} (install 1 or 2 first, carrying its bundle)")
    try:
        return subprocess.run(list(cmd), env=device_env(site), cwd=REPO, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"device_kit run: the command ran over {timeout:.0f}s and was stopped", flush=True)
        return 124


# --------------------------------------------------------------------------- check (here)


def find_python312(explicit: Optional[str] = None) -> str:
    """A Python 3.12 interpreter: ``--python``, ``python3.12`` on PATH, or one under pyenv."""
    candidates = [explicit] if explicit else []
    if not explicit:
        candidates += [shutil.which("python3.12") or ""]
        root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
        candidates += sorted(
            glob.glob(os.path.join(root, "versions", "3.12*", "bin", "python3.12"))
        )
    for c in filter(None, candidates):
        try:
            out = subprocess.run(
                [c, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == DEVICE_PYTHON:
            return c
    raise KitError(
        "check needs a Python 3.12 (the device's): pass --python PATH (e.g. pyenv install 3.12)"
    )


def _venv_dists(python: str) -> List[str]:
    code = (
        "import importlib.metadata as m, json; "
        "print(json.dumps(sorted({d.metadata['Name'].lower().replace('_', '-') "
        "for d in m.distributions()})))"
    )
    # run elsewhere than the repo: its rlrec.egg-info would count as installed
    return json.loads(_run([python, "-c", code], 120, cwd=tempfile.gettempdir()).stdout)


def base_venv(python312: str, check_dir: Path) -> str:
    """A clean Python 3.12 venv with a part of the device image (torch 2.11, numpy 2.5, ...),
    from the registry with their dependencies; made once and reused while CHECK_BASE is the
    same. Returns its python."""
    venv = check_dir / "venv"
    stamp = venv / "rlrec-base.json"
    want = json.dumps(CHECK_BASE)
    py = str(venv / "bin" / "python")
    if stamp.is_file() and stamp.read_text() == want and os.path.exists(py):
        return py
    _remove_owned(venv)
    _run([python312, "-m", "venv", _abs(venv)], 300)
    (venv / SENTINEL).write_text("made by tools/device/device_kit.py check\n")
    print(f"check: installing the device image's packages into {venv} (minutes, once)", flush=True)
    _run([py, "-m", "pip", "install", *PIP_QUIET, *CHECK_BASE], 1800)
    stamp.write_text(want)
    return py


SMOKE = r"""
import json, os, sys, time
site, repo = sys.argv[1], sys.argv[2]
out = {}
t = time.perf_counter()
import torch, rlrec, sapien, mani_skill, mani_skill.envs, gymnasium, hydra, imageio_ffmpeg
import rlrec.run.cli, rlrec.train.runner
out["import_s"] = round(time.perf_counter() - t, 1)
out["versions"] = {m.__name__: getattr(m, "__version__", "?") for m in (torch, sapien, mani_skill,
                   gymnasium, hydra)}
roots = [os.path.realpath(p) for p in (site, repo, sys.prefix, sys.base_prefix)]
# modules with a real file (torch.ops and torch.classes carry a bare name) outside the roots
outside = sorted({m.__name__.split(".")[0] for m in list(sys.modules.values())
                  if os.path.isabs(getattr(m, "__file__", None) or "")
                  and not any(os.path.realpath(m.__file__).startswith(r) for r in roots)})
out["modules_from_elsewhere"] = outside
ffmpeg = imageio_ffmpeg.get_ffmpeg_exe()
out["ffmpeg"] = ffmpeg
import subprocess
proc = subprocess.run([ffmpeg, "-version"], capture_output=True, timeout=60)
out["ffmpeg_ok"] = proc.returncode == 0
from rlrec.config import SimConfig
from rlrec.envs.maniskill import ManiSkillEnvConfig
from rlrec.envs.factory import make_adapter
out["envs"] = {}
for env_id in ("PushCube-v1", "PickCube-v1"):
    try:
        t = time.perf_counter()
        env = make_adapter(ManiSkillEnvConfig(id=env_id, render_width=64, render_height=64),
                           SimConfig(name="cpu", device="cpu"), 2, 0)
        env.reset(seed=0)
        env.step(torch.zeros(2, *env.single_action_space.shape))
        frame = env.render([0, 1])
        env.close()
        out["envs"][env_id] = {"ok": tuple(frame.shape) == (2, 64, 64, 3) and int(frame.max()) > 0,
                               "s": round(time.perf_counter() - t, 1)}
    except Exception as e:
        out["envs"][env_id] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:400]}
print("SMOKE " + json.dumps(out))
"""


def check(kit: Path = KIT, python: Optional[str] = None, gpu_check: bool = True) -> dict:
    """Installs the bundles into a clean Python 3.12 here exactly as ``install`` does there, and
    smoke-tests that environment; writes ``kit/check/result.json``."""
    if not (kit / "kit.json").is_file():
        raise KitError(f"no kit built in {kit}: run python tools/device/device_kit.py build first")
    desc = json.loads((kit / "kit.json").read_text())
    check_dir = kit / "check"
    check_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"bundles": desc["bundles"], "working_tree_bytes": working_tree_bytes()}
    py = base_venv(find_python312(python), check_dir)
    dists = _venv_dists(py)
    result["venv_not_on_device"] = sorted(d for d in dists if d not in DEVICE_HAS)
    result["bundled_but_on_device"] = sorted(_name(r) for r in NEEDS if _name(r) in DEVICE_HAS)
    # each call's bundle in a site of its own, as a fresh machine has it
    sites = {
        b["bundle"]: _make_owned_dir(check_dir / f"site-{b['bundle']}") for b in desc["bundles"]
    }
    result["install_s"] = {n: round(install(n, kit, site, py), 1) for n, site in sites.items()}
    last = sites[max(sites)]  # the bundle with mani_skill
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [py, "-c", SMOKE, _abs(last), _abs(REPO)],
        env=device_env(last, clean),
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("SMOKE ")), None)
    if line is None:
        raise KitError(
            f"the smoke test failed in the check venv:\n{(proc.stdout + proc.stderr)[-4000:]}"
        )
    result["smoke"] = json.loads(line[6:])
    result["gpu_check_cpu_rehearsal"] = {}
    for n, site in sites.items() if gpu_check else ():
        out = _make_owned_dir(check_dir / f"gpu_check-{n}")
        cmd = [py, _abs(REPO / "tools" / "device" / "gpu_check.py"), "--device", "cpu", "--quick"]
        # a call's rehearsal takes up to about 15 minutes on a slow CPU (a cold inductor cache
        # compiles for minutes); it bounds each part itself
        rc, text, took = _bounded(
            [*cmd, "--call", str(n), "--out", _abs(out)], env=device_env(site, clean), timeout=1800
        )
        lines = text.strip().splitlines()
        summary = [x for x in lines if x.startswith(("PASS gpu_check", "FAIL gpu_check"))]
        result["gpu_check_cpu_rehearsal"][n] = {
            "rc": rc,
            "s": round(took, 1),
            "summary": (summary or lines or [""])[-1],
            "failed": [x for x in lines if x.startswith("FAIL ")][:20],
        }
    smoke = result["smoke"]
    result["ok"] = bool(
        not result["venv_not_on_device"]
        and not result["bundled_but_on_device"]
        and not smoke["modules_from_elsewhere"]
        and smoke["ffmpeg_ok"]
        and all(e["ok"] for e in smoke["envs"].values())
        and all(r["rc"] == 0 for r in result["gpu_check_cpu_rehearsal"].values())
    )
    (check_dir / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


# --------------------------------------------------------------------------- cli


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="download, slim and pack the bundles here; print the calls")
    sub.add_parser("plan", help="print the device calls and the bundle sizes")
    c = sub.add_parser("check", help="install the bundles into a clean Python 3.12 venv here")
    c.add_argument("--python", help="the Python 3.12 to make the venv with")
    c.add_argument(
        "--no-gpu-check", action="store_true", help="skip gpu_check --device cpu --quick"
    )
    i = sub.add_parser("install", help="(device) install bundle N into build/device_kit/site")
    i.add_argument("n", type=int)
    r = sub.add_parser("run", help="(device) run a command with the installed bundles")
    r.add_argument("--timeout", type=float, default=590.0, help="seconds, 1..3600")
    r.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    try:
        if args.cmd == "build":
            desc = build()
            print(f"built {len(desc['bundles'])} bundles in {desc['built_in_s']:.0f}s under {KIT}")
            print_plan()
        elif args.cmd == "plan":
            return 0 if print_plan() else 1
        elif args.cmd == "check":
            res = check(python=args.python, gpu_check=not args.no_gpu_check)
            print(json.dumps(res, indent=1))
            print(f"device kit check: {'PASS' if res['ok'] else 'FAIL'}")
            return 0 if res["ok"] else 1
        elif args.cmd == "install":
            if args.n < 1:
                raise KitError(f"install N: N={args.n} is invalid: bundles are numbered from 1")
            install(args.n)
        elif args.cmd == "run":
            import math

            if not (math.isfinite(args.timeout) and 1 <= args.timeout <= 3600):
                raise KitError(
                    f"--timeout={args.timeout} is invalid: a number of seconds in [1, 3600]"
                )
            cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
            return run_command(cmd, args.timeout)
    except KitError as e:
        print(f"device_kit {args.cmd}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
