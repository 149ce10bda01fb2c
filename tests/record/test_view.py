"""``recorder.view``: a clip shows the policy's own observation (``obs``), or the render with it
beside (``both``), and the observation tile of each frame is exactly the observation the policy
acted on at that step: the reset observation first, the final observation (AutoReset's
``final_obs``) last, across a partial reset of the recorded env while the others run on. The clips
are lossless and decoded, and compared with the observations logged above the stack."""

from __future__ import annotations

from operator import attrgetter

import numpy as np
import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.envs.autoreset import AutoReset
from rlrec.envs.builtin import PointReach
from rlrec.record import Recorder
from rlrec.record.settings import RecorderConfig
from rlrec.record.wrappers.episodes import ClipChoice, EpisodeClips
from rlrec.record.wrappers.view import obs_frames
from tests.helpers import make_config
from tests.record.recutil import Spy, decode, random_actions, rec_cfg

# render 40 x 48, observation 16 x 16: upscaled twice (48 // 16 = 3 does not fit the height)
RENDER_H, RENDER_W, OBS, UP = 40, 48, 16, 2


def _env(num_envs: int, limit: int = 10) -> PointReach:
    kw = dict(render_width=RENDER_W, render_height=RENDER_H, obs_width=OBS, obs_height=OBS)
    return PointReach(num_envs, max_episode_steps=limit, seed=0, obs_mode="rgb", **kw)


def _up(image: torch.Tensor) -> np.ndarray:
    """The logged observation as the clip must show it: each pixel a UP x UP block."""
    return np.repeat(np.repeat(image.cpu().numpy(), UP, 0), UP, 1)


@pytest.mark.parametrize("view", ["obs", "both"])
def test_obs_tile_of_every_frame_is_the_observation_acted_on(tmp_path, view):
    spy = Spy(_env(3), watch=1)  # the render of env 1 at every reset and step
    cfg = rec_cfg(trigger="always", env_idx=[1], view=view)
    stack = AutoReset(Recorder(spy, cfg, str(tmp_path)))
    gen = torch.Generator().manual_seed(0)
    obs, _ = stack.reset(seed=3)
    clips = [[obs["rgb"][1]]]  # per episode of env 1: the observations its clip must show
    for t in range(25):
        if t == 3:  # envs 0 and 2 restart: env 1's episodes then end while they run on
            obs, _ = stack.reset(env_idx=torch.tensor([0, 2]))
        obs, _, terminated, truncated, info = stack.step(random_actions(stack, gen))
        done = (terminated | truncated).tolist()
        if done[1]:
            assert done == [False, True, False]  # a partial reset of the recorded env alone
            final = info["final_obs"]["rgb"][1]
            assert not torch.equal(final, obs["rgb"][1])  # the comparison tells them apart
            clips[-1].append(final)  # the terminal frame: the final observation
            clips.append([obs["rgb"][1]])  # the next clip's first frame: the reset observation
        else:
            clips[-1].append(obs["rgb"][1])
    stack.close()  # saves the episode in progress
    paths = sorted(tmp_path.glob("*.mp4"))
    assert [len(c) for c in clips] == [11, 11, 6] and len(paths) == 3
    for path, expected, rendered in zip(paths, clips, spy.episodes):
        frames, _ = decode(str(path))
        assert len(frames) == len(expected)
        tiles = [_up(image) for image in expected]
        size = OBS * UP
        if view == "obs":
            assert frames.shape[1:] == (size, size, 3)
            assert all(np.array_equal(f, tile) for f, tile in zip(frames, tiles))
        else:  # the render, then the observation padded with black rows to the render's height
            assert frames.shape[1:] == (RENDER_H, RENDER_W + size, 3)
            assert all(np.array_equal(f[:, :RENDER_W], r) for f, r in zip(frames, rendered))
            assert all(np.array_equal(f[:size, RENDER_W:], t) for f, t in zip(frames, tiles))
            assert not frames[:, size:, RENDER_W:].any()


def test_per_episode_clips_show_the_observation(tmp_path):
    env = EpisodeClips(_env(2, limit=6), rec_cfg(view="obs"), str(tmp_path), choice=ClipChoice())
    stack = AutoReset(env)
    obs, _ = stack.reset(seed=5)
    seen = {i: [obs["rgb"][i]] for i in range(2)}
    for _ in range(6):
        obs, _, terminated, truncated, info = stack.step(torch.zeros(2, 2))
        for i in range(2):
            last = info["final_obs"] if bool(terminated[i] | truncated[i]) else obs
            seen[i].append(last["rgb"][i])
    placed = env.settle({0: (None, 0.0), 1: (None, 0.0)})
    for i, clip in placed.items():
        frames, _ = decode(clip.path)
        assert len(frames) == 7
        assert all(np.array_equal(f, _up(image)) for f, image in zip(frames, seen[i]))
    assert sorted(placed) == [0, 1]
    stack.close()


def test_obs_frames_channels_and_sizes_that_do_not_divide():
    rgb = torch.randint(0, 256, (2, 3, 2, 6), dtype=torch.uint8)  # two frames stacked, oldest first
    out = obs_frames(rgb, (7, 5))  # 7 // 3 = 2, 5 // 2 = 2: a 6 x 4 tile, never stretched
    assert out.shape == (2, 6, 4, 3)
    assert torch.equal(out[:, ::2, ::2], rgb[..., 3:])  # the newest frame
    grey = torch.randint(0, 256, (1, 4, 4, 3), dtype=torch.uint8)  # three grey frames stacked
    assert torch.equal(obs_frames(grey, (2, 2), 1), grey[..., 2:].expand(1, 4, 4, 3))  # not RGB
    rgba = torch.randint(0, 256, (1, 4, 4, 8), dtype=torch.uint8)  # two RGBA frames stacked
    assert torch.equal(obs_frames(rgba, (4, 4), 4), rgba[..., 4:7])  # the newest frame's RGB


@pytest.mark.parametrize("key", ["recorder", "eval_env.recorder"])
def test_a_view_of_the_observation_needs_an_image(key):
    with pytest.raises(ConfigError, match=rf"{key}\.view=obs .*env\.obs_mode=rgb.*{key}\.view="):
        make_config([f"{key}.view=obs"])  # the built-in env observes state by default
    cfg = make_config(["+experiment=builtin_pixels", f"{key}.view=both"])
    assert attrgetter(key)(cfg).view == "both"


def test_a_view_is_refused_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match=r"recorder\.view=both .*observes none"):
        Recorder(PointReach(2), rec_cfg(view="both"), str(tmp_path / "v"))
    assert not (tmp_path / "v").exists()
    with pytest.raises(ConfigError, match=r"recorder\.view='pixels' .*render, obs, both"):
        RecorderConfig(view="pixels").check(1)
