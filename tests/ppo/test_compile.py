"""``algo.compile``: the compiled PPO against the eager one, on the real inductor backend (the C++
compiler is gcc), and the rollout's policy step as one graph."""

import gymnasium as gym
import pytest
import torch
from torch._dynamo.utils import counters

from rlrec.config import PPOConfig
from rlrec.envs.autoreset import AutoReset
from rlrec.envs.builtin import PointReach
from rlrec.ppo.agent import ActorCritic
from rlrec.ppo.ppo import PPO
from tests.helpers import make_config

CPU = torch.device("cpu")
# small: the compile of three graphs is the cost of this module (seconds once inductor's cache
# holds them); episodes of 5 steps end inside the 8-step rollout, so time-outs are bootstrapped
SMALL = dict(
    num_steps=8,
    num_minibatches=2,
    update_epochs=2,
    target_kl=None,
    hidden_sizes=[16, 16],
    learning_rate=1e-2,  # large enough for the clip range to bite in the second minibatch
    norm_obs=True,
    anneal_lr=True,
    anneal_clip=True,
)
ROLLOUT = ("obs", "actions", "logprobs", "values", "rewards", "advantages", "returns")


def _two_iterations(compile: bool):
    """Two iterations (rollout + update) from the same seed, each with another learning rate and
    clip range; what each produced, and the number of graphs compiled after each."""
    torch.manual_seed(0)
    env = AutoReset(PointReach(8, max_episode_steps=5))
    ppo = PPO(
        PPOConfig(compile=compile, **SMALL),
        env.single_observation_space,
        env.single_action_space,
        CPU,
    )
    storage = ppo.init_storage(env.num_envs)
    with torch.inference_mode():
        obs, _ = env.reset(seed=0)
    out = []
    for frac in (0.5, 0.25):
        ppo.set_schedule(frac)
        with torch.inference_mode():
            for _ in range(SMALL["num_steps"]):
                action = ppo.act(obs)
                obs, reward, term, trunc, info = env.step(action)
                ppo.process_env_step(reward, term, trunc, info)
            ppo.compute_returns(obs)
        rollout = {k: getattr(storage, k).clone() for k in ROLLOUT}
        losses = ppo.update()
        params = {n: p.detach().clone() for n, p in ppo.agent.named_parameters()}
        out.append((rollout, losses, params, counters["stats"]["unique_graphs"]))
    return ppo, out


@pytest.fixture(scope="module")
def eager_and_compiled():
    torch._dynamo.reset()
    graphs_before = counters["stats"]["unique_graphs"]
    eager = _two_iterations(False)
    assert counters["stats"]["unique_graphs"] == graphs_before, "the eager run compiled something"
    return eager, _two_iterations(True), graphs_before


def test_compile_is_off_by_default_and_set_by_algo_compile():
    assert PPOConfig().compile is False
    assert make_config([]).algo.compile is False
    assert make_config(["algo.compile=true"]).algo.compile is True
    space = gym.spaces.Box(-1, 1, (3,))
    eager = PPO(PPOConfig(), space, space, CPU)
    assert eager._policy_step == eager._policy_step_eager and not eager.compiled
    compiled = PPO(PPOConfig(compile=True), space, space, CPU)
    assert compiled.compiled and compiled._policy_step != compiled._policy_step_eager


def test_compiled_rollouts_and_updates_match_eager_within_1e5(eager_and_compiled):
    (_, eager), (ppo, compiled), graphs_before = eager_and_compiled
    for it, ((r_e, l_e, p_e, _), (r_c, l_c, p_c, _)) in enumerate(zip(eager, compiled)):
        for k in ROLLOUT:  # the same actions: the noise is Normal.sample's draw
            torch.testing.assert_close(r_c[k], r_e[k], atol=1e-5, rtol=0, msg=f"{k}, it {it}")
        assert l_c.keys() == l_e.keys()
        for k in l_e:
            assert l_c[k] == pytest.approx(l_e[k], abs=1e-5), f"{k}, iteration {it}"
        assert l_c["loss/updates"] == 4 and l_c["loss/clipfrac"] > 0  # the clip range bites
        for name in p_e:
            torch.testing.assert_close(p_c[name], p_e[name], atol=1e-5, rtol=0, msg=name)
    # the graphs really were compiled (policy step, loss, optimizer step), once: the second
    # iteration's learning rate and clip range changed the tensors they read, not the graphs
    first, second = compiled[0][3], compiled[1][3]
    assert first - graphs_before >= 3
    assert second == first, "a changed learning rate or clip range recompiled"
    assert isinstance(ppo.optimizer.param_groups[0]["lr"], torch.Tensor)
    assert float(ppo.optimizer.param_groups[0]["lr"]) == pytest.approx(1e-2 * 0.25)


@pytest.mark.parametrize("action_space", [gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3)])
def test_the_rollout_policy_step_is_one_graph_without_breaks(action_space):
    ppo = PPO(
        PPOConfig(compile=True, hidden_sizes=[8]),
        gym.spaces.Box(-1, 1, (5,)),
        action_space,
        CPU,
    )
    obs = torch.randn(4, 5)
    noise = torch.rand(ppo.agent.noise_shape(4))
    explain = torch._dynamo.explain(ppo._policy_step_eager)(obs, noise)
    assert explain.graph_break_count == 0 and explain.graph_count == 1, explain.break_reasons
    with torch.no_grad():
        nobs = ppo.obs_norm(obs)
        mb = (nobs, *ppo.agent.act_with_noise(nobs, noise)[:1], torch.zeros(4), torch.zeros(4))
        explain = torch._dynamo.explain(ppo._loss_eager)(*mb, torch.ones(4), torch.ones(4), 0.2)
    assert explain.graph_break_count == 0 and explain.graph_count == 1, explain.break_reasons


def test_noise_driven_samples_follow_the_policy_distribution():
    """``act_with_noise`` (the compiled path's sampler) draws from the same distributions as
    ``act``: the Gaussian head the very numbers of ``Normal.sample`` for the same draw, the
    categorical head (Gumbel-max) the softmax probabilities, with consistent log-probabilities."""
    gauss = ActorCritic(
        gym.spaces.Box(-1, 1, (6,)), gym.spaces.Box(-1, 1, (2,)), [16], "tanh", -0.5
    )
    obs = torch.randn(5, 6)
    torch.manual_seed(3)
    a_ref, lp_ref, v_ref = gauss.act(obs)
    torch.manual_seed(3)
    a, lp, v = gauss.act_with_noise(obs, torch.randn(gauss.noise_shape(5)))
    torch.testing.assert_close(a, a_ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(lp, lp_ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(v, v_ref)

    cat = ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3), [16])
    with torch.no_grad():
        cat.actor[-1].bias.copy_(torch.tensor([1.0, 0.0, -1.0]))  # unequal probabilities
    one = torch.randn(1, 4).expand(20000, 4)
    g = torch.Generator().manual_seed(0)
    action, logp, _ = cat.act_with_noise(one, torch.rand(cat.noise_shape(20000), generator=g))
    probs = cat.distribution(one[:1]).probs[0]
    freq = torch.bincount(action, minlength=3).float() / 20000
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)
    torch.testing.assert_close(logp, probs.log()[action])
    # the extremes of the uniform draw give finite Gumbel noise
    edges = torch.tensor([[0.0, 1.0, 0.5]])
    assert torch.isfinite(cat.act_with_noise(one[:1], edges)[1]).all()


def test_checkpoints_load_across_modes():
    """A compiled run resumes an eager run's checkpoint and the other way round: the saved learning
    rate is a float in both, and each keeps its own Adam implementation and lr type."""
    space = gym.spaces.Box(-1, 1, (3,))
    eager = PPO(PPOConfig(learning_rate=1e-3), space, space, CPU)
    compiled = PPO(PPOConfig(learning_rate=5e-4, compile=True), space, space, CPU)
    eager.set_schedule(0.5)
    state = eager.state_dict()
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(5e-4)
    compiled.load_state_dict(state)
    group = compiled.optimizer.param_groups[0]
    assert isinstance(group["lr"], torch.Tensor) and float(group["lr"]) == pytest.approx(5e-4)
    assert group["fused"] is None and group["foreach"] is False
    compiled.set_schedule(0.2)
    saved = compiled.state_dict()["optimizer"]["param_groups"][0]
    assert isinstance(saved["lr"], float) and saved["lr"] == pytest.approx(1e-4)
    assert isinstance(compiled.optimizer.param_groups[0]["lr"], torch.Tensor)  # untouched
    eager.load_state_dict(compiled.state_dict())
    group = eager.optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(1e-4) and group["fused"] is True
    for a, b in zip(eager.agent.parameters(), compiled.agent.parameters()):
        assert torch.equal(a, b)
