"""Shared by the real-ManiSkill tests (CPU sim, lavapipe Vulkan, small frames): importing it skips
a module without the maniskill extra; ``pytestmark`` marks its tests."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "mani_skill", reason="needs the maniskill extra: bash scripts/setup_maniskill.sh"
)
pytestmark = [
    pytest.mark.maniskill,
    # raised inside ManiSkill (np.isnan on a torch tensor), not here
    pytest.mark.filterwarnings("ignore:__array_wrap__:DeprecationWarning"),
]

from rlrec.envs import maniskill as ms  # noqa: E402
from rlrec.envs.config import ManiSkillEnvConfig, SimConfig  # noqa: E402

SIZE = 64


def make_cfg(**over) -> ManiSkillEnvConfig:
    return ManiSkillEnvConfig(**{"render_width": SIZE, "render_height": SIZE, **over})


def make_env(num_envs=2, seed=None, sim="cpu", **over):
    """``num_envs`` envs of ``make_cfg(**over)`` on the CPU sim (``sim=gpu``: on CUDA)."""
    sim_cfg = SimConfig(name=sim, device="cuda" if sim == "gpu" else "cpu")
    device = torch.device(sim_cfg.device)
    return ms.make(make_cfg(**over), sim_cfg, num_envs=num_envs, device=device, seed=seed)
