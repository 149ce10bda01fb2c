"""Shared by tests/dataset: a run dir with a checkpoint, the replay of a dataset's episodes from
their seeds, and LeRobot's own check of a dataset (lerobot_check.py in LeRobot's venv)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import List, Sequence

import numpy as np
import torch

from rlrec.envs.factory import make_adapter
from rlrec.layout import RunDir
from rlrec.run.replay import replay_config
from rlrec.train import checkpoint as ckpt
from rlrec.train.runner import Runner
from tests.helpers import FAST, make_config

HERE = Path(__file__).resolve().parent


def tiny_run(run_dir: Path, overrides: Sequence[str] = ()) -> Path:
    """One iteration of training, no evaluation, no clip: a run dir with its checkpoint."""
    cfg = make_config([*FAST, "eval_env.enabled=false", "recorder=none", *overrides])
    cfg.total_steps = cfg.env.num_envs * cfg.algo.num_steps
    run_dir.mkdir()
    Runner(cfg, run_dir).run()
    return run_dir


def replay(run_dir: Path, root: Path, overrides: Sequence[str] = ()) -> Path:
    """Each episode of the dataset at ``root`` replayed on the env the command built (the run's
    config and the same ``overrides``): a full reset with its ``reset_seed``, then its actions,
    for env ``env`` of the batch. What the env showed at each row (its reward, state, render and
    observation image) goes to ``ROOT.npz`` beside the dataset; returns that path."""
    import pyarrow.parquet as pq

    data = pq.read_table(root / "data/chunk-000/file-000.parquet").to_pydict()
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    saved = ckpt.of_step(RunDir(run_dir).checkpoints, None, "step")[1]["config"]
    cfg = replay_config(saved, 0, list(overrides))
    env = make_adapter(cfg.env, cfg.sim, cfg.eval_env.num_envs, None, device=torch.device("cpu"))
    seen: dict = {"reward": [], "state": [], "render": [], "obs": []}
    try:
        for ep in episodes:
            j = ep["env"]
            obs, _ = env.reset(seed=ep["reset_seed"])
            for a in data["action"][ep["dataset_from_index"] : ep["dataset_to_index"]]:
                seen["render"].append(env.render([j])[0].numpy())
                state = obs.get("state") if isinstance(obs, dict) else obs
                if isinstance(obs, dict):
                    seen["obs"].append(obs["rgb"][j, ..., -3:].numpy())
                if state is not None:
                    seen["state"].append(state[j].numpy())
                action = torch.as_tensor(a)
                obs, reward, *_ = env.step(action.expand(env.num_envs, *action.shape))
                seen["reward"].append(float(reward[j]))
    finally:
        env.close()
    path = root.parent / f"{root.name}.npz"
    np.savez(path, **{k: np.array(v) for k, v in seen.items()})
    return path


def check_with_lerobot(python: Path, tmp: Path, datasets: List[list]) -> str:
    """LeRobot's LeRobotDataset loads each ``[root, npz, fps, tolerance]`` and compares it with
    the replay (lerobot_check.py); its printed lines."""
    env = {**os.environ, "HF_HOME": str(tmp / "hf"), "HF_LEROBOT_HOME": str(tmp / "lerobot")}
    proc = subprocess.run(
        [str(python), str(HERE / "lerobot_check.py"), json.dumps(datasets, default=str)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return proc.stdout
