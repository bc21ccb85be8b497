"""The Transformer LM's memory without a GPU: the accounting from the config (weights, gradients, AdamW's moments, one
residual-stream tensor, one layer's attention scores), what autograd keeps for backward (measured with saved-tensor
hooks on fake tensors: the shapes and dtypes of a real run, with no memory and no arithmetic, so even 2.7B takes
seconds on a laptop), and the peak of a step those figures predict, with and without activation checkpointing.

mem_profile.py prints these beside the peaks it measures on CUDA; docs/mem_profile.md explains them. Nothing here
does work at import time or changes global state on import.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import re
from collections import Counter
from typing import Any

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import common
import runner
from common import DTYPES, precision_context, saved_tensors, storage_key
from model import TransformerLM, cross_entropy
from model_config import ModelConfig

FP32_BYTES = 4


# ---- accounting from the config ----


def static_memory_bytes(cfg: ModelConfig, mode: str, num_params: int | None = None) -> dict[str, int]:
    """Bytes that live for the whole run: fp32 weights (the master copy, also under autocast), fp32 gradients
    when the mode runs backward, and AdamW's two fp32 moments (exp_avg, exp_avg_sq) in a training step.
    `num_params`: the model's own count (yours); default our architecture's."""
    weights = (num_params or cfg.num_params) * FP32_BYTES
    return {"weights_bytes": weights, "grads_bytes": weights if mode != "forward" else 0,
            "adamw_state_bytes": 2 * weights if mode == "train" else 0}


def residual_stream_bytes(batch: int, ctx: int, d_model: int) -> int:
    """One (batch, ctx, d_model) residual-stream tensor in fp32. Under bf16/fp16 autocast it stays fp32: the
    embedding output is fp32 and each residual add (fp32 + low-precision) promotes to fp32."""
    return batch * ctx * d_model * FP32_BYTES


def attention_scores_bytes(batch: int, heads: int, ctx: int, dtype: str) -> int:
    """One layer's (batch, heads, ctx, ctx) attention-score matrix, in the dtype the QK^T matmul produces
    (fp32: 4 B; autocast bf16/fp16: 2 B). Naive attention keeps several such matrices per layer for backward."""
    return batch * heads * ctx * ctx * DTYPES[dtype].itemsize


# ---- saved for backward ----


def op_name(t: torch.Tensor) -> str:
    """The autograd op that produced `t` ('Where' for WhereBackward0); '(no grad_fn)' for an input or a
    non-differentiable output (the token ids, sdpa's log-sum-exp)."""
    return re.sub(r"Backward\d*$", "", t.grad_fn.name()) if t.grad_fn is not None else "(no grad_fn)"


class ModuleTracker:
    """Forward pre-/post-hooks on every module: the path of the module running now ('layers.3.ffn.w1') and the
    module that produced each module output. A module shared between blocks (the RoPE cache) takes the path
    under its caller, so what it makes is attributed to the right block."""

    def __init__(self, model: nn.Module):
        self._paths: dict[int, list[str]] = {}
        for path, module in model.named_modules(remove_duplicate=False):
            self._paths.setdefault(id(module), []).append(path)
        self._stack: list[str] = []
        # storage key -> (producing module path, the output itself: kept so that its key cannot be reused)
        self.produced_by: dict[int, tuple[str, torch.Tensor]] = {}
        self._handles = [h for m in model.modules()
                         for h in (m.register_forward_pre_hook(self._enter), m.register_forward_hook(self._exit))]

    @property
    def current(self) -> str:
        return self._stack[-1] if self._stack else ""

    def producer(self, key: int) -> str:
        """The module whose output this storage is; else the module running now (a tensor made inside it)."""
        return self.produced_by[key][0] if key in self.produced_by else self.current

    def _enter(self, module: nn.Module, args: Any) -> None:
        for t in args:  # an input not yet known as a module output was made by the caller, running now
            if isinstance(t, torch.Tensor):
                self.produced_by.setdefault(storage_key(t), (self.current, t))
        paths = self._paths[id(module)]
        prefix = self.current + "." if self._stack and self.current else ""
        self._stack.append(next((p for p in paths if p.startswith(prefix)), paths[0]))

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        path = self._stack.pop()
        for t in output if isinstance(output, (tuple, list)) else (output,):
            if isinstance(t, torch.Tensor):
                self.produced_by.setdefault(storage_key(t), (path, t))  # inner modules exit first: they win

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self.produced_by.clear()


def saved_for_backward(cfg: ModelConfig, batch: int, dtype: str = "fp32", attn: str = "naive",
                       checkpoint_every: int = 0, device: str | torch.device = "cpu",
                       fake: bool = True, model_factory: str | None = None) -> list[dict[str, Any]]:
    """Every storage autograd saves for backward during one forward pass plus the loss, each counted once,
    with the module that produced it, the op, shape (of the whole storage's tensor), dtype and bytes. Weights
    and buffers the graph refers to are left out: they are resident anyway (autocast's low-precision weight
    copies are not, and are listed).

    fake=True runs under FakeTensorMode: the graph, shapes and dtypes (autocast included) are a real run's,
    with no memory and no arithmetic. fake=False runs the real model (tests compare the two). `model_factory`:
    your model instead of ours (runner.build_model)."""
    device = torch.device(device)
    if fake:
        with torch.device("meta"):
            model = runner.build_model(cfg, attn, checkpoint_every, model_factory)
        # allow_non_fake_inputs: to_empty turns the meta weights into fake ones on `device`
        mode: contextlib.AbstractContextManager = FakeTensorMode(allow_non_fake_inputs=True)
    else:
        with device:
            model = runner.build_model(cfg, attn, checkpoint_every, model_factory)
        mode = contextlib.nullcontext()
    with mode:
        if fake:
            model = model.to_empty(device=device)
        tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.context_length), device=device)
        resident = {storage_key(t) for t in itertools.chain(model.parameters(), model.buffers())}
        tracker = ModuleTracker(model)

        def describe(t: torch.Tensor) -> dict[str, Any]:
            base = t._base if t._base is not None else t  # a view: describe the tensor that owns the storage
            return {"bytes": t.untyped_storage().nbytes(), "module": tracker.producer(storage_key(t)),
                    "op": op_name(base), "shape": list(base.shape), "dtype": common.dtype_name(base.dtype)}

        try:
            with torch.enable_grad(), saved_tensors(describe, exclude=resident) as saved, \
                    precision_context(device, dtype):
                loss = cross_entropy(model(tokens), tokens)
            rows = list(saved.values())
            del loss  # the graph (and every saved storage) stayed alive until now, so no key was reused
        finally:
            tracker.remove()
    return rows


BLOCK_PATH = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")  # ours and the staff model's blocks; a wrapper's too


def _top_groups(groups: Counter, n: int, per: int, denominator: int) -> list[dict[str, Any]]:
    return [{"module": module, "op": op, "shape": "x".join(map(str, shape)), "dtype": dtype,
             "bytes": total / per, "share": total / denominator if denominator else 0.0}
            for (module, op, shape, dtype), total in groups.most_common(n)]


def summarize_saved(saved: list[dict[str, Any]], num_layers: int, top_block: int = 5,
                    top_outside: int = 3) -> dict[str, Any]:
    """Saved bytes per TransformerBlock (by the block that produced them), outside the blocks (embedding,
    final norm, lm_head, loss), in total; the largest contributors per block (averaged over blocks; share of
    the blocks' total) and outside (share of the grand total)."""
    per_block = [0] * num_layers
    in_blocks: Counter = Counter()
    outside: Counter = Counter()
    for s in saved:
        match = BLOCK_PATH.search(s["module"])
        if match:
            per_block[int(match.group(1))] += s["bytes"]
            module = s["module"][match.end():] or "(block)"
            in_blocks[(module, s["op"], tuple(s["shape"]), s["dtype"])] += s["bytes"]
        else:
            outside[(s["module"] or "(model)", s["op"], tuple(s["shape"]), s["dtype"])] += s["bytes"]
    blocks_total, outside_total = sum(per_block), sum(outside.values())
    total = blocks_total + outside_total
    return {"saved_block_bytes_mean": blocks_total / num_layers, "saved_block_bytes_min": min(per_block),
            "saved_block_bytes_max": max(per_block), "saved_blocks_bytes": blocks_total,
            "saved_outside_bytes": outside_total, "saved_total_bytes": total, "saved_storages": len(saved),
            "saved_block_top": _top_groups(in_blocks, top_block, num_layers, blocks_total),
            "saved_outside_top": _top_groups(outside, top_outside, 1, total)}


# ---- the predicted peak, with and without activation checkpointing ----


class OutputsKept(TorchDispatchMode):
    """Every tensor an op returns while active, kept (on fake tensors that costs nothing, and no storage key can be
    reused while they live)."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[torch.Tensor] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.outputs += [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        return out


def largest_transient_bytes(cfg: ModelConfig, batch: int, dtype: str, attn: str,
                            device: str | torch.device, backward: bool = True) -> int:
    """The largest storage one forward (and backward) makes that is neither kept for backward, nor a weight, nor a
    gradient: a temporary such as the logits' gradient or an attention-score matrix's, on top of what is kept
    when it is made. On fake tensors of `device` (shapes and dtypes only)."""
    device = torch.device(device)
    with torch.device("meta"):
        model = TransformerLM(cfg, attn=attn)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to_empty(device=device)
        tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.context_length), device=device)
        outputs = OutputsKept()
        with torch.enable_grad(), saved_tensors() as saved, outputs, precision_context(device, dtype):
            loss = cross_entropy(model(tokens), tokens)
        if backward:
            with outputs:
                loss.backward()
        lasting = set(saved) | {storage_key(t) for t in itertools.chain(model.parameters(), model.buffers())}
        lasting |= {storage_key(p.grad) for p in model.parameters() if p.grad is not None}
        sizes = {storage_key(t): t.untyped_storage().nbytes() for t in outputs.outputs}
        return max((size for key, size in sizes.items() if key not in lasting), default=0)


@functools.lru_cache(maxsize=16)
def activation_figures(cfg: ModelConfig, batch: int, dtype: str, attn: str, device: str,
                       backward: bool) -> dict[str, int]:
    """What the prediction needs from one forward (and backward) without checkpointing, on fake tensors: what one
    block keeps for backward (the largest block's) and its largest single tensor, what the rest of the model keeps
    (embedding, final norm, lm_head, loss), the largest transient, and the gradient bytes of one block and of the
    embedding (fp32, as the parameters). The same for every K: computed once per configuration in a process."""
    saved = saved_for_backward(cfg, batch, dtype, attn, 0, device)
    summary = summarize_saved(saved, cfg.num_layers)
    return {"block_bytes": int(summary["saved_block_bytes_max"]), "outside_bytes": summary["saved_outside_bytes"],
            "transient_bytes": largest_transient_bytes(cfg, batch, dtype, attn, device, backward),
            "block_transient_bytes": max((s["bytes"] for s in saved if BLOCK_PATH.search(s["module"])), default=0),
            "block_grad_bytes": cfg.block_params * FP32_BYTES,
            "embedding_grad_bytes": cfg.vocab_size * cfg.d_model * FP32_BYTES}


def peak_moments(k: int, layers: int, boundary_bytes: int, figures: dict[str, int], static: dict[str, int],
                 mode: str) -> dict[str, int]:
    """Bytes in use at each moment a step's peak can fall in, with checkpointing every k blocks (0: none); `static`
    is static_memory_bytes (weights, gradients, AdamW's moments).
    - backward starts: the state without gradients, what the forward kept (every block's saved tensors with k = 0,
      else one residual-stream tensor per segment), what the rest keeps, and the largest transient (the logits'
      gradient); in forward mode this is the end of the forward;
    - the first segment's backward (k > 0; it runs last): the state, the gradients of everything after it (all but
      the embedding's and its own blocks'), the segment inputs, its k blocks recomputed (each keeping what a block
      keeps without checkpointing) and a block's largest tensor again (its gradient);
    - backward ends: the state with every gradient;
    - the optimizer step (train): that, and one parameter-sized temporary (our AdamW's denominator,
      torch._foreach_sqrt of the second moments).
    A block's own gradients arrive as its activations go, so they are not added to its moment."""
    state = static["weights_bytes"] + static["adamw_state_bytes"]
    kept = layers * figures["block_bytes"] if k == 0 else -(-layers // k) * boundary_bytes
    moments = {"backward starts" if mode != "forward" else "forward ends":
               state + kept + figures["outside_bytes"] + figures["transient_bytes"]}
    if mode == "forward":
        return moments
    if k:
        blocks = min(k, layers)
        later_grads = static["grads_bytes"] - figures["embedding_grad_bytes"] - blocks * figures["block_grad_bytes"]
        moments["first segment's backward"] = (state + later_grads + kept + blocks * figures["block_bytes"]
                                               + figures["block_transient_bytes"])
    moments["backward ends"] = state + static["grads_bytes"]
    if mode == "train":
        moments["optimizer step"] = state + static["grads_bytes"] + static["weights_bytes"]
    return moments


def checkpoint_prediction(cfg: ModelConfig, batch: int, mode: str, k: int, kept_bytes: int,
                          figures: dict[str, int]) -> dict[str, Any]:
    """The predicted peak of a configuration checkpointing every k blocks (the largest of peak_moments) and the curve
    over every K from 0 to the number of layers, with its minimum: what the plot draws and the table prints beside
    the measured peak. `kept_bytes`: what this configuration's blocks keep for backward, measured on fake tensors."""
    static = static_memory_bytes(cfg, mode)
    boundary = residual_stream_bytes(batch, cfg.context_length, cfg.d_model)  # a segment's input

    def peak(k: int) -> tuple[int, str]:
        moments = peak_moments(k, cfg.num_layers, boundary, figures, static, mode)
        moment = max(moments, key=moments.get)
        return moments[moment], moment

    predicted, moment = peak(k)
    curve = [{"k": k, "predicted_peak_bytes": peak(k)[0]} for k in range(cfg.num_layers + 1)]
    best = min(curve, key=lambda point: point["predicted_peak_bytes"])  # the smallest K among equals
    return {**figures, "state_bytes": static["weights_bytes"] + static["adamw_state_bytes"],
            "grads_bytes": static["grads_bytes"], "boundary_bytes": boundary, "kept_bytes": kept_bytes,
            "predicted_peak_bytes": predicted, "peak_moment": moment, "curve": curve, "best_k": best["k"],
            "best_predicted_peak_bytes": best["predicted_peak_bytes"]}
