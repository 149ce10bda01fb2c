"""``python -m rlrec.dataset`` on the built-in env: which episodes it keeps and how many it tries,
bad input refused in one line before anything is written, no partial dataset under its final
name after a kill, bounded memory, the batched GPU sims' seed rule, and the run's report."""

import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc

import pyarrow.parquet as pq
import pytest

from rlrec.dataset.__main__ import main
from rlrec.envs.builtin import PointReach
from rlrec.layout import RunDir
from rlrec.report.html import write_report
from tests.dataset.common import tiny_run
from tests.helpers import REPO

SHORT = ["env.max_episode_steps=10", "eval_env.num_envs=8"]
EASY = [*SHORT, "env.goal_radius=0.7"]  # the untrained policy succeeds now and then


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("run") / "run")


def _episodes(root):
    """Per episode: its seed, and whether it succeeded at some step."""
    data = pq.read_table(root / "data/chunk-000/file-000.parquet").to_pydict()
    meta = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    won = [False] * len(meta)
    for e, s in zip(data["episode_index"], data["next.success"]):
        won[e] |= s
    return [m["seed"] for m in meta], won


def _files(run):
    return sorted(p.relative_to(run) for p in run.rglob("*"))


def test_keep_chooses_the_episodes_and_tries_are_bounded(run, capsys):
    for keep in ("success", "failed"):
        root = run / f"datasets/{keep}"
        argv = [str(run), "dataset.episodes=3", f"dataset.keep={keep}", f"dataset.dir={root}"]
        assert main([*argv, *EASY]) == 0
        seeds, won = _episodes(root)
        assert won == [keep == "success"] * 3 and seeds == sorted(seeds)
    lines = RunDir(run).datasets.read_text().splitlines()
    assert [json.loads(x)["path"] for x in lines] == [
        str(run / "datasets/success"),
        str(run / "datasets/failed"),
    ]
    before = _files(run)
    never = [str(run), "dataset.episodes=2", "dataset.keep=success", "dataset.tries=9"]
    assert main([*never, *SHORT, "env.goal_radius=0.001"]) == 1  # two evaluations of 8 envs
    err = capsys.readouterr().err
    assert "0 of the 2 episodes asked for (dataset.keep=success) in the 16 tried" in err
    assert _files(run) == before  # nothing written, nor listed


BAD = [
    (["dataset.keep=best"], "expected one of [all, success, failed] full_key: dataset.keep"),
    (["dataset.episodes=0"], "dataset.episodes=0 is invalid: must be a positive number"),
    ([], "dataset.episodes=0 is invalid"),  # required
    (["dataset.episodes=two"], "'two' of type 'str' could not be converted to Integer"),
    (["dataset.step=77"], "holds no checkpoint of step 77: dataset.step= one of 128"),
    (["dataset.dir=DIR"], "exists and is not an empty folder"),
    (["dataset.size=3"], "dataset.size is not a config key: allowed keys at dataset"),
    (["eval_env.num_envs=many"], "eval_env.num_envs"),
    (["env.obs_mode=rgb"], "the checkpoint's policy (6,): drop the overrides"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(a) or "none" for a, _ in BAD])
def test_bad_input_is_one_line_status_2_and_nothing_written(run, capsys, args, message):
    full = run / "checkpoints"  # a folder that is not empty
    args = [a.replace("DIR", str(full)) for a in args]
    episodes = (
        []
        if any(a.startswith("dataset.episodes") for a in args) or not args
        else ["dataset.episodes=2"]
    )
    before = _files(run)
    assert main([str(run), *episodes, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlrec-dataset: ") and message in err and err.count("\n") == 1, err
    assert _files(run) == before


def test_a_missing_extra_is_named(run, capsys, monkeypatch):
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "pyarrow" else find(n, *a)
    )
    before = _files(run)
    assert main([str(run), "dataset.episodes=1"]) == 2
    assert (
        "needs the 'dataset' extra (pyarrow, pandas): pip install 'rlrec[dataset]'"
        in capsys.readouterr().err
    )
    assert _files(run) == before


def test_a_kill_mid_write_leaves_no_dataset_under_its_name(run):
    final = run / "datasets/killed"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlrec.dataset",
            str(run),
            "dataset.episodes=100000",
            f"dataset.dir={final}",
            *SHORT,
        ],
        cwd=REPO,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    parts = []
    while not any(any(p.glob("data/*/*.parquet")) for p in parts) and time.monotonic() < deadline:
        time.sleep(0.1)
        parts = list(final.parent.glob(f".killed.{proc.pid}-*.part"))  # rlrec.files' scheme
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert parts and any(parts[0].glob("data/*/*.parquet")), "it never began to write"
    assert not final.exists()


def test_memory_does_not_grow_with_the_episodes(run):
    """Two evaluations' frames (8 MB at 128x128) pass through; one evaluation's stay."""
    big = [*SHORT, "env.render_width=128", "env.render_height=128"]
    peaks = []
    for n in (1, 8, 16):  # (the first loads what a dataset imports) one evaluation, two
        tracemalloc.start() if n > 1 else None
        assert main([str(run), f"dataset.episodes={n}", f"dataset.dir={run}/m{n}", *big]) == 0
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[2] < peaks[1] + 1_000_000, peaks


def test_one_seed_per_batch_is_each_episode_s_seed(run, monkeypatch):
    """The batched GPU sims (ManiSkill's physx_cuda, Genesis) seed the whole batch with one seed
    (``seed_per_env = False``): each episode records it, with its env of the batch."""
    monkeypatch.setattr(PointReach, "seed_per_env", False)
    root = run / "datasets/batch"
    assert main([str(run), "dataset.episodes=10", f"dataset.dir={root}", *SHORT]) == 0
    meta = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    base = 1_000_000
    assert [(m["seed"], m["env"]) for m in meta] == [
        (base + 8 * (k // 8), k % 8) for k in range(10)
    ]


def test_the_report_lists_the_datasets(run):
    root = run / "datasets/listed"
    assert main([str(run), "dataset.episodes=1", f"dataset.dir={root}", *SHORT]) == 0
    page = write_report(run).read_text()
    assert '<h2 id="datasets">Datasets</h2>' in page and f"<code>{root}</code>" in page


def test_rlrec_replay_reproduces_an_episode(run, tmp_path):
    """``python -m rlrec.run.replay`` of an episode's seed (its evaluation's reset seed, its env)
    shows the episode's frames and ends as it did."""
    import imageio_ffmpeg
    import numpy as np

    from rlrec.run.replay import replay

    root, lossless = run / "datasets/replayed", "eval_env.recorder.lossless=true"
    assert main([str(run), "dataset.episodes=10", f"dataset.dir={root}", *SHORT, lossless]) == 0
    ep = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()[9]
    seed = f"eval_env.seed={ep['reset_seed']}"  # the second evaluation's, env 1
    clip = replay(run, 128, ep["env"], [*SHORT, lossless, seed], tmp_path / "replay")
    line = json.loads((tmp_path / "replay/eval_episodes.jsonl").read_text().splitlines()[ep["env"]])
    assert (line["seed"], line["length"]) == (ep["seed"], ep["length"])

    def frames(path):
        gen = imageio_ffmpeg.read_frames(str(path))
        size = next(gen)["size"]
        return [np.frombuffer(f, np.uint8).reshape(size[1], size[0], 3) for f in gen]

    video = root / "videos/observation.images.render/chunk-000/file-000.mp4"
    ours = frames(video)[ep["dataset_from_index"] : ep["dataset_to_index"]]
    assert np.array_equal(np.stack(ours), np.stack(frames(clip)[: ep["length"]]))


def test_sampled_actions_differ_from_the_mean_and_repeat(run):
    def first_actions(name, *more):
        root = run / f"datasets/{name}"
        assert main([str(run), "dataset.episodes=1", f"dataset.dir={root}", *SHORT, *more]) == 0
        return pq.read_table(root / "data/chunk-000/file-000.parquet")["action"].to_pylist()

    mean = first_actions("mean")
    sampled = first_actions("sampled", "dataset.sample=true")
    assert sampled != mean and sampled == first_actions("again", "dataset.sample=true")
