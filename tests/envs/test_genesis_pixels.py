"""env=genesis from pixels: FrankaReach observing every env's camera image (Genesis's rasterizer
draws a split_envs scene env by env, on the CPU too), the adapter contract on that pixel dict, and
what is refused before work."""

import numpy as np
import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.envs import genesis as ga
from rlrec.envs.base import resize_images
from rlrec.envs.config import SimConfig
from rlrec.envs.genesis import GenesisEnvConfig
from rlrec.envs.genesis_tasks import FrankaReach
from rlrec.record.settings import RecorderConfig, Trigger
from rlrec.record.wrappers.episodes import ClipChoice
from rlrec.testing import decode
from rlrec.train.stack import close_all, make_env_stack
from tests.envs import test_genesis  # its contract class, not collected twice under a module name
from tests.envs.genesis_util import SIZE
from tests.envs.test_genesis import needs_genesis
from tests.helpers import make_config


def _cfg(num_envs=2, limit=6, **kw):
    return GenesisEnvConfig(
        num_envs=num_envs,
        max_episode_steps=limit,
        render_width=SIZE,
        render_height=SIZE,
        kwargs={"rendered_envs_idx": None},
        **{"obs_width": 40, "obs_height": 36, **kw},
    )


def _make(num_envs=2, seed=0, device="cpu", **kw):
    return ga.make(_cfg(num_envs, **kw), SimConfig(), num_envs, torch.device(device), seed)


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


@needs_genesis
def test_a_recording_pixel_stack_renders_each_state_once(tmp_path, monkeypatch):
    """The eval stack of a pixel run that records and keeps per-episode clips, as train.py
    composes it (``AutoReset(EpisodeClips(Recorder(adapter)))``): the observation, the recorder
    and the clips take their frames from one camera render per reset and step (three before),
    and the clip holds the images of those renders, the terminal one included."""
    rec = RecorderConfig(trigger=Trigger.eval, record_final_episode=False, lossless=True)
    clips = []
    cfg, cpu = _cfg(2, limit=3, obs_mode="rgb"), torch.device("cpu")
    stack = make_env_stack(
        cfg, SimConfig(), 2, 0, rec, str(tmp_path), "eval", clips.append, cpu, ClipChoice()
    )
    camera = stack.env.unwrapped.camera
    real, drawn = camera.render, []  # every image set the camera rendered

    def counted(*args, **kwargs):
        out = real(*args, **kwargs)
        drawn.append(np.array(out[0][..., :3]))
        return out

    monkeypatch.setattr(camera, "render", counted)
    try:
        observed = [stack.env.reset(seed=1)[0]["rgb"]]
        for i in range(3):  # the third step ends both episodes: AutoReset resets them
            action = torch.rand(2, 7, generator=torch.Generator().manual_seed(i)) * 2 - 1
            observed.append(stack.env.step(action)[0]["rgb"])
        assert len(drawn) == 5  # the reset, three steps, AutoReset's reset
        for obs, k in zip(observed, (0, 1, 2, 4)):  # the last step observes the reset state
            assert torch.equal(obs, resize_images(torch.from_numpy(drawn[k]), (36, 40)))
        now = stack.env.unwrapped.render([1, 0])  # served: no render
        assert len(drawn) == 5 and torch.equal(now, torch.from_numpy(drawn[4][[1, 0]]))
        stack.recorder.flush()
    finally:
        close_all([stack.env])
    frames, _ = decode(clips[0].path)  # env 0's episode: the reset, its three steps
    assert np.array_equal(frames, np.stack([d[0] for d in drawn[:4]]))


@needs_genesis
def test_observed_images_are_copied_as_uint8_and_resized_on_the_device(monkeypatch):
    """``meta`` stands for a GPU: the camera's uint8 images go to rlrec's device at their rendered
    size and are resized there (not resized on the CPU in float32 and copied after)."""
    resized = []

    def resize(images, size):
        resized.append(images)
        return resize_images(images, size)

    monkeypatch.setattr(ga, "resize_images", resize)
    env = _make(2, device="meta", obs_mode="rgb_state")
    try:
        obs = [env.reset(seed=1)[0], env.step(torch.zeros(2, 7))[0]]
    finally:
        env.close()
    for images, o in zip(resized, obs, strict=True):
        assert images.device.type == "meta" and images.dtype == torch.uint8
        assert images.shape == (2, SIZE, SIZE, 3)
        assert o["rgb"].device.type == "meta" and o["rgb"].shape == (2, 36, 40, 3)


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
