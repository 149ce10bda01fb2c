"""The ``+experiment=NAME`` presets of conf/experiment/: each composes and validates."""

import pytest

from tests.helpers import REPO, make_config


def test_experiment_preset_applies():
    cfg = make_config(["+experiment=smoke"])
    assert cfg.total_steps == 8192 and cfg.env.num_envs == 16


@pytest.mark.parametrize(
    "name", sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))
)
def test_experiment_presets_compose_and_validate(name):
    cfg = make_config([f"+experiment={name}"])
    batch = cfg.env.num_envs * cfg.algo.num_steps
    assert cfg.total_steps >= batch and batch % cfg.algo.num_minibatches == 0


def test_maniskill_gpu_preset_uses_maniskill_baseline_settings():
    cfg = make_config(["+experiment=maniskill_pushcube_gpu"])
    assert (cfg.env.name, cfg.env.id, cfg.sim.name) == ("maniskill", "PushCube-v1", "gpu")
    assert (
        cfg.env.num_envs,
        cfg.algo.num_steps,
        cfg.algo.update_epochs,
        cfg.algo.num_minibatches,
    ) == (2048, 20, 8, 32)
    assert (cfg.algo.gamma, cfg.algo.gae_lambda, cfg.algo.norm_obs) == (0.8, 0.9, False)
    # ppo.py: every done row bootstrapped, target KL checked per minibatch before the step
    assert (cfg.algo.bootstrap_at, cfg.algo.kl_check, cfg.algo.target_kl) == (
        "done",
        "minibatch",
        0.1,
    )
    assert (cfg.algo.init_log_std, cfg.algo.anneal_lr, cfg.total_steps) == (-0.5, False, 2_000_000)


def test_maniskill_pickcube_preset_uses_ppo_fast_baseline_settings():
    cfg = make_config(["+experiment=maniskill_pickcube_gpu"])
    assert (cfg.env.name, cfg.env.id, cfg.sim.name) == ("maniskill", "PickCube-v1", "gpu")
    assert (
        cfg.env.num_envs,
        cfg.algo.num_steps,
        cfg.algo.update_epochs,
        cfg.algo.num_minibatches,
        cfg.eval_env.num_envs,
        cfg.eval_env.every,
    ) == (4096, 4, 8, 32, 16, 25)
    assert (cfg.algo.gamma, cfg.algo.gae_lambda, cfg.algo.init_log_std) == (0.8, 0.9, 0.0)
    assert (cfg.algo.bootstrap_at, cfg.algo.kl_check, cfg.algo.norm_obs) == (
        "done",
        "minibatch",
        False,
    )


def test_builtin_and_gymnasium_presets_keep_bootstrapping_time_outs_only():
    """Their terminations are true ends (CartPole falls), worth no future value."""
    for name in ("smoke", "cartpole", "genesis_franka_reach"):
        cfg = make_config([f"+experiment={name}"])
        assert cfg.algo.bootstrap_at == "truncated" and cfg.algo.kl_check == "epoch", name


def test_presets_that_reproduce_another_ppo_clip_the_gradient_as_it_does():
    """rlrec's default clips the actor's and the critic's gradients each on its own (rsl_rl's
    rule); the presets that reproduce SB3's (CartPole) or ManiSkill's PPO clip them together."""
    assert make_config([]).algo.grad_clip == "per_network"
    for name in ("cartpole", "maniskill_pushcube_gpu", "maniskill_pickcube_gpu"):
        assert make_config([f"+experiment={name}"]).algo.grad_clip == "joint", name


def test_presets_that_reproduce_another_ppo_keep_its_init_and_adam_eps():
    """The CartPole (SB3), ManiSkill (ppo.py, ppo_fast.py) and Genesis presets keep the
    orthogonal init and Adam eps 1e-5 of the PPO each follows; rlrec's defaults are rsl_rl's."""
    algo = make_config([]).algo
    assert (algo.init, algo.adam_eps, algo.anneal_lr) == ("torch_default", 1e-8, False)
    for name in (
        "cartpole",
        "maniskill_pushcube_gpu",
        "maniskill_pickcube_gpu",
        "genesis_franka_reach",
    ):
        algo = make_config([f"+experiment={name}"]).algo
        assert algo.init == "orthogonal" and algo.adam_eps == 1e-5, name
        assert algo.anneal_lr == (name in ("cartpole", "genesis_franka_reach")), name


def test_the_cartpole_preset_uses_relu_hidden_layers():
    """The CartPole preset keeps rl-zoo's PPO settings but ReLU hidden layers (SB3's MlpPolicy:
    tanh), which hold 475 in fewer env steps (docs/gymnasium.md); rlrec's default stays tanh."""
    assert make_config([]).algo.activation == "tanh"
    assert make_config(["+experiment=cartpole"]).algo.activation == "relu"


def test_maniskill_rgb_preset_uses_ppo_rgb_baseline_settings():
    """ppo_rgb.py's PushCube-v1 command and defaults (docs/maniskill.md maps each one)."""
    cfg = make_config(["+experiment=maniskill_pushcube_rgb"])
    env, algo = cfg.env, cfg.algo
    assert (env.name, env.id, cfg.sim.name, env.obs_mode) == (
        "maniskill",
        "PushCube-v1",
        "gpu",
        "rgb_state",  # --include-state
    )
    assert (env.obs_height, env.obs_width, algo.encoder) == (128, 128, "cnn")
    assert (env.num_envs, algo.num_steps, algo.update_epochs, algo.num_minibatches) == (
        256,
        20,
        8,
        8,
    )
    assert (cfg.total_steps, cfg.eval_env.every, cfg.eval_env.num_envs) == (1_000_000, 10, 8)
    assert (algo.gamma, algo.gae_lambda, algo.target_kl, algo.kl_check) == (
        0.8,
        0.9,
        0.2,
        "minibatch",
    )
    assert (algo.bootstrap_at, algo.grad_clip, algo.init, algo.adam_eps) == (
        "done",
        "joint",
        "orthogonal",
        1e-5,
    )
    assert (algo.hidden_sizes, algo.activation, algo.init_log_std, algo.norm_obs) == (
        [512],
        "relu",
        -0.5,
        False,
    )
