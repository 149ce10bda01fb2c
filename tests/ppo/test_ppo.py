"""PPO pieces against straightforward reference implementations."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlrec import distributed
from rlrec.envs.autoreset import AutoReset
from rlrec.envs.builtin import PointReach
from rlrec.ppo.agent import ActorCritic, ObsNormalizer
from rlrec.ppo.config import GradClip, Init
from rlrec.ppo.storage import RolloutStorage
from tests.hostsync import HostReads
from tests.ppo import make_ppo, rollout


def test_gae_matches_reference():
    g = torch.Generator().manual_seed(0)
    T, N, gamma, lam = 7, 3, 0.97, 0.9
    s = RolloutStorage(T, N, (2,), (1,), torch.float32, torch.device("cpu"))
    s.rewards.copy_(torch.randn(T, N, generator=g))
    s.values.copy_(torch.randn(T, N, generator=g))
    s.dones.copy_((torch.rand(T, N, generator=g) < 0.3).float())
    next_value = torch.randn(N, generator=g)
    s.compute_gae(next_value, gamma, lam)
    rewards, values, dones = s.rewards.numpy(), s.values.numpy(), s.dones.numpy()
    ref, last = np.zeros((T, N)), np.zeros(N)
    for t in reversed(range(T)):
        nxt = next_value.numpy() if t == T - 1 else values[t + 1]
        delta = rewards[t] + gamma * nxt * (1 - dones[t]) - values[t]
        ref[t] = last = delta + gamma * lam * (1 - dones[t]) * last
    np.testing.assert_allclose(s.advantages.numpy(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s.returns, s.advantages + s.values)


def test_minibatches_cover_the_batch_once():
    s = RolloutStorage(4, 6, (1,), (), torch.long, torch.device("cpu"))
    s.obs.copy_(torch.arange(24, dtype=torch.float32).reshape(4, 6, 1))
    seen = torch.cat([mb["obs"].flatten() for mb in s.minibatches(3)])
    assert sorted(seen.tolist()) == list(range(24))


def test_obs_normalizer_matches_running_statistics():
    norm = ObsNormalizer((3,))
    scale, shift = torch.tensor([1.0, 5.0, 0.1]), torch.tensor([2.0, -1.0, 0.0])
    data = [torch.randn(50, 3) * scale + shift for _ in range(4)]
    for x in data:
        norm.update(x)
    allx = torch.cat(data)
    torch.testing.assert_close(norm.mean, allx.mean(0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(norm.var, allx.var(0, unbiased=False), rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(norm(allx).mean(0), torch.zeros(3), atol=1e-3, rtol=0)


def _normaliser_tensors(norm: ObsNormalizer) -> dict:
    """Every tensor the normaliser holds: its buffers and tensor attributes."""
    tensors = {k: v for k, v in vars(norm).items() if isinstance(v, torch.Tensor)}
    return {**dict(norm.named_buffers()), **tensors}


def test_obs_normalizer_moves_every_tensor_with_to_and_checkpoints_only_its_statistics():
    """Several ranks (``pending=True``): ``.to(device)`` takes the pending moments and the merge's
    starting statistics along (``meta`` stands for the CUDA device), and a checkpoint holds the
    statistics alone, so older checkpoints load and newer ones load into a single rank."""
    tensors = _normaliser_tensors(ObsNormalizer((3,), pending=True).to("meta"))
    assert len(tensors) >= 4  # mean, var, count and the pending moments at least
    assert {k: t.device.type for k, t in tensors.items()} == {k: "meta" for k in tensors}
    assert set(ObsNormalizer((3,), pending=True).state_dict()) == {"mean", "var", "count"}
    old = ObsNormalizer((3,)).state_dict()  # a one-rank checkpoint's statistics
    old["mean"].fill_(2.0)
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
    one, g = ObsNormalizer((3,)), torch.Generator().manual_seed(0)
    with torch.inference_mode():
        norm.load_state_dict(one.state_dict())
    for n in (3, 1):  # two rollouts, each merged by its update
        batches = [torch.randn(16, 3, generator=g) * 2 + 1 for _ in range(n)]
        with torch.inference_mode():
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


def test_the_heads_modes_log_probs_and_samples():
    """Categorical: the mode, log-probabilities and entropies of its distribution; its samples,
    of ``action`` (evaluation) and of ``act_with_noise`` (collection, a Gumbel-max of uniform
    noise, finite at the extremes of the draw), follow its probabilities. Gaussian: the mode is
    the mean, and ``act_with_noise`` of a standard normal draw is the very number
    ``Normal.sample`` draws, with its log-probability."""
    agent = ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3), [16])
    with torch.no_grad():
        agent.actor[-1].bias.copy_(torch.tensor([1.0, 0.0, -1.0]))  # unequal probabilities
    obs = torch.randn(5, 4)
    a = agent.action(obs)
    lp, ent, v = agent.evaluate(obs, a)
    assert a.dtype == torch.long and a.shape == lp.shape == v.shape == (5,)
    dist = agent.distribution(obs)
    assert torch.equal(agent.action(obs, deterministic=True), dist.probs.argmax(-1))
    torch.testing.assert_close(lp, dist.log_prob(a))
    torch.testing.assert_close(ent, dist.entropy())
    one, g = obs[:1].expand(20000, 4), torch.Generator().manual_seed(0)
    action, logp, _ = agent.act_with_noise(one, torch.rand(agent.noise_shape(20000), generator=g))
    torch.manual_seed(0)
    for sample in (agent.action(one), action):
        freq = torch.bincount(sample, minlength=3).float() / 20000
        torch.testing.assert_close(freq, dist.probs[0], atol=0.015, rtol=0)
    torch.testing.assert_close(logp, dist.probs[0].log()[action])
    assert torch.isfinite(agent.act_with_noise(one[:1], torch.tensor([[0.0, 1.0, 0.5]]))[1]).all()
    gauss = ActorCritic(
        gym.spaces.Box(-1, 1, (6,)), gym.spaces.Box(-1, 1, (2,)), [16], "tanh", -0.5
    )
    obs = torch.randn(4, 6)
    torch.testing.assert_close(gauss.action(obs, deterministic=True), gauss.actor(obs))
    torch.manual_seed(3)
    a_ref = gauss.action(obs)
    lp_ref, _, v_ref = gauss.evaluate(obs, a_ref)
    torch.manual_seed(3)
    a, lp, v = gauss.act_with_noise(obs, torch.randn(gauss.noise_shape(4)))
    torch.testing.assert_close(a, a_ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(lp, lp_ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(v, v_ref)


def test_update_improves_the_value_fit_and_anneals():
    torch.manual_seed(0)
    env = AutoReset(PointReach(16))
    ppo = make_ppo(
        env, num_steps=8, num_minibatches=2, target_kl=None, anneal_lr=True, anneal_clip=True
    )
    rollout(ppo, env)
    s = ppo.storage
    before = [p.clone() for p in ppo.agent.parameters()]
    assert ppo.set_schedule(0.5) == pytest.approx(ppo.cfg.learning_rate * 0.5)
    assert float(ppo.clip_coef) == pytest.approx(0.1)  # a tensor, read by the loss
    assert ppo.update()["loss/updates"] == 2 * 4
    assert any(not torch.equal(b, p) for b, p in zip(before, ppo.agent.parameters()))
    with torch.no_grad():  # the value function fits its targets better after the update
        fitted = ppo.agent.value(s.obs.reshape(-1, 6)) - s.returns.flatten()
        assert (fitted**2).mean() < ((s.values - s.returns) ** 2).mean()


@pytest.mark.parametrize("kl_check", ["epoch", "minibatch"])
def test_ppo_stores_its_rollout_and_the_kl_check_stops_the_update(kl_check):
    """act -> env step -> process_env_step fills PPO's storage row by row; the update clears it.
    ``algo.kl_check=epoch``: the KL is read once, after the first epoch, which runs whole (its 4
    minibatches). ``minibatch`` (ManiSkill's ppo.py): each minibatch's KL is read before its
    optimizer step, and the first one over ``target_kl`` takes no step and ends the update: the
    first minibatch has KL 0 (the policy has not moved), so exactly one step is taken."""
    torch.manual_seed(0)
    env = AutoReset(PointReach(8, max_episode_steps=3))
    ppo = make_ppo(
        env, num_steps=6, update_epochs=20, target_kl=1e-6, learning_rate=1e-2, kl_check=kl_check
    )
    rollout(ppo, env)
    storage = ppo.storage
    assert storage.step == 6
    assert bool(storage.dones[2].all()) and not bool(storage.dones[1].any())  # episodes of 3
    assert not torch.equal(storage.advantages, torch.zeros_like(storage.advantages))
    reads, above = [], ppo._kl_above
    ppo._kl_above = lambda kl, limit: reads.append(float(kl)) or above(kl, limit)
    before = [p.detach().clone() for p in ppo.agent.parameters()]
    updates = ppo.update()["loss/updates"]
    if kl_check == "minibatch":
        assert updates == 1 and len(reads) == 2 and reads[0] == 0.0 and reads[1] > 1e-6
    else:
        assert updates == 4 and len(reads) == 1 and reads[0] > 1e-6
    assert any(not torch.equal(a, b) for a, b in zip(before, ppo.agent.parameters()))
    assert storage.step == 0  # cleared for the next rollout, which refills it from row 0
    rollout(ppo, env)
    with pytest.raises(IndexError, match="full"):
        storage.add(*(torch.zeros(8, *s) for s in ((6,), (2,), (), (), (), ())))


def test_kl_check_minibatch_decides_on_the_mean_over_ranks(monkeypatch):
    """Several ranks: each minibatch's KL is all-reduced (mean) before the decision, so every
    rank stops at the same minibatch (the gradient all-reduces stay matched)."""
    ppo, calls = make_ppo(kl_check="minibatch"), []
    monkeypatch.setattr(distributed, "all_reduce_", lambda t, op: calls.append(op) or t.fill_(0.5))
    local = torch.tensor(0.0)  # the other rank's KL was 1.0
    assert not ppo._kl_above(local, 0.1) and calls == []  # one rank: no collective
    ppo.world = 2
    assert ppo._kl_above(local, 0.1) and calls == ["mean"]
    assert float(local) == 0.0  # the minibatch's own statistics are left as they were


@pytest.mark.parametrize("num_minibatches", [2, 8])
def test_update_reads_the_device_the_same_few_times_whatever_its_minibatches(num_minibatches):
    """No host sync per minibatch (the losses, KL, clipped fraction and gradient norm are summed
    on the device; the clip scales on the device): the update reads back once, at its end, with 8
    minibatches an epoch as with 2."""
    torch.manual_seed(0)
    env = AutoReset(PointReach(16))
    ppo = make_ppo(
        env, num_steps=8, num_minibatches=num_minibatches, update_epochs=3, target_kl=None
    )
    rollout(ppo, env)
    with HostReads() as reads:
        stats = ppo.update()
    assert stats["loss/updates"] == 3 * num_minibatches
    assert reads.count == 1, reads.where  # every statistic at once, at the end
    assert stats["train/grad_norm"] > 0 and np.isfinite(stats["train/grad_norm"])


def test_grad_clip_per_network_clips_the_actor_and_the_critic_each_on_its_own():
    """``algo.grad_clip=per_network`` (rsl_rl's PPO): each network's gradient is scaled to
    ``max_grad_norm`` by its own norm, so the critic's large gradient leaves the actor's as it is
    when the actor's is under the limit; ``joint`` scales both by the one norm of the two."""
    clipped = {}
    for mode in GradClip:
        ppo = make_ppo(max_grad_norm=1.0, grad_clip=mode)
        ppo.optimizer.step = lambda: None  # the clipped gradients are what is looked at
        actor = [*ppo.agent.actor.parameters(), ppo.agent.log_std]
        for p in ppo.agent.parameters():  # a small actor gradient, a large critic gradient
            p.grad = torch.full_like(p, 1e-4 if any(p is q for q in actor) else 10.0)
        grads = [p.grad.clone() for p in actor]
        total = float(torch.cat([p.grad.flatten() for p in ppo.agent.parameters()]).norm())
        assert float(ppo._optimizer_step_eager()) == pytest.approx(total, rel=1e-5)  # before
        critic = torch.cat([p.grad.flatten() for p in ppo.agent.critic.parameters()])
        assert float(critic.norm()) == pytest.approx(1.0, rel=1e-4)
        clipped[mode] = all(torch.equal(a, p.grad) for a, p in zip(grads, actor))
    assert clipped == {GradClip.joint: False, GradClip.per_network: True}


def test_init_torch_default_keeps_nn_linear_init_and_orthogonal_replaces_it():
    """``algo.init=torch_default`` (rsl_rl's MLP): every layer's weights and biases are those
    ``nn.Linear`` draws (the same numbers as plain layers built from the same seed, biases not
    zero); ``orthogonal``: orthogonal weights with gain sqrt(2) in the hidden layers, 0.01 at the
    actor's output and 1 at the critic's, zero biases."""
    nets = {}
    for init in Init:
        torch.manual_seed(0)
        nets[init] = make_ppo(hidden_sizes=[8, 8], init=init).agent
    linears = lambda net: [m for m in net if isinstance(m, torch.nn.Linear)]  # noqa: E731
    torch.manual_seed(0)
    plain = [torch.nn.Linear(i, o) for i, o in [(6, 8), (8, 8), (8, 1), (6, 8), (8, 8), (8, 2)]]
    default = nets[Init.torch_default]
    for layer, ref in zip(linears(default.critic) + linears(default.actor), plain):
        assert torch.equal(layer.weight, ref.weight) and torch.equal(layer.bias, ref.bias)
        assert layer.bias.abs().sum() > 0
    ortho = nets[Init.orthogonal]
    for net, out_gain in ((ortho.critic, 1.0), (ortho.actor, 0.01)):
        for i, layer in enumerate(linears(net)):
            gain = out_gain if i == len(linears(net)) - 1 else 2**0.5
            w = layer.weight.detach()
            small = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
            eye = torch.eye(small.shape[0])
            assert torch.allclose(small, gain**2 * eye, atol=1e-5 * max(1.0, gain**2)), (i, gain)
            assert not layer.bias.any()


@pytest.mark.parametrize("compile_", [False, True])
def test_adam_eps_is_the_steps_and_wins_over_a_loaded_state(compile_):
    """``algo.adam_eps`` is the eps of the optimizer's step (fused on the CPU, torch.optim's
    Adam with ``algo.compile``), also after loading a state saved with another eps: a huge eps
    (1.0 against gradients of 1e-4) makes the first step about lr * 1e-4 instead of about lr."""
    saved = make_ppo(adam_eps=1e-5, learning_rate=1e-2).state_dict()
    assert saved["optimizer"]["param_groups"][0]["eps"] == 1e-5
    moved = {}
    for eps in (1e-8, 1.0):
        ppo = make_ppo(adam_eps=eps, learning_rate=1e-2, compile=compile_)
        ppo.load_state_dict(saved)
        assert [g["eps"] for g in ppo.optimizer.param_groups] == [eps]
        before = ppo.agent.log_std.detach().clone()
        ppo.agent.log_std.grad = torch.full_like(before, 1e-4)
        ppo.optimizer.step()
        moved[eps] = float((ppo.agent.log_std.detach() - before).abs().max())
    assert moved[1e-8] == pytest.approx(1e-2, rel=1e-3)
    assert moved[1.0] == pytest.approx(1e-6, rel=1e-2)
