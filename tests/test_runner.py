"""The runner end to end on the built-in env: outputs, resume, evaluation, bad checkpoints."""

import json
from pathlib import Path

import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.train import checkpoint as ckpt
from rlrec.train.runner import Runner
from tests.helpers import FAST, make_config, read_metrics, run_train


def _run(tmp_path: Path, name: str, overrides):
    run_dir = tmp_path / name
    run_dir.mkdir()
    cfg = make_config([*FAST, "recorder=none", "eval_env.recorder.enabled=false", *overrides])
    return Runner(cfg, run_dir), run_dir


def test_train_writes_metrics_checkpoints_and_evals(tmp_path):
    runner, run_dir = _run(tmp_path, "a", ["total_steps=1024", "checkpoint_every=2"])
    result = runner.run()
    lines = read_metrics(run_dir)
    assert all("step" in line for line in lines)
    evals = [line for line in lines if "eval/return" in line]
    # one before training (eval_env.at_start), then every 2 iterations of 128 steps, and at the
    # end: 8 iterations -> evals at 0, 2, 4, 6, 8
    assert [e["step"] for e in evals] == [0, 256, 512, 768, 1024]
    assert all("eval/success" in e and "eval/length" in e for e in evals)
    assert result["eval/return"] == evals[-1]["eval/return"]
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == [
        "iter_000002.pt",
        "iter_000004.pt",
        "iter_000006.pt",
        "iter_000008.pt",
        "last.pt",
    ]
    data = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert data["global_step"] == 1024 and data["iteration"] == 8
    assert {"agent", "optimizer", "obs_norm"} <= set(data["ppo"]) and "rng" in data


def test_resume_is_bit_exact(tmp_path):
    common = ["algo.anneal_lr=false", "eval_env.every=3"]
    full, _ = _run(tmp_path, "full", [*common, "total_steps=1536"])
    full.run()
    half, half_dir = _run(tmp_path, "half", [*common, "total_steps=768"])
    half.run()
    resumed, resumed_dir = _run(
        tmp_path,
        "resumed",
        [*common, "total_steps=1536", f"checkpoint={half_dir}/checkpoints/last.pt"],
    )
    resumed.run()
    a = ckpt.load(tmp_path / "full" / "checkpoints" / "last.pt")
    b = ckpt.load(resumed_dir / "checkpoints" / "last.pt")
    assert a["global_step"] == b["global_step"] == 1536
    for k, v in a["ppo"]["agent"].items():
        assert torch.equal(v, b["ppo"]["agent"][k]), k
    for k, v in a["ppo"]["obs_norm"].items():
        assert torch.equal(v, b["ppo"]["obs_norm"][k]), k
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])
    steps = [m["step"] for m in read_metrics(resumed_dir) if "loss/policy" in m]
    assert steps[0] == 768 + 128, "the resumed run continues the step count"
    # the evaluation at start is the new run's only: the resumed run does not redo step 0
    evals = [m["step"] for m in read_metrics(resumed_dir) if "eval/return" in m]
    assert evals == [1152, 1536]


def test_a_finished_run_resumed_does_not_evaluate_again(tmp_path):
    runner, run_dir = _run(tmp_path, "a", ["total_steps=512"])
    runner.run()
    cfg = make_config([*FAST, "recorder=none", "eval_env.recorder.enabled=false"])
    cfg.total_steps, cfg.resume = 512, "auto"
    Runner(cfg, run_dir).run()
    evals = [m["step"] for m in read_metrics(run_dir) if "eval/return" in m]
    assert evals == [0, 256, 512]
    steps = [json.loads(x)["step"] for x in (run_dir / "eval_episodes.jsonl").open()]
    assert steps == [0, 0, 256, 256, 512, 512]  # no line twice


def test_eval_at_start_off(tmp_path):
    runner, run_dir = _run(tmp_path, "a", ["total_steps=512", "eval_env.at_start=false"])
    runner.run()
    evals = [m["step"] for m in read_metrics(run_dir) if "eval/return" in m]
    assert evals == [256, 512]


def test_resume_auto_continues_newest_checkpoint(tmp_path):
    runner, run_dir = _run(tmp_path, "r", ["total_steps=512"])
    runner.run()
    cfg = make_config(
        [
            *FAST,
            "recorder=none",
            "eval_env.recorder.enabled=false",
            "total_steps=1024",
            "resume=auto",
        ]
    )
    Runner(cfg, run_dir).run()
    assert ckpt.load(run_dir / "checkpoints" / "last.pt")["global_step"] == 1024


def test_eval_only_evaluates_a_checkpoint(tmp_path):
    runner, run_dir = _run(tmp_path, "t", ["total_steps=512"])
    runner.run()
    ev, ev_dir = _run(
        tmp_path, "e", ["eval_only=true", f"checkpoint={run_dir}/checkpoints/last.pt"]
    )
    result = ev.run()
    assert set(result) >= {"eval/return", "eval/length", "eval/success"}
    assert ev.train_env is None


@pytest.mark.parametrize("content", [None, b"not a checkpoint", "torch-other"])
def test_bad_checkpoint_fails_before_work(tmp_path, content):
    path = tmp_path / "x.pt"
    if content == "torch-other":
        torch.save({"weights": torch.zeros(2)}, path)
    elif content is not None:
        path.write_bytes(content)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = make_config([*FAST, f"checkpoint={path}"])
    with pytest.raises(ConfigError) as e:
        Runner(cfg, run_dir)
    assert "checkpoint=" in str(e.value)
    assert ("does not exist" if content is None else "not an rlrec checkpoint") in str(e.value)
    assert list(run_dir.iterdir()) == []


def test_checkpoint_from_other_env_is_refused():
    import gymnasium as gym

    from rlrec.train.resume import StartCheckpoint

    data = {"obs_shape": (4,), "action_space": "Discrete(2)", "env_name": "gymnasium"}
    with pytest.raises(ConfigError) as e:
        StartCheckpoint("x.pt", data, "checkpoint").check_compatible(
            (6,), gym.spaces.Box(-1, 1, (2,))
        )
    assert "checkpoint" in str(e.value) and "(4,)" in str(e.value) and "(6,)" in str(e.value)


def test_eval_only_without_checkpoint_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="eval_only"):
        Runner(make_config([*FAST, "eval_only=true"]), tmp_path)


@pytest.mark.slow
def test_train_py_subprocess_output_layout(tmp_path):
    proc = run_train(
        [
            *FAST,
            "logger=tensorboard",
            "total_steps=512",
            "eval_env.every=1",
            f"hydra.run.dir={tmp_path}/run",
        ],
        cwd=tmp_path,
    )
    run_dir = tmp_path / "run"
    assert "eval return" in proc.stdout and str(run_dir) in proc.stdout
    for p in (".hydra/config.yaml", "metrics.jsonl", "checkpoints/last.pt"):
        assert (run_dir / p).exists(), p
    events = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert events
    # every saved clip is logged: its path in metrics.jsonl, the clip in TensorBoard
    lines = read_metrics(run_dir)
    for kind in ("train", "eval"):
        paths = [m[f"video/{kind}"] for m in lines if f"video/{kind}" in m]
        assert paths, kind
        assert all((run_dir / p).is_file() and p.startswith(f"videos/{kind}/") for p in paths)
        # each clip and its sidecar, nothing else
        assert sorted(p.name for p in (run_dir / "videos" / kind).iterdir()) == sorted(
            Path(p).with_suffix(ext).name for p in paths for ext in (".json", ".mp4")
        )
    # eval clips are encoded while training goes on, and logged at their evaluation's step;
    # each eval line names its clip, and that clip's sidecar is of that evaluation
    evals = [m for m in lines if "eval/return" in m]
    clip_lines = {m["step"]: m["video/eval"] for m in lines if "video/eval" in m}
    # one evaluation before training (eval_env.at_start), then one per iteration
    assert len(evals) == 5 and sorted(clip_lines) == [m["step"] for m in evals]
    for m in evals:
        assert m["eval/clip"] == clip_lines[m["step"]]
        assert m["eval/clip"] == f"videos/eval/eval-step{m['step']:09d}.mp4"  # named by step
        side = json.loads((run_dir / m["eval/clip"]).with_suffix(".json").read_text())
        assert side["tag"] == m["step"] and side["kind"] == "eval" and side["seed"] == 1_000_000
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    acc.Reload()
    assert {"video/train", "video/eval"} <= set(acc.Tags()["images"])
    assert {"loss/policy", "sps/collect", "time/learn", "eval/return"} <= set(acc.Tags()["scalars"])


@pytest.mark.slow
def test_config_error_exits_cleanly_and_writes_nothing(tmp_path):
    proc = run_train(
        [*FAST, "eval_env.num_envs=0", f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path, check=False
    )
    assert proc.returncode == 2
    assert "eval_env.num_envs=0" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_two_runs_in_the_same_second_get_different_dirs(tmp_path):
    import subprocess
    import sys

    from tests.helpers import REPO

    args = [
        sys.executable,
        str(REPO / "train.py"),
        *FAST,
        "total_steps=128",
        "eval_env.enabled=false",
    ]
    procs = [
        subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    dirs = list((tmp_path / "outputs").glob("*/*"))
    assert len(dirs) == 2


def test_final_episode_clip_is_saved_at_the_end(tmp_path):
    from rlrec.record import Recorder

    run_dir = tmp_path / "fin"
    run_dir.mkdir()
    # cubic: clips for episodes 0 and 1 only, then the final episode (in progress at the end)
    cfg = make_config(
        [
            *FAST,
            "total_steps=4096",
            "eval_env.enabled=false",
            "env.max_episode_steps=40",
            "algo.learning_rate=1e-9",
        ]
    )
    runner = Runner(cfg, run_dir)
    rec = runner.train_env.find(Recorder)
    runner.run()
    clips = [m["video/train"] for m in read_metrics(run_dir) if "video/train" in m]
    assert clips[:2] == [c for c in clips if "-ep000000-" in c or "-ep000001-" in c]
    last = sorted(clips)[-1]
    # 4096 steps = 512 steps of env 0; episodes last at most 40 steps, so the final clip starts late
    first_step = int(last.split("-step")[1].split(".")[0])
    assert first_step > 512 - 40 - 16, last
    assert rec.engine.episode >= 512 // 40


@pytest.mark.slow
def test_wandb_offline_logs_metrics_and_clips(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "wb"
    run_train(
        [
            *FAST,
            "logger=wandb",
            "logger.wandb_mode=offline",
            "total_steps=512",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
    )
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    videos = list(runs[0].rglob("media/videos/**/*.mp4"))
    logged = [m for m in read_metrics(run_dir) if "video/train" in m or "video/eval" in m]
    assert len(videos) == len(logged) > 0
    assert list(runs[0].glob("run-*.wandb"))


@pytest.mark.slow
def test_resume_auto_continues_the_wandb_run_and_logs_no_step_twice(tmp_path, monkeypatch):
    """A run killed after its checkpoint at iteration 2 (its later checkpoints removed: the kill
    came before them) had sent W&B steps up to 640; resume=auto continues the same W&B run (its
    id kept in the run dir) from step 256 and sends W&B only the steps after 640."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "wb"
    args = [*FAST, "logger=wandb", "logger.wandb_mode=offline", "checkpoint_every=2"]
    args += [f"hydra.run.dir={run_dir}"]
    run_train([*args, "total_steps=640"], cwd=tmp_path)
    for name in ("last.pt", "iter_000004.pt"):
        (run_dir / "checkpoints" / name).unlink()
    run_train([*args, "total_steps=1024", "resume=auto"], cwd=tmp_path)

    runs = sorted((run_dir / "wandb").glob("offline-run-*"), key=lambda p: p.name)
    ids = {p.name.rsplit("-", 1)[1] for p in runs}
    assert len(runs) == 2 and len(ids) == 1, runs  # one W&B run, written by both processes
    (first, second) = [_wandb_history_steps(next(p.glob("run-*.wandb"))) for p in runs]
    assert first == [0, 128, 256, 384, 512, 640] and second == [768, 896, 1024]
    # metrics.jsonl and TensorBoard hold the resumed run's lines of steps 384..640
    resumed = [m["step"] for m in read_metrics(run_dir) if "train/lr" in m]
    assert resumed == list(range(128, 1025, 128))
    kept = json.loads((run_dir / "wandb_run.json").read_text())
    assert kept == {"id": ids.pop(), "step": 1024}


def _wandb_history_steps(path: Path) -> list:
    """The step of each history record of an offline W&B run file (``run-ID.wandb``): a 7-byte
    header, then 32 KiB blocks of records (each with a 7-byte header: CRC, length, type: FULL 1,
    FIRST 2, MIDDLE 3, LAST 4) that hold W&B's protobuf Records."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, steps, part, pos, block = path.read_bytes(), [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the rest of a block is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack_from("<IHB", data, pos)
        part += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a record is whole
            record = pb.Record()
            record.ParseFromString(part)
            part = b""
            if record.HasField("history"):
                steps.append(record.history.step.num)
    return steps


def _assert_final_clip_covers_the_last_step(run_dir: Path, rec) -> None:
    """The last train clip in metrics.jsonl is of the episode of env 0 in progress at the end,
    and its last frame is the run's final env step."""
    from rlrec.testing import decode

    clips = [m["video/train"] for m in read_metrics(run_dir) if "video/train" in m]
    assert clips, "no train clip"
    name = Path(clips[-1]).name  # train-ep000042-step000000504.mp4
    episode = int(name.split("-ep")[1].split("-")[0])
    first_step = int(name.split("-step")[1].split(".")[0])
    frames, _ = decode(str(run_dir / clips[-1]))
    assert rec.engine.steps_per_frame == 1
    assert episode == rec.engine.episode, (clips[-1], rec.engine.episode)
    steps = rec.engine.steps
    assert first_step + len(frames) - 1 == steps, (clips[-1], len(frames), steps)


def test_final_episode_has_a_clip_on_the_main_job_shape(tmp_path):
    """`python train.py` defaults, small: episodes (at most 12 steps, often fewer: a wide goal)
    shorter than algo.num_steps (32), the default cubic trigger, evaluations on."""
    from rlrec.record import Recorder

    run_dir = tmp_path / "main"
    run_dir.mkdir()
    cfg = make_config(
        [
            "env.num_envs=8",
            "env.render_width=32",
            "env.render_height=32",
            "env.max_episode_steps=12",
            "env.goal_radius=0.5",
            "eval_env.num_envs=2",
            "total_steps=2048",
            "logger=none",
            "logger.progress=false",
        ]
    )
    assert cfg.algo.num_steps == 32 and cfg.recorder.record_final_episode
    runner = Runner(cfg, run_dir)
    rec = runner.train_env.find(Recorder)
    runner.run()
    assert rec.engine.steps == 2048 // 8 and rec.engine.episode > 2048 // 8 // 12
    _assert_final_clip_covers_the_last_step(run_dir, rec)


def test_final_episode_has_a_clip_on_cartpole(tmp_path):
    """`env=gymnasium +experiment=cartpole`, shortened, with the train recorder on: episodes of
    a barely trained policy, far shorter than the 100-step limit set here."""
    pytest.importorskip("gymnasium")
    from rlrec.record import Recorder

    run_dir = tmp_path / "cartpole"
    run_dir.mkdir()
    cfg = make_config(
        [
            "env=gymnasium",
            "+experiment=cartpole",
            "recorder.enabled=true",
            "env.max_episode_steps=100",
            "seed=3",  # at 8b71342 (one arming per iteration) its final episode had no clip
            "total_steps=2048",
            "eval_env.enabled=false",
            "logger=none",
            "logger.progress=false",
        ]
    )
    runner = Runner(cfg, run_dir)
    rec = runner.train_env.find(Recorder)
    runner.run()
    assert rec.engine.steps == 2048 // 8 and rec.engine.episode >= 3
    _assert_final_clip_covers_the_last_step(run_dir, rec)


@pytest.mark.parametrize("horizon", [[], ["env.max_episode_steps=1000"]])
def test_train_clips_are_the_triggers_and_the_final_one(tmp_path, horizon):
    """record_final_episode records every episode that may still run at the end (those that
    begin within the last max_episode_steps steps: with 1000, longer than the run, every one),
    but keeps only the one in progress at the end: the train clips are exactly the cubic
    trigger's and that one. Episodes of a few dozen steps (a wide goal) against a 100-step limit
    (issue 48: episode 5 of this run was kept too)."""
    from rlrec.record.schedule import capped_cubic

    run_dir = tmp_path / "run"
    args = ["env.num_envs=8", "env.goal_radius=0.4", "algo.num_steps=32", "total_steps=2560"]
    args += ["eval_env.enabled=false", "env.render_width=32", "env.render_height=32"]
    args += ["logger=none", "logger.progress=false", "report.enabled=false", *horizon]
    run_train([*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    videos = run_dir / "videos" / "train"
    sidecars = {p.name: json.loads(p.read_text()) for p in videos.glob("*.json")}
    assert sorted(p.name for p in videos.iterdir()) == sorted(
        [*sidecars, *(s["video"] for s in sidecars.values())]
    )  # each clip with its sidecar, nothing else
    episodes = {int(name.split("-ep")[1].split("-")[0]) for name in sidecars}
    # the final clip: the episode of env 0 in progress at the run's last step (2560 / 8)
    final = [s for s in sidecars.values() if s["last_step"] == 320 and s["envs"][0]["end"] == "cut"]
    assert len(final) == 1, sidecars
    last = final[0]["episodes"][0]
    assert last >= 3  # episodes 2 and up to last - 1 (not cubic) were no one's
    assert episodes == {e for e in range(last) if capped_cubic(e)} | {last}


def test_a_clip_lost_at_the_final_evaluation_is_counted_in_the_report(tmp_path):
    """The only evaluation is the final one (after the loop), and its clip is lost (the eval
    clips' directory turns into a file): metrics.jsonl ends with the loss counters as the stacks
    closed, so the report's health row counts the clip, and the evaluation reads as lost."""
    import re

    from rlrec.report.html import write_run_report

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    clips = tmp_path / "eval_clips"
    cfg = make_config(
        [
            *FAST,
            "total_steps=256",
            "recorder=none",
            "eval_env.at_start=false",
            "eval_env.every=100",
            f"eval_env.recorder.dir={clips}",
        ]
    )
    runner = Runner(cfg, run_dir)
    clips.rmdir()
    clips.write_text("not a directory")  # the final evaluation's clip cannot be put in place
    runner.run()
    assert runner.losses["record/clips_dropped"] == 1
    lines = read_metrics(run_dir)
    (evaluation,) = [m for m in lines if "eval/return" in m]
    assert evaluation["eval/clip"] is None and evaluation["eval/clip_lost"] is True
    train = [m for m in lines if "train/lr" in m]
    assert train and all(m["record/clips_dropped"] == 0 for m in train)  # logged before it
    page = write_run_report(run_dir).read_text()
    health = page[page.index('id="health"') : page.index('id="progress"')]
    assert re.search(r'data-health="clips_dropped">1<', health), health
    assert re.search(r'data-health="clips_missing">1<', health), health
    frames = runner.losses["record/frames_dropped"]
    assert frames > 0 and f'data-health="frames_dropped">{frames}<' in health
