"""Value checks shared by every component's settings: the error type, closed choices, float
ranges, seeds and devices. Plain Python (no Hydra, no OmegaConf), so a component that
is used without Hydra (the recorder in a user's own loop) checks its settings with the same rules
and messages as a composed run.
"""

from __future__ import annotations

import difflib
import enum
import math
import typing
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple


class ConfigError(ValueError):
    """A config value is invalid. The message names the key and what is allowed."""


class Choice(str, enum.Enum):
    """A closed choice: compares equal to, and prints as, its string value (like 3.11's StrEnum)."""

    __str__ = str.__str__
    __format__ = str.__format__

    def _generate_next_value_(name, *_):  # noqa: N805  (Enum's hook: a member's value is its name)
        return name

    @classmethod
    def values(cls) -> List[str]:
        return [m.value for m in cls]


@dataclass(frozen=True)
class Range:
    """The values a float field allows: always a finite number, at least ``low`` (``low_open``:
    above it) and at most ``high`` where given (``high`` only with ``low``). NaN and infinity mean
    nothing in any field."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        return math.isfinite(value) and above and (self.high is None or value <= self.high)

    def __str__(self) -> str:
        if self.low is None:
            return "a finite number"
        if self.high is None:
            return f"a finite number {'>' if self.low_open else '>='} {self.low:g}"
        return f"a finite number in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"


POSITIVE = Range(low=0.0, low_open=True)
NON_NEGATIVE = Range(low=0.0)
UNIT = Range(low=0.0, high=1.0)
# seconds, bounded where they become a clip length, a timeout or a timedelta: a day is far beyond
# any use, and 1e308 would overflow those (int(inf), threading's and timedelta's limits)
SECONDS = Range(low=0.0, low_open=True, high=86_400.0)


def field_types(cls: type) -> Iterator[Tuple[str, Any, bool]]:
    """``(name, type, nullable)`` of each field of dataclass ``cls``: ``Optional[X]`` gives ``X``
    and nullable (a union of several types gives None)."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        hint, nullable = hints[f.name], False
        if typing.get_origin(hint) is typing.Union:
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            nullable = len(args) < len(typing.get_args(hint))
            hint = args[0] if len(args) == 1 else None
        yield f.name, hint, nullable


def check_fields(obj: Any, prefix: str = "") -> None:
    """Every field of dataclass ``obj`` and of the dataclasses it holds, named ``prefix + field``:
    a :class:`Choice` holds one of its values (:func:`check_choices`), a float is a finite number
    in its range (the schema's ``FLOAT_RANGES``); ConfigError naming the key and what is allowed."""
    check_choices(obj, prefix)
    for name, hint, nullable in field_types(type(obj)):
        value = getattr(obj, name)
        if is_dataclass(value):
            check_fields(value, f"{prefix}{name}.")
        elif hint is float and not (value is None and nullable):
            # its schema's FLOAT_RANGES (a subclass that sets its own restates its bases')
            allowed = getattr(type(obj), "FLOAT_RANGES", {}).get(name, Range())
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or value not in allowed:
                rule = f"{allowed} or null" if nullable else str(allowed)
                raise ConfigError(f"{prefix}{name}={value!r} is invalid: must be {rule}")


SEED_MAX = 2**32 - 1  # NumPy's seeds are 32-bit


def check_seed(value: Any, key: str, num_envs: int, count_key: str) -> None:
    """Env i of a stack is seeded ``seed + i``: every one of them must be a seed NumPy takes."""
    high = SEED_MAX - (num_envs - 1)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise ConfigError(
            f"{key}={value!r} is invalid: must be an integer in [0, {high}] (env i is seeded "
            f"{key} + i for each of the {count_key}={num_envs} envs, and seeds are 32-bit)"
        )


def check_device(value: Any, key: str = "sim.device") -> None:
    """``cpu``, ``cuda`` or ``cuda:N``, parsed by ``torch.device`` (torch is imported here only:
    the checks above it stay fast)."""
    import torch

    try:
        device = torch.device(value)
        valid = device.type == "cuda" or (device.type == "cpu" and device.index is None)
    except (RuntimeError, TypeError, ValueError):
        valid = False
    if not valid:
        raise ConfigError(
            f"{key}={value!r} is invalid: allowed values are cpu, cuda, cuda:N (N: a GPU index)"
        )


def positive(value: Any, key: str, *, allow_none: bool = False) -> None:
    if (value is None or value <= 0) and not (value is None and allow_none):
        rule = "a positive number or null" if allow_none else "a positive number"
        raise ConfigError(f"{key}={value!r} is invalid: must be {rule}")


def did_you_mean(value: str, allowed: Sequence[str], before: str = "", after: str = "") -> str:
    """``"did you mean X?"`` for the names of ``allowed`` closest to a mistyped ``value``, best
    first (one that differs only in case, then difflib's close matches), each written between
    ``before`` and ``after``; ``""`` where none is close."""
    close = difflib.get_close_matches(value, allowed, n=3, cutoff=0.6)
    case = [name for name in allowed if name.lower() == value.lower() and name not in close]
    names = " or ".join(before + name + after for name in case[:1] + close)
    return f"did you mean {names}?" if names else ""


def one_of(value: Any, key: str, allowed: List[str]) -> None:
    if value not in allowed:
        hint = did_you_mean(str(value), allowed)
        raise ConfigError(
            f"{key}={value!r} is invalid: allowed values are {', '.join(allowed)}"
            + (f" ({hint})" if hint else "")
        )


def check_choices(obj: Any, prefix: str = "") -> None:
    """Every :class:`Choice` field of dataclass ``obj`` holds one of its values (an Optional one
    may be None) and becomes its member; ConfigError naming ``prefix + field`` and the allowed
    values. Hydra refuses such a value while composing; this is the same refusal for a schema
    built in code."""
    for name, hint, nullable in field_types(type(obj)):
        value = getattr(obj, name)
        if isinstance(hint, type) and issubclass(hint, Choice) and not (value is None and nullable):
            try:
                setattr(obj, name, hint(value))
            except ValueError:
                one_of(value, prefix + name, hint.values() + (["null"] if nullable else []))
