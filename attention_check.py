"""Is an attention implementation right? Its output and the gradients of Q, K and V, on the very inputs it is
about to be timed on, against a float64 reference, before any timing: a fast kernel that computes something else
must not make a table look good.

The reference is causal softmax(Q K^T / sqrt(d)) V written out in float64, a block of queries at a time, so that it
needs memory linear in the sequence length (a block's scores, not seq x seq) and runs at 65536 tokens: each block's
forward and backward go through autograd, dQ of the block is its own, dK and dV are summed over the blocks.
float64 rather than fp32: its rounding (1e-16) is nothing next to the tolerances below, and TF32 never applies to it,
whatever the process's matmul precision says.

The error of each tensor is max |x - ref| / (1 + |ref|) over its elements: an absolute error where values are below 1,
a relative one above. Passing means every element meets |x - ref| <= tol * (1 + |ref|), which is
torch.testing.assert_close with atol = rtol = tol. The tolerance depends on the dtype the kernel computes in:

- fp32: 1e-2, the handout's own tests (tests/test_attention.py: assert_close(rtol=1e-2, atol=1e-2), fp32 inputs).
  It leaves room for Triton's tl.dot, which multiplies fp32 in TF32 by default (10-bit mantissa, unit roundoff
  2^-11 ~ 4.9e-4): such a kernel is about 8x less exact than bf16's 2^-8, and bf16 errors stay under 1.5e-2 (below).
  An fp32 kernel without TF32 is off by about 1e-6 (PyTorch's SDPA on this CPU: 1e-7 to 2e-6, seq 128 to 2048).
- bf16: 5e-2. The inputs are the same bf16 numbers for both sides, so what differs is the rounding of the kernel's
  intermediates (probabilities, dS) and of its bf16 outputs. PyTorch's own attention in bf16 (model.naive_attention
  on this CPU, torch 2.13, seq 128 to 8192, d 16 to 128, randn inputs) reaches 4e-3 to 1.5e-2 by this measure, so
  the handout's 1e-2 would fail PyTorch itself; 5e-2 leaves it 3x margin and still catches a wrong mask, scale or
  softmax, whose errors are of order 1.

What this cannot see: an error confined to entries much smaller than 1 that stays under the tolerance (a missing
term in the gradient of a late key, whose gradient is small, at a long sequence). The handout's tests at 128 tokens
remain the place to find such bugs; this check makes sure that what gets timed computes attention.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from common import is_oom

# max |x - ref| / (1 + |ref|) that passes, by the dtype of the inputs (see the module docstring)
TOLERANCE = {"fp32": 1e-2, "bf16": 5e-2}
METRIC = "max |x - ref| / (1 + |ref|)"
TENSORS = ("out", "dq", "dk", "dv")
# memory of one block of the reference: this many float64 (batch, block, seq) tensors (scores, masked scores,
# probabilities and their gradients) within REFERENCE_BLOCK_BYTES
REFERENCE_BLOCK_BYTES = 256 * 2**20
REFERENCE_BLOCK_TENSORS = 6


class ImplementationError(Exception):
    """The implementation under test failed or returned something that is not attention's output or gradients;
    the message is one line and names the implementation."""


def reference_bytes(batch: int, seq: int, d: int) -> int:
    """Memory the check holds at its peak: float64 copies of Q, K, V, the output gradient and the reference's four
    results (8 x batch x seq x d x 8 B), plus one block of scores."""
    return 8 * batch * seq * d * 8 + REFERENCE_BLOCK_BYTES


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        grad_out: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Causal attention and its gradients in float64, a block of queries at a time: (out, dq, dk, dv), each
    (batch, seq, d) like q. Query i sees keys 0..i, so a block of queries ending at `stop` needs keys [0, stop)."""
    batch, seq, d = q.shape
    q64, k64, v64, g64 = (t.detach().to(torch.float64) for t in (q, k, v, grad_out))
    out, dq = torch.empty_like(q64), torch.empty_like(q64)
    dk, dv = torch.zeros_like(k64), torch.zeros_like(v64)
    rows = max(1, REFERENCE_BLOCK_BYTES // (REFERENCE_BLOCK_TENSORS * batch * seq * 8))
    positions = torch.arange(seq, device=q.device)
    for start in range(0, seq, rows):
        stop = min(seq, start + rows)
        qb, kb, vb = (t.detach().requires_grad_() for t in (q64[:, start:stop], k64[:, :stop], v64[:, :stop]))
        with torch.enable_grad():
            scores = qb @ kb.transpose(-2, -1) / math.sqrt(d)  # (batch, block, stop)
            future = positions[None, :stop] > positions[start:stop, None]  # key after query: masked
            probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            block_out = probs @ vb
            gq, gk, gv = torch.autograd.grad(block_out, (qb, kb, vb), g64[:, start:stop])
        out[:, start:stop] = block_out.detach()
        dq[:, start:stop] = gq
        dk[:, :stop] += gk
        dv[:, :stop] += gv
    return out, dq, dk, dv


def max_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| / (1 + |ref|), in float64; inf if x has a NaN or an infinity."""
    error = (x.to(torch.float64) - ref).abs() / (1 + ref.abs())
    return float(error.nan_to_num(nan=math.inf).max())


def run_implementation(attention: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...],
                       grad_out: torch.Tensor, name: str) -> tuple[torch.Tensor, ...]:
    """(out, dq, dk, dv) of the implementation, each checked to be a tensor shaped, typed and placed like its input.
    Anything wrong is an ImplementationError naming `name`; an out-of-memory error stays one (the row says OOM)."""
    q = inputs[0]
    expected = f"{tuple(q.shape)} {str(q.dtype).removeprefix('torch.')} on {q.device}"

    def described(t: Any) -> str:
        if not isinstance(t, torch.Tensor):
            return type(t).__name__
        return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} on {t.device}"

    try:
        out = attention(*inputs)
    except Exception as exc:  # noqa: BLE001 - the implementation's failure, reported as its row
        if is_oom(exc):
            raise
        raise ImplementationError(f"{name} raised {type(exc).__name__} in forward: {first_line(exc)}") from exc
    if described(out) != expected:
        raise ImplementationError(f"{name} returned {described(out)} in forward; expected {expected}")
    if out.grad_fn is None:
        raise ImplementationError(f"{name}'s output has no autograd graph (grad_fn is None): no backward to check")
    try:
        grads = torch.autograd.grad(out, inputs, grad_out)
    except Exception as exc:  # noqa: BLE001
        if is_oom(exc):
            raise
        raise ImplementationError(f"{name} raised {type(exc).__name__} in backward: {first_line(exc)}") from exc
    for tensor_name, grad in zip(TENSORS[1:], grads):
        if described(grad) != expected:
            raise ImplementationError(f"{name} returned {described(grad)} as {tensor_name}; expected {expected}")
    return (out.detach(), *grads)


def check_implementation(attention: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...],
                         grad_out: torch.Tensor, dtype: str, name: str) -> dict[str, Any]:
    """The check's record: ok, the error of each tensor and the worst, the tolerance and how both are defined."""
    results = run_implementation(attention, inputs, grad_out, name)
    reference = reference_attention(*inputs, grad_out)
    errors = {tensor: max_error(x, ref) for tensor, x, ref in zip(TENSORS, results, reference)}
    del results, reference
    worst = max(errors, key=errors.get)
    tolerance = TOLERANCE[dtype]
    return {"ok": errors[worst] <= tolerance, "max_error": errors[worst], "worst": worst, "tolerance": tolerance,
            "errors": errors, "metric": METRIC,
            "reference": "causal softmax(QK^T/sqrt(d))V and its gradients in float64, on the same inputs"}


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:160]
