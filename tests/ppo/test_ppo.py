"""PPO pieces against straightforward reference implementations."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrec.envs.autoreset import AutoReset
from rlrec.envs.builtin import PointReach
from rlrec.ppo.agent import ActorCritic, ObsNormalizer
from rlrec.ppo.config import PPOConfig
from rlrec.ppo.ppo import PPO, action_dtype
from rlrec.ppo.storage import RolloutStorage
from tests.ppo import stored_reward

CPU = torch.device("cpu")


def _reference_gae(rewards, values, dones, next_value, gamma, lam):
    T, N = rewards.shape
    adv = np.zeros((T, N))
    last = np.zeros(N)
    for t in reversed(range(T)):
        nxt = next_value if t == T - 1 else values[t + 1]
        nonterminal = 1.0 - dones[t]
        delta = rewards[t] + gamma * nxt * nonterminal - values[t]
        last = delta + gamma * lam * nonterminal * last
        adv[t] = last
    return adv


def test_gae_matches_reference():
    g = torch.Generator().manual_seed(0)
    T, N = 7, 3
    s = RolloutStorage(T, N, (2,), (1,), torch.float32, torch.device("cpu"))
    s.rewards.copy_(torch.randn(T, N, generator=g))
    s.values.copy_(torch.randn(T, N, generator=g))
    s.dones.copy_((torch.rand(T, N, generator=g) < 0.3).float())
    nv = torch.randn(N, generator=g)
    s.compute_gae(nv, 0.97, 0.9)
    ref = _reference_gae(
        s.rewards.numpy(), s.values.numpy(), s.dones.numpy(), nv.numpy(), 0.97, 0.9
    )
    np.testing.assert_allclose(s.advantages.numpy(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s.returns, s.advantages + s.values)


def test_minibatches_cover_the_batch_once():
    s = RolloutStorage(4, 6, (1,), (), torch.long, torch.device("cpu"))
    s.obs.copy_(torch.arange(24, dtype=torch.float32).reshape(4, 6, 1))
    seen = torch.cat([mb["obs"].flatten() for mb in s.minibatches(3)])
    assert sorted(seen.tolist()) == list(range(24))


def test_obs_normalizer_matches_running_statistics():
    norm = ObsNormalizer((3,))
    data = [
        torch.randn(50, 3) * torch.tensor([1.0, 5.0, 0.1]) + torch.tensor([2.0, -1.0, 0.0])
        for _ in range(4)
    ]
    for x in data:
        norm.update(x)
    allx = torch.cat(data)
    torch.testing.assert_close(norm.mean, allx.mean(0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(norm.var, allx.var(0, unbiased=False), rtol=1e-3, atol=1e-4)
    z = norm(allx)
    torch.testing.assert_close(z.mean(0), torch.zeros(3), atol=1e-3, rtol=0)


def _normaliser_tensors(norm: ObsNormalizer) -> dict:
    """Every tensor the normaliser holds: its buffers and tensor attributes (or tuples of them)."""
    out = dict(norm.named_buffers())
    for name, value in vars(norm).items():
        values = value if isinstance(value, tuple) else (value,)
        for i, v in enumerate(values):
            if isinstance(v, torch.Tensor):
                out[f"{name}[{i}]"] = v
    return out


def test_obs_normalizer_moves_every_tensor_with_to_and_checkpoints_only_its_statistics():
    """Several ranks (``pending=True``): ``.to(device)`` takes the pending moments and the merge's
    starting statistics along (``meta`` stands for the CUDA device), and a checkpoint holds the
    statistics alone, so older checkpoints load and newer ones load into a single rank."""
    norm = ObsNormalizer((3,), pending=True).to("meta")
    tensors = _normaliser_tensors(norm)
    assert len(tensors) >= 4  # mean, var, count and the pending moments at least
    assert {k: t.device.type for k, t in tensors.items()} == {k: "meta" for k in tensors}
    assert set(ObsNormalizer((3,), pending=True).state_dict()) == {"mean", "var", "count"}
    old = ObsNormalizer((3,)).state_dict()  # a one-rank checkpoint's statistics
    old["mean"].fill_(2.0)
    old["count"].fill_(5.0)
    several = ObsNormalizer((3,), pending=True)
    several.load_state_dict(old)  # strict
    assert float(several.mean[0]) == 2.0
    ObsNormalizer((3,)).load_state_dict(several.state_dict())


def test_obs_normalizer_merges_outside_inference_mode_after_updates_inside_it():
    """The update of a run of several ranks: moments gathered during the rollout (inside
    ``torch.inference_mode()``), merged by the update (outside it). The normaliser is materialised
    on this device after being built elsewhere (``to_empty``: the CPU's stand-in for ``.to(cuda)``,
    which needs two devices with data) and first touched inside inference mode. Nothing it holds
    may be rebuilt there: an inference tensor cannot be updated in place by the merge ("Inplace
    update to inference tensor outside InferenceMode")."""
    with torch.device("meta"):
        norm = ObsNormalizer((3,), pending=True)
    norm.to_empty(device="cpu")
    one = ObsNormalizer((3,))
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(16, 3, generator=g) * 2 + 1 for _ in range(3)]
    with torch.inference_mode():
        norm.load_state_dict(one.state_dict())
        for x in batches:
            norm.update(x)
    for x in batches:
        one.update(x)
    norm.merge_pending(lambda t: t)  # one rank: the all-reduce is the identity
    inference = [k for k, t in _normaliser_tensors(norm).items() if t.is_inference()]
    assert not inference, f"inference tensors: {inference}"
    torch.testing.assert_close(norm.mean, one.mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm.var, one.var, rtol=1e-5, atol=1e-6)
    assert float(norm._pending.abs().sum()) == 0.0
    with torch.inference_mode():  # the next rollout, and its merge
        norm.update(batches[0])
    one.update(batches[0])
    norm.merge_pending(lambda t: t)
    torch.testing.assert_close(norm.mean, one.mean, rtol=1e-5, atol=1e-6)


def test_categorical_head_for_discrete_actions():
    agent = ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3), [16])
    obs = torch.randn(5, 4)
    a = agent.action(obs)
    lp, ent, v = agent.evaluate(obs, a)
    assert a.dtype == torch.long and a.shape == (5,) and lp.shape == (5,) and v.shape == (5,)
    det = agent.action(obs, deterministic=True)  # the eval path's mode
    assert torch.equal(det, agent.distribution(obs).probs.argmax(-1))
    torch.testing.assert_close(lp, agent.distribution(obs).log_prob(a))
    torch.testing.assert_close(ent, agent.distribution(obs).entropy())
    assert (ent > 0).all()
    # sampled actions follow the categorical distribution of the logits
    torch.manual_seed(0)
    one = obs[:1].expand(20000, 4)
    freq = torch.bincount(agent.action(one), minlength=3).float() / 20000
    torch.testing.assert_close(freq, agent.distribution(obs[:1]).probs[0], atol=0.015, rtol=0)


def test_gaussian_deterministic_action_is_the_mean():
    agent = ActorCritic(gym.spaces.Box(-1, 1, (6,)), gym.spaces.Box(-1, 1, (2,)), [16])
    obs = torch.randn(4, 6)
    torch.testing.assert_close(agent.action(obs, deterministic=True), agent.actor(obs))


def test_update_improves_the_clipped_objective_and_anneals():
    torch.manual_seed(0)
    env = AutoReset(PointReach(16))
    cfg = PPOConfig(
        num_steps=8,
        num_minibatches=2,
        update_epochs=4,
        target_kl=None,
        anneal_lr=True,
        anneal_clip=True,
    )
    ppo = PPO(cfg, env.single_observation_space, env.single_action_space, torch.device("cpu"))
    s = RolloutStorage(
        8, 16, (6,), (2,), action_dtype(env.single_action_space), torch.device("cpu")
    )
    obs, _ = env.reset(seed=0)
    with torch.inference_mode():
        for t in range(8):
            ppo.obs_norm.update(obs)
            nobs = ppo.normalize(obs)
            a = ppo.agent.action(nobs)
            lp, _, v = ppo.agent.evaluate(nobs, a)
            obs, r, term, trunc, _ = env.step(a)
            s.obs[t], s.actions[t], s.logprobs[t], s.values[t], s.rewards[t] = nobs, a, lp, v, r
            s.dones[t] = (term | trunc).float()
        s.compute_gae(ppo.agent.value(ppo.normalize(obs)), 0.99, 0.95)
    before = [p.clone() for p in ppo.agent.parameters()]
    assert ppo.set_schedule(0.5) == pytest.approx(cfg.learning_rate * 0.5)
    assert float(ppo.clip_coef) == pytest.approx(0.1)  # a tensor, read by the loss
    stats = ppo.update(s)
    assert stats["loss/updates"] == 8
    assert any(not torch.equal(b, p) for b, p in zip(before, ppo.agent.parameters()))
    # the value function fits its targets better after the update
    with torch.no_grad():
        err_after = ((ppo.agent.value(s.obs.reshape(-1, 6)) - s.returns.flatten()) ** 2).mean()
        err_before = ((s.values.flatten() - s.returns.flatten()) ** 2).mean()
    assert err_after < err_before


def test_target_kl_stops_early():
    torch.manual_seed(0)
    env = AutoReset(PointReach(8))
    cfg = PPOConfig(
        num_steps=4, num_minibatches=1, update_epochs=50, target_kl=1e-6, learning_rate=1e-2
    )
    ppo = PPO(cfg, env.single_observation_space, env.single_action_space, torch.device("cpu"))
    s = RolloutStorage(4, 8, (6,), (2,), torch.float32, torch.device("cpu"))
    obs, _ = env.reset(seed=0)
    with torch.inference_mode():
        for t in range(4):
            a = ppo.agent.action(obs)
            lp, _, v = ppo.agent.evaluate(obs, a)
            s.obs[t], s.actions[t], s.logprobs[t], s.values[t] = obs, a, lp, v
            obs, r, *_ = env.step(a)
            s.rewards[t] = r
        s.compute_gae(ppo.agent.value(obs), 0.99, 0.95)
    assert ppo.update(s)["loss/updates"] < 50


def test_truncated_episodes_are_bootstrapped_from_their_final_observation():
    env = AutoReset(PointReach(4, max_episode_steps=1))
    ppo = PPO(
        PPOConfig(gamma=0.9),
        env.single_observation_space,
        env.single_action_space,
        torch.device("cpu"),
    )
    obs, _ = env.reset(seed=0)
    with torch.inference_mode():
        _, reward, term, trunc, info = env.step(torch.zeros(4, 2))
        assert bool(trunc.all()) and not bool(term.any())
        final = info["final_obs"]
        assert not torch.equal(final, env.env.unwrapped._obs()), "final obs is the pre-reset state"
        out = stored_reward(ppo, obs, reward, term, trunc, info)
        torch.testing.assert_close(out, reward + 0.9 * ppo.agent.value(ppo.normalize(final)))
        # terminated episodes are not bootstrapped, even when the time limit hits on the same step
        term2 = torch.tensor([True, False, True, False])
        out2 = stored_reward(ppo, obs, reward, term2, trunc, info)
        torch.testing.assert_close(out2[term2], reward[term2])


def _collect(ppo, env, steps):
    with torch.inference_mode():
        obs, _ = env.reset(seed=0)
        for _ in range(steps):
            action = ppo.act(obs)
            obs, reward, term, trunc, info = env.step(action)
            ppo.process_env_step(reward, term, trunc, info)
        ppo.compute_returns(obs)


def test_ppo_stores_its_own_transitions_and_kl_stops_only_between_epochs():
    """act -> env step -> process_env_step fills PPO's storage row by row; with target_kl the
    epochs stop at an epoch boundary (one device sync per epoch), so the update count is a whole
    number of epochs."""
    torch.manual_seed(0)
    env = AutoReset(PointReach(8, max_episode_steps=3))
    cfg = PPOConfig(
        num_steps=6, num_minibatches=4, update_epochs=20, target_kl=1e-6, learning_rate=1e-2
    )
    ppo = PPO(cfg, env.single_observation_space, env.single_action_space, torch.device("cpu"))
    storage = ppo.init_storage(env.num_envs)
    _collect(ppo, env, 6)
    assert storage.step == 6
    assert bool(storage.dones[2].all()) and not bool(storage.dones[1].any())  # episodes of 3 steps
    assert not torch.equal(storage.advantages, torch.zeros_like(storage.advantages))
    updates = ppo.update()["loss/updates"]
    assert updates < 20 * 4 and updates % 4 == 0
    assert storage.step == 0  # cleared for the next rollout
    _collect(ppo, env, 6)  # refills from row 0
    with pytest.raises(IndexError, match="full"):
        storage.add(*(torch.zeros(8, *s) for s in ((6,), (2,), (), (), (), ())))


@pytest.mark.parametrize("kl_check", ["epoch", "minibatch"])
def test_kl_check_minibatch_stops_before_the_step_that_would_exceed_target_kl(kl_check):
    """``algo.kl_check=minibatch`` (ManiSkill's ppo.py): each minibatch's KL is read before its
    optimizer step, and the first one over ``target_kl`` takes no step and ends the update. The
    first minibatch has KL 0 (the policy has not moved), so exactly one step is taken; with
    ``epoch`` the whole first epoch runs and the KL is read once, after it. The per-minibatch read
    happens only when asked for."""
    torch.manual_seed(0)
    env = AutoReset(PointReach(8, max_episode_steps=3))
    cfg = PPOConfig(
        num_steps=6,
        num_minibatches=4,
        update_epochs=20,
        target_kl=1e-6,
        learning_rate=1e-2,
        kl_check=kl_check,
    )
    ppo = PPO(cfg, env.single_observation_space, env.single_action_space, torch.device("cpu"))
    ppo.init_storage(env.num_envs)
    _collect(ppo, env, 6)
    reads = []
    above = ppo._kl_above
    ppo._kl_above = lambda kl, limit: reads.append(float(kl)) or above(kl, limit)
    before = [p.detach().clone() for p in ppo.agent.parameters()]
    updates = ppo.update()["loss/updates"]
    if kl_check == "minibatch":
        assert updates == 1 and reads[0] == 0.0 and reads[1] > 1e-6 and len(reads) == 2
    else:
        assert updates == 4 and len(reads) == 1 and reads[0] > 1e-6  # after the epoch alone
    assert any(not torch.equal(a, b) for a, b in zip(before, ppo.agent.parameters()))


def test_kl_check_minibatch_decides_on_the_mean_over_ranks(monkeypatch):
    """Several ranks: each minibatch's KL is all-reduced (mean) before the decision, so every
    rank stops at the same minibatch (the gradient all-reduces stay matched)."""
    from rlrec import distributed

    env = PointReach(2)
    ppo = PPO(
        PPOConfig(kl_check="minibatch"),
        env.single_observation_space,
        env.single_action_space,
        torch.device("cpu"),
    )
    calls = []

    def fake_all_reduce_(tensor, op="sum"):
        calls.append(op)
        tensor.fill_(0.5)  # the other rank's KL was 1.0

    monkeypatch.setattr(distributed, "all_reduce_", fake_all_reduce_)
    local = torch.tensor(0.0)
    assert not ppo._kl_above(local, 0.1) and calls == []  # one rank: no collective
    ppo.world = 2
    assert ppo._kl_above(local, 0.1) and calls == ["mean"]
    assert float(local) == 0.0  # the minibatch's own statistics are left as they were


def _filled(ppo: PPO, num_envs: int, seed: int = 0) -> None:
    env = AutoReset(PointReach(num_envs))
    ppo.init_storage(num_envs)
    obs, _ = env.reset(seed=seed)
    with torch.inference_mode():
        for _ in range(ppo.cfg.num_steps):
            action = ppo.act(obs)
            obs, reward, term, trunc, info = env.step(action)
            ppo.process_env_step(reward, term, trunc, info)
        ppo.compute_returns(obs)


@pytest.mark.parametrize("num_minibatches", [2, 8])
def test_update_reads_the_device_the_same_few_times_whatever_its_minibatches(num_minibatches):
    """No host sync per minibatch (the losses, KL, clipped fraction and gradient norm are summed
    on the device; the clip scales on the device): the update reads back once, at its end, with 8
    minibatches an epoch as with 2, and reports the mean gradient norm before the clip."""
    from tests.hostsync import HostReads

    torch.manual_seed(0)
    cfg = PPOConfig(num_steps=8, num_minibatches=num_minibatches, update_epochs=3, target_kl=None)
    space = PointReach(16)
    ppo = PPO(cfg, space.single_observation_space, space.single_action_space, torch.device("cpu"))
    _filled(ppo, 16)
    with HostReads() as reads:
        stats = ppo.update()
    assert stats["loss/updates"] == 3 * num_minibatches
    assert reads.count == 1, reads.where  # every statistic at once, at the end
    assert stats["train/grad_norm"] > 0 and np.isfinite(stats["train/grad_norm"])


def test_update_reports_the_gradient_norm_before_the_clip():
    torch.manual_seed(0)
    cfg = PPOConfig(num_steps=8, num_minibatches=1, update_epochs=1, target_kl=None)
    space = PointReach(16)
    ppo = PPO(cfg, space.single_observation_space, space.single_action_space, torch.device("cpu"))
    _filled(ppo, 16)
    probe = PPO(
        PPOConfig(
            num_steps=8, num_minibatches=1, update_epochs=1, target_kl=None, max_grad_norm=1e-6
        ),
        space.single_observation_space,
        space.single_action_space,
        torch.device("cpu"),
    )
    probe.load_state_dict(ppo.state_dict())
    # the one minibatch's gradient, by hand
    mb = next(ppo.storage.minibatches(1))
    loss, _ = ppo._loss_eager(
        mb["obs"], mb["actions"], mb["logprobs"], mb["values"], mb["advantages"], mb["returns"], 0.2
    )
    grads = torch.autograd.grad(loss, list(ppo.agent.parameters()))
    expected = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
    before = [p.detach().clone() for p in probe.agent.parameters()]
    probe.storage = ppo.storage
    stats = probe.update()
    assert stats["train/grad_norm"] == pytest.approx(expected, rel=1e-5)
    assert expected > 1e-3  # so the clip to 1e-6 bites: Adam's first step is still ~lr per weight
    assert any(not torch.equal(b, p) for b, p in zip(before, probe.agent.parameters()))


def test_grad_clip_per_network_clips_the_actor_and_the_critic_each_on_its_own():
    """``algo.grad_clip=per_network`` (rsl_rl's PPO): each network's gradient is scaled to
    ``max_grad_norm`` by its own norm, so the critic's large gradient leaves the actor's as it is
    when the actor's is under the limit; ``joint`` scales both by the one norm of the two."""
    from rlrec.ppo.config import GradClip

    space = PointReach(4)
    obs_space, act_space = space.single_observation_space, space.single_action_space
    clipped = {}
    for mode in (GradClip.joint, GradClip.per_network):
        torch.manual_seed(0)
        ppo = PPO(PPOConfig(max_grad_norm=1.0, grad_clip=mode), obs_space, act_space, CPU)
        ppo.optimizer.step = lambda: None  # the clipped gradients are what is looked at
        for p in ppo.agent.actor.parameters():
            p.grad = torch.full_like(p, 1e-4)  # a small actor gradient
        ppo.agent.log_std.grad = torch.full_like(ppo.agent.log_std, 1e-4)
        for p in ppo.agent.critic.parameters():
            p.grad = torch.full_like(p, 10.0)  # a large critic gradient
        actor = [p.grad.clone() for p in (*ppo.agent.actor.parameters(), ppo.agent.log_std)]
        total = float(torch.cat([p.grad.flatten() for p in ppo.agent.parameters()]).norm())
        norm = ppo._optimizer_step_eager()
        assert float(norm) == pytest.approx(total, rel=1e-5)  # the whole gradient, before clips
        critic = torch.cat([p.grad.flatten() for p in ppo.agent.critic.parameters()])
        assert float(critic.norm()) == pytest.approx(1.0, rel=1e-4)
        after = [p.grad for p in (*ppo.agent.actor.parameters(), ppo.agent.log_std)]
        clipped[mode] = all(torch.equal(a, b) for a, b in zip(actor, after))
    assert clipped == {GradClip.joint: False, GradClip.per_network: True}


def _linears(net):
    return [m for m in net if isinstance(m, torch.nn.Linear)]


def test_init_torch_default_keeps_nn_linear_init_and_orthogonal_replaces_it():
    """``algo.init=torch_default`` (rsl_rl's MLP): every layer's weights and biases are those
    ``nn.Linear`` draws (the same numbers as plain layers built from the same seed, biases not
    zero); ``orthogonal``: orthogonal weights with gain sqrt(2) in the hidden layers, 0.01 at the
    actor's output and 1 at the critic's, zero biases."""
    from rlrec.ppo.config import Init

    space = PointReach(4)
    obs_space, act_space = space.single_observation_space, space.single_action_space
    nets = {}
    for init in (Init.torch_default, Init.orthogonal):
        torch.manual_seed(0)
        ppo = PPO(PPOConfig(hidden_sizes=[8, 8], init=init), obs_space, act_space, CPU)
        nets[init] = ppo.agent
    torch.manual_seed(0)
    plain = [torch.nn.Linear(i, o) for i, o in [(6, 8), (8, 8), (8, 1), (6, 8), (8, 8), (8, 2)]]
    default = nets[Init.torch_default]
    for layer, ref in zip(_linears(default.critic) + _linears(default.actor), plain):
        assert torch.equal(layer.weight, ref.weight) and torch.equal(layer.bias, ref.bias)
        assert layer.bias.abs().sum() > 0
    ortho = nets[Init.orthogonal]
    for net, out_gain in ((ortho.critic, 1.0), (ortho.actor, 0.01)):
        layers = _linears(net)
        for i, layer in enumerate(layers):
            gain = out_gain if i == len(layers) - 1 else 2**0.5
            w = layer.weight.detach()
            small = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
            eye = torch.eye(small.shape[0])
            assert torch.allclose(small, gain**2 * eye, atol=1e-5 * max(1.0, gain**2)), (i, gain)
            assert not layer.bias.any()


@pytest.mark.parametrize("compile_", [False, True])
def test_adam_eps_reaches_the_optimizer_and_wins_over_a_loaded_state(compile_):
    """``algo.adam_eps`` is the eps of the optimizer's step (fused on the CPU, torch.optim's
    Adam with ``algo.compile``), also after loading a state saved with another eps."""
    space = PointReach(4)
    obs_space, act_space = space.single_observation_space, space.single_action_space
    saved = PPO(PPOConfig(adam_eps=1e-5), obs_space, act_space, CPU).state_dict()
    assert saved["optimizer"]["param_groups"][0]["eps"] == 1e-5
    ppo = PPO(PPOConfig(adam_eps=3e-7, compile=compile_), obs_space, act_space, CPU)
    assert [g["eps"] for g in ppo.optimizer.param_groups] == [3e-7]
    ppo.load_state_dict(saved)
    assert [g["eps"] for g in ppo.optimizer.param_groups] == [3e-7]


def test_adam_eps_changes_the_step():
    """The eps is the one the Adam step divides by: a huge eps (1.0 against gradients of 1e-4)
    makes the first step about lr * 1e-4 instead of about lr."""
    space = PointReach(4)
    obs_space, act_space = space.single_observation_space, space.single_action_space
    moved = {}
    for eps in (1e-8, 1.0):
        ppo = PPO(PPOConfig(adam_eps=eps, learning_rate=1e-2), obs_space, act_space, CPU)
        before = ppo.agent.log_std.detach().clone()
        ppo.agent.log_std.grad = torch.full_like(before, 1e-4)
        ppo.optimizer.step()
        moved[eps] = float((ppo.agent.log_std.detach() - before).abs().max())
    assert moved[1e-8] == pytest.approx(1e-2, rel=1e-3)
    assert moved[1.0] == pytest.approx(1e-6, rel=1e-2)


@pytest.mark.parametrize("mode", ["joint", "per_network"])
def test_the_gradient_clip_equals_torchs_clip_grad_norm_bit_for_bit(mode):
    """The optimizer step's clip is ``nn.utils.clip_grad_norm_(set, max_grad_norm, foreach=True)``
    on each set of ``algo.grad_clip`` (written out without its per-call grouping): the same
    clipped gradients and the same norms, exactly, whether the norm is over the limit or not."""
    from rlrec.ppo.config import GradClip

    space = PointReach(4)
    obs_space, act_space = space.single_observation_space, space.single_action_space
    for scale in (1e-4, 1.0, 50.0):  # under, near and over max_grad_norm
        torch.manual_seed(0)
        ppo = PPO(PPOConfig(max_grad_norm=0.5, grad_clip=GradClip(mode)), obs_space, act_space, CPU)
        ppo.optimizer.step = lambda: None
        for p in ppo.agent.parameters():
            p.grad = torch.randn_like(p) * scale
        expected = [[p.grad.clone() for p in params] for params in ppo._clip_sets]
        # clip_grad_norm_ on parameters holding the same gradients
        params = [[torch.nn.Parameter(torch.zeros_like(g)) for g in grads] for grads in expected]
        for ps, grads in zip(params, expected):
            for p, g in zip(ps, grads):
                p.grad = g.clone()
        norms = [torch.nn.utils.clip_grad_norm_(ps, 0.5, foreach=True) for ps in params]
        total = ppo._optimizer_step_eager()
        for ps, own in zip(params, ppo._clip_sets):
            for p, q in zip(ps, own):
                assert torch.equal(p.grad, q.grad)
        whole = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))
        assert torch.equal(total, whole)
