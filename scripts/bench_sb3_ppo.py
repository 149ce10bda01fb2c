"""One run of Stable-Baselines3's PPO with the PPO settings of an rlrec config, the SB3 side of
``scripts/bench_mujoco.py --sb3``:

    python scripts/bench_sb3_ppo.py OUT_DIR SEED TOTAL_STEPS +experiment=mujoco_tuned zoo=Hopper-v4

The overrides compose rlrec's config, whose ``algo`` becomes SB3's ``PPO`` and ``VecNormalize``
arguments (:func:`sb3_settings`; what SB3 cannot express is refused), built as RL Baselines3 Zoo
does (``env.num_envs`` Gymnasium envs under ``Monitor`` in a ``DummyVecEnv``); then the Zoo's
evaluation (``eval_env.num_envs`` deterministic episodes, observation statistics frozen). Writes
``OUT_DIR/result.json``: the training episodes' returns and lengths, the eval returns, the env steps
and the run's wall time (imports included).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Dict

START = time.time()

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import rlrec.run.cli  # noqa: E402  (registers rlrec's schemas and resolvers)
from rlrec.config import Config, to_dataclass  # noqa: E402


def sb3_settings(cfg: Config) -> Dict[str, Any]:
    """``{"ppo": PPO kwargs, "normalize": VecNormalize kwargs}`` for rlrec's ``cfg``: the same
    PPO, where SB3 has the setting. SB3's value loss has no factor 1/2 (``F.mse_loss``), so its
    ``vf_coef`` is half of rlrec's; ``clip_range_vf`` clips the value around the old one by the
    clip range (rlrec's ``algo.clip_vloss``); a learning rate or clip range annealed to 0 is SB3's
    linear schedule of the progress remaining."""
    a = cfg.algo
    refused = {
        "algo.grad_clip": (a.grad_clip, "joint"),
        "algo.bootstrap_at": (a.bootstrap_at, "truncated"),
        "algo.encoder": (a.encoder, "mlp"),
        "algo.reward_scale": (a.reward_scale, 1.0),
        "algo.target_kl": (a.target_kl, None),  # SB3 stops at 1.5 x target_kl, per minibatch
    }
    for key, (value, allowed) in refused.items():
        if value != allowed:
            raise SystemExit(f"{key}={value}: SB3's PPO has {allowed} only")
    batch = cfg.env.num_envs * a.num_steps

    def schedule(value: float, anneal: bool):
        return (lambda remaining: value * remaining) if anneal else value

    activation = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU, "elu": torch.nn.ELU}
    ppo = dict(
        n_steps=a.num_steps,
        batch_size=batch // a.num_minibatches,
        n_epochs=a.update_epochs,
        learning_rate=schedule(a.learning_rate, a.anneal_lr),
        gamma=a.gamma,
        gae_lambda=a.gae_lambda,
        clip_range=schedule(a.clip_coef, a.anneal_clip),
        clip_range_vf=a.clip_coef if a.clip_vloss else None,
        normalize_advantage=a.norm_adv,
        ent_coef=a.ent_coef,
        vf_coef=a.vf_coef / 2,
        max_grad_norm=a.max_grad_norm,
        policy_kwargs=dict(
            net_arch=dict(pi=list(a.hidden_sizes), vf=list(a.hidden_sizes)),
            activation_fn=activation[str(a.activation)],
            ortho_init=a.init == "orthogonal",
            log_std_init=a.init_log_std,
            optimizer_kwargs=dict(eps=a.adam_eps),
        ),
    )
    clip_reward = a.clip_reward if a.clip_reward is not None else float("inf")
    normalize = dict(
        norm_obs=a.norm_obs, norm_reward=a.norm_reward, clip_reward=clip_reward, gamma=a.gamma
    )
    return {"ppo": ppo, "normalize": normalize}


def main() -> None:
    import gymnasium as gym
    from hydra import compose, initialize_config_dir
    from stable_baselines3 import PPO
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    out, seed, steps, overrides = (
        Path(sys.argv[1]),
        int(sys.argv[2]),
        int(sys.argv[3]),
        sys.argv[4:],
    )
    with initialize_config_dir(version_base="1.3", config_dir=rlrec.run.cli.CONFIG_DIR):
        cfg = to_dataclass(compose("config", overrides=[*overrides, f"seed={seed}"]))
    if cfg.env.name != "gymnasium":
        raise SystemExit(f"env={cfg.env.name}: the SB3 side runs Gymnasium tasks only")
    settings = sb3_settings(cfg)
    torch.set_num_threads(cfg.torch_threads or torch.get_num_threads())
    task = cfg.env.id
    monitors = [Monitor(gym.make(task)) for _ in range(cfg.env.num_envs)]
    env = VecNormalize(DummyVecEnv([lambda m=m: m for m in monitors]), **settings["normalize"])
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **settings["ppo"])
    model.learn(total_timesteps=steps)
    train_wall = time.time() - START
    # every env's episodes, in the order they ended
    episodes = sorted(
        (t, r, n)
        for m in monitors
        for t, r, n in zip(m.get_episode_times(), m.get_episode_rewards(), m.get_episode_lengths())
    )
    # the Zoo's evaluation: deterministic actions, the observation statistics frozen
    eval_env = VecNormalize(DummyVecEnv([lambda: Monitor(gym.make(task))]), training=False)
    eval_env.obs_rms, eval_env.norm_reward = env.obs_rms, False
    eval_env.seed(cfg.eval_env.seed)
    obs, returns = eval_env.reset(), []
    while len(returns) < cfg.eval_env.num_envs:
        action, _ = model.predict(obs, deterministic=True)
        obs, _, done, info = eval_env.step(action)
        if done[0]:
            returns.append(float(info[0]["episode"]["r"]))
    result = dict(side="sb3", task=task, seed=seed, steps=int(model.num_timesteps), eval=returns)
    result["train"] = {
        "returns": [r for _, r, _ in episodes],
        "lengths": [n for _, _, n in episodes],
    }
    result.update(wall=train_wall, overrides=overrides)
    result["versions"] = {"stable_baselines3": __import__("stable_baselines3").__version__}
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, default=float))
    print(f"sb3 {task} seed {seed}: {result['steps']} steps in {train_wall:.0f} s", flush=True)


if __name__ == "__main__":
    main()
