"""Adam without ``torch.optim``: the same update, minus a 1-1.6 s start-up cost.

Every public method of ``torch.optim.Optimizer`` (constructor included) lazily imports
``torch._dynamo`` (~1 s of a few-second CartPole run). This class does the arithmetic of torch's
single-tensor Adam (the one it runs on CPU; amsgrad, weight decay and maximize left out) op for op,
so results are bit-identical there, and its ``state_dict`` has ``torch.optim.Adam``'s layout.
"""

from __future__ import annotations

from typing import Iterable, List

import torch


class Adam:
    """``torch.optim.Adam(params, lr, betas, eps)`` for one parameter group."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params: List[torch.Tensor] = list(params)
        self.param_groups = [{"params": self.params, "lr": lr, "betas": tuple(betas), "eps": eps,
                              "weight_decay": 0, "amsgrad": False, "maximize": False, "foreach": None,
                              "capturable": False, "differentiable": False, "fused": None,
                              "decoupled_weight_decay": False}]
        self.state: dict = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        for p in self.params:
            if p.grad is None:
                continue
            st = self.state.get(p)
            if st is None:
                st = self.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                      "exp_avg_sq": torch.zeros_like(p)}
            grad, exp_avg, exp_avg_sq = p.grad, st["exp_avg"], st["exp_avg_sq"]
            st["step"] += 1
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = st["step"].item()
            step_size = lr / (1 - beta1**step)
            bias_correction2_sqrt = (1 - beta2**step) ** 0.5
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
            p.addcdiv_(exp_avg, denom, value=-step_size)

    def state_dict(self) -> dict:
        """``torch.optim.Adam.state_dict()``'s layout: state keyed by parameter index."""
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(self.params)))
        state = {i: {k: v.clone() for k, v in self.state[p].items()}
                 for i, p in enumerate(self.params) if p in self.state}
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            raise ValueError("optimizer state does not match the model's parameters")
        self.param_groups[0].update({k: v for k, v in groups[0].items() if k != "params"})
        self.param_groups[0]["betas"] = tuple(self.param_groups[0]["betas"])
        self.state = {}
        for i, p in enumerate(self.params):
            st = state_dict["state"].get(i)
            if st is not None:
                self.state[p] = {"step": st["step"].detach().clone().float().cpu(),
                                 "exp_avg": st["exp_avg"].detach().to(p.device, p.dtype).clone(),
                                 "exp_avg_sq": st["exp_avg_sq"].detach().to(p.device, p.dtype).clone()}
