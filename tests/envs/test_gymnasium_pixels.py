"""env=gymnasium from pixels (rlrec/obs.py): an env whose own observation is an image (Dots, a tiny
env registered here, used as env.id=MODULE:ID), CartPole observing its rendered frame
(env.obs_mode=rgb|rgb_state), the resize to env.obs_height x env.obs_width, env.frame_stack and
its reset, async workers, what is known and refused before work, and short runs of train.py."""

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("pygame")  # CartPole renders with pygame

from rlrec.checks import ConfigError
from rlrec.envs.autoreset import AutoReset
from rlrec.envs.base import resize_images
from rlrec.envs.builtin import PointReach
from rlrec.envs.config import EnvNotBuilt, GymnasiumEnvConfig
from rlrec.envs.gymnasium import GymnasiumEnv, check_ready
from rlrec.testing import EnvContract
from tests.helpers import FAST, make_config, read_metrics, run_train

ID = "rlrec-test/Dots-v0"
MODULE_ID = f"{__name__}:{ID}"


class Dots(gym.Env):
    """A dot of a random colour on a 40x48 image, its own observation (a Box of uint8, HxWxC):
    the action moves it left or right, a bar along the bottom grows with the step count, and the
    episode ends when the dot reaches the left edge. It renders the same image."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    H, W = 40, 48
    observation_space = gym.spaces.Box(0, 255, (H, W, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = int(self.np_random.integers(2, 6)), 0
        self.colour = self.np_random.integers(50, 256, 3).astype(np.uint8)
        return self.render(), {}

    def step(self, action):
        self.x, self.t = min(self.x + (1 if action else -1), self.W - 1), self.t + 1
        return self.render(), float(self.x), self.x <= 0, False, {}

    def render(self):
        image = np.zeros((self.H, self.W, 3), np.uint8)
        image[10:20, self.x] = self.colour
        image[-1, : self.t] = 255
        return image


class Blind(Dots):
    """Dots without frames to render."""

    metadata = {"render_modes": []}


BLIND = "rlrec-test/BlindDots-v0"
if ID not in gym.registry:
    gym.register(ID, entry_point=Dots, max_episode_steps=30)
    gym.register(BLIND, entry_point=Blind)


class TestImageEnvContract(EnvContract):
    """The contract on a dict observation: an env whose own observation is an image."""

    def make_env(self, num_envs, seed=None):
        return GymnasiumEnv(
            GymnasiumEnvConfig(id=ID, obs_height=Dots.H, obs_width=Dots.W), num_envs, seed=seed
        )


class TestBuiltinRgbStateContract(EnvContract):
    """The contract on the built-in env observing its image and its state."""

    def make_env(self, num_envs, seed=None):
        return PointReach(num_envs, seed=seed, obs_mode="rgb_state", obs_width=36, obs_height=36)


def _env(env_id=ID, n=2, **kw):
    return GymnasiumEnv(GymnasiumEnvConfig(id=env_id, **kw), n, seed=5)


def test_an_image_env_observes_its_own_image_resized():
    env = _env(obs_width=36, obs_height=30)
    space = env.single_observation_space
    assert isinstance(space, gym.spaces.Dict) and set(space) == {"rgb"}
    assert space["rgb"].shape == (30, 36, 3) and space["rgb"].dtype == np.uint8
    obs, _ = env.reset(seed=5)
    for _ in range(3):
        own = torch.from_numpy(np.stack([e.unwrapped.render() for e in env.vec.envs]))
        assert obs["rgb"].dtype == torch.uint8 and obs["rgb"].shape == (2, 30, 36, 3)
        assert torch.equal(obs["rgb"], resize_images(own, (30, 36)))
        obs, *_ = env.step(torch.tensor([1, 0]))
    env.close()


def test_cartpole_observes_its_rendered_frame_and_its_state():
    state_env = _env("CartPole-v1")
    state, _ = state_env.reset(seed=5)
    for mode in ("rgb", "rgb_state"):
        env = _env("CartPole-v1", obs_mode=mode, obs_width=40, obs_height=36)
        assert env.single_observation_space["rgb"].shape == (36, 40, 3)
        obs, _ = env.reset(seed=5)
        for _ in range(2):
            frames = resize_images(env.render([0, 1]), (36, 40))
            assert torch.equal(obs["rgb"], frames)
            obs, *_ = env.step(torch.tensor([1, 1]))
        assert set(obs) == ({"rgb", "state"} if mode == "rgb_state" else {"rgb"})
        env.close()
    env = _env("CartPole-v1", obs_mode="rgb_state")
    obs, _ = env.reset(seed=5)
    assert obs["state"].dtype == torch.float32 and torch.equal(obs["state"], state)
    env.close()
    state_env.close()


def test_frame_stack_joins_the_last_images_and_an_autoreset_restarts_the_stack():
    env = AutoReset(_env(frame_stack=3, obs_width=48, obs_height=40))  # the env's own size
    assert env.single_observation_space["rgb"].shape == (40, 48, 9)
    obs, _ = env.reset(seed=5)
    frames = [env.render([0, 1])]
    assert torch.equal(obs["rgb"], frames[0].repeat(1, 1, 1, 3))  # the reset image, three times
    left_right = torch.tensor([0, 1])  # env 0 walks to the left edge and ends, env 1 goes on
    for _ in range(10):
        obs, _, term, _, info = env.step(left_right)
        if bool(term[0]):
            break
        frames.append(env.render([0, 1]))
        assert torch.equal(obs["rgb"], torch.cat(([frames[0]] * 2 + frames)[-3:], dim=-1))
    assert bool(term[0]) and not bool(term[1])
    # env 0 was reset in the same step: its stack is its reset image alone, never the previous
    # episode's images; the final observation holds the ended episode's last three images
    fresh = env.render([0])[0]
    assert torch.equal(obs["rgb"][0], fresh.repeat(1, 1, 3))
    final = info["final_obs"]["rgb"][0]
    assert torch.equal(final[..., :6], torch.cat([frames[-2][0], frames[-1][0]], dim=-1))
    assert not torch.equal(final[..., 6:], fresh)  # the terminal image, at the left edge
    # env 1 goes on: its last image is its current one, the two before are its earlier images
    c = 3
    assert torch.equal(obs["rgb"][1][..., 2 * c :], env.render([1])[0])
    assert torch.equal(obs["rgb"][1][..., c : 2 * c], frames[-1][1])
    obs, *_ = env.step(left_right)
    assert torch.equal(obs["rgb"][0][..., : 2 * c], fresh.repeat(1, 1, 2))
    assert torch.equal(obs["rgb"][0][..., 2 * c :], env.render([0])[0])
    env.close()


def test_async_workers_observe_the_same_images():
    sync, asyn = _env(frame_stack=2), _env(frame_stack=2, vectorization="async")
    a, _ = sync.reset(seed=9)
    b, _ = asyn.reset(seed=9)
    for step in range(4):
        assert torch.equal(a["rgb"], b["rgb"]) and a["rgb"].shape == (2, 64, 64, 6), step
        a, *_ = sync.step(torch.tensor([1, step % 2]))
        b, *_ = asyn.step(torch.tensor([1, step % 2]))
    sync.close()
    asyn.close()


def test_the_observed_image_is_known_and_refused_before_work():
    assert GymnasiumEnvConfig(id=MODULE_ID).obs_image() == (64, 64, 3)  # one probe env built
    assert GymnasiumEnvConfig(id=MODULE_ID, frame_stack=2, obs_width=36).obs_image() == (64, 36, 6)
    assert GymnasiumEnvConfig(id="CartPole-v1").obs_image() is None
    cfg = GymnasiumEnvConfig(id="CartPole-v1", obs_mode="rgb_state", frame_stack=4)
    assert cfg.obs_image() == (64, 64, 12)
    with pytest.raises(ConfigError, match="env.frame_stack=2 stacks images, but env.id='Cart"):
        GymnasiumEnvConfig(id="CartPole-v1", frame_stack=2).obs_image()
    # an env that cannot be built is refused as the backend's check before work refuses it
    with pytest.raises(ConfigError, match="is not a registered gymnasium id: did you mean Cart"):
        make_config(["env=gymnasium", "env.id=CartPol-v1", "env.frame_stack=2"])
    with pytest.raises(ConfigError, match="env.kwargs.bogus is not a keyword argument"):
        make_config(["env=gymnasium", "env.frame_stack=2", "+env.kwargs.bogus=1"])
    # the probe alone (no validation around it) raises with the env's own error
    with pytest.raises(EnvNotBuilt, match="env.id='CartPol-v1' cannot be built: .*CartPol"):
        GymnasiumEnvConfig(id="CartPol-v1", frame_stack=2).obs_image()
    with pytest.raises(ConfigError, match="env.frame_stack=0 is invalid"):
        GymnasiumEnvConfig(frame_stack=0)
    make_config(["env=gymnasium", f"env.id={MODULE_ID}", "algo.encoder=cnn"])  # an image: cnn
    with pytest.raises(ConfigError, match="cnn reads an image but env=gymnasium observes"):
        make_config(["env=gymnasium", "env.id=CartPole-v1", "algo.encoder=cnn"])
    with pytest.raises(ConfigError, match="algo.encoder=mlp on the raw image 64x64x6"):
        make_config(["env=gymnasium", f"env.id={MODULE_ID}", "env.frame_stack=2"])
    check_ready(GymnasiumEnvConfig(id=MODULE_ID, obs_mode="rgb"))  # Dots renders its frames
    with pytest.raises(
        ConfigError,
        match=r"BlindDots-v0' cannot observe env.obs_mode=rgb.*Observe with env.obs_mode=state",
    ):
        check_ready(GymnasiumEnvConfig(id=BLIND, obs_mode="rgb"))


@pytest.mark.parametrize(
    "args",
    [
        ["env.id=CartPole-v1", "env.obs_mode=rgb", "env.obs_width=36", "env.obs_height=36"],
        [f"env.id={MODULE_ID}", "env.frame_stack=2", "env.vectorization=async"],
    ],
    ids=["cartpole-rgb", "image-env-stacked-async"],
)
def test_train_py_runs_a_cnn_from_pixels(tmp_path, args):
    run_dir = tmp_path / "run"
    more = (
        "env=gymnasium env.num_envs=2 env.max_episode_steps=20 algo.encoder=cnn algo.num_steps=32"
    )
    more += " eval_env.every=1 eval_env.recorder.enabled=false recorder=none total_steps=128"
    run_train([*FAST, *more.split(), *args, f"hydra.run.dir={run_dir}"], tmp_path, timeout=600)
    assert [m for m in read_metrics(run_dir) if "eval/return" in m][-1]["step"] == 128
    from rlrec.train import checkpoint as ckpt

    data = ckpt.load(run_dir / "checkpoints" / "last.pt")
    shape = (36, 36, 3) if "env.id=CartPole-v1" in args else (64, 64, 6)
    assert data["obs_shape"] == {"rgb": shape} and data["next_obs"]["rgb"].dtype == torch.uint8
