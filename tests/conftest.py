"""Fixtures shared by every test module (tests/ mirrors rlrec/, as packages).

Configs are composed with Hydra's compose API from the repo's own conf/ (``tests.helpers``), as
lightning-hydra-template's conftest does: the tests see exactly what ``python train.py`` composes.
"""

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
