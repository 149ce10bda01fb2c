"""What a resumed run moves aside: the files of the timeline after its checkpoint
(rlrec/train/timeline.py), on a run dir laid out as a run leaves it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlrec.train import timeline

S = 128  # the checkpoint's global step
# the evaluation of step S was cut (eval_due): the resumed run redoes it
DATA = {"global_step": S, "eval_due": True, "train_env": {"recorder": {"steps": 100}}}
DATA["eval_env"] = {"recorder": {"steps": 20}}


def _clip(run_dir: Path, rel: str, first_step=None, kind="train") -> None:
    path = run_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"mp4")
    if first_step is not None:
        side = {"video": path.name, "kind": kind, "first_step": first_step}
        path.with_suffix(".json").write_text(json.dumps(side))


def _jsonl(path: Path, lines) -> None:
    path.write_text("".join(json.dumps(m) + "\n" for m in lines))


def _read(path: Path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    _clip(run, "videos/train/train-ep000001-step000000050.mp4", 50)  # before: stays
    _clip(run, "videos/train/train-ep000002-step000000100.mp4", 100)  # in progress: stays
    _clip(run, "videos/train/train-ep000003-step000000101.mp4", 101)  # after: moves
    _clip(run, "videos/train/train-ep000004-step000000150.mp4")  # no sidecar, its name: moves
    _clip(run, "videos/train/mine.mp4")  # says nothing of its step: stays
    _clip(run, "videos/eval/eval-ep000001-step000000010.mp4", 10, "eval")  # stays
    _clip(run, "videos/eval/eval-ep000002-step000000020.mp4", 20, "eval")  # the cut eval: moves
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.pt").write_bytes(b"ckpt")
    clip = "videos/eval/eval-ep000001-step000000010.mp4"
    lines = [{"step": 64, "loss/policy": 0.5}, {"step": 64, "eval/return": 1.0, "eval/clip": clip}]
    lines += [
        {"step": 128, "loss/policy": 0.25},
        {"step": 128, "video/train": "videos/train/train-ep000003-step000000101.mp4"},
        {"step": 128, "eval/return": 2.0},  # of the cut evaluation (eval_due)
        {"step": 256, "video/train": "videos/train/train-ep000002-step000000100.mp4"},
        {"step": 256, "loss/policy": 0.125},
    ]
    _jsonl(run / "metrics.jsonl", lines)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 256, "loss/pol')  # torn by the kill
    _jsonl(run / "eval_episodes.jsonl", [{"step": s, "episode": 0} for s in (64, 128, 256)])
    return run


def test_what_was_written_after_the_checkpoint_is_moved_aside(tmp_path, capsys):
    run = _run_dir(tmp_path)
    videos = {"train": run / "videos" / "train", "eval": run / "videos" / "eval"}
    moved = timeline.supersede(run, run / "checkpoints" / "last.pt", DATA, videos)

    folder = run / "superseded" / f"1-step{S:09d}"
    assert moved == folder
    files = lambda root: sorted(str(p.relative_to(root)) for p in root.rglob("*.*"))  # noqa: E731
    assert files(folder) == [
        "eval_episodes.jsonl",
        "metrics.jsonl",
        "videos/eval/eval-ep000002-step000000020.json",
        "videos/eval/eval-ep000002-step000000020.mp4",
        "videos/train/train-ep000003-step000000101.json",
        "videos/train/train-ep000003-step000000101.mp4",
        "videos/train/train-ep000004-step000000150.mp4",
    ]
    assert files(run / "videos") == [
        "eval/eval-ep000001-step000000010.json",
        "eval/eval-ep000001-step000000010.mp4",
        "train/mine.mp4",
        "train/train-ep000001-step000000050.json",
        "train/train-ep000001-step000000050.mp4",
        "train/train-ep000002-step000000100.json",
        "train/train-ep000002-step000000100.mp4",
    ]
    # the lines up to the checkpoint stay (a clip's line with its clip), then the resume event
    kept = _read(run / "metrics.jsonl")
    assert [m["step"] for m in kept] == [64, 64, 128, 256, 128]
    assert kept[3]["video/train"].endswith("step000000100.mp4")
    assert kept[-1] == {
        "step": S,
        "event": "resume",
        "from": "checkpoints/last.pt",
        "moved": f"superseded/1-step{S:09d}",
    }
    gone = (folder / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in gone[:3]] == [128, 128, 256]
    assert gone[3] == '{"step": 256, "loss/pol'  # kept as it was, not lost
    assert _read(run / "eval_episodes.jsonl") == [{"step": 64, "episode": 0}]
    assert [m["step"] for m in _read(folder / "eval_episodes.jsonl")] == [128, 256]
    err = capsys.readouterr().err
    assert f"is moved to superseded/1-step{S:09d}/" in err and "3 clip(s)" in err

    # resumed again from the same checkpoint: nothing is after it, nothing moves
    again = timeline.supersede(run, run / "checkpoints" / "last.pt", DATA, videos)
    assert again is None
    assert _read(run / "metrics.jsonl")[-1]["moved"] is None
    assert capsys.readouterr().err == ""
    # from an earlier one: a second folder
    earlier = {**DATA, "global_step": 64, "eval_due": False}
    assert timeline.supersede(run, run / "checkpoints" / "last.pt", earlier, videos) == (
        run / "superseded" / "2-step000000064"
    )


def test_clips_outside_the_run_dir_stay(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _clip(tmp_path, "shared/train-ep000003-step000000101.mp4", 101)
    timeline.supersede(run, run / "last.pt", DATA, {"train": tmp_path / "shared"})
    assert (tmp_path / "shared" / "train-ep000003-step000000101.mp4").exists()
    assert not (run / "superseded").exists()


def test_tensorboard_events_after_the_checkpoint_move_to_their_own_file(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "run"
    writer = SummaryWriter(log_dir=str(run / "tensorboard"))
    for step in (64, 128, 192, 256):
        writer.add_scalar("train/return", float(step), step)
    writer.close()
    (events,) = (run / "tensorboard").glob("events.out.tfevents.*")

    moved = timeline.supersede(run, run / "last.pt", {**DATA, "eval_due": False}, {})
    assert "(2 TensorBoard event(s))" in capsys.readouterr().err

    def steps(path: Path):
        loaded = list(EventFileLoader(str(path)).Load())
        assert loaded[0].HasField("file_version")  # each part is an event file of its own
        return [e.step for e in loaded if e.summary.value]

    assert steps(events) == [64, 128]
    assert steps(moved / "tensorboard" / events.name) == [192, 256]


@pytest.mark.parametrize("eval_recorder", [True, False], ids=["eval-recorder", "no-eval-recorder"])
def test_an_evaluations_clips_go_with_its_lines_whatever_their_step_counts(tmp_path, eval_recorder):
    """Per-episode clips (and the evaluation's clip) are judged by the evaluation's step their
    names say, as its eval_episodes.jsonl lines are: with the eval recorder off (no eval counts in
    the checkpoint), and when their engines' step counts restarted at 0 in a resumed process
    (first_step 3 here, far below the checkpoint's eval count 20)."""
    run = tmp_path / "run"
    for step in (64, 128, 256):
        for env in (0, 1):
            _clip(run, f"videos/eval/eval-step{step:09d}-env{env:03d}.mp4", 3, "eval")
        if eval_recorder:
            _clip(run, f"videos/eval/eval-step{step:09d}.mp4", 3, "eval")
    data = DATA if eval_recorder else {**DATA, "eval_env": {"recorder": None}}
    videos = {"eval": run / "videos" / "eval"}
    moved = timeline.supersede(run, run / "last.pt", data, videos)
    names = lambda root: sorted(p.stem for p in root.glob("*.mp4"))  # noqa: E731
    stays = ["eval-step000000064-env000", "eval-step000000064-env001"]
    goes = [f"eval-step{s:09d}-env{e:03d}" for s in (128, 256) for e in (0, 1)]  # 128: eval_due
    if eval_recorder:
        stays, goes = stays + ["eval-step000000064"], goes + ["eval-step000000128"]
        goes += ["eval-step000000256"]
    assert names(run / "videos" / "eval") == sorted(stays)
    assert names(moved / "videos" / "eval") == sorted(goes)
