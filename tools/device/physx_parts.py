"""The ManiSkill parts that need SAPIEN's PhysX GPU library (``sim=gpu``): run them on a CUDA
machine that has ``libPhysXGpu_64.so`` under ``~/.sapien/physx/<version>/`` (docs/maniskill.md
says how to fetch it on a machine with internet). The GPU machine of ``device_kit.py plan`` has no
network and so none of them run there; ``gpu_check.py --parts physx_pushcube ...`` names them:

- ``physx_smoke``: PushCube-v1 built, stepped and rendered on ``sim=gpu``.
- ``physx_regression``: the seed scenario, an eval env (16 envs) and a collection env (128 envs):
  three evaluations, each after a full seeded reset, with collection in between; every eval clip
  (lossless) starts on the frame of a fresh env reset with the same seed and ends on the true
  terminal state; the collection recorder follows the cubic schedule.
- ``physx_contract``: the env-contract suite of ``tests/envs/test_maniskill.py`` on the GPU sim.
- ``physx_own_loop``: ``examples/maniskill_own_loop.py`` (``RecordClips`` under
  ``ManiSkillVectorEnv``): frame 0 of every eval clip equals a fresh env's render after a reset
  with the clip's seed.
- ``physx_throughput``: steps/s of the raw batched env against rlrec's adapter (PickCube-v1, 4,096
  envs); goal: at least 0.95x.
- ``physx_pushcube`` / ``physx_pickcube``: PPO through ``train.py`` until eval success >= 0.9
  (ManiSkill's ppo.py baseline / ppo_fast's settings).

With ``--device cpu`` they run on ManiSkill's CPU sim (the same code, small), as their own test.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
from gpu_common import REPO, Report, decode, diff, merge
from gpu_common import train_run as gpu_check_train_run

from rlrec.envs.autoreset import AutoReset
from rlrec.envs.config import SimConfig
from rlrec.envs.factory import make_adapter
from rlrec.envs.maniskill import ManiSkillEnvConfig
from rlrec.record import Recorder
from rlrec.record.settings import RecorderConfig, Trigger
from rlrec.testing import FrameSpy

EVAL_LIMIT = 10  # steps per eval episode in the regression
TRAIN_LIMIT = 2  # collection episodes, short so env 0 reaches episode 8 of the cubic schedule fast
EVAL_SEED = 1000
PUSHCUBE = [  # ManiSkill's ppo.py baseline for state PushCube-v1 (the preset holds it)
    "+experiment=maniskill_pushcube_gpu",
]
PICKCUBE = [  # ManiSkill's ppo_fast.py baseline for state PickCube-v1 (the preset holds it)
    "+experiment=maniskill_pickcube_gpu",
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
        [c.episode for c in train_clips] == [0, 1, 8] and train_rec.engine.episode >= 9,
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


OWN_LOOP_STEPS = 10  # steps per eval episode of the example


def own_loop_command(
    out_dir: Path, sim: str, eval_envs: int, train_envs: int, size: int, render: str = ""
):
    """examples/maniskill_own_loop.py, small: three evaluations, lossless clips (``render``:
    its ``--render-backend``, or its default)."""
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
        *(["--render-backend", render] if render else []),
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


def own_loop_first_frames(
    eval_dir: Path, sim: str, size: int, batch: int, render: str = ""
) -> List[dict]:
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
    if render:
        kw["render_backend"] = render
    elif sim == "cpu":
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
    check_own_loop_clips(rep, rows, 1 if args.sim == "gpu" else n_eval, tol)


def check_own_loop_clips(rep: Report, rows: List[dict], recorders: int, tol: float) -> None:
    """The checks of three evaluations' eval clips of the example (``own_loop_first_frames``):
    one whole episode per clip, frame 0 the fresh reset of the clip's seed (within ``tol``), never
    the previous clip's last frame."""
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
    """``gpu_check.train_run`` that also ends the run when an eval reaches ``stop_at`` success or
    after ``max_evals`` evaluations; adds the eval curve and the first eval at ``stop_at``."""
    curve: List[dict] = []
    hit: List[dict] = []

    def watch(lines: List[dict], wall: float) -> Optional[str]:
        for m in lines:
            if "eval/success" not in m:
                continue
            curve.append({"wall_s": round(wall, 1), "step": m["step"], **m})
            print(
                f"  {name}: eval at {wall:6.1f}s, {m['step']:>10,} steps: success "
                f"{m['eval/success']:.3f}, return {m.get('eval/return', 0):.2f}",
                flush=True,
            )
            if not hit and stop_at is not None and m["eval/success"] >= stop_at:
                hit.append(curve[-1])
        if hit:
            return "success"
        return "count" if max_evals is not None and len(curve) >= max_evals else None

    # a ManiSkill run gets 90 s after SIGTERM to checkpoint and close its envs
    result = gpu_check_train_run(
        args, rep, name, overrides, budget, max_iters, launcher, watch=watch, grace=90.0
    )
    iters = result["iters"]
    result["env_steps"] = iters[-1]["step"] if iters else 0
    result["curve"] = [(c["wall_s"], c["step"], round(c["eval/success"], 3)) for c in curve]
    result["hit"] = hit[0] if hit else None
    rep.figure(f"{name}_env_steps", result["env_steps"])
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
        over += ["algo.bootstrap_at=done", "algo.kl_check=minibatch"]
    _learn(args, rep, "pushcube", "PushCube-v1", over, budget, "ManiSkill's ppo.py: under a minute")


def pickcube(args, rep: Report, tmp: Path, budget: float) -> None:
    over = merge(PICKCUBE, ["sim=cpu"]) if args.quick else [*PICKCUBE, "sim=gpu"]
    _learn(args, rep, "pickcube", "PickCube-v1", over, budget, "ppo_fast's PR: about 1.3 min")


# name -> (function(args, report, tmp dir, budget), budget s on a GPU, least s to start)
PARTS: Dict[str, tuple] = {
    "physx_smoke": (lambda a, r, t, b: smoke(a, r, t), 25, 10),
    "physx_regression": (lambda a, r, t, b: regression(a, r, t), 55, 40),
    "physx_contract": (contract, 55, 45),
    "physx_own_loop": (maniskill_own_loop, 60, 40),
    "physx_throughput": (lambda a, r, t, b: throughput(a, r, t), 35, 30),
    "physx_pushcube": (pushcube, 80, 60),
    "physx_pickcube": (pickcube, 100, 60),
}
