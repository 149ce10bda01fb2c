"""Your own ManiSkill3 training loop, recorded by rlrec.

The shape of ManiSkill's examples/baselines/ppo/ppo.py, much shorter: a collection env, a separate
eval env of several envs wrapped by ``RecordClips`` exactly where ppo.py puts ``RecordEpisode``,
and evaluations, each after a full reset of the eval env. The policy is a tiny random linear map
(the point is the recording, not the learning).

    python examples/maniskill_own_loop.py                       # GPU sim when CUDA is there
    python examples/maniskill_own_loop.py --sim cpu --num-envs 2 --num-eval-envs 2

Each eval clip lands in ``OUTPUT_DIR/eval`` (GPU sim; CPU sim: ``OUTPUT_DIR/eval/envN`` per eval
env, as ManiSkill's CPU sim holds one env per object) with a ``.json`` sidecar beside it: the env,
its episode and seed, return, length, success and how it ended.
"""

from __future__ import annotations

import argparse
import os
import time

import gymnasium as gym
import mani_skill.envs  # noqa: F401  registers the ManiSkill tasks
import numpy as np
import torch
from mani_skill.utils.wrappers.gymnasium import CPUGymWrapper
from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv

from rlrec.record import RecordClips


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env-id", default="PushCube-v1")
    p.add_argument(
        "--sim", choices=["gpu", "cpu"], default="gpu" if torch.cuda.is_available() else "cpu"
    )
    p.add_argument("--num-envs", type=int, default=64, help="collection envs")
    p.add_argument("--num-eval-envs", type=int, default=8)
    p.add_argument("--steps", type=int, default=50, help="collection steps between evaluations")
    p.add_argument("--evaluations", type=int, default=3)
    p.add_argument("--episode-steps", type=int, default=None, help="default: the task's limit")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--eval-seed", type=int, default=1000, help="evaluation k resets with +k")
    p.add_argument("--render-size", type=int, default=128)
    p.add_argument(
        "--render-backend",
        choices=["cpu", "gpu"],
        default=None,
        help="SAPIEN's renderer (default: cpu with --sim cpu, ManiSkill's own choice with gpu)",
    )
    p.add_argument("--output-dir", default="runs/maniskill_own_loop")
    p.add_argument("--lossless", action="store_true", help="pixel-exact clips (for analysis)")
    args = p.parse_args(argv)
    for name in ("num_envs", "num_eval_envs", "steps", "evaluations", "render_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.sim == "cpu" and args.num_eval_envs > 8:
        p.error("--sim cpu builds one process-local env per eval env: use --num-eval-envs <= 8")
    return args


def env_kwargs(args, num_envs: int) -> dict:
    kw = dict(
        num_envs=num_envs,
        obs_mode="state",
        control_mode="pd_joint_delta_pos",
        render_mode="rgb_array",
        sim_backend="physx_cuda" if args.sim == "gpu" else "physx_cpu",
        human_render_camera_configs=dict(width=args.render_size, height=args.render_size),
    )
    if args.render_backend is not None:  # gpu: the CPU sim rendered on CUDA (sapien_cuda)
        kw["render_backend"] = args.render_backend
    elif args.sim == "cpu":
        kw["render_backend"] = "cpu"
    if args.episode_steps is not None:
        kw["max_episode_steps"] = args.episode_steps
    return kw


def recorder(env, args, output_dir: str):
    # ppo.py: RecordEpisode(eval_envs, output_dir=..., save_trajectory=False,
    #                       max_steps_per_video=args.num_eval_steps, video_fps=30)
    return RecordClips(
        env,
        output_dir=output_dir,
        save_trajectory=False,
        video_fps=30,
        ignore_terminations=True,  # as the vector wrapper's below
        trigger="eval",  # one clip per evaluation: the first episode after each full reset
        lossless=args.lossless,
    )


def make_envs(args, num_envs: int, record: bool):
    """GPU sim: one batched env under ManiSkillVectorEnv. CPU sim: one env per object in a
    gymnasium vector env (ManiSkill's CPU sim holds one env), each recorded on its own."""
    eval_dir = os.path.join(args.output_dir, "eval")
    if args.sim == "gpu":
        env = gym.make(args.env_id, **env_kwargs(args, num_envs))
        if record:
            env = recorder(env, args, eval_dir)
        return ManiSkillVectorEnv(env, num_envs, ignore_terminations=record, record_metrics=True)

    def make(i: int):
        def thunk():
            env = gym.make(args.env_id, **env_kwargs(args, 1))
            if record:
                env = recorder(env, args, os.path.join(eval_dir, f"env{i}"))
            return CPUGymWrapper(env, ignore_terminations=record, record_metrics=True)

        return thunk

    return gym.vector.SyncVectorEnv([make(i) for i in range(num_envs)])


class TinyPolicy:
    """A random linear map with tanh: actions in [-1, 1], batched in torch."""

    def __init__(self, obs_dim: int, act_dim: int, seed: int, device):
        g = torch.Generator().manual_seed(seed)
        self.w = (torch.randn(obs_dim, act_dim, generator=g) * 0.3).to(device)

    def __call__(self, obs) -> torch.Tensor:
        return torch.tanh(torch.as_tensor(obs, dtype=torch.float32, device=self.w.device) @ self.w)


def to_env(action: torch.Tensor, sim: str):
    return action if sim == "gpu" else action.cpu().numpy()


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device("cuda" if args.sim == "gpu" else "cpu")
    t0 = time.perf_counter()
    envs = make_envs(args, args.num_envs, record=False)
    eval_envs = make_envs(args, args.num_eval_envs, record=True)
    obs, _ = envs.reset(seed=args.seed)  # the eval envs are reset by each evaluation
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    act_dim = int(np.prod(envs.single_action_space.shape))
    policy = TinyPolicy(obs_dim, act_dim, args.seed, device)
    limit = args.episode_steps or gym.spec(args.env_id).max_episode_steps
    print(f"built {args.sim} envs in {time.perf_counter() - t0:.1f}s; eval episodes: {limit} steps")
    try:
        for k in range(args.evaluations):
            for _ in range(args.steps):  # "training": collection with the current policy
                obs, _, _, _, _ = envs.step(to_env(policy(obs), args.sim))
            eval_obs, _ = eval_envs.reset(seed=args.eval_seed + k)
            returns = torch.zeros(args.num_eval_envs, device=device)
            for _ in range(limit):  # ignore_terminations: every eval env runs to its time limit
                eval_obs, rew, _, _, _ = eval_envs.step(to_env(policy(eval_obs), args.sim))
                returns += torch.as_tensor(rew, dtype=torch.float32, device=device)
            print(f"evaluation {k}: mean return {returns.mean().item():.3f}")
    finally:
        eval_envs.close()  # saves and reports every clip (bounded waits)
        envs.close()
    clips = sorted(
        os.path.join(d, f)
        for d, _, files in os.walk(os.path.join(args.output_dir, "eval"))
        for f in files
        if f.endswith(".mp4")
    )
    print(f"{len(clips)} eval clips:", *clips, sep="\n  ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
