"""A run's policy for a robot or a user's own loop: ``python -m rlrec.export RUN_DIR
[export.step=S] [export.format=torchscript|onnx|both]`` (``rlrec-export``) writes, in the run
dir's ``exported/``, the deterministic policy of the checkpoint of step ``S`` (default: the last)
as TorchScript (``policy.pt``) and/or ONNX (``policy.onnx``, the ``export`` extra), with
``policy.json`` beside it. The policy takes raw observations ``float32 [batch, *obs_shape]``,
or a pixel observation's dict (rlrec/obs.py: ONNX inputs ``rgb`` uint8, ``state`` float32),
(any batch size) and returns the Gaussian's mean clamped to the action space's bounds, or the
categorical's argmax (int64): the observation normaliser is folded in.

:func:`load_policy` turns a checkpoint or an export into a callable ``obs -> action`` (no Hydra,
no simulator); ``eval_only=true checkpoint=EXPORT`` evaluates an export (:func:`start_data`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlrec import __version__
from rlrec.checks import Choice, ConfigError, one_of
from rlrec.files import write_atomic
from rlrec.layout import RunDir
from rlrec.obs import Obs, as_float, first, map_obs, shape_of
from rlrec.ppo.agent import ActorCritic, ObsNormalizer
from rlrec.train import checkpoint as ckpt

OPSET = 17  # onnxruntime >= 1.13 runs it
FILES = {"torchscript": "policy.pt", "onnx": "policy.onnx"}
META = "policy.json"
EXTRA = "pip install 'rlrec[export]' (or pip install -e '.[export]' in a checkout)"


class ExportFormat(Choice):
    torchscript = "torchscript"
    onnx = "onnx"
    both = "both"


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


def _need(module: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"{what} needs the 'export' extra ({module} is missing): {EXTRA}")


def _is_torchscript(path: Path) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        return any(n.endswith("/constants.pkl") for n in z.namelist())


def load_policy(path) -> LoadedPolicy:
    """The deterministic policy of an rlrec checkpoint (``checkpoints/*.pt``, verified as any
    load is) or of an export (``exported/policy.pt``, ``exported/policy.onnx``)."""
    p = Path(path)
    ckpt.check_exists(p, "load_policy")
    meta_path = p.parent / META
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else None
    if p.suffix == ".onnx":
        _need("onnxruntime", f"running {p}")
        from rlrec.onnx_policy import OnnxPolicy

        onnx_policy = OnnxPolicy(p)

        def run(x: Obs) -> torch.Tensor:
            return torch.from_numpy(onnx_policy(map_obs(lambda v: v.cpu().numpy(), x)))

        return LoadedPolicy(run, meta)
    if _is_torchscript(p):
        return LoadedPolicy(torch.jit.load(str(p), map_location="cpu"), meta)
    return LoadedPolicy(policy_of(ckpt.load(p, "load_policy")))


def start_data(path, eval_only: bool) -> Optional[Dict[str, Any]]:
    """What ``eval_only=true checkpoint=PATH`` reads of an export (its step, its spaces and its
    policy, from the policy.json beside it); None when ``PATH`` is no export."""
    p = Path(path)
    if not p.is_file() or not (p.suffix == ".onnx" or _is_torchscript(p)):
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


def _blobs(policy: DeterministicPolicy, example: Obs, kinds: List[str]) -> Dict[str, bytes]:
    """The files of ``policy`` in each format of ``kinds``, traced with ``example``, by name."""
    names = list(example) if isinstance(example, dict) else ["obs"]
    blobs: Dict[str, bytes] = {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy ONNX exporter's notes
        if "torchscript" in kinds:
            buf = io.BytesIO()
            torch.jit.save(torch.jit.trace(policy, (example,), check_trace=False), buf)
            blobs[FILES["torchscript"]] = buf.getvalue()
        if "onnx" in kinds:
            import onnx

            buf = io.BytesIO()
            torch.onnx.export(
                policy,
                (example, {}),  # (a dict last would be read as keyword arguments)
                buf,
                input_names=names,
                output_names=["action"],
                dynamic_axes={n: {0: "batch"} for n in [*names, "action"]},
                opset_version=OPSET,
                dynamo=False,
            )
            onnx.checker.check_model(onnx.load_from_string(buf.getvalue()))
            blobs[FILES["onnx"]] = buf.getvalue()
    return blobs


# ---------------------------------------------------------------------- the export
def export(run_dir, step: Optional[int] = None, fmt: str = "torchscript") -> List[Path]:
    """Writes ``exported/`` of ``run_dir`` (the files of ``fmt``, then policy.json) and returns
    the paths written. Everything is checked before anything is written: the format's extra, the
    checkpoint (missing, damaged), and an earlier export of another step (never replaced)."""
    one_of(fmt, "export.format", ExportFormat.values())
    kinds = ["torchscript", "onnx"] if fmt == ExportFormat.both else [str(fmt)]
    if "onnx" in kinds:
        _need("onnx", "export.format=onnx")
    path, data = ckpt.of_step(RunDir(run_dir).checkpoints, step, "export.step")
    out = RunDir(run_dir).exported
    old = json.loads((out / META).read_text()) if (out / META).is_file() else {}
    if old and old["step"] != data["global_step"]:
        raise ConfigError(
            f"{out} holds the export of step {old['step']}, which an export of step "
            f"{data['global_step']} would replace: move it aside first "
            f"(mv {out} {out}-step{old['step']})"
        )
    policy = policy_of(data)
    example = as_float(map_obs(lambda s: torch.zeros(1, *s, dtype=torch.uint8), data["obs_shape"]))
    blobs = _blobs(policy, example, kinds)
    out.mkdir(exist_ok=True)
    for name, blob in blobs.items():
        write_atomic(out / name, blob)
    norm, space = policy.norm, action_space(data["action_space"])
    stats = None if norm is None else {k: v.tolist() for k, v in norm.state_dict().items()}
    if isinstance(space, gym.spaces.Discrete):
        kind = {"type": "Discrete", "n": int(space.n), "start": int(space.start), "dtype": "int64"}
    else:  # bounds: infinite ones as null
        low, high = (np.where(np.isfinite(b), b, None).tolist() for b in (space.low, space.high))
        kind = {"type": "Box", "shape": list(space.shape), "dtype": "float32"}
        kind.update(low=low, high=high)
    dtypes = map_obs(lambda t: str(t.dtype).removeprefix("torch."), example)  # float32, uint8
    meta = {
        "step": data["global_step"],
        "iteration": data["iteration"],
        "env": data["env_name"],
        "observation_space": {"shape": map_obs(list, data["obs_shape"]), "dtype": dtypes},
        "action_space": {**kind, "repr": data["action_space"]},
        "normalizer": stats and {**stats, "eps": norm.eps, "clip": norm.clip},
        "checkpoint": {
            "path": str(path.relative_to(run_dir)),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        },
        "files": {
            **old.get("files", {}),
            **{n: {"sha256": hashlib.sha256(b).hexdigest()} for n, b in blobs.items()},
        },
        "onnx_opset": OPSET,
        "rlrec_version": __version__,
        "torch_version": torch.__version__,
        "config": data["config"],
    }
    write_atomic(out / META, json.dumps(meta, indent=2) + "\n")
    return [out / n for n in blobs] + [out / META]
