"""When a clip starts: every trigger decision of a recorder, and the state those decisions keep.

The recorder counts steps (calls of ``step``) and episodes of the recorded env and asks its
:class:`Schedule` at two moments:

- :meth:`Schedule.on_reset`, once at each new episode of the recorded env (its reset): does a clip
  start with this episode's first frame? Asked once per episode, an episode trigger cannot fire
  twice in one episode, even when a short clip ends long before the episode does.
- :meth:`Schedule.on_step`, after each step, only for ``trigger=step``
  (:attr:`Schedule.asks_steps`): does a clip start on the current state? (While a clip is open,
  only with ``restart``.)

Beyond the trigger, two requests start a clip at a reset: :meth:`Schedule.record_next_episode`
(the next episode, once) and :meth:`Schedule.expect_end` (with ``record_final_episode``: every
episode that may still be in progress when the run ends, provisionally). Each decision says why a
clip starts (:class:`Start`), which its name may tell.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Dict, Optional

from rlrec.record.settings import RecorderConfig, Trigger


class Start(enum.Enum):
    """Why a clip starts: at an episode's reset (``episode``), by the step trigger (``step``), or
    provisionally (``provisional``: recorded in case it is the episode in progress at
    ``close()``, which alone keeps it; see ``provisional`` of :class:`Schedule` and
    :meth:`Schedule.expect_end`)."""

    episode = "episode"
    step = "step"
    provisional = "provisional"


def capped_cubic(episode: int) -> bool:
    """True for episodes 0, 1, 8, 27, ..., 729, 1000, 2000, 3000, ... (Gymnasium's schedule)."""
    if episode < 1000:
        return round(episode ** (1.0 / 3)) ** 3 == episode
    return episode % 1000 == 0


class Schedule:
    """The trigger decisions of one recorder.

    ``trigger``: a :class:`Trigger` (or its name); ``every``: N for ``episode``
    (every N episodes) and ``step`` (every N steps); ``record_final_episode``: whether
    :meth:`expect_end` arms the final episodes. The settings are checked by
    :meth:`rlrec.record.settings.RecorderConfig.check`, not here.

    ``episode_fn`` / ``step_fn``: callable triggers (Gymnasium's ``episode_trigger`` /
    ``step_trigger``) replacing ``trigger``: ``episode_fn(episode)`` is asked once at each new
    episode, ``step_fn(steps)`` in place of ``steps % every == 0``; both: a clip starts when either
    fires. ``restart`` (Gymnasium's RecordVideo): a step trigger that fires while a clip is open
    ends that clip and starts its own. ``provisional`` (with ``record_final_episode``, until
    :meth:`expect_end`): every episode no trigger selects starts a provisional clip, which only
    ``close()`` keeps. ``hold``: the clips wait, encoded, for the caller's final word
    (:meth:`Encoder.release`).
    """

    STATE_VERSION = 1

    def __init__(
        self,
        trigger,
        every: Optional[int] = None,
        record_final_episode: bool = False,
        episode_fn: Optional[Callable[[int], bool]] = None,
        step_fn: Optional[Callable[[int], bool]] = None,
        provisional: bool = False,
        restart: bool = False,
        hold: bool = False,
    ):
        self.episode_fn, self.step_fn = episode_fn, step_fn
        if step_fn is not None or episode_fn is not None:  # callables replace the trigger
            trigger = Trigger.step if step_fn is not None else Trigger.episode
        self.trigger = Trigger(trigger)
        # whether on_step must be asked after each step; False: a recorder need not look at them
        self.asks_steps = self.trigger is Trigger.step
        self.every, self.record_final_episode = every, record_final_episode
        self.provisional = record_final_episode and provisional
        self.restart, self.hold = restart, hold
        # checkpointed: the step trigger fell on a terminal step (start at the next reset), and
        # the step count at which it last fired
        self._step_pending, self._step_fired_at = False, -1
        # this process only: record_next_episode; the step count at which the caller will close
        # the recorder and the longest episode (None: unknown); the episode on_reset last saw
        self._record_next = False
        self._end = None
        self._horizon = None
        self._asked = None

    @classmethod
    def of(cls, cfg: RecorderConfig, **kw) -> "Schedule":
        """The schedule of ``cfg`` (``kw``: the callables, ``provisional``, ``restart``,
        ``hold``)."""
        return cls(cfg.trigger, cfg.every, cfg.record_final_episode, **kw)

    # ------------------------------------------------------------------ decisions
    def on_reset(self, episode: int, steps: int, full_reset: bool) -> Optional[Start]:
        """Whether (and why) a clip starts with the first frame of ``episode`` of the recorded
        env, reset after ``steps`` steps; None: none. ``full_reset``: it was
        ``reset(env_idx=None)`` (an AutoReset naming every env is not one); ``trigger=eval``
        records the first episode after each, i.e. one clip per evaluation. Asked again about the
        same episode, it says None."""
        if episode == self._asked:
            return None
        self._asked = episode
        by_step = self.asks_steps and (
            self._step_pending or (steps != self._step_fired_at and self._step_due(steps))
        )
        t = self.trigger  # eval: the first episode after a full reset; none: never
        if self.episode_fn is not None:  # with both callables, its clip too
            by_episode = bool(self.episode_fn(episode))
        else:
            by_episode = (
                (t is Trigger.cubic and capped_cubic(episode))
                or (t is Trigger.episode and episode % self.every == 0)  # type: ignore[operator]
                or t is Trigger.always
                or (t is Trigger.eval and full_reset)
            )
        if not (by_step or by_episode or self._record_next):
            # no trigger: a clip only in case this episode is the one in progress at close()
            return Start.provisional if self.provisional or self._final(steps) else None
        if self.asks_steps:
            self._step_fired_at = steps
        self._step_pending = self._record_next = False
        # the step trigger's name wins when both fire (Gymnasium's)
        return Start.step if by_step or (self.asks_steps and not by_episode) else Start.episode

    def on_step(self, steps: int, busy: bool, terminal: Callable[[], bool]) -> Optional[Start]:
        """Whether a clip starts on the state after step ``steps`` (asked only where
        :attr:`asks_steps`). ``busy``: a clip is open; the step trigger then starts nothing,
        unless ``restart`` (that clip then ends where this one starts). ``terminal()`` says
        whether that step ended the recorded env's episode; it is called only when the step
        trigger falls (a device read-back every ``every`` steps). On a terminal step the clip
        starts at the next reset instead: a clip of the terminal frame alone is useless."""
        if not self.asks_steps or (busy and not self.restart) or not self._step_due(steps):
            return None
        self._step_fired_at = steps
        if terminal():
            self._step_pending = True
            return None
        return Start.step

    def _step_due(self, steps):
        if self.step_fn is not None:
            return bool(self.step_fn(steps))
        return steps % self.every == 0  # type: ignore[operator]

    def _final(self, steps):
        """Whether an episode reset after ``steps`` steps may be in progress at the announced
        end."""
        horizon = self._horizon
        return self._end is not None and (horizon is None or self._end - steps <= horizon)

    # ------------------------------------------------------------------ requests
    def record_next_episode(self):
        """The next episode starts a clip, whatever the trigger says (once)."""
        self._record_next = True

    def expect_end(self, steps: int, steps_left: int, horizon: Optional[int]):
        """The recorder is at step ``steps`` and will be closed after ``steps_left`` more steps.

        With ``record_final_episode``, every episode that begins within the last ``horizon`` steps
        (the longest an episode can last; None: unknown, so every episode from now on) and that no
        trigger selects starts a provisional clip, so the episode in progress at the end has one
        and the others are dropped as they end. An idle recorder renders nothing, so
        an episode already running when this is called cannot get a clip any more: announce the
        end at least ``horizon`` steps before it. Not checkpointed: a resumed run announces its
        own end. Without ``record_final_episode`` it does nothing but check ``steps_left``
        (ValueError when negative, with or without it); with it, it ends ``provisional``.
        """
        if steps_left < 0:
            raise ValueError(f"expect_end: steps_left={steps_left} must be >= 0")
        if self.record_final_episode:
            self.provisional = False
            self._end, self._horizon = steps + steps_left, horizon

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> Dict[str, Any]:
        return {
            "version": self.STATE_VERSION,
            "step_pending": self._step_pending,
            "step_fired_at": self._step_fired_at,
        }

    def load_state_dict(self, state: Dict[str, Any]):
        version = state.get("version") if isinstance(state, dict) else None
        if version != self.STATE_VERSION:
            raise ValueError(
                f"not a recorder schedule state of version {self.STATE_VERSION}: "
                f"version {version!r}"
            )
        self._step_pending = bool(state.get("step_pending", False))
        self._step_fired_at = int(state.get("step_fired_at", -1))
        self._asked = None  # the episode counter is the caller's, and it was just replaced too
