"""Helpers of the PPO tests."""


def stored_reward(ppo, obs, reward, terminated, truncated, info):
    """The reward ``ppo.process_env_step`` stores for the step from ``obs`` (after its ``act``):
    the env's reward, bootstrapped where ``algo.bootstrap_at`` says."""
    ppo.init_storage(reward.shape[0])
    ppo.act(obs)
    ppo.process_env_step(reward, terminated, truncated, info)
    return ppo.storage.rewards[0].clone()
