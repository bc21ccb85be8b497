"""Faults for the tests, injected through the entry points a student has: `--model test_faults_helper:<faults>`
(bench_e2e, mem_profile) or `--impl test_faults_helper:impl_<faults>` (bench_attention), where <faults> names a
fault per size, e.g. `error16_hang24_kill32_exit40_oom56`: the model for context 16 raises an error, for 24 hangs
(for --timeout and signals; it says its pid on stderr), for 32 is killed without a word, for 40 calls sys.exit, for
56 runs out of memory; `long16` raises a 400-character error; `sleep16` sleeps 0.5 s; `oom330up` runs out of memory
at 330 and every size above (a small device); a `rank1_` prefix limits the faults to torchrun's rank 1. Other sizes
run ours. `--optimizer NAME=test_faults_helper:SlowForwardAdamW` slows its own variant's forward (a drift)."""
import os
import re
import signal
import sys
import time

import torch

from model import TransformerLM
from optim import AdamW
from results import ModelConfig

FAULT = re.compile(r"(oom|error|long|hang|kill|exit|sleep)(\d+)(up)?")
LONG_MESSAGE = "the cause, told in full: " + "x" * 375  # 400 characters
SLOW_FORWARD_S = 0.005  # per module with parameters, in each forward of a SlowForwardAdamW's model


def fault(kind: str) -> None:
    if kind == "oom":
        raise torch.OutOfMemoryError("CUDA out of memory (test_faults_helper)")
    if kind in ("error", "long"):
        raise RuntimeError("injected failure" if kind == "error" else LONG_MESSAGE)
    if kind == "hang":
        print(f"hanging in pid {os.getpid()}", file=sys.stderr, flush=True)
        time.sleep(3600)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "exit":
        sys.exit(0)
    if kind == "sleep":
        time.sleep(0.5)


def fault_at(name: str, size: int) -> str | None:
    """The fault `name` injects at `size`, if any (on torchrun's rank 1 only, with the prefix rank1_)."""
    if name.startswith("rank1_") and os.environ.get("RANK") != "1":
        return None
    return next((kind for kind, at, up in FAULT.findall(name) if size == int(at) or (up and size > int(at))), None)


def __getattr__(name: str):
    """`<faults>` is a model factory with the staff constructor's keywords; `impl_<faults>` an attention f(q, k, v,
    is_causal) whose fault follows the sequence length."""
    if not FAULT.search(name) or name.startswith("__"):
        raise AttributeError(name)
    if name.startswith("impl_"):
        def attention(q, k, v, is_causal=True):
            if kind := fault_at(name, q.shape[-2]):
                fault(kind)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        return attention

    def model(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
        if kind := fault_at(name, context_length):
            fault(kind)
        return TransformerLM(ModelConfig(vocab_size=vocab_size, context_length=context_length, d_model=d_model,
                                         num_layers=num_layers, num_heads=num_heads, d_ff=d_ff, rope_theta=rope_theta))
    return model


# ---- a drift: one variant of a comparison slowed in a phase it shares with the others ----


def _slow_forward(module: torch.nn.Module, args: tuple) -> None:
    if any(getattr(p, "slow_forward", False) for p in module.parameters(recurse=False)):
        time.sleep(SLOW_FORWARD_S)


_hooked: list = []  # the global forward pre-hook, registered once per process


class SlowForwardAdamW(AdamW):
    """Our AdamW, whose model's forward sleeps SLOW_FORWARD_S in every module that holds its parameters: compared
    with another optimizer, the forward (the phase both variants run alike) slows for this variant only, as if the
    machine slowed down whenever its steps ran."""

    def __init__(self, params, lr: float = 1e-3):
        super().__init__(params, lr=lr)
        for group in self.param_groups:
            for p in group["params"]:
                p.slow_forward = True
        if not _hooked:
            _hooked.append(torch.nn.modules.module.register_module_forward_pre_hook(_slow_forward))
