"""``algo.compile``: the compiled PPO against the eager one, on the real inductor backend (the C++
compiler is gcc), and the rollout's policy step as one graph."""

import gymnasium as gym
import pytest
import torch
from torch._dynamo.utils import counters

from rlrec.envs.autoreset import AutoReset
from rlrec.envs.builtin import PointReach
from rlrec.ppo.config import PPOConfig
from rlrec.ppo.ppo import PPO
from rlrec.train import resume as resume_module
from rlrec.train.runner import Runner
from rlrec.train.stack import load_stack_state
from tests.helpers import make_config
from tests.ppo import CPU, make_ppo, rollout
from tests.trainutil import QUIET

# small: the compile of three graphs is the cost of this module (seconds once inductor's cache
# holds them); episodes of 5 steps end inside the 8-step rollout, so time-outs are bootstrapped.
# The learning rate is large enough for the clip range to bite in the second minibatch
SMALL = dict(num_steps=8, num_minibatches=2, update_epochs=2, target_kl=None)
SMALL.update(hidden_sizes=[16, 16], learning_rate=1e-2, anneal_lr=True, anneal_clip=True)
ROLLOUT = ("obs", "actions", "logprobs", "values", "rewards", "advantages", "returns")


def _small(**cfg):
    """8 built-in envs of 5-step episodes and the PPO of :data:`SMALL` (and ``cfg``), seed 0."""
    torch.manual_seed(0)
    env = AutoReset(PointReach(8, max_episode_steps=5))
    return env, make_ppo(env, **SMALL, **cfg)


def _two_iterations(compile: bool):
    """Two iterations (rollout + update) from the same seed, each with another learning rate and
    clip range; what each produced, and the number of graphs compiled after each."""
    env, ppo = _small(compile=compile)
    out, obs = [], None
    for frac in (0.5, 0.25):
        ppo.set_schedule(frac)
        obs = rollout(ppo, env, obs)
        stored = {k: getattr(ppo.storage, k).clone() for k in ROLLOUT}
        losses = ppo.update()
        params = {n: p.detach().clone() for n, p in ppo.agent.named_parameters()}
        out.append((stored, losses, params, counters["stats"]["unique_graphs"]))
    return ppo, out


@pytest.fixture(scope="module")
def eager_and_compiled():
    torch._dynamo.reset()
    graphs_before = counters["stats"]["unique_graphs"]
    eager = _two_iterations(False)
    assert counters["stats"]["unique_graphs"] == graphs_before, "the eager run compiled something"
    return eager, _two_iterations(True), graphs_before


def test_compile_is_off_by_default_and_set_by_algo_compile():
    assert make_config([]).algo.compile is False
    assert make_config(["algo.compile=true"]).algo.compile is True
    eager, compiled = make_ppo(), make_ppo(compile=True)
    assert eager._policy_step == eager._policy_step_eager and not eager.compiled
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
        PPOConfig(compile=True, hidden_sizes=[8]), gym.spaces.Box(-1, 1, (5,)), action_space, CPU
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


def test_checkpoints_load_across_modes():
    """A compiled run resumes an eager run's checkpoint and the other way round: the saved learning
    rate is a float in both, and each keeps its own Adam implementation and lr type."""
    eager = make_ppo(learning_rate=1e-3, anneal_lr=True)
    compiled = make_ppo(learning_rate=5e-4, anneal_lr=True, compile=True)
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


class _StaleGradients(torch.overrides.TorchFunctionMode):
    """CUDA graphs faked on the CPU: each step marked by ``cudagraph_mark_step_begin`` starts a
    new replay, which overwrites the CUDA-graph pool where the last backward left its outputs,
    the gradients AccumulateGrad took. Any op that reads or writes such a gradient's data
    afterwards raises, as torch does (torch/_inductor/cudagraph_trees.py
    dealloc_current_path_weakrefs)."""

    def __init__(self, params):
        super().__init__()
        self.params, self.stale, self.steps = params, [], 0
        self.before_backward = []  # the gradients as each backward pass begins

    def mark_step_begin(self) -> None:
        self.steps += 1
        self.stale.extend(p.grad for p in self.params if p.grad is not None)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) == "backward":
            self.before_backward.append([p.grad for p in self.params])
        flat = torch.utils._pytree.tree_leaves((args, kwargs or {}))
        # not a read of an attribute nor a flag: those touch no data
        reads_data = getattr(func, "__name__", None) not in ("__get__", "requires_grad_")
        if reads_data and any(
            t is s for t in flat if isinstance(t, torch.Tensor) for s in self.stale
        ):
            raise RuntimeError(
                f"{func}: accessing gradient tensor output of CUDAGraphs that has been "
                "overwritten by a subsequent run"
            )
        return func(*args, **(kwargs or {}))


def test_updates_under_cuda_graphs_never_touch_the_last_replays_gradients(monkeypatch):
    """Under CUDA graphs every minibatch drops the last one's gradients (``.grad`` is None before
    each backward) instead of zeroing them: they were the outputs of the last backward replay,
    overwritten by the next replay. CUDA graphs are faked (``_cudagraphs`` on an eager PPO, the
    step marker and the pool's overwrite by :class:`_StaleGradients`); four minibatches, as
    ``test_compiled_rollouts_and_updates_match_eager_within_1e5`` on a GPU."""
    env, ppo = _small()
    ppo._cudagraphs = True
    rollout(ppo, env)
    pool = _StaleGradients(ppo._params)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", pool.mark_step_begin)
    before = [p.detach().clone() for p in ppo._params]
    with pool:
        losses = ppo.update()
    assert losses["loss/updates"] == 4 and pool.steps == 4
    assert len(pool.before_backward) == 4
    assert all(g is None for grads in pool.before_backward for g in grads)
    assert all(not torch.equal(p, b) for p, b in zip(ppo._params, before))  # it did learn


def _rollout_runner(tmp_path, name: str, overrides):
    run_dir = tmp_path / name
    run_dir.mkdir()
    args = [*QUIET, "algo.compile=true", "total_steps=256", *overrides]
    return Runner(make_config(args), run_dir), run_dir


def test_compiled_rollouts_run_under_no_grad_not_inference_mode(tmp_path, monkeypatch):
    """``algo.compile``: the policy step (the rollout's CUDA graph) is never first captured inside
    inference mode, which on torch before 2.11 breaks the update's capture after it; the train
    env's reset and restore run in the rollout's mode (an env's tensors built inside inference
    mode could not be updated in place by a rollout outside it). torch.compile is replaced by the
    identity here: the modes are the runner's, whatever compiles. A run, then its resume."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    modes = {}  # what ran -> the (inference mode, grad mode) pairs it ran under

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            mode = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())
            modes.setdefault(name, set()).add(mode)
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(resume_module, "load_stack_state", spy("restore", load_stack_state))

    def watch(runner):
        runner.ppo._policy_step = spy("policy step", runner.ppo._policy_step)
        env = runner.train_env
        env.reset, env.step = spy("reset", env.reset), spy("step", env.step)
        return runner

    outside = {(False, False)}  # no_grad, not inference mode
    runner, run_dir = _rollout_runner(tmp_path, "a", [])
    assert runner.ppo.compiled
    watch(runner).run()
    assert modes == {"policy step": outside, "reset": outside, "step": outside}, modes
    modes.clear()
    resumed, _ = _rollout_runner(
        tmp_path, "b", ["total_steps=512", f"checkpoint={run_dir}/checkpoints/last.pt"]
    )
    watch(resumed).run()
    assert modes == {"policy step": outside, "step": outside, "restore": outside}, modes
    assert resumed.global_step == 512
    eager, _ = _rollout_runner(tmp_path, "c", ["algo.compile=false"])
    try:
        with eager.ppo.rollout_mode():  # eager rollouts keep inference mode
            assert torch.is_inference_mode_enabled()
    finally:
        eager.close()
