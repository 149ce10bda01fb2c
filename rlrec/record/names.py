"""Clip file names: every name a recorder gives a clip, and the one parse of a name back.

A :class:`~rlrec.record.engine.ClipEngine` asks its ``name(ClipStart) -> str`` for each clip's
file name (in its video dir); a taken name gets ``-1``, ``-2``, ... (the encoder). The names:

- :func:`default`: ``{kind}-ep{episode:06d}-step{step:09d}.mp4``, read back by :func:`first_step`;
- :func:`fixed`: ``recorder.filename``, one file replaced by each clip;
- :func:`prefixed`: Gymnasium's ``{prefix}-episode-{episode}.mp4`` / ``-step-{step}.mp4``;
- :func:`evaluation`: ``eval-step{step:09d}.mp4``, the clip of the evaluation at training step
  ``step`` (its tag);
- :func:`episode_clip`: ``{kind}-step{step:09d}-env{env:03d}.mp4``, an eval env's own clip;
  these two read back by :func:`evaluation_step`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from rlrec.checks import ConfigError


@dataclass(frozen=True)
class ClipStart:
    """What a clip's name may say: the recorder's kind, the recorded env's episode, the
    recorder's step count at the first frame, whether the step trigger started it, the tag."""

    kind: str
    episode: int
    step: int
    by_step: bool = False
    tag: Any = None


Name = Callable[[ClipStart], str]


def default(start: ClipStart) -> str:
    return f"{start.kind}-ep{start.episode:06d}-step{start.step:09d}.mp4"


_DEFAULT = re.compile(r"^(?P<kind>[a-z]+)-ep\d+-step(?P<step>\d+)(?:-\d+)?\.mp4$")


def first_step(name: str, kind: str) -> Optional[int]:
    """The step count a :func:`default` name of ``kind`` says (a claimed ``-N`` suffix allowed);
    None for any other name."""
    m = _DEFAULT.match(name)
    return int(m.group("step")) if m and m.group("kind") == kind else None


def fixed(filename: str) -> Name:
    """Every clip under ``filename`` (``.mp4`` appended when missing)."""
    name = filename if filename.lower().endswith(".mp4") else filename + ".mp4"
    return lambda start: name


def prefixed(prefix: str, key: str, step_base: int = 0) -> Name:
    """Gymnasium's names: a step trigger's clip is named by its step count less ``step_base``
    (1 for Gymnasium's step ids, 0 after the first step). ConfigError naming ``key`` unless
    ``prefix`` is a plain file-name prefix."""
    bad = not isinstance(prefix, str) or not prefix.strip()
    if bad or "/" in prefix or prefix.startswith((".", "-")):
        raise ConfigError(
            f"{key}: name_prefix={prefix!r} is invalid: a plain file-name prefix (no '/', not "
            "starting with '.' or '-')"
        )

    def name(s):
        at = f"step-{s.step - step_base}" if s.by_step else f"episode-{s.episode}"
        return f"{prefix}-{at}.mp4"

    return name


def evaluation(step: int) -> str:
    """The file name of the evaluation clip of training step ``step``."""
    return f"eval-step{int(step):09d}.mp4"


def by_tag(start: ClipStart) -> str:
    """An eval recorder's names: :func:`evaluation` of the clip's tag (the training step), else
    :func:`default`."""
    return default(start) if start.tag is None else evaluation(start.tag)


_EVALUATION = re.compile(r"^(?P<kind>[a-z]+)-step(?P<step>\d+)(?:-env\d+)?(?:-\d+)?\.mp4$")


def evaluation_step(name: str, kind: str) -> Optional[int]:
    """The training step an :func:`evaluation` or :func:`episode_clip` name of ``kind`` says (a
    claimed ``-N`` suffix allowed); None for any other name."""
    m = _EVALUATION.match(name)
    return int(m.group("step")) if m and m.group("kind") == kind else None


def episode_clip(kind: str, tag, env: int) -> str:
    """The name of env ``env``'s own clip of the evaluation tagged ``tag`` (an int: its step)."""
    if isinstance(tag, int) and not isinstance(tag, bool):
        return f"{kind}-step{tag:09d}-env{env:03d}.mp4"
    return f"{kind}-env{env:03d}.mp4"
