"""The policy file format of an export (``exported/policy.pt``, ``policy.onnx``, ``policy.json``)
and of a checkpoint's policy: :func:`load_policy` turns either into a callable ``obs -> action``
(no Hydra, no simulator); ``eval_only=true checkpoint=EXPORT`` evaluates an export
(:func:`start_data`). Written by ``python -m rlrec.export`` (rlrec/export/)."""

from __future__ import annotations

import importlib.util
import json
import re
import zipfile
from pathlib import Path
from typing import Any, Dict, Optional

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlrec.checks import ConfigError
from rlrec.obs import Obs, as_float, first, map_obs, shape_of
from rlrec.ppo.agent import ActorCritic, ObsNormalizer
from rlrec.train import checkpoint as ckpt

FILES = {"torchscript": "policy.pt", "onnx": "policy.onnx"}
META = "policy.json"


def need_extra(module: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"{what} needs the 'export' extra ({module} is missing): pip install 'rlrec[export]' "
            "(or pip install -e '.[export]' in a checkout)"
        )


class DeterministicPolicy(nn.Module):
    """Raw observations -> the deterministic action, as ``PPO.act_inference`` computes it, then
    clamped to the action space's bounds as the env adapters clamp it."""

    def __init__(self, agent: ActorCritic, norm: Optional[ObsNormalizer], space: gym.Space):
        super().__init__()
        self.agent, self.norm = agent, norm
        self.box = isinstance(space, gym.spaces.Box)
        if self.box:
            self.register_buffer("low", torch.as_tensor(space.low, dtype=torch.float32).flatten())
            self.register_buffer("high", torch.as_tensor(space.high, dtype=torch.float32).flatten())

    def forward(self, obs: Obs) -> torch.Tensor:
        obs = as_float(obs)
        action = self.agent.action(obs if self.norm is None else self.norm(obs), deterministic=True)
        return torch.clamp(action, self.low, self.high) if self.box else action


def action_space(desc: str) -> gym.Space:
    """The action space a checkpoint names (its ``action_space`` entry: gymnasium's repr)."""
    if m := re.fullmatch(r"Discrete\((\d+)(?:, start=(-?\d+))?\)", desc):
        return gym.spaces.Discrete(int(m[1]), start=int(m[2] or 0))
    m = re.fullmatch(r"Box\((.+?), (.+?), \(([\d, ]*)\), (\w+)\)", desc, re.S)
    if m is None:
        raise ConfigError(f"action space {desc} cannot be exported: Box or Discrete only")
    shape = tuple(int(n) for n in m[3].replace(",", " ").split())
    # a bound is one number (all equal) or numpy's print of the array
    low, high = (
        np.resize(np.array(re.findall(r"[^\s\[\]]+", s), m[4]), shape) for s in m.group(1, 2)
    )
    return gym.spaces.Box(low, high, shape, np.dtype(m[4]))


def policy_of(data: Dict[str, Any]) -> DeterministicPolicy:
    """The deterministic policy of a checkpoint's verified contents (no critic)."""
    algo, space = data["config"]["algo"], action_space(data["action_space"])
    hidden, encoder = list(algo["hidden_sizes"]), algo.get("encoder", "mlp")  # (older: no key)
    agent = ActorCritic(data["obs_shape"], space, hidden, algo["activation"], encoder=encoder)
    agent.load_state_dict(data["ppo"]["agent"])
    del agent.critic
    norm, stats = None, data["ppo"].get("obs_norm")
    if stats is not None:  # of the state part alone, for a pixel observation
        norm = ObsNormalizer(tuple(stats["mean"].shape))
        norm.load_state_dict(stats)
    return DeterministicPolicy(agent, norm, space).eval()


class LoadedPolicy:
    """``policy(obs) -> action``: a torch tensor for a torch tensor (on its device), a numpy
    array otherwise; ``meta``: the export's policy.json (None for a checkpoint)."""

    def __init__(self, run, meta: Optional[Dict[str, Any]] = None):
        self.run, self.meta, self.device = run, meta, torch.device("cpu")

    def __call__(self, obs):
        x = as_float(map_obs(torch.as_tensor, obs))
        device = first(x).device
        if isinstance(self.run, nn.Module) and device != self.device:  # moved once
            self.device = device
            self.run.to(device)
        with torch.no_grad():
            action = self.run(x)
        return action.to(device) if torch.is_tensor(first(obs)) else action.cpu().numpy()


def _is_export(path: Path) -> bool:
    if path.suffix == ".onnx" or not zipfile.is_zipfile(path):
        return path.suffix == ".onnx"
    with zipfile.ZipFile(path) as z:  # TorchScript
        return any(n.endswith("/constants.pkl") for n in z.namelist())


def load_policy(path) -> LoadedPolicy:
    """The deterministic policy of an rlrec checkpoint (``checkpoints/*.pt``, verified as any
    load is) or of an export (``exported/policy.pt``, ``exported/policy.onnx``)."""
    p = Path(path)
    ckpt.check_exists(p, "load_policy")
    if not _is_export(p):
        return LoadedPolicy(policy_of(ckpt.load(p, "load_policy")))
    meta = json.loads((p.parent / META).read_text()) if (p.parent / META).is_file() else None
    if p.suffix != ".onnx":
        return LoadedPolicy(torch.jit.load(str(p), map_location="cpu"), meta)
    need_extra("onnxruntime", f"running {p}")
    from rlrec.onnx_policy import OnnxPolicy

    onnx_policy = OnnxPolicy(p)
    return LoadedPolicy(
        lambda x: torch.from_numpy(onnx_policy(map_obs(lambda v: v.cpu().numpy(), x))), meta
    )


def start_data(path, eval_only: bool) -> Optional[Dict[str, Any]]:
    """What ``eval_only=true checkpoint=PATH`` reads of an export (its step, its spaces and its
    policy, from the policy.json beside it); None when ``PATH`` is no export."""
    p = Path(path)
    if not p.is_file() or not _is_export(p):
        return None
    if not eval_only:
        raise ConfigError(
            f"checkpoint={p} is an export: eval_only=true evaluates it; training "
            "continues from a checkpoint (<run dir>/checkpoints/*.pt)"
        )
    if not (p.parent / META).is_file():
        raise ConfigError(f"checkpoint={p} is an export without its {META} beside it: export again")
    policy = load_policy(p)
    meta = policy.meta
    return {
        "global_step": meta["step"],
        "iteration": meta["iteration"],
        "obs_shape": shape_of(meta["observation_space"]["shape"]),
        "action_space": meta["action_space"]["repr"],
        "env_name": meta["env"],
        "policy": policy,
    }
