"""rlrec's FusedAdam: torch.optim.Adam(fused=True)'s updates bit for bit and its checkpoint layout,
without importing torch._dynamo (what torch.optim's first step does: seconds of start-up)."""

from __future__ import annotations

import copy
import subprocess
import sys

import torch

from rlrec.ppo.adam import FusedAdam
from tests.helpers import REPO


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _steps(model, opt, n, seed=1, lrs=(1e-3, 5e-4, 2e-4)):
    gen = torch.Generator().manual_seed(seed)
    for i in range(n):
        opt.param_groups[0]["lr"] = lrs[i % len(lrs)]
        x = torch.randn(16, 5, generator=gen)
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()


def test_fused_adam_steps_as_torch_adam_fused_and_checkpoints_load_across():
    ours, theirs = _model(), _model()
    a = FusedAdam(ours.parameters(), lr=1e-3, eps=1e-5)
    b = torch.optim.Adam(theirs.parameters(), lr=1e-3, eps=1e-5, fused=True)
    _steps(ours, a, 5)
    _steps(theirs, b, 5)
    for p, q in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(p, q)
    sa, sb = copy.deepcopy(a.state_dict()), copy.deepcopy(b.state_dict())  # loads alias tensors
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for k in sa["state"]:
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(sa["state"][k][name], sb["state"][k][name])
    # each loads the other's state and then keeps stepping as the other would
    ours2, theirs2 = _model(3), _model(3)
    ours2.load_state_dict(theirs.state_dict())
    theirs2.load_state_dict(ours.state_dict())
    a2 = FusedAdam(ours2.parameters(), lr=0.1, eps=0.1)
    a2.load_state_dict(sb)
    b2 = torch.optim.Adam(theirs2.parameters(), lr=0.1, eps=0.1, fused=True)
    b2.load_state_dict(sa)
    assert a2.param_groups[0]["eps"] == 1e-5 and b2.param_groups[0]["eps"] == 1e-5
    _steps(ours2, a2, 3, seed=2)
    _steps(theirs2, b2, 3, seed=2)
    _steps(theirs, b, 3, seed=2)
    for p, q, r in zip(ours2.parameters(), theirs2.parameters(), theirs.parameters()):
        assert torch.equal(p, q) and torch.equal(p, r)


def test_an_eager_ppo_update_on_the_cpu_does_not_import_torch_dynamo():
    """A rollout (with time-outs bootstrapped), a reload of PPO's state and an update."""
    code = (
        "import sys\n"
        "from rlrec.envs.autoreset import AutoReset\n"
        "from rlrec.envs.builtin import PointReach\n"
        "from tests.ppo import make_ppo, rollout\n"
        "env = AutoReset(PointReach(8, max_episode_steps=3))\n"
        "ppo = make_ppo(env, num_steps=4)\n"
        "rollout(ppo, env)\n"
        "ppo.load_state_dict(ppo.state_dict())\n"
        "assert ppo.update()['loss/updates'] > 0\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
