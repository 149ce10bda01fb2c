"""rlrec.onnx_policy: an export's policy.onnx and policy.json act, in a venv of onnxruntime and
numpy alone (no torch), as the checkpoint does (within onnxruntime's rounding), for a state policy
and a pixel policy (rgb_state, algo.encoder=cnn)."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
import torch

from rlrec.export import export
from rlrec.train.runner import Runner
from tests.base_venv import onnx_python
from tests.helpers import FAST, REPO, make_config
from tests.test_export import sampled

pytest.importorskip("onnx", reason="needs the export extra: pip install 'rlrec[export]'")

RUNS = {
    "state": [],
    "pixels": ["env.obs_mode=rgb_state", "env.obs_width=36", "env.obs_height=36"]
    + ["algo.encoder=cnn", "env.num_envs=4"],
}
ACT = """
import json, sys
import numpy as np
from rlrec.onnx_policy import OnnxPolicy
policy = OnnxPolicy(sys.argv[1])
obs = dict(np.load(sys.argv[2]))
action = policy(obs["obs"] if list(obs) == ["obs"] else obs)
np.save(sys.argv[3], action)
bad = [m for m in sys.modules if m.split(".")[0] in ("torch", "hydra", "omegaconf", "gymnasium")]
print(json.dumps({"meta_step": policy.meta["step"], "dtype": str(action.dtype), "loaded": bad}))
"""


@pytest.mark.parametrize("kind", list(RUNS))
def test_onnx_policy_acts_without_torch(tmp_path, kind):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    quiet = ["total_steps=128", "recorder=none", "eval_env.enabled=false"]
    Runner(make_config([*FAST, *RUNS[kind], *quiet]), run_dir).run()
    export(run_dir, fmt="onnx")
    obs, act = sampled(run_dir, RUNS[kind], n=64)
    want = act(obs)
    arrays = {k: v.numpy() for k, v in (obs if isinstance(obs, dict) else {"obs": obs}).items()}
    np.savez(tmp_path / "obs.npz", **arrays)
    python = onnx_python()
    no_torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True)
    assert no_torch.returncode != 0, "the venv holds torch"
    files = [run_dir / "exported" / "policy.onnx", tmp_path / "obs.npz", tmp_path / "action.npy"]
    proc = subprocess.run(
        [str(python), "-c", ACT, *map(str, files)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},  # rlrec from the checkout: not installed
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"meta_step": 128, "dtype": "float32", "loaded": []}
    got = np.load(tmp_path / "action.npy")
    diff = float(np.abs(got.astype(np.float64) - want.numpy()).max())
    assert got.shape == tuple(want.shape) and diff <= 1e-5, diff
    assert not torch.equal(want, want[:1].expand_as(want)), "the observations vary the action"
