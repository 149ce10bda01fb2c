"""The env stack, composed at the call site: ``AutoReset(Recorder(adapter))``.

This module sits above ``rlrec.envs`` and ``rlrec.record`` and is the only one that knows both.
It also owns what a checkpoint keeps of a stack, keyed by role:

- ``adapter``: the simulator state, where the backend can save it (``state_dict`` on the adapter);
  ``None`` where it cannot, and then a resumed run starts new episodes;
- ``recorder``: the recorder's schedule and counters (``None`` when the stack records nothing);
- ``autoreset``: the episode return/length accumulators.

Each role is restored on its own, so a checkpoint saved with a recorder resumes with
``recorder=none`` (and the other way round) with the simulator restored either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from rlrec.envs.autoreset import AutoReset
from rlrec.envs.factory import backend_module, make_adapter
from rlrec.record import Recorder, names
from rlrec.record.settings import RecorderConfig, recording
from rlrec.record.wrappers.episodes import EpisodeClips

LOSSES = ("record/clips_dropped", "record/frames_dropped", "record/encoder_stalls")


@dataclass
class Stack:
    """An env stack and its recording layers (None where it has none), for who composed it."""

    env: AutoReset
    recorder: Optional[Recorder] = None
    clips: Optional[EpisodeClips] = None


def make_env_stack(
    env_cfg,
    sim,
    num_envs: int,
    seed: Optional[int],
    recorder_cfg: Optional[RecorderConfig] = None,
    video_dir: Optional[str] = None,
    kind: str = "train",
    on_clip=None,
    device=None,
    clips=None,
) -> Stack:
    """``AutoReset(Recorder(adapter))`` (``.env``) and its recording layers; the recorder is left
    out when disabled or ``none``; an eval recorder names its clips by their tag, the
    evaluation's training step (:func:`rlrec.record.names.by_tag`).
    When recording, an env that cannot render is refused before it is built. ``device``: the one
    the runner resolved (``rlrec.envs.factory.resolve_device``; None: resolved here).
    ``clips`` (a ``ClipChoice``): ``AutoReset(EpisodeClips(Recorder(adapter)))``, a clip of each
    env's first episode after a full reset, encoded with ``recorder_cfg``'s settings (its trigger
    aside), kept as ``clips`` chooses (:mod:`rlrec.record.wrappers.episodes`)."""
    record = recording(recorder_cfg)
    if record or clips is not None:
        getattr(backend_module(env_cfg.name), "check_renderable", lambda cfg: None)(env_cfg)
    env = make_adapter(env_cfg, sim, num_envs, seed, device=device)
    recorder = episodes = None
    if record:
        name = names.by_tag if kind == "eval" else None
        env = recorder = Recorder(env, recorder_cfg, video_dir, kind, on_clip, name)
    if clips is not None:
        cfg = recorder_cfg or RecorderConfig()
        env = episodes = EpisodeClips(env, cfg, video_dir, kind, f"{kind}_env.recorder", clips)
    return Stack(AutoReset(env), recorder, episodes)


def recorder_of(stack) -> Optional[Recorder]:
    """The recorder layer of ``stack``, or None."""
    return None if stack is None else stack.find(Recorder)


def record_losses(*stacks) -> Dict[str, int]:
    """What the recorders of ``stacks`` (None: skipped) lost so far, summed: :data:`LOSSES`
    (``ClipEngine.losses``)."""
    out = dict.fromkeys(LOSSES, 0)
    for stack in filter(None, stacks):
        rec = recorder_of(stack)
        for layer in filter(None, (rec and rec.engine, stack.find(EpisodeClips))):
            for k, v in layer.losses().items():
                out[f"record/{k}"] += v
    return out


def close_all(stacks, *after: Any) -> None:
    """Closes each stack's recorder (saving the episode in progress), then the stack, then each of
    ``after`` (None: skipped), every one even when one fails (e.g. a RecorderError of a last
    clip); then raises the first error."""
    errors = []
    for layer in [*(x for stack in stacks for x in (recorder_of(stack), stack)), *after]:
        try:
            if layer is not None:
                layer.close()
        except BaseException as exc:  # the rest are still closed
            errors.append(exc)
    if errors:
        raise errors[0]


def _roles(stack):
    return {"adapter": stack.unwrapped, "recorder": recorder_of(stack), "autoreset": stack}


def stack_state(stack: AutoReset) -> Dict[str, Optional[dict]]:
    """What a checkpoint keeps of ``stack``: one entry per role, None where a role has no state
    (an adapter that cannot save its simulator: a resumed run starts new episodes)."""
    return {
        r: layer.state_dict() if hasattr(layer, "state_dict") else None
        for r, layer in _roles(stack).items()
    }


def load_stack_state(stack: AutoReset, state: Dict[str, Optional[dict]]) -> None:
    """Restores each role that both the checkpoint and ``stack`` have."""
    for role, layer in _roles(stack).items():
        if state.get(role) is not None and hasattr(layer, "load_state_dict"):
            layer.load_state_dict(state[role])
