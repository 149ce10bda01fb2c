"""env=gymnasium against real gymnasium envs (CartPole-v1, Pendulum-v1 from the classic extra).
The recorder over a vector env of held sub-envs (the adapter ``env=gymnasium`` shares with
ManiSkill's CPU sim, ``VectorEnvAdapter``) is tested on ManiSkill: test_maniskill_recording.py."""

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("pygame")  # gymnasium[classic-control] renders with pygame

from rlrec.checks import ConfigError
from rlrec.envs import gymnasium as gym_backend
from rlrec.envs.autoreset import AutoReset
from rlrec.envs.config import SimConfig
from rlrec.envs.factory import make_adapter
from rlrec.envs.gymnasium import GymnasiumEnv, GymnasiumEnvConfig, check_renderable
from rlrec.testing import EnvContract, frame_diff, sample_actions
from tests.helpers import make_config


def _gym(env_id, n, seed=None, **cfg):
    """The adapter of ``env.id=env_id`` with ``cfg`` set in its schema."""
    return GymnasiumEnv(GymnasiumEnvConfig(id=env_id, **cfg), n, seed=seed)


def _resized(size):
    """The schema's keys of frames resized to ``size`` (H, W)."""
    return dict(resize_frames=True, render_height=size[0], render_width=size[1])


class TestCartPoleContract(EnvContract):
    num_envs = 3
    # CartPole draws at 125 px/m with integer pixel coordinates, so a few steps can be sub-pixel:
    # from seed 123 env 0's three contract steps leave its image unchanged. Seed 0 moves it visibly.
    seed = 0

    def make_env(self, num_envs, seed=None):
        return _gym("CartPole-v1", num_envs, seed, max_episode_steps=60)


class TestPendulumContract(EnvContract):
    num_envs = 2

    def make_env(self, num_envs, seed=None):
        return _gym("Pendulum-v1", num_envs, seed, max_episode_steps=30)


class TestCartPoleAsyncContract(EnvContract):
    num_envs = 2
    seed = 0  # see TestCartPoleContract

    def make_env(self, num_envs, seed=None):
        return _gym("CartPole-v1", num_envs, seed, vectorization="async", max_episode_steps=40)


# --------------------------------------------------------------------------- behaviour


def _singles(env_id, n, seed, **kw):
    """n plain gymnasium envs reset the way the adapter seeds its sub-envs (seed + i)."""
    envs = [gym.make(env_id, render_mode="rgb_array", **kw) for _ in range(n)]
    obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)])
    return envs, obs


def test_discrete_actions_match_plain_gymnasium_envs():
    n, seed = 4, 11
    env = _gym("CartPole-v1", n)
    singles, obs_ref = _singles("CartPole-v1", n, seed)
    obs, _ = env.reset(seed=seed)
    assert obs.dtype == torch.float32 and torch.equal(obs, torch.from_numpy(obs_ref))
    rng = np.random.default_rng(0)
    for _ in range(5):
        act = rng.integers(0, 2, size=n)
        obs, rew, term, trunc, _ = env.step(torch.as_tensor(act, dtype=torch.long))
        ref = [s.step(int(a)) for s, a in zip(singles, act)]
        assert torch.equal(obs, torch.from_numpy(np.stack([r[0] for r in ref])))
        assert rew.dtype == torch.float32 and rew.tolist() == [r[1] for r in ref]
        assert term.tolist() == [r[2] for r in ref] and trunc.tolist() == [r[3] for r in ref]
    # [N, 1] long actions (a policy's sample with a trailing dim) are accepted too
    env.step(torch.ones(n, 1, dtype=torch.long))
    env.close()


def test_box_actions_are_clipped_to_bounds():
    a, b = _gym("Pendulum-v1", 2), _gym("Pendulum-v1", 2)
    a.reset(seed=5), b.reset(seed=5)
    obs_a, rew_a, *_ = a.step(torch.full((2, 1), 10.0))
    obs_b, rew_b, *_ = b.step(torch.full((2, 1), 2.0))  # Pendulum's max torque
    assert torch.equal(obs_a, obs_b) and torch.equal(rew_a, rew_b)
    a.close(), b.close()


def test_finished_env_stays_on_its_terminal_state_until_reset():
    env = _gym("CartPole-v1", 2, max_episode_steps=200)
    env.reset(seed=0)
    push = torch.tensor([1, 0])  # env 0 always right: falls within a few dozen steps; env 1 left
    for _ in range(200):
        obs, rew, term, trunc, _ = env.step(push)
        if term[0]:
            break
    assert bool(term[0])
    terminal_obs, terminal_frame = obs[0].clone(), env.render([0])
    obs, rew, term, trunc, _ = env.step(push)  # stepping a finished env is a no-op
    assert torch.equal(obs[0], terminal_obs) and rew[0] == 0 and bool(term[0])
    assert frame_diff(env.render([0]), terminal_frame) == 0
    obs, _ = env.reset(env_idx=[0])
    obs, rew, term, trunc, _ = env.step(push)
    assert rew[0] == 1 and not bool(term[0])
    env.close()


def test_partial_reset_seeds_and_leaves_others_alone():
    n = 3
    env = _gym("CartPole-v1", n)
    env.reset(seed=1)
    for i in range(4):
        before, *_ = env.step(sample_actions(env, seed=i))
    frames_before = env.render(range(n))
    after, _ = env.reset(seed=50, env_idx=torch.tensor([False, True, False]))
    # env 1 is seeded 50 + 1, exactly like a fresh gymnasium env reset with that seed
    fresh = gym.make("CartPole-v1", render_mode="rgb_array")
    ref_obs, _ = fresh.reset(seed=51)
    assert torch.equal(after[1], torch.from_numpy(ref_obs))
    assert torch.equal(env.render([1])[0], torch.from_numpy(fresh.render()))
    assert torch.equal(after[[0, 2]], before[[0, 2]])
    frames_after = env.render(range(n))
    assert torch.equal(frames_after[[0, 2]], frames_before[[0, 2]])
    assert frame_diff(frames_after[1], frames_before[1]) > 0
    env.close()


def test_dt_time_limit_and_spaces():
    cart = _gym("CartPole-v1", 1)
    pend = _gym("Pendulum-v1", 1, max_episode_steps=7)
    car = _gym("MountainCar-v0", 1)  # neither dt nor tau: 1 / render_fps
    assert (cart.dt, cart.max_episode_steps) == (0.02, 500)
    assert (pend.dt, pend.max_episode_steps) == (0.05, 7)
    assert car.dt == pytest.approx(1 / 30)
    assert isinstance(cart.single_action_space, gym.spaces.Discrete)
    assert isinstance(pend.single_action_space, gym.spaces.Box)
    for e in (cart, pend, car):
        e.close()


def test_resize_frames_and_close_twice():
    env = _gym("CartPole-v1", 2, vectorization="async", **_resized((48, 64)))
    env.reset(seed=0)
    frames = env.render([1])
    assert frames.shape == (1, 48, 64, 3) and frames.dtype == torch.uint8
    env.close()
    env.close()


# --------------------------------------------------------------------------- errors before work


def _cfg(**kw):
    return GymnasiumEnvConfig(**kw)


def test_unknown_id_names_key_and_suggests():
    with pytest.raises(ConfigError, match=r"env.id='CartPol-v1'.*CartPole-v1"):
        make_adapter(_cfg(id="CartPol-v1"), SimConfig(), num_envs=2, seed=0)
    with pytest.raises(ConfigError, match=r"env.id='cartpole-v1'.*CartPole-v1"):
        check_renderable(_cfg(id="cartpole-v1"))
    with pytest.raises(ConfigError, match=r"cannot import module 'no_such_module_xyz'"):
        make_adapter(_cfg(id="no_such_module_xyz:Foo-v0"), SimConfig(), num_envs=2, seed=0)


class _NoFrames(gym.Env):
    """A registered env that renders nothing."""

    metadata = {"render_modes": []}
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


if "rlrec-test/NoFrames-v0" not in gym.registry:
    gym.register("rlrec-test/NoFrames-v0", entry_point=_NoFrames, max_episode_steps=10)


def test_env_without_rgb_array_is_refused_when_recording():
    cfg = _cfg(id="rlrec-test/NoFrames-v0")
    with pytest.raises(ConfigError, match=r"env.id='rlrec-test/NoFrames-v0' cannot be recorded"):
        check_renderable(cfg)
    check_renderable(_cfg(id="Pendulum-v1"))  # renders: no error
    # without recording it still trains; asking it for frames is a clear error
    env = make_adapter(cfg, SimConfig(), num_envs=2, seed=0)
    env.reset()
    env.step(torch.zeros(2, dtype=torch.long))
    with pytest.raises(ConfigError, match="cannot render"):
        env.render([0])
    env.close()


# --------------------------------------------------------------------------- hydra config


def test_hydra_config_builds_the_adapter():
    c = make_config(["env=gymnasium", "env.id=Pendulum-v1", "env.num_envs=2", "+env.kwargs.g=9.81"])
    assert isinstance(c.env, GymnasiumEnvConfig) and c.env.vectorization == "sync"
    env = AutoReset(gym_backend.make(c.env, c.sim, num_envs=2, device=torch.device("cpu"), seed=3))
    obs, _ = env.reset()
    assert obs.shape == (2, 3)
    assert env.unwrapped.vec.envs[0].unwrapped.g == 9.81
    env.close()
    # the CartPole preset, with and without naming the env group first
    c = make_config(["env=gymnasium", "env.id=CartPole-v1", "+experiment=cartpole"])
    assert isinstance(c.env, GymnasiumEnvConfig) and c.env.id == "CartPole-v1"


def test_runner_refuses_non_rendering_env_before_work_only_when_recording(tmp_path):
    from rlrec.train.runner import Runner
    from tests.helpers import FAST

    env = (
        "env=gymnasium env.id=rlrec-test/NoFrames-v0 env.num_envs=4 algo.num_minibatches=2".split()
    )
    with pytest.raises(ConfigError, match="cannot be recorded"):
        Runner(make_config([*FAST, *env]), tmp_path)
    assert list(tmp_path.iterdir()) == []
    quiet = ["recorder=none", "eval_env.recorder.enabled=false", "total_steps=64"]
    Runner(make_config([*FAST, *env, *quiet]), tmp_path).run()
    assert (tmp_path / "checkpoints" / "last.pt").is_file()
