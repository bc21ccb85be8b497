"""The Transformer LM under study: the course's reference ("basics") architecture, parameter names and numerics,
so that numbers measured here compare with everyone else's. Pre-norm blocks (RMSNorm -> causal self-attention with
RoPE; RMSNorm -> SwiGLU), a final RMSNorm, an untied lm_head, no biases: a reference state dict loads strictly.

    from model import TransformerLM, cross_entropy, get_config
    model = TransformerLM(get_config("small", handout="2025"), attn="naive")
"""
from __future__ import annotations

import inspect
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange
from torch.utils.checkpoint import checkpoint

from common import LoadError, annotate, load
from optim import AdamW

# The configuration, presets and FLOPs live in torch-free results.py (report.py reads them from records); here
# because the model is where a reader looks for them (gpt-fast's ModelArgs).
from results import HANDOUTS, ModelConfig, attention_matmul_flops, forward_flops, get_config, step_flops  # noqa: F401


# ---- numerically stable primitives, written out by hand as in the reference ----


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(x - max) / sum(exp(x - max)): subtracting the row max keeps exp from overflowing. torch.max, not
    amax: its backward keeps the argmax, not x (one score-sized tensor less per layer, as the staff model)."""
    shifted = x - torch.max(x, dim=dim, keepdim=True).values
    exp = torch.exp(shifted)
    return exp / torch.sum(exp, dim=dim, keepdim=True)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean -log p(targets) under `logits` (..., vocab): log p = (x - max) - log(sum(exp(x - max)))."""
    shifted = logits - torch.max(logits, dim=-1, keepdim=True).values
    log_probs = shifted - torch.log(torch.sum(torch.exp(shifted), dim=-1, keepdim=True))
    return -torch.mean(torch.gather(log_probs, -1, targets.unsqueeze(-1)))


# ---- attention implementations: (..., seq, d_head) inputs, causal ----


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Scores by matmul, -inf above the diagonal, our softmax, the value matmul: the (..., seq, seq) scores and
    probabilities kept for backward make it quadratic in memory. q, k, v: (..., seq, d) -> (..., seq, d)."""
    seq, d = q.shape[-2], q.shape[-1]
    with annotate("scaled dot product attention"):
        with annotate("computing attention scores"):
            scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (..., seq, seq)
            positions = torch.arange(seq, device=q.device)
            causal_mask = positions[:, None] >= positions[None, :]  # query i sees keys j <= i
            scores = torch.where(causal_mask, scores, float("-inf"))
        with annotate("computing softmax"):
            probs = softmax(scores, dim=-1)
        with annotate("final matmul"):
            return probs @ v


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """PyTorch's fused kernel (flash / memory-efficient / math, chosen by PyTorch)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


ATTENTION = {"naive": naive_attention, "sdpa": sdpa_attention}


# ---- layers ----


class Linear(nn.Module):
    """y = x W^T with W stored (d_out, d_in), truncated-normal init std sqrt(2 / (d_in + d_out)) cut at 3 std."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        std = math.sqrt(2.0 / (d_in + d_out))
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(d_out, d_in), std=std, a=-3 * std, b=3 * std))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(vocab_size, d_model), std=1.0, a=-3.0, b=3.0))

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[token_ids]


class RMSNorm(nn.Module):
    """x / rms(x) * g, computed in float32 (squares overflow in half precision) and cast back."""

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x).to(in_dtype)


class RotaryEmbedding(nn.Module):
    """RoPE: rotate each adjacent pair (x[2i], x[2i+1]) of a head by angle pos * theta^(-2i/d).
    The cos/sin cache is a non-persistent buffer, so it is not part of the state dict."""

    def __init__(self, context_length: int, d_head: int, theta: float = 10_000.0):
        super().__init__()
        inv_freq = theta ** -(torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)  # (d_head/2,)
        angles = torch.outer(torch.arange(context_length, dtype=torch.float32), inv_freq)  # (ctx, d_head/2)
        self.register_buffer("cos_sin", torch.stack((angles.cos(), angles.sin())), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., seq, d_head), positions 0..seq-1."""
        seq = x.shape[-2]
        if seq > self.cos_sin.shape[1]:
            raise ValueError(f"sequence length {seq} exceeds the model's context_length {self.cos_sin.shape[1]}")
        cos, sin = self.cos_sin[:, :seq]  # (seq, d_head/2) each
        x_even, x_odd = rearrange(x, "... (half pair) -> pair ... half", pair=2)
        rotated = torch.stack((cos * x_even - sin * x_odd, sin * x_even + cos * x_odd), dim=-1)
        # the fp32 cache promotes a bf16 x: cast back, so bf16 parameters (FSDP2's MixedPrecisionPolicy) stay bf16
        return rearrange(rotated, "... half pair -> ... (half pair)").to(x.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, rope: RotaryEmbedding, attn: str = "naive"):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = Linear(d_model, d_model)
        self.k_proj = Linear(d_model, d_model)
        self.v_proj = Linear(d_model, d_model)
        self.output_proj = Linear(d_model, d_model)
        self.rope = rope
        self.impl = attn  # key into ATTENTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (batch, seq, d_model) -> (batch, heads, seq, d_head)
        q, k, v = (rearrange(proj(x), "b s (h d) -> b h s d", h=self.num_heads)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        q, k = self.rope(q), self.rope(k)
        out = ATTENTION[self.impl](q, k, v)
        return self.output_proj(rearrange(out, "b h s d -> b s (h d)"))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = Linear(d_model, d_ff)
        self.w2 = Linear(d_ff, d_model)
        self.w3 = Linear(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.w1(x)
        return self.w2(gate * torch.sigmoid(gate) * self.w3(x))  # silu(w1 x) * w3 x


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding, attn: str = "naive"):
        super().__init__()
        self.ln1 = RMSNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.num_heads, rope, attn)
        self.ln2 = RMSNorm(cfg.d_model)
        self.ffn = SwiGLU(cfg.d_model, cfg.d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    """token ids (batch, seq) -> logits (batch, seq, vocab). checkpoint_every=K > 0: the blocks run in segments
    of K under torch.utils.checkpoint: only a segment's input is kept for backward, its blocks recomputed there."""

    def __init__(self, cfg: ModelConfig, attn: str = "naive", checkpoint_every: int = 0):
        super().__init__()
        if attn not in ATTENTION:
            raise ValueError(f"unknown attention {attn!r}; choose from {', '.join(ATTENTION)}")
        self.config = cfg
        self.checkpoint_every = checkpoint_every
        self.token_embeddings = Embedding(cfg.vocab_size, cfg.d_model)
        rope = RotaryEmbedding(cfg.context_length, cfg.d_head, cfg.rope_theta)
        self.layers = nn.ModuleList(TransformerBlock(cfg, rope, attn) for _ in range(cfg.num_layers))
        self.ln_final = RMSNorm(cfg.d_model)
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        x = self.token_embeddings(token_ids)  # (batch, seq, d_model): the residual stream
        k = self.checkpoint_every
        if k and torch.is_grad_enabled():
            for start in range(0, len(self.layers), k):
                x = checkpoint(self._run_layers, x, start, start + k, use_reentrant=False)
        else:
            x = self._run_layers(x, 0, len(self.layers))
        return self.lm_head(self.ln_final(x))

    def _run_layers(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        for layer in self.layers[start:stop]:
            x = layer(x)
        return x


# ---- building a model and an optimizer by name: ours, or the student's MODULE:CALLABLE ----

# The staff model's constructor keywords (cs336_basics.model.BasicsTransformerLM), each a ModelConfig field
STAFF_MODEL_KEYWORDS = ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta")
# Ours, torch's and the staff AdamW's defaults. A student's optimizer gets those its signature names, so the
# leaderboard's check compares its step with AdamW's whatever its own defaults; the step's cost is the same.
ADAMW_SETTINGS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}


def build_model(cfg: ModelConfig, attn: str = "naive", checkpoint_every: int = 0,
                factory: str | None = None) -> nn.Module:
    """Ours, or `factory` (MODULE:CALLABLE) called with the staff constructor's keywords, on the current default
    device. A factory that cannot take them or returns no nn.Module is a LoadError (one line)."""
    if factory is None:
        return TransformerLM(cfg, attn=attn, checkpoint_every=checkpoint_every)
    make = load(factory)
    keywords = {name: getattr(cfg, name) for name in STAFF_MODEL_KEYWORDS}
    try:
        inspect.signature(make).bind(**keywords)
    except TypeError as exc:
        raise LoadError(f"{factory} cannot be called with the staff model's keywords "
                        f"({', '.join(STAFF_MODEL_KEYWORDS)}): {exc}") from None
    except ValueError:  # no signature to read (a builtin): let the call say
        pass
    model = make(**keywords)
    if not isinstance(model, nn.Module):
        raise LoadError(f"{factory} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def check_logits(logits: object, tokens_shape: tuple[int, int], vocab_size: int, name: str | None) -> None:
    """A model must map token ids (batch, seq) to floating-point logits (batch, seq, vocab); a ValueError naming it
    otherwise (the scripts check a student's model once, on its first forward: a shape and a dtype, no sync)."""
    expected = (*tokens_shape, vocab_size)
    if isinstance(logits, torch.Tensor) and tuple(logits.shape) == expected and logits.is_floating_point():
        return
    got = f"{tuple(logits.shape)} {logits.dtype}" if isinstance(logits, torch.Tensor) else f"a {type(logits).__name__}"
    raise ValueError(f"{name or 'the model'} returned {got} for token ids {tokens_shape}; expected floating-point "
                     f"logits (batch, seq, vocab) = {expected}")


def build_optimizer(name: str, params, device: torch.device, course: bool = False) -> torch.optim.Optimizer:
    """ours = optim.AdamW; torch = torch.optim.AdamW (fused on CUDA, foreach on CPU); else MODULE:CLASS, built as
    CLASS(params, **the ADAMW_SETTINGS it names), or with `course` as the course's leaderboard builds it:
    CLASS(params), its own defaults."""
    if name == "ours":
        return AdamW(params)
    if name == "torch":
        return torch.optim.AdamW(params, **({"fused": True} if device.type == "cuda" else {"foreach": True}))
    make = load(name)
    try:
        named = inspect.signature(make).parameters
    except (TypeError, ValueError):  # a builtin without a signature: the lr alone
        named = {"lr"}
    optimizer = make(params, **{k: v for k, v in ADAMW_SETTINGS.items() if k in named and not course})
    if not (callable(getattr(optimizer, "step", None)) and callable(getattr(optimizer, "zero_grad", None))):
        raise LoadError(f"{name} made a {type(optimizer).__name__}, which has no step() and zero_grad()")
    return optimizer
