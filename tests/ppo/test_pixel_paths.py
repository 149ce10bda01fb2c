"""Every path of a run with image observations (issue 34): one short pixel run of the built-in env
(rgb_state, 36x36, algo.encoder=cnn) that trains, evaluates, records, checkpoints, with
per-episode clips and its report, then its resume, its replay, its policy loaded and exported, the
divergence watch on pixel observations, and two ranks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rlrec.export import export, load_policy
from rlrec.layout import RunDir
from rlrec.ppo.ppo import PPO
from rlrec.run.replay import replay
from rlrec.train import checkpoint as ckpt
from rlrec.train.divergence import Diverged, Watch
from rlrec.train.runner import Runner
from rlrec.train.stack import make_env_stack
from tests.helpers import FAST, make_config, read_metrics, run_train
from tests.record.recutil import decode_many

PIXELS = ["env.obs_mode=rgb_state", "env.obs_width=36", "env.obs_height=36", "algo.encoder=cnn"]
PIXELS += ["env.num_envs=4"]
# 4 iterations of 4 envs x 16 steps; evaluations at steps 0, 128, 256, each with a checkpoint
RUN = [*FAST, *PIXELS, "total_steps=256", "checkpoint_every=2"]
RUN += ["recorder.trigger=step", "recorder.every=128"]
RUN += ["eval_env.clips=all", "eval_env.recorder.lossless=true", "report.enabled=true"]


@pytest.fixture(scope="module")
def pixel_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("pixels")
    run_train([*RUN, f"hydra.run.dir={tmp / 'run'}"], cwd=tmp)
    return tmp / "run"


def _episodes(run_dir: Path):
    return [json.loads(x) for x in RunDir(run_dir).eval_episodes.read_text().splitlines()]


def test_per_episode_clips_and_the_report(pixel_run, tmp_path):
    evals = [m for m in read_metrics(pixel_run) if "eval/success" in m]
    assert [m["step"] for m in evals] == [0, 128, 256]
    records = _episodes(pixel_run)
    assert len(records) == 3 * 2 and all("-env" in r["clip"] for r in records)
    clips = decode_many([str(pixel_run / r["clip"]) for r in records], (32, 32), tmp_path)
    assert [len(c) for c in clips] == [r["length"] + 1 for r in records]  # the reset's frame too
    page = RunDir(pixel_run).report.read_text()
    assert all(f'src="{m["eval/clip"]}"' in page for m in evals)
    assert "python -m rlrec.export ." in page  # it holds for a pixel policy (below)
    assert (pixel_run / "videos" / "progress.mp4").is_file()


def test_the_checkpoint_holds_the_raw_image_and_a_run_continues_from_it(pixel_run, tmp_path):
    data = ckpt.load(pixel_run / "checkpoints" / "last.pt")
    assert data["obs_shape"] == {"rgb": (36, 36, 3), "state": (4,)}
    assert data["next_obs"]["rgb"].dtype == torch.uint8
    assert data["ppo"]["obs_norm"]["mean"].shape == (4,)  # the state part's statistics
    losses = [m["loss/value"] for m in read_metrics(pixel_run) if "loss/value" in m]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)
    assert list((pixel_run / "videos" / "train").glob("*.mp4"))
    last = f"checkpoint={pixel_run}/checkpoints/last.pt"
    resumed = Runner(
        make_config([*FAST, *PIXELS, "recorder=none", "total_steps=384", last]), tmp_path
    )
    resumed.run()
    assert resumed.global_step == 384


def test_replay_of_a_pixel_episode_is_its_clip(pixel_run, tmp_path):
    record = next(r for r in _episodes(pixel_run) if r["step"] == 256 and r["env"] == 1)
    clip = replay(pixel_run, 256, 1, out=tmp_path / "replay")
    a, b = decode_many([str(pixel_run / record["clip"]), str(clip)], (32, 32), tmp_path)
    assert len(a) == record["length"] + 1 and np.array_equal(a, b)


def test_the_policy_loads_and_exports_from_a_pixel_checkpoint(pixel_run, tmp_path):
    """load_policy of the checkpoint and both exports act as PPO itself on the env's own
    observations (TorchScript exactly, ONNX within 1e-5, numpy or torch), and eval_only of the
    TorchScript export evaluates as the run's last evaluation did."""
    cfg = make_config([*FAST, *PIXELS])
    env = make_env_stack(cfg.env, cfg.sim, cfg.env.num_envs, seed=7).env
    ppo = PPO(cfg.algo, env.single_observation_space, env.single_action_space, torch.device("cpu"))
    ppo.load_state_dict(ckpt.load(pixel_run / "checkpoints" / "last.pt")["ppo"])
    env.reset(seed=7)
    obs = env.step(torch.rand(4, 2) * 2 - 1)[0]
    env.close()
    with torch.no_grad():
        want = ppo.act_inference(obs).clamp(-1.0, 1.0)
    assert not torch.equal(want, want[:1].expand_as(want)), "the observations vary the action"
    assert torch.equal(load_policy(pixel_run / "checkpoints" / "last.pt")(obs), want)
    pytest.importorskip("onnxruntime", reason="needs the export extra")
    script, onnx, meta = export(pixel_run, fmt="both")
    assert json.loads(meta.read_text())["observation_space"] == {
        "shape": {"rgb": [36, 36, 3], "state": [4]},
        "dtype": {"rgb": "uint8", "state": "float32"},
    }
    assert torch.equal(load_policy(script)(obs), want)
    got = load_policy(onnx)({k: v.numpy() for k, v in obs.items()})  # numpy in, numpy out
    assert np.abs(got - want.numpy()).max() <= 1e-5
    out = tmp_path / "eval"
    out.mkdir()
    Runner(make_config([*FAST, *PIXELS, "eval_only=true", f"checkpoint={script}"]), out).run()
    (last,) = [m for m in read_metrics(out) if "eval/return" in m]
    assert (
        last["eval/return"]
        == [m for m in read_metrics(pixel_run) if "eval/return" in m][-1]["eval/return"]
    )


def test_the_divergence_watch_reads_the_state_part_of_a_pixel_observation(tmp_path):
    """A NaN in the state part is named as the env's; the image (uint8) is always finite."""
    n = 3

    def obs(nan_env=None):
        o = {"rgb": torch.full((n, 36, 36, 3), 255, dtype=torch.uint8), "state": torch.zeros(n, 4)}
        if nan_env is not None:
            o["state"][nan_env, 2] = math.nan
        return o

    params = [("actor.0.weight", torch.ones(2, 2))]
    watch = Watch(2, n, torch.device("cpu"), tmp_path)
    with watch.rollout(obs(), "iteration 1"):
        watch.step(obs(), torch.zeros(n), {})
        watch.step(obs(), torch.zeros(n), {"final_obs": obs(nan_env=2)})
    with pytest.raises(Diverged, match="env 2 returned a non-finite observation at step 2"):
        watch.check({}, params, "iteration 1")
    rgb_only = Watch(1, n, torch.device("cpu"), tmp_path)
    with rgb_only.rollout({"rgb": obs()["rgb"]}, "iteration 1"):
        rgb_only.step({"rgb": obs()["rgb"]}, torch.zeros(n), {})
    rgb_only.check({}, params, "iteration 1")  # nothing non-finite: no raise


@pytest.mark.slow
def test_two_ranks_train_from_pixels(tmp_path):
    from tests.test_distributed import TWO, _log, start_ranks, wait_ranks

    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    args = [*TWO, *PIXELS, "total_steps=256", "recorder=none", f"hydra.run.dir={run_dir}"]
    codes = wait_ranks(start_ranks(args, tmp_path, logs), timeout=240)
    assert codes == [0, 0], (_log(logs, 0), _log(logs, 1))
    data = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert data["world_size"] == 2 and data["global_step"] == 256
    other = data["ranks"][0]["next_obs"]
    assert other["rgb"].dtype == torch.uint8 and other["rgb"].shape == (4, 36, 36, 3)
    assert not torch.equal(other["rgb"], data["next_obs"]["rgb"])
    assert [m["step"] for m in read_metrics(run_dir) if "eval/success" in m] == [0, 256]
