"""Every frame is the state it claims: each frame of each clip equals a re-render of the env state
at the step that frame stands for.

A layer right below the recorder (``StateLog``) saves the built-in env's full state (positions,
velocities, goals, step counters) after every reset and every step. After the run, a second
built-in env is set to each saved state and rendered, and the decoded clip (lossless) must equal
those renders pixel for pixel, in order: frame 0 is the state right after the reset that began
the clip's episode; then one frame every ``steps_per_frame`` steps counted from it, and the
terminal step, which is rendered before AutoReset resets the env; a clip cut by its length stops
there. Because the built-in env's image is a pure function of its state and its progress bar
grows on every step, a frame repeated from an earlier step, or taken from a state other than the
one it claims (a frozen pose while physics goes on), differs from the re-render; the last test
checks that the comparison catches exactly such a renderer.

(``test_recorder_frames`` checks clips against the frames the env showed while it ran; this
module checks them against states, re-rendered by another env instance.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import pytest
import torch

from rlrec.envs.autoreset import AutoReset
from rlrec.envs.base import EnvWrapper, as_env_index
from rlrec.envs.builtin import PointReach
from rlrec.record import Recorder
from tests.record.recutil import decode_many, point_reach, random_actions, rec_cfg, sidecar

SIZE = 32
LIMIT = 16  # SIZE / LIMIT = 2 more bar columns every step: consecutive states never look alike
DT = 0.05  # 20 steps per second of sim time


@dataclass
class Snapshot:
    state: Dict[str, torch.Tensor]  # PointReach.state_dict() (cloned)
    done: Optional[torch.Tensor] = None  # terminated | truncated of a step; None after a reset


class StateLog(EnvWrapper):
    """Saves the env's state after every reset and step (below the recorder, above the env)."""

    def __init__(self, env: PointReach):
        super().__init__(env)
        self.steps: List[Snapshot] = []  # steps[s - 1]: after the s-th step
        self.resets: Dict[int, List[tuple]] = {}  # env -> [(steps before it, snapshot)] in order

    def _snap(self, done=None) -> Snapshot:
        state = {k: v.clone() for k, v in self.env.state_dict().items() if k != "rng"}
        return Snapshot(state, done)

    def reset(self, seed=None, env_idx=None):
        out = self.env.reset(seed=seed, env_idx=env_idx)
        snap = self._snap()
        for i in as_env_index(env_idx, self.num_envs, self.device).tolist():
            self.resets.setdefault(i, []).append((len(self.steps), snap))
        return out

    def step(self, action):
        out = self.env.step(action)
        self.steps.append(self._snap(out[2] | out[3]))
        return out


class StaleEveryNth(EnvWrapper):
    """A broken renderer for the last test: every ``n``-th render returns the previous image."""

    def __init__(self, env, n: int):
        super().__init__(env)
        self.n, self.calls, self.last = n, 0, None

    def render(self, env_idx):
        self.calls += 1
        if self.last is not None and self.calls % self.n == 0:
            return self.last.clone()
        self.last = self.env.render(env_idx)
        return self.last.clone()


def expected_states(clip, log: StateLog, env_idx: List[int], spf: int, length) -> tuple:
    """The states the clip's frames stand for (module doc), from the log alone, and the steps of
    the first and the last of them."""
    first = env_idx[0]
    resets = log.resets[first]
    start, snap = resets[clip.episode]  # the episode's reset (episodes counted on env_idx[0])
    assert start == clip.step
    # the episode ends at its terminal step, at the next reset of env `first`, or at the run's end
    end = resets[clip.episode + 1][0] if clip.episode + 1 < len(resets) else len(log.steps)
    states, last = [snap], start
    for s in range(start + 1, end + 1):
        if length is not None and len(states) >= length:
            break
        step = log.steps[s - 1]
        done = bool(step.done[first])
        if (s - start) % spf == 0 or done:
            states.append(step)
            last = s
        if done:
            break
    return states, start, last


def rerender(ref: PointReach, snap: Snapshot, env_idx: List[int]) -> np.ndarray:
    """``ref`` set to the saved state, rendered; the recorded envs side by side (a row: the
    layout of 1 and 2 tiles)."""
    for k, v in snap.state.items():
        getattr(ref, k).copy_(v)
    frames = ref.render(env_idx).numpy()
    return np.concatenate(list(frames), axis=1)


def mismatches(clips, log, env_idx, spf, length, tmp_path, num_envs) -> List[tuple]:
    """``(clip index, frame index)`` of every frame that is not its state (and a count mismatch
    as frame index -1)."""
    ref = point_reach(num_envs, SIZE, LIMIT, seed=123)
    out_dir = tmp_path / "decoded"
    out_dir.mkdir(exist_ok=True)
    decoded = decode_many([c.path for c in clips], (SIZE * len(env_idx), SIZE), out_dir)
    bad = []
    for c, (clip, frames) in enumerate(zip(clips, decoded)):
        states, first_step, last_step = expected_states(clip, log, env_idx, spf, length)
        info = sidecar(clip.path)
        assert info["first_step"] == first_step and info["frames"] == len(frames), clip.path
        # (last_step: see test_the_sidecar_names_the_step_of_the_last_frame)
        assert last_step <= info["last_step"] < last_step + spf, clip.path
        want = [rerender(ref, s, env_idx) for s in states]
        # the comparison can fail: no two consecutive frames a clip must hold look alike
        assert all(not np.array_equal(a, b) for a, b in zip(want, want[1:])), clip.path
        if len(frames) != len(want) or clip.num_frames != len(want):
            bad.append((c, -1))
        bad += [(c, j) for j, (a, b) in enumerate(zip(frames, want)) if not np.array_equal(a, b)]
    return bad


def run(tmp_path, num_envs, env_idx, fps=None, length=None, steps=150, stale_every=None):
    log = StateLog(point_reach(num_envs, SIZE, LIMIT, dt=DT))
    below = StaleEveryNth(log, stale_every) if stale_every else log
    clips: list = []
    cfg = rec_cfg(trigger="always", env_idx=env_idx, fps=fps, length_frames=length)
    rec = Recorder(below, cfg, str(tmp_path / "videos"), on_clip=clips.append)
    stack = AutoReset(rec)
    gen = torch.Generator().manual_seed(1)
    stack.reset(seed=0)
    for t in range(steps):
        if t == 5 and num_envs > 1:
            stack.reset(env_idx=[env_idx[-1]])  # another recorded env restarts: not an episode
        if t == 40:
            stack.reset(env_idx=[env_idx[0]])  # the first recorded env restarts mid-episode
        if t == 90:
            stack.reset(seed=7)  # a full reset mid-episode
        stack.step(random_actions(stack, gen))
    stack.close()  # record_final_episode: the episode in progress is saved too
    return clips, log, rec.engine.steps_per_frame


CASES = {
    "one env, a frame per step": dict(num_envs=1, env_idx=[0]),
    "grid of 2, partial resets, 3 steps per frame": dict(num_envs=3, env_idx=[0, 2], fps=20 / 3),
    "grid of 2 led by env 1, 2 steps per frame, cut by length": dict(
        num_envs=2, env_idx=[1, 0], fps=10, length=4
    ),
    "cut by length, a frame per step": dict(num_envs=2, env_idx=[0], length=5),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_every_frame_is_the_state_it_claims(tmp_path, case):
    kw = CASES[case]
    clips, log, spf = run(tmp_path, **kw)
    expected_spf = {None: 1, 10: 2, 20 / 3: 3}[kw.get("fps")]
    assert spf == expected_spf
    assert len(clips) >= 8, [c.path for c in clips]
    length = kw.get("length")
    if length is not None:  # some clips were cut by their length, not by their episode's end
        assert any(c.num_frames == length for c in clips)
    elif spf > 1:  # whole episodes: terminal frames off the cadence were taken too
        assert any((c.num_frames - 1) * spf > LIMIT for c in clips)
    bad = mismatches(clips, log, kw["env_idx"], spf, length, tmp_path, kw["num_envs"])
    assert bad == [], f"frames that are not the state they claim (clip, frame): {bad}"


def test_a_stale_frame_is_caught(tmp_path):
    """A renderer that repeats its previous image every 7th render (a frozen pose): exactly the
    frames it repeated are reported."""
    env_idx = [0, 1]
    clips, log, spf = run(tmp_path, num_envs=2, env_idx=env_idx, steps=60, stale_every=7)
    bad = mismatches(clips, log, env_idx, spf, None, tmp_path, 2)
    frame_counts = [c.num_frames for c in clips]
    renders = [(c, j) for c, n in enumerate(frame_counts) for j in range(n)]  # in render order
    stale = [renders[i - 1] for i in range(7, len(renders) + 1, 7)]
    # a repeat of the clip's own previous frame, or of the last frame of the clip before it
    assert stale and bad == stale


def test_the_sidecar_names_the_step_of_the_last_frame(tmp_path):
    env_idx = [0, 2]
    clips, log, spf = run(tmp_path, num_envs=3, env_idx=env_idx, fps=20 / 3)
    wanted = [expected_states(clip, log, env_idx, spf, None)[2] for clip in clips]
    assert [sidecar(clip.path)["last_step"] for clip in clips] == wanted
