"""A small, real Genesis Forge env for the VideoWrapper tests: a box thrown up and sideways.

``ThrownBox`` is a :class:`genesis_forge.ManagedEnvironment` like a user's: a plane, a free box,
one 64x64 camera bound to env 0 (only env 0 is drawn), a :class:`TerminationManager` that
truncates env ``i`` after ``lengths[i]`` steps, and the framework's own autoreset inside
``step`` (``ManagedEnvironment.step`` calls ``self.reset(done_envs)`` before it returns).
Episode ``k`` of an env starts with the box at ``x = -0.8 + 0.25 * (k % 5)``, thrown with
velocity ``(3, 0, 5)`` m/s, so every step and every reset changes the image, and episode ``k`` of
env 0 can be replayed on a second scene (:func:`reference_episode`) to get its frames
independently. Actions are ignored (the box flies ballistically); ``act()`` gives a dummy batch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from rlrec.envs.genesis import init_genesis

SIZE = 64
DT = 0.05


def _length_reached(env) -> torch.Tensor:
    return env.episode_length >= env.lengths


def make_box_class():
    """The env class (built lazily: genesis_forge imports genesis, which needs gs.init first)."""
    gs = init_genesis("cpu")
    from genesis_forge import ManagedEnvironment
    from genesis_forge.managers import TerminationManager

    class ThrownBox(ManagedEnvironment):
        def __init__(self, lengths: Sequence[int] = (5, 3), dt: float = DT):
            # the longest episode (what a recorder may take as the horizon); the termination
            # manager ends each env's episodes
            super().__init__(num_envs=len(lengths), dt=dt, max_episode_length_sec=max(lengths) * dt)
            self.scene = gs.Scene(
                sim_options=gs.options.SimOptions(dt=dt, substeps=2),
                vis_options=gs.options.VisOptions(shadow=False, rendered_envs_idx=[0]),
                show_viewer=False,
            )
            self.scene.add_entity(gs.morphs.Plane())
            self.box = self.scene.add_entity(
                gs.morphs.Box(size=(0.3, 0.3, 0.3), pos=(0.0, 0.0, 0.3)),
                surface=gs.surfaces.Default(color=(0.9, 0.2, 0.1)),
            )
            self.camera = self.scene.add_camera(
                res=(SIZE, SIZE), pos=(0.0, -1.8, 0.6), lookat=(0.0, 0.0, 0.55), fov=60, GUI=False
            )
            self.lengths = torch.tensor(list(lengths), dtype=torch.int32)
            self.episodes = torch.zeros(self.num_envs, dtype=torch.long)  # per env, next episode
            self._built = False

        def config(self):
            TerminationManager(self, term_cfg={"length": {"fn": _length_reached, "time_out": True}})

        def build(self):
            # idempotent, so that one scene serves every test (each wrapper's build() builds it)
            if not self._built:
                super().build()
                self._built = True

        def reset(self, env_ids=None):
            out = super().reset(env_ids)
            if env_ids is None:
                idx = torch.arange(self.num_envs)
            else:
                idx = torch.as_tensor(env_ids, dtype=torch.long).reshape(-1).cpu()
            n = idx.numel()
            if n:
                pos = torch.zeros(n, 3)
                pos[:, 0] = -0.8 + 0.25 * (self.episodes[idx] % 5).float()
                pos[:, 2] = 0.3
                self.box.set_pos(pos, envs_idx=idx)
                self.box.set_quat(torch.tensor([[1.0, 0.0, 0.0, 0.0]]).repeat(n, 1), envs_idx=idx)
                vel = torch.zeros(n, 6)
                vel[:, 0], vel[:, 2] = 3.0, 5.0
                self.box.set_dofs_velocity(vel, envs_idx=idx)
                self.episodes[idx] += 1
            return out

        def act(self) -> torch.Tensor:
            return torch.zeros(self.num_envs, 1)

        def restart(self) -> None:
            """Back to a fresh env (episode counters at 0); the next reset starts episode 0."""
            self.episodes.zero_()

    return ThrownBox


def render(camera, force: bool = True) -> np.ndarray:
    """The camera's image now, uint8 [H, W, 3] (an owned copy)."""
    rgb = camera.render(rgb=True, force_render=force)[0]
    rgb = rgb.cpu().numpy() if isinstance(rgb, torch.Tensor) else rgb
    return np.ascontiguousarray(rgb[..., :3], dtype=np.uint8)


def reference_episode(ref, k: int, steps: int) -> np.ndarray:
    """Env 0's episode ``k`` replayed on the reference scene ``ref`` (a ThrownBox whose episodes
    outlast ``steps``): its reset frame and the frame after each of ``steps`` steps,
    ``[steps + 1, H, W, 3]``."""
    ref.episodes[:] = k
    ref.reset()
    frames = [render(ref.camera)]
    for _ in range(steps):
        ref.step(ref.act())
        frames.append(render(ref.camera))
    return np.stack(frames)


def box_xy(frame: np.ndarray) -> np.ndarray:
    """The centroid (x, y) in pixels of the red box in a frame: a position that lossy encoding
    (Genesis's own recorder) barely moves, to match frames of a lossy clip with reference frames."""
    f = frame.astype(np.int16)
    mask = (f[..., 0] > f[..., 1] + 30) & (f[..., 0] > f[..., 2] + 30)
    ys, xs = np.nonzero(mask)
    if xs.size == 0:
        return np.array([np.nan, np.nan])
    return np.array([xs.mean(), ys.mean()])
