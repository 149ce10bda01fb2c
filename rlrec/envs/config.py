"""The env's and the sim's settings: the fields every backend understands (each backend's own
schema sits in its module and extends :class:`EnvConfig`; ``rlrec.envs.factory`` lists them), the
choices several backends share, and where the simulator runs (the ``sim`` group)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from rlrec.checks import Choice, check_choices

Vectorization = Choice("Vectorization", {"sync": "sync", "async": "async"}, module=__name__)
Vectorization.__doc__ = (
    "How an adapter runs CPU sub-envs: in this process, or one worker process each."
)

StartMethod = Choice(
    "StartMethod", {"fork": "fork", "spawn": "spawn", "forkserver": "forkserver"}, module=__name__
)
StartMethod.__doc__ = "multiprocessing start method of async vector envs."


class ObsMode(Choice):
    """What an env observes (rlrec/obs.py): ``state`` one float vector; ``rgb`` its camera image
    (uint8, ``env.obs_height x env.obs_width``); ``rgb_state`` the image and the robot's own
    state (ppo_rgb.py's ``--include-state``)."""

    state = "state"
    rgb = "rgb"
    rgb_state = "rgb_state"


class SimName(Choice):
    """Where the simulator runs."""

    cpu = "cpu"
    gpu = "gpu"


@dataclass
class EnvConfig:
    """Fields every env backend understands. A backend's schema extends it; its ``name`` default
    is the backend's name (``env=<name>``, ``conf/env/<name>.yaml``)."""

    name: str = "???"  # OmegaConf's MISSING: each backend's schema gives its own
    # envs per stack (per rank on several ranks; the eval stack has its own: eval_env.num_envs)
    num_envs: int = 64
    max_episode_steps: Optional[int] = None  # None: the backend's own time limit
    render_width: int = 128
    render_height: int = 128

    def __post_init__(self) -> None:
        # a closed choice (an Enum field) is refused here when the schema is built in code, as
        # Hydra refuses it while composing: the backends never see a value outside it
        check_choices(self, "env.")

    def frame_size(self) -> Optional[Tuple[int, int]]:
        """``(height, width)`` of this env's frames, or None where the env chooses its own size
        (the memory estimate sizes the recorder's frame buffers with it)."""
        return (self.render_height, self.render_width)

    def obs_image(self) -> Optional[Tuple[int, int, int]]:
        """``(height, width, channels)`` of the image this env observes, or None (state only):
        the memory estimate and the encoder's checks read it before the env is built."""
        return None


@dataclass
class SimConfig:
    """Where the simulator runs: ``cpu`` or ``gpu`` (CUDA)."""

    name: SimName = SimName.cpu
    device: str = "cpu"  # torch device of the env's tensors and of the policy
