"""Same-step autoreset: the layer above the recorder that starts the next episode of done envs.

Because it sits above the recorder, the recorder sees each terminal state in ``step`` (before
this layer resets the env) and each new episode's first state in ``reset(env_idx=...)``.
"""

from __future__ import annotations

import torch

from rlrec.envs.base import EnvAdapter, EnvWrapper, as_env_index
from rlrec.obs import map_obs


class AutoReset(EnvWrapper):
    """Same-step autoreset above the recorder.

    When envs finish in ``step``, their final observation and info are cloned into
    ``info["final_obs"]`` / ``info["final_info"]`` (full-batch tensors; rows valid where
    ``info["_final"]`` is True; ``info["_final_idx"]``: their indices, a long tensor on the CPU) and
    then only those envs are reset, so the returned ``obs`` is already the first observation of the
    next episode. Episode returns and lengths of finished
    envs are reported in ``info["episode"]``.

    A step reads one thing back from the device, the done flags, and names the envs it resets
    with a long index tensor on the CPU (``reset(env_idx=...)``).
    """

    def __init__(self, env: EnvAdapter):
        super().__init__(env)
        self._return = torch.zeros(env.num_envs, device=env.device)
        self._length = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)

    def reset(self, seed=None, env_idx=None):
        idx = as_env_index(env_idx, self.num_envs, self.device)
        self._return[idx] = 0.0
        self._length[idx] = 0
        return self.env.reset(seed=seed, env_idx=env_idx)

    def state_dict(self) -> dict:
        return {"return": self._return.clone(), "length": self._length.clone()}

    def load_state_dict(self, state: dict) -> None:
        self._return.copy_(state["return"])
        self._length.copy_(state["length"])

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._return += reward
        self._length += 1
        done = terminated | truncated
        # The one read back of a step: the done flags, copied to the host once (one sync on a
        # GPU, whether or not an episode ended). The finished envs are then named by a CPU index
        # tensor: the recorder below reads it without a device round trip, and an adapter copies
        # it to its device without waiting (as_env_index). Nothing else here waits for the device.
        ended = done.cpu()
        if bool(ended.any()):
            idx = ended.nonzero().flatten()
            episode = {
                "return": self._return.clone(),
                "length": self._length.clone(),
                "_mask": done,
            }
            info = dict(info, final_obs=map_obs(torch.clone, obs), final_info=dict(info))
            info.update(_final=done.clone(), _final_idx=idx, episode=episode)
            obs, _ = self.reset(env_idx=idx)  # the finished envs' return and length start at 0
        return obs, reward, terminated, truncated, info
