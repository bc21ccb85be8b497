"""AdamW (Loshchilov & Hutter, decoupled weight decay) with multi-tensor `torch._foreach_*` operations in
torch.optim.AdamW(foreach=True)'s order, so the two agree to float rounding and cost the same (docs/model.md).
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
            params = [p for p in group["params"] if p.grad is not None]  # no gradient: no update, no state
            if not params:
                continue
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError("AdamW does not support sparse gradients")
            for p in params:
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
            grads = [p.grad for p in params]
            exp_avgs = [self.state[p]["exp_avg"] for p in params]
            exp_avg_sqs = [self.state[p]["exp_avg_sq"] for p in params]
            lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            if weight_decay:
                torch._foreach_mul_(params, 1 - lr * weight_decay)
            torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
            torch._foreach_mul_(exp_avg_sqs, beta2)
            torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
            # bias corrections per parameter: one that had no gradient on some steps has a smaller step count
            steps = [self.state[p]["step"] for p in params]
            neg_step_sizes = [-lr / (1 - beta1 ** t) for t in steps]
            denom = torch._foreach_sqrt(exp_avg_sqs)
            torch._foreach_div_(denom, [math.sqrt(1 - beta2 ** t) for t in steps])
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(params, exp_avgs, denom, neg_step_sizes)
        return loss
