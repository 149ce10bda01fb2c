#!/usr/bin/env python
"""ManiSkill3 on an NVIDIA GPU: the checks that cannot run on a CPU-only machine, in one script.

    python scripts/gpu_check.py                    # CUDA machine, maniskill extra installed;
                                                   # < 5 min
    python scripts/gpu_check.py --sim cpu --quick  # the same code path on the CPU sim
                                                   # (script smoke test)

1. The eval-recording regression with ``sim=gpu`` (eval num_envs 16, collection num_envs 128):
   three evaluations, each after a full seeded reset, with collection in between; every eval clip
   (lossless) must start on the frame of a fresh env reset with the same seed, not on the previous
   episode's last frame nor on the pre-reset state, and end on the real terminal state (frames kept
   by a spy below the recorder). The collection recorder must follow the cubic schedule.
2. Step and render cost of the batched GPU env.
3. PPO on PushCube-v1 (state obs) through rlrec's own runner, with ManiSkill's baseline settings
   (2048 envs, 12-step rollouts, gamma 0.8, 8 epochs, 32 minibatches, 3x256 MLP); prints SPS and the
   eval success curve; target: eval success >= 0.9 within 180 s of wall time (ManiSkill's own
   baseline reports under a minute).
4. The env-contract test suite on the GPU env (pytest, ``TestManiSkillGPUContract``).

Prints PASS/FAIL lines and the figures; exits 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

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
RESULTS: List[bool] = []


def report(ok: bool, name: str, detail: str = "") -> bool:
    RESULTS.append(bool(ok))
    print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""), flush=True)
    return ok


def diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float32) - b.astype(np.float32)).mean())


def decode(path: str) -> np.ndarray:
    import imageio_ffmpeg

    gen = imageio_ffmpeg.read_frames(path, pix_fmt="rgb24")
    w, h = next(gen)["size"]
    return np.stack([np.frombuffer(b, np.uint8).reshape(h, w, 3) for b in gen])


def random_actions(env, gen: torch.Generator) -> torch.Tensor:
    shape = (env.num_envs, *env.single_action_space.shape)
    return (torch.rand(shape, generator=gen) * 2 - 1).to(env.device)


def sim_cfg(sim: str) -> SimConfig:
    return SimConfig(name=sim, device="cuda" if sim == "gpu" else "cpu")


def recording_stack(sim, num_envs, limit, seed, trigger, size, video_dir, keep):
    cfg = ManiSkillEnvConfig(render_width=size, render_height=size, max_episode_steps=limit)
    spy = FrameSpy(make_adapter(cfg, sim_cfg(sim), num_envs, seed), keep_frames=keep)
    clips: list = []
    rec = Recorder(
        spy,
        RecorderConfig(trigger=trigger, env_idx=[0], lossless=True, record_final_episode=False),
        video_dir,
        kind="eval" if trigger is Trigger.eval else "train",
        on_clip=clips.append,
    )
    return AutoReset(rec), rec, spy, clips


# --------------------------------------------------------------------------- 1 + 2


def regression(args, tmp: Path) -> None:
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
    fresh = make_adapter(
        ManiSkillEnvConfig(
            render_width=args.size, render_height=args.size, max_episode_steps=EVAL_LIMIT
        ),
        sim_cfg(args.sim),
        args.eval_envs,
        12345,
    )
    fresh.reset(seed=EVAL_SEED)
    reference = fresh.render([0])[0].numpy().copy()
    fresh.close()

    report(len(eval_clips) == 3, "one eval clip per evaluation", f"{len(eval_clips)} clips")
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
    report(
        all(d <= tol for d in firsts),
        "every eval clip starts on the fresh seeded reset state",
        f"mean abs diff to a fresh env's reset frame {[round(d, 3) for d in firsts]} (tol {tol})",
    )
    report(
        prevs and all(d > max(tol, 1.0) for d in prevs + stales),
        "no eval clip starts on the previous episode's last frame or the pre-reset state",
        f"diff to previous last frame {[round(d, 2) for d in prevs]}, to pre-reset frame "
        f"{[round(d, 2) for d in stales]}",
    )
    report(
        terminal_ok and length_ok and all(d > max(tol, 1.0) for d in after),
        "eval clips are the whole episode and end on the terminal state (before autoreset)",
        f"terminal frame diff {[round(d, 3) for d in lasts]}, to the autoreset frame "
        f"{[round(d, 2) for d in after]}",
    )
    report(
        [c.episode for c in train_clips] == [0, 1, 8] and train_rec.episode >= 9,
        "cubic schedule on the collection env",
        f"clips of episodes {[c.episode for c in train_clips]}",
    )
    report(
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
    report(
        torch.equal(a, kept) and a.data_ptr() != b.data_ptr() and diff(a.numpy(), b.numpy()) > 0,
        "render returns an owned copy of the current state",
    )

    # 2: costs
    adapter = train_env.unwrapped
    act = random_actions(adapter, gen)
    for _ in range(5):
        adapter.step(act)
    sync = torch.cuda.synchronize if args.sim == "gpu" else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(50):
        adapter.step(act)
    sync()
    step_s = (time.perf_counter() - t) / 50
    ev = eval_env.unwrapped
    t = time.perf_counter()
    for _ in range(20):
        ev.render([0])
    r1 = (time.perf_counter() - t) / 20
    t = time.perf_counter()
    for _ in range(5):
        ev.render(list(range(ev.num_envs)))
    rall = (time.perf_counter() - t) / 5
    print(
        f"  cost: step {step_s * 1e3:.2f} ms for {adapter.num_envs} envs "
        f"({adapter.num_envs / step_s:,.0f} env steps/s); render {args.size}x{args.size}: env 0 "
        f"{r1 * 1e3:.1f} ms, all {ev.num_envs} envs {rall * 1e3:.1f} ms",
        flush=True,
    )
    eval_env.close()
    train_env.close()


# --------------------------------------------------------------------------- 3


def ppo(args, tmp: Path) -> None:
    from hydra import compose, initialize_config_dir

    import rlrec.cli  # registers the schemas and resolvers
    from rlrec.config import to_dataclass
    from rlrec.runner import Runner

    if args.quick:
        sizes = [
            "env.num_envs=4",
            "algo.num_steps=16",
            "algo.num_minibatches=4",
            "algo.update_epochs=2",
            "eval_env.num_envs=2",
            "eval_env.every=2",
        ]
    else:
        sizes = [
            f"env.num_envs={args.ppo_envs}",
            "algo.num_steps=12",
            "algo.num_minibatches=32",
            "algo.update_epochs=8",
            f"eval_env.num_envs={args.eval_envs}",
            "eval_env.every=10",
        ]
    overrides = [
        "env=maniskill",
        f"sim={args.sim}",
        "env.id=PushCube-v1",
        "env.obs_mode=state",
        "env.control_mode=pd_joint_delta_pos",
        "env.reward_mode=normalized_dense",
        "env.max_episode_steps=50",
        f"env.render_width={args.size}",
        f"env.render_height={args.size}",
        *sizes,
        "algo.gamma=0.8",
        "algo.gae_lambda=0.9",
        "algo.learning_rate=3e-4",
        "algo.anneal_lr=false",
        "algo.hidden_sizes=[256,256,256]",
        "algo.init_log_std=-0.5",
        "algo.norm_obs=false",
        "algo.target_kl=0.1",
        "recorder.trigger=none",
        "logger=none",
        "logger.progress=false",
        "total_steps=500000000",
        "checkpoint_every=1000000",
        "seed=1",
    ]
    with initialize_config_dir(version_base="1.3", config_dir=rlrec.cli.CONFIG_DIR):
        cfg = to_dataclass(compose("config", overrides=overrides))
    curve = []
    t0 = time.perf_counter()
    runner = Runner(cfg, tmp / "ppo")
    built = time.perf_counter() - t0
    evaluate = runner.evaluate

    def timed_evaluate():
        m = evaluate()
        wall = time.perf_counter() - t0
        curve.append(
            (
                wall,
                runner.global_step,
                m.get("eval/success", float("nan")),
                m.get("eval/return", 0.0),
            )
        )
        print(
            f"  eval at {wall:6.1f}s, {runner.global_step:>10,} steps: success {curve[-1][2]:.3f}, "
            f"return {curve[-1][3]:.2f}",
            flush=True,
        )
        if curve[-1][2] >= 0.9 or wall > args.ppo_seconds:
            runner.stop.signum = signal.SIGTERM  # ends training at the next env step
        return m

    runner.evaluate = timed_evaluate
    runner.run()
    wall = time.perf_counter() - t0
    sps = runner.global_step / max(wall - built, 1e-9)
    print(
        f"  PPO: {runner.global_step:,} env steps in {wall:.1f}s (build {built:.1f}s), "
        f"{sps:,.0f} SPS overall",
        flush=True,
    )
    print(
        "  eval success curve (wall s, env steps, success): "
        + ", ".join(f"({w:.0f}, {s}, {x:.2f})" for w, s, x, _ in curve),
        flush=True,
    )
    hit = next((c for c in curve if c[2] >= 0.9), None)
    report(
        hit is not None and hit[0] <= args.ppo_seconds,
        f"PushCube-v1 eval success >= 0.9 within {args.ppo_seconds:.0f}s",
        f"reached at {hit[0]:.1f}s / {hit[1]:,} steps"
        if hit
        else f"best {max((c[2] for c in curve), default=0):.2f}",
    )
    if hit is not None:
        print(
            f"  INFO vs ManiSkill's PPO baseline (under 60 s for state PushCube): "
            f"{'as fast' if hit[0] <= 60 else 'slower'} ({hit[0]:.1f}s)",
            flush=True,
        )


# --------------------------------------------------------------------------- 4


def contract(args) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        str(REPO / "tests/envs/test_maniskill.py"),
        "-k",
        "GPUContract" if args.sim == "gpu" else "CPUContract",
    ]
    t = time.perf_counter()
    out = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=args.contract_timeout
    )
    tail = (out.stdout + out.stderr).strip().splitlines()[-1:] or [""]
    report(
        out.returncode == 0,
        f"env contract suite on sim={args.sim}",
        f"{tail[0]} ({time.perf_counter() - t:.0f}s)",
    )
    if out.returncode != 0:
        print(out.stdout[-4000:], out.stderr[-2000:], flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sim", choices=["gpu", "cpu"], default="gpu")
    p.add_argument("--quick", action="store_true", help="small sizes (for --sim cpu)")
    p.add_argument("--eval-envs", type=int, default=16)
    p.add_argument("--train-envs", type=int, default=128)
    p.add_argument("--ppo-envs", type=int, default=2048)
    p.add_argument("--ppo-seconds", type=float, default=180.0)
    p.add_argument("--size", type=int, default=128, help="render width and height")
    p.add_argument(
        "--gpu-tol",
        type=float,
        default=0.5,
        help="mean abs pixel diff counted as the same frame on GPU",
    )
    p.add_argument("--skip", nargs="*", default=[], choices=["regression", "ppo", "contract"])
    p.add_argument("--contract-timeout", type=float, default=150.0)
    p.add_argument(
        "--budget",
        type=float,
        default=290.0,
        help="seconds for the whole script (the contract part is cut to fit)",
    )
    args = p.parse_args()
    if args.quick:
        args.eval_envs, args.train_envs, args.size = 2, 2, 64
        args.ppo_seconds = min(args.ppo_seconds, 30.0)
    start = time.perf_counter()
    import mani_skill

    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA"
    print(
        f"gpu_check: sim={args.sim}, torch {torch.__version__}, "
        f"mani_skill {mani_skill.__version__}, {dev}",
        flush=True,
    )
    if args.sim == "gpu" and not torch.cuda.is_available():
        report(
            False, "CUDA available", "torch.cuda.is_available() is False: run this on a GPU machine"
        )
        return 1
    with tempfile.TemporaryDirectory(prefix="rlrec_gpu_check_") as tmp:
        for name, fn in (
            ("regression", lambda: regression(args, Path(tmp))),
            ("ppo", lambda: ppo(args, Path(tmp))),
            ("contract", lambda: contract(args)),
        ):
            if name in args.skip:
                continue
            left = args.budget - (time.perf_counter() - start)
            if name == "contract":
                if left < 45:
                    print(
                        f"SKIP contract: {left:.0f}s left of the {args.budget:.0f}s budget",
                        flush=True,
                    )
                    continue
                args.contract_timeout = min(args.contract_timeout, left)
            print(f"== {name} ({time.perf_counter() - start:.0f}s)", flush=True)
            try:
                fn()
            except Exception as e:  # one broken part must not hide the others' figures
                import traceback

                traceback.print_exc()
                report(False, name, f"{type(e).__name__}: {e}")
    total = time.perf_counter() - start
    ok = all(RESULTS) and bool(RESULTS)
    print(
        f"{'PASS' if ok else 'FAIL'} gpu_check: {sum(RESULTS)}/{len(RESULTS)} checks passed "
        f"in {total:.0f}s",
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
