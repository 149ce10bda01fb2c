#!/usr/bin/env python
"""rlrec on one NVIDIA GPU: what such a machine can run, measured in two bounded calls, and what
it cannot, said plainly.

    python tools/device/gpu_check.py --call 1 --out DIR        # CUDA machine: Call 1's parts
    python tools/device/gpu_check.py --call 2 --out DIR        # Call 2's parts
    python tools/device/gpu_check.py --device cpu --quick      # the rehearsal: every part small,
                                                                # on the CPU (CUDA-only checks
                                                                # reported as skipped, with why)

``tools/device/device_kit.py plan`` prints the two calls for a GPU machine with no network (the
packages it lacks travel as bundles, each call's holding all its parts need). A run first checks
what its parts need that the machine may lack (the preflight: the bundle's distributions, ffmpeg
with libx264rgb, ``libX11.so.6`` and a Vulkan driver for SAPIEN's renderer, ``libcuda.so``), and
skips a part whose need is missing, naming it. Then the parts, most valuable first, each cut at
its own budget (time an earlier part left unused is added to it), so that an overrun never takes
the next part's time; a part that cannot start with its minimum left of ``--budget`` is skipped,
and says so:

Call 1 (bundle-1: rlrec's imports and ffmpeg): ``compiled_update`` (the cold compile is a figure;
a compile that outlasts the part is reported as such, not as a defect), ``train_cuda``,
``memory_budget``, ``recorder_cost``, ``frames_are_states``. Call 2 (bundle-2: the same, sapien and
mani_skill): ``maniskill_render``, ``physx_refusal``, ``compile_speedup``, ``two_ranks``. What each
checks, its goal and budget: ``PARTS`` below and the table in tools/device/README.md.

The parts that need SAPIEN's PhysX GPU library (``sim=gpu`` ManiSkill training, the regression,
the contract suite; ``physx_parts.py``) run only where ``--parts`` names them.

Goals (ratios) are checked on CUDA; with ``--quick`` or ``--device cpu`` they are reported, not
checked. Wall times are figures, never checks. ``--out`` (default ``$OUT`` when set) receives
``gpu_check.log`` and ``gpu_check.json`` (rewritten after each part). Exits 0 only when every
check passed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
for _p in (str(REPO), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gpu_common import (  # noqa: E402
    Report,
    _pythonpath,
    decode,
    tail,
    train_cmd,
    train_run,
)


@dataclass(frozen=True)
class Part:
    call: Optional[int]  # 1 or 2 (the device calls); None: only when --parts names it
    budget: float  # seconds it may take on the GPU machine (then it is cut)
    min_start: float  # the least it needs to start
    quick_budget: float  # seconds under --quick (the CPU rehearsal on a slow machine)
    what: str
    # what it needs beside the device image: distributions (pip names, as device_kit.py pins
    # them: its call's bundle must hold them) and what the image itself may lack (SYSTEM)
    needs: Tuple[str, ...] = ()


SYSTEM = ("ffmpeg", "libX11.so.6", "vulkan", "libcuda.so")  # checked by the preflight
TRAIN = ("hydra-core", "omegaconf", "antlr4-python3-runtime", "gymnasium")  # train.py
CLIPS = ("gymnasium", "imageio-ffmpeg", "ffmpeg")  # rlrec's encoder
SAPIEN = ("sapien", "libX11.so.6")  # importing sapien (its renderer library links libX11)
RENDERER = (*SAPIEN, "mani-skill", "vulkan")  # SAPIEN's renderer under ManiSkill

# Each call's parts in the order they run: the most valuable first.
PARTS: Dict[str, Part] = {
    "compiled_update": Part(1, 70, 30, 300, "compiled NatureCNN rollouts, updates", ("gymnasium",)),
    "train_cuda": Part(1, 25, 15, 120, "train.py from pixels, recorder.view=both", TRAIN + CLIPS),
    "memory_budget": Part(1, 15, 10, 60, "a size that does not fit is refused", TRAIN),
    "recorder_cost": Part(1, 25, 15, 120, "idle recorder cost; 4x4 grid clip", CLIPS),
    "frames_are_states": Part(1, 20, 10, 120, "every frame is a re-render of its state", CLIPS),
    "maniskill_render": Part(2, 50, 30, 240, "SAPIEN's renderer on the device", CLIPS + RENDERER),
    "physx_refusal": Part(2, 20, 15, 60, "env=maniskill sim=gpu refused", TRAIN + SAPIEN),
    "compile_speedup": Part(2, 90, 60, 420, "eager vs algo.compile=true env steps/s", TRAIN),
    "two_ranks": Part(2, 40, 30, 240, "two ranks on one GPU: identical parameters", TRAIN),
}
CALL_PARTS = {c: [n for n, p in PARTS.items() if p.call == c] for c in (1, 2)}
CUT_GRACE_S = 2  # a part is cut this long after its budget (its subprocesses end at the budget)
# the whole run's --budget of each call (tools/device/device_kit.py gives the call's timeout):
# its parts' budgets and their cut grace
CALL_BUDGET = {1: 165, 2: 208}
REFUSAL_S = 20.0  # the PhysX refusal must come within this (ManiSkill would hang downloading)
REFUSED_BEFORE_WORK_S = 30.0  # the memory budget's refusal: Hydra and imports, nothing built
EVAL_SEED = 1000


def physx_parts() -> Dict[str, Part]:
    """The ManiSkill GPU-sim parts (physx_parts.py), which need SAPIEN's PhysX GPU library."""
    import physx_parts as pp

    return {
        name: Part(
            None, budget, least, max(budget, 240), "needs the PhysX GPU library", PHYSX_NEEDS
        )
        for name, (_, budget, least) in pp.PARTS.items()
    }


PHYSX_NEEDS = TRAIN + CLIPS + RENDERER + ("libcuda.so",)
PHYSX_NAMES = [  # physx_parts.PARTS (listed here so --help needs no ManiSkill import)
    "physx_smoke",
    "physx_regression",
    "physx_contract",
    "physx_own_loop",
    "physx_throughput",
    "physx_pushcube",
    "physx_pickcube",
]


# --------------------------------------------------------------------------- reporting


class Tee:
    """Everything printed (stdout and stderr) goes to the console and to the log file."""

    def __init__(self, stream, file):
        self.stream, self.file = stream, file

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.file.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        self.file.flush()


# --------------------------------------------------------------------------- helpers


def cuda(args) -> bool:
    return args.device == "cuda"


def offline_env(home: Path) -> Dict[str, str]:
    """A subprocess environment with a fresh ``HOME`` (no PhysX library in it) and no network:
    every proxy points at a closed local port, so a download fails at once instead of hanging."""
    env = dict(os.environ)
    env.update(HOME=str(home), PYTHONUNBUFFERED="1", PYTHONPATH=_pythonpath())
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        env[key] = "http://127.0.0.1:9"
    env["NO_PROXY"] = env["no_proxy"] = ""
    return env


class Cut(BaseException):
    """A part's time is up (SIGALRM; a BaseException, so no part's own handler takes it)."""


def _cut(signum, frame) -> None:
    raise Cut()


def run_bounded(cmd: List[str], timeout: float, cwd: Path = REPO, env=None) -> tuple:
    """``(exit status, output, seconds)`` of ``cmd``; 124 when it ran over ``timeout`` (its whole
    process group is killed, as when the part is cut meanwhile)."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env if env is not None else {**os.environ, "PYTHONPATH": _pythonpath()},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=max(1.0, timeout))
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        rc, out = 124, (out or "") + f"\n[gpu_check: stopped after {timeout:.0f}s]"
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return rc, out or "", time.perf_counter() - t


# a launcher that makes torch report one CUDA device, for rehearsing a refusal that comes before
# any CUDA work (the CPU has none); train.py's own main runs after it
FAKE_CUDA = (
    "import sys, torch; c = torch.cuda; c.is_available = lambda: True; "
    "c.device_count = lambda: 1; c.current_device = lambda: 0; c.set_device = lambda d: None; "
    "c.mem_get_info = lambda d=None: (40 << 30, 80 << 30); "  # 40 GiB of 80 free
    "sys.argv[0] = 'train.py'; from rlrec.run.cli import main; main()"
)

# --------------------------------------------------------------------------- Call 1


# Loads each shared library named on the command line in a fresh process (a failed or odd load
# stays out of gpu_check's own), printing {name: "" or why it did not load}.
PROBE = """import ctypes, json, sys
def load(name):
    try:
        return ctypes.CDLL(name) and ""
    except OSError as e:
        return str(e)
print(json.dumps({name: load(name) for name in sys.argv[1:]}))"""
ICD_DIRS = [  # where Vulkan loaders look for driver manifests, and the NVIDIA driver's own
    "/usr/local/nvidia/share/vulkan/icd.d",
    "/etc/vulkan/icd.d",
    "/usr/share/vulkan/icd.d",
    "/usr/local/share/vulkan/icd.d",
]


def vulkan_drivers() -> Dict[str, str]:
    """The Vulkan driver manifests the loader would read here (with SAPIEN's own NVIDIA one, which
    it falls back to): file -> the library it names."""
    import importlib.util

    named = os.environ.get("VK_DRIVER_FILES") or os.environ.get("VK_ICD_FILENAMES")
    files = named.split(":") if named else [str(f) for d in ICD_DIRS for f in Path(d).glob("*")]
    spec = importlib.util.find_spec("sapien")
    if not named and spec is not None and spec.origin:
        files.append(str(Path(spec.origin).parent / "vulkan_library" / "nvidia_icd.json"))
    out = {}
    for f in files:
        try:
            out[f] = json.loads(Path(f).read_text())["ICD"]["library_path"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def preflight(args, rep: Report, parts: List[str], table: Dict[str, Part]) -> Dict[str, str]:
    """Before any part: versions, the GPU, and each thing the parts need that this machine may
    lack (their distributions, which the call's bundle installs; ffmpeg with libx264rgb;
    ``libX11.so.6`` and a Vulkan driver for SAPIEN's renderer; ``libcuda.so`` by that name, which
    SAPIEN's PhysX loads). Returns what is missing, each with why."""
    import importlib.metadata as metadata

    rep.figure("python", sys.version.split()[0])
    rep.figure("torch", torch.__version__)
    wanted = {n for p in parts for n in table[p].needs}
    missing: Dict[str, str] = {}
    for dist in sorted(wanted - set(SYSTEM)):
        try:
            rep.figure(dist, metadata.version(dist))
        except metadata.PackageNotFoundError:
            missing[dist] = "not installed (the call's bundle installs it)"
    if "ffmpeg" in wanted and "imageio-ffmpeg" not in missing:
        try:
            import imageio_ffmpeg

            exe = imageio_ffmpeg.get_ffmpeg_exe()
            rc, out, _ = run_bounded([exe, "-hide_banner", "-encoders"], 20)
            rep.figure("ffmpeg", exe)
            if rc != 0 or "libx264rgb" not in out:
                missing["ffmpeg"] = f"{exe} exits {rc} or lacks libx264rgb (lossless clips)"
        except Exception as e:  # imageio-ffmpeg finds no binary
            missing["ffmpeg"] = f"{type(e).__name__}: {e}"[:300]
    drivers = vulkan_drivers() if "vulkan" in wanted else {}
    libs = ["libX11.so.6", "libvulkan.so.1", "libcuda.so", *sorted(set(drivers.values()))]
    rc, out, _ = run_bounded([sys.executable, "-c", PROBE, *libs], 30)
    loads = json.loads(out.strip().splitlines()[-1]) if rc == 0 else {n: out[-200:] for n in libs}
    rep.figure("libraries", {n: loads[n] or "loads" for n in libs})
    if "libX11.so.6" in wanted and loads["libX11.so.6"]:
        missing["libX11.so.6"] = f"{loads['libX11.so.6']} (SAPIEN's renderer links it)"
    if "vulkan" in wanted:
        # SAPIEN falls back to its own loader; the driver must be NVIDIA's on the GPU, any
        # (lavapipe) on the CPU
        usable = {f: lib for f, lib in drivers.items() if not loads[lib]}
        if cuda(args):
            usable = {f: lib for f, lib in usable.items() if "nvidia" in lib.lower()}
        rep.figure("vulkan_drivers", drivers)
        if not usable:
            kind = "NVIDIA's" if cuda(args) else "any"
            missing["vulkan"] = f"no Vulkan driver manifest ({kind}) whose library loads in "
            missing["vulkan"] += "$VK_DRIVER_FILES/$VK_ICD_FILENAMES or " + ", ".join(ICD_DIRS)
    if "libcuda.so" in wanted and loads["libcuda.so"]:
        missing["libcuda.so"] = f"{loads['libcuda.so']} (SAPIEN's PhysX loads it by this name)"
    said = "; ".join(f"{n}: {loads[n] or 'loads'}" for n in libs[:3])
    print(f"preflight: {said}; missing: {', '.join(sorted(missing)) or 'nothing'}", flush=True)
    for item, why in sorted(missing.items()):
        users = " ".join(p for p in parts if item in table[p].needs)
        if item in SYSTEM:
            rep.skip(f"this machine has {item}", f"{why}; skipped: {users}")
        else:
            rep.check(False, f"{item} is installed", f"{why}; skipped: {users}")
    if cuda(args):
        smi = shutil.which("nvidia-smi")
        query = ["--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        rc, out, _ = run_bounded([smi, *query], 20) if smi else (127, "not on PATH", 0)
        rep.figure("nvidia_smi", out.strip()[:300])
        rep.check(rc == 0, "nvidia-smi answers", out.strip()[:200])
        props = torch.cuda.get_device_properties(0)
        rep.figure("gpu", props.name)
        rep.figure("gpu_memory_gib", props.total_memory / 2**30)
        rep.figure("cuda", torch.version.cuda)
    return missing


def physx_refusal(args, rep: Report, tmp: Path, budget: float) -> None:
    """``train.py env=maniskill sim=gpu`` where SAPIEN's PhysX GPU library is missing: rlrec must
    refuse before building the env. Without that refusal ManiSkill calls
    ``sapien.physx.enable_gpu()``, which downloads the library with ``requests.get(url)`` and no
    timeout (sapien/physx/__init__.py, sapien 3.0.3), so an offline node hangs there."""
    try:
        import sapien.physx

        version = sapien.physx.version()
    except Exception as e:
        rep.check(False, "sapien imports (the refusal reads its PhysX version)", str(e)[:300])
        return
    home = tmp / "home"
    home.mkdir()
    lib = home / ".sapien" / "physx" / version / "libPhysXGpu_64.so"
    over = ["env=maniskill", "sim=gpu", "env.num_envs=2", "eval_env.num_envs=2"]
    over += ["recorder=none", "total_steps=1000"]
    launcher = None if cuda(args) else FAKE_CUDA  # the CPU: CUDA faked, the refusal comes first
    if launcher:
        rep.info("CUDA faked", "--device cpu: torch.cuda.is_available() patched to True")
    # the CPU rehearsal's machine may be slow and loaded: its start-up alone can take 20 s there
    within = REFUSAL_S if cuda(args) else 3 * REFUSAL_S
    limit = min(budget, within + 5)
    rc, out, took = run_bounded(
        train_cmd(over, tmp / "run", launcher), limit, env=offline_env(home)
    )
    rep.figure("exit", rc)
    rep.figure("s", took)
    rep.figure("expected_path", str(lib))
    last = [line for line in out.strip().splitlines() if line.strip()][-3:]
    rep.check(
        rc not in (0, 124) and took < within and "libPhysXGpu" in out,
        f"train.py env=maniskill sim=gpu refuses within {within:.0f}s naming libPhysXGpu",
        f"exit {rc} after {took:.1f}s; says: {' | '.join(last)[:400]}",
    )
    rep.figure("names_full_path", str(lib) in out)
    rep.check(not lib.exists(), "nothing downloaded", f"{lib} absent")
    if rc == 0 or "libPhysXGpu" not in out:
        print(tail(out), flush=True)


def _clips_decode(run_dir: Path) -> Dict[str, List[Tuple[int, int]]]:
    """``(frames, width)`` of every clip under ``run_dir/videos``, by kind (train / eval)."""
    out: Dict[str, List[Tuple[int, int]]] = {}
    for mp4 in sorted((run_dir / "videos").rglob("*.mp4")):
        kind = mp4.relative_to(run_dir / "videos").parts[0]
        try:
            frames = decode(str(mp4))
            shape = (len(frames), int(frames.shape[2]))
        except Exception:
            shape = (0, 0)
        out.setdefault(kind, []).append(shape)
    return out


def _metrics(run_dir: Path) -> List[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def train_cuda(args, rep: Report, tmp: Path, budget: float) -> None:
    """train.py on the built-in env from pixels (a uint8 image and the state, NatureCNN), the
    training clips showing the render and the observed image side by side (``recorder.view=both``:
    the recorded envs' images copied from the device)."""
    n, size = (16 if args.quick else 256), 64
    over = [f"sim.device={args.device}", f"env.num_envs={n}", "algo.num_steps=16"]
    over += ["algo.num_minibatches=2", "algo.update_epochs=2", f"total_steps={4 * n * 16}"]
    over += [f"env.render_width={size}", f"env.render_height={size}", "env.max_episode_steps=20"]
    over += ["env.obs_mode=rgb_state", "algo.encoder=cnn", "recorder.view=both"]
    over += ["recorder.trigger=always", "recorder.env_idx=[0,1]", "eval_env.num_envs=4"]
    over += ["eval_env.every=2", "eval_env.recorder.env_idx=[0,1,2,3]", "checkpoint_every=1000"]
    run_dir = tmp / "run"
    rc, out, took = run_bounded(train_cmd(over, run_dir), budget)
    rep.figure("s", took)
    metrics = _metrics(run_dir)
    iters = [m for m in metrics if "sps/total" in m]
    losses = [m.get("loss/value", float("nan")) for m in iters]
    if iters:
        rep.figure("sps_last", iters[-1]["sps/total"])
    rep.check(
        rc == 0 and len(iters) == 4 and all(math.isfinite(v) for v in losses),
        f"train.py trains the built-in env from pixels (env.obs_mode=rgb_state algo.encoder=cnn) "
        f"on {args.device} (4 iterations, finite losses)",
        f"exit {rc}, {len(iters)} iterations in {took:.1f}s",
    )
    clips = _clips_decode(run_dir)
    rep.figure("clip_frames_width", clips)
    train, evals = clips.get("train", []), clips.get("eval", [])
    rep.check(
        bool(train) and bool(evals) and all(f > 1 for f, _ in train + evals),
        "training and eval clips exist and decode",
        f"{len(train)} training and {len(evals)} eval clips",
    )
    rep.check(
        bool(train) and all(w == 2 * 2 * size for _, w in train),  # 2 envs in a row, 2 tiles
        "recorder.view=both: each training clip shows the render and the observed image",
        f"widths {sorted({w for _, w in train})} px: 2 envs of {size} px in a row, 2 tiles each",
    )
    if rc != 0:
        print(tail(out), flush=True)


PIXELS = (64, 64, 3)  # the compiled_update worker's image (env.obs_mode=rgb_state's default)


def compiled_update_worker(device: str, out: Path) -> None:
    """(in a subprocess) PPO with ``algo.compile=true algo.encoder=cnn`` on ``device`` over a
    dict observation (a uint8 image and a state, as ``env.obs_mode=rgb_state``): three rollouts of
    random observations through the compiled policy step (CUDA graphs on CUDA) into the uint8
    rollout storage, time-outs bootstrapped eagerly, each followed by a compiled ``update()``;
    writes what each returned."""
    import gymnasium as gym

    from rlrec.ppo.config import PPOConfig
    from rlrec.ppo.ppo import PPO

    dev, n = torch.device(device), 256
    torch.manual_seed(0)
    g = torch.Generator(device=dev).manual_seed(0)
    box = gym.spaces.Box
    obs_space = gym.spaces.Dict(
        {"rgb": box(0, 255, PIXELS, np.uint8), "state": box(-np.inf, np.inf, (6,), np.float32)}
    )
    cfg = PPOConfig(compile=True, encoder="cnn", num_steps=16, num_minibatches=4, update_epochs=2)
    ppo = PPO(cfg, obs_space, box(-1.0, 1.0, (2,), np.float32), dev)
    storage = ppo.init_storage(n)

    def obs():
        rgb = torch.randint(0, 256, (n, *PIXELS), generator=g, device=dev, dtype=torch.uint8)
        return {"rgb": rgb, "state": torch.randn(n, 6, generator=g, device=dev)}

    before = torch.cat([p.detach().flatten() for p in ppo.agent.parameters()]).clone()
    done, results = torch.zeros(n, dtype=torch.bool, device=dev), []
    print("compiling: the first rollout and update() compile", flush=True)
    for _ in range(3):
        _sync(dev)
        t = time.perf_counter()
        with ppo.rollout_mode():
            for _ in range(cfg.num_steps):
                ppo.act(obs())
                cut = torch.rand(n, generator=g, device=dev) < 0.05
                info = {"_final": cut, "final_obs": obs()}
                ppo.process_env_step(torch.randn(n, generator=g, device=dev), done, cut, info)
            ppo.compute_returns(obs())
        losses = ppo.update()
        _sync(dev)
        results.append({"s": time.perf_counter() - t, "losses": losses})
        out.write_text(json.dumps({"updates": results}))  # what a cut leaves
    after = torch.cat([p.detach().flatten() for p in ppo.agent.parameters()])
    rgb = storage.obs["rgb"]
    out.write_text(
        json.dumps(
            {
                "updates": results,
                "finite_params": bool(torch.isfinite(after).all()),
                "changed": not torch.equal(before, after),
                "storage": f"{rgb.dtype} on {rgb.device.type}",
                "cudagraphs": ppo._cudagraphs,
            }
        )
    )


def compiled_update(args, rep: Report, tmp: Path, budget: float) -> None:
    """Three compiled rollouts and ``update()`` calls of NatureCNN over a dict observation, in a
    subprocess with an empty compile cache: the first iteration's seconds are the cold compile (a
    figure); a compile still running when the part's time is up is reported as such."""
    out = tmp / "result.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "compiled_update"]
    cmd += ["--device", args.device, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"), TRITON_CACHE_DIR=str(tmp / "triton"))
    rc, text, took = run_bounded(cmd, budget, env=env)
    rep.figure("s", took)
    ups = json.loads(out.read_text())["updates"] if out.is_file() else []
    if rc == 124 and not ups and "compiling:" in text:
        rep.figure("cold_compile_s", f"> {took:.0f} (cut)")
        rep.info("cold compile", f"still compiling when the part's {budget:.0f}s ran out")
        return
    if ups:
        rep.figure("cold_compile_s", ups[0]["s"])  # the first iteration, its compile included
    if rc != 0:
        rep.check(False, "three compiled NatureCNN rollouts and updates", f"exit {rc}, {took:.0f}s")
        print(tail(text, 5000), flush=True)
        return
    res = json.loads(out.read_text())
    rep.figure("iteration_s", [round(u["s"], 3) for u in ups])
    bad = [
        (i, k, v)
        for i, u in enumerate(ups)
        for k, v in u["losses"].items()
        if k.startswith("loss/") and k != "loss/explained_variance" and not math.isfinite(v)
    ]
    mode = "CUDA graphs (reduce-overhead)" if cuda(args) else "inductor, no CUDA graphs"
    rep.check(
        len(ups) == 3 and not bad and res["finite_params"] and res["changed"],
        f"algo.compile=true algo.encoder=cnn on {args.device} ({mode}), a uint8 image and a "
        "state observed: three rollouts and update() calls, finite losses",
        f"cold compile (the first iteration) {ups[0]['s']:.1f}s, then "
        f"{[round(u['s'], 2) for u in ups[1:]]}s; non-finite {bad}",
    )
    rep.check(
        res["storage"] == f"torch.uint8 on {args.device}" and res["cudagraphs"] == cuda(args),
        "the rollout storage keeps the image as uint8 on the device",
        f"{res['storage']}; CUDA graphs {res['cudagraphs']}",
    )


# --------------------------------------------------------------------------- Call 2


def compile_speedup(args, rep: Report, tmp: Path, budget: float) -> None:
    """The same built-in run eager and compiled: env steps over the collect + learn time of the
    iterations after the first few (the compiled run compiles during its first ones)."""
    n = 256 if args.quick else args.envs
    base = [f"sim.device={args.device}", f"env.num_envs={n}", "eval_env.enabled=false"]
    base += ["recorder=none", "total_steps=10000000000", "checkpoint_every=100000"]
    skip, measured = (2, 3) if args.quick else (5, 25)
    shares = {"eager": 0.35, "compiled": 0.65}  # compiling takes most of the compiled run's start
    sps = {}
    for label, flag in (("eager", "algo.compile=false"), ("compiled", "algo.compile=true")):
        share = budget * shares[label]
        res = train_run(args, rep, label, [*base, flag], share, skip + measured)
        steady = res["iters"][skip:]
        secs = sum(m["time/collect"] + m["time/learn"] for m in steady)
        steps = steady[-1]["step"] - res["iters"][skip - 1]["step"] if steady else 0
        sps[label] = steps / secs if secs > 0 and steps > 0 else float("nan")
        rep.figure(f"{label}_steady_sps", sps[label])
        rep.figure(f"{label}_steady_iterations", len(steady))
        if label == "compiled" and not steady and res["stopped_by"] == "budget":
            rep.info(
                "compiled run",
                f"still compiling when its {share:.0f}s ran out ({res['iterations']} iterations)"
                ": no steady figure, not a defect",
            )
            return
        rep.check(
            res["clean_exit"] and len(steady) > 0,
            f"train.py runs {n:,} built-in envs on {args.device} with {flag}",
            f"{res['iterations']} iterations, {len(steady)} measured, exit {res['rc']}",
        )
    ratio = sps["compiled"] / sps["eager"] if sps["eager"] > 0 else float("nan")
    rep.figure("ratio", ratio)
    rep.goal(
        cuda(args) and not args.quick,
        ratio >= 1.3,
        "algo.compile=true at least 1.3x the eager env steps/s",
        f"{ratio:.2f}x ({sps['compiled']:,.0f} vs {sps['eager']:,.0f} env steps/s, {n:,} envs)",
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _steps_per_s(env, action, steps: int) -> float:
    _sync(env.device)
    t = time.perf_counter()
    for _ in range(steps):
        env.step(action)
    _sync(env.device)
    return env.num_envs * steps / max(time.perf_counter() - t, 1e-9)


def recorder_cost(args, rep: Report, tmp: Path, budget: float) -> None:
    """The built-in env on the device: (1) an idle recorder's cost per step against the bare env,
    in alternating blocks (drift hits both); (2) the throughput while a clip of a 4x4 grid of its
    envs (frames rendered on the device) is recorded, against the throughput between clips."""
    from rlrec.envs.autoreset import AutoReset
    from rlrec.envs.builtin import PointReach
    from rlrec.record import Recorder
    from rlrec.record.settings import RecorderConfig, Trigger

    n = 64 if args.quick else 4 * args.envs
    steps = 20 if args.quick else 200
    dev = torch.device(args.device)
    env = PointReach(n, device=dev, max_episode_steps=100, render_width=128, render_height=128)
    clips: list = []
    grid = list(range(16))
    rec = Recorder(
        env,
        RecorderConfig(trigger=Trigger.none, env_idx=grid, record_final_episode=False),
        str(tmp / "videos"),
        kind="eval",
        on_clip=clips.append,
    )
    stack = AutoReset(rec)
    stack.reset(seed=0)
    act = torch.rand(n, 2, device=dev) * 2 - 1
    _steps_per_s(env, act, 10)
    bare, idle = [], []
    for _ in range(3):
        bare.append(_steps_per_s(env, act, steps))
        idle.append(_steps_per_s(rec, act, steps))
    b, i = float(np.median(bare)), float(np.median(idle))
    cost = b / i - 1.0  # extra time per step, as a fraction of the bare step
    rep.figure("envs", n)
    rep.figure("bare_steps_per_s", b)
    rep.figure("idle_recorder_steps_per_s", i)
    rep.figure("idle_cost_fraction", cost)
    # a figure, not a goal: a 16k-env step on a GPU is about 100 us, 1% of it a Python call
    rep.info(
        "an idle recorder's cost per step",
        f"{cost * 100:+.2f}% ({b:,.0f} bare, {i:,.0f} with the idle recorder, env steps/s)",
    )
    between = _steps_per_s(stack, act, steps)
    rec.record_next_episode()
    for _ in range(200):
        if rec.recording:
            break
        stack.step(act)
    recorded = 0  # one timed block over the whole clip, synced once (as the blocks above)
    _sync(dev)
    t = time.perf_counter()
    while rec.recording and recorded < 200:
        stack.step(act)
        recorded += 1
    _sync(dev)
    sps_rec = n * recorded / max(time.perf_counter() - t, 1e-9) if recorded else float("nan")
    rec.flush()
    stack.close()
    rep.figure("steps_per_s_between_clips", between)
    rep.figure("steps_per_s_recording_grid", sps_rec)
    rep.figure("clip_frames", clips[0].num_frames if clips else 0)
    rep.check(
        bool(clips) and recorded > 0 and clips[0].num_frames >= 2,
        "a 4x4 grid clip (frames rendered on the env's device) was recorded whole",
        f"{len(clips)} clip(s), {recorded} steps recorded",
    )
    ratio = sps_rec / max(between, 1e-9)
    rep.figure("ratio_recording_grid", ratio)
    rep.goal(
        cuda(args) and not args.quick,
        ratio >= 0.5,
        "throughput while a 4x4 grid clip records is at least 0.5x of not recording",
        f"{ratio:.2f}x ({sps_rec:,.0f} vs {between:,.0f} env steps/s, {n:,} envs)",
    )


def frames_are_states(args, rep: Report, tmp: Path, budget: float) -> None:
    """tests/record/test_frames_are_states.py's cases, with the recorded env and the re-rendering
    env on the device: its own functions, three of them bound to the device and its decoder
    swapped for imageio-ffmpeg's reader."""
    import tests.record.test_frames_are_states as fs

    dev = torch.device(args.device)

    class DevicePointReach(fs.PointReach):
        def __init__(self, *a, **kw):
            kw.setdefault("device", dev)
            super().__init__(*a, **kw)

    def rerender(ref, snap, env_idx):
        for k, v in snap.state.items():
            getattr(ref, k).copy_(v)
        frames = ref.render(env_idx).cpu().numpy()
        return np.concatenate(list(frames), axis=1)

    def random_actions(env, gen):
        return (torch.rand(env.num_envs, 2, generator=gen) * 2 - 1).to(env.device)

    def decode_many(paths, size, workdir):
        # imageio-ffmpeg's own reader: the test's one-process decoder passes -fps_mode, which
        # the kit's ffmpeg 4.2 lacks (it came in 5.1)
        return [decode(p) for p in paths]

    names = ("PointReach", "rerender", "random_actions", "decode_many")
    saved = {n: getattr(fs, n) for n in names}
    for n, f in zip(names, (DevicePointReach, rerender, random_actions, decode_many)):
        setattr(fs, n, f)
    try:
        for case, kw in fs.CASES.items():
            case_dir = tmp / case.replace(" ", "_").replace(",", "")
            case_dir.mkdir()
            clips, log, spf = fs.run(case_dir, **kw)
            on_device = next(iter(log.steps[0].state.values())).device.type == dev.type
            bad = fs.mismatches(
                clips, log, kw["env_idx"], spf, kw.get("length"), case_dir, kw["num_envs"]
            )
            frames = sum(c.num_frames for c in clips)
            rep.check(
                on_device and len(clips) >= 8 and bad == [],
                f"every frame is the state it claims, env on {args.device}: {case}",
                f"{len(clips)} clips, {frames} frames, mismatches {bad[:5]}",
            )
    finally:
        for n, f in saved.items():
            setattr(fs, n, f)


def rank_worker(out_dir: Path, overrides: List[str]) -> None:
    """(a torchrun rank) a run of the built-in env; the flat parameters after every update are
    saved to ``out_dir/rank<r>.pt``."""
    from hydra import compose, initialize_config_dir

    import rlrec.run.cli
    from rlrec import distributed

    with initialize_config_dir(version_base="1.3", config_dir=rlrec.run.cli.CONFIG_DIR):
        cfg = compose("config", overrides=overrides)
    run_dir = out_dir / f"run{distributed.env_rank()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    # train.py's own build: validation, the rank's device, the process group, the runner
    runner = rlrec.run.cli._build(cfg, run_dir)
    rank = distributed.rank()
    ppo, after = runner.ppo, []
    update = ppo.update

    def recording_update(*a, **kw):
        losses = update(*a, **kw)
        flat = torch.cat([p.detach().reshape(-1) for p in ppo.agent.parameters()])
        after.append(flat.double().cpu())
        return losses

    ppo.update = recording_update
    runner.run()
    info = {"backend": torch.distributed.get_backend(), "device": str(ppo.device)}
    distributed.shutdown()
    torch.save({"after": after, "info": info}, out_dir / f"rank{rank}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_ranks(args, rep: Report, tmp: Path, budget: float) -> None:
    n = 64 if args.quick else 1024
    over = [f"sim.device={args.device}", f"env.num_envs={n}", "algo.num_steps=16"]
    over += ["algo.num_minibatches=2", "algo.update_epochs=2", f"total_steps={2 * 3 * n * 16}"]
    over += ["eval_env.enabled=false", "recorder=none", "logger=none", "logger.progress=false"]
    over += ["distributed.timeout_sec=60", "distributed.share_gpus=true"]
    backends = ["gloo", "nccl"] if cuda(args) else ["gloo"]
    if not cuda(args):
        rep.skip("two ranks on one GPU with NCCL", "--device cpu: NCCL needs CUDA")
    for backend in backends:
        out = tmp / backend
        out.mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        cmd += ["--master-port", str(_free_port()), str(Path(__file__).resolve())]
        cmd += ["--worker", "rank", "--out", str(out), "--", *over]
        cmd += [f"distributed.backend={backend}"]
        env = {**os.environ, "PYTHONPATH": _pythonpath(), "OMP_NUM_THREADS": "1"}
        rc, text, took = run_bounded(cmd, budget / len(backends), env=env)
        rep.figure(f"{backend}_s", took)
        files = [out / f"rank{r}.pt" for r in (0, 1)]
        if rc == 0 and all(f.is_file() for f in files):
            r0, r1 = (torch.load(f, weights_only=True) for f in files)
            same = len(r0["after"]) == len(r1["after"]) >= 2 and all(
                torch.equal(a, b) for a, b in zip(r0["after"], r1["after"])
            )
            trained = bool(r0["after"]) and not torch.equal(r0["after"][0], r0["after"][-1])
            rep.figure(f"{backend}_ranks", [r0["info"], r1["info"]])
            rep.check(
                same and trained,
                f"two ranks ({backend}, share_gpus) hold identical parameters after each update",
                f"{len(r0['after'])} and {len(r1['after'])} updates on {r0['info']['device']} "
                f"and {r1['info']['device']}, {took:.0f}s",
            )
        elif backend == "nccl" and "NCCL cannot" in text:
            rep.check(
                rc not in (0, 124) and took < 60,
                "NCCL with two ranks on one GPU is refused before any work (NCCL needs a GPU "
                "per rank; share_gpus runs on gloo)",
                f"exit {rc} after {took:.0f}s",
            )
        else:
            rep.check(False, f"two ranks ({backend}, share_gpus) run", f"exit {rc}, {took:.0f}s")
            print(tail(text, 5000), flush=True)


def memory_budget(args, rep: Report, tmp: Path, budget: float) -> None:
    """A size whose rollout storage alone (10^7 envs x 2,048 steps x 8 floats: 655 GB) fits no
    GPU: rlrec/run/budget.py refuses it before building anything, naming the device's free memory.
    On the CPU, CUDA is faked (one GPU, 40 GiB of 80 free): the refusal comes before any CUDA
    work."""
    n, steps = 10_000_000, 2048
    over = ["sim.device=cuda", f"env.num_envs={n}", f"algo.num_steps={steps}"]
    over += ["eval_env.enabled=false", "recorder=none", f"total_steps={n * steps * 2}"]
    launcher = None if cuda(args) else FAKE_CUDA
    if launcher:
        rep.info("CUDA faked", "--device cpu: one GPU, torch.cuda.mem_get_info 40 GiB of 80 free")
    run_dir = tmp / "run"
    limit = min(budget, REFUSED_BEFORE_WORK_S + 10)
    rc, out, took = run_bounded(train_cmd(over, run_dir, launcher), limit)
    rep.figure("s", took)
    said = [line for line in out.splitlines() if "needs at least" in line]
    rep.check(
        rc not in (0, 124)
        and took < REFUSED_BEFORE_WORK_S
        and bool(said)
        and all(w in said[0] for w in ("of GPU memory (cuda:0)", "free of", "env.num_envs"))
        and "Not counted: the simulator's" in said[0]
        and not (run_dir / "metrics.jsonl").exists(),
        "a run larger than the GPU's free memory is refused before any work, naming "
        "env.num_envs and what it does not count",
        f"exit {rc} after {took:.1f}s: {said[0][:300] if said else tail(out, 300)}",
    )


def maniskill_render(args, rep: Report, tmp: Path, budget: float) -> None:
    """ManiSkill's CPU sim (physx_cpu: no PhysX GPU library needed) with SAPIEN's renderer on
    the GPU, through examples/maniskill_own_loop.py (``RecordClips`` on the eval env)."""
    import physx_parts as pp

    render = "gpu" if cuda(args) else "cpu"
    if not cuda(args):
        rep.info("renderer", "--device cpu: SAPIEN's CPU renderer (lavapipe), not CUDA")
    n_eval, size = 2, 64
    out_dir = tmp / "out"
    cmd = pp.own_loop_command(out_dir, "cpu", n_eval, 1, size, render)
    rc, text, took = run_bounded(cmd, budget - 20)
    rep.figure("example_s", took)
    if rc != 0:
        lines = [x for x in text.strip().splitlines() if x.strip()][-3:]
        rep.check(
            False,
            f"SAPIEN's renderer runs on {args.device} under ManiSkill's CPU sim",
            f"it did not (exit {rc} after {took:.0f}s): {' | '.join(lines)[:500]}",
        )
        print(tail(text), flush=True)
        return
    rows = pp.own_loop_first_frames(out_dir / "eval", "cpu", size, n_eval, render)
    pp.check_own_loop_clips(rep, rows, n_eval, 0.0 if not cuda(args) else 0.5)


FUNCS: Dict[str, Callable] = {
    "physx_refusal": physx_refusal,
    "train_cuda": train_cuda,
    "compiled_update": compiled_update,
    "compile_speedup": compile_speedup,
    "recorder_cost": recorder_cost,
    "frames_are_states": frames_are_states,
    "two_ranks": two_ranks,
    "memory_budget": memory_budget,
    "maniskill_render": maniskill_render,
}

# --------------------------------------------------------------------------- main


def _finite(name: str, low: float, high: float):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}={text!r} is not a number") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(
                f"{name}={text} is invalid: a finite number in [{low:g}, {high:g}]"
            )
        return value

    return parse


def _positive_int(name: str, high: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}={text!r} is not an integer") from None
        if not 1 <= value <= high:
            raise argparse.ArgumentTypeError(f"{name}={text} is invalid: an integer in [1, {high}]")
        return value

    return parse


def parse_args(argv=None):
    names = [*PARTS, *PHYSX_NAMES]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--quick", action="store_true", help="small sizes (the CPU rehearsal)")
    p.add_argument("--call", type=int, choices=[1, 2], help="the parts of device call 1 or 2")
    p.add_argument("--parts", nargs="+", choices=names, help="default: both calls' parts")
    p.add_argument("--skip", nargs="*", choices=names, default=[])
    p.add_argument("--out", help="where gpu_check.log and gpu_check.json go (default: $OUT)")
    p.add_argument(
        "--budget",
        type=_finite("--budget", 10, 3600),
        help="seconds for the whole run (default: the call's, or the parts' sum)",
    )
    p.add_argument("--envs", type=_positive_int("--envs", 1 << 20), default=4096)
    # the physx_* parts' sizes (physx_parts.py)
    p.add_argument("--size", type=_positive_int("--size", 2048), default=128, help="render size")
    p.add_argument("--eval-envs", type=_positive_int("--eval-envs", 4096), default=16)
    p.add_argument("--train-envs", type=_positive_int("--train-envs", 65536), default=128)
    p.add_argument(
        "--throughput-envs", type=_positive_int("--throughput-envs", 65536), default=4096
    )
    p.add_argument(
        "--gpu-tol",
        type=_finite("--gpu-tol", 0, 255),
        default=0.5,
        help="mean abs pixel diff counted as the same frame on a GPU renderer",
    )
    p.add_argument("--worker", choices=["compiled_update", "rank"], help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.parts is None:
        args.parts = CALL_PARTS[args.call] if args.call else [*CALL_PARTS[1], *CALL_PARTS[2]]
    elif args.call:
        p.error("--call and --parts: give one")
    args.sim = "gpu" if cuda(args) else "cpu"  # the physx_* parts' name for it
    if args.quick:
        args.eval_envs, args.train_envs, args.size, args.throughput_envs = 2, 2, 64, 2
    return args


def budgets(args) -> Dict[str, Part]:
    parts = dict(PARTS)
    if any(n in PHYSX_NAMES for n in args.parts):
        parts.update(physx_parts())
    return parts


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker == "compiled_update":
        compiled_update_worker(args.device, Path(args.out))
        return 0
    if args.worker == "rank":
        rank_worker(Path(args.out), args.overrides)
        return 0
    out_dir = args.out or os.environ.get("OUT")
    out = Path(out_dir).resolve() if out_dir else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        log = open(out / "gpu_check.log", "a", buffering=1)
        sys.stdout, sys.stderr = Tee(sys.stdout, log), Tee(sys.stderr, log)
    table = budgets(args)
    parts = [n for n in args.parts if n not in args.skip]
    limit = {n: (table[n].quick_budget if args.quick else table[n].budget) for n in parts}
    if args.budget is None:
        args.budget = (
            CALL_BUDGET[args.call]
            if args.call and not args.quick
            else sum(limit.values()) + CUT_GRACE_S * len(parts)
        )
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA"
    meta = {
        "device": args.device,
        "quick": args.quick,
        "torch": torch.__version__,
        "gpu": dev,
        "argv": sys.argv[1:],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    rep = Report(None if out is None else out / "gpu_check.json", meta)
    print(
        f"gpu_check: --device {args.device}{' --quick' if args.quick else ''}, torch "
        f"{torch.__version__}, {dev}; parts {' '.join(parts)}; budget {args.budget:.0f}s",
        flush=True,
    )
    if cuda(args) and not torch.cuda.is_available():
        rep.check(False, "CUDA available", "torch.cuda.is_available() is False: --device cpu?")
        rep.save()
        return 1
    t = time.perf_counter()
    rep.start("preflight")
    missing = preflight(args, rep, parts, table)
    rep.end("preflight", "done", time.perf_counter() - t)
    start = time.perf_counter()  # --budget counts the parts' time
    funcs = dict(FUNCS)
    if any(n in PHYSX_NAMES for n in parts):
        import physx_parts as pp

        funcs.update({n: pp.PARTS[n][0] for n in pp.PARTS})
    bank = 0.0  # seconds earlier parts left unused: a later part may take them
    alarm = signal.signal(signal.SIGALRM, _cut)
    with tempfile.TemporaryDirectory(prefix="rlrec_gpu_check_") as tmp:
        args.tmp = tmp
        for name in parts:
            left = args.budget - (time.perf_counter() - start)
            need = min(table[name].min_start, limit[name])
            if left < need:
                print(f"SKIP {name}: {left:.0f}s left of the {args.budget:.0f}s budget", flush=True)
                rep.start(name)
                rep.end(name, "skipped", 0.0, f"{left:.0f}s left, needs {need:.0f}s")
                continue
            lacking = [n for n in table[name].needs if n in missing]
            if lacking:
                rep.start(name)
                rep.skip(name, f"needs {', '.join(lacking)}, which this machine lacks (preflight)")
                rep.end(name, "skipped", 0.0)
                continue
            budget = min(limit[name] + bank, left - CUT_GRACE_S)
            print(
                f"== {name} (at {time.perf_counter() - start:.0f}s, budget {budget:.0f}s): "
                f"{table[name].what}",
                flush=True,
            )
            rep.start(name)
            t = time.perf_counter()
            try:
                part_tmp = Path(tmp) / name
                part_tmp.mkdir()
                signal.setitimer(signal.ITIMER_REAL, budget + CUT_GRACE_S)
                funcs[name](args, rep, part_tmp, budget)
                rep.end(name, "done", time.perf_counter() - t)
            except Cut:  # its time is up: the next part keeps its own
                took = time.perf_counter() - t
                rep.check(False, f"{name} ends within its {budget:.0f}s", f"cut after {took:.0f}s")
                rep.end(name, "cut", took, f"cut after {took:.0f}s")
            except Exception as e:  # one broken part must not hide the others' figures
                import traceback

                traceback.print_exc(file=sys.stdout)
                rep.check(False, name, f"{type(e).__name__}: {e}")
                rep.end(name, "error", time.perf_counter() - t, f"{type(e).__name__}: {e}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            took = time.perf_counter() - t
            bank = max(0.0, budget - took)
            over = " (OVER its budget)" if took > limit[name] else ""
            print(f"   {name}: {took:.1f}s of {limit[name]:.0f}s{over}", flush=True)
    signal.signal(signal.SIGALRM, alarm)
    results = rep.results()
    ok = bool(results) and all(results)
    total = time.perf_counter() - start
    rep.data["total_s"] = round(total, 1)
    rep.save()
    skipped = sum(1 for p in rep.data["parts"].values() for c in p["checks"] if c.get("skipped"))
    print(
        f"{'PASS' if ok else 'FAIL'} gpu_check: {sum(results)}/{len(results)} checks passed, "
        f"{skipped} skipped on this machine, in {total:.0f}s",
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
