"""Fault tolerance of a real ``python train.py`` process: SIGKILL then ``resume=auto``, and
SIGTERM/SIGINT (preemption, Ctrl-C) answered with a checkpoint and the final clip within 10 s."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import imageio_ffmpeg
import pytest
import torch

from rlrec.train import checkpoint as ckpt
from tests.helpers import FAST, read_metrics, run_train, start_train, wait_for
from tests.trainutil import BATCH, drive, runner, same_state, snapshot, steps, temporaries

_temporaries = temporaries  # the name tests/test_signal_boundaries.py imports

# every episode of env 0 is recorded, so a clip is being written at any moment
RECORD_ALL = ["recorder.trigger=always", "torch_threads=1"]
_CLIP = re.compile(r"^(train|eval)-ep(\d+)-step(\d+)(-\d+)?\.mp4$")


def _train_steps(run_dir: Path):
    if not (run_dir / "metrics.jsonl").exists():
        return []
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        if '"loss/policy"' in line and line.endswith("}"):
            out.append(int(re.search(r'"step": (\d+)', line).group(1)))
    return out


def _parsed(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None


def _clips(run_dir: Path, kind: str):
    return sorted((run_dir / "videos" / kind).glob("*.mp4"))


def _assert_videos_decode(run_dir: Path) -> None:
    for path in run_dir.rglob("*.mp4"):
        frames, _ = imageio_ffmpeg.count_frames_and_secs(str(path))  # decodes the whole file
        assert frames >= 1, path


def _assert_checkpoints_load(run_dir: Path) -> None:
    for path in (run_dir / "checkpoints").glob("*.pt"):
        ckpt.load(path)


@pytest.mark.slow
def test_sigkill_then_resume_continues_to_the_total(tmp_path):
    total = 24 * BATCH
    common = [*FAST, *RECORD_ALL, f"total_steps={total}", "checkpoint_every=4"]
    common += ["algo.anneal_lr=true"]
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "run"
    # the uninterrupted reference runs alongside the run that gets killed
    reference = start_train([*common, f"hydra.run.dir={ref_dir}"], tmp_path)
    victim = start_train([*common, f"hydra.run.dir={run_dir}"], tmp_path)
    # kill once two periodic checkpoints exist and the run is part-way into the next iterations
    periodic = run_dir / "checkpoints" / "iter_000008.pt"
    wait_for(lambda: periodic.exists() and len(_train_steps(run_dir)) >= 10, victim)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    assert victim.returncode == -signal.SIGKILL

    killed_at = max(_train_steps(run_dir))
    assert killed_at < total, "the kill came after the end: nothing to resume"
    newest, saved = ckpt.find_resume(run_dir / "checkpoints")
    resumed_from = saved["global_step"]
    assert 8 * BATCH <= resumed_from <= killed_at
    saved_rec = saved["train_env"]["recorder"]
    clips_before = {p.name for p in _clips(run_dir, "train")}
    stale = temporaries(run_dir)  # usually the clip being encoded when the kill came

    proc = run_train([*common, "resume=auto", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert reference.wait(timeout=300) == 0, reference.stdout.read()
    assert "done" in proc.stdout

    # what the killed run wrote after the checkpoint was moved aside, in one folder, and said so
    (event,) = _events(run_dir)
    rel = str(newest.relative_to(run_dir))
    assert event == {"step": resumed_from, "event": "resume", "from": rel, "moved": event["moved"]}
    moved = run_dir / event["moved"]
    assert event["moved"] == f"superseded/1-step{resumed_from:09d}" and "is moved to" in proc.stderr
    gone = [_parsed(x) for x in (moved / "metrics.jsonl").read_text().splitlines()]
    gone = [m for m in gone if m is not None]  # a line the kill cut is kept as it was
    assert gone and all(m["step"] > resumed_from or "video/train" in m for m in gone)
    moved_clips = {p.name for p in (moved / "videos" / "train").glob("*.mp4")}

    # the step count continues from the checkpoint, each iteration logged once, to the total
    steps = _train_steps(run_dir)
    assert steps == list(range(BATCH, total + 1, BATCH))
    final = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert final["global_step"] == total

    # ...and so does the recorder schedule: the resumed run's next clip is the next episode
    kept = clips_before - moved_clips
    new_clips = [p.name for p in _clips(run_dir, "train") if p.name not in kept]
    eps = sorted(int(_CLIP.match(n).group(2)) for n in new_clips)
    assert eps and eps[0] == saved_rec["episode"] + 1, (saved_rec, new_clips)
    # the resumed run is the uninterrupted run: same parameters, recorder counters, clip names
    ref = ckpt.load(ref_dir / "checkpoints" / "last.pt")
    for k, v in ref["ppo"]["agent"].items():
        assert torch.equal(v, final["ppo"]["agent"][k]), k
    for k in ("episode", "steps"):  # clips_saved differs by the clip that was cut (below)
        assert ref["train_env"]["recorder"][k] == final["train_env"]["recorder"][k], k
    # the same clips, sidecars and lines under the same names (none renamed -1). The one clip
    # that may be missing: the episode that was being recorded at the checkpoint (a clip is never
    # continued across processes) when the kill came before it was complete (it was removed)
    ref_files, our_files = set(_files(ref_dir)), set(_files(run_dir))
    assert our_files <= ref_files
    missing = {str(Path(p).with_suffix(".mp4")) for p in ref_files - our_files}
    assert all(int(_CLIP.match(Path(n).name).group(2)) == saved_rec["episode"] for n in missing)
    ref_lines = [m for m in _lines(ref_dir) if m.get("video/train") not in missing]
    assert _lines(run_dir) == ref_lines

    # no corrupt or half-written file is left: every checkpoint loads, every clip decodes
    assert temporaries(run_dir) == [], f"left over (killed run's were {stale})"
    _assert_checkpoints_load(run_dir)
    _assert_videos_decode(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_stop_signal_checkpoints_and_saves_the_final_clip_within_10s(tmp_path, signame):
    run_dir = tmp_path / "run"
    # a run far too long to end by itself; no periodic checkpoints, so last.pt is the signal's
    args = [*FAST, *RECORD_ALL, "total_steps=100000000", "checkpoint_every=100000"]
    args += [f"hydra.run.dir={run_dir}"]
    proc = start_train(args, tmp_path)
    wait_for(lambda: len(_train_steps(run_dir)) >= 4 and _clips(run_dir, "train"), proc)
    t0 = time.monotonic()
    proc.send_signal(getattr(signal, signame))
    out, _ = proc.communicate(timeout=30)
    elapsed = time.monotonic() - t0
    assert elapsed < 10.0, f"took {elapsed:.1f}s to stop"
    assert proc.returncode == 128 + getattr(signal, signame), out  # 143 on SIGTERM, as Lightning
    assert "stopped by signal" in out

    # a checkpoint of that moment: the last completed update (the unfinished rollout is dropped)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.pt"]
    data = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert data["global_step"] == max(_train_steps(run_dir)) == data["iteration"] * BATCH
    # the final clip: the episode in progress when the signal came is on disk, complete
    episode = data["train_env"]["recorder"]["episode"]
    last = [p for p in _clips(run_dir, "train") if int(_CLIP.match(p.name).group(2)) == episode]
    assert len(last) == 1, [p.name for p in _clips(run_dir, "train")]
    frames, _ = imageio_ffmpeg.count_frames_and_secs(str(last[0]))
    assert 1 <= frames <= 101
    assert temporaries(run_dir) == []
    _assert_videos_decode(run_dir)


def test_resume_removes_only_other_processes_temporaries(tmp_path):
    from rlrec.run.rundir import remove_stale_temporaries

    dead = 2**22 + 12345  # above the default pid_max: no such process
    names = {
        f"checkpoints/.last.pt.{dead}-0.part": True,
        f"videos/train/.train-ep000003-step000000300.mp4.{dead}-2.part": True,
        f".metrics.jsonl.{dead}-3.part": True,  # a resume's rewrite of metrics.jsonl
        f"superseded/1-step000000128/.metrics.jsonl.{dead}-4.part": True,
        f"videos/eval/.eval-ep000000-step000000000.mp4.{os.getpid()}-0.part": False,  # ours
        "videos/train/train-ep000001-step000000100.mp4": False,  # a finished clip
        "checkpoints/last.pt": False,
        f"elsewhere/.x.{dead}.tmp": False,  # outside checkpoints/ and videos/
    }
    paths = {tmp_path / name: gone for name, gone in names.items()}  # the file: whether it goes
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    assert set(remove_stale_temporaries(tmp_path)) == {p for p, gone in paths.items() if gone}
    assert [p for p, gone in paths.items() if p.exists() == gone] == []


# ---------------------------------------------------------------------- stop, then resume=auto
# train.py's main with one action at an exact moment of the run, so that each test stops the run
# where it means to: a real signal sent to the process (the handler, the stop flag and the
# checkpoint are the real ones), the recorder's directory replaced by a file (block:DIR), or the
# run dir's file system turned read-only for eval_episodes.jsonl (erofs: opening it for writing
# fails as the kernel does).
#   driver.py ACTION rollout CALL  overrides...   before the CALL-th collection step of the run
#   driver.py ACTION eval N:STEP   overrides...   before step STEP of the N-th evaluation
_DRIVER = """
import errno
import os
import signal
import sys

from rlrec.train.evaluation import Evaluator
from rlrec.ppo.ppo import PPO

action, where, at = sys.argv[1:4]
sys.argv = [sys.argv[0], *sys.argv[4:]]
count = {"act": 0, "evals": 0, "eval_step": 0}


def fire():
    if action.startswith("block:"):
        path = action[len("block:"):]
        os.rename(path, path + ".moved")
        with open(path, "w") as f:
            f.write("not a directory")
    elif action == "erofs":
        real_open = os.open

        def read_only(path, flags, *args, **kwargs):
            if str(path).endswith("eval_episodes.jsonl") and flags & (os.O_WRONLY | os.O_RDWR):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real_open(path, flags, *args, **kwargs)

        os.open = read_only
    else:
        os.kill(os.getpid(), getattr(signal, action))


def on_act():
    count["act"] += 1
    if where == "rollout" and count["act"] == int(at):
        fire()


def on_eval():
    count["evals"] += 1
    count["eval_step"] = 0


def on_act_inference():
    count["eval_step"] += 1
    if where == "eval" and "%d:%d" % (count["evals"], count["eval_step"]) == at:
        fire()


def wrap(cls, name, before):
    original = getattr(cls, name)

    def hooked(self, *args, **kwargs):
        before()
        return original(self, *args, **kwargs)

    setattr(cls, name, hooked)


wrap(PPO, "act", on_act)
wrap(Evaluator, "run", on_eval)
wrap(PPO, "act_inference", on_act_inference)
from rlrec.run.cli import main  # noqa: E402

main()
"""

NUM_STEPS = 16  # FAST: algo.num_steps
TOTAL = 8 * BATCH  # evaluations at start (step 0), after iterations 2, 4, 6 and the final one
RESUMABLE = [*FAST, f"total_steps={TOTAL}", "checkpoint_every=4"]
# wall-clock figures, and the recording losses (counted per process: a run that lost a clip
# before it was stopped counts it, its uninterrupted twin not)
_VOLATILE = ("time/", "sps/", "record/")


def _drive(tmp_path: Path, action: str, where: str, at: str, args):
    return drive(tmp_path, _DRIVER, [action, where, at, *args])


def _lines(run_dir: Path, clips: bool = True):
    """metrics.jsonl without the figures that differ between two equal runs and without the
    stop and resume events, by step (an eval line is written once its clip is encoded, so its
    place among the lines varies); every eval line names its clip. A clip's own line (video/)
    keeps its name without its step: it is logged when the clip's encoding ends, at whatever
    step training is at then (and a clip cut by a stop ends at another step)."""
    out = []
    for m in read_metrics(run_dir):
        if "event" in m:
            continue
        if "eval/return" in m:
            assert m["eval/clip"], m
        volatile = _VOLATILE if clips else (*_VOLATILE, "video/", "eval/clip")
        kept = {k: v for k, v in m.items() if not k.startswith(volatile)}
        if any(k.startswith("video/") for k in kept):
            kept["step"] = None
        if len(kept) > 1:  # more than the step
            out.append(kept)
    return sorted(out, key=lambda m: (m["step"] or -1, sorted(m)))


def _files(run_dir: Path):
    """The clips and sidecars of a run dir (what was moved aside is not the run's)."""
    return sorted(
        str(p.relative_to(run_dir))
        for p in (run_dir / "videos").rglob("*")
        if p.is_file() and not p.name.startswith(".")
    )


def _events(run_dir: Path):
    return [m for m in read_metrics(run_dir) if "event" in m]


def _assert_same_run(reference: Path, run_dir: Path) -> None:
    ref = ckpt.load(reference / "checkpoints" / "last.pt")
    ours = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert ours["global_step"] == ref["global_step"] == TOTAL
    # parameters, optimizer, observation normaliser; every RNG stream; the next observation;
    # both env stacks: simulator and episode accumulators, and the recorder's counters and
    # schedule (clips_saved may differ by the clip that was cut, as after a SIGKILL)
    keys = ("ppo", "rng", "next_obs", "iteration")
    diffs = same_state(ref, ours, keys, ("adapter", "autoreset", "recorder"))
    assert not diffs, diffs
    # every train, eval and clip line, once, with the same values (clip names included)
    assert _lines(run_dir) == _lines(reference)
    # the same clips and sidecars under the same names: none renamed, none left over
    assert _files(run_dir) == _files(reference)
    assert steps(run_dir) == [0, 2 * BATCH, 4 * BATCH, 6 * BATCH, TOTAL]


def _assert_resuming_again_changes_nothing(args, tmp_path: Path, run_dir: Path) -> None:
    """Resumed again, the run that ended changes nothing and appends nothing."""
    before = snapshot(run_dir)
    again = run_train([*args, "resume=auto"], cwd=tmp_path)
    assert "done already" in again.stdout, again.stdout
    assert snapshot(run_dir) == before


@pytest.mark.slow
@pytest.mark.parametrize(
    "signame, where, at, saved_step, eval_due",
    [
        # mid-rollout: the 5th step of iteration 4's rollout
        ("SIGTERM", "rollout", str(3 * NUM_STEPS + 5), 3 * BATCH, False),
        # the first step of the rollout that follows an evaluation
        ("SIGINT", "rollout", str(2 * NUM_STEPS + 1), 2 * BATCH, False),
        # mid-evaluation: the first one after iteration 2 (the second: one at start)
        ("SIGTERM", "eval", "2:10", 2 * BATCH, True),
        # mid-evaluation: the final one
        ("SIGINT", "eval", "5:10", TOTAL, True),
    ],
    ids=["SIGTERM-mid-rollout", "SIGINT-rollout-after-eval", "SIGTERM-mid-eval", "SIGINT-final"],
)
def test_stop_then_resume_equals_the_uninterrupted_run(
    tmp_path, uninterrupted_resumable, signame, where, at, saved_step, eval_due
):
    run_dir = tmp_path / "run"
    args = [*RESUMABLE, f"hydra.run.dir={run_dir}"]
    stopped = _drive(tmp_path, signame, where, at, args)
    out = stopped.stdout + stopped.stderr
    assert stopped.returncode == 128 + getattr(signal, signame), out
    assert "stopped by signal" in out
    # the checkpoint is the state as of the start of the interrupted rollout or evaluation
    saved = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert saved["global_step"] == saved_step == max(_train_steps(run_dir))
    assert bool(saved.get("eval_due")) is eval_due
    # every evaluation before it has its line; a cut one has none (fewer episodes than asked)
    done = [s for s in (0, 2 * BATCH, 4 * BATCH, 6 * BATCH, TOTAL) if s <= saved_step]
    assert steps(run_dir) == (done[:-1] if eval_due else done)

    # the stop is a line of its own, at the step of its checkpoint
    stop = {"step": saved_step, "event": "stop", "signal": int(getattr(signal, signame))}
    assert _events(run_dir) == [stop]
    after = {p for p in _files(run_dir) if _first_step(run_dir / p) > _saved_steps(saved, p)}

    resumed = run_train([*args, "resume=auto"], cwd=tmp_path)
    assert "done" in resumed.stdout
    _assert_same_run(uninterrupted_resumable, run_dir)
    assert temporaries(run_dir) == []
    _assert_checkpoints_load(run_dir)
    # what the stopped run wrote after its checkpoint was moved aside, not deleted, and said so
    moved = _events(run_dir)[1]["moved"]
    assert _events(run_dir) == [
        stop,
        {"step": saved_step, "event": "resume", "from": "checkpoints/last.pt", "moved": moved},
    ]
    if after:
        assert moved.startswith("superseded/1-step") and "is moved to" in resumed.stderr
        kept = {str(p.relative_to(run_dir / moved)) for p in (run_dir / moved).rglob("*.*")}
        assert after <= kept

    _assert_resuming_again_changes_nothing(args, tmp_path, run_dir)


@pytest.mark.slow
def test_a_kill_before_the_first_checkpoint_then_resume_equals_the_uninterrupted_run(
    tmp_path, uninterrupted_resumable
):
    """SIGKILL in iteration 3 (RESUMABLE checkpoints every 4): no checkpoint yet. resume=auto
    starts again from step 0 and moves all the first attempt wrote to superseded/ (as after a
    later checkpoint), so the run dir equals the uninterrupted run's: no line twice, no `-1`
    clip beside the first attempt's."""
    run_dir = tmp_path / "run"
    args = [*RESUMABLE, f"hydra.run.dir={run_dir}"]
    killed = _drive(tmp_path, "SIGKILL", "rollout", str(2 * NUM_STEPS + 5), args)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not list(run_dir.glob("checkpoints/*.pt"))
    first = (run_dir / "metrics.jsonl").read_text()
    assert _train_steps(run_dir) == [BATCH, 2 * BATCH]
    assert '"eval/return"' in first and _clips(run_dir, "eval")
    resumed = run_train([*args, "resume=auto"], cwd=tmp_path)
    assert "found no checkpoint: the run starts again from step 0" in resumed.stderr
    _assert_same_run(uninterrupted_resumable, run_dir)
    moved = "superseded/1-step000000000"
    assert _events(run_dir) == [{"step": 0, "event": "resume", "from": None, "moved": moved}]
    assert (run_dir / moved / "metrics.jsonl").read_text() == first
    assert (run_dir / moved / "videos" / "eval").is_dir()
    assert not [
        p
        for p in run_dir.rglob("*.mp4")
        if re.search(r"-\d+\.mp4$", p.name) and "-env" not in p.name and "superseded" not in p.parts
    ]


def _eval_episodes(run_dir: Path):
    """eval_episodes.jsonl's records, in a fixed order."""
    lines = (run_dir / "eval_episodes.jsonl").read_text().splitlines()
    return sorted(lines)


@pytest.mark.slow
@pytest.mark.parametrize("every, saved_iteration", [(4, 4), (7, 7)])
def test_a_kill_during_the_final_evaluation_then_resume_equals_the_uninterrupted_run(
    tmp_path, uninterrupted_resumable, every, saved_iteration
):
    """SIGKILL at step 10 of the final evaluation, once the last training line is written: the
    last iteration's checkpoint comes after the final evaluation (as every periodic one comes
    after its iteration's evaluation), so resume=auto continues from the one before and does the
    final evaluation (its line, its clip, its eval_episodes.jsonl records). The final train clip
    (the episode in progress at the end; with checkpoints every 7 iterations it began before the
    last one) is on disk before the final evaluation. The run dir equals the uninterrupted run's;
    resumed again, nothing changes."""
    run_dir, reference = tmp_path / "run", uninterrupted_resumable
    args = [*FAST, f"total_steps={TOTAL}", f"checkpoint_every={every}", f"hydra.run.dir={run_dir}"]
    killed = _drive(tmp_path, "SIGKILL", "eval", "5:10", args)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert _train_steps(run_dir)[-1] == TOTAL
    saved = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert saved["global_step"] == saved_iteration * BATCH and not saved.get("eval_due")
    final_clip = [f for f in _files(reference) if f.endswith(".mp4") and "/train/" in f][-1]
    assert _first_step(reference / final_clip) < 7 * NUM_STEPS  # before iteration 7's end
    assert final_clip in _files(run_dir)

    resumed = run_train([*args, "resume=auto"], cwd=tmp_path)
    assert "done already" not in resumed.stdout, resumed.stdout
    _assert_same_run(reference, run_dir)
    assert _eval_episodes(run_dir) == _eval_episodes(reference)
    assert f"videos/eval/eval-step{TOTAL:09d}.mp4" in _files(run_dir)
    assert temporaries(run_dir) == []

    _assert_resuming_again_changes_nothing(args, tmp_path, run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("eval_recorder", ["true", "false"])
def test_two_kills_then_resume_leave_the_per_episode_clips_of_an_uninterrupted_run(
    tmp_path, eval_recorder
):
    """Per-episode clips (eval_env.clips=all): SIGKILL in iteration 7 (after the evaluation of
    step 6 * BATCH, checkpoint of 4 * BATCH), resume=auto killed there again, then resumed to the
    end: videos/eval holds exactly what the uninterrupted run's does (each killed attempt's
    clips in superseded/, no -1 name), with the eval recorder on and off."""
    args = [*RESUMABLE, "eval_env.clips=all", f"eval_env.recorder.enabled={eval_recorder}"]
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    run_train([*args, f"hydra.run.dir={reference}"], cwd=tmp_path)
    args += [f"hydra.run.dir={run_dir}"]
    killed = _drive(tmp_path, "SIGKILL", "rollout", str(6 * NUM_STEPS + 5), args)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # resumed from step 4 * BATCH: iterations 5 and 6, the evaluation, then iteration 7
    again = _drive(tmp_path, "SIGKILL", "rollout", str(2 * NUM_STEPS + 5), [*args, "resume=auto"])
    assert again.returncode == -signal.SIGKILL, again.stderr
    run_train([*args, "resume=auto"], cwd=tmp_path)
    eval_files = lambda run: [f for f in _files(run) if f.startswith("videos/eval/")]  # noqa: E731
    assert any("-env" in f for f in eval_files(reference))
    assert eval_files(run_dir) == eval_files(reference)
    assert temporaries(run_dir) == []  # the killed attempts' clips held in temporary files
    for n in (1, 2):  # each attempt's evaluation of step 6 * BATCH, moved aside
        moved = run_dir / "superseded" / f"{n}-step{4 * BATCH:09d}" / "videos" / "eval"
        assert {p.name for p in moved.glob("*-env*.mp4")} == {
            f"eval-step{6 * BATCH:09d}-env{e:03d}.mp4" for e in (0, 1)
        }


@pytest.mark.slow
def test_a_read_only_run_dir_ends_in_one_line_and_resume_completes(
    tmp_path, uninterrupted_resumable
):
    """The output file system turns read-only mid-run (as the 4th evaluation, at step 6 * BATCH,
    begins: its episode records cannot be written; the checkpoint of iteration 4 is on disk):
    exit 1 and one line naming the file, that nothing written before is lost, and the command
    that continues; that command, once the dir can be written, ends as the uninterrupted run."""
    run_dir = tmp_path / "run"
    args = [*RESUMABLE, f"hydra.run.dir={run_dir}"]
    proc = _drive(tmp_path, "erofs", "eval", "4:1", args)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"rlrec: could not write {run_dir / 'eval_episodes.jsonl'}: "), last
    assert "(the file system is read-only)" in last and "nothing was replaced" in last
    assert f"python train.py resume=auto hydra.run.dir={run_dir}" in last
    assert "(step 512)" in last
    assert ckpt.load(run_dir / "checkpoints" / "last.pt")["global_step"] == 4 * BATCH
    run_train([*args, "resume=auto"], cwd=tmp_path)
    _assert_same_run(uninterrupted_resumable, run_dir)


def _first_step(clip: Path) -> int:
    """The recorder's step count at a clip's first frame (its sidecar's; a sidecar: its clip's)."""
    return json.loads(clip.with_suffix(".json").read_text())["first_step"]


def _saved_steps(saved: dict, rel: str) -> int:
    """The checkpoint's step count of the recorder of the clip at ``rel`` (videos/KIND/...):
    a training clip after it began after that count, an eval clip at it or after."""
    kind = Path(rel).parts[1]
    steps = saved[f"{kind}_env"]["recorder"]["steps"]
    return steps if kind == "train" else steps - 1


@pytest.mark.slow
def test_recorder_error_still_writes_the_checkpoint_of_the_last_update(
    tmp_path, uninterrupted_resumable
):
    """recorder.on_error=raise: the recorder's directory turns into a file mid-rollout; the
    RecorderError ends the run, after the checkpoint of the last completed update is written."""
    run_dir, clips = tmp_path / "run", tmp_path / "clips"
    args = [*RESUMABLE, f"hydra.run.dir={run_dir}", f"recorder.dir={clips}"]
    # a short clip every 10 steps: the next one fails soon; no periodic checkpoint: last.pt is
    # the error's
    args += ["recorder.on_error=raise", "recorder.trigger=step", "recorder.every=10"]
    args += ["recorder.length_frames=3", "checkpoint_every=100"]
    failed = _drive(tmp_path, f"block:{clips}", "rollout", str(3 * NUM_STEPS + 5), args)
    out = failed.stdout + failed.stderr
    assert failed.returncode == 1, out
    assert "RecorderError" in out and "on_error=raise" in out
    saved = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert saved["global_step"] == max(_train_steps(run_dir)) == saved["iteration"] * BATCH
    assert 3 * BATCH <= saved["global_step"] < TOTAL and saved["eval_due"] is False

    # ...and it is a state the run went through: fixed, the run resumes to the uninterrupted end
    clips.unlink()
    (tmp_path / "clips.moved").rename(clips)
    run_train([*args, "resume=auto"], cwd=tmp_path)
    ref = ckpt.load(uninterrupted_resumable / "checkpoints" / "last.pt")
    ours = ckpt.load(run_dir / "checkpoints" / "last.pt")
    diffs = same_state(ref, ours, ("global_step", "ppo", "rng", "next_obs"))
    assert not diffs, diffs
    # no train or eval line lost or repeated (its clips are other ones: another trigger)
    assert _lines(run_dir, clips=False) == _lines(uninterrupted_resumable, clips=False)


def test_stop_flag_keeps_the_first_signal_and_names_the_exit_status():
    from rlrec.run.preempt import StopRequested

    stop = StopRequested()
    assert not stop and stop.exit_status == 0
    stop.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop and stop.signum == signal.SIGTERM
        # a later signal (SLURM's SIGTERM after submitit's USR2, say) keeps the first one
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signum == signal.SIGTERM and stop.exit_status == 128 + signal.SIGTERM == 143
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C interrupts at once
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) != stop._handle


def test_a_recorder_error_at_close_still_closes_everything_else(tmp_path):
    """The last clip fails as the run closes (on_error=raise): the error propagates, after the
    eval stack and the logger are closed too (metrics.jsonl complete, no encoder left running)."""
    from rlrec.record import RecorderError
    from rlrec.train.stack import recorder_of

    clips = tmp_path / "clips"
    over = [f"recorder.dir={clips}", "recorder.on_error=raise", "recorder.trigger=always"]
    run = runner(tmp_path / "run", over, base=FAST)
    train_rec, eval_rec = recorder_of(run.train_env), recorder_of(run.eval_env)
    with torch.inference_mode():
        run.train_env.reset(seed=0)
        for _ in range(3):  # a clip of episode 0 is being recorded
            run.train_env.step(torch.zeros(8, 2))
    assert train_rec.recording
    clips.rename(tmp_path / "moved")
    clips.write_text("not a directory")  # the clip in progress can no longer be put in place
    with pytest.raises(RecorderError, match="on_error=raise"):
        run.close()
    assert train_rec.engine.closed and eval_rec.engine.closed and run.logger._metrics.closed
    run.close()  # idempotent: closed once
