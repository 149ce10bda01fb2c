"""The runner end to end on the built-in env: outputs, evaluation, resume (rlrec.train.resume: the
resume point, where a run starts from), bad checkpoints, clips, W&B."""

import json
import re
import signal
from pathlib import Path

import pytest
import torch

from rlrec.checks import ConfigError
from rlrec.ppo.ppo import PPO
from rlrec.record import Recorder
from rlrec.run.preempt import StopRequested
from rlrec.train import checkpoint as ckpt
from rlrec.train import resume
from rlrec.train.runner import Runner
from tests.helpers import FAST, make_config, read_metrics, run_train, start_train
from tests.trainutil import QUIET, runner, snapshot, steps


@pytest.mark.parametrize("at_start", [True, False])
def test_train_writes_metrics_checkpoints_and_evals(tmp_path, at_start):
    run_dir = tmp_path / "a"
    over = ["total_steps=1024", "checkpoint_every=2", f"eval_env.at_start={at_start}"]
    result = runner(run_dir, over).run()
    lines = read_metrics(run_dir)
    assert all("step" in line for line in lines)
    evals = [line for line in lines if "eval/return" in line]
    # (eval_env.at_start: one before training, then) every 2 iterations of 128 steps and at the
    # end: 8 iterations
    assert [e["step"] for e in evals] == [0, 256, 512, 768, 1024][1 - at_start :]
    assert all("eval/success" in e and "eval/length" in e for e in evals)
    assert result["eval/return"] == evals[-1]["eval/return"]
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == [*(f"iter_{i:06d}.pt" for i in (2, 4, 6, 8)), "last.pt"]
    data = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert data["global_step"] == 1024 and data["iteration"] == 8
    assert {"agent", "optimizer", "obs_norm"} <= set(data["ppo"]) and "rng" in data


def test_resume_is_bit_exact(tmp_path):
    common = ["algo.anneal_lr=false", "eval_env.every=3"]
    runner(tmp_path / "full", [*common, "total_steps=1536"]).run()
    runner(tmp_path / "half", [*common, "total_steps=768"]).run()
    half = f"checkpoint={tmp_path}/half/checkpoints/last.pt"
    runner(tmp_path / "resumed", [*common, "total_steps=1536", half]).run()
    a = ckpt.load(tmp_path / "full" / "checkpoints" / "last.pt")
    b = ckpt.load(tmp_path / "resumed" / "checkpoints" / "last.pt")
    assert a["global_step"] == b["global_step"] == 1536
    for part in ("agent", "obs_norm"):
        for k, v in a["ppo"][part].items():
            assert torch.equal(v, b["ppo"][part][k]), k
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])
    # the resumed run continues the step count; the evaluation at start is the new run's only
    assert steps(tmp_path / "resumed", "loss/policy")[0] == 768 + 128
    assert steps(tmp_path / "resumed") == [1152, 1536]


def test_a_stop_in_the_last_update_leaves_the_final_evaluation_due_then_the_run_ends(
    tmp_path, monkeypatch, capsys
):
    """A stop that comes during the last update skips the final evaluation: the checkpoint says
    it is due, resume=auto does it (one final eval line), and resuming the ended run again
    changes nothing."""
    run_dir, args = tmp_path / "run", ["total_steps=512"]
    run_dir.mkdir()
    stopped = Runner(make_config([*QUIET, *args]), run_dir, stop=StopRequested())
    update = PPO.update

    def last_update_stopped(self):
        if stopped.iteration == stopped.num_iterations:
            stopped.stop.signum = signal.SIGTERM  # what the handler does
        return update(self)

    with monkeypatch.context() as m:
        m.setattr(PPO, "update", last_update_stopped)
        stopped.run()
    saved = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert saved["global_step"] == 512 and saved["eval_due"] is True
    assert steps(run_dir) == [0, 256]  # eval_env.at_start, then iteration 2's
    runner(run_dir, [*args, "resume=auto"]).run()
    assert steps(run_dir) == [0, 256, 512]
    assert not ckpt.load(run_dir / "checkpoints" / "last.pt").get("eval_due")
    episodes = [json.loads(x)["step"] for x in (run_dir / "eval_episodes.jsonl").open()]
    assert episodes == [0, 0, 256, 256, 512, 512]  # no line twice
    before = snapshot(run_dir)
    capsys.readouterr()
    runner(run_dir, [*args, "resume=auto"]).run()
    assert "rlrec: done already" in capsys.readouterr().out
    assert snapshot(run_dir) == before


def test_the_resume_point_is_the_kept_state_until_cleared_then_the_state_as_of_now(tmp_path):
    agent = {"w": torch.zeros(2)}
    live = {"global_step": 0, "next_obs": torch.zeros(3), "ppo": {"agent": agent, "obs_norm": {}}}
    point = resume.ResumePoint(lambda: {**live, "ppo": dict(live["ppo"])}, tmp_path, make_config())
    assert point.state()["global_step"] == 0 and "eval_due" not in point.state()
    point.keep(eval_due=True)
    live["next_obs"].add_(1)  # the rollout changes the live state in place
    live["global_step"] = 16
    kept = point.state()
    assert kept["eval_due"] and kept["global_step"] == 0
    assert torch.equal(kept["next_obs"], torch.zeros(3))  # a copy of its own
    assert kept["ppo"]["agent"] is agent  # the model is shared: only the update changes it
    point.clear()
    assert point.state()["global_step"] == 16


def test_where_a_run_starts_from(tmp_path):
    """resume=auto in a new run dir: nothing; a checkpoint of another number of ranks is refused
    naming the file (training; evaluating it is not)."""
    find = lambda *args: resume.find(make_config([*FAST, *args]), tmp_path / "run", 0, 1)  # noqa: E731
    assert find("resume=auto") is None
    path = tmp_path / "two.pt"
    ckpt.save(path, {"global_step": 0, "iteration": 0, "world_size": 2})
    with pytest.raises(ConfigError, match=r"saved by a run of 2 rank\(s\) and this run has 1"):
        find(f"checkpoint={path}")
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    last.parent.mkdir(parents=True)
    ckpt.save(last, ckpt.load(path))
    with pytest.raises(ConfigError) as e:  # resume=auto names the file it found
        find("resume=auto")
    assert str(e.value).startswith(f"{last} was saved")
    start = find(f"checkpoint={path}", "eval_only=true")
    assert start.path == str(path) and start.key == "checkpoint" and not start.eval_due


def test_eval_only_evaluates_a_checkpoint(tmp_path):
    runner(tmp_path / "t", ["total_steps=512"]).run()
    ev = runner(tmp_path / "e", ["eval_only=true", f"checkpoint={tmp_path}/t/checkpoints/last.pt"])
    assert set(ev.run()) >= {"eval/return", "eval/length", "eval/success"}
    assert ev.train_env is None
    with pytest.raises(ConfigError, match="eval_only"):  # without a checkpoint
        Runner(make_config([*FAST, "eval_only=true"]), tmp_path)


@pytest.mark.parametrize("content", [None, b"not a checkpoint", "torch-other"])
def test_bad_checkpoint_fails_before_work(tmp_path, content):
    path = tmp_path / "x.pt"
    if content == "torch-other":
        torch.save({"weights": torch.zeros(2)}, path)
    elif content is not None:
        path.write_bytes(content)
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as e:
        runner(run_dir, [f"checkpoint={path}"])
    assert "checkpoint=" in str(e.value)
    assert ("does not exist" if content is None else "not an rlrec checkpoint") in str(e.value)
    assert list(run_dir.iterdir()) == []


@pytest.mark.slow
def test_train_py_subprocess_output_layout(tmp_path):
    run_dir = tmp_path / "run"
    args = [*FAST, "logger=tensorboard", "total_steps=512", "eval_env.every=1"]
    proc = run_train([*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert "eval return" in proc.stdout and str(run_dir) in proc.stdout
    for p in (".hydra/config.yaml", "metrics.jsonl", "checkpoints/last.pt"):
        assert (run_dir / p).exists(), p
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
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
def test_two_runs_in_the_same_second_get_different_dirs(tmp_path):
    args = [*FAST, "total_steps=128", "eval_env.enabled=false"]
    for proc in [start_train(args, tmp_path) for _ in range(2)]:
        assert proc.wait(timeout=120) == 0, proc.stdout.read()
    assert len(list((tmp_path / "outputs").glob("*/*"))) == 2


@pytest.mark.slow
def test_wandb_logs_metrics_and_clips_and_resume_auto_continues_its_run(tmp_path, monkeypatch):
    """W&B (offline) gets the metrics and every clip. A run killed after its checkpoint at
    iteration 2 (its later checkpoints removed: the kill came before them) had sent W&B steps up
    to 640; resume=auto continues the same W&B run (its id kept in the run dir) from step 256 and
    sends W&B only the steps after 640."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "wb"
    args = [*FAST, "logger=wandb", "logger.wandb_mode=offline", "checkpoint_every=2"]
    args += [f"hydra.run.dir={run_dir}"]
    run_train([*args, "total_steps=640"], cwd=tmp_path)
    (first,) = (run_dir / "wandb").glob("offline-run-*")
    videos = list(first.rglob("media/videos/**/*.mp4"))
    logged = [m for m in read_metrics(run_dir) if "video/train" in m or "video/eval" in m]
    assert len(videos) == len(logged) > 0
    for name in ("last.pt", "iter_000004.pt"):
        (run_dir / "checkpoints" / name).unlink()
    run_train([*args, "total_steps=1024", "resume=auto"], cwd=tmp_path)

    runs = sorted((run_dir / "wandb").glob("offline-run-*"), key=lambda p: p.name)
    ids = {p.name.rsplit("-", 1)[1] for p in runs}
    assert len(runs) == 2 and len(ids) == 1, runs  # one W&B run, written by both processes
    (first, second) = [_wandb_history_steps(next(p.glob("run-*.wandb"))) for p in runs]
    assert first == [0, 128, 256, 384, 512, 640] and second == [768, 896, 1024]
    # metrics.jsonl and TensorBoard hold the resumed run's lines of steps 384..640
    assert steps(run_dir, "train/lr") == list(range(128, 1025, 128))
    assert json.loads((run_dir / "wandb_run.json").read_text()) == {"id": ids.pop(), "step": 1024}


def _wandb_history_steps(path: Path) -> list:
    """The step of each history record of an offline W&B run file (``run-ID.wandb``): a 7-byte
    header, then 32 KiB blocks of records (each with a 7-byte header: CRC, length, type: FULL 1,
    FIRST 2, MIDDLE 3, LAST 4) that hold W&B's protobuf Records."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, found, part, pos, block = path.read_bytes(), [], b"", 7, 32768
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
                found.append(record.history.step.num)
    return found


SMALL = ["env.num_envs=8", "env.render_width=32", "env.render_height=32"]


@pytest.mark.parametrize(
    "args, episodes",
    [
        # `python train.py` defaults, small: episodes (at most 12 steps, often fewer: a wide
        # goal) shorter than algo.num_steps (32), the default cubic trigger, evaluations on
        ([*SMALL, "env.max_episode_steps=12", "env.goal_radius=0.5", "eval_env.num_envs=2"], 22),
        # `env=gymnasium +experiment=cartpole` with the train recorder on: episodes of a barely
        # trained policy, far shorter than the 100-step limit set here (at 8b71342, one arming
        # per iteration, its final episode had no clip)
        (
            ["env=gymnasium", "+experiment=cartpole", "recorder.enabled=true", "seed=3"]
            + ["env.max_episode_steps=100", "eval_env.enabled=false"],
            3,
        ),
    ],
    ids=["main-job-shape", "cartpole"],
)
def test_the_final_episode_has_a_clip_that_ends_at_the_last_step(tmp_path, args, episodes):
    """record_final_episode: the last train clip is of the episode of env 0 in progress at the
    end, and its last frame is the run's final env step."""
    from rlrec.testing import decode

    if "env=gymnasium" in args:
        pytest.importorskip("gymnasium")
    run = runner(
        tmp_path, [*args, "total_steps=2048"], base=["logger=none", "logger.progress=false"]
    )
    assert run.cfg.recorder.record_final_episode
    rec = run.train_env.find(Recorder)
    run.run()
    assert rec.engine.steps == 2048 // 8 and rec.engine.episode >= episodes
    clips = [m["video/train"] for m in read_metrics(tmp_path) if "video/train" in m]
    name = Path(clips[-1]).name  # train-ep000042-step000000504.mp4
    episode, first = (int(x) for x in re.match(r"train-ep(\d+)-step(\d+)", name).groups())
    frames, _ = decode(str(tmp_path / clips[-1]))
    assert rec.engine.steps_per_frame == 1 and episode == rec.engine.episode
    assert first + len(frames) - 1 == rec.engine.steps, (clips[-1], len(frames))


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
    from rlrec.report.html import write_run_report

    clips = tmp_path / "eval_clips"
    over = ["total_steps=256", "recorder=none", "eval_env.at_start=false", "eval_env.every=100"]
    run = runner(tmp_path / "run", [*over, f"eval_env.recorder.dir={clips}"], base=FAST)
    clips.rmdir()
    clips.write_text("not a directory")  # the final evaluation's clip cannot be put in place
    run.run()
    assert run.losses["record/clips_dropped"] == 1
    lines = read_metrics(run.run_dir)
    (evaluation,) = [m for m in lines if "eval/return" in m]
    assert evaluation["eval/clip"] is None and evaluation["eval/clip_lost"] is True
    train = [m for m in lines if "train/lr" in m]
    assert train and all(m["record/clips_dropped"] == 0 for m in train)  # logged before it
    page = write_run_report(run.run_dir).read_text()
    health = page[page.index('id="health"') : page.index('id="progress"')]
    assert re.search(r'data-health="clips_dropped">1<', health), health
    assert re.search(r'data-health="clips_missing">1<', health), health
    frames = run.losses["record/frames_dropped"]
    assert frames > 0 and f'data-health="frames_dropped">{frames}<' in health
