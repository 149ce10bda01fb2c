"""Replays an eval episode of a run: ``python -m rlrec.run.replay RUN_DIR replay.step=S
replay.env=E [KEY=VALUE ...]`` (``rlrec-replay`` once installed).

It re-runs the evaluation of training step ``S`` from the run's own config (the one saved in its
checkpoints) and the checkpoint of that step (``S = 0``, the untrained policy, rebuilt from the
run's seed when no checkpoint of step 0 exists), recording env ``E``'s first episode, the one
``eval_episodes.jsonl`` lists with ``"env": E`` and a seed. The whole eval batch is re-run (same
``eval_env.num_envs``, seed and device), so the episode is the one of the batch, not of a batch of
one. ``KEY=VALUE`` overrides change the replay's config (``env.render_width=512
env.render_height=512`` re-renders it larger, ``eval_env.recorder.lossless=true`` encodes it
exactly). The clip, its sidecar and the replay's own ``eval_episodes.jsonl`` go to
``RUN_DIR/replay/step{S:09d}-env{E:03d}/`` (``replay.dir=PATH`` elsewhere); the path of the clip
is printed.

On the CPU backends (built-in, Gymnasium, ManiSkill's CPU sim) the replay at the original size is
frame for frame the original clip when both are lossless (docs/recorder.md, "Replaying an
episode", says what holds on the batched GPU sims).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from omegaconf import OmegaConf

from rlrec.checks import ConfigError
from rlrec.config import Config, KeptClips, to_dataclass
from rlrec.layout import RunDir
from rlrec.record import names
from rlrec.record.settings import Trigger
from rlrec.run import preempt
from rlrec.train import checkpoint as ckpt

USAGE = "python -m rlrec.run.replay RUN_DIR replay.step=S replay.env=E [KEY=VALUE ...]"


def find_checkpoint(run_dir: Path, step: int) -> Tuple[Optional[Path], dict]:
    """The checkpoint of ``step`` in ``run_dir/checkpoints`` (None for step 0 without one) and the
    data of a checkpoint of the run (for its config); ConfigError when there is none."""
    folder = RunDir(run_dir).checkpoints
    try:
        return ckpt.of_step(folder, step, "replay.step")
    except ConfigError as exc:
        if step != 0:
            raise ConfigError(
                f"{exc}; an evaluation is replayable where a checkpoint was written at its step "
                "(checkpoint_every a divisor of eval_env.every, and the final one)"
            ) from None
    # step 0 without a checkpoint: the untrained policy, of the config a checkpoint of the run holds
    data = next((d for _, d in ckpt.scan(folder) if not isinstance(d, ConfigError)), None)
    if data is None:
        raise ConfigError(f"replay: no readable checkpoint in {folder}")
    return None, data


def replay_config(saved: dict, env: int, overrides: Sequence[str] = ()) -> Config:
    """The replay's config: the run's ``saved`` config, recording eval env ``env``'s first
    episode (no per-episode clips), then ``overrides``."""
    from hydra import compose, initialize_config_dir

    from rlrec.run.cli import CONFIG_DIR  # registers the schemas

    with initialize_config_dir(version_base="1.3", config_dir=CONFIG_DIR):
        base = compose("config", overrides=[f"env={saved['env']['name']}"])
    recorder = {"enabled": True, "trigger": Trigger.eval.value, "every": None, "env_idx": [env]}
    recorder.update(filename=None, dir=None, record_final_episode=False)
    merged = OmegaConf.merge(
        base,
        {k: v for k, v in saved.items() if k != "hydra"},
        {
            "eval_env": {"recorder": recorder, "clips": KeptClips.none.value},
            "eval_only": False,  # set below: step 0 may have no checkpoint to name
            "recorder": {"enabled": False},  # the train env's
            "resume": None,
            "checkpoint": None,
            "logger": {"name": "none", "progress": False},
            "distributed": saved.get("distributed", {}),
        },
        OmegaConf.from_dotlist(list(overrides)),
    )
    return to_dataclass(merged)


def replay(
    run_dir: Path, step: int, env: int, overrides: Sequence[str] = (), out: Optional[Path] = None
) -> Path:
    """Re-runs the evaluation of ``step`` of ``run_dir`` recording eval env ``env``; returns the
    clip's path."""
    from rlrec.train.runner import Runner

    path, data = find_checkpoint(Path(run_dir), step)
    cfg = replay_config(data["config"], env, overrides)  # refuses an env past eval_env.num_envs
    out = Path(out) if out is not None else RunDir(run_dir).replay(step, env)
    out.mkdir(parents=True, exist_ok=True)
    if path is not None:
        cfg.checkpoint, cfg.eval_only = str(path), True
    # step 0 without a checkpoint: the untrained policy, built from the run's seed as the
    # training run built it (its train env too), then evaluated once
    runner = Runner(cfg, out, stop=preempt.StopRequested())
    try:
        if path is None:
            runner.evaluate()
        else:
            runner.run()
    finally:
        runner.close()
    clip = RunDir(out).videos("eval") / names.evaluation(step)
    if not clip.exists():
        raise RuntimeError(f"replay: the clip {clip} was not written (see the log above)")
    return clip


def _parse(argv: List[str]) -> Tuple[Path, int, int, List[str], Optional[Path]]:
    """``replay``'s arguments, in its order, from the command line."""
    if not argv or "=" in argv[0]:
        raise ConfigError(f"usage: {USAGE}")
    numbers, out, rest = {}, None, []  # replay.step and replay.env
    for arg in argv[1:]:
        key, _, value = arg.partition("=")
        if key in ("replay.step", "replay.env"):
            try:
                numbers[key] = int(value)
            except ValueError:
                raise ConfigError(f"{key}={value!r} is invalid: an integer") from None
        elif key == "replay.dir":
            out = Path(value)
        else:
            rest.append(arg)
    if len(numbers) < 2:
        raise ConfigError(f"replay.step and replay.env are both needed; usage: {USAGE}")
    return Path(argv[0]), numbers["replay.step"], numbers["replay.env"], rest, out


def main(argv: Optional[List[str]] = None) -> None:
    try:
        clip = replay(*_parse(sys.argv[1:] if argv is None else argv))
    except ConfigError as exc:
        print(f"rlrec replay: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"rlrec replay: {clip}", flush=True)


if __name__ == "__main__":
    main()
