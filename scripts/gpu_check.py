#!/usr/bin/env python
"""ManiSkill3 on an NVIDIA GPU: the checks that cannot run on a CPU-only machine, in one script.

    python scripts/gpu_check.py --out DIR                  # CUDA machine, all parts
    python scripts/gpu_check.py --parts pushcube compile   # some parts (each one bounded)
    python scripts/gpu_check.py --sim cpu --quick          # every part, small, on the CPU sim
                                                           # (the script's own test, minutes)

On the device machine it runs through the device kit (scripts/device_kit.py prints the calls),
with ``--out $OUT``. The parts, each with its own time budget (``--budget`` caps the whole run;
a part that cannot start with its minimum left is skipped, and says so):

- ``smoke``: versions, the GPU, a ManiSkill env built and rendered on the sim.
- ``regression``: the seed scenario, an eval env (16 envs) and a collection env (128 envs):
  three evaluations, each after a full seeded reset, with collection in between; every eval clip
  (lossless) must start on the frame of a fresh env reset with the same seed, not on the previous
  episode's last frame nor on the pre-reset state, and end on the true terminal state (frames kept
  by a spy below the recorder). The collection recorder must follow the cubic schedule.
- ``contract``: the env-contract test suite (partial resets included) on the sim, through pytest.
- ``maniskill_own_loop``: examples/maniskill_own_loop.py, a user's own loop with
  ``ManiSkillVectorEnv(RecordClips(gym.make(...)))`` as its eval env: three evaluations, each
  after a full seeded reset; frame 0 of every eval clip (lossless) must equal the render of a
  second env reset with the seed in the clip's sidecar, and never the previous clip's last frame.
- ``throughput``: steps/s of the raw batched ManiSkill env against rlrec's adapter on it
  (PickCube-v1, 4,096 envs); goal: the adapter at least 0.95x of raw.
- ``recorder``: the recorder's idle cost per step (goal: under 1% of a step), and the training
  throughput while an eval clip of a 4x4 grid of envs is recorded and encoded (goal: at least
  0.5x of the throughput between clips).
- ``pushcube``: PPO on PushCube-v1 (state) through ``python train.py +experiment=
  maniskill_pushcube_gpu`` (ManiSkill's baseline settings): eval success >= 0.9 and the wall time
  to it (ManiSkill's ppo.py README: under a minute on a GPU).
- ``compile``: SPS of ``algo.compile=true`` against eager on PushCube (goal: at least 1.3x).
- ``pickcube``: PPO on PickCube-v1 with ManiSkill's ppo_fast settings (4,096 envs, 4-step
  rollouts): eval success >= 0.9 and the wall time (ppo_fast's PR reports about 1.3 minutes).

With ``--sim cpu --quick`` the learning and speed goals are reported, not checked (a CPU sim
cannot reach them); every other check holds. ``--out`` (default ``$OUT`` when set) receives
``gpu_check.log`` (this output) and ``gpu_check.json`` (every check and figure, rewritten after
each part, so a run cut short keeps what it measured). Exits 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from rlrec.config import ManiSkillEnvConfig, RecorderConfig, SimConfig, Trigger  # noqa: E402
from rlrec.envs.autoreset import AutoReset  # noqa: E402
from rlrec.envs.factory import make_adapter  # noqa: E402
from rlrec.record.recorder import Recorder  # noqa: E402
from rlrec.testing import FrameSpy  # noqa: E402

EVAL_LIMIT = 10  # steps per eval episode in the regression
TRAIN_LIMIT = 2  # collection episodes, short so env 0 reaches episode 8 of the cubic schedule fast
EVAL_SEED = 1000
PARTS = [
    "smoke",
    "regression",
    "contract",
    "maniskill_own_loop",
    "throughput",
    "recorder",
    "pushcube",
    "compile",
    "pickcube",
]
# seconds: what each part may take on the GPU, and the least it needs to start. They sum to
# under the device kit's --budget (scripts/device_kit.py: 15 minutes of device time in all).
BUDGET = {
    "smoke": 25,
    "regression": 55,
    "contract": 55,
    "maniskill_own_loop": 60,
    "throughput": 35,
    "recorder": 35,
    "pushcube": 80,
    "compile": 80,
    "pickcube": 100,
}
MIN_START = {
    "smoke": 10,
    "regression": 40,
    "contract": 45,
    "maniskill_own_loop": 40,
    "throughput": 30,
    "recorder": 30,
    "pushcube": 60,
    "compile": 60,
    "pickcube": 60,
}
PUSHCUBE = [  # ManiSkill's ppo.py baseline for state PushCube-v1 (the preset holds it)
    "+experiment=maniskill_pushcube_gpu",
]
PICKCUBE = [  # ManiSkill's ppo_fast.py settings for state PickCube-v1
    "env=maniskill",
    "env.id=PickCube-v1",
    "env.num_envs=4096",
    "env.obs_mode=state",
    "env.control_mode=pd_joint_delta_pos",
    "env.reward_mode=normalized_dense",
    "env.max_episode_steps=50",
    "algo.num_steps=4",
    "algo.update_epochs=8",
    "algo.num_minibatches=32",
    "algo.learning_rate=3e-4",
    "algo.anneal_lr=false",
    "algo.gamma=0.8",
    "algo.gae_lambda=0.9",
    "algo.target_kl=0.1",
    "algo.norm_obs=false",
    "algo.hidden_sizes=[256,256,256]",
    "algo.init_log_std=0.0",
    "eval_env.num_envs=16",
    "eval_env.every=10",
    "total_steps=50000000",
]
QUICK_PPO = [  # the CPU sim: the same code path, sizes that run in seconds
    "env.num_envs=4",
    "algo.num_steps=16",
    "algo.num_minibatches=4",
    "algo.update_epochs=2",
    "algo.hidden_sizes=[64,64]",
    "eval_env.num_envs=2",
    "eval_env.every=2",
    "env.render_width=64",
    "env.render_height=64",
]


def merge(*lists: List[str]) -> List[str]:
    """Hydra overrides, a later value of a key replacing an earlier one (Hydra refuses two)."""
    out: Dict[str, str] = {}
    for lst in lists:
        for o in lst:
            out[o.split("=", 1)[0]] = o
    return list(out.values())


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


class Report:
    """Checks and figures by part, saved as JSON after each part (atomically)."""

    def __init__(self, path: Optional[Path], meta: Dict[str, Any]):
        self.path = path
        self.data: Dict[str, Any] = {**meta, "parts": {}, "ok": False}
        self.part = "setup"

    def start(self, part: str) -> None:
        self.part = part
        self.data["parts"][part] = {"status": "running", "checks": [], "figures": {}}

    def check(self, ok: bool, name: str, detail: str = "") -> bool:
        ok = bool(ok)
        self._entry()["checks"].append({"name": name, "ok": ok, "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""), flush=True)
        return ok

    def info(self, name: str, detail: str) -> None:
        """A goal reported, not checked (``--quick`` on the CPU sim)."""
        self._entry()["checks"].append({"name": name, "ok": None, "detail": detail})
        print(f"INFO {name}: {detail}", flush=True)

    def goal(self, enforce: bool, ok: bool, name: str, detail: str) -> None:
        if enforce:
            self.check(ok, name, detail)
        else:
            self.info(name, f"{detail} (goal not checked on this sim)")

    def figure(self, key: str, value: Any) -> None:
        if isinstance(value, float):
            value = round(value, 4) if math.isfinite(value) else str(value)
        self._entry()["figures"][key] = value

    def end(self, part: str, status: str, seconds: float, error: str = "") -> None:
        entry = self.data["parts"].setdefault(part, {"checks": [], "figures": {}})
        entry.update(status=status, s=round(seconds, 1))
        if error:
            entry["error"] = error
        self.save()

    def _entry(self) -> dict:
        return self.data["parts"].setdefault(
            self.part, {"status": "running", "checks": [], "figures": {}}
        )

    def results(self) -> List[bool]:
        return [
            c["ok"] for p in self.data["parts"].values() for c in p["checks"] if c["ok"] is not None
        ]

    def save(self) -> None:
        self.data["ok"] = bool(self.results()) and all(self.results())
        if self.path is None:
            return
        tmp = self.path.with_suffix(".json.partial")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(tmp, self.path)


# --------------------------------------------------------------------------- helpers


def diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float32) - b.astype(np.float32)).mean())


def decode(path: str) -> np.ndarray:
    from rlrec.testing import decode as decode_mp4

    return decode_mp4(path)[0]


def random_actions(env, gen: torch.Generator) -> torch.Tensor:
    shape = (env.num_envs, *env.single_action_space.shape)
    return (torch.rand(shape, generator=gen) * 2 - 1).to(env.device)


def sim_cfg(sim: str) -> SimConfig:
    return SimConfig(name=sim, device="cuda" if sim == "gpu" else "cpu")


def sync(sim: str) -> None:
    if sim == "gpu":
        torch.cuda.synchronize()


def ms_cfg(size: int, limit: Optional[int], env_id: str = "PushCube-v1") -> ManiSkillEnvConfig:
    return ManiSkillEnvConfig(
        id=env_id, render_width=size, render_height=size, max_episode_steps=limit
    )


def recording_stack(sim, num_envs, limit, seed, trigger, size, video_dir, keep):
    spy = FrameSpy(
        make_adapter(ms_cfg(size, limit), sim_cfg(sim), num_envs, seed), keep_frames=keep
    )
    clips: list = []
    rec = Recorder(
        spy,
        RecorderConfig(trigger=trigger, env_idx=[0], lossless=True, record_final_episode=False),
        video_dir,
        kind="eval" if trigger is Trigger.eval else "train",
        on_clip=clips.append,
    )
    return AutoReset(rec), rec, spy, clips


def steps_per_s(env, action, steps: int, sim: str, step: Optional[Callable] = None) -> float:
    """Env steps (``num_envs`` per call) per second of ``steps`` calls, the device synced."""
    step = step or env.step
    sync(sim)
    t = time.perf_counter()
    for _ in range(steps):
        step(action)
    sync(sim)
    return env.num_envs * steps / max(time.perf_counter() - t, 1e-9)


# --------------------------------------------------------------------------- smoke


def smoke(args, rep: Report, tmp: Path) -> None:
    import mani_skill
    import sapien

    rep.figure("torch", torch.__version__)
    rep.figure("mani_skill", mani_skill.__version__)
    rep.figure("sapien", sapien.__version__)
    if torch.cuda.is_available():
        rep.figure("gpu", torch.cuda.get_device_name(0))
        rep.figure("gpu_memory_gib", torch.cuda.get_device_properties(0).total_memory / 2**30)
    rep.figure("vk_icd", os.environ.get("VK_ICD_FILENAMES") or os.environ.get("VK_DRIVER_FILES"))
    t = time.perf_counter()
    env = make_adapter(ms_cfg(args.size, 8), sim_cfg(args.sim), 2, 0)
    built = time.perf_counter() - t
    env.reset(seed=0)
    env.step(random_actions(env, torch.Generator().manual_seed(0)))
    frame = env.render([0, 1])
    env.close()
    rep.figure("build_s", built)
    rep.check(
        tuple(frame.shape) == (2, args.size, args.size, 3) and int(frame.max()) > 0,
        f"PushCube-v1 builds, steps and renders on sim={args.sim}",
        f"built in {built:.1f}s, frames {tuple(frame.shape)}",
    )


# --------------------------------------------------------------------------- regression


def regression(args, rep: Report, tmp: Path) -> None:
    tol = 0.0 if args.sim == "cpu" else args.gpu_tol  # lavapipe is bit-exact; GPU: mean abs diff
    t0 = time.perf_counter()
    eval_env, eval_rec, eval_spy, eval_clips = recording_stack(
        args.sim, args.eval_envs, EVAL_LIMIT, 7, Trigger.eval, args.size, str(tmp / "eval"), True
    )
    train_env, train_rec, train_spy, train_clips = recording_stack(
        args.sim,
        args.train_envs,
        TRAIN_LIMIT,
        3,
        Trigger.cubic,
        args.size,
        str(tmp / "train"),
        False,
    )
    rep.figure("build_s", time.perf_counter() - t0)
    print(
        f"  built eval ({args.eval_envs} envs) and collection ({args.train_envs} envs) stacks in "
        f"{time.perf_counter() - t0:.1f}s",
        flush=True,
    )
    gen = torch.Generator().manual_seed(0)
    stale = []
    train_env.reset(seed=3)
    for _ in range(3):
        for _ in range(7):
            train_env.step(random_actions(train_env, gen))
        stale.append(eval_env.unwrapped.render([0])[0].numpy().copy())
        eval_env.reset(seed=EVAL_SEED)
        finished = torch.zeros(args.eval_envs, dtype=torch.bool, device=eval_env.device)
        for _ in range(3 * EVAL_LIMIT):
            _, _, term, trunc, _ = eval_env.step(random_actions(eval_env, gen))
            finished |= term | trunc
            if bool(finished.all()):
                break
        for _ in range(2):  # env 0 runs on into its autoreset episode
            eval_env.step(random_actions(eval_env, gen))
        eval_rec.flush()
    for _ in range(7 * TRAIN_LIMIT):
        train_env.step(random_actions(train_env, gen))
    train_rec.flush()
    fresh = make_adapter(ms_cfg(args.size, EVAL_LIMIT), sim_cfg(args.sim), args.eval_envs, 12345)
    fresh.reset(seed=EVAL_SEED)
    reference = fresh.render([0])[0].numpy().copy()
    fresh.close()

    rep.check(len(eval_clips) == 3, "one eval clip per evaluation", f"{len(eval_clips)} clips")
    firsts, prevs, stales, lasts, after = [], [], [], [], []
    previous_last = None
    terminal_ok = length_ok = True
    for k, clip in enumerate(eval_clips):
        frames = decode(clip.path)
        length_ok &= clip.num_frames == len(frames) == EVAL_LIMIT + 1
        firsts.append(diff(frames[0], reference))
        if k:
            prevs.append(diff(frames[0], previous_last))
            stales.append(diff(frames[0], stale[k]))
        previous_last = frames[-1]
        ended, nxt = eval_spy.episodes[2 * k], eval_spy.episodes[2 * k + 1]
        if len(ended) == EVAL_LIMIT + 1:
            terminal_ok &= all(diff(a, b) <= tol for a, b in zip(frames, ended))
            lasts.append(diff(frames[-1], ended[-1]))
            after.append(diff(frames[-1], nxt[0]))
    rep.figure("first_frame_diff", firsts)
    rep.check(
        all(d <= tol for d in firsts),
        "every eval clip starts on the fresh seeded reset state",
        f"mean abs diff to a fresh env's reset frame {[round(d, 3) for d in firsts]} (tol {tol})",
    )
    rep.check(
        bool(prevs) and all(d > max(tol, 1.0) for d in prevs + stales),
        "no eval clip starts on the previous episode's last frame or the pre-reset state",
        f"diff to previous last frame {[round(d, 2) for d in prevs]}, to pre-reset frame "
        f"{[round(d, 2) for d in stales]}",
    )
    rep.check(
        terminal_ok and length_ok and len(lasts) == 3 and all(d > max(tol, 1.0) for d in after),
        "eval clips are the whole episode and end on the terminal state (before autoreset)",
        f"terminal frame diff {[round(d, 3) for d in lasts]}, to the autoreset frame "
        f"{[round(d, 2) for d in after]}",
    )
    rep.check(
        [c.episode for c in train_clips] == [0, 1, 8] and train_rec.episode >= 9,
        "cubic schedule on the collection env",
        f"clips of episodes {[c.episode for c in train_clips]}",
    )
    rep.check(
        all(r == [0] for r in eval_spy.render_requests + train_spy.render_requests)
        and len(train_spy.render_requests) == sum(c.num_frames for c in train_clips),
        "recorder renders only the recorded env, only while recording",
        f"{len(train_spy.render_requests)} collection renders for "
        f"{sum(c.num_frames for c in train_clips)} frames",
    )

    # owned copies: a kept frame survives later steps and renders
    a = eval_env.unwrapped.render([0, 1])
    kept = a.clone()
    eval_env.step(random_actions(eval_env, gen))
    b = eval_env.unwrapped.render([0, 1])
    rep.check(
        torch.equal(a, kept) and a.data_ptr() != b.data_ptr() and diff(a.numpy(), b.numpy()) > 0,
        "render returns an owned copy of the current state",
    )

    # costs of the collection env
    adapter = train_env.unwrapped
    act = random_actions(adapter, gen)
    steps_per_s(adapter, act, 5, args.sim)
    sps = steps_per_s(adapter, act, 20 if args.quick else 50, args.sim)
    ev = eval_env.unwrapped
    t = time.perf_counter()
    for _ in range(5 if args.quick else 20):
        ev.render([0])
    r1 = (time.perf_counter() - t) / (5 if args.quick else 20)
    t = time.perf_counter()
    for _ in range(3):
        ev.render(list(range(ev.num_envs)))
    rall = (time.perf_counter() - t) / 3
    rep.figure("collection_env_steps_per_s", sps)
    rep.figure("render_env0_ms", r1 * 1e3)
    rep.figure("render_all_eval_envs_ms", rall * 1e3)
    print(
        f"  cost: {sps:,.0f} env steps/s for {adapter.num_envs} envs; render {args.size}x"
        f"{args.size}: env 0 {r1 * 1e3:.1f} ms, all {ev.num_envs} envs {rall * 1e3:.1f} ms",
        flush=True,
    )
    eval_env.close()
    train_env.close()


# --------------------------------------------------------------------------- contract


def contract(args, rep: Report, tmp: Path, budget: float) -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    cmd += [str(REPO / "tests" / "envs" / "test_maniskill.py")]
    cmd += ["-k", "GPUContract" if args.sim == "gpu" else "CPUContract"]
    t = time.perf_counter()
    try:
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=budget)
        rc, text = out.returncode, out.stdout + out.stderr
    except subprocess.TimeoutExpired as e:
        rc, text = 124, f"timed out after {budget:.0f}s\n{(e.stdout or b'')[-2000:]!r}"
    lines = text.strip().splitlines()
    last = lines[-1] if lines else ""
    summary = next((x for x in reversed(lines) if " passed" in x or " failed" in x), last)
    rep.figure("pytest_s", time.perf_counter() - t)
    rep.check(
        rc == 0 and "passed" in str(summary) and "skipped" not in str(summary),
        f"env contract suite (partial resets included) on sim={args.sim}",
        f"{str(summary).strip()} ({time.perf_counter() - t:.0f}s)",
    )
    if rc != 0:
        print(text[-4000:], flush=True)


# --------------------------------------------------------------------------- maniskill_own_loop

OWN_LOOP_STEPS = 10  # steps per eval episode of the example


def own_loop_command(out_dir: Path, sim: str, eval_envs: int, train_envs: int, size: int):
    """examples/maniskill_own_loop.py, small: three evaluations, lossless clips."""
    return [
        sys.executable,
        str(REPO / "examples" / "maniskill_own_loop.py"),
        "--sim",
        sim,
        "--num-envs",
        str(train_envs),
        "--num-eval-envs",
        str(eval_envs),
        "--evaluations",
        "3",
        "--steps",
        "4",
        "--episode-steps",
        str(OWN_LOOP_STEPS),
        "--render-size",
        str(size),
        "--output-dir",
        str(out_dir),
        "--lossless",
    ]


def own_loop_clips(eval_dir: Path) -> Dict[str, List[dict]]:
    """Each clip's sidecar (plus ``path``), by directory (one recorder each), in step order."""
    by_dir: Dict[str, List[dict]] = {}
    for side in sorted(eval_dir.rglob("*.json")):
        mp4 = side.with_suffix(".mp4")
        if mp4.is_file():
            meta = json.loads(side.read_text())
            by_dir.setdefault(str(side.parent), []).append({**meta, "path": str(mp4)})
    for clips in by_dir.values():
        clips.sort(key=lambda m: m["first_step"])
    return by_dir


def own_loop_first_frames(eval_dir: Path, sim: str, size: int, batch: int) -> List[dict]:
    """For every eval clip: frame 0 against a second env's render right after a reset with the
    sidecar's seed (a batch of ``batch`` envs on the GPU sim: the eval env's own shape), and
    against the previous clip's last frame of the same recorder."""
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401

    from rlrec.envs.maniskill import render_rows

    kw = dict(
        num_envs=batch if sim == "gpu" else 1,
        obs_mode="state",
        control_mode="pd_joint_delta_pos",
        render_mode="rgb_array",
        sim_backend="physx_cuda" if sim == "gpu" else "physx_cpu",
        human_render_camera_configs=dict(width=size, height=size),
        max_episode_steps=OWN_LOOP_STEPS,
    )
    if sim == "cpu":
        kw["render_backend"] = "cpu"
    ref = gym.make("PushCube-v1", **kw)
    rows = []
    try:
        for clips in own_loop_clips(eval_dir).values():
            previous_last = None
            for meta in clips:
                frames = decode(meta["path"])
                first = int(meta["env_idx"][0])
                ref.reset(seed=meta["seed"])
                reference = render_rows(ref.unwrapped, [first])[0].numpy()
                rows.append(
                    {
                        "path": meta["path"],
                        "seed": meta["seed"],
                        "frames": len(frames),
                        "to_reset": diff(frames[0], reference),
                        "to_previous_last": None
                        if previous_last is None
                        else diff(frames[0], previous_last),
                    }
                )
                previous_last = frames[-1]
    finally:
        ref.close()
    return rows


def maniskill_own_loop(args, rep: Report, tmp: Path, budget: float) -> None:
    if args.sim == "gpu" and not torch.cuda.is_available():
        rep.info("maniskill_own_loop", "skipped: no CUDA")
        return
    tol = 0.0 if args.sim == "cpu" else args.gpu_tol
    n_eval = 2 if args.quick else 8
    cmd = own_loop_command(tmp / "out", args.sim, n_eval, 1 if args.quick else 64, args.size)
    t = time.perf_counter()
    try:
        # the rest of the budget: the reference env and the frame comparisons
        limit = budget - 15
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=limit)
        rc, text = out.returncode, out.stdout + out.stderr
    except subprocess.TimeoutExpired:
        rc, text = 124, f"timed out after {limit:.0f}s"
    rep.figure("example_s", time.perf_counter() - t)
    if not rep.check(rc == 0, "examples/maniskill_own_loop.py runs", f"exit status {rc}"):
        print(text[-4000:], flush=True)
        return
    rows = own_loop_first_frames(tmp / "out" / "eval", args.sim, args.size, n_eval)
    recorders = 1 if args.sim == "gpu" else n_eval
    rep.figure("first_frame_diff", [r["to_reset"] for r in rows])
    rep.check(
        len(rows) == 3 * recorders and all(r["frames"] == OWN_LOOP_STEPS + 1 for r in rows),
        "one whole-episode clip per evaluation and recorded env",
        f"{len(rows)} clips of {[r['frames'] for r in rows]} frames",
    )
    rep.check(
        bool(rows) and all(r["seed"] is not None and r["to_reset"] <= tol for r in rows),
        "frame 0 of every eval clip is the render of a fresh env reset with its seed",
        f"mean abs diff {[round(r['to_reset'], 3) for r in rows]} (tol {tol})",
    )
    prev = [r["to_previous_last"] for r in rows if r["to_previous_last"] is not None]
    rep.check(
        len(prev) == 2 * recorders and all(d > max(tol, 1.0) for d in prev),
        "no eval clip starts on the previous clip's last frame",
        f"diff to the previous last frame {[round(d, 2) for d in prev]}",
    )


# --------------------------------------------------------------------------- throughput


def throughput(args, rep: Report, tmp: Path) -> None:
    """The raw ManiSkill env and rlrec's adapter on it, stepped in alternating blocks (so drift
    hits both), with the same actions; the median block of each."""
    n = args.throughput_envs
    t0 = time.perf_counter()
    # no time limit inside the measurement: the raw env has none either
    adapter = make_adapter(ms_cfg(args.size, 10**9, "PickCube-v1"), sim_cfg(args.sim), n, 0)
    rep.figure("build_s", time.perf_counter() - t0)
    gen = torch.Generator().manual_seed(1)
    act = random_actions(adapter, gen)
    if args.sim == "gpu":
        raw = adapter.env

        def raw_step(a):
            return raw.step(a)

    else:
        raw = adapter.vec
        act_np = act.numpy().astype(adapter.single_action_space.dtype)

        def raw_step(a):
            return raw.step(act_np)

    steps = 10 if args.quick else 50
    steps_per_s(adapter, act, 5, args.sim, raw_step)  # warm-up
    steps_per_s(adapter, act, 5, args.sim)
    raws, ours = [], []
    for _ in range(3):
        raws.append(steps_per_s(adapter, act, steps, args.sim, raw_step))
        ours.append(steps_per_s(adapter, act, steps, args.sim))
    adapter.close()
    r, o = float(np.median(raws)), float(np.median(ours))
    rep.figure("envs", n)
    rep.figure("raw_steps_per_s", r)
    rep.figure("adapter_steps_per_s", o)
    rep.figure("ratio", o / r)
    print(f"  PickCube-v1, {n} envs: raw {r:,.0f} env steps/s, rlrec adapter {o:,.0f}", flush=True)
    rep.goal(
        not args.quick,
        o >= 0.95 * r,
        "rlrec's adapter steps at least 0.95x of the raw batched env",
        f"ratio {o / r:.3f}",
    )


# --------------------------------------------------------------------------- recorder


def _harmonic(n: int, rates: List[float]) -> Optional[float]:
    """Steps/s over several one-call timings: total steps over total time."""
    return n * len(rates) / sum(n / r for r in rates) if rates else None


def recorder(args, rep: Report, tmp: Path) -> None:
    """On a collection stack of ``--recorder-train-envs`` envs: (1) the idle recorder's cost per
    step against the bare adapter; (2) the throughput while a clip of a 4x4 grid of its envs is
    recorded, against the throughput between clips. On an eval stack of 16 envs: (3) an eval clip
    of all 16 as a 4x4 grid, and the training throughput while that clip is still encoding
    (evaluation blocks training; its clip's encoding does not)."""
    gen = torch.Generator().manual_seed(2)
    n, grid = args.recorder_train_envs, list(range(args.grid))
    side = int(math.ceil(math.sqrt(args.grid)))
    steps = 10 if args.quick else 50
    train = make_adapter(ms_cfg(args.size, 50), sim_cfg(args.sim), n, 0)
    train_clips: list = []
    rec = Recorder(
        train,
        RecorderConfig(trigger=Trigger.none, env_idx=grid, record_final_episode=False),
        str(tmp / "train"),
        kind="train",
        on_clip=train_clips.append,
    )
    train_env = AutoReset(rec)
    train_env.reset(seed=0)
    act = random_actions(train, gen)
    steps_per_s(train, act, 5, args.sim)
    bare, idle = [], []
    for _ in range(3):  # alternating blocks: drift hits both
        bare.append(steps_per_s(train, act, steps, args.sim))
        idle.append(steps_per_s(rec, act, steps, args.sim))
    b, i = float(np.median(bare)), float(np.median(idle))
    cost = b / i - 1.0  # extra time per step, as a fraction of the bare step
    rep.figure("train_envs", n)
    rep.figure("bare_steps_per_s", b)
    rep.figure("idle_recorder_steps_per_s", i)
    rep.figure("idle_cost_fraction", cost)
    rep.goal(
        not args.quick,
        cost < 0.01,
        "an idle recorder costs under 1% of a step",
        f"{cost * 100:+.2f}% ({b:,.0f} bare, {i:,.0f} with the idle recorder, env steps/s)",
    )

    # (2) a clip of a grid of the collection envs: it starts at env 0's next reset
    between = steps_per_s(train_env, act, steps, args.sim)
    rec.record_next_episode()
    for _ in range(200):
        if rec.recording:
            break
        train_env.step(act)
    during = []
    while rec.recording and len(during) < 200:
        during.append(steps_per_s(train_env, act, 1, args.sim))
    rec.flush()
    sps_rec = _harmonic(n, during)
    rep.figure("grid", f"{side}x{side} of {args.size}x{args.size}")
    rep.figure("train_steps_per_s_between_clips", between)
    rep.figure("train_steps_per_s_recording_grid", sps_rec)
    rep.figure("train_clip_frames", train_clips[0].num_frames if train_clips else 0)
    rep.check(
        bool(train_clips) and bool(during),
        f"a {side}x{side} grid clip of the collection env was recorded",
        f"{len(train_clips)} clip(s), {len(during)} steps recorded",
    )
    if sps_rec is not None:
        ratio = sps_rec / max(between, 1e-9)
        rep.figure("ratio_recording_grid", ratio)
        rep.goal(
            not args.quick,
            ratio >= 0.5,
            f"throughput while a {side}x{side} grid clip records is at least 0.5x between clips",
            f"{ratio:.2f}x ({sps_rec:,.0f} vs {between:,.0f} env steps/s, {n} envs)",
        )

    # (3) an eval clip of a 16-env eval stack as a grid; training goes on while it encodes
    clips: list = []
    eval_adapter = make_adapter(ms_cfg(args.size, 50), sim_cfg(args.sim), args.grid, 1)
    eval_rec = Recorder(
        eval_adapter,
        RecorderConfig(trigger=Trigger.eval, env_idx=grid, record_final_episode=False),
        str(tmp / "grid"),
        kind="eval",
        on_clip=clips.append,
    )
    eval_env = AutoReset(eval_rec)
    eact = random_actions(eval_adapter, gen)
    between = steps_per_s(train_env, act, steps, args.sim)
    t = time.perf_counter()
    eval_env.reset(seed=EVAL_SEED)
    eval_steps = 0
    while eval_rec.recording and eval_steps < 200:
        eval_env.step(eact)
        eval_steps += 1
    eval_s = time.perf_counter() - t
    eval_idle = steps_per_s(eval_env, eact, min(eval_steps, steps) or 1, args.sim)
    while_encoding = []
    t = time.perf_counter()
    while not clips and time.perf_counter() - t < 60:
        while_encoding.append(steps_per_s(train_env, act, 1, args.sim))
        eval_rec.poll()
    encode_tail_s = time.perf_counter() - t
    eval_rec.close()
    rec.close()  # closes the collection adapter too
    sps_enc = _harmonic(n, while_encoding)
    eval_rec_sps = args.grid * eval_steps / max(eval_s, 1e-9)
    rep.figure("eval_clip_frames", clips[0].num_frames if clips else 0)
    rep.figure("eval_steps_per_s_recording", eval_rec_sps)
    rep.figure("eval_steps_per_s_idle", eval_idle)
    rep.figure("encode_after_eval_s", encode_tail_s)
    rep.figure("train_steps_per_s_while_eval_clip_encodes", sps_enc)
    rep.figure("train_steps_while_eval_clip_encodes", len(while_encoding))
    rep.check(bool(clips), f"the {side}x{side} eval clip was saved", f"{len(clips)} clip(s)")
    if sps_enc is None:
        rep.info(
            "training throughput while an eval clip encodes",
            "the clip was encoded by the end of the evaluation: no training step overlapped it",
        )
    else:
        ratio = sps_enc / max(between, 1e-9)
        rep.figure("ratio_while_eval_clip_encodes", ratio)
        rep.goal(
            not args.quick,
            ratio >= 0.5,
            f"training throughput while a {side}x{side} eval clip encodes is at least 0.5x "
            "between clips",
            f"{ratio:.2f}x ({sps_enc:,.0f} vs {between:,.0f} env steps/s over "
            f"{len(while_encoding)} steps)",
        )


# --------------------------------------------------------------------------- PPO via train.py


def train_run(
    args,
    rep: Report,
    name: str,
    overrides: List[str],
    budget: float,
    stop_at: Optional[float],
    launcher: Optional[str] = None,
    max_evals: Optional[int] = None,
    max_iters: Optional[int] = None,
) -> Dict[str, Any]:
    """``python train.py overrides`` in a subprocess, its metrics.jsonl followed as it grows: ends
    it (SIGTERM: rlrec saves a checkpoint and exits) when an eval reaches ``stop_at`` success,
    after ``max_evals`` evaluations or ``max_iters`` iterations, or when ``budget`` seconds
    pass. Returns the curve and the timings."""
    run_dir = Path(args.tmp) / name
    cmd = [sys.executable]
    cmd += ["-c", launcher] if launcher else [str(REPO / "train.py")]
    cmd += [*overrides, f"hydra.run.dir={run_dir}", "logger=none", "logger.progress=false"]
    metrics = run_dir / "metrics.jsonl"
    log = open(Path(args.tmp) / f"{name}.out", "w")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    curve: List[dict] = []
    iters: List[dict] = []
    first_iter_s = None
    pos = 0
    hit = None
    stopped_by = "exit"
    try:
        while proc.poll() is None:
            time.sleep(0.25)
            wall = time.perf_counter() - t0
            if metrics.exists():
                with open(metrics) as f:
                    f.seek(pos)
                    chunk = f.read()
                complete = chunk[: chunk.rfind("\n") + 1]
                pos += len(complete.encode())
                for line in complete.splitlines():
                    m = json.loads(line)
                    if "sps/total" in m:
                        iters.append(m)
                        if first_iter_s is None:
                            first_iter_s = wall
                    if "eval/success" in m:
                        curve.append({"wall_s": round(wall, 1), "step": m["step"], **m})
                        print(
                            f"  {name}: eval at {wall:6.1f}s, {m['step']:>10,} steps: success "
                            f"{m['eval/success']:.3f}, return {m.get('eval/return', 0):.2f}",
                            flush=True,
                        )
                        if hit is None and stop_at is not None and m["eval/success"] >= stop_at:
                            hit = curve[-1]
            enough = (max_evals is not None and len(curve) >= max_evals) or (
                max_iters is not None and len(iters) >= max_iters
            )
            if hit is not None or enough or wall > budget:
                stopped_by = "success" if hit is not None else "count" if enough else "budget"
                proc.send_signal(signal.SIGTERM)
                break
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
    wall = time.perf_counter() - t0
    out_text = (Path(args.tmp) / f"{name}.out").read_text()[-3000:]
    rc = proc.returncode
    clean = rc == 0 or (stopped_by != "exit" and rc in (0, -signal.SIGTERM, 128 + signal.SIGTERM))
    if not clean:
        print(f"  {name}: train.py exited {rc}:\n{out_text}", flush=True)
    result = {
        "rc": rc,
        "clean_exit": clean,
        "stopped_by": stopped_by,
        "wall_s": wall,
        "first_iteration_s": first_iter_s,
        "iterations": len(iters),
        "env_steps": iters[-1]["step"] if iters else 0,
        "curve": [(c["wall_s"], c["step"], round(c["eval/success"], 3)) for c in curve],
        "hit": hit,
        "iters": iters,
    }
    for key in ("rc", "stopped_by", "wall_s", "first_iteration_s", "iterations", "env_steps"):
        rep.figure(f"{name}_{key}", result[key])
    rep.figure(f"{name}_curve", result["curve"])
    return result


def _learn(args, rep: Report, name: str, env_id: str, overrides: List[str], budget: float, ref):
    max_evals = None
    if args.quick:
        overrides = merge(overrides, QUICK_PPO, [f"sim={args.sim}", "total_steps=100000000"])
        max_evals = 2
    res = train_run(args, rep, name, overrides, budget, stop_at=0.9, max_evals=max_evals)
    successes = [c[2] for c in res["curve"]]
    losses_ok = all(math.isfinite(m.get("loss/value", float("nan"))) for m in res["iters"])
    rep.check(
        res["clean_exit"] and res["iterations"] > 0 and bool(successes) and losses_ok,
        f"train.py trains and evaluates {env_id} on sim={args.sim}",
        f"{res['iterations']} iterations, {len(successes)} evaluations, finite losses "
        f"{losses_ok}, exit {res['rc']} ({res['stopped_by']})",
    )
    hit = res["hit"]
    if hit is not None:
        since = hit["wall_s"] - (res["first_iteration_s"] or 0.0)
        rep.figure(f"{name}_success_wall_s", hit["wall_s"])
        rep.figure(f"{name}_success_steps", hit["step"])
        rep.figure(f"{name}_success_s_since_first_iteration", since)
    sps = [m["sps/total"] for m in res["iters"]]
    if sps:
        rep.figure(f"{name}_sps_last", sps[-1])
    rep.goal(
        not args.quick,
        hit is not None,
        f"{env_id} eval success >= 0.9 within {budget:.0f}s",
        f"reached at {hit['wall_s']:.1f}s (process start) / {hit['step']:,} steps; {ref}"
        if hit
        else f"best {max(successes, default=0):.2f} in {res['wall_s']:.0f}s; {ref}",
    )


def pushcube(args, rep: Report, tmp: Path, budget: float) -> None:
    over = list(PUSHCUBE)
    if args.quick:  # the preset is for the GPU; the same keys, on the CPU sim
        over = ["env=maniskill", "env.id=PushCube-v1", "algo.gamma=0.8", "algo.gae_lambda=0.9"]
    _learn(args, rep, "pushcube", "PushCube-v1", over, budget, "ManiSkill's ppo.py: under a minute")


def pickcube(args, rep: Report, tmp: Path, budget: float) -> None:
    over = PICKCUBE if args.quick else [*PICKCUBE, "sim=gpu"]
    _learn(args, rep, "pickcube", "PickCube-v1", over, budget, "ppo_fast's PR: about 1.3 min")


COMPILE_NO_CUDAGRAPHS = (
    "import sys; import rlrec.ppo.ppo as p; p.COMPILE_MODES['cuda'] = None; "
    "sys.argv[0] = 'train.py'; from rlrec.cli import main; main()"
)


def compile_part(args, rep: Report, tmp: Path, budget: float) -> None:
    """SPS of the same PushCube run eager and compiled, over the iterations after the first few
    (the compiled run compiles during its first ones): env steps over their collect + learn
    time."""
    if args.quick:
        base = merge(["env=maniskill", "env.id=PushCube-v1"], QUICK_PPO, [f"sim={args.sim}"])
        base += ["eval_env.enabled=false", "total_steps=100000000"]
    else:
        base = [*PUSHCUBE, "eval_env.enabled=false", "recorder=none", "total_steps=500000000"]
    variants = [("eager", "algo.compile=false", None), ("compiled", "algo.compile=true", None)]
    if args.sim == "gpu" and args.compile_no_cudagraphs:
        variants.append(("compiled_no_cudagraphs", "algo.compile=true", COMPILE_NO_CUDAGRAPHS))
    skip, measured = (2, 3) if args.quick else (5, 30)
    sps = {}
    each = budget / len(variants)
    for label, flag, launcher in variants:
        res = train_run(
            args,
            rep,
            f"compile_{label}",
            [*base, flag],
            each,
            None,
            launcher,
            None,
            skip + measured,
        )
        steady = res["iters"][skip:]
        secs = sum(m["time/collect"] + m["time/learn"] for m in steady)
        steps = steady[-1]["step"] - res["iters"][skip - 1]["step"] if steady else 0
        sps[label] = steps / secs if secs > 0 and steps > 0 else float("nan")
        rep.figure(f"{label}_steady_sps", sps[label])
        rep.figure(f"{label}_steady_iterations", len(steady))
        rep.figure(f"{label}_first_iteration_s", res["first_iteration_s"])
        rep.check(
            res["clean_exit"] and len(steady) > 0,
            f"train.py runs PushCube-v1 with {flag}" + (" (no CUDA graphs)" if launcher else ""),
            f"{res['iterations']} iterations, {len(steady)} measured, exit {res['rc']}",
        )
    ratio = sps["compiled"] / sps["eager"] if sps["eager"] > 0 else float("nan")
    rep.figure("ratio", ratio)
    if "compiled_no_cudagraphs" in sps and sps["eager"] > 0:
        rep.figure("ratio_no_cudagraphs", sps["compiled_no_cudagraphs"] / sps["eager"])
    rep.goal(
        not args.quick,
        ratio >= 1.3,
        "algo.compile=true trains PushCube at least 1.3x the eager SPS",
        f"{ratio:.2f}x ({sps['compiled']:,.0f} vs {sps['eager']:,.0f} SPS, steady iterations)",
    )


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
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sim", choices=["gpu", "cpu"], default="gpu")
    p.add_argument("--quick", action="store_true", help="small sizes (for --sim cpu)")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS, help="default: all")
    p.add_argument("--skip", nargs="*", choices=PARTS, default=[])
    p.add_argument("--out", help="where gpu_check.log and gpu_check.json go (default: $OUT)")
    p.add_argument(
        "--budget",
        type=_finite("--budget", 10, 3600),
        help="seconds for the whole run (default 580, with --quick 1500)",
    )
    p.add_argument("--eval-envs", type=_positive_int("--eval-envs", 4096), default=16)
    p.add_argument("--train-envs", type=_positive_int("--train-envs", 65536), default=128)
    p.add_argument(
        "--throughput-envs", type=_positive_int("--throughput-envs", 65536), default=4096
    )
    p.add_argument(
        "--recorder-train-envs", type=_positive_int("--recorder-train-envs", 65536), default=2048
    )
    p.add_argument("--size", type=_positive_int("--size", 2048), default=128, help="render size")
    p.add_argument(
        "--gpu-tol",
        type=_finite("--gpu-tol", 0, 255),
        default=0.5,
        help="mean abs pixel diff counted as the same frame on GPU",
    )
    p.add_argument(
        "--compile-no-cudagraphs",
        action="store_true",
        help="compile part: also a compiled run without CUDA graphs",
    )
    args = p.parse_args(argv)
    args.grid = 16  # the eval clip of the recorder part: a 4x4 grid
    if args.budget is None:
        args.budget = 1500.0 if args.quick else 540.0
    if args.quick:
        args.eval_envs, args.train_envs, args.size = 2, 2, 64
        args.throughput_envs, args.recorder_train_envs, args.grid = 2, 4, 4
        quick = {"contract": 120, "maniskill_own_loop": 150, "compile": 300}
        for part in BUDGET:
            BUDGET[part] = quick.get(part, 90)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    out_dir = args.out or os.environ.get("OUT")
    out = Path(out_dir).resolve() if out_dir else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        log = open(out / "gpu_check.log", "a", buffering=1)
        sys.stdout, sys.stderr = Tee(sys.stdout, log), Tee(sys.stderr, log)
    start = time.perf_counter()
    import mani_skill

    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA"
    meta = {
        "sim": args.sim,
        "quick": args.quick,
        "torch": torch.__version__,
        "mani_skill": mani_skill.__version__,
        "device": dev,
        "argv": sys.argv[1:],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    rep = Report(None if out is None else out / "gpu_check.json", meta)
    print(
        f"gpu_check: sim={args.sim}, torch {torch.__version__}, mani_skill "
        f"{mani_skill.__version__}, {dev}",
        flush=True,
    )
    if args.sim == "gpu" and not torch.cuda.is_available():
        rep.check(False, "CUDA available", "torch.cuda.is_available() is False: run this on a GPU")
        rep.save()
        return 1
    parts = [p for p in PARTS if p in args.parts and p not in args.skip]
    fns = {
        "smoke": smoke,
        "regression": regression,
        "contract": contract,
        "maniskill_own_loop": maniskill_own_loop,
        "throughput": throughput,
        "recorder": recorder,
        "pushcube": pushcube,
        "compile": compile_part,
        "pickcube": pickcube,
    }
    timed = {
        "contract",
        "maniskill_own_loop",
        "pushcube",
        "compile",
        "pickcube",
    }  # they take their budget as an argument
    with tempfile.TemporaryDirectory(prefix="rlrec_gpu_check_") as tmp:
        args.tmp = tmp
        for name in parts:
            left = args.budget - (time.perf_counter() - start)
            if left < MIN_START[name]:
                print(f"SKIP {name}: {left:.0f}s left of the {args.budget:.0f}s budget", flush=True)
                rep.start(name)
                rep.end(name, "skipped", 0.0, f"{left:.0f}s left, needs {MIN_START[name]}s")
                continue
            budget = min(BUDGET[name], left - 5)
            print(
                f"== {name} (at {time.perf_counter() - start:.0f}s, budget {budget:.0f}s)",
                flush=True,
            )
            rep.start(name)
            t = time.perf_counter()
            try:
                part_tmp = Path(tmp) / name
                part_tmp.mkdir()
                if name in timed:
                    fns[name](args, rep, part_tmp, budget)
                else:
                    fns[name](args, rep, part_tmp)
                rep.end(name, "done", time.perf_counter() - t)
            except Exception as e:  # one broken part must not hide the others' figures
                import traceback

                traceback.print_exc(file=sys.stdout)
                rep.check(False, name, f"{type(e).__name__}: {e}")
                rep.end(name, "error", time.perf_counter() - t, f"{type(e).__name__}: {e}")
    results = rep.results()
    ok = bool(results) and all(results)
    total = time.perf_counter() - start
    rep.data["total_s"] = round(total, 1)
    rep.save()
    print(
        f"{'PASS' if ok else 'FAIL'} gpu_check: {sum(results)}/{len(results)} checks passed "
        f"in {total:.0f}s",
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
