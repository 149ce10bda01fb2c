"""The dataset of the simulators that run here, checked by LeRobot's LeRobotDataset against the
replay of each episode from its seed (tests/dataset/common.py): ManiSkill's PushCube-v1 on its CPU
sim observing its camera and the robot's state, and Genesis's FrankaReach (one seed per batch:
the episode replays as env ``env`` of a batch reset with ``reset_seed``). One tiny run, one
dataset and one replay each; the GPU sims' rule of one seed per batch also runs on the built-in
env (tests/dataset/test_dataset.py)."""

import importlib.util

import pytest

from rlrec.dataset.__main__ import main
from tests.dataset.common import check_with_lerobot, replay, tiny_run

SMALL = ["env.num_envs=2", "eval_env.num_envs=2", "env.max_episode_steps=4", "algo.num_steps=4"]
SMALL += ["algo.num_minibatches=1", "eval_env.recorder.lossless=true"]
MANISKILL = ["env=maniskill", "env.obs_mode=rgb_state", "env.obs_height=36", "env.obs_width=40"]
GENESIS = ["env=genesis", "env.render_width=64", "env.render_height=64"]


def _check(tmp_path, lerobot, overrides, fps, more=()):
    run = tiny_run(tmp_path / "run", [*overrides, *SMALL])
    root = tmp_path / "dataset"
    assert main([str(run), "dataset.episodes=2", f"dataset.dir={root}", *more]) == 0
    npz = replay(run, root, more)
    return check_with_lerobot(lerobot, tmp_path, [[root, npz, fps, 0]])


@pytest.mark.maniskill
@pytest.mark.filterwarnings("ignore:__array_wrap__:DeprecationWarning")  # inside ManiSkill
@pytest.mark.skipif(importlib.util.find_spec("mani_skill") is None, reason="the maniskill extra")
def test_maniskill_cpu_sim(tmp_path, lerobot):
    out = _check(tmp_path, lerobot, MANISKILL, 20)
    assert "'observation.images.obs': [36, 40, 3]" in out and "[0.0, 0]}" in out


@pytest.mark.genesis
@pytest.mark.skipif(importlib.util.find_spec("genesis") is None, reason="the genesis extra")
def test_genesis_franka_reach(tmp_path, lerobot):
    # rlrec's FrankaReach draws env 0 alone unless told to draw every env
    out = _check(tmp_path, lerobot, GENESIS, 50, ["env.kwargs.rendered_envs_idx=null"])
    assert "'observation.images.render': [64, 64, 3]" in out and "[0.0, 0]}" in out
