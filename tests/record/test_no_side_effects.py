"""Recording has no side effects: with the recorder on and off, an env stack goes through the same
states, bit for bit, on every backend.

Each case runs rlrec's own stack (``rlrec.train.stack.make_env_stack``:
``AutoReset(Recorder(adapter))`` or ``AutoReset(adapter)``) twice from the same seeds, with the same
seeded random actions: once with ``trigger=always`` on a grid of two envs (so the recorder renders
both at every step of every episode of env 0) and once with no recorder. Every step's full
observation tensor, reward, termination, truncation and final observation (AutoReset's
``info["final_obs"]``) must be equal, and so must the simulator state the backend exposes, read
right after each step (so a render that moved an object, or left a write pending that the next step
applies, is caught at the step it happens, not only through later observations). The runs include
partial resets (an early manual reset of env 1 staggers the episodes, so AutoReset then resets envs
one at a time), a full seeded reset mid-run, and renders right after resets (every clip's first
frame).

Sizes are small (2 or 3 envs, 32x32 frames; 64x64 for Genesis's camera). The built-in env and
CartPole run 1,000 steps, ManiSkill and Genesis (slow on a CPU) 300: six 50-step episodes of each
env, so every kind of reset and render above occurs several times. The built-in env renders both
envs at every step; the others render far slower than they step on a CPU (measured on a 2-core
machine: CartPole about 20 ms per env, pygame draws 600x400 and the adapter scales it down; Genesis
about 35 ms per 64x64 render on llvmpipe; ManiSkill about 75 ms per 32x32 render on lavapipe), so
their recorder takes a frame every few steps (a lower ``fps``), besides every reset frame and every
terminal frame: renders still fall between steps all through the run, after resets and before
autoresets.
"""

from __future__ import annotations

from typing import Dict, List

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrec.envs.builtin import BuiltinEnvConfig
from rlrec.envs.config import SimConfig
from rlrec.envs.gymnasium import GymnasiumEnvConfig
from rlrec.envs.maniskill import ManiSkillEnvConfig
from rlrec.record.settings import RecorderConfig, Trigger
from rlrec.train.stack import make_env_stack

STEPS = 1000
SIM_STEPS = 300  # ManiSkill and Genesis: see the module docstring
SEED = 5


def random_actions(space: gym.Space, n: int, gen: torch.Generator) -> torch.Tensor:
    """A batch of ``n`` seeded random actions of ``space`` (Box: uniform in its bounds)."""
    if isinstance(space, gym.spaces.Discrete):
        return torch.randint(int(space.n), (n,), generator=gen) + int(space.start)
    assert isinstance(space, gym.spaces.Box), space
    low = torch.as_tensor(np.maximum(space.low, -1e3), dtype=torch.float32)
    high = torch.as_tensor(np.minimum(space.high, 1e3), dtype=torch.float32)
    return low + (high - low) * torch.rand(n, *space.shape, generator=gen)


def _cpu(x):
    return x.detach().to("cpu").clone() if isinstance(x, torch.Tensor) else x


def run(env_cfg, num_envs, video_dir, sim_state, steps, fps=None, spf=None) -> dict:
    """Steps a fresh stack ``steps`` times, recording (``spf``: the steps per frame its ``fps``
    gives) or not (``spf`` None); returns every step's outputs (on the CPU), the sim state after
    each step where ``sim_state(adapter)`` reads one, and the recorder's clips."""
    torch.manual_seed(0)  # global RNGs as a fresh process has them, in both runs
    np.random.seed(0)
    clips: list = []
    rec_cfg = None
    if spf is not None:
        rec_cfg = RecorderConfig(trigger=Trigger.always, env_idx=[0, 1], queue_size=8, fps=fps)
    stack = make_env_stack(
        env_cfg, SimConfig(), num_envs, SEED, rec_cfg, str(video_dir), on_clip=clips.append
    ).env
    adapter = stack.unwrapped
    if spf is not None:
        assert stack.env.engine.steps_per_frame == spf
    gen = torch.Generator().manual_seed(SEED)
    out: Dict[str, list] = {k: [] for k in ("obs", "step", "final", "state")}
    try:
        obs, _ = stack.reset(seed=SEED)
        out["obs"].append(_cpu(obs))
        for t in range(steps):
            if t == 3:  # env 1 restarts early: its episodes end at other steps than env 0's
                out["obs"].append(_cpu(stack.reset(env_idx=[1])[0]))
            if t == steps // 2:  # a full seeded reset mid-episode, as an evaluation starts
                out["obs"].append(_cpu(stack.reset(seed=SEED + 1)[0]))
            action = random_actions(stack.single_action_space, num_envs, gen)
            obs, reward, term, trunc, info = stack.step(action)
            final = info.get("_final", torch.zeros(num_envs, dtype=torch.bool))
            out["final"].append(_cpu(final))
            # the step's outputs, AutoReset's final observation
            out["step"].append([_cpu(x) for x in (obs, reward, term, trunc, info.get("final_obs"))])
            if sim_state is not None:
                out["state"].append(sim_state(adapter))
    finally:
        stack.close()
    return {**out, "clips": clips, "dt": adapter.dt}


def same(x, y) -> bool:
    """Bit-identical: tensors of one dtype and equal values (NaNs nowhere), recursively."""
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        both = isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
        return both and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
    if isinstance(x, dict) or isinstance(y, dict):
        both = isinstance(x, dict) and isinstance(y, dict)
        return both and x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    if isinstance(x, list) or isinstance(y, list):
        both = isinstance(x, list) and isinstance(y, list) and len(x) == len(y)
        return both and all(same(a, b) for a, b in zip(x, y))
    return x == y


def check(env_cfg, num_envs, tmp_path, sim_state=None, steps=STEPS, steps_per_frame=1):
    off = run(env_cfg, num_envs, tmp_path / "off", sim_state, steps)
    fps = None if steps_per_frame == 1 else 1.0 / (steps_per_frame * off["dt"])
    on = run(env_cfg, num_envs, tmp_path / "on", sim_state, steps, fps, steps_per_frame)
    # the recorder really rendered: a clip of every episode of env 0, a frame every
    # steps_per_frame steps (and its reset and terminal frames)
    frames = sum(c.num_frames for c in on["clips"])
    assert frames >= steps // steps_per_frame, f"only {frames} frames in {steps} steps"
    assert len(on["clips"]) >= 3
    # episodes ended at different steps in different envs: AutoReset reset envs one at a time
    partial = sum(bool(f.any() and not f.all()) for f in on["final"])
    assert partial >= 2, f"only {partial} partial resets"
    for key in ("obs", "step", "final", "state"):
        a, b = on[key], off[key]
        assert len(a) == len(b), key
        for t, (x, y) in enumerate(zip(a, b)):
            assert same(x, y), f"{key} differs at step {t} with the recorder on:\n{x}\nvs off:\n{y}"


# --------------------------------------------------------------------------- built-in


def test_builtin(tmp_path):
    cfg = BuiltinEnvConfig(max_episode_steps=40, render_width=32, render_height=32)
    check(cfg, 3, tmp_path, sim_state=lambda env: {k: _cpu(v) for k, v in env.state_dict().items()})


# --------------------------------------------------------------------------- gymnasium


def _gym_state(env) -> torch.Tensor:
    """Each CartPole's internal state (not just the observation the adapter returns)."""
    states = [np.asarray(e.unwrapped.state, dtype=np.float64) for e in env.vec.envs]
    return torch.as_tensor(np.stack(states))


def test_gymnasium_cartpole(tmp_path):
    pytest.importorskip("pygame")
    cfg = GymnasiumEnvConfig(
        id="CartPole-v1", max_episode_steps=60, render_width=32, render_height=32,
        resize_frames=True,
    )  # fmt: skip
    check(cfg, 2, tmp_path, sim_state=_gym_state, steps_per_frame=4)


# --------------------------------------------------------------------------- ManiSkill (CPU sim)


def _maniskill_state(env) -> torch.Tensor:
    """ManiSkill's full sim state of each CPU env (every actor's and articulation's pose and
    velocity, joint positions and velocities), as ``BaseEnv.get_state`` gives it."""
    return torch.cat([sub.unwrapped.get_state().clone() for sub in env.vec.envs])


@pytest.mark.maniskill
@pytest.mark.filterwarnings("ignore:__array_wrap__:DeprecationWarning")  # inside ManiSkill
def test_maniskill_cpu_pushcube(tmp_path):
    pytest.importorskip("mani_skill", reason="needs the maniskill extra")
    cfg = ManiSkillEnvConfig(
        id="PushCube-v1", max_episode_steps=50, render_width=32, render_height=32
    )
    check(cfg, 2, tmp_path, sim_state=_maniskill_state, steps=SIM_STEPS, steps_per_frame=10)


# --------------------------------------------------------------------------- Genesis (CPU)


def _genesis_state(env) -> List[torch.Tensor]:
    """The Franka's joint positions and velocities and the goals, as Genesis holds them."""
    task = env.task
    q = torch.as_tensor(task.robot.get_dofs_position()).as_subclass(torch.Tensor)
    v = torch.as_tensor(task.robot.get_dofs_velocity()).as_subclass(torch.Tensor)
    return torch.cat([_cpu(q), _cpu(v), _cpu(task.goal)], dim=1)


@pytest.mark.genesis
def test_genesis_cpu_franka_reach(tmp_path):
    pytest.importorskip("genesis", reason="needs the genesis extra")
    from tests.envs.genesis_util import genesis_cfg

    cfg = genesis_cfg(2, 50)
    check(cfg, 2, tmp_path, sim_state=_genesis_state, steps=SIM_STEPS, steps_per_frame=10)
