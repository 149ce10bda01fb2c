"""The recorder in rlrec's env stack: an env wrapper between AutoReset and the adapter.

Sitting below AutoReset, it sees every ``reset`` (full or partial) and every ``step`` of the
adapter, before AutoReset resets the envs that finished, and hands each to its
:class:`~rlrec.record.engine.ClipEngine` (``recorder.engine``), which decides and records the
clips (docs/recorder.md has the full semantics): the fresh reset state is a clip's first frame
and the terminal state its last. Renders go through the adapter's ``render(env_idx)``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from rlrec.envs.base import EnvAdapter, EnvWrapper
from rlrec.record.encoder import ClipInfo
from rlrec.record.engine import ClipEngine
from rlrec.record.names import Name
from rlrec.record.settings import RecorderConfig
from rlrec.record.wrappers.base import RecorderWrapper
from rlrec.record.wrappers.episodes import env_seed
from rlrec.record.wrappers.view import viewed


class Recorder(RecorderWrapper, EnvWrapper):
    """Records clips of ``cfg.env_idx`` into ``video_dir`` (``cfg.dir`` overrides it).

    ``kind`` ("train" or "eval") goes into file names and :class:`ClipInfo`; ``on_clip`` is called
    with each clip once it is complete on disk, from the training thread (during a later
    ``step``/``reset``/``flush``/``close``); ``name``: the clips' file names
    (:mod:`rlrec.record.names`). Bad settings raise ConfigError here, before any work; then the
    video directory is created. ``cfg.view``: :mod:`rlrec.record.wrappers.view`.

    The clips' figures, the schedule and the caller's ``tag`` (each clip keeps the tag current at
    its first frame, and its :class:`ClipInfo` carries it) are the engine's: ``recorder.engine``.
    """

    def __init__(
        self,
        env: EnvAdapter,
        cfg: RecorderConfig,
        video_dir: Optional[str],
        kind: str = "train",
        on_clip: Optional[Callable[[ClipInfo], None]] = None,
        name: Optional[Name] = None,
    ):
        key = "recorder" if kind == "train" else f"{kind}_env.recorder"
        super().__init__(viewed(env, cfg, key))
        self.engine = ClipEngine(
            cfg, self.env, video_dir, kind=kind, key=key, on_clip=on_clip, name=name
        )

    def reset(self, seed=None, env_idx=None):
        out = self.env.reset(seed=seed, env_idx=env_idx)
        self.engine.on_reset(env_idx, env_seed(self.env, seed, self.engine.env_idx[0]))
        return out

    def step(self, action):
        out = self.env.step(action)
        self.engine.on_step(out[1], out[2], out[3], out[4])
        return out

    def state_dict(self) -> Dict[str, Any]:
        """Counters and schedule, for checkpoints."""
        return self.engine.state_dict()

    def load_state_dict(self, state: Dict[str, Any]):
        """Continues the schedule of a checkpoint (call it before the first reset)."""
        self.engine.load_state_dict(state)
