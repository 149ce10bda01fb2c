"""The closed-loop check of an export (``export.verify=N``, docs/export.md): ``N`` evaluation
episodes on the run's eval env (its config, the per-episode seeds of its eval envs ``0..N-1``),
driven once by the checkpoint (``PPO.act_inference``, as the run evaluated it) and once by each
exported file, through the one eval loop (:class:`~rlrec.train.evaluation.Evaluator`), compared
step by step. Each episode's trajectory parts where an observation element differs by more than
``tolerance * (1 + |checkpoint's|)``, or where one episode ends and the other does not. The
figures go to ``exported/verify.json``, env 0's clips to ``exported/verify/``; a file whose
episodes part is moved to ``exported/rejected/`` and dropped from policy.json.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import gymnasium as gym
import torch

from rlrec.envs.factory import resolve_device
from rlrec.files import write_atomic
from rlrec.layout import RunDir
from rlrec.obs import map_obs
from rlrec.ppo.ppo import PPO
from rlrec.record import names
from rlrec.run.replay import replay_config
from rlrec.train import checkpoint as ckpt
from rlrec.train.evaluation import Evaluator
from rlrec.train.policy import FILES, META, load_policy
from rlrec.train.stack import close_all

TOLERANCE = 1e-4  # export.tolerance: of an observation element, relative to 1 + |its value|
Tape = Tuple[List[Any], List[torch.Tensor]]  # the observations and actions of every step
_BOTH = ("return", "length", "success")  # of an episode, by the file and by the checkpoint


def _episodes(cfg, policy_for: Callable, step: int, tmp: Path, clip: Path, device):
    """One evaluation by ``policy_for(env)``: what it saw and did at every step, the episodes'
    lines, and env 0's clip, moved to ``clip`` (its name under ``exported/``; None: none)."""
    seen: Tape = ([], [])
    tmp.mkdir()
    evaluator = Evaluator(cfg.env, cfg.sim, cfg.eval_env, tmp, video_dir=str(tmp), device=device)
    space = evaluator.env.single_action_space
    box = isinstance(space, gym.spaces.Box)
    low, high = (torch.as_tensor(b, device=device) for b in (space.low, space.high)) if box else ()

    def taped(obs):
        action = policy(obs)
        seen[0].append(map_obs(lambda t: t.to("cpu", torch.float64), obs))
        seen[1].append((torch.clamp(action, low, high) if box else action).to("cpu", torch.float64))
        return action

    try:
        policy = policy_for(evaluator.env)
        evaluator.run(taped, tag=step)
    finally:
        close_all([evaluator.env], evaluator)
    lines = [json.loads(x) for x in RunDir(tmp).eval_episodes.read_text().splitlines()]
    keep = ("env", "seed", *_BOTH, "ended")
    eps = sorted(({k: r[k] for k in keep} for r in lines), key=lambda r: r["env"])
    if not (tmp / names.evaluation(step)).is_file():
        return seen, eps, None
    clip.parent.mkdir(exist_ok=True)
    os.replace(tmp / names.evaluation(step), clip)
    return seen, eps, str(clip.relative_to(clip.parent.parent))


def _obs_diff(got, want) -> torch.Tensor:
    """Per env, the largest ``|got - want| / (1 + |want|)`` of the observation's elements."""
    diff = map_obs(lambda g, w: ((g - w).abs() / (1 + w.abs())).flatten(1).amax(1), got, want)
    return torch.stack(list(diff.values())).amax(0) if isinstance(diff, dict) else diff


def compare(ref: Tape, got: Tape, ref_eps, got_eps, tolerance: float) -> List[dict]:
    """Episode by episode: the largest action and observation differences up to where the
    trajectories part, that step (None: they did not), the return, length and success of both."""
    out = []
    for ep, (r, g) in enumerate(zip(ref_eps, got_eps)):
        env, steps = r["env"], min(r["length"], g["length"])
        obs = [float(_obs_diff(g_o, r_o)[env]) for g_o, r_o in zip(got[0][:steps], ref[0][:steps])]
        parted = next((t for t, d in enumerate(obs) if d > tolerance), None)
        if parted is None and r["length"] != g["length"]:
            parted = steps  # one ended, the other went on
        upto = steps if parted is None else parted + 1
        acts = [float((a[env] - b[env]).abs().max()) for a, b in zip(got[1][:upto], ref[1][:upto])]
        out.append(
            {
                "episode": ep,
                "env": env,
                "seed": r["seed"],
                "parted_at_step": parted,
                "max_action_diff": max(acts, default=0.0),
                "max_obs_diff": max(obs[:upto], default=0.0),
                **{k: g[k] for k in _BOTH},
                **{f"checkpoint_{k}": r[k] for k in _BOTH},
            }
        )
    return out


def _reject(out: Path, kind: str) -> Path:
    """Moves a failed file to ``exported/rejected/`` (beside an earlier one of its name, never
    over it: ``policy-1.pt``, ...) and drops it from policy.json."""
    (out / "rejected").mkdir(exist_ok=True)
    name, taken = Path(FILES[kind]), 0
    moved = out / "rejected" / name
    while moved.exists():
        taken += 1
        moved = out / "rejected" / f"{name.stem}-{taken}{name.suffix}"
    os.replace(out / name, moved)
    meta = json.loads((out / META).read_text())
    meta["files"].pop(FILES[kind], None)
    write_atomic(out / META, json.dumps(meta, indent=2) + "\n")
    return moved


def verify(run_dir, kinds: List[str], n: int, tolerance: float = TOLERANCE) -> Dict[str, Any]:
    """Runs the check of the exports ``kinds`` of ``run_dir`` (their files in ``exported/``),
    writes ``exported/verify.json`` and returns it; a failed file goes to ``exported/rejected/``."""
    out = RunDir(run_dir).exported
    meta = json.loads((out / META).read_text())
    step = meta["step"]
    data = ckpt.load(Path(run_dir) / meta["checkpoint"]["path"], "export.verify")
    cfg = replay_config(data["config"], 0, [f"eval_env.num_envs={n}", "eval_env.episodes=null"])
    device = resolve_device(cfg.sim)  # the device of this command, resolved once

    def checkpoint(env):  # the checkpoint's policy, as the run evaluated it
        ppo = PPO(cfg.algo, env.single_observation_space, env.single_action_space, device)
        ppo.load_state_dict(data["ppo"])
        return lambda obs: ppo.act_inference(obs, deterministic=True)

    old = out / "verify.json"
    report = json.loads(old.read_text()) if old.is_file() else {}
    formats = report.get("formats", {}) if report.get("step") == step else {}
    report = {"step": step, "episodes": n, "tolerance": tolerance}
    with tempfile.TemporaryDirectory(dir=out, prefix=".verify-") as tmp_dir:
        tmp, clips = Path(tmp_dir), out / "verify"
        ref, ref_eps, clip = _episodes(
            cfg, checkpoint, step, tmp / "ckpt", clips / "checkpoint-env000.mp4", device
        )
        report["checkpoint"] = {"clip": clip, "episodes": ref_eps}
        for kind in kinds:
            load = lambda env, p=out / FILES[kind]: load_policy(p)  # noqa: E731
            got, got_eps, clip = _episodes(
                cfg, load, step, tmp / kind, clips / f"{kind}-env000.mp4", device
            )
            eps = compare(ref, got, ref_eps, got_eps, tolerance)
            bad = next((e for e in eps if e["parted_at_step"] is not None), None)
            formats[kind] = {
                "file": FILES[kind],
                "passed": bad is None,
                **{k: max(e[k] for e in eps) for k in ("max_action_diff", "max_obs_diff")},
                "max_return_diff": max(abs(e["return"] - e["checkpoint_return"]) for e in eps),
                "failed": bad and {k: bad[k] for k in ("episode", "seed", "parted_at_step")},
                "clip": clip,
                "episodes": eps,
            }
    for kind in kinds:
        if not formats[kind]["passed"]:
            formats[kind]["rejected"] = str(_reject(out, kind).relative_to(run_dir))
    report["formats"] = formats
    write_atomic(out / "verify.json", json.dumps(report, indent=2) + "\n")
    return report
