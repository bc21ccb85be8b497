"""The attention implementations bench_attention compares, all in one shape: f(q, k, v) -> out, causal, on
(batch, seq, d) tensors. Ours by name (IMPLEMENTATIONS: the model's naive attention, torch.compile of it, PyTorch's
fused SDPA); yours as MODULE:CALLABLE, a function f(q, k, v, is_causal) or a torch.autograd.Function subclass
(called as .apply(q, k, v, is_causal)), imported from the current directory or PYTHONPATH and checked to take
those four arguments before anything runs. Nothing here does work at import time or changes global state on import.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

import user_code
from attention_tables import BASELINE  # noqa: F401 (the speed-ups are over it; bench_attention reads it here)
from model import naive_attention, sdpa_attention

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # causal; (batch, seq, d) each


def sdpa_one_head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """model.sdpa_attention on (batch, seq, d) inputs seen as one head. The fused kernels (flash,
    memory-efficient, cuDNN) only take (batch, heads, seq, d): 3-D inputs silently fall back to the math kernel,
    which materialises seq x seq like the naive code (seen with torch.profiler on torch 2.13). The extra
    dimension is a view, no copy."""
    return sdpa_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)).squeeze(1)


def compiled_naive_attention() -> AttentionFn:
    """torch.compile of the model's naive attention, after a reset: every shape compiles fresh, so no cache from
    an earlier shape helps it and the recompilation limit never kicks in. Donated buffers (the compiled backward
    reusing its saved tensors' memory) are turned off in this process: they forbid retain_graph=True, and the
    backward is timed through one retained graph, as for every implementation (torch 2.13 raises otherwise)."""
    torch.compiler.reset()
    torch._functorch.config.donated_buffer = False
    return torch.compile(naive_attention)


# name -> builder of the attention function (called once per configuration)
IMPLEMENTATIONS: dict[str, Callable[[], AttentionFn]] = {
    "naive": lambda: naive_attention,
    "compiled": compiled_naive_attention,
    "sdpa": lambda: sdpa_one_head,
}


impl_choice = user_code.named_or_spec(IMPLEMENTATIONS)  # --impl: ours by name, or MODULE:CALLABLE (yours)


def signature_error(target: Callable[..., Any], arguments: tuple[Any, ...]) -> str | None:
    """Why `target` cannot be called with `arguments` (None if it can, or if Python cannot tell: a builtin)."""
    try:
        inspect.signature(target).bind(*arguments)
    except TypeError as exc:
        return str(exc)
    except ValueError:
        return None
    return None


def user_attention(spec: str) -> AttentionFn:
    """Your attention, loaded from MODULE:CALLABLE into the shape of ours: f(q, k, v) with causal masking, calling
    yours as f(q, k, v, True) or, for a torch.autograd.Function subclass, .apply(q, k, v, True). A spec that cannot
    be imported, or names something that cannot take (q, k, v, is_causal), is a LoadError (one line: the row)."""
    found = user_code.load(spec)
    args = ("q", "k", "v", "is_causal")
    if isinstance(found, type) and issubclass(found, torch.autograd.Function):
        # forward(ctx, q, k, v, is_causal), or forward(q, k, v, is_causal) with a separate setup_context
        with_ctx, without_ctx = signature_error(found.forward, (None, *args)), signature_error(found.forward, args)
        if with_ctx and without_ctx:
            raise user_code.LoadError(f"{spec}: forward{inspect.signature(found.forward)} cannot take "
                                      "(ctx, q, k, v, is_causal)")
        function = found.apply
    elif isinstance(found, type):
        raise user_code.LoadError(f"{spec} is a class ({found.__name__}), not a function f(q, k, v, is_causal) or a "
                                  "torch.autograd.Function subclass")
    elif callable(found):
        if (why := signature_error(found, args)) is not None:
            raise user_code.LoadError(f"{spec} cannot be called as f(q, k, v, is_causal): {why}")
        function = found
    else:
        raise user_code.LoadError(f"{spec} is a {type(found).__name__}, not callable")
    return lambda q, k, v: function(q, k, v, True)


def attention_function(impl: str) -> AttentionFn:
    """The attention an implementation name stands for: ours from IMPLEMENTATIONS, yours from MODULE:CALLABLE."""
    return IMPLEMENTATIONS[impl]() if impl in IMPLEMENTATIONS else user_attention(impl)
