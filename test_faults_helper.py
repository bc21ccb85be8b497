"""Faults for the tests, injected through the entry points a student has: `--model test_faults_helper:<faults>`
(bench_e2e, mem_profile) or `--impl test_faults_helper:impl_<faults>` (bench_attention), where <faults> names a
fault per size, e.g. `error16_hang24_kill32_exit40_oom56`: the model for context 16 raises an error, for 24 hangs
(for --timeout and signals; it says its pid on stderr), for 32 is killed without a word, for 40 calls sys.exit, for
56 runs out of memory; `long16` raises a 400-character error; `sleep16` sleeps 0.5 s. Other sizes run ours."""
import os
import re
import signal
import sys
import time

import torch

from model import TransformerLM
from results import ModelConfig

FAULT = re.compile(r"(oom|error|long|hang|kill|exit|sleep)(\d+)")
LONG_MESSAGE = "the cause, told in full: " + "x" * 375  # 400 characters


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


def faults_of(name: str) -> dict[int, str]:
    return {int(size): kind for kind, size in FAULT.findall(name)}


def __getattr__(name: str):
    """`<faults>` is a model factory with the staff constructor's keywords; `impl_<faults>` an attention f(q, k, v,
    is_causal) whose fault follows the sequence length."""
    faults = faults_of(name)
    if not faults or name.startswith("__"):
        raise AttributeError(name)
    if name.startswith("impl_"):
        def attention(q, k, v, is_causal=True):
            if q.shape[-2] in faults:
                fault(faults[q.shape[-2]])
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        return attention

    def model(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
        if context_length in faults:
            fault(faults[context_length])
        return TransformerLM(ModelConfig(vocab_size=vocab_size, context_length=context_length, d_model=d_model,
                                         num_layers=num_layers, num_heads=num_heads, d_ff=d_ff, rope_theta=rope_theta))
    return model
