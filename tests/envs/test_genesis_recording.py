"""The recorder on real Genesis: what Genesis Forge's VideoWrapper got wrong, on Genesis's frames.

Stack under test: ``AutoReset(Recorder(Spy(GenesisAdapter(FrankaReach))))`` on the CPU backend,
2 envs, 64x64 frames, episodes of a few steps. The Spy (below the recorder) keeps env 0's frame
after every reset and step; rendering does not change a Genesis scene, so it observes without
disturbing. Clips are lossless (libx264rgb), so decoded frames are the rendered frames; frames
of two scenes are compared with ``RENDER_ATOL`` (see genesis_util).

Genesis Forge's VideoWrapper defects that these rule out: the reset and terminal frames were never
captured (autoreset inside step), every step was rendered even when not recording, and
``torch.any(a or b)`` failed on batched tensors. The recorder's triggers, clip lengths, fps,
file names and final episode are the engine's, tested on the built-in env (tests/record/:
test_recorder_schedule.py, test_recorder_frames.py, test_recorder_failures.py), and against
Genesis Forge's own wrapper in tests/record/test_genesis_forge.py.
"""

import pytest
import torch

pytest.importorskip("genesis", reason="needs the genesis extra: bash scripts/setup_genesis.sh")
pytestmark = pytest.mark.genesis


from rlrec.envs.autoreset import AutoReset  # noqa: E402
from rlrec.record import Recorder  # noqa: E402
from rlrec.record.settings import RecorderConfig, Trigger  # noqa: E402
from rlrec.testing import FrameSpy, decode  # noqa: E402
from tests.envs.genesis_util import RENDER_ATOL, diff, make_genesis  # noqa: E402

N = 2
DT = 0.02  # FrankaReach's env step: 50 frames per second of sim time


@pytest.fixture(scope="module")
def adapters():
    """Two scenes for the whole module: the env under test and a fresh reference env."""
    env, ref = make_genesis(N, limit=5, seed=3), make_genesis(N, limit=5, seed=99)
    yield env, ref
    env.close()
    ref.close()


@pytest.fixture
def make_stack(adapters, tmp_path):
    env = adapters[0]
    stacks = []

    def build(limit, **rec):
        env.max_episode_steps = limit
        spy = FrameSpy(env, close_inner=False)
        kind = rec.pop("kind", "eval")
        rec.setdefault("lossless", True)
        cfg = RecorderConfig(**rec)
        clips = []
        recorder = Recorder(spy, cfg, str(tmp_path / "videos"), kind=kind, on_clip=clips.append)
        stack = AutoReset(recorder)
        stacks.append(stack)
        return stack, recorder, spy, clips

    yield build
    for stack in stacks:
        stack.close()


def zeros():
    return torch.zeros(N, 7)


def wiggle(i):
    g = torch.Generator().manual_seed(i)
    return torch.rand(N, 7, generator=g) * 2 - 1


# --------------------------------------------------------------------------- evaluation clips


def test_each_evaluation_starts_on_its_own_fresh_reset_frame_and_ends_on_the_terminal_frame(
    make_stack, adapters
):
    limit = 4
    stack, rec, spy, clips = make_stack(limit, trigger=Trigger.eval, record_final_episode=False)
    seeds = [1000, 1001, 1002]
    stale = []
    for k, seed in enumerate(seeds):
        stale.append(stack.unwrapped.render([0])[0].numpy().copy())  # env 0 before the full reset
        stack.reset(seed=seed)
        for i in range(limit):
            stack.step(wiggle(10 * k + i))
        for i in range(2):  # env 0's next (autoreset) episode goes on between evaluations
            stack.step(wiggle(500 + 10 * k + i))
        rec.flush()
    assert [c.episode for c in clips] == [0, 2, 4]
    ref = adapters[1]
    ref.max_episode_steps = limit
    for k, (clip, seed) in enumerate(zip(clips, seeds)):
        frames, fps = decode(clip.path)
        ref.reset(seed=seed)
        fresh = ref.render([0])[0].numpy()
        assert diff(frames[0], fresh) <= RENDER_ATOL, (
            f"eval {k}: first frame is not the fresh reset state"
        )
        assert diff(frames[0], stale[k]) > RENDER_ATOL, (
            f"eval {k}: first frame is the pre-reset state"
        )
        if k:
            previous, _ = decode(clips[k - 1].path)
            assert diff(frames[0], previous[-1]) > RENDER_ATOL, (
                f"eval {k}: starts on the previous clip's last frame"
            )
        # the whole episode, frame for frame, ending on the terminal state before autoreset
        episode = spy.episodes[2 * k]
        after = spy.episodes[2 * k + 1][0]  # first frame of the autoreset episode
        assert clip.num_frames == len(frames) == limit + 1 and fps == pytest.approx(1 / DT)
        assert all(diff(a, b) <= RENDER_ATOL for a, b in zip(frames, episode))
        assert diff(frames[-1], episode[-1]) <= RENDER_ATOL
        assert diff(frames[-1], after) > RENDER_ATOL, "terminal frame taken after the autoreset"


def test_partial_reset_of_another_env_leaves_the_recorded_env_and_its_clip(make_stack):
    stack, rec, spy, clips = make_stack(
        20, trigger=Trigger.always, env_idx=[0], record_final_episode=False
    )
    stack.reset(seed=5)
    for i in range(3):
        stack.step(wiggle(i))
    before = stack.unwrapped.render([0, 1])
    stack.reset(env_idx=[1])  # e.g. AutoReset of env 1 alone
    after = stack.unwrapped.render([0, 1])
    assert diff(after[0], before[0]) <= RENDER_ATOL, (
        "a partial reset of env 1 changed env 0's image"
    )
    assert diff(after[1], before[1]) > RENDER_ATOL, "env 1's image does not show its reset"
    assert rec.recording and rec.engine.episode == 0, (
        "a reset of another env ended or restarted env 0's clip"
    )
    for i in range(2):
        stack.step(wiggle(10 + i))
    rec.end_clip()
    rec.flush()
    frames, _ = decode(clips[0].path)
    assert len(frames) == 6 and all(
        diff(a, b) <= RENDER_ATOL for a, b in zip(frames, spy.episodes[0])
    )


# --------------------------------------------------------------------------- triggers


def test_capped_cubic_trigger_counts_episodes_of_the_recorded_env(make_stack):
    """Episodes are counted on env_idx (env 1), not on every reset of any env."""
    limit = 2
    stack, rec, spy, clips = make_stack(limit, trigger=Trigger.cubic, env_idx=[1], kind="train")
    stack.reset(seed=0)
    for _ in range(9 * limit + 1):  # env 1 starts its episodes 1..9
        stack.step(zeros())
        stack.reset(env_idx=[0])  # many extra episodes of env 0, which must not count
    rec.flush()
    assert rec.engine.episode == 9
    assert [c.episode for c in clips] == [0, 1, 8]
    assert all(c.num_frames == limit + 1 for c in clips)
    # nothing rendered outside clips, and only the recorded env (Spy's own renders are not counted)
    assert all(r == [1] for r in spy.render_requests)
    assert len(spy.render_requests) == sum(c.num_frames for c in clips)
