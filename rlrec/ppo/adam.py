"""Adam on torch's fused kernel, without ``torch.optim``'s start-up cost.

``torch.optim.Adam`` imports ``torch._dynamo`` the first time it steps (its ``step`` and
``zero_grad`` are wrapped by ``torch._disable_dynamo``, which imports it lazily; torch 2.13,
torch/_compile.py and torch/optim/optimizer.py ``_use_grad_for_differentiable``). That import
costs about as much as ``import torch`` itself, seconds on a small machine, which is a large part
of a short run. :class:`FusedAdam` calls the kernel ``torch.optim.Adam(fused=True)`` calls, the same
way (``torch._foreach_add_`` on the step counts, then ``torch._fused_adam_``; torch/optim/adam.py
``_fused_adam``), so its updates are bit for bit those of ``torch.optim.Adam(fused=True)``, and
its ``state_dict`` has that optimizer's layout: a checkpoint loads into either.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable

import torch


def fused_available(device: torch.device) -> bool:
    """Whether torch has the fused Adam kernel for ``device`` (the CPU and CUDA)."""
    return device.type in ("cpu", "cuda") and hasattr(torch, "_fused_adam_")


# what FusedAdam's steps are: Adam's own, without its options
_PLAIN = {"amsgrad": False, "weight_decay": 0.0, "maximize": False}
_STATE = ("step", "exp_avg", "exp_avg_sq")  # a parameter's state, as torch.optim.Adam's


class FusedAdam:
    """Adam (no weight decay, no AMSGrad) over one parameter group, float learning rate."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, eps: float = 1e-8):
        self.params = list(params)
        # torch.optim.Adam's group keys (its default betas), so a state_dict loads into either
        group = {"params": self.params, "lr": lr, "betas": (0.9, 0.999), "eps": eps}
        off = ("amsgrad", "maximize", "capturable", "differentiable", "decoupled_weight_decay")
        group.update(dict.fromkeys(off, False), weight_decay=0, foreach=None, fused=True)
        self.param_groups = [group]
        # per parameter (made at its first step, as torch.optim does): step, exp_avg, exp_avg_sq
        self.state = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drops the gradients (``set_to_none``: torch.optim's signature; they are never zeroed)."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        params = [p for p in self.params if p.grad is not None]
        if not params:
            return
        for p in params:
            if p not in self.state:  # made at its first step, as torch.optim does
                zeros = torch.zeros_like(p, memory_format=torch.preserve_format)
                step = torch.zeros((), dtype=torch.float32, device=p.device)
                self.state[p] = {"step": step, "exp_avg": zeros, "exp_avg_sq": zeros.clone()}
        steps, avgs, sqs = ([self.state[p][k] for p in params] for k in _STATE)
        (beta1, beta2), lr, eps = group["betas"], float(group["lr"]), group["eps"]
        torch._foreach_add_(steps, 1)
        grads = [p.grad for p in params]
        torch._fused_adam_(
            params, grads, avgs, sqs, [], steps, lr=lr, beta1=beta1, beta2=beta2, eps=eps, **_PLAIN
        )

    def state_dict(self) -> Dict[str, Any]:
        """``torch.optim.Adam``'s layout: the state by parameter index, the group without its
        parameters (their indices instead)."""
        index = {id(p): i for i, p in enumerate(self.params)}
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(self.params)))
        return {
            "state": {index[id(p)]: dict(s) for p, s in self.state.items()},
            "param_groups": [group],
        }

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads a state of this optimizer or of ``torch.optim.Adam`` over the same parameters
        (one group): tensors moved to each parameter's device, ``step`` as float32 (what the fused
        kernel reads), the group's hyper-parameters taken as saved."""
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            raise ValueError(
                "loaded optimizer state does not match this optimizer's parameters: "
                f"{[len(g['params']) for g in groups]} against one group of {len(self.params)}"
            )
        saved = groups[0]
        ids = saved["params"]
        self.state = {}
        for key, value in state_dict["state"].items():
            p = self.params[ids.index(key)]
            dtypes = zip(_STATE, (torch.float32, p.dtype, p.dtype))
            self.state[p] = {k: value[k].to(dtype=d, device=p.device) for k, d in dtypes}
        betas = tuple(float(b) for b in saved["betas"])
        self.param_groups[0].update(lr=float(saved["lr"]), betas=betas, eps=saved["eps"])
