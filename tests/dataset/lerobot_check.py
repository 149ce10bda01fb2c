"""Run with LeRobot's venv (tests/base_venv.py, ``lerobot_python``), never with rlrec's: loads each
dataset with LeRobot's own ``LeRobotDataset`` and compares every row and decoded frame with what
rlrec's env showed when the episode was replayed from its seed (an .npz the test wrote), and the
statistics of meta/stats.json with those of its rows.

    python lerobot_check.py '[[ROOT, NPZ, FPS, TOLERANCE], ...]'

TOLERANCE: the largest mean absolute difference (0..255) of a decoded frame allowed (0: every
pixel equal, a lossless dataset). Prints one line per dataset; exits non-zero on a mismatch."""

import json
import sys

import numpy as np
from lerobot.datasets.lerobot_dataset import CODEBASE_VERSION, LeRobotDataset

for root, npz, fps, tolerance in json.loads(sys.argv[1]):
    want = np.load(npz)
    ds = LeRobotDataset("rlrec/check", root=root, video_backend="pyav")  # no torchcodec here
    assert ds.meta.info["codebase_version"] == CODEBASE_VERSION, ds.meta.info["codebase_version"]
    assert ds.fps == fps and len(ds) == len(want["reward"]), (ds.fps, len(ds))
    worst = {key: [0.0, 0] for key in ds.meta.video_keys}  # mean, max pixel difference
    for e, ep in enumerate(ds.meta.episodes):
        rows = range(ep["dataset_from_index"], ep["dataset_to_index"])
        assert ep["episode_index"] == e and ep["length"] == len(rows)
        for t, i in enumerate(rows):
            item = ds[i]
            assert (item["episode_index"], item["frame_index"], item["index"]) == (e, t, i)
            assert abs(float(item["timestamp"]) - t / fps) < 1e-6
            assert bool(item["next.done"]) == (t == len(rows) - 1), (e, t)
            assert float(item["next.reward"]) == float(want["reward"][i]), (e, t)
            if "observation.state" in item:
                assert np.array_equal(item["observation.state"].numpy(), want["state"][i]), (e, t)
            for key in ds.meta.video_keys:
                got = (item[key].numpy().transpose(1, 2, 0) * 255).round()
                diff = np.abs(got - want[key.rsplit(".", 1)[1]][i])
                worst[key] = [
                    max(worst[key][0], float(diff.mean())),
                    max(worst[key][1], int(diff.max())),
                ]
    for key in ("action", "observation.state", "next.reward"):  # stats.json: of every row
        if key in ds.meta.stats:
            x = np.asarray(ds.hf_dataset.with_format("numpy")[key], np.float64).reshape(len(ds), -1)
            for stat, want_stat in (("mean", x.mean(0)), ("std", x.std(0)), ("max", x.max(0))):
                assert np.allclose(ds.meta.stats[key][stat], want_stat), (root, key, stat)
    for key, (mean, most) in worst.items():
        assert mean <= tolerance and (tolerance or most == 0), (root, key, mean, most)
    shape = {k: list(ds.meta.shapes[k]) for k in ds.meta.video_keys}
    print(
        f"LeRobotDataset {ds.meta.info['codebase_version']} {root.rsplit('/', 1)[1]}: "
        f"{ds.num_episodes} episodes, {len(ds)} frames, fps {ds.fps}, videos {shape}, "
        f"frame diff vs replay (mean, max) {worst}"
    )
