"""Eval episodes of a run's checkpoint as a LeRobot dataset (LeRobot 0.4's format, codebase
version v3.0; docs/dataset.md): :func:`make`, run by ``python -m rlrec.dataset``.

The checkpoint is loaded and the run's eval env built as ``rlrec.export.verify`` does (the run's
config by ``replay_config``, then the overrides), and the episodes are those of the one eval loop
(:class:`~rlrec.train.evaluation.Evaluator`): each evaluation resets every eval env with
``eval_env.seed`` (env ``i`` the seed ``eval_env.seed + i``) and takes each env's first episode;
the next evaluation's seed follows on (``+ eval_env.num_envs``), so the episodes tried have the
seeds ``eval_env.seed + k``. Row ``t`` of an episode: the observation the policy acted on at step
``t`` (frame 0: the reset), its frames rendered then, the action it took (clamped to the bounds
the env applies), and that step's ``next.reward``, ``next.done``, ``next.success``; the terminal
observation is no row (LeRobot's convention: a row is an observation acted on). While an episode
runs, its rows stay in memory and its frames go to an ffmpeg of its env's; once the evaluation
ended, the kept episodes are appended in order (the rows to one parquet file, each clip set
aside), and at the end each video key's clips are joined by ffmpeg's concat (no second
encoding): memory holds one evaluation's rows, whatever the number of episodes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from rlrec.checks import Choice, ConfigError
from rlrec.envs.factory import resolve_device
from rlrec.files import probe_dir, temporary_name, write_atomic
from rlrec.layout import RunDir
from rlrec.obs import shape_of
from rlrec.ppo.ppo import PPO
from rlrec.record.ffmpeg import FFmpegProcess, encoder_settings, ffmpeg_output_path
from rlrec.record.frames import pad_even
from rlrec.record.wrappers.episodes import env_seed
from rlrec.run.replay import replay_config
from rlrec.train import checkpoint as ckpt
from rlrec.train.evaluation import Evaluator
from rlrec.train.stack import close_all

VERSION = "v3.0"  # LeRobot's codebase_version of the format written (lerobot 0.4.x reads it)
FILE = "chunk-000/file-000"  # one file per stream: LeRobot's first chunk and file
QUANTILES = (1, 10, 50, 90, 99)  # LeRobot's stats: q01 ... q99
GOP = 2  # frames between keyframes, as LeRobot's writer: a random frame decodes fast
EXTRA = "pip install 'rlrec[dataset]' (or pip install -e '.[dataset]' in a checkout)"


class Keep(Choice):
    all = "all"
    success = "success"  # succeeded at some step, as the evaluation counts success
    failed = "failed"  # never succeeded (every episode, where the env reports no success)


@dataclass
class DatasetConfig:
    episodes: int = 0  # the episodes written (required)
    keep: Keep = Keep.all
    step: Optional[int] = None  # the env step of the checkpoint (None: the last)
    dir: Optional[str] = None  # None: the run dir's datasets/step{S}-{keep}
    sample: bool = False  # sampled actions, not the deterministic ones
    tries: Optional[int] = None  # the episodes run at most (None: 10 x episodes)


class Short(RuntimeError):
    """Fewer episodes than asked for were kept within ``dataset.tries``."""


def _stats(x: np.ndarray, axes) -> Dict[str, np.ndarray]:
    """LeRobot's statistics of a feature over ``axes``."""
    out = {"min": x.min(axes), "max": x.max(axes), "mean": x.mean(axes), "std": x.std(axes)}
    out.update({f"q{q:02d}": v for q, v in zip(QUANTILES, np.percentile(x, QUANTILES, axes))})
    return {**out, "count": np.array([len(x)])}


def _merge(a: Optional[dict], b: dict) -> dict:
    """Two features' statistics as one, as LeRobot aggregates them (quantiles: weighted)."""
    if a is None:
        return b
    n = a["count"] + b["count"]
    w = a["count"] / n, b["count"] / n
    out = {k: w[0] * a[k] + w[1] * b[k] for k in a if k == "mean" or k[0] == "q"}
    var = sum(x * (s["std"] ** 2 + (s["mean"] - out["mean"]) ** 2) for x, s in zip(w, (a, b)))
    out.update(min=np.minimum(a["min"], b["min"]), max=np.maximum(a["max"], b["max"]))
    return {**out, "std": np.sqrt(var), "count": n}


def _column(v: np.ndarray):
    import pyarrow as pa

    flat = pa.array(v.reshape(len(v), -1).ravel())
    return flat if v.ndim == 1 else pa.FixedSizeListArray.from_arrays(flat, v.shape[1])


class _Writer:
    """Appends whole episodes to the dataset at ``root``: their rows, their clips (encoded by
    :class:`_Tape`, kept in ``.clips/KEY/`` until :meth:`finish` joins them), metadata and
    statistics; :meth:`finish` writes the videos and ``meta/``."""

    def __init__(self, root: Path, fps: int, task: str):
        self.root, self.fps, self.task = root, fps, task
        self.pq: Dict[str, Any] = {}  # data, episodes: their parquet writers
        self.features: Dict[str, dict] = {}
        self.stats: Dict[str, dict] = {}
        self.n = self.frames = 0

    def _append(self, name: str, table) -> None:
        import pyarrow.parquet as pq

        if name not in self.pq:
            (self.root / name).parent.mkdir(parents=True)
            self.pq[name] = pq.ParquetWriter(self.root / name, table.schema)
        self.pq[name].write_table(table.cast(self.pq[name].schema))

    def add(self, cols: Dict[str, np.ndarray], clips: Dict[str, tuple], meta: dict) -> None:
        import pyarrow as pa

        length, start = len(cols["action"]), self.frames
        cols = {
            **cols,
            "timestamp": np.arange(length, dtype=np.float32) / self.fps,
            "frame_index": np.arange(length),
            "episode_index": np.full(length, self.n),
            "index": np.arange(start, start + length),
            "task_index": np.zeros(length, np.int64),
        }
        self._append(f"data/{FILE}.parquet", pa.table({k: _column(v) for k, v in cols.items()}))
        stats = {k: _stats(v.reshape(length, -1).astype(np.float64), 0) for k, v in cols.items()}
        row = {"episode_index": self.n, "tasks": [self.task], "length": length, **meta}
        for k, v in cols.items():
            shape = [*v.shape[1:]] or [1]
            self.features.setdefault(k, {"dtype": str(v.dtype), "shape": shape, "names": None})
        for key, (path, sample, info) in clips.items():
            names = ["height", "width", "channels"]
            self.features[key] = {"dtype": "video", "shape": info["shape"], "names": names}
            self.features[key]["info"] = info["info"]
            (self.root / ".clips" / key).mkdir(parents=True, exist_ok=True)
            os.replace(path, self.root / f".clips/{key}/{self.n:09d}.mp4")  # joined by finish
            stats[key] = {k: v.reshape(-1, 1, 1) for k, v in _stats(sample, (0, 1, 2)).items()}
            stats[key]["count"] = np.array([len(sample)])
            row.update({f"videos/{key}/chunk_index": 0, f"videos/{key}/file_index": 0})
            row[f"videos/{key}/from_timestamp"] = start / self.fps
            row[f"videos/{key}/to_timestamp"] = (start + length) / self.fps
        row.update({"data/chunk_index": 0, "data/file_index": 0, "dataset_from_index": start})
        row.update({"dataset_to_index": start + length, "meta/episodes/chunk_index": 0})
        row["meta/episodes/file_index"] = 0
        for k, s in stats.items():
            row.update({f"stats/{k}/{name}": v.tolist() for name, v in s.items()})
            self.stats[k] = _merge(self.stats.get(k), s)
        self._append(f"meta/episodes/{FILE}.parquet", pa.Table.from_pylist([row]))
        self.n, self.frames = self.n + 1, start + length

    def _join(self, key: str) -> None:
        """The episodes' clips of ``key`` as one file, in order (ffmpeg's concat: no
        re-encoding; each clip lasts its frames / fps, so episode ``e`` starts at its
        ``from_timestamp``)."""
        import imageio_ffmpeg

        clips = self.root / ".clips" / key
        listed = clips / "list.txt"
        listed.write_text("".join(f"file {p.name}\n" for p in sorted(clips.glob("*.mp4"))))
        out = self.root / f"videos/{key}/{FILE}.mp4"
        out.parent.mkdir(parents=True)
        cmd = [imageio_ffmpeg.get_ffmpeg_exe(), *"-nostdin -loglevel error -f concat".split()]
        cmd += ["-i", ffmpeg_output_path(listed), "-c", "copy", ffmpeg_output_path(out)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=3600)
        shutil.rmtree(clips)

    def finish(self, extra: dict) -> None:
        """Joins each key's clips, ends the parquet files, writes info, stats and tasks."""
        import pandas as pd

        keys = [k for k, f in self.features.items() if f["dtype"] == "video"]
        for key in keys:
            self._join(key)
        self.close()
        (self.root / ".clips").rmdir()
        pd.DataFrame({"task_index": [0]}, index=[self.task]).to_parquet(
            self.root / "meta/tasks.parquet"
        )
        stats = {k: {s: v.tolist() for s, v in st.items()} for k, st in self.stats.items()}
        write_atomic(self.root / "meta/stats.json", json.dumps(stats, indent=2))
        video = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
        info = {
            "codebase_version": VERSION,
            "robot_type": extra["env"],
            "total_episodes": self.n,
            "total_frames": self.frames,
            "total_tasks": 1,
            "chunks_size": 1000,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200,
            "fps": self.fps,
            "splits": {"train": f"0:{self.n}"},
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": video if keys else None,
            "features": self.features,
            "rlrec": extra,
        }
        write_atomic(self.root / "meta/info.json", json.dumps(info, indent=2))

    def close(self) -> None:
        for writer in self.pq.values():
            writer.close()
        self.pq = {}


class _Tape:
    """One evaluation's first episodes, env by env: ``policy`` takes the step's observation, its
    frames (each env's own ffmpeg, one clip per key in ``scratch``) and the action; ``step`` the
    step's outcome."""

    def __init__(self, env, policy, box, scratch: Path, fps: int, encoding: dict):
        self.env, self.act, self.box, self.scratch = env, policy, box, scratch
        self.fps, self.encoding = fps, encoding
        self.open = np.ones(env.num_envs, bool)  # still in its first episode
        self.rows: List[List[list]] = [[] for _ in self.open]
        self.clips: Dict[tuple, Any] = {}  # (env, key): its ffmpeg, sampled frames, the feature
        self.success = False  # whether the env reports success

    def policy(self, obs):
        action = self.act(obs)
        idx = np.flatnonzero(self.open).tolist()
        state = obs.get("state") if isinstance(obs, dict) else obs
        images = {"observation.images.render": self.env.render(idx)}
        if isinstance(obs, dict):  # the policy's image (the newest frame, the last camera)
            images["observation.images.obs"] = obs["rgb"][idx][..., -3:]
        for key, batch in images.items():
            for j, frame in zip(idx, batch.cpu().numpy()):
                frame = pad_even(frame)  # as the recorder pads it for H.264
                if (j, key) not in self.clips:
                    self.clips[j, key] = self._clip(j, key, *frame.shape[:2])
                self.clips[j, key][0].write([frame])
                if len(self.rows[j]) % 10 == 0:  # every 10th frame, at most 64 px high
                    h = self.clips[j, key][2]["shape"][0] // 64 + 1
                    self.clips[j, key][1].append(frame[::h, ::h] / 255.0)
        taken = torch.clamp(action, *self.box) if self.box else action
        state = None if state is None else state.cpu().numpy()
        for j, a in zip(idx, taken.cpu().numpy()):
            self.rows[j].append([None if state is None else state[j], a])
        return action

    def _clip(self, j: int, key: str, h: int, w: int) -> tuple:
        path = str(self.scratch / f"{j}-{key}.mp4")
        info = {"video.height": h, "video.width": w, "video.fps": self.fps, "video.channels": 3}
        fmt = "gbrp" if self.encoding["lossless"] else "yuv420p"  # libx264rgb's is gbrp
        info.update({"video.codec": "h264", "video.pix_fmt": fmt, "video.is_depth_map": False})
        proc = FFmpegProcess(path, w, h, self.fps, self.encoding, threads=1)
        return proc, [], {"shape": [h, w, 3], "info": {**info, "has_audio": False}}

    def step(self, obs, action, out) -> None:
        _, reward, terminated, truncated, info = out
        done, reward = (terminated | truncated).cpu().numpy(), reward.cpu().numpy()
        self.success = "success" in info
        success = info["success"].cpu().numpy() if self.success else done * False
        for j in np.flatnonzero(self.open):
            self.rows[j][-1] += [reward[j], bool(done[j]), bool(success[j])]
        self.open &= ~done

    def episode(self, j: int):
        """The columns and clips of env ``j``'s first episode, and whether it succeeded."""
        state, action, reward, done, success = map(np.array, zip(*self.rows[j]))
        cols = {"action": action, "next.reward": reward.astype(np.float32), "next.done": done}
        if state[0] is not None:
            cols["observation.state"] = np.stack(state).astype(np.float32)
        if self.success:
            cols["next.success"] = success
        clips = {}
        for key in [k for i, k in self.clips if i == j]:
            proc, sample, feature = self.clips.pop((j, key))
            proc.finish()
            clips[key] = (self.scratch / f"{j}-{key}.mp4", np.stack(sample), feature)
        return cols, clips, bool(success.any())

    def close(self) -> None:
        """Ends the clips not taken (an evaluation that raised)."""
        for proc, _, _ in self.clips.values():
            proc.kill()
        for p in self.scratch.iterdir():
            p.unlink()


def _collect(cfg, data: dict, dcfg: DatasetConfig, root: Path, device) -> Dict[str, Any]:
    evaluator = Evaluator(cfg.env, cfg.sim, cfg.eval_env, device=device)
    env, writer = evaluator.env, None
    try:
        seen, saved = shape_of(env.single_observation_space), shape_of(data["obs_shape"])
        if seen != saved:
            raise ConfigError(
                f"the env observes {seen}, the checkpoint's policy {saved}: drop the "
                "overrides that change the observation"
            )
        ppo = PPO(cfg.algo, env.single_observation_space, env.single_action_space, device)
        ppo.load_state_dict(data["ppo"])
        space = env.single_action_space
        box = hasattr(space, "low") and [
            torch.as_tensor(b, device=device) for b in (space.low, space.high)
        ]
        rec, task = cfg.eval_env.recorder, getattr(cfg.env, "id", None) or cfg.env.name
        encoding = {**encoder_settings(rec.quality, rec.lossless, rec.preset), "gop": GOP}
        fps = max(1, round(1 / env.dt))
        writer = _Writer(root, fps, task)
        base, tried = cfg.eval_env.seed, 0
        (root / ".frames").mkdir()
        while writer.n < dcfg.episodes and tried < (dcfg.tries or 10 * dcfg.episodes):
            cfg.eval_env.seed = base + tried  # the evaluator's config: its next reset's seed
            act = lambda obs: ppo.act_inference(obs, deterministic=not dcfg.sample)  # noqa: E731
            tape = _Tape(env, act, box, root / ".frames", fps, encoding)
            try:
                evaluator.run(tape.policy, data["global_step"], on_step=tape.step)
                for j in range(env.num_envs):
                    cols, clips, ok = tape.episode(j)
                    wanted = dcfg.keep in (Keep.all, ("failed", "success")[ok])
                    if wanted and writer.n < dcfg.episodes:
                        meta = {"seed": env_seed(env, base + tried, j), "reset_seed": base + tried}
                        writer.add(cols, clips, {**meta, "env": j})
            finally:
                tape.close()
            tried += env.num_envs
        (root / ".frames").rmdir()
        if writer.n < dcfg.episodes:
            raise Short(
                f"{writer.n} of the {dcfg.episodes} episodes asked for (dataset.keep="
                f"{dcfg.keep}) in the {tried} tried: nothing written (more: dataset.tries=T)"
            )
        extra = {"env": cfg.env.name, "step": data["global_step"], "dt": env.dt, "tried": tried}
        extra.update(keep=str(dcfg.keep), sample=dcfg.sample)
        writer.finish(extra)
        return {"episodes": writer.n, "frames": writer.frames, **extra}
    finally:
        if writer is not None:
            writer.close()
        close_all([env], evaluator)


def make(run_dir, dcfg: DatasetConfig, overrides: List[str] = ()) -> Dict[str, Any]:
    """Writes the dataset of ``dcfg`` from ``run_dir``'s checkpoint (``overrides``: of its
    config, the eval env's), beside its final name and then moved there; lists it in the run
    dir's ``datasets.jsonl``; returns its line. Checked before any work: the extra, the
    checkpoint, the folder (absent or empty), the overrides."""
    if not all(map(importlib.util.find_spec, ("pyarrow", "pandas"))):
        raise ConfigError(f"a dataset needs the 'dataset' extra (pyarrow, pandas): {EXTRA}")
    path, data = ckpt.of_step(RunDir(run_dir).checkpoints, dcfg.step, "dataset.step")
    step = data["global_step"]
    out = Path(dcfg.dir or RunDir(run_dir).dataset(step, dcfg.keep))
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise ConfigError(f"dataset.dir={out} exists and is not an empty folder: name another")
    probe_dir(out.parent, "dataset.dir")
    fixed = ["eval_env.recorder.enabled=false", "eval_env.episodes=null"]
    cfg = replay_config(data["config"], 0, [*overrides, *fixed])
    tmp, made = Path(temporary_name(out)), [p for p in out.absolute().parents if not p.exists()]
    tmp.mkdir(parents=True)
    try:
        ckpt.seed_rng(cfg.seed)
        line = {
            "path": str(out.absolute()),
            **_collect(cfg, data, dcfg, tmp, resolve_device(cfg.sim)),
        }
        os.rename(tmp, out)  # an empty folder there is replaced
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # this command's own, and the folders it made
        for folder in made:
            folder.rmdir()
        raise
    with open(RunDir(run_dir).datasets, "a") as f:
        f.write(json.dumps({**line, "checkpoint": str(path.relative_to(run_dir))}) + "\n")
    return line
