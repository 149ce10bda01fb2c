"""LeRobot's own LeRobotDataset (its venv) loads what ``python -m rlrec.dataset`` writes, and every
row and decoded frame is what the env showed when the episode is replayed from its seed: the
built-in env (state, lossless and lossy; pixels) and Gymnasium's CartPole (a discrete action;
state and pixels)."""

import json

import pyarrow.parquet as pq
import pytest

from rlrec.dataset.__main__ import main
from tests.dataset.common import check_with_lerobot, replay, tiny_run

LOSSLESS = "eval_env.recorder.lossless=true"
CARTPOLE = ["env=gymnasium", "env.id=CartPole-v1", "env.resize_frames=true"]
PIXELS = ["env.obs_mode=rgb", "env.obs_height=36", "env.obs_width=36", "algo.encoder=mlp"]


def _made(run, name, n, *overrides):
    """The dataset ``name`` of ``n`` episodes, and its replay, for LeRobot's check."""
    root = run.parent / f"dataset-{name}"
    assert main([str(run), f"dataset.episodes={n}", f"dataset.dir={root}", *overrides]) == 0
    return root, replay(run, root, overrides)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    return {
        "builtin": tiny_run(tmp / "builtin"),
        "pixels": tiny_run(tmp / "pixels", ["+experiment=builtin_pixels"]),
        "cartpole": tiny_run(tmp / "cartpole", CARTPOLE),
        "cartpole_rgb": tiny_run(tmp / "cartpole_rgb", [*CARTPOLE, *PIXELS]),
    }


def test_lerobot_loads_the_episodes_as_the_env_showed_them(runs, lerobot, tmp_path):
    short = ["eval_env.num_envs=3", "env.max_episode_steps=12"]
    made = [
        # two evaluations (3 envs each): the seeds go on from one to the next
        (*_made(runs["builtin"], "state", 4, *short, LOSSLESS), 20, 0),
        (*_made(runs["builtin"], "lossy", 2, *short), 20, 3.0),  # x264 crf 15, yuv420p
        (*_made(runs["pixels"], "pixels", 2, *short, LOSSLESS), 20, 0),
        (*_made(runs["cartpole"], "cartpole", 2, "eval_env.num_envs=2", LOSSLESS), 50, 0),
        (*_made(runs["cartpole_rgb"], "cartpole_rgb", 2, "eval_env.num_envs=2", LOSSLESS), 50, 0),
    ]
    out = check_with_lerobot(lerobot, tmp_path, [list(m) for m in made])
    print(out)
    lines = out.splitlines()
    assert len(lines) == 5 and all(line.startswith("LeRobotDataset v3.0") for line in lines)
    assert "'observation.images.obs': [36, 36, 3]" in lines[2]  # the policy's image, and
    assert "'observation.images.render': [32, 32, 3]" in lines[2]  # the render view
    state = made[0][0]
    eps = pq.read_table(state / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    base = 1_000_000  # eval_env.seed: episode k began with seed + k, as eval env k of the batch
    assert [(e["seed"], e["reset_seed"], e["env"]) for e in eps] == [
        (base, base, 0),
        (base + 1, base, 1),
        (base + 2, base, 2),
        (base + 3, base + 3, 0),
    ]
    info = json.loads((state / "meta/info.json").read_text())
    assert info["fps"] == 20 and info["rlrec"]["dt"] == 0.05 and info["rlrec"]["tried"] == 6
    cart = json.loads((made[3][0] / "meta/info.json").read_text())["features"]["action"]
    assert cart == {"dtype": "int64", "shape": [1], "names": None}
