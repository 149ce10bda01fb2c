"""env=genesis from pixels: FrankaReach observing every env's camera image (Genesis's rasterizer
draws a split_envs scene env by env, on the CPU too), the adapter contract on that pixel dict, and
what is refused before work."""

import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.envs import genesis as ga
from rlrec.envs.base import resize_images
from rlrec.envs.config import SimConfig
from rlrec.envs.genesis import GenesisEnvConfig
from rlrec.envs.genesis_tasks import FrankaReach
from tests.envs import test_genesis  # its contract class, not collected twice under a module name
from tests.envs.genesis_util import SIZE
from tests.envs.test_genesis import needs_genesis
from tests.helpers import make_config


def _make(num_envs=2, seed=0, **kw):
    cfg = GenesisEnvConfig(
        num_envs=num_envs,
        max_episode_steps=6,
        render_width=SIZE,
        render_height=SIZE,
        kwargs={"rendered_envs_idx": None},
        **{"obs_width": 40, "obs_height": 36, **kw},
    )
    return ga.make(cfg, SimConfig(), num_envs, torch.device("cpu"), seed)


@needs_genesis
class TestGenesisRgbStateContract(test_genesis.TestGenesisContract):  # its one shared scene
    num_envs = 2

    def make_env(self, num_envs, seed=None):
        return _make(num_envs, seed, obs_mode="rgb_state")


@needs_genesis
def test_the_observation_is_every_envs_camera_image_resized():
    env = _make(3, obs_mode="rgb")
    try:
        assert set(env.single_observation_space) == {"rgb"}
        assert env.single_observation_space["rgb"].shape == (36, 40, 3)
        obs, _ = env.reset(seed=1)
        for _ in range(2):
            assert obs["rgb"].dtype == torch.uint8 and obs["rgb"].shape == (3, 36, 40, 3)
            assert torch.equal(obs["rgb"], resize_images(env.render([0, 1, 2]), (36, 40)))
            obs, *_ = env.step(torch.rand(3, 7) * 2 - 1)
        assert not torch.equal(obs["rgb"][0], obs["rgb"][1])  # each env's own goal and arm
    finally:
        env.close()


class DrawsFirstEnv(FrankaReach):
    """A class of the user's own whose camera draws env 0 only, under a keyword rlrec cannot
    read before the scene is built."""

    def __init__(self, num_envs, **kwargs):
        super().__init__(num_envs, **kwargs, rendered_envs_idx=[0])


@needs_genesis
def test_pixels_from_a_class_that_does_not_draw_every_env_are_refused_naming_the_obs_mode():
    cfg = GenesisEnvConfig(_target_=f"{__name__}.DrawsFirstEnv", obs_mode="rgb", num_envs=2)
    says = r"env.obs_mode=rgb observes every env's camera image, but camera .* draws envs \[0\] "
    with pytest.raises(ConfigError, match=says + r"only \(found once the scene was built\)"):
        ga.make(cfg, SimConfig(), 2, torch.device("cpu"), 0)


def test_pixels_without_every_env_drawn_are_refused_before_work():
    with pytest.raises(
        ConfigError, match=r"env.kwargs.rendered_envs_idx=\[0\] draws only those envs: set .*=null"
    ):
        make_config(["env=genesis", "env.obs_mode=rgb"])  # conf/env/genesis.yaml draws env 0
    with pytest.raises(
        ConfigError,
        match="env.obs_mode=rgb_state observes every env's camera image, but env.camera_attr=null",
    ):
        GenesisEnvConfig(obs_mode="rgb_state", camera_attr=None)
    cfg = make_config(["env=genesis", "env.obs_mode=rgb", "env.kwargs.rendered_envs_idx=null"])
    assert cfg.env.obs_image() == (64, 64, 3)
