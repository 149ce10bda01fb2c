"""A run's policy for a robot or a user's own loop: ``python -m rlrec.export RUN_DIR
[export.step=S] [export.format=torchscript|onnx|both]`` (``rlrec-export``) writes, in the run
dir's ``exported/``, the deterministic policy of the checkpoint of step ``S`` (default: the last)
as TorchScript (``policy.pt``) and/or ONNX (``policy.onnx``, the ``export`` extra), with
``policy.json`` beside it. The policy takes raw observations ``float32 [batch, *obs_shape]``,
or a pixel observation's dict (rlrec/obs.py: ONNX inputs ``rgb`` uint8, ``state`` float32),
(any batch size) and returns the Gaussian's mean clamped to the action space's bounds, or the
categorical's argmax (int64): the observation normaliser is folded in. The format, and
:func:`load_policy`, are rlrec/train/policy.py's.
"""

from __future__ import annotations

import hashlib
import io
import json
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

import gymnasium as gym
import numpy as np
import torch

from rlrec import __version__
from rlrec.checks import Choice, ConfigError, one_of
from rlrec.files import write_atomic
from rlrec.layout import RunDir
from rlrec.obs import Obs, as_float, map_obs
from rlrec.train import checkpoint as ckpt
from rlrec.train.policy import (
    FILES,
    META,
    DeterministicPolicy,
    action_space,
    load_policy,
    need_extra,
    policy_of,
)

__all__ = ["ExportFormat", "export", "load_policy"]
OPSET = 17  # onnxruntime >= 1.13 runs it


class ExportFormat(Choice):
    torchscript = "torchscript"
    onnx = "onnx"
    both = "both"

    def kinds(self) -> List[str]:
        return [str(self)] if self != ExportFormat.both else list(FILES)


def _blob(policy: DeterministicPolicy, example: Obs, kind: str) -> bytes:
    """The file of ``policy`` in format ``kind``, traced with ``example``."""
    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy ONNX exporter's notes
        if kind == ExportFormat.torchscript:
            torch.jit.save(torch.jit.trace(policy, (example,), check_trace=False), buf)
            return buf.getvalue()
        import onnx

        names = list(example) if isinstance(example, dict) else ["obs"]
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
    return buf.getvalue()


def _space(space: gym.Space) -> Dict[str, Any]:
    """policy.json's description of the action space (infinite bounds as null)."""
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start), "dtype": "int64"}
    low, high = (np.where(np.isfinite(b), b, None).tolist() for b in (space.low, space.high))
    return {"type": "Box", "shape": list(space.shape), "dtype": "float32", "low": low, "high": high}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def export(run_dir, step: Optional[int] = None, fmt: str = "torchscript") -> List[Path]:
    """Writes ``exported/`` of ``run_dir`` (the files of ``fmt``, then policy.json) and returns
    the paths written. Everything is checked before anything is written: the format's extra, the
    checkpoint (missing, damaged), and an earlier export of another step (never replaced)."""
    one_of(fmt, "export.format", ExportFormat.values())
    kinds = ExportFormat(fmt).kinds()
    if "onnx" in kinds:
        need_extra("onnx", "export.format=onnx")
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
    blobs = {FILES[k]: _blob(policy, example, k) for k in kinds}
    out.mkdir(exist_ok=True)
    for name, blob in blobs.items():
        write_atomic(out / name, blob)
    norm = policy.norm
    stats = None if norm is None else {k: v.tolist() for k, v in norm.state_dict().items()}
    meta = {
        "step": data["global_step"],
        "iteration": data["iteration"],
        "env": data["env_name"],
        "observation_space": {
            "shape": map_obs(list, data["obs_shape"]),
            "dtype": map_obs(lambda t: str(t.dtype).removeprefix("torch."), example),
        },
        "action_space": {
            **_space(action_space(data["action_space"])),
            "repr": data["action_space"],
        },
        "normalizer": stats and {**stats, "eps": norm.eps, "clip": norm.clip},
        "checkpoint": {
            "path": str(path.relative_to(run_dir)),
            "sha256": _sha256(path.read_bytes()),
        },
        "files": {**old.get("files", {}), **{n: {"sha256": _sha256(b)} for n, b in blobs.items()}},
        "onnx_opset": OPSET,
        "rlrec_version": __version__,
        "torch_version": torch.__version__,
        "config": data["config"],
    }
    write_atomic(out / META, json.dumps(meta, indent=2) + "\n")
    return [out / n for n in blobs] + [out / META]
