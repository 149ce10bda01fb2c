import torch

from rlrec.envs.builtin import PointReach
from rlrec.testing import EnvContract, sample_actions


class TestBuiltinContract(EnvContract):
    num_envs = 4

    def make_env(self, num_envs, seed=None):
        return PointReach(
            num_envs, render_width=48, render_height=32, max_episode_steps=40, seed=seed
        )


def test_frame_is_pure_function_of_state():
    env = PointReach(5, render_width=40, render_height=30)
    env.reset(seed=3)
    for i in range(4):
        env.step(sample_actions(env, seed=i))
    frames = env.render(range(5))
    again = env.draw(env.pos.clone(), env.goal.clone(), env.t.clone())
    assert torch.equal(frames, again)
    assert frames.shape == (5, 30, 40, 3)


def test_reset_frame_has_empty_progress_bar_and_success_terminates():
    env = PointReach(2, render_width=50, render_height=50, goal_radius=0.1)
    env.reset(seed=0)
    bar = env.render([0, 1])[:, -2:]
    assert (bar == torch.tensor([24, 26, 34], dtype=torch.uint8)).all()
    # drive env 0 straight at the goal: it must terminate with success, env 1 must not
    for _ in range(200):
        direction = env.goal - env.pos
        act = direction / direction.norm(dim=1, keepdim=True).clamp(min=1e-6)
        act = act - env.vel * 0.5
        act[1] = 0
        _, _, term, trunc, info = env.step(act)
        if term[0]:
            break
    assert bool(term[0]) and bool(info["success"][0]) and not bool(term[1])
