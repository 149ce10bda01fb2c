"""An exported policy with onnxruntime and numpy alone (no torch, no other part of rlrec):

    from rlrec.onnx_policy import OnnxPolicy   # or copy this file next to your code
    policy = OnnxPolicy("RUN_DIR/exported/policy.onnx")   # policy.json beside it
    action = policy(obs)   # obs: float32 [batch, *shape], or {"rgb": uint8, "state": float32}

``action``: a numpy array, the deterministic action of ``python -m rlrec.export`` (float32, the
Box's bounds applied; int64 for a Discrete space). ``policy.meta``: the export's policy.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Union

import numpy as np

Observation = Union[np.ndarray, Dict[str, np.ndarray]]


class OnnxPolicy:
    """``policy(obs) -> action`` of an ``exported/policy.onnx`` (docs/export.md)."""

    def __init__(self, path: Union[str, Path]):
        import onnxruntime  # the one dependency beside numpy

        path = Path(path)
        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]  # "obs", or "rgb" / "state"
        meta = path.parent / "policy.json"
        self.meta: Any = json.loads(meta.read_text()) if meta.is_file() else None

    def __call__(self, obs: Observation) -> np.ndarray:
        given = obs if isinstance(obs, dict) else {"obs": obs}
        feed = {
            k: np.ascontiguousarray(given[k], dtype=np.uint8 if k == "rgb" else np.float32)
            for k in self.inputs
        }
        return self.session.run(None, feed)[0]
