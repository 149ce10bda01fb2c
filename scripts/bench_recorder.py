"""What the recorder costs the training thread, measured side by side in one run.

    python scripts/bench_recorder.py [--quick] [--gym-wrapper-only]   # 64 envs, 256x256 frames

rlrec's Recorder on the built-in env, four stacks taking turns each round: no recorder, armed but
idle, one that only renders the recorded env and copies its frame (the least any recording costs),
and recording every step (each block flushes the encoder, its wait charged to the block). Targets:
recording over render + one copy <= 1.10 in the training thread's CPU time, paired within each
round (wall time beside it); the idle recorder alone (best of 50 runs over an adapter that answers
at once) < 1% of a step; RSS growth over a clip < 50 MB. Gymnasium's vector RecordVideo on the same
frames and on 8 CartPole envs; RecordVectorVideo against it there: idle cost (also over a replayed
random-action trace), steps/s recording (encoding included; target >= 10x) and RSS growth. Each
measurement in a fresh process (freed memory would hide the next one's growth).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit

import benchlib as bl
import numpy as np
import torch

from rlrec.envs.autoreset import AutoReset
from rlrec.envs.base import EnvWrapper
from rlrec.envs.builtin import PointReach
from rlrec.record import Recorder, RecordVectorVideo
from rlrec.record.settings import RecorderConfig, Trigger

MODES = ("none", "idle", "render_copy", "recording")
NEVER, ALWAYS = (lambda e: False), (lambda e: True)


def status(pid, field: str) -> float:
    """A ``/proc/PID/status`` field (VmRSS, VmHWM) in MB."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) / 1024 for x in f if x.startswith(field + ":"))


def peak_growth(run) -> float:
    """Peak RSS growth (MB) of this process while ``run()`` runs (VmHWM reset first, Linux >= 4.0,
    else the RSS after)."""
    base = status("self", "VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return run() or status("self", "VmRSS") - base
    return run() or status("self", "VmHWM") - base


def isolated(bare, wrapped) -> float:
    """Seconds per call that ``wrapped`` adds to ``bare``: the best of 50 runs of 2,000 calls each
    (a run that another process preempts is simply not the best)."""
    best = [min(timeit.repeat(f, number=2000, repeat=50)) / 2000 for f in (bare, wrapped)]
    return best[1] - best[0]


class Ready(EnvWrapper):
    """An adapter whose step returns a result made ahead: only the layers above it are timed."""

    def __init__(self, env, result):
        super().__init__(env)
        self.result = result

    def step(self, action):
        return self.result


class RenderCopy(EnvWrapper):
    """The least recording costs the training thread: after each step, the render of env 0 and
    one copy of the frame into a reused buffer."""

    def __init__(self, env, frame):
        super().__init__(env)
        self.buffer = torch.empty_like(frame)

    def step(self, action):
        out = self.env.step(action)
        self.buffer.copy_(self.env.render([0]))
        return out


def point_reach(a) -> PointReach:
    size = dict(render_width=a.size, render_height=a.size)
    return PointReach(a.num_envs, max_episode_steps=10**9, seed=0, **size)


def recorder(env, work: str, idle: bool, **cfg) -> Recorder:
    trigger = Trigger.cubic if idle else Trigger.always
    rec = Recorder(env, RecorderConfig(trigger=trigger, **cfg), work)
    if idle:  # between scheduled episodes: the next reset starts episode 2
        rec.load_state_dict({"episode": 1, "steps": 0, "clips_saved": 0})
    return rec


def timing(a, work: str) -> dict:
    """Per step, each stack's (wall, CPU) seconds in its block of each round, and (wall, CPU) of
    a render of env 0 and of a copy of its frame, timed alone in the same rounds."""
    envs = {m: point_reach(a) for m in MODES}
    recs = {m: recorder(envs[m], work, m == "idle", filename=f"{m}.mp4") for m in MODES[1::2]}
    stacks = {m: AutoReset(recs.get(m, envs[m])) for m in MODES}
    action, frame = torch.zeros(a.num_envs, 2), envs["none"].render([0])
    stacks["render_copy"] = AutoReset(RenderCopy(envs["render_copy"], frame))

    def block(mode):
        n = a.fast_steps if mode in ("none", "idle") else a.rec_steps
        wall, cpu = bl.per_call(lambda: stacks[mode].step(action), n)
        if mode == "recording":  # the frames still queued are encoded now, charged to this block
            wall += bl.per_call(recs[mode].flush, 1)[0] / n
        return wall, cpu

    for s in stacks.values():  # warm-up: the recording stack starts its ffmpeg here
        s.reset(seed=0)
        s.step(action)
    configs = {m: lambda m=m: block(m) for m in MODES}
    configs["render"] = lambda: bl.per_call(lambda: envs["none"].render([0]), a.rec_steps)
    configs["copy"] = lambda: bl.per_call(frame.clone, a.rec_steps)
    rows = {k: np.array(v) for k, v in bl.rounds(configs, a.rounds).items()}
    assert not recs["recording"].errors, recs["recording"].errors
    for s in stacks.values():
        s.close()
    out = {k: list(np.median(v, axis=0)) for k, v in rows.items()}
    for i, kind in enumerate(("wall", "cpu")):  # the target, paired within each round
        n, c, r = (rows[m][:, i] for m in ("none", "render_copy", "recording"))
        ratios = list((r - n) / (c - n))
        out[f"ratio:{kind}"] = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    env = PointReach(4, render_width=16, render_height=16, max_episode_steps=10**9)
    env.reset(seed=0)
    bare = Ready(env, env.step(action[:4]))
    idle = recorder(bare, work, True)
    idle.reset(seed=0)
    out["idle_call"] = isolated(lambda: bare.step(action[:4]), lambda: idle.step(action[:4]))
    idle.close()
    return out


def record_until(step, rec, until) -> float:
    """RSS growth (MB) while ``step`` records until ``until()``, ffmpeg started before."""
    for _ in range(20):  # ffmpeg started, queue and allocator warm
        step()
    rec.flush()

    def clip():
        while not until():
            step()
        rec.flush()

    return peak_growth(clip)


def rss(a, work: str) -> dict:
    """RSS growth of this process, and ffmpeg's RSS, over one ``--clip-frames`` clip."""
    rec = recorder(point_reach(a), work, False, length_frames=a.clip_frames, filename="rss.mp4")
    s, action, ffmpeg, steps = AutoReset(rec), torch.zeros(a.num_envs, 2), [0.0], itertools.count()

    def until():
        pid = rec.engine.encoder.current_pid
        if next(steps) % 250 == 0 and pid is not None:
            ffmpeg[0] = max(ffmpeg[0], status(pid, "VmRSS"))
        return rec.engine.clips_saved == 1 or not rec.recording

    t0 = time.perf_counter()
    growth = record_until(lambda: s.step(action), rec, until)
    assert rec.engine.clips_saved == 1 and not rec.errors, rec.errors
    s.close()
    fps = a.clip_frames / (time.perf_counter() - t0)
    return {"growth": growth, "ffmpeg": ffmpeg[0], "fps": fps}


def gym_point_reach(a):
    """PointReach behind gymnasium's VectorEnv API (same-step autoreset, numpy), so that
    RecordVideo records the very same frames."""
    import gymnasium as gym

    class PointReachVec(gym.vector.VectorEnv):
        metadata = {"render_modes": ["rgb_array"], "render_fps": 20}
        metadata["autoreset_mode"] = gym.vector.AutoresetMode.SAME_STEP
        render_mode = "rgb_array"

        def __init__(self):
            self.env, self.num_envs = point_reach(a), a.num_envs
            self.single_observation_space = self.env.single_observation_space
            self.single_action_space = space = self.env.single_action_space
            self.observation_space = gym.vector.utils.batch_space(
                self.env.single_observation_space, self.num_envs
            )
            self.action_space = gym.vector.utils.batch_space(space, self.num_envs)

        def reset(self, *, seed=None, options=None):
            return self.env.reset(seed=seed)[0].numpy(), {}

        def step(self, actions):
            obs, rew, term, trunc, _ = self.env.step(torch.as_tensor(actions))
            if bool((term | trunc).any()):
                obs, _ = self.env.reset(env_idx=term | trunc)
            return obs.numpy(), rew.numpy(), term.numpy(), trunc.numpy(), {}

        def render(self):  # every env, as gymnasium's vector API does
            return list(self.env.render(range(self.num_envs)).numpy())

    return PointReachVec()


def cartpole(max_episode_steps: int = 10**6):
    """8 CartPole envs (SyncVectorEnv, NEXT_STEP) whose episodes last as long as asked."""
    import gymnasium as gym

    kw = dict(render_mode="rgb_array", max_episode_steps=max_episode_steps)
    return gym.make_vec("CartPole-v1", 8, vectorization_mode="sync", **kw)


def record_video(make_env, act, steps: int, frames: int, work: str, **kw) -> dict:
    """steps/s without and while RecordVideo records (its encode at close spread over the clip);
    RSS held before the encode and its peak growth over a ``frames`` clip."""
    import gymnasium as gym
    from gymnasium.wrappers.vector import RecordVideo

    gym.logger.min_level = 40  # its same-step warning is expected here
    plain = make_env()
    plain.reset(seed=0)
    out = {"plain": bl.per_call(lambda: plain.step(act(plain)), steps)[0], "frames": frames}
    plain.close()
    # one clip of exactly ``frames`` frames, across episode boundaries (CartPole's are short)
    env = RecordVideo(
        make_env(), work, step_trigger=lambda s: s == 0, video_length=frames - 1, **kw
    )
    env.reset(seed=0)

    def clip():
        base = status("self", "VmRSS")
        out["record"] = bl.per_call(lambda: env.step(act(env)), frames - 1)[0]
        out["held"] = status("self", "VmRSS") - base  # every frame, held until the clip ends
        out["encode"] = bl.per_call(env.close, 1)[0]  # encodes the clip now (moviepy)

    out["peak"] = peak_growth(clip)
    out["paid"] = out["record"] + out["encode"] / (frames - 1)
    return out


def balance(obs: np.ndarray) -> np.ndarray:
    """A linear controller that keeps every pole up (no episode ends)."""
    x, x_dot, theta, theta_dot = obs.T
    return ((theta * 10 + theta_dot * 2 + x * 0.1 + x_dot * 0.5) > 0).astype(np.int64)


class Driven:
    """Steps a vector env with :func:`balance`, or replays ``random_steps`` random actions over
    and over (episodes then end and reset, as in training)."""

    def __init__(self, env, random_steps: int = 0):
        self.env, (self.obs, _) = env, env.reset(seed=0)
        actions = np.random.default_rng(0).integers(0, 2, size=(random_steps, 8))
        self.actions = itertools.cycle(list(actions)) if random_steps else None

    def step(self):
        self.obs = self.env.step(next(self.actions) if self.actions else balance(self.obs))[0]


def idle_over(results: list, work: str) -> float:
    """What an idle RecordVectorVideo adds to a vector env answering ``results`` at once."""
    env, cycle = cartpole(500), itertools.cycle(results)
    env.reset(seed=0)
    env.step = lambda actions: next(cycle)
    rec = RecordVectorVideo(env, work, env_idx=0, episode_trigger=NEVER)
    rec.reset(seed=0)
    act = np.zeros(8, dtype=np.int64)
    extra = isolated(lambda: env.step(act), lambda: rec.step(act))
    rec.close()
    return extra


def wrapper_idle(a, work: str) -> dict:
    """An armed, idle RecordVectorVideo on 8 CartPole envs: isolated over a vector env answering
    at once (one ready result where no episode ends; a replayed trace of 2,000 random-action steps
    where they end and reset), against the plain step's best of 30 runs; then in a run of random
    actions, a plain env, a pass-through VectorWrapper and it, in turns step by step (paired)."""
    import gymnasium as gym

    env, steps = cartpole(500), a.fast_steps // 4
    ready = env.step(balance(env.reset(seed=0)[0]))
    trace = [env.step(x) for x in np.random.default_rng(0).integers(0, 2, (2000, 8))]
    plain = Driven(env, random_steps=steps)
    out = {"best": min(timeit.repeat(plain.step, number=steps, repeat=30)) / steps}
    out["ends_every"] = len(trace) / max(1, sum(bool(r[2][0] or r[3][0]) for r in trace))
    out["idle"], out["idle_ends"] = idle_over([ready], work), idle_over(trace, work)
    runs = {"plain": cartpole(500), "bare": gym.vector.VectorWrapper(cartpole(500))}
    runs["idle"] = RecordVectorVideo(cartpole(500), work, env_idx=0, episode_trigger=NEVER)
    runs = {k: Driven(e, random_steps=steps) for k, e in runs.items()}
    each = {k: lambda k=k: bl.per_call(runs[k].step, 1)[0] for k in runs}  # in turns, step by step
    rows = [{k: np.mean(v) for k, v in bl.rounds(each, steps).items()} for _ in range(a.rounds)]
    for d in runs.values():
        d.env.close()
    out["plain"] = bl.median(r["plain"] for r in rows)
    for name in ("bare", "idle"):  # what each adds to the plain step, paired within each round
        out[f"{name}_run"] = bl.median(r[name] - r["plain"] for r in rows)
    return out


def wrapper_throughput(a, work: str) -> dict:
    """Steps/s of 8 CartPole envs recording env 0 every step: no wrapper, RecordVectorVideo and
    RecordVideo (record_first_only), in rounds that take turns; each one's encoding counted."""
    import gymnasium as gym
    from gymnasium.wrappers.vector import RecordVideo

    gym.logger.min_level = 40
    ours = RecordVectorVideo(cartpole(), f"{work}/rlrec", env_idx=0, episode_trigger=ALWAYS)
    theirs = RecordVideo(cartpole(), f"{work}/gym", record_first_only=True, episode_trigger=ALWAYS)
    runs = {"plain": Driven(cartpole()), "ours": Driven(ours), "theirs": Driven(theirs)}
    r = max(2, a.rounds // 5)
    n = {"ours": max(5, a.gym_frames // r)}
    n.update(theirs=n["ours"], plain=4 * n["ours"])
    spent = bl.rounds({k: lambda k=k: bl.per_call(runs[k].step, n[k])[0] * n[k] for k in runs}, r)
    spent = {k: sum(v) for k, v in spent.items()}
    sub = runs["plain"].env
    out = {"render_one": bl.per_call(sub.envs[0].render, 10)[0]}
    out["render_all"] = bl.per_call(sub.render, 3)[0]
    spent["ours"] += bl.per_call(ours.flush, 1)[0]  # every frame encoded
    assert ours.recording and not ours.engine.errors, ours.engine.errors
    spent["theirs"] += bl.per_call(theirs.close, 1)[0]  # encodes its clip now (moviepy)
    ours.close()
    sub.close()
    return {**out, "frames": n["ours"] * r, **{k: n[k] * r / spent[k] for k in runs}}


def wrapper_rss(a, work: str) -> dict:
    """RSS growth while RecordVectorVideo records one ``--clip-frames`` clip of env 0."""
    rec = RecordVectorVideo(
        cartpole(), work, env_idx=0, episode_trigger=ALWAYS, video_length=a.clip_frames
    )
    d = Driven(rec)
    growth = record_until(d.step, rec, lambda: not rec.recording)
    assert len(rec.clips) == 1 and rec.clips[0].num_frames == a.clip_frames, rec.clips
    rec.close()
    return {"growth": growth}


def cartpole_case(first_only: bool):
    act = lambda e: e.action_space.sample()  # noqa: E731
    return lambda a, w: record_video(
        cartpole, act, 500, a.gym_frames, w, record_first_only=first_only
    )


def pointreach_case(a, work: str) -> dict:
    act = lambda e: np.zeros((a.num_envs, 2), np.float32)  # noqa: E731
    make = lambda: gym_point_reach(a)  # noqa: E731
    return record_video(make, act, max(20, a.rec_steps), a.gym_frames, work, record_first_only=True)


GYM = {"the same PointReach frames, record_first_only": pointreach_case}
GYM["8 CartPole envs, all tiled (its default)"] = cartpole_case(False)
GYM["8 CartPole envs, record_first_only"] = first_only = cartpole_case(True)
PARTS = {"timing": timing, "rss": rss, "wrapper-idle": wrapper_idle, "wrapper-rss": wrapper_rss}
PARTS.update({"wrapper-throughput": wrapper_throughput, **GYM})


def part(name: str, a, cache: dict) -> dict:
    """One measurement in a fresh process (each once per run of this script)."""
    if name not in cache:
        env = dict(os.environ, SDL_VIDEODRIVER="dummy", SDL_AUDIODRIVER="dummy")
        cmd = [sys.executable, __file__, *a.bench.argv, "--part", name]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(
                (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            )
        cache[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    return cache[name]


def target(ok: bool, what: str) -> str:
    return f"{what}: {'PASS' if ok else 'FAIL'}"


def rlrec_rows(b: bl.Bench, a, cache: dict) -> list:
    t, r = part("timing", a, cache), part("rss", a, cache)
    b.out(f"rlrec's Recorder, {a.num_envs} built-in envs, {a.size}x{a.size}, {a.rounds} rounds")
    us = {m: [f"{1 / t[m][0]:.1f}", f"{t[m][0] * 1e6:.1f}", f"{t[m][1] * 1e6:.1f}"] for m in MODES}
    b.table(["", "steps/s", "wall us per step", "CPU us"], [[m, *us[m]] for m in MODES])
    none, idle, render, rec = (t[m] for m in ("none", "idle", "render", "recording"))
    q = {k: "{1:.3f} ({0:.3f}..{2:.3f})".format(*t[f"ratio:{k}"]) for k in ("wall", "cpu")}
    share, paid = t["idle_call"] / none[1], (rec[1] - none[1]) * 1e6
    rows = [("idle recorder, isolated", f"{t['idle_call'] * 1e6:.2f} us, {share:.2%} of a step")]
    rows[0] += (target(share < 0.01, "< 1%"),)
    rows.append(("idle recorder in the run (none/idle steps/s)", f"{idle[0] / none[0]:.3f}"))
    ok = target(t["ratio:cpu"][1] <= 1.1, "<= 1.10")
    rows += [("recording / render + one copy, CPU (quartiles)", q["cpu"], ok)]
    rows.append(("the same in wall time (quartiles)", q["wall"]))
    alone = f"{paid:.0f}; {render[1] * 1e6:.0f}, {t['copy'][1] * 1e6:.0f} us"
    rows.append(("a recording step's CPU beyond a plain one; a render, a copy alone", alone))
    ratio = f"{none[0] / rec[0]:.3f}; {render[0] / none[0]:.1f}"
    rows.append(("steps/s recording over none; a render in plain steps", ratio))
    mb, ok = f"{r['growth']:.1f} MB ({r['ffmpeg']:.0f} MB)", target(r["growth"] < 50, "< 50 MB")
    return rows + [(f"RSS growth over a {a.clip_frames}-frame clip (ffmpeg's RSS)", mb, ok)]


def scaled(g: dict, frames: int) -> float:
    """RSS growth over ``frames``: the held frames grow with the clip, the rest does not."""
    return g["held"] * frames / g["frames"] + max(0.0, g["peak"] - g["held"])


def wrapper_rows(a, cache: dict) -> list:
    i, t, r = (part(f"wrapper-{k}", a, cache) for k in ("idle", "throughput", "rss"))
    best, x = i["best"], t["ours"] / t["theirs"]
    theirs = scaled(part("8 CartPole envs, record_first_only", a, cache), a.clip_frames)
    idle = f"{i['idle'] / best:.2%}; {i['idle_ends'] / best:.2%} of a {best * 1e6:.0f} us step"
    ok = target(max(i["idle"], i["idle_ends"]) < best / 100, "< 1%")
    rows = [(f"RecordVectorVideo idle; an episode ending every {i['ends_every']:.1f}", idle, ok)]
    run = f"{i['idle_run'] / i['plain']:+.1%}; {i['bare_run'] / i['plain']:+.1%}"
    rows.append(("RecordVectorVideo idle; a pass-through VectorWrapper, in a run", run))
    sps = f"{t['plain']:.0f}, {t['ours']:.1f}, {t['theirs']:.2f}: {x:.1f}x"
    what = f"steps/s recording {t['frames']} frames: none, RecordVectorVideo, RecordVideo"
    rows.append((what, sps, target(x >= 10, ">= 10x")))
    renders = f"{t['render_one'] * 1e3:.1f}; {t['render_all'] * 1e3:.1f} ms"
    rows.append(("a render of env 0; of all 8 (as RecordVideo renders)", renders))
    what = f"RSS growth over a {a.clip_frames}-frame clip: RecordVectorVideo, RecordVideo"
    return rows + [(what, f"{r['growth']:.1f}, ~{theirs:.0f} MB")]


def gym_rows(a, cache: dict) -> list:
    rows = []
    for name in GYM:
        try:
            g = part(name, a, cache)
        except RuntimeError as e:  # e.g. classic-control (pygame) missing
            rows.append([name, f"skipped: {e}", "", "", ""])
            continue
        sps = " / ".join(f"{1 / g[k]:.1f}" for k in ("plain", "record", "paid"))
        mb = f"{g['held']:.1f} / {g['peak']:.1f}"
        rows.append(
            [name, sps, f"{g['plain'] / g['paid']:.4f}", mb, f"~{scaled(g, a.clip_frames):.0f}"]
        )
    return rows


def main() -> None:
    b = bl.Bench(__file__, __doc__)
    p = b.parser
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--rounds", type=int, default=25)
    p.add_argument("--fast-steps", type=int, default=1000, help="steps per round, not recording")
    p.add_argument("--rec-steps", type=int, default=50, help="steps per round while recording")
    p.add_argument("--clip-frames", type=int, default=5000)
    p.add_argument("--gym-frames", type=int, default=200, help="RecordVideo's clip (RSS scaled)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-gym", action="store_true")
    p.add_argument("--gym-wrapper-only", action="store_true", help="RecordVectorVideo only")
    p.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    p.add_argument("--part", choices=PARTS, help="(internal) one measurement, as JSON")
    a = b.args()
    a.bench = b
    if a.quick:
        a.rounds, a.fast_steps, a.rec_steps, a.clip_frames, a.gym_frames = 3, 200, 10, 300, 30
    torch.set_num_threads(a.threads)
    if a.part:
        with tempfile.TemporaryDirectory(prefix="rlrec-bench-") as work:
            return print(json.dumps(PARTS[a.part](a, work)))
    cache, rows = {}, []
    if not a.gym_wrapper_only:
        rows += rlrec_rows(b, a, cache)
    if not a.no_gym:
        rows += wrapper_rows(a, cache)
    b.table(["", "measured", "target"], [(*row, "")[:3] for row in rows])
    if not (a.no_gym or a.gym_wrapper_only):
        b.out(f"\nGymnasium's vector RecordVideo (moviepy), {a.gym_frames}-frame clip")
        head = ["", "steps/s: no wrapper / recording / with its encode", "x of no wrapper"]
        b.table(head + ["MB held / peak", f"MB over {a.clip_frames}"], gym_rows(a, cache))
    b.finish()


if __name__ == "__main__":
    main()
