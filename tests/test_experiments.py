"""The ``+experiment=NAME`` presets of conf/experiment/: each composes and validates, and keeps the
settings of the PPO it reproduces (rlrec's own defaults: rsl_rl's)."""

from operator import attrgetter

import pytest
import yaml

from rlrec.run import budget
from tests.helpers import REPO, make_config

# what each preset must keep, as KEY=VALUE overrides ("": rlrec's defaults)
PINNED = {
    "": "algo.grad_clip=per_network algo.activation=tanh algo.init=torch_default "
    "algo.adam_eps=1.0e-8 algo.anneal_lr=false env.num_envs=64",
    "smoke": "total_steps=8192 env.num_envs=16",
    # SB3's (rl-zoo's) CartPole, with ReLU hidden layers (held 475 in fewer env steps)
    "cartpole": "env.id=CartPole-v1 algo.grad_clip=joint algo.activation=relu "
    "algo.init=orthogonal algo.adam_eps=1.0e-5 algo.anneal_lr=true",
    "genesis_franka_reach": "algo.init=orthogonal algo.adam_eps=1.0e-5 algo.anneal_lr=true",
    # ManiSkill's ppo.py: every done row bootstrapped, target KL checked per minibatch
    "maniskill_pushcube_gpu": "env.id=PushCube-v1 sim.name=gpu env.num_envs=2048 "
    "algo.num_steps=20 algo.update_epochs=8 algo.num_minibatches=32 algo.gamma=0.8 "
    "algo.gae_lambda=0.9 algo.norm_obs=false algo.bootstrap_at=done algo.kl_check=minibatch "
    "algo.target_kl=0.1 algo.init_log_std=-0.5 algo.anneal_lr=false total_steps=2000000 "
    "algo.grad_clip=joint algo.init=orthogonal algo.adam_eps=1.0e-5",
    # ManiSkill's ppo_fast.py
    "maniskill_pickcube_gpu": "env.id=PickCube-v1 sim.name=gpu env.num_envs=4096 "
    "algo.num_steps=4 algo.update_epochs=8 algo.num_minibatches=32 eval_env.num_envs=16 "
    "eval_env.every=25 algo.gamma=0.8 algo.gae_lambda=0.9 algo.init_log_std=0.0 "
    "algo.bootstrap_at=done algo.kl_check=minibatch algo.norm_obs=false algo.grad_clip=joint "
    "algo.init=orthogonal algo.adam_eps=1.0e-5 algo.anneal_lr=false",
    # ManiSkill's ppo_rgb.py PushCube-v1 command and defaults (docs/maniskill.md maps each one)
    "maniskill_pushcube_rgb": "env.id=PushCube-v1 sim.name=gpu env.obs_mode=rgb_state "
    "env.obs_height=128 env.obs_width=128 algo.encoder=cnn env.num_envs=256 algo.num_steps=20 "
    "algo.update_epochs=8 algo.num_minibatches=8 total_steps=1000000 eval_env.every=10 "
    "eval_env.num_envs=8 algo.gamma=0.8 algo.gae_lambda=0.9 algo.target_kl=0.2 "
    "algo.kl_check=minibatch algo.bootstrap_at=done algo.grad_clip=joint algo.init=orthogonal "
    "algo.adam_eps=1.0e-5 algo.hidden_sizes=[512] algo.activation=relu algo.init_log_std=-0.5 "
    "algo.norm_obs=false",
    # CleanRL's ppo_continuous_action.py
    "mujoco": "env.name=gymnasium env.num_envs=1 total_steps=1000000 algo.num_steps=2048 "
    "algo.num_minibatches=32 algo.update_epochs=10 algo.learning_rate=3.0e-4 algo.anneal_lr=true "
    "algo.adam_eps=1.0e-5 algo.gamma=0.99 algo.gae_lambda=0.95 algo.clip_coef=0.2 "
    "algo.clip_vloss=true algo.ent_coef=0.0 algo.vf_coef=0.5 algo.max_grad_norm=0.5 "
    "algo.grad_clip=joint algo.norm_obs=true algo.norm_reward=true algo.clip_reward=10.0 "
    "algo.init=orthogonal algo.init_log_std=0.0 algo.target_kl=null",
}
NAMES = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("name", ["", *NAMES])
def test_presets_compose_validate_and_keep_their_settings(name):
    cfg = make_config([f"+experiment={name}"] if name else [])
    batch = cfg.env.num_envs * cfg.algo.num_steps
    assert cfg.total_steps >= batch and batch % cfg.algo.num_minibatches == 0
    pinned = dict(item.split("=") for item in PINNED.get(name, "").split())
    assert {k: attrgetter(k)(cfg) for k in pinned} == {
        k: yaml.safe_load(v) for k, v in pinned.items()
    }
    for on_gpu in (False, True):  # a few MB by the memory estimate (4096 ManiSkill envs too)
        assert sum(n.bytes for n in budget.estimate(cfg, on_gpu)) < 1e9
    budget.check(cfg)  # the host check of this machine
    # terminations that are true ends (CartPole falls) are worth no future value
    if name in ("", "smoke", "cartpole", "genesis_franka_reach"):
        assert (cfg.algo.bootstrap_at, cfg.algo.kl_check) == ("truncated", "epoch")
