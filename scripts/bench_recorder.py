"""What the recorder costs the training thread, measured side by side in one run.

    python scripts/bench_recorder.py                 # 64 envs, 256x256 frames, 5,000-frame clip
    python scripts/bench_recorder.py --quick         # smaller counts, for a smoke run
    python scripts/bench_recorder.py --gym-wrapper-only   # RecordVectorVideo vs RecordVideo

On the built-in env (PointReach, zero actions so no episode ends): steps/s with no recorder, with
a recorder armed but idle (cubic trigger between scheduled episodes), with a layer that only
renders the recorded env and copies its frame once per step into a reused buffer (the least
recording can cost), and while recording every step; the peak RSS growth of this process over one
5,000-frame clip (and the peak RSS of the ffmpeg process).

The target ratio is what a recording step adds over a plain step, divided by what the
render+copy step adds over a plain step: ``(recording - none) / (render_copy - none)``, in the
training thread's own CPU time (``time.thread_time``: the recorder's work, and whatever its
encoder thread and ffmpeg cost the training thread's caches and GIL turns; not the cores they take
from it). The four stacks are built on the same env (same size, same frames: one render of env 0
per step), take turns in each round, and the ratio is taken within each round and its median
reported with its quartiles. The same ratio in wall time (which also counts waiting for a core or
for the GIL, and the flush of the encoder after each recording block) is printed beside it.
Then Gymnasium's vector RecordVideo for comparison: on the same PointReach frames through a
minimal gymnasium VectorEnv shim, and on 8 CartPole envs. It holds every frame in memory until
the clip ends, so its RSS growth is measured over a shorter clip and scaled to 5,000 frames.
Last, rlrec's drop-in RecordVectorVideo against Gymnasium's vector RecordVideo on the same 8
CartPole envs recording env 0: its armed idle cost per step, both recorders' throughput while
recording every step (encoding included), and the RSS growth over a 5,000-frame clip.

Timings are medians over interleaved rounds (the configurations take turns), so load from other
processes hits all of them alike. Torch runs single-threaded (``--threads``): the env's tensors
are small and a 2-core machine shared with an encoder thread only loses to thread contention.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from rlrec.envs.autoreset import AutoReset  # noqa: E402
from rlrec.envs.base import EnvWrapper  # noqa: E402
from rlrec.envs.builtin import PointReach  # noqa: E402
from rlrec.record import Recorder  # noqa: E402
from rlrec.record.settings import RecorderConfig, Trigger


# ----------------------------------------------------------------------------- memory
def _status(pid: int | str, field: str) -> float:
    """A ``/proc/PID/status`` field (VmRSS, VmHWM) in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak_rss() -> bool:
    """Resets this process's VmHWM to its current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# ----------------------------------------------------------------------------- rlrec stacks
def point_reach(args) -> PointReach:
    return PointReach(
        args.num_envs,
        render_width=args.size,
        render_height=args.size,
        max_episode_steps=10**9,
        seed=0,
    )


def time_per_call(fn: Callable[[], object], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def times_per_call(fn: Callable[[], object], n: int) -> tuple:
    """(wall seconds, this thread's CPU seconds) per call. CPU time is what the training thread
    itself spends; wall time also counts waiting for a core held by other threads/processes."""
    w0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(n):
        fn()
    return (time.perf_counter() - w0) / n, (time.thread_time() - c0) / n


class Timed(EnvWrapper):
    """Bench-only layer right above the adapter: accumulates the training thread's wall and CPU
    time inside the adapter's step and render, so the recorder's own share can be separated from
    them within the same steps (robust to load from other processes)."""

    def __init__(self, env):
        super().__init__(env)
        self.t = {"step": [0.0, 0.0], "render": [0.0, 0.0]}

    def _timed(self, key, fn, *a):
        w0, c0 = time.perf_counter(), time.thread_time()
        out = fn(*a)
        acc = self.t[key]
        acc[0] += time.perf_counter() - w0
        acc[1] += time.thread_time() - c0
        return out

    def step(self, action):
        return self._timed("step", self.env.step, action)

    def render(self, env_idx):
        return self._timed("render", self.env.render, env_idx)


class RenderCopy(EnvWrapper):
    """Bench-only layer: what the training thread pays at the least to record one env: after
    each step, the render of env 0 and one copy of the frame (into a reused buffer)."""

    def __init__(self, env):
        super().__init__(env)
        self.buffer = None

    def step(self, action):
        out = self.env.step(action)
        frame = self.env.render([0])
        if self.buffer is None:
            self.buffer = torch.empty_like(frame, device="cpu")
        self.buffer.copy_(frame)
        return out


def rlrec_stack(args, video_dir: str, mode: str):
    """``mode``: none | idle | render_copy | recording. Returns (stack, recorder or None, Timed)."""
    env = Timed(point_reach(args))
    rec = None
    if mode == "render_copy":
        return AutoReset(RenderCopy(env)), None, env
    if mode == "idle":
        rec = Recorder(env, RecorderConfig(trigger=Trigger.cubic), video_dir)
        rec.load_state_dict({"episode": 1, "steps": 0, "clips_saved": 0})  # next reset: episode 2
    elif mode == "recording":
        rec = Recorder(
            env, RecorderConfig(trigger=Trigger.always, filename=f"{mode}.mp4"), video_dir
        )
    stack = AutoReset(rec if rec is not None else env)
    stack.reset(seed=0)
    return stack, rec, env


def bench_rlrec(args, video_dir: str) -> Dict[str, float]:
    """Per step, wall and CPU: the whole stack, and the adapter's step and render inside it."""
    stacks = {
        m: rlrec_stack(args, video_dir, m) for m in ("none", "idle", "render_copy", "recording")
    }
    action = torch.zeros(args.num_envs, 2)
    copy_src = stacks["none"][2].env.render([0])
    steps = {
        "none": args.fast_steps,
        "idle": args.fast_steps,
        "render_copy": args.rec_steps,
        "recording": args.rec_steps,
    }
    samples: Dict[str, List[tuple]] = {m: [] for m in stacks}
    copies: List[tuple] = []
    for stack, _, _ in stacks.values():  # warm-up (the recording stack starts its ffmpeg here)
        stack.step(action)
    for _ in range(args.rounds):  # the configurations take turns
        for mode, (stack, _, timed) in stacks.items():
            for acc in timed.t.values():
                acc[0] = acc[1] = 0.0
            n = steps[mode]
            total = times_per_call(lambda stack=stack: stack.step(action), n)
            if mode == "recording":
                # the frames still queued are encoded now, their wait charged to this block's
                # wall time: the encoder's work lands on recording, not on the next block
                t0 = time.perf_counter()
                stacks[mode][1].flush()
                total = (total[0] + (time.perf_counter() - t0) / n, total[1])
            samples[mode].append(total + tuple(v / n for acc in timed.t.values() for v in acc))
        copies.append(times_per_call(lambda: copy_src.clone(), args.rec_steps))
    rec = stacks["recording"][1]
    rec.flush()
    assert not rec.errors, rec.errors
    for stack, _, _ in stacks.values():
        stack.close()
    out: Dict[str, float] = {}
    names = ("wall", "cpu", "step_wall", "step_cpu", "render_wall", "render_cpu")
    for mode, rows in samples.items():
        for i, name in enumerate(names):
            out[f"{mode}:{name}"] = statistics.median(r[i] for r in rows)
        # what the layers above the adapter add to each step (AutoReset, and the recorder if any)
        for kind in ("wall", "cpu"):
            total, step, render = (names.index(k) for k in (kind, "step_" + kind, "render_" + kind))
            layer = [r[total] - r[step] - r[render] for r in rows]
            out[f"{mode}:layers_{kind}"] = statistics.median(layer)
    # The target, paired within each round (the machine's speed drifts between rounds): what
    # recording adds to a step over what the render+copy stack adds.
    for i, kind in enumerate(("wall", "cpu")):
        ratios = sorted(
            (rec[i] - none[i]) / (least[i] - none[i])
            for none, least, rec in zip(
                samples["none"], samples["render_copy"], samples["recording"]
            )
        )
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        out[f"ratio:{kind}"], out[f"ratio:{kind}:q1"], out[f"ratio:{kind}:q3"] = q[1], q[0], q[2]
    out["idle_call"] = idle_call_cost()
    out["copy:wall"] = statistics.median(c[0] for c in copies)
    out["copy:cpu"] = statistics.median(c[1] for c in copies)
    return out


def idle_call_cost() -> float:
    """Seconds per step the armed idle recorder adds, isolated from any env: the best of 50 short
    runs of Recorder.step over an adapter whose step returns a ready result (load-independent)."""
    import timeit

    class Ready(EnvWrapper):
        def step(self, action):
            return ready

    env = PointReach(4, render_width=16, render_height=16, max_episode_steps=10**9)
    env.reset(seed=0)
    action = torch.zeros(4, 2)
    ready = env.step(action)
    bare = Ready(env)
    rec = Recorder(
        bare, RecorderConfig(trigger=Trigger.cubic), tempfile.mkdtemp(prefix="rlrec-bench-")
    )
    rec.load_state_dict({"episode": 1, "steps": 0, "clips_saved": 0})
    rec.reset(seed=0)
    n = 2000  # the best of many short runs: one that another process preempts is not the best
    t_bare = min(timeit.repeat(lambda: bare.step(action), number=n, repeat=50)) / n
    t_rec = min(timeit.repeat(lambda: rec.step(action), number=n, repeat=50)) / n
    rec.close()
    shutil.rmtree(rec.engine.video_dir, ignore_errors=True)
    return t_rec - t_bare


def rss_over_clip(args, video_dir: str) -> Dict[str, float]:
    """Peak RSS growth of this process while one ``args.clip_frames``-frame clip is recorded."""
    env = point_reach(args)
    cfg = RecorderConfig(trigger=Trigger.always, length_frames=args.clip_frames, filename="rss.mp4")
    rec = Recorder(env, cfg, video_dir)
    stack = AutoReset(rec)
    action = torch.zeros(args.num_envs, 2)
    stack.reset(seed=0)
    for _ in range(20):  # ffmpeg started, queue and allocator warm
        stack.step(action)
    rec.flush()
    base = _status("self", "VmRSS")
    exact = reset_peak_rss()
    ffmpeg_peak = 0.0
    t0 = time.perf_counter()
    for i in range(args.clip_frames - 21):
        stack.step(action)
        if i % 250 == 0 and rec.engine.encoder.current_pid is not None:
            try:
                ffmpeg_peak = max(ffmpeg_peak, _status(rec.engine.encoder.current_pid, "VmRSS"))
            except OSError:
                pass
    rec.flush()
    seconds = time.perf_counter() - t0
    peak = _status("self", "VmHWM") if exact else _status("self", "VmRSS")
    assert rec.engine.clips_saved == 1 and not rec.errors, rec.errors
    stack.close()
    return {
        "growth_mb": peak - base,
        "ffmpeg_mb": ffmpeg_peak,
        "seconds": seconds,
        "exact_peak": exact,
    }


# ----------------------------------------------------------------------------- gymnasium
def gym_point_reach(args):
    """PointReach behind gymnasium's VectorEnv API (same-step autoreset, numpy), so Gymnasium's
    vector RecordVideo can record the very same frames."""
    import gymnasium as gym

    class PointReachVec(gym.vector.VectorEnv):
        metadata = {
            "render_modes": ["rgb_array"],
            "autoreset_mode": gym.vector.AutoresetMode.SAME_STEP,
            "render_fps": 20,
        }

        def __init__(self):
            self.env = point_reach(args)
            self.num_envs = args.num_envs
            self.render_mode = "rgb_array"
            self.single_observation_space = self.env.single_observation_space
            self.single_action_space = self.env.single_action_space
            batch = gym.vector.utils.batch_space
            self.observation_space = batch(self.single_observation_space, self.num_envs)
            self.action_space = batch(self.single_action_space, self.num_envs)

        def reset(self, *, seed=None, options=None):
            obs, info = self.env.reset(seed=seed)
            return obs.numpy(), {}

        def step(self, actions):
            obs, rew, term, trunc, _ = self.env.step(torch.as_tensor(actions))
            done = term | trunc
            if bool(done.any()):
                obs, _ = self.env.reset(env_idx=done)
            return obs.numpy(), rew.numpy(), term.numpy(), trunc.numpy(), {}

        def render(self):  # every env, as gymnasium's vector API does
            return list(self.env.render(range(self.num_envs)).numpy())

    return PointReachVec()


def bench_gym_record_video(
    make_env, action_fn, steps: int, clip_frames: int, video_dir: str, **rv_kw
):
    """steps/s without and with RecordVideo recording; RSS growth over a ``clip_frames`` clip."""
    import gymnasium as gym
    from gymnasium.wrappers.vector import RecordVideo

    gym.logger.min_level = 40  # its same-step warning is expected here
    plain = make_env()
    plain.reset(seed=0)
    t_plain = time_per_call(lambda: plain.step(action_fn(plain)), steps)
    plain.close()
    # one clip of exactly ``clip_frames`` frames, across episode boundaries (CartPole's are short)
    env = RecordVideo(
        make_env(), video_dir, step_trigger=lambda s: s == 0, video_length=clip_frames - 1, **rv_kw
    )
    env.reset(seed=0)
    base = _status("self", "VmRSS")
    exact = reset_peak_rss()
    t0 = time.perf_counter()
    for _ in range(clip_frames - 1):
        env.step(action_fn(env))
    t_record = (time.perf_counter() - t0) / (clip_frames - 1)
    held = _status("self", "VmRSS") - base  # every frame of the clip, held until it ends
    t1 = time.perf_counter()
    env.close()  # encodes the clip now, synchronously (moviepy)
    t_encode = time.perf_counter() - t1
    peak = (_status("self", "VmHWM") if exact else _status("self", "VmRSS")) - base
    # the training thread pays for the encode too: spread it over the clip's steps
    t_paid = t_record + t_encode / (clip_frames - 1)
    return {"t_plain": t_plain, "t_record": t_record, "t_paid": t_paid, "encode_s": t_encode,
            "held_mb": held, "peak_mb": peak, "frames": clip_frames}  # fmt: skip


# ----------------------------------------------------------------------------- RecordVectorVideo
GYM_ENVS = 8  # CartPole envs of the RecordVectorVideo cases


def cartpole_vec(max_episode_steps: int = 10**6):
    """8 CartPole envs (SyncVectorEnv, NEXT_STEP) whose episodes last: with ``balance`` as the
    policy no episode ends, so a clip of one episode can be as long as the measurement needs."""
    import gymnasium as gym

    return gym.make_vec("CartPole-v1", GYM_ENVS, vectorization_mode="sync",
                        render_mode="rgb_array", max_episode_steps=max_episode_steps)  # fmt: skip


def balance(obs: np.ndarray) -> np.ndarray:
    """A linear controller that keeps every pole up (actions from the last observations)."""
    x, x_dot, theta, theta_dot = obs.T
    return ((theta * 10 + theta_dot * 2 + x * 0.1 + x_dot * 0.5) > 0).astype(np.int64)


class Driven:
    """Steps a vector env (or a wrapper of one) with :func:`balance`, or with a fixed list of
    random actions (``random_steps``: episodes then end and reset, as in training)."""

    def __init__(self, env, random_steps: int = 0):
        self.env = env
        self.obs, _ = env.reset(seed=0)
        rng = np.random.default_rng(0)
        self.actions = list(rng.integers(0, 2, size=(random_steps, GYM_ENVS)))
        self.t = 0

    def step(self):
        if self.actions:
            action = self.actions[self.t % len(self.actions)]
            self.t += 1
        else:
            action = balance(self.obs)
        self.obs = self.env.step(action)[0]


def gym_wrapper_idle(args) -> Dict[str, float]:
    """What an armed, idle RecordVectorVideo adds to a step of 8 CartPole envs.

    Isolated (best of 50 timeit runs over a vector env whose step answers at once, so only the
    wrapper's own work is timed): on one ready result where no episode ends, and on a replayed
    trace of 2,000 random-action steps, where episodes end and reset every few steps as in
    training (each step's result as the real env gave it). Against the best of 30 runs of the
    plain env's own step. Then in a run with random actions: a plain env, a pass-through
    VectorWrapper and RecordVectorVideo driven with the same actions, taking turns step by step,
    each first in turn (load from other processes hits all three alike); the median of rounds,
    paired."""
    import itertools
    import timeit

    import gymnasium as gym

    from rlrec.record import RecordVectorVideo

    work = tempfile.mkdtemp(prefix="rlrec-bench-")
    never = lambda e: False  # noqa: E731

    def isolated(results) -> float:
        """Seconds per step the idle wrapper adds over a vector env answering ``results``."""
        env = cartpole_vec(500)
        env.reset(seed=0)
        cycle = itertools.cycle(results)
        env.step = lambda actions: next(cycle)  # the vector env's step, answered at once
        rec = RecordVectorVideo(env, work, env_idx=0, episode_trigger=never)
        rec.reset(seed=0)
        action = np.zeros(GYM_ENVS, dtype=np.int64)
        # the best of many short runs: a run that another process preempts is simply not the best
        n = 2000
        t_bare = min(timeit.repeat(lambda: env.step(action), number=n, repeat=50)) / n
        t_rec = min(timeit.repeat(lambda: rec.step(action), number=n, repeat=50)) / n
        rec.close()
        return t_rec - t_bare

    try:
        env = cartpole_vec(500)
        obs, _ = env.reset(seed=0)
        ready = env.step(balance(obs))
        rng = np.random.default_rng(0)
        trace = [env.step(a) for a in rng.integers(0, 2, size=(2000, GYM_ENVS))]
        ends = sum(bool(r[2][0] or r[3][0]) for r in trace)  # episodes of env 0 that end
        steps = args.fast_steps // 4
        plain = Driven(env, random_steps=steps)
        t_plain = min(timeit.repeat(plain.step, number=steps, repeat=30)) / steps
        env.close()
        out = {"idle_call": isolated([ready]), "idle_ends": isolated(trace),
               "ends_every": len(trace) / max(1, ends), "plain_best": t_plain}  # fmt: skip
        runs = {
            "plain": Driven(cartpole_vec(500), random_steps=steps),
            # any wrapper at all: a VectorWrapper that passes everything through
            "bare": Driven(gym.vector.VectorWrapper(cartpole_vec(500)), random_steps=steps),
            "idle": Driven(
                RecordVectorVideo(cartpole_vec(500), work, env_idx=0, episode_trigger=never),
                random_steps=steps,
            ),
        }
        rows: Dict[str, List[float]] = {name: [] for name in runs}
        clock = time.perf_counter
        names = list(runs)
        orders = [names[i:] + names[:i] for i in range(len(names))]  # each goes first in turn
        for _ in range(args.rounds):
            spent = dict.fromkeys(runs, 0.0)
            for t in range(steps):  # step by step, in turns
                for name in orders[t % len(orders)]:
                    d = runs[name]
                    t0 = clock()
                    d.step()
                    spent[name] += clock() - t0
            for name in runs:
                rows[name].append(spent[name] / steps)
        for d in runs.values():
            d.env.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out |= {name: statistics.median(r) for name, r in rows.items()}
    # paired within each round: what each wrapper adds to the plain env's step
    for name in ("bare", "idle"):
        out[f"{name}:extra"] = statistics.median(w - p for p, w in zip(rows["plain"], rows[name]))
    return out


def gym_wrapper_throughput(args) -> Dict[str, float]:
    """Steps/s of 8 CartPole envs recording env 0 every step: no wrapper, RecordVectorVideo and
    Gymnasium's vector RecordVideo (record_first_only), in interleaved rounds on identical envs;
    each recorder's encoding is counted (RecordVideo encodes on close, RecordVectorVideo's
    encoder thread is flushed at the end)."""
    import gymnasium as gym
    from gymnasium.wrappers.vector import RecordVideo

    from rlrec.record import RecordVectorVideo

    gym.logger.min_level = 40
    work = tempfile.mkdtemp(prefix="rlrec-bench-")
    try:
        always = lambda e: True  # noqa: E731
        ours = RecordVectorVideo(cartpole_vec(), os.path.join(work, "rlrec"), env_idx=0,
                                 episode_trigger=always)  # fmt: skip
        theirs = RecordVideo(cartpole_vec(), os.path.join(work, "gym"), record_first_only=True,
                             episode_trigger=always)  # fmt: skip
        runs = {"plain": Driven(cartpole_vec()), "ours": Driven(ours), "theirs": Driven(theirs)}
        spent = {k: 0.0 for k in runs}
        steps = {"plain": 0, "ours": 0, "theirs": 0}
        rounds = max(2, args.rounds // 5)
        per_round = max(5, args.gym_frames // rounds)
        for _ in range(rounds):
            for name, d in runs.items():
                n = per_round * (4 if name == "plain" else 1)
                spent[name] += time_per_call(d.step, n) * n
                steps[name] += n
        sub = runs["plain"].env
        one = time_per_call(lambda: sub.envs[0].render(), 10)
        every = time_per_call(sub.render, 3)
        t0 = time.perf_counter()
        ours.flush()  # every frame encoded
        spent["ours"] += time.perf_counter() - t0
        assert ours.recording and not ours.engine.errors, ours.engine.errors
        t0 = time.perf_counter()
        theirs.close()  # encodes its clip now (moviepy)
        spent["theirs"] += time.perf_counter() - t0
        ours.close()
        runs["plain"].env.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {f"{k}:sps": steps[k] / spent[k] for k in runs}
    return out | {"frames": steps["ours"], "render_one": one, "render_all": every}


def gym_wrapper_rss(args) -> Dict[str, float]:
    """Peak RSS growth of this process while RecordVectorVideo records one ``args.clip_frames``-
    frame clip of env 0 of 8 CartPole envs (one long episode)."""
    from rlrec.record import RecordVectorVideo

    work = tempfile.mkdtemp(prefix="rlrec-bench-")
    try:
        rec = RecordVectorVideo(cartpole_vec(), work, env_idx=0, episode_trigger=lambda e: True,
                                video_length=args.clip_frames)  # fmt: skip
        d = Driven(rec)
        for _ in range(20):  # ffmpeg started, queue and allocator warm
            d.step()
        rec.flush()
        base = _status("self", "VmRSS")
        exact = reset_peak_rss()
        t0 = time.perf_counter()
        while rec.recording:
            d.step()
        rec.flush()
        seconds = time.perf_counter() - t0
        peak = _status("self", "VmHWM") if exact else _status("self", "VmRSS")
        assert len(rec.clips) == 1 and rec.clips[0].num_frames == args.clip_frames, rec.clips
        rec.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"growth_mb": peak - base, "seconds": seconds, "exact_peak": exact}


def print_gym_wrapper(argv: List[str], args) -> None:
    print(f"RecordVectorVideo vs gymnasium.wrappers.vector.RecordVideo: {GYM_ENVS} CartPole-v1 "
          "envs (SyncVectorEnv, NEXT_STEP), recording env 0, 600x400 frames")  # fmt: skip
    i = in_subprocess("gym-wrapper-idle", argv)
    extra, bare = (i[f"{k}:extra"] / i["plain"] * 100 for k in ("idle", "bare"))
    best = i["plain_best"]
    print(f"  armed, idle, isolated (best of 50 runs) against the plain step's best of 30 "
          f"({best * 1e6:.0f} us): no episode ending {i['idle_call'] * 1e6:.2f} us per step = "
          f"{i['idle_call'] / best * 100:.2f}%; replayed random-action steps (env 0's episode "
          f"ends every {i['ends_every']:.1f} steps) {i['idle_ends'] * 1e6:.2f} us = "
          f"{i['idle_ends'] / best * 100:.2f}%")  # fmt: skip
    worst = max(i["idle_call"], i["idle_ends"]) / best * 100
    print(f"  target: armed idle RecordVectorVideo adds < 1% to a step, episodes ending or not: "
          f"{worst:.2f}%: {'PASS' if worst < 1 else 'FAIL'}")  # fmt: skip
    print(f"  in a run with random actions (episodes end and reset): plain "
          f"{i['plain'] * 1e6:.0f} us per step; RecordVectorVideo idle adds {extra:+.1f}%, a "
          f"pass-through VectorWrapper {bare:+.1f}% (medians of {args.rounds} rounds, the three "
          "taking turns step by step, paired)")  # fmt: skip
    t = in_subprocess("gym-wrapper-throughput", argv)
    print(f"  recording every step ({int(t['frames'])} frames each, encoding included): "
          f"no wrapper {t['plain:sps']:.0f} steps/s, RecordVectorVideo {t['ours:sps']:.1f}, "
          f"RecordVideo {t['theirs:sps']:.2f}: {t['ours:sps'] / t['theirs:sps']:.1f}x "
          "RecordVideo's throughput (target >= 10x)")  # fmt: skip
    print(f"    (a render of env 0 costs {t['render_one'] * 1e3:.1f} ms, vec.render() of all "
          f"{GYM_ENVS}, which RecordVideo calls even with record_first_only, "
          f"{t['render_all'] * 1e3:.1f} ms)")  # fmt: skip
    r = in_subprocess("gym-wrapper-rss", argv)
    how = "peak (VmHWM)" if r["exact_peak"] else "RSS after"
    print(f"  RecordVectorVideo, {args.clip_frames}-frame clip: RSS growth "
          f"{r['growth_mb']:.1f} MB {how}, {r['seconds']:.1f} s")  # fmt: skip
    try:
        g = in_subprocess("gym-cartpole-first", argv)
        scale = args.clip_frames / g["frames"]
        scaled = g["held_mb"] * scale + max(0.0, g["peak_mb"] - g["held_mb"])
        print(f"  RecordVideo (record_first_only), {args.clip_frames}-frame clip: RSS growth "
              f"~{scaled:.0f} MB (measured {g['peak_mb']:.1f} MB peak over {g['frames']} "
              "frames, scaled: it holds every frame until the clip ends)")  # fmt: skip
    except Exception as err:
        print(f"  RecordVideo RSS: skipped ({err})")


# ----------------------------------------------------------------------------- main
PARTS = (
    "timing",
    "rss",
    "gym-pointreach",
    "gym-cartpole-tiled",
    "gym-cartpole-first",
    "gym-wrapper-idle",
    "gym-wrapper-throughput",
    "gym-wrapper-rss",
)


def run_part(part: str, args, work: str) -> Dict[str, float]:
    if part == "timing":
        return bench_rlrec(args, work)
    if part == "rss":
        return rss_over_clip(args, work)
    if part == "gym-wrapper-idle":
        return gym_wrapper_idle(args)
    if part == "gym-wrapper-throughput":
        return gym_wrapper_throughput(args)
    if part == "gym-wrapper-rss":
        return gym_wrapper_rss(args)
    if part == "gym-pointreach":
        return bench_gym_record_video(
            lambda: gym_point_reach(args), lambda e: np.zeros((args.num_envs, 2), np.float32),
            max(20, args.rec_steps), args.gym_frames, os.path.join(work, part),
            record_first_only=True,
        )  # fmt: skip
    import gymnasium as gym

    def cartpole():
        return gym.make_vec("CartPole-v1", 8, vectorization_mode="sync", render_mode="rgb_array")

    return bench_gym_record_video(
        cartpole, lambda e: e.action_space.sample(), 500, args.gym_frames, os.path.join(work, part),
        record_first_only=part.endswith("first"),
    )  # fmt: skip


def in_subprocess(part: str, argv: List[str]) -> Dict[str, float]:
    """Each measurement in a fresh process: memory freed by an earlier one (kept by malloc)
    would otherwise hide the next one's RSS growth."""
    import json
    import subprocess

    env = dict(os.environ, SDL_VIDEODRIVER="dummy", SDL_AUDIODRIVER="dummy")
    cmd = [sys.executable, __file__, *argv, "--part", part]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        err = proc.stderr.strip()
        raise RuntimeError(err.splitlines()[-1] if err else f"exit status {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--rounds", type=int, default=25)
    p.add_argument("--fast-steps", type=int, default=1000, help="steps per round without rendering")
    p.add_argument("--rec-steps", type=int, default=50, help="steps per round while recording")
    p.add_argument("--clip-frames", type=int, default=5000)
    p.add_argument(
        "--gym-frames", type=int, default=200, help="RecordVideo clip length (RSS scaled)"
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-gym", action="store_true")
    p.add_argument(
        "--gym-wrapper-only",
        action="store_true",
        help="only RecordVectorVideo against Gymnasium's vector RecordVideo (8 CartPole envs)",
    )
    p.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    p.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # internal: one measurement
    argv = sys.argv[1:]
    args = p.parse_args()
    if args.quick:
        args.rounds, args.fast_steps, args.rec_steps, args.clip_frames, args.gym_frames = (
            3,
            200,
            10,
            300,
            30,
        )
    torch.set_num_threads(args.threads)
    if args.part:
        import json

        work = tempfile.mkdtemp(prefix="rlrec-bench-")
        try:
            print(json.dumps(run_part(args.part, args, work)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return

    if args.gym_wrapper_only:
        print_gym_wrapper(argv, args)
        return
    print(f"rlrec recorder, built-in env: {args.num_envs} envs, {args.size}x{args.size} frames, "
          f"median of {args.rounds} interleaved rounds, torch threads {args.threads}")  # fmt: skip
    t = in_subprocess("timing", argv)
    us = {k: v * 1e6 for k, v in t.items()}
    modes = (
        ("none", "no recorder"),
        ("idle", "armed, idle"),
        ("render_copy", "render+copy"),
        ("recording", "recording"),
    )
    for mode, label in modes:
        print(f"  {label:12s} {1 / t[mode + ':wall']:8.1f} steps/s | per step "
              f"{us[mode + ':wall']:7.1f} us wall, {us[mode + ':cpu']:7.1f} us CPU, of which "
              f"adapter step {us[mode + ':step_cpu']:6.1f}, "
              f"render {us[mode + ':render_cpu']:7.1f}, "
              f"layers above {us[mode + ':layers_cpu']:6.1f}")  # fmt: skip
    idle_extra = t["idle:layers_cpu"] - t["none:layers_cpu"]
    print(f"  armed idle recorder: {us['idle_call']:.2f} us per step (isolated, best of 50 runs) = "
          f"{t['idle_call'] / t['none:cpu'] * 100:.2f}% of the step (target < 1%); in the run "
          f"{idle_extra * 1e6:+.2f} us CPU per step ({idle_extra / t['none:cpu'] * 100:+.2f}%), "
          f"wall steps/s ratio none/idle {t['none:wall'] / t['idle:wall']:.3f}")  # fmt: skip
    # The target: what recording adds to a step, against what rendering the recorded env and
    # copying its frame once add (the render+copy stack); ratios paired within each round. CPU:
    # what the training thread itself does; wall: also the core time it loses to the encoder.
    for kind in ("cpu", "wall"):
        paid = t[f"recording:{kind}"] - t[f"none:{kind}"]
        least = t[f"render_copy:{kind}"] - t[f"none:{kind}"]
        print(f"  recording adds {paid * 1e6:.1f} us {kind} per step; render + one copy add "
              f"{least * 1e6:.1f}: ratio {t[f'ratio:{kind}']:.3f} (median of rounds, quartiles "
              f"{t[f'ratio:{kind}:q1']:.3f}..{t[f'ratio:{kind}:q3']:.3f}; "
              "target <= 1.10)")  # fmt: skip
    ratio = t["ratio:cpu"]
    print(f"  target: recording costs <= 1.10x render + one copy on the training thread (CPU): "
          f"{ratio:.3f}x: {'PASS' if ratio <= 1.10 else 'FAIL'}")  # fmt: skip
    idle = t["idle_call"] / t["none:cpu"] * 100
    print(f"  target: an armed idle recorder adds < 1% to a step: {idle:.2f}%: "
          f"{'PASS' if idle < 1 else 'FAIL'}")  # fmt: skip
    # the same from inside the recording steps: render + a copy measured alone, against the rest
    paid = t["recording:cpu"] - t["none:step_cpu"] - t["none:layers_cpu"]
    print(f"  (inside the recording steps: {paid * 1e6:.1f} us CPU beyond a plain step, of "
          f"which render {t['recording:render_cpu'] * 1e6:.1f} + a copy timed alone "
          f"{t['copy:cpu'] * 1e6:.1f}; the rest is what rendering does to the next step's caches "
          "and the recorder itself)")  # fmt: skip
    print(f"  recording runs at {t['none:wall'] / t['recording:wall']:.3f}x the steps/s of no "
          f"recorder: one {args.size}x{args.size} render of this env costs "
          f"{us['recording:render_wall']:.0f} us wall, "
          f"{t['recording:render_wall'] / t['none:wall']:.1f}x "
          f"a whole step of {args.num_envs} envs")  # fmt: skip
    r = in_subprocess("rss", argv)
    how = "peak (VmHWM)" if r["exact_peak"] else "RSS after (no peak reset available)"
    print(f"  {args.clip_frames}-frame clip: RSS growth {r['growth_mb']:.1f} MB {how} "
          "(target < 50 MB); "
          f"ffmpeg process RSS {r['ffmpeg_mb']:.1f} MB; {r['seconds']:.1f} s, "
          f"{args.clip_frames / r['seconds']:.0f} frames/s")  # fmt: skip
    if args.no_gym:
        return
    print(
        "Gymnasium vector RecordVideo (moviepy; renders every env, holds the clip, encodes on "
        "close)"
    )
    for part, what in (
        ("gym-pointreach", f"same PointReach frames ({args.num_envs} envs), record_first_only"),
        ("gym-cartpole-tiled", "8 CartPole envs, all 8 tiled (its default)"),
        ("gym-cartpole-first", "8 CartPole envs, record_first_only"),
    ):
        try:
            _print_gym(what, in_subprocess(part, argv), args.clip_frames)
        except Exception as err:  # e.g. classic-control (pygame) missing: it does not apply
            print(f"  {what}: skipped ({err})")
    print_gym_wrapper(argv, args)


def _print_gym(what: str, g: Dict[str, float], clip_frames: int) -> None:
    scale = clip_frames / g["frames"]
    print(f"  {what}:")
    print(f"    no wrapper {1 / g['t_plain']:8.1f} steps/s; recording "
          f"{1 / g['t_record']:.1f} steps/s, "
          f"{1 / g['t_paid']:.1f} with its encode ({g['encode_s']:.2f} s at close): "
          f"{g['t_plain'] / g['t_paid']:.4f}x of no wrapper")  # fmt: skip
    # the held frames grow with the clip; the rest of the peak (renders, encoder) does not
    scaled = g["held_mb"] * scale + max(0.0, g["peak_mb"] - g["held_mb"])
    print(f"    {g['frames']}-frame clip: {g['held_mb']:.1f} MB held before encoding, peak growth "
          f"{g['peak_mb']:.1f} MB; scaled to {clip_frames} frames ~{scaled:.0f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
