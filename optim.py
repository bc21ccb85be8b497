"""AdamW (Loshchilov & Hutter, decoupled weight decay) with multi-tensor `torch._foreach_*` operations, in the order
torch.optim.AdamW(foreach=True) uses, so the two agree to float rounding and cost the same (docs/model.md).
"""
from __future__ import annotations

import math
from typing import Callable, Iterable

import torch


class AdamW(torch.optim.Optimizer):
    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"lr, eps and weight_decay must be >= 0 (got {lr}, {eps}, {weight_decay})")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:  # frozen or unused this step: no update, no state
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                steps.append(state["step"])
            if params:
                _adamw_foreach(params, grads, exp_avgs, exp_avg_sqs, steps, lr=group["lr"], betas=group["betas"],
                               eps=group["eps"], weight_decay=group["weight_decay"])
        return loss


def _adamw_foreach(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                   exp_avg_sqs: list[torch.Tensor], steps: list[int], *, lr: float, betas: tuple[float, float],
                   eps: float, weight_decay: float) -> None:
    beta1, beta2 = betas
    if weight_decay:
        torch._foreach_mul_(params, 1 - lr * weight_decay)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    # Bias corrections per parameter: a parameter that had no gradient on some steps has a smaller step count.
    neg_step_sizes = [-lr / (1 - beta1 ** t) for t in steps]
    bias_correction2_sqrt = [math.sqrt(1 - beta2 ** t) for t in steps]
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, bias_correction2_sqrt)
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(params, exp_avgs, denom, neg_step_sizes)
