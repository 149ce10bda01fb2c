"""rlrec's built-in env: a batched 2-D point mass that must reach a goal disc.

Everything is torch on the chosen device, and the image is a pure function of the state
``(pos, goal, t)``, so tests can compare frames exactly: the goal is a green disc, the agent an
orange disc, and a white bar along the bottom grows with the step count ``t`` (so every frame of
an episode differs and a reset frame has an empty bar).

Each env draws its starts from a random stream of its own (:class:`EnvStreams`), so that env ``i``
of a reset with seed ``s`` starts as env 0 of a reset with seed ``s + i`` (the adapter contract's
seed rule), on any device and without a host round trip.
"""

from __future__ import annotations

from typing import Optional, Tuple

import gymnasium as gym
import numpy as np
import torch

from rlrec.checks import ConfigError
from rlrec.envs.base import EnvAdapter, EpisodeClock, as_env_index, pixel_space
from rlrec.envs.config import BuiltinEnvConfig, ObsMode
from rlrec.obs import RGB, STATE

_COLORS = ((24, 26, 34), (60, 200, 90), (250, 140, 30), (235, 235, 235))  # bg, goal, agent, bar
_U32 = 0xFFFFFFFF


def _mul32(x, c):
    """``x * c mod 2**32`` for ``0 <= x < 2**32`` in int64, without overflowing it: ``c`` in two
    16-bit halves, the high half's product cut to 16 bits before its shift."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _U32


def _mix32(x):
    """A 32-bit integer hash (Chris Wellons' "lowbias32") of int64 values in [0, 2**32)."""
    for shift, c in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        x = _mul32(x ^ (x >> shift), c)
    return x ^ (x >> 16)


class EnvStreams:
    """One random stream per env, drawn for any set of envs at once on the device.

    Env ``i``'s draws are a hash of its key (the seed it was given plus ``i``) and of how many
    numbers it has drawn since, so they depend on nothing else: not on the batch size, nor on
    which other envs reset (one ``torch.Generator`` is one stream for the whole batch, where env
    ``i``'s draws would depend on every draw before them). ``key`` and ``count`` (long
    ``[num_envs]``) are all of its state.
    """

    def __init__(self, num_envs: int, device: torch.device, seed: int = 0):
        self.key = torch.zeros(num_envs, dtype=torch.long, device=device)
        self.count = torch.zeros_like(self.key)
        self.seed(seed, torch.arange(num_envs, device=device))

    def seed(self, seed: int, idx: torch.Tensor) -> None:
        """Env ``i`` of ``idx`` restarts its stream at ``seed + i``."""
        self.key[idx] = (int(seed) + idx) & _U32
        self.count[idx] = 0

    def uniform(self, idx: torch.Tensor, n: int) -> torch.Tensor:
        """``float32 [len(idx), n]`` in [0, 1): the next ``n`` numbers of each env of ``idx``."""
        drawn = self.count[idx, None] * n + torch.arange(n, device=idx.device)
        bits = _mix32(_mix32(self.key[idx, None]) ^ (drawn & _U32))
        self.count[idx] += 1
        return (bits >> 8).to(torch.float32) * 2.0**-24  # 24 bits: exact in float32


class PointReach(EnvAdapter):
    """Point-mass reaching task.

    Observation (6): position, velocity, goal minus position; with ``obs_mode=rgb`` the image
    :meth:`draw` makes, at ``obs_height x obs_width``, as ``{"rgb": uint8 [N, H, W, 3]}``
    (rlrec/obs.py), and with ``rgb_state`` also ``"state"``: position and velocity (4). Action (2):
    acceleration in [-1, 1].
    Reward: progress towards the goal, +10 on success, a small time penalty. The episode
    terminates with ``info["success"]`` when the agent is inside the goal disc and is truncated
    after ``max_episode_steps``.
    """

    ACCEL = 4.0
    MAX_SPEED = 2.0
    AGENT_RADIUS = 0.06
    CHECKPOINTED = ("pos", "vel", "goal", "t")  # the checkpointed state, with the random streams

    def __init__(
        self,
        num_envs: int = 64,
        device: str | torch.device = "cpu",
        max_episode_steps: Optional[int] = 100,
        goal_radius: float = 0.1,
        dt: float = 0.05,
        render_width: int = 128,
        render_height: int = 128,
        seed: Optional[int] = None,
        obs_mode: str = ObsMode.state,
        obs_width: int = 64,
        obs_height: int = 64,
    ):
        self.num_envs, self.device, self.dt = num_envs, torch.device(device), float(dt)
        self.max_episode_steps, self.goal_radius = max_episode_steps, goal_radius
        self.width, self.height = render_width, render_height
        self.obs_mode, self.obs_size = ObsMode(obs_mode), (obs_height, obs_width)
        # the state: position, velocity and goal minus position; beside an image (rgb_state),
        # position and velocity
        state_dim = 6 if self.obs_mode == ObsMode.state else 4
        state = gym.spaces.Box(-np.inf, np.inf, (state_dim,), np.float32)
        self.single_observation_space = pixel_space(self.obs_mode, self.obs_size, state)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        # the construction's seed seeds the streams of the resets that get none
        self.streams = EnvStreams(num_envs, self.device, seed or 0)
        self.pos, self.vel, self.goal = torch.zeros(3, num_envs, 2, device=self.device)
        self.clock = EpisodeClock(num_envs, self.device)
        self._colors = torch.tensor(_COLORS, dtype=torch.uint8, device=self.device)

    @property
    def t(self) -> torch.Tensor:
        """Steps since each env's reset (the time limit's clock; drawn as the bar)."""
        return self.clock.elapsed

    # ------------------------------------------------------------------ dynamics
    def _obs(self):
        if self.obs_mode == ObsMode.state:
            return torch.cat([self.pos, self.vel, self.goal - self.pos], dim=1)
        obs = {RGB: self.draw(self.pos, self.goal, self.t, self.obs_size)}
        if self.obs_mode == ObsMode.rgb_state:
            obs[STATE] = torch.cat([self.pos, self.vel], dim=1)
        return obs

    def reset(self, seed=None, env_idx=None):
        idx = as_env_index(env_idx, self.num_envs, self.device)
        if seed is not None:
            self.streams.seed(seed, idx)
        u = self.streams.uniform(idx, 4)
        pos = -0.9 + 1.8 * u[:, :2]
        goal = -0.8 + 1.6 * u[:, 2:]
        # keep starts away from the goal: every coordinate then differs by at least 0.6
        close = (goal - pos).norm(dim=1, keepdim=True) < 0.4
        goal = torch.where(close, -torch.sign(pos) * 0.6, goal)
        self.pos[idx] = pos
        self.goal[idx] = goal
        self.vel[idx] = 0.0
        self.clock.reset(idx)
        return self._obs(), {"success": self.pos.new_zeros(self.num_envs, dtype=torch.bool)}

    def step(self, action):
        action = action.to(self.device, torch.float32).clamp(-1.0, 1.0)
        dist_before = (self.goal - self.pos).norm(dim=1)
        vel = self.vel + action * self.ACCEL * self.dt
        speed = vel.norm(dim=1, keepdim=True)
        self.vel = vel * (self.MAX_SPEED / speed.clamp(min=self.MAX_SPEED))
        pos = self.pos + self.vel * self.dt
        hit_wall = pos.abs() > 1.0
        self.pos = pos.clamp(-1.0, 1.0)
        self.vel = torch.where(hit_wall, torch.zeros_like(self.vel), self.vel)
        dist = (self.goal - self.pos).norm(dim=1)
        success = dist < self.goal_radius
        reward = 5.0 * (dist_before - dist) + 10.0 * success.float() - 0.01
        terminated = success.clone()
        truncated = self.clock.step(terminated, self.max_episode_steps)
        return self._obs(), reward, terminated, truncated, {"success": success}

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        """The full simulator state, so a resumed run continues bit-exactly."""
        state = {k: getattr(self, k).clone() for k in self.CHECKPOINTED}
        state["rng"] = torch.stack([self.streams.key, self.streams.count], dim=1)  # long [N, 2]
        return state

    def load_state_dict(self, state: dict) -> None:
        for k in self.CHECKPOINTED:
            getattr(self, k).copy_(state[k].to(self.device))
        rng = state["rng"].to(self.device)
        if rng.dtype != torch.long or tuple(rng.shape) != (self.num_envs, 2):
            raise ConfigError(
                "the built-in env's saved state holds one random generator for all envs (an "
                "older rlrec): resume it with the rlrec that saved it, or start a new run"
            )
        self.streams.key.copy_(rng[:, 0])
        self.streams.count.copy_(rng[:, 1])

    # ------------------------------------------------------------------ rendering
    def render(self, env_idx):
        idx = as_env_index(env_idx, self.num_envs, self.device)
        return self.draw(self.pos[idx], self.goal[idx], self.t[idx])

    def draw(
        self,
        pos: torch.Tensor,
        goal: torch.Tensor,
        t: torch.Tensor,
        size: Optional[Tuple[int, int]] = None,
    ) -> torch.Tensor:
        """Frames ``[k, H, W, 3]`` for explicit states: a pure function of ``(pos, goal, t)``, at
        ``size`` (height, width; the render size by default), all envs at once on the device."""
        height, width = size or (self.height, self.width)
        # pixel centres in world units (x right, y up), broadcast over [k, H, W]
        xs = ((torch.arange(width, device=self.device) + 0.5) / width * 2 - 1)[None, None]
        ys = (1 - (torch.arange(height, device=self.device) + 0.5) / height * 2)[None, :, None]

        def disc(center, radius):
            cx, cy = center[:, 0, None, None], center[:, 1, None, None]
            return (xs - cx) ** 2 + (ys - cy) ** 2 <= radius**2

        k = pos.shape[0]
        background, goal_color, agent_color, bar_color = self._colors
        frame = background.expand(k, height, width, 3).clone()
        frame[disc(goal, self.goal_radius)] = goal_color
        frame[disc(pos, self.AGENT_RADIUS)] = agent_color
        limit = self.max_episode_steps or 100
        filled = (t.float() / limit).clamp(max=1.0)[:, None, None]  # fraction of the bar
        bar_rows = max(1, height // 25)
        col_frac = ((torch.arange(width, device=self.device) + 1) / width)[None, None, :]
        bar = (col_frac <= filled).expand(k, bar_rows, width)
        frame[:, -bar_rows:][bar] = bar_color
        return frame


def make(env_cfg: BuiltinEnvConfig, sim, num_envs: int, device, seed=None) -> PointReach:
    """Factory entry point for ``env=builtin``: every field of the schema but its name and
    ``num_envs`` (the stack's own) is a keyword argument of :class:`PointReach`."""
    kwargs = {k: v for k, v in vars(env_cfg).items() if k not in ("name", "num_envs")}
    return PointReach(num_envs=num_envs, device=device, seed=seed, **kwargs)
