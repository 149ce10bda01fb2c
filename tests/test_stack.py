"""rlrec.train.stack: the composed env stack and what a checkpoint keeps of it, keyed by role."""

from __future__ import annotations

import torch

from rlrec.envs.autoreset import AutoReset
from rlrec.envs.builtin import BuiltinEnvConfig
from rlrec.envs.config import SimConfig
from rlrec.record import Recorder
from rlrec.record.settings import RecorderConfig, Trigger
from rlrec.train import checkpoint as ckpt
from rlrec.train.runner import Runner
from rlrec.train.stack import (
    load_stack_state,
    make_env_stack,
    recorder_of,
    simulator_saved,
    stack_state,
)

ENV = BuiltinEnvConfig(num_envs=3, max_episode_steps=7, render_width=16, render_height=16)


def _stack(tmp_path, record: bool, seed: int = 0) -> AutoReset:
    rec = RecorderConfig(trigger=Trigger.always) if record else RecorderConfig(enabled=False)
    return make_env_stack(ENV, SimConfig(), 3, seed, rec, video_dir=str(tmp_path / "v")).env


def _advance(stack: AutoReset, steps: int = 11) -> None:
    stack.reset(seed=5)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        stack.step(torch.rand(3, 2, generator=gen) * 2 - 1)


def test_the_stack_is_autoreset_over_recorder_over_adapter(tmp_path):
    stack = _stack(tmp_path, record=True)
    try:
        assert isinstance(stack, AutoReset) and isinstance(stack.env, Recorder)
        assert recorder_of(stack) is stack.env and stack.unwrapped is stack.env.env
    finally:
        recorder_of(stack).close()
    bare = _stack(tmp_path, record=False)
    assert recorder_of(bare) is None and bare.env is bare.unwrapped


def test_state_is_keyed_by_role(tmp_path):
    stack = _stack(tmp_path, record=True)
    _advance(stack)
    state = stack_state(stack)
    recorder_of(stack).close()
    assert set(state) == {"adapter", "recorder", "autoreset"}
    assert simulator_saved(state) and state["recorder"] is not None
    assert torch.equal(state["adapter"]["pos"], stack.unwrapped.pos)
    bare = stack_state(_stack(tmp_path, record=False))
    assert bare["recorder"] is None and simulator_saved(bare)


def _restore_across(tmp_path, save_with: bool, load_with: bool) -> None:
    saved = _stack(tmp_path / "a", record=save_with)
    _advance(saved)
    state = stack_state(saved)
    target = _stack(tmp_path / "b", record=load_with, seed=99)
    target.reset(seed=1)
    load_stack_state(target, state)
    for key in ("pos", "vel", "goal", "t"):
        assert torch.equal(getattr(target.unwrapped, key), getattr(saved.unwrapped, key)), key
    assert torch.equal(target.state_dict()["return"], saved.state_dict()["return"])
    for s in (saved, target):
        if recorder_of(s) is not None:
            recorder_of(s).close()


def test_simulator_restored_when_saved_with_a_recorder_and_loaded_without(tmp_path):
    _restore_across(tmp_path, save_with=True, load_with=False)


def test_simulator_restored_when_saved_without_a_recorder_and_loaded_with(tmp_path):
    _restore_across(tmp_path, save_with=False, load_with=True)


def test_runner_resumes_the_simulator_across_recorder_settings(tmp_path, fast_config):
    """A checkpoint written with a recorder, resumed with recorder=none (and the other way round):
    the built-in env's positions are those of the checkpoint, and the saved next observation is
    the one collection continues from, so the two agree."""
    for first, second in (([], ["recorder=none"]), (["recorder=none"], [])):
        run_dir = tmp_path / f"run{len(first)}"
        run_dir.mkdir()
        common = ["eval_env.enabled=false", "total_steps=256"]
        Runner(fast_config([*common, *first]), run_dir).run()
        data = ckpt.load(run_dir / "checkpoints" / "last.pt")
        resumed_dir = tmp_path / f"resumed{len(first)}"
        resumed_dir.mkdir()
        resumed = Runner(
            fast_config(
                [*common, *second, "total_steps=512", f"checkpoint={run_dir}/checkpoints/last.pt"]
            ),
            resumed_dir,
        )
        try:
            obs = resumed._restore()
            env = resumed.train_env.unwrapped
            assert obs is not None
            assert torch.equal(env.pos, data["train_env"]["adapter"]["pos"])
            assert not torch.equal(env.pos, torch.zeros_like(env.pos))
            torch.testing.assert_close(obs[:, :2], env.pos)  # the observation matches the env
        finally:
            resumed.close()
