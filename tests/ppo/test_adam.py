"""rlrec's Adam matches torch.optim.Adam bit for bit, state_dict included."""

import copy

import torch

from rlrec.ppo.adam import Adam


def _train(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for i in range(steps):
        x = torch.randn(32, 4, generator=g)
        opt.zero_grad(set_to_none=True)
        (model(x) ** 2).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        for group in opt.param_groups:
            group["lr"] = 1e-3 * (1 - i / steps)
        opt.step()


def test_matches_torch_adam_and_state_dict_interchanges():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    ours = copy.deepcopy(ref)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-3, eps=1e-5)
    our_opt = Adam(ours.parameters(), lr=1e-3, eps=1e-5)
    _train(ref, ref_opt, 20, 1)
    _train(ours, our_opt, 20, 1)
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), ours.parameters()))
    ref_sd, our_sd = ref_opt.state_dict(), our_opt.state_dict()
    assert ref_sd["param_groups"][0].keys() == our_sd["param_groups"][0].keys()
    for i, st in ref_sd["state"].items():
        assert st.keys() == our_sd["state"][i].keys()
        assert all(torch.equal(v, our_sd["state"][i][k]) for k, v in st.items())
    # resume: a fresh Adam loaded from torch's state continues identically
    resumed = Adam(ours.parameters(), lr=1.0)
    resumed.load_state_dict(ref_sd)
    _train(ref, ref_opt, 5, 2)
    _train(ours, resumed, 5, 2)
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), ours.parameters()))
