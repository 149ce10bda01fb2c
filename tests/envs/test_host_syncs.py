"""Host syncs of the collection step: AutoReset(Recorder(adapter)) + EpisodeStats read the device
at most once per step, also on the steps where episodes end (a partial reset, the recorded env's
included). Counted on the CPU by tests/hostsync.py, standing in for a GPU, where every one of
these reads would stall the training thread until the device caught up."""

from __future__ import annotations

import math

import torch

from rlrec.envs.autoreset import AutoReset
from rlrec.envs.builtin import PointReach
from rlrec.record import Recorder
from rlrec.record.settings import RecorderConfig, Trigger
from rlrec.train.logger import EpisodeStats
from tests.hostsync import HostReads


def test_the_counter_sees_the_reads_of_device_tensors_only():
    with HostReads() as reads:
        flags = torch.tensor([True, False, True], device="cpu")  # "device": named explicitly
        values = torch.arange(3.0, device="cpu")
        bool(flags.any())
        flags.nonzero()
        values[flags]
        values.sum().item()
        host = flags.cpu()  # a read; what follows is on the host
        assert reads.count == 5
        host.nonzero().tolist()
        bool(host.any())
        torch.tensor([1, 2]).tolist()  # made from host data
        torch.where(flags, values, 0.0).sum()  # no read: a masked sum stays on the device
        values.masked_fill_(flags, 0.0)
        assert reads.count == 5, reads.where


def _stack(tmp_path, num_envs=6):
    # episode 0 of env 0 is recorded (a clip from the first reset to its end); later episodes of
    # env 0 end with the recorder armed and idle
    cfg = RecorderConfig(trigger=Trigger.episode, every=1000, env_idx=[0, 3], overlay=True)
    adapter = PointReach(num_envs, max_episode_steps=4, render_width=16, render_height=16, seed=0)
    return AutoReset(Recorder(adapter, cfg, str(tmp_path)))


def test_a_step_reads_the_device_once_also_when_episodes_end(tmp_path):
    gen = torch.Generator().manual_seed(0)
    with HostReads() as reads:
        env = _stack(tmp_path)
        rec = env.find(Recorder)
        stats = EpisodeStats()
        env.reset(seed=0)
        env.step(torch.zeros(6, 2))
        env.reset(env_idx=[1, 4])  # staggered episodes: envs end on different steps
        env.step(torch.zeros(6, 2))
        env.reset(env_idx=[2])
        while rec.recording:  # the clip of episode 0 ends
            env.step(torch.zeros(6, 2))
        assert rec.engine.clips_started == 1
        reads.reset()
        per_step, ended, recorded_env_ended = [], 0, 0
        for _ in range(16):
            action = torch.rand(6, 2, generator=gen) * 2 - 1
            episode = rec.engine.episode
            *_, info = env.step(action)
            stats.add(info)
            per_step.append((reads.count, list(reads.where)))
            reads.reset()
            ended += "_final" in info
            recorded_env_ended += rec.engine.episode != episode
        assert not rec.recording and rec.engine.clips_started == 1  # idle throughout
    assert ended >= 8 and recorded_env_ended >= 3  # partial resets, the recorded env's included
    assert all(n <= 1 for n, _ in per_step), [w for n, w in per_step if n > 1]
    summary = stats.summary()
    assert set(summary) == {"train/return", "train/length", "train/success", "train/episodes"}
    env.close()


def test_episode_stats_are_the_means_of_the_finished_episodes():
    stats = EpisodeStats()
    assert stats.summary() == {}

    def info(ret, length, mask, success=None):
        out = {
            "_final": torch.tensor(mask),
            "episode": {
                "return": torch.tensor(ret),
                "length": torch.tensor(length),
                "_mask": torch.tensor(mask),
            },
        }
        if success is not None:
            out["success"] = torch.tensor(success)
        return out

    stats.add({"step": torch.zeros(3)})  # no episode ended
    # unfinished rows hold anything, even NaN: they never reach the means
    stats.add(info([1.5, math.nan, 4.5], [3, 9, 5], [True, False, True], [True, True, False]))
    stats.add(info([2.0, 6.0, 0.5], [2, 7, 1], [False, True, False]))  # no success reported
    assert stats.summary() == {
        "train/return": 4.0,
        "train/length": 5.0,
        "train/success": 0.5,
        "train/episodes": 3.0,
    }
    assert stats.summary() == {}  # forgotten once read
    stats.add(info([1.0], [1], [True]))
    assert stats.summary() == {"train/return": 1.0, "train/length": 1.0, "train/episodes": 1.0}


def test_a_recording_step_reads_the_device_a_bounded_number_of_times(tmp_path, monkeypatch):
    """While a clip is open (overlay on), the recorder adds to AutoReset's one read: the recorded
    envs' step values (reward, done flags, success) in one read, and per frame one copy of the
    frames and one of the overlay's figures; the clip's end adds one read of its sidecar figures.
    (The built-in env's own render is counted apart: it is the env's business.) The engine reads
    CPU tensors in place (a slice of each, ``tolist()``); here they take the path of tensors on a
    device, which is what is bounded."""
    from rlrec.record import engine as engine_mod

    cpu_view = engine_mod._Recorded.host
    monkeypatch.setattr(
        engine_mod._Recorded,
        "host",
        lambda self, v: None if isinstance(v, torch.Tensor) else cpu_view(self, v),
    )
    gen = torch.Generator().manual_seed(0)
    with HostReads() as reads:
        env = _stack(tmp_path)
        rec = env.find(Recorder)
        env.reset(seed=0)
        assert rec.recording
        reads.reset()
        steps = []
        while rec.recording:
            env.step(torch.rand(6, 2, generator=gen) * 2 - 1)
            ours = [w for w in reads.where if not w[1].startswith("envs/builtin.py")]
            steps.append(ours)
            reads.reset()
    env.close()
    assert len(steps) == 4  # max_episode_steps: the clip ends with its episode
    for ours in steps[:-1]:
        assert len(ours) <= 4, ours  # AutoReset, done flag, frame copy, overlay figures
    assert len(steps[-1]) <= 5, steps[-1]  # and the sidecar's figures


def test_per_episode_clips_read_the_device_once_per_step_for_all_envs(tmp_path):
    """EpisodeClips (eval_env.clips) with every env's clip open, 16 envs, the overlay on: a step
    reads the step's values once and copies the frames once for all the engines together, not
    each engine its own (16 to 64 syncs a step on a GPU sim). The built-in env's own render is
    counted apart: it is the env's business."""
    from rlrec.record.wrappers.episodes import EpisodeClips

    n = 16
    adapter = PointReach(n, max_episode_steps=6, render_width=16, render_height=16, seed=0)
    cfg = RecorderConfig(overlay=True)
    gen = torch.Generator().manual_seed(0)
    with HostReads() as reads:
        env = EpisodeClips(adapter, cfg, str(tmp_path))
        env.reset(seed=0)
        assert all(engine.recording for engine in env.engines)
        steps = []
        for _ in range(4):  # the episodes run on (they end at step 6)
            reads.reset()
            env.step(torch.rand(n, 2, generator=gen) * 2 - 1)
            steps.append([w for w in reads.where if not w[1].startswith("envs/builtin.py")])
        assert all(engine.recording for engine in env.engines)
    env.close()
    for ours in steps:
        assert len(ours) <= 2, ours  # the step's values, the frames
