"""Fixtures shared by every test module (tests/ mirrors rlrec/, as packages).

Configs are composed with Hydra's compose API from the repo's own conf/ (``tests.helpers``), as
lightning-hydra-template's conftest does: the tests see exactly what ``python train.py`` composes.
"""

import importlib.util
import os
from typing import Callable, Sequence

import pytest

from rlrec.config import Config
from tests.helpers import FAST, make_config

os.environ.setdefault("PYTHONHASHSEED", "0")
# torch.compile's C++ builder imports setuptools, whose distutils override asserts when the
# standard library's distutils was imported first (by another package, earlier in the suite)
os.environ.setdefault("SETUPTOOLS_USE_DISTUTILS", "stdlib")


@pytest.fixture
def fast_config() -> Callable[..., Config]:
    """``fast_config(overrides)``: the composed, validated config with the small settings of
    ``tests.helpers.FAST`` (8 envs, 32x32 frames, short rollouts, no logger) under ``overrides``."""

    def make(overrides: Sequence[str] = ()) -> Config:
        return make_config([*FAST, *overrides])

    return make


@pytest.fixture
def run_dir(tmp_path):
    """An empty run dir, as Hydra makes one for a run."""
    path = tmp_path / "run"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def uninterrupted_resumable(tmp_path_factory):
    """The uninterrupted ``train.py`` run of ``tests.test_fault_tolerance.RESUMABLE`` that every
    stopped-and-resumed run of tests/test_fault_tolerance.py and tests/test_signal_boundaries.py
    must equal, bit for bit: one run per test process, which the tests only read."""
    from tests.helpers import run_train
    from tests.test_fault_tolerance import RESUMABLE

    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    run_train([*RESUMABLE, f"hydra.run.dir={run_dir}"], cwd=run_dir.parent)
    return run_dir


@pytest.fixture(scope="session", autouse=True)
def sapien_render_device(request):
    """One small ManiSkill env alive for the whole session when any selected test is marked
    ``maniskill``: SAPIEN's render device lives while any env does, and bringing it up again on
    lavapipe costs about 12 s of CPU each time the last env was freed (0.7 s with one alive), which
    every module or test that builds its own env would otherwise pay."""
    wanted = any(item.get_closest_marker("maniskill") for item in request.session.items)
    if not wanted or importlib.util.find_spec("mani_skill") is None:
        yield None
        return
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401  (registers the tasks)

    env = gym.make(
        "PushCube-v1",
        num_envs=1,
        obs_mode="state",
        render_mode="rgb_array",
        sim_backend="physx_cpu",
        render_backend="cpu",
        human_render_camera_configs=dict(width=32, height=32),
    )
    env.reset(seed=0)
    env.render()
    yield env
    env.close()
