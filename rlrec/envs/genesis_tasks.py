"""Genesis tasks shipped with rlrec, written against the
task protocol of :mod:`rlrec.envs.genesis`.

``FrankaReach``: the Franka Panda that ships with genesis-world moves its hand to a goal point.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

# joint-space home pose of the 7 arm joints (hand in front of the base, above the table) and
# open fingers
_HOME = (0.0, -0.3, 0.0, -2.2, 0.0, 2.0, 0.79, 0.04, 0.04)
_KP = (4500.0, 4500.0, 3500.0, 3500.0, 2000.0, 2000.0, 2000.0, 100.0, 100.0)
_KV = (450.0, 450.0, 350.0, 350.0, 200.0, 200.0, 200.0, 10.0, 10.0)


class FrankaReach:
    """Batched Franka reach: bring the hand within ``goal_radius`` of a random goal (red sphere).

    Action (7, in [-1, 1]): joint position deltas of the arm, ``action_scale`` radians per step,
    tracked by Genesis's PD controller; the gripper stays open.
    Observation (23): arm joint positions (7), joint velocities x0.1 (7), hand position (3),
    goal (3), goal minus hand (3), in the env's local frame.
    Reward: ``10 * (previous distance - distance)`` (progress), ``+10`` on success, ``-0.05`` per
    step.
    The episode terminates with ``info["success"]`` when the hand is within ``goal_radius``;
    ``info["distance"]`` is the hand-goal distance (a tracking metric for eval).

    ``vis_mode="collision"`` draws the convex collision hulls of the arm: about 20x cheaper to
    rasterize on CPU than the detailed visual meshes (``vis_mode="visual"``).
    ``rendered_envs_idx`` limits the envs the camera draws (all by default): each drawn env costs
    one render per frame.
    """

    num_actions = 7
    num_observations = 23

    def __init__(
        self,
        num_envs: int,
        render_width: int = 128,
        render_height: int = 128,
        dt: float = 0.02,
        substeps: int = 2,
        max_episode_steps: int = 100,
        goal_radius: float = 0.05,
        action_scale: float = 0.08,
        goal_low: Sequence[float] = (0.3, -0.35, 0.15),
        goal_high: Sequence[float] = (0.65, 0.35, 0.6),
        init_noise: float = 0.1,
        vis_mode: str = "collision",
        rendered_envs_idx: Optional[Sequence[int]] = None,
        env_spacing: float = 2.0,
    ):
        import genesis as gs

        self.num_envs, self.dt, self.max_episode_steps = num_envs, dt, max_episode_steps
        self.goal_radius, self.action_scale, self._init_noise = (
            goal_radius,
            action_scale,
            init_noise,
        )
        self._spacing = (env_spacing, env_spacing)
        self._goal_range = torch.tensor([goal_low, goal_high], dtype=torch.float32)
        drawn = None if rendered_envs_idx is None else list(rendered_envs_idx)
        self.scene = gs.Scene(
            sim_options=gs.options.SimOptions(dt=dt, substeps=substeps),
            vis_options=gs.options.VisOptions(  # one image per env
                split_envs=True, rendered_envs_idx=drawn, shadow=False, ambient_light=(0.25,) * 3
            ),
            show_viewer=False,
        )
        self.scene.add_entity(gs.morphs.Plane())
        # Genesis paints collision hulls with colours from numpy's global RNG: fix them, so every
        # scene looks the same (frames comparable across scenes), and leave the caller's RNG as it
        # was
        rng_state = np.random.get_state()
        np.random.seed(7)
        try:
            panda = gs.morphs.MJCF(file="xml/franka_emika_panda/panda.xml")
            self.robot = self.scene.add_entity(panda, vis_mode=vis_mode)
        finally:
            np.random.set_state(rng_state)
        self.goal_marker = self.scene.add_entity(
            gs.morphs.Sphere(radius=goal_radius, fixed=True, collision=False),
            surface=gs.surfaces.Default(color=(0.9, 0.15, 0.1)),
        )
        self.camera = self.scene.add_camera(
            res=(render_width, render_height),
            pos=(1.25, -1.05, 0.95),
            lookat=(0.3, 0.0, 0.3),
            fov=45,
            GUI=False,
        )

    def build(self) -> None:
        import genesis as gs

        self.scene.build(n_envs=self.num_envs, env_spacing=self._spacing)
        self.device = dev = torch.device(gs.device)
        self.hand = self.robot.get_link("hand")
        self.robot.set_dofs_kp(torch.tensor(_KP))
        self.robot.set_dofs_kv(torch.tensor(_KV))
        lower, upper = self.robot.get_dofs_limit()
        self._q_low, self._q_high = lower[:7].to(dev), upper[:7].to(dev)
        self._home = torch.tensor(_HOME, dtype=torch.float32, device=dev)
        self._goal_range = self._goal_range.to(dev)
        self.goal = torch.zeros(self.num_envs, 3, device=dev)
        self.target = self._home.repeat(self.num_envs, 1)  # PD targets of all 9 dofs
        self._dist = torch.zeros(self.num_envs, device=dev)

    # ------------------------------------------------------------------ protocol
    def reset_idx(self, env_idx: torch.Tensor, generator: torch.Generator) -> None:
        k, dev = env_idx.numel(), self.device
        noise = (torch.rand(k, 7, generator=generator, device=dev) * 2 - 1) * self._init_noise
        q = self._home.repeat(k, 1)
        q[:, :7] = torch.clamp(q[:, :7] + noise, self._q_low, self._q_high)
        low, high = self._goal_range
        goal = low + (high - low) * torch.rand(k, 3, generator=generator, device=dev)
        self.robot.set_dofs_position(q, envs_idx=env_idx, zero_velocity=True)
        self.robot.control_dofs_position(q, envs_idx=env_idx)
        self.target[env_idx] = q
        self.goal_marker.set_pos(goal, envs_idx=env_idx)
        self.goal[env_idx] = goal
        self._dist[env_idx] = (goal - self.hand.get_pos()[env_idx]).norm(dim=1)

    def get_observations(self) -> torch.Tensor:
        q = self.robot.get_dofs_position()[:, :7]
        dq = self.robot.get_dofs_velocity()[:, :7]
        hand = self.hand.get_pos()
        return torch.cat([q, 0.1 * dq, hand, self.goal, self.goal - hand], dim=1)

    def step(self, actions: torch.Tensor):
        q = self.robot.get_dofs_position()[:, :7]
        self.target[:, :7] = torch.clamp(q + self.action_scale * actions, self._q_low, self._q_high)
        self.robot.control_dofs_position(self.target)
        self.scene.step()
        obs = self.get_observations()
        dist = (self.goal - obs[:, 14:17]).norm(dim=1)
        success = dist < self.goal_radius
        reward = 10.0 * (self._dist - dist) + 10.0 * success.float() - 0.05
        self._dist = dist
        return obs, reward, success.clone(), {"success": success, "distance": dist}
