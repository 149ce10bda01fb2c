"""rlrec.train.stack: the composed env stack and what a checkpoint keeps of it, keyed by role."""

from __future__ import annotations

import pytest
import torch

from rlrec.envs.autoreset import AutoReset
from rlrec.envs.builtin import BuiltinEnvConfig
from rlrec.envs.config import SimConfig
from rlrec.record import Recorder
from rlrec.record.settings import RecorderConfig, Trigger
from rlrec.train import checkpoint as ckpt
from rlrec.train.stack import load_stack_state, make_env_stack, recorder_of, stack_state
from tests.trainutil import runner

ENV = BuiltinEnvConfig(num_envs=3, max_episode_steps=7, render_width=16, render_height=16)


def _stack(tmp_path, record: bool, seed: int = 0, steps: int = 11) -> AutoReset:
    """A stack of 3 built-in envs, recording every episode or not, ``steps`` random steps in."""
    rec = RecorderConfig(trigger=Trigger.always) if record else RecorderConfig(enabled=False)
    stack = make_env_stack(ENV, SimConfig(), 3, seed, rec, video_dir=str(tmp_path / "v")).env
    stack.reset(seed=5)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        stack.step(torch.rand(3, 2, generator=gen) * 2 - 1)
    return stack


def test_the_stack_is_autoreset_over_recorder_over_adapter_and_its_state_is_by_role(tmp_path):
    stack = _stack(tmp_path, record=True)
    try:
        assert isinstance(stack, AutoReset) and isinstance(stack.env, Recorder)
        assert recorder_of(stack) is stack.env and stack.unwrapped is stack.env.env
        state = stack_state(stack)
    finally:
        recorder_of(stack).close()
    assert set(state) == {"adapter", "recorder", "autoreset"} and state["recorder"] is not None
    assert torch.equal(state["adapter"]["pos"], stack.unwrapped.pos)
    bare = _stack(tmp_path, record=False)
    assert recorder_of(bare) is None and bare.env is bare.unwrapped
    assert stack_state(bare)["recorder"] is None and stack_state(bare)["adapter"] is not None


@pytest.mark.parametrize("save_with, load_with", [(True, False), (False, True)])
def test_the_simulator_is_restored_whether_a_recorder_saved_or_loads_it(
    tmp_path, save_with, load_with
):
    saved = _stack(tmp_path / "a", record=save_with)
    target = _stack(tmp_path / "b", record=load_with, seed=99, steps=0)
    load_stack_state(target, stack_state(saved))
    for key in ("pos", "vel", "goal", "t"):
        assert torch.equal(getattr(target.unwrapped, key), getattr(saved.unwrapped, key)), key
    assert torch.equal(target.state_dict()["return"], saved.state_dict()["return"])
    for rec in filter(None, map(recorder_of, (saved, target))):
        rec.close()


@pytest.mark.parametrize("first, second", [([], ["recorder=none"]), (["recorder=none"], [])])
def test_runner_resumes_the_simulator_across_recorder_settings(tmp_path, first, second):
    """A checkpoint written with a recorder, resumed with recorder=none (and the other way round):
    the built-in env's positions are those of the checkpoint, and the saved next observation is
    the one collection continues from, so the two agree."""
    from tests.helpers import FAST

    common = ["eval_env.enabled=false", "total_steps=256"]
    runner(tmp_path / "run", [*common, *first], base=FAST).run()
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    data = ckpt.load(last)
    args = [*common, *second, "total_steps=512", f"checkpoint={last}"]
    resumed = runner(tmp_path / "resumed", args, base=FAST)
    try:
        obs, env = resumed._restore(), resumed.train_env.unwrapped
        assert obs is not None
        assert torch.equal(env.pos, data["train_env"]["adapter"]["pos"])
        assert not torch.equal(env.pos, torch.zeros_like(env.pos))
        torch.testing.assert_close(obs[:, :2], env.pos)  # the observation matches the env
    finally:
        resumed.close()
