"""A dataset of an expert's successful eval episodes is worth cloning (docs/dataset.md).

For each expert (the README's main job on the built-in env, and CartPole-v1 with
``+experiment=cartpole``; trained first unless given): ``python -m rlrec.dataset`` writes
``--episodes`` (300, 50) of its successful episodes (CartPole reports no success: all its
episodes, which reach the 500-step limit) in one evaluation of that many envs, timed against an
evaluation of the same episodes with per-episode clips (``eval_env.clips=all``), with its size
per 1,000 frames; then a behaviour-cloning MLP learns ``action`` from ``observation.state`` (the
dataset's own statistics normalise it) and rlrec's evaluator scores it on ``--eval`` episodes of
seeds the dataset does not hold.

    python scripts/bench_bc.py [--builtin RUN_DIR] [--cartpole RUN_DIR] [--episodes N] [--eval 500]
    python scripts/bench_bc.py --write-docs   # its table into docs/benchmarks.md
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl
import pyarrow.parquet as pq
import torch
from torch import nn

REPO = bl.ROOT

from rlrec.dataset import DatasetConfig, Keep, make  # noqa: E402
from rlrec.layout import RunDir  # noqa: E402
from rlrec.run.replay import replay_config  # noqa: E402
from rlrec.train import checkpoint as ckpt  # noqa: E402
from rlrec.train.evaluation import Evaluator  # noqa: E402
from rlrec.train.policy import load_policy  # noqa: E402
from rlrec.train.stack import close_all  # noqa: E402

# each expert's preset and the episodes of its dataset (CartPole's 500-step episodes are long)
EXPERTS = {"builtin": ([], 300), "cartpole": (["+experiment=cartpole"], 50)}
HELD_OUT = "eval_env.seed=5000000"  # seeds no dataset here holds
STEPS = 5000  # BC's Adam steps (minibatches of 256 rows)


def _evaluate(run: Path, policy, overrides, video_dir=None) -> dict:
    """rlrec's evaluator on the run's eval env (``overrides`` applied), driven by ``policy``;
    its figures and its seconds, the env's build and the clips' encoding included."""
    t0 = time.perf_counter()
    path, data = ckpt.of_step(RunDir(run).checkpoints, None, "step")
    cfg = replay_config(data["config"], 0, ["eval_env.recorder.enabled=false", *overrides])
    evaluator = Evaluator(cfg.env, cfg.sim, cfg.eval_env, video_dir=video_dir)
    try:
        out = evaluator.run(policy or load_policy(path), 0)
    finally:
        close_all([evaluator.env], evaluator)
    return {**out, "seconds": time.perf_counter() - t0}


def _clone(root: Path, discrete: bool):
    """A 2x256 MLP fitted to the dataset's actions (MSE; cross-entropy for a discrete action)."""
    data = pq.read_table(root / "data/chunk-000/file-000.parquet").to_pydict()
    stats = json.loads((root / "meta/stats.json").read_text())["observation.state"]
    mean, std = torch.tensor(stats["mean"]), torch.tensor(stats["std"]) + 1e-6
    x = (torch.tensor(data["observation.state"]) - mean) / std
    y = torch.tensor(data["action"])
    net = nn.Sequential(nn.Linear(x.shape[1], 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
    net.append(nn.Linear(256, 2 if discrete else y.shape[1]))
    loss_fn = nn.CrossEntropyLoss() if discrete else nn.MSELoss()
    torch.manual_seed(0)  # (the dataset's and the evaluations' draws come before)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(STEPS):
        idx = torch.randint(len(x), (256,))
        loss = loss_fn(net(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()

    def policy(obs):
        a = net((obs.float() - mean) / std)
        return a.argmax(1) if discrete else a

    return policy, loss.item()


def bench(name: str, run: Path, tmp: Path, episodes: int, n_eval: int) -> list:
    """The row of expert ``name``: its dataset, the clips' time, BC's and the expert's scores."""
    root = tmp / f"{name}-dataset"
    keep = Keep.success if name == "builtin" else Keep.all  # CartPole reports no success
    t0 = time.perf_counter()
    batch = [f"eval_env.num_envs={episodes}"]  # one evaluation, when enough of them are kept
    made = make(run, DatasetConfig(episodes=episodes, keep=keep, dir=str(root)), batch)
    seconds = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    tried = made["tried"]  # the same episodes (seeds eval_env.seed + k), one clip each
    clips = ["eval_env.clips=all", f"eval_env.num_envs={tried}", "eval_env.episodes=null"]
    clips.append("eval_env.recorder.fps=null")  # every step a frame, as the dataset
    timed = _evaluate(run, None, clips, str(tmp / f"{name}-clips"))
    info = json.loads((root / "meta/info.json").read_text())
    policy, _ = _clone(root, info["features"]["action"]["dtype"] == "int64")
    held_out = [f"eval_env.num_envs={n_eval}", HELD_OUT]
    bc, expert = _evaluate(run, policy, held_out), _evaluate(run, None, held_out)
    score = lambda r: f"{r.get('eval/success', float('nan')):.3f} ({r['eval/return']:.2f})"  # noqa: E731
    return [
        name,
        f"{made['episodes']} of {tried} tried, {made['frames']:,} frames",
        f"{size / made['frames'] * 1000 / 1e6:.2f} MB",
        f"{seconds:.1f} s / {timed['seconds']:.1f} s",
        score(bc),
        score(expert),
    ]


def main() -> None:
    b = bl.Bench(__file__, __doc__)
    for name in EXPERTS:
        b.parser.add_argument(f"--{name}", type=Path, help="its trained run dir (default: train)")
    b.parser.add_argument("--episodes", type=int, help="of each dataset (default: 300, 50)")
    b.parser.add_argument("--eval", type=int, default=500)
    args = b.args()
    torch.set_num_threads(1)  # as a run (docs/architecture.md): threads spin on a small MLP
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (preset, episodes) in EXPERTS.items():
            run = getattr(args, name) or Path(tmp, name)
            if getattr(args, name) is None:
                train = ["train.py", *preset, f"hydra.run.dir={run}", "report.enabled=false"]
                subprocess.run([sys.executable, *train], cwd=REPO, check=True, capture_output=True)
            rows.append(bench(name, run, Path(tmp), args.episodes or episodes, args.eval))
    head = ["expert", "dataset", "per 1,000 frames", "dataset / clips time"]
    b.table([*head, f"BC on {args.eval} held-out seeds: success (return)", "the expert"], rows)
    b.finish()


if __name__ == "__main__":
    main()
