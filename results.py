"""Records, tables and result files, without torch (report.py and kernel_tables.py start without it):
statuses, model configurations and FLOPs, paired statistics, tables, result files, command-line helpers."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import html
import itertools
import json
import math
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn

from tabulate import tabulate, tabulate_formats

Record = dict[str, Any]

# ---- statuses ----
# Every record has a "status": "ok", "noisy" (measured, a phase varied more than the script's threshold),
# "OOM" (or "OOM on rank N"), "error: ...", "timeout after N s", "skipped: ...".
FINISHED = ("ok", "noisy")


def finished(record: Record) -> bool:
    """Whether a record measured every step."""
    return record.get("status") in FINISHED


def is_oom_status(status: str) -> bool:
    return status == "OOM" or status.startswith("OOM on rank")


MIB, GIB = 2**20, 2**30
OURS = "ours"  # the --model and --optimizer name of model.py's and optim.py's


def format_bytes(n: float | None) -> str | None:
    """Bytes in the largest power-of-two unit that keeps the number >= 1."""
    if not number(n):
        return None
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def number(value: Any) -> bool:
    """A finite int or float (not None, a status string or a bool): a number a table or figure can use."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ---- the model's configuration (records, tables and --size read it; model.py builds from it) ----


class ConfigError(ValueError):
    """A configuration that cannot exist (unknown preset, bad shape): a one-line usage error."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of the Transformer LM in model.py (the course's "basics" model)."""

    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int = 10_000
    context_length: int = 128  # the longest sequence the RoPE cache covers
    rope_theta: float = 10_000.0

    def __post_init__(self) -> None:
        for name in ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "context_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.num_heads:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if self.d_head % 2:
            raise ConfigError(f"d_model / num_heads = {self.d_head} must be even for RoPE (it rotates pairs)")

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads

    @property
    def block_params(self) -> int:
        """One TransformerBlock: Q, K, V, output projections (4 d^2), SwiGLU (3 d d_ff), two RMSNorm gains."""
        return 4 * self.d_model**2 + 3 * self.d_model * self.d_ff + 2 * self.d_model

    @property
    def matmul_params(self) -> int:
        """Parameters used as matmul weights: every Linear, lm_head included; not the embedding or norms."""
        return self.num_layers * (self.block_params - 2 * self.d_model) + self.d_model * self.vocab_size

    @property
    def parameter_shapes(self) -> list[tuple[int, ...]]:
        """model.TransformerLM's parameter shapes, counted here (test_model.py checks them against a built model):
        building one, even on the meta device, imports torch._dynamo, seconds of every dry run."""
        d, f, v = self.d_model, self.d_ff, self.vocab_size
        block = [(d,), (d, d), (d, d), (d, d), (d, d), (d,), (f, d), (d, f), (f, d)]
        return [(v, d), *block * self.num_layers, (d,), (v, d)]

    @property
    def num_params(self) -> int:
        """Exact parameter count of model.TransformerLM (untied embedding and lm_head)."""
        return self.num_layers * self.block_params + 2 * self.vocab_size * self.d_model + self.d_model


# Table 1 of the handouts (vocab 10,000): the same name can mean another model in the Spring 2025 handout and
# the current one (v26.1.1), so every script resolves names in one handout's table and says which.
TINY = ModelConfig(d_model=512, d_ff=1344, num_layers=4, num_heads=16)  # the CPU size, not in Table 1
_SMALL = ModelConfig(d_model=768, d_ff=3072, num_layers=12, num_heads=12)
_MEDIUM = ModelConfig(d_model=1024, d_ff=4096, num_layers=24, num_heads=16)
_LARGE = ModelConfig(d_model=1280, d_ff=5120, num_layers=36, num_heads=20)
_D2560 = ModelConfig(d_model=2560, d_ff=10240, num_layers=32, num_heads=32)  # 2026's xl = 2025's 2.7B
PRESETS_2026 = {"tiny": TINY, "small": _SMALL, "medium": _MEDIUM, "large": _LARGE, "xl": _D2560,
                "10B": ModelConfig(d_model=4608, d_ff=12288, num_layers=50, num_heads=36)}
PRESETS_2025 = {"tiny": TINY, "small": _SMALL, "medium": _MEDIUM, "large": _LARGE,
                "xl": ModelConfig(d_model=1600, d_ff=6400, num_layers=48, num_heads=25), "2.7B": _D2560}

# The 2026 leaderboard (stanford-cs336/assignment2-systems-leaderboard): the staff model at this shape, batch 2
LEADERBOARD = ModelConfig(d_model=4096, d_ff=11008, num_layers=34, num_heads=32, vocab_size=151_936,
                          context_length=32_768)
LEADERBOARD_BATCH = 2
# 2025's leaderboard (the 2025 handout, section 1.3.3): FlashAttention-2 on (heads, seq, d), bf16, causal
LEADERBOARD_2025_SHAPE = (16, 16_384, 64)


@dataclasses.dataclass(frozen=True)
class Handout:
    """One handout of the study: its Table 1 and the setups its questions name."""

    name: str  # what --handout and CS336_HANDOUT take
    version: str
    presets: dict[str, ModelConfig]  # Table 1 plus tiny
    default_context_length: int
    memory_size: str  # memory_profiling: the size and its context lengths
    memory_contexts: tuple[int, ...]
    checkpoint_setup: tuple[str, int, int] | None  # gradient_checkpointing (b): (size, batch, context)

    @property
    def table1(self) -> list[str]:
        return [name for name in self.presets if name != "tiny"]

    @property
    def title(self) -> str:
        return f"handout {self.name} ({self.version})"


HANDOUTS = {
    "2026": Handout("2026", "v26.1.1", PRESETS_2026, 512, "xl", (128, 2048), ("xl", 4, 2048)),
    "2025": Handout("2025", "Spring 2025", PRESETS_2025, 128, "2.7B", (128, 256, 512), None),
}
DEFAULT_HANDOUT = "2026"
HANDOUT_ENV = "CS336_HANDOUT"  # set once in the shell instead of --handout on every command
DEFAULT_BATCH_SIZE = 4
MODES = ("forward", "forward-backward", "train")  # what one measured step does
PHASES_BY_MODE = {"forward": ("forward",), "forward-backward": ("forward", "backward"),
                  "train": ("forward", "backward", "optimizer")}


def get_handout(name: str) -> Handout:
    if name not in HANDOUTS:
        raise ConfigError(f"unknown handout {name!r}; valid handouts: {', '.join(HANDOUTS)}")
    return HANDOUTS[name]


def get_config(name: str, handout: str = DEFAULT_HANDOUT, **overrides: Any) -> ModelConfig:
    """Preset `name` of `handout`'s table at its default context length, with the non-None `overrides`."""
    chosen = get_handout(handout)
    _check_preset(name, chosen)
    changes = {"context_length": chosen.default_context_length,
               **{k: v for k, v in overrides.items() if v is not None}}
    return dataclasses.replace(chosen.presets[name], **changes)


def _check_preset(name: str, handout: Handout, also_valid: tuple[str, ...] = ()) -> None:
    if name in handout.presets:
        return
    elsewhere = [h.name for h in HANDOUTS.values() if name in h.presets]
    if elsewhere:
        raise ConfigError(f"preset {name!r} is in handout {elsewhere[0]}'s table, not in handout "
                          f"{handout.name}'s ({', '.join(handout.presets)}); use --handout {elsewhere[0]} "
                          f"(or {HANDOUT_ENV}={elsewhere[0]})")
    raise ConfigError(f"unknown preset {name!r}; valid presets in handout {handout.name}: "
                      f"{', '.join([*handout.presets, *also_valid])}")


def expand_sizes(names: list[str], handout: str) -> list[str]:
    """--size values with 'all' replaced by the handout's Table 1 (in order, no repeats), each checked."""
    chosen = get_handout(handout)
    for name in names:
        if name != "all":
            _check_preset(name, chosen, also_valid=("all",))
    return list(dict.fromkeys(s for name in names for s in (chosen.table1 if name == "all" else [name])))


def sizes_from(record: Record) -> str:
    """The title of the handout whose table a record's size names come from."""
    return get_handout((record.get("config") or {}).get("handout") or DEFAULT_HANDOUT).title


def model_tensor_shapes(cfg: ModelConfig, batch: int) -> dict[str, tuple[int, ...]]:
    """The largest tensors a step of model.py builds (check_tensor_sizes bounds them)."""
    seq = cfg.context_length
    return {"logits": (batch, seq, cfg.vocab_size), "attention scores": (batch, cfg.num_heads, seq, seq),
            "embedding": (cfg.vocab_size, cfg.d_model), "feed-forward weight": (cfg.d_ff, cfg.d_model)}


def config_row(name: str, cfg: ModelConfig) -> Record:
    return {"size": name, "d_model": cfg.d_model, "d_ff": cfg.d_ff, "layers": cfg.num_layers,
            "heads": cfg.num_heads, "vocab": cfg.vocab_size, "params": cfg.num_params}


def config_table(models: list[tuple[str, ModelConfig]], handout: Handout, fmt: str = "github",
                 params: str = "params") -> str:
    """One row per size (context lengths aside), under a line naming the handout; `params`: that column's name."""
    seen = dict.fromkeys((size, dataclasses.replace(cfg, context_length=1)) for size, cfg in models)
    rows = [{**{k: v for k, v in config_row(size, cfg).items() if k != "params"}, params: f"{cfg.num_params:,}"}
            for size, cfg in seen]
    return f"Model sizes from {handout.title}:\n\n" + render_table(rows, list(rows[0]) if rows else [], fmt)


# FLOPs: a multiply-add is 2 FLOPs, so (m x k) @ (k x n) costs 2mkn (Kaplan et al. 2020, "Scaling Laws for
# Neural Language Models", Table 1; the convention of torch.utils.flop_counter).


def attention_matmul_flops(batch: int, seq: int, d_model: int) -> int:
    """QK^T and PV of one layer, all heads: 2 x 2*B*S*S*d_model (the full S x S; the causal half masked)."""
    return 2 * (2 * batch * seq * seq * d_model)


def forward_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """2 x matmul parameters x tokens plus every layer's attention matmuls; elementwise work (norms, softmax,
    RoPE, SwiGLU gating, < 1% here) is not counted."""
    attention = cfg.num_layers * attention_matmul_flops(batch, seq, cfg.d_model)
    return 2 * cfg.matmul_params * batch * seq + attention


def step_flops(cfg: ModelConfig, batch: int, seq: int, mode: str) -> int:
    """Forward FLOPs, 3x with backward (input and weight gradients); AdamW is elementwise, not counted."""
    return forward_flops(cfg, batch, seq) * (1 if mode == "forward" else 3)


# ---- floors: the least time the hardware allows a phase ----
# A phase's floor is max(FLOPs / peak FLOP/s, bytes / memory bandwidth); the larger term is its bound. The bytes
# are a lower bound, each tensor named below moving once (the byte model); a real phase moves more: activation
# gradients between layers, intermediates (naive attention's scores before the softmax, SwiGLU's and RMSNorm's
# temporaries, RoPE's copies), re-reads of an input by several kernels, autocast's bf16 copies of the weights,
# the embedding's gather. So "of floor" (floor / measured) understates how close a phase came to what it could
# reach, unless a measured ceiling (a few seconds of matmuls and copies) fell short of the machine's real one.

ADAMW_BYTES_PER_PARAM = 28  # AdamW reads parameter, gradient, m, v and writes parameter, m, v: 7 x 4 bytes (fp32)
LSE_BYTES = 4  # a fused kernel's fp32 log-sum-exp per query row, kept for backward


def saved_activations(cfg: ModelConfig, batch: int, seq: int, attn: str) -> int:
    """Elements of model.TransformerLM's forward outputs that its backward reads: per layer and token the
    attention norm's output (the Q, K, V projections' input), Q, K, V, the attention output (output_proj's
    input), the feed-forward norm's output (W1's and W3's input), W1x and W3x (SwiGLU's gate and the W2 input's
    factors); then the final norm's output and the logits (the model returns them). Naive attention adds its
    seq x seq probabilities per head (PV's input); a fused kernel keeps O(seq) statistics instead."""
    per_token = cfg.num_layers * (6 * cfg.d_model + 2 * cfg.d_ff) + cfg.d_model + cfg.vocab_size
    probabilities = cfg.num_layers * cfg.num_heads * seq * seq if attn == "naive" else 0
    return batch * (seq * per_token + probabilities)


def forward_bytes(cfg: ModelConfig, batch: int, seq: int, activation_bytes: int, attn: str = "naive") -> int:
    """Every matmul weight read once (fp32 master weights, 4 bytes, under autocast too) and the activations of
    saved_activations written once, `activation_bytes` each (4 fp32, 2 under bf16 autocast)."""
    return 4 * cfg.matmul_params + activation_bytes * saved_activations(cfg, batch, seq, attn)


def backward_bytes(cfg: ModelConfig, batch: int, seq: int, activation_bytes: int, attn: str = "naive") -> int:
    """The matmul weights read again, every parameter's gradient written once (fp32), the saved activations
    read once."""
    return 4 * cfg.matmul_params + 4 * cfg.num_params + activation_bytes * saved_activations(cfg, batch, seq, attn)


def optimizer_bytes(num_params: int) -> int:
    return ADAMW_BYTES_PER_PARAM * num_params


def attention_phase_bytes(batch: int, seq: int, d: int, element_bytes: int, materialized: bool) -> dict[str, int]:
    """Bytes of one causal attention call on (batch, seq, d) inputs. Fused (FlashAttention): forward reads Q, K,
    V and writes O and the log-sum-exp; backward reads Q, K, V, O, dO and the log-sum-exp, writes dQ, dK, dV:
    O(seq x d). Materialized (naive, torch.compile of it, SDPA's math backend) adds seq x seq tensors: forward
    writes the scores and reads them into the softmax, writes the probabilities and reads them into PV (4 passes);
    backward reads the probabilities, writes and reads dP and dS (5 passes)."""
    e, rows, square = element_bytes, batch * seq, batch * seq * seq * element_bytes
    forward = 4 * rows * d * e + rows * LSE_BYTES + (4 * square if materialized else 0)
    backward = 8 * rows * d * e + rows * LSE_BYTES + (5 * square if materialized else 0)
    return {"forward": forward, "backward": backward, "forward_backward": forward + backward}


def attention_phase_flops(batch: int, seq: int, d: int) -> dict[str, int]:
    """The useful work of causal attention: half of QK^T and PV forward (as FlashAttention counts); backward
    twice that (dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q), a fused kernel's recomputation not counted."""
    forward = attention_matmul_flops(batch, seq, d) // 2
    return {"forward": forward, "backward": 2 * forward, "forward_backward": 3 * forward}


# A ring collective over n ranks sends each rank's share of the message this many times over its link (NCCL's
# "bus bandwidth" factors, nccl-tests' PERFORMANCE.md): an all-reduce is a reduce-scatter then an all-gather.
RING_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


def collective_floor_ms(op: str, nbytes: int, world_size: int, link_gbs: float) -> float:
    """The least time of a ring collective of an `nbytes` message (the full tensor, as torch.distributed is
    given it) over links of `link_gbs` GB/s per direction; part 2's floor, bytes / the link's bandwidth."""
    return RING_FACTORS[op](world_size) * nbytes / (link_gbs * 1e9) * 1e3


def floor(flops: int, nbytes: int, tflops: float | None, gbs: float | None) -> dict[str, Any]:
    """max(FLOPs / peak, bytes / bandwidth) in ms and which term it was; a missing ceiling drops its term."""
    compute_ms = flops / (tflops * 1e12) * 1e3 if tflops else None
    memory_ms = nbytes / (gbs * 1e9) * 1e3 if gbs else None
    terms = {"compute": compute_ms, "memory": memory_ms}
    bound = max((k for k, v in terms.items() if v is not None), key=terms.get, default=None)
    return {"flops": flops, "bytes": nbytes, "compute_ms": compute_ms, "memory_ms": memory_ms,
            "floor_ms": terms[bound] if bound else None, "bound": bound}


def step_floors(cfg: ModelConfig, batch: int, seq: int, mode: str, activation_bytes: int, attn: str,
                tflops: float | None, gbs: float | None, num_params: int | None = None) -> dict[str, dict]:
    """The floor of each phase of `mode` and of the whole step (their sum) for model.TransformerLM; train mode's
    optimizer step is AdamW's bytes (num_params: the model's parameters, ours when None)."""
    out = {"forward": floor(forward_flops(cfg, batch, seq), forward_bytes(cfg, batch, seq, activation_bytes, attn),
                            tflops, gbs)}
    if mode != "forward":
        out["backward"] = floor(2 * forward_flops(cfg, batch, seq),
                                backward_bytes(cfg, batch, seq, activation_bytes, attn), tflops, gbs)
    if mode == "train":
        out["optimizer"] = floor(0, optimizer_bytes(num_params or cfg.num_params), tflops, gbs)
    if len(out) > 1 and all(f["floor_ms"] is not None for f in out.values()):
        bounds = {f["bound"] for f in out.values()}
        out["step"] = {"flops": sum(f["flops"] for f in out.values()), "bytes": sum(f["bytes"] for f in out.values()),
                       "floor_ms": sum(f["floor_ms"] for f in out.values()),
                       "bound": bounds.pop() if len(bounds) == 1 else "mixed"}
    return out


def beside_measured(floors: dict[str, dict], record: Record, roofs: dict[str, Any]) -> dict[str, Any]:
    """Each phase's floor beside its measured mean (`<phase>_ms_mean`): `of_floor` = floor / measured (1.0 would
    be the hardware's limit), achieved TFLOP/s; with the roofs it divided by."""
    for phase, f in floors.items():
        ms = record.get(f"{phase}_ms_mean")
        f["of_floor"] = f["floor_ms"] / ms if ms and f.get("floor_ms") else None
        f["achieved_tflops"] = f["flops"] / ms / 1e9 if ms and f["flops"] else None
    return {"phases": floors, "roofs": roofs}


def share(value: float) -> str:
    """A share of a floor as a percentage: whole percents, one significant digit below 1% (launch-bound phases)."""
    return f"{value:.0%}" if value >= 0.01 else f"{100 * value:.1g}%"


def floor_facts(records: list[Record]) -> list[str]:
    """study.py's line on the floors of a problem's records ([] when none has floors): each phase (each
    implementation's, for attention) at what share of its floor, a range over the configurations."""
    shares: dict[str, list[tuple[float, str]]] = {}
    for r in records:
        impl = (r.get("config") or {}).get("impl")
        for phase, f in ((r.get("floors") or {}).get("phases") or {}).items():
            if number(f.get("of_floor")) and phase != "step":
                name = f"{impl + ' ' if impl else ''}{phase.replace('forward_backward', 'fwd+bwd')}"
                shares.setdefault(name, []).append((f["of_floor"], f["bound"]))
    if not shares:
        return []
    ceilings = "/".join(dict.fromkeys(r["floors"]["roofs"]["ceiling"] for r in records if r.get("floors")))
    parts = []
    for name, got in shares.items():
        low, high = share(min(v for v, _ in got)), share(max(v for v, _ in got))
        parts.append(f"{name} at {low}{'-' + high if high != low else ''} of its "
                     f"{'/'.join(sorted({b for _, b in got}))} floor")
    over = any(v > 1 for got in shares.values() for v, _ in got)
    return [f"floors ({ceilings} ceiling; floor / measured time): " + ", ".join(parts)
            + ("; over 100%: faster than the floor, so that ceiling is too low to bound it (--recalibrate on an idle "
               "machine)" if over else "")]


# ---- statistics of interleaved comparisons ----
# Variants are timed in rounds, A B | B A | A B ..., so a drift of the machine falls on both sides alike. Each
# round gives one ratio; the speed-up is the Hodges-Lehmann estimate of the per-round log-ratios (the median
# of their Walsh averages) with the exact Wilcoxon signed-rank interval: a few wild rounds (a background job
# waking during one block) move it little, where a mean of ratios jumps. scipy is not a dependency and
# `statistics` has no signed-rank distribution, so the counts are built below.

CONFIDENCE = 0.95
MIN_ROUNDS_FOR_INTERVAL = 6  # 5 rounds of one sign still happen 2/32 of the time: no 95% interval below 6
EXACT_SIGNED_RANK_N = 50  # the exact null distribution up to this many rounds, normal approximation beyond
MAX_ROUNDS = 500  # more rounds are merged in neighbouring groups (n^2 Walsh averages)
DRIFT_MIN_CHANGE = 0.05  # a control phase that moved by less than 5% is not called drift


def summarize(samples: list[float]) -> dict[str, float | None]:
    """Mean, sample std (n-1), median, min, max, cv; one sample has no std (None, never a made-up 0)."""
    if not samples:
        return {}
    mean = statistics.fmean(samples)
    std = statistics.stdev(samples) if len(samples) > 1 else None
    return {"mean": mean, "std": std, "median": statistics.median(samples), "min": min(samples),
            "max": max(samples), "cv": std / mean if std is not None and mean else None, "n": len(samples)}


def round_order(variants: int, round_index: int) -> list[int]:
    """0..n-1 in even rounds, reversed in odd ones: A B | B A | A B ..."""
    return list(range(variants))[::-1 if round_index % 2 else 1]


def block_sizes(steps: int, block: int) -> list[int]:
    """`steps` timed steps taken in blocks of `block`: each round's block size (the last may be shorter)."""
    return [min(block, steps - start) for start in range(0, steps, block)]


def steps_per_block(step_s: float | None, steps: int, min_block_s: float) -> int:
    """Consecutive steps per variant: enough that a block lasts `min_block_s` (a switch costs cold caches),
    but leaving MIN_ROUNDS_FOR_INTERVAL rounds. `step_s`: a warm-up step's time; None: blocks of one step."""
    if step_s is None or step_s <= 0:
        return 1
    return max(1, min(math.ceil(min_block_s / step_s), steps // MIN_ROUNDS_FOR_INTERVAL))


def signed_rank_depth(n: int) -> int | None:
    """The interval runs from the k-th smallest to the k-th largest Walsh average, for the largest k with
    P(T <= k - 1) <= (1 - CONFIDENCE) / 2; None when even k = 1 covers less (n < 6). Exact up to
    EXACT_SIGNED_RANK_N (as R's wilcox.test), then the normal approximation with continuity correction."""
    tail = (1.0 - CONFIDENCE) / 2.0
    if n > EXACT_SIGNED_RANK_N:
        sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
        z = statistics.NormalDist().inv_cdf(1.0 - tail)
        return max(1, math.floor(n * (n + 1) / 4.0 - z * sd + 0.5))
    counts = [1] + [0] * (n * (n + 1) // 2)  # counts[t]: sign patterns of ranks 1..n whose positive ranks sum to t
    for rank in range(1, n + 1):
        for total in range(rank * (rank + 1) // 2, rank - 1, -1):
            counts[total] += counts[total - rank]
    below, k = 0, 0
    while (below + counts[k]) / 2**n <= tail:
        below += counts[k]
        k += 1
    return k or None


@dataclasses.dataclass(frozen=True)
class PairedRatio:
    """A speed-up (baseline time / variant time: above 1 is faster) with its interval (None: too few rounds);
    rounds = 0 when the two were measured apart (the ratio of their means)."""

    ratio: float
    low: float | None
    high: float | None
    rounds: int

    @property
    def resolved(self) -> bool | None:
        """True when the interval excludes 1, False when it contains 1, None without one."""
        return None if self.low is None else (self.low > 1.0 or self.high < 1.0)

    def interval_text(self) -> str | None:
        return None if self.low is None else f"{self.low:.2f}-{self.high:.2f}x"


def hodges_lehmann(paired: list[float]) -> tuple[float, float | None, float | None]:
    """Paired differences' Hodges-Lehmann estimate (the median of the Walsh averages) and the signed-rank test's
    95% interval (None, None: fewer than 6 rounds)."""
    walsh = sorted((paired[i] + paired[j]) / 2.0 for i in range(len(paired)) for j in range(i, len(paired)))
    depth = signed_rank_depth(len(paired))
    return statistics.median(walsh), *((None, None) if depth is None else (walsh[depth - 1], walsh[-depth]))


def paired_ratio(baseline: list[float], variant: list[float]) -> PairedRatio:
    """`variant`'s speed-up over `baseline` from per-round times: the log-ratios' HL estimate and interval."""
    if len(baseline) != len(variant) or not baseline:
        raise ValueError(f"need the same non-zero number of rounds, got {len(baseline)} and {len(variant)}")
    if len(baseline) > MAX_ROUNDS:  # neighbouring rounds merged: they stay paired
        group = math.ceil(len(baseline) / MAX_ROUNDS)
        baseline, variant = ([sum(t[i:i + group]) for i in range(0, len(t), group)]
                             for t in (baseline, variant))
    log_ratio, low, high = hodges_lehmann([math.log(b / v) for b, v in zip(baseline, variant)])
    low, high = (None, None) if low is None else (math.exp(low), math.exp(high))
    return PairedRatio(math.exp(log_ratio), low, high, len(baseline))


def round_times(record: Record, phases: tuple[str, ...]) -> list[float] | None:
    """Per round, the summed mean of `phases` (ms): pairing["rounds"] holds each round's [start, stop) in the
    `<phase>_ms` lists; rounds_by_phase overrides it per phase (do_bench's own counts)."""
    pairing = record.get("pairing")
    if not pairing or not all(f"{p}_ms" in record for p in phases):
        return None
    bounds = {p: pairing.get("rounds_by_phase", {}).get(p, pairing["rounds"]) for p in phases}
    return [sum(statistics.fmean(record[f"{p}_ms"][slice(*bounds[p][r])]) for p in phases)
            for r in range(len(pairing["rounds"]))]


def ratio_of_means(baseline: Record, variant: Record, phases: tuple[str, ...]) -> float:
    return sum(baseline[f"{p}_ms_mean"] for p in phases) / sum(variant[f"{p}_ms_mean"] for p in phases)


def speedup(baseline: Record, variant: Record, phases: tuple[str, ...]) -> PairedRatio:
    """Paired by round when measured as a pair (one group, as many rounds), else the ratio of the means."""
    a, b = baseline.get("pairing"), variant.get("pairing")
    if a and b and a["group"] == b["group"] and len(a["rounds"]) == len(b["rounds"]):
        return paired_ratio(round_times(baseline, phases), round_times(variant, phases))
    return PairedRatio(ratio_of_means(baseline, variant, phases), None, None, 0)


def interval_notes(unresolved: list[str], few_rounds: dict[str, tuple[int, str]], pulled: list[str],
                   calls: str) -> list[str]:
    """Notes: intervals containing 1, too few rounds (name -> (rounds, option)), means outside intervals."""
    notes = [f"not resolved (the interval contains 1): {', '.join(unresolved)}"] if unresolved else []
    notes += [f"{name}: {n} round{'s' * (n != 1)}, too few for a 95% interval "
              f"({knob} {MIN_ROUNDS_FOR_INTERVAL} or more)"
              for name, (n, knob) in few_rounds.items()]
    if pulled:
        notes.append(f"ratio of the means outside the interval (a few slow {calls} pull a mean): "
                     + ", ".join(pulled))
    return notes


@dataclasses.dataclass(frozen=True)
class Drift:
    phase: str
    change: float  # the variant's mean / the baseline's mean - 1


def drift(baseline: Record, variant: Record, phase: str) -> Drift | None:
    """A control phase (the same work in both variants) whose means differ by more than twice the standard
    error of the difference (Welch) and by DRIFT_MIN_CHANGE at least: the machine changed in between."""
    a, b = baseline.get(f"{phase}_ms"), variant.get(f"{phase}_ms")
    if not a or not b or len(a) < 2 or len(b) < 2:
        return None
    mean_a, mean_b = statistics.fmean(a), statistics.fmean(b)
    spread = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    if abs(mean_b - mean_a) > max(2 * spread, DRIFT_MIN_CHANGE * mean_a):
        return Drift(phase, mean_b / mean_a - 1.0)
    return None


# ---- tables ----

TABLE_FORMATS = sorted(tabulate_formats)
LATEX_FORMATS = ("latex", "latex_raw", "latex_booktabs", "latex_longtable")
REPORT_SUFFIXES = {"github": ".md", "pipe": ".md", "html": ".html", "unsafehtml": ".html", "rst": ".rst",
                   "tsv": ".tsv", **{fmt: ".tex" for fmt in LATEX_FORMATS}}
MODEL_SHAPE_COLUMNS = ("d_model", "d_ff", "layers", "heads")  # LaTeX tables leave them to the config table
RUN_KEY, RUN_COLUMN = "_run", "run"  # a merged record's run (a key no script writes), and its column


def parallel_label(config: Record) -> str | None:
    """"fsdp x8", "fsdp x8 bf16-params no-reshard", "ddp x2"; None for one process."""
    if not config.get("parallel"):
        return None
    fsdp = config["parallel"] == "fsdp"
    return (f"{config['parallel']} x{config['world_size']}"
            + " bf16-params" * (fsdp and config["fsdp_mixed_precision"] == "bf16")
            + " no-reshard" * (fsdp and not config["reshard_after_forward"]))


def as_report_file(text: str, fmt: str) -> str:
    """A report as its file holds it; LaTeX: a file to \\input, every line outside the tables a comment."""
    if fmt not in LATEX_FORMATS:
        return text
    out, in_table = [], False
    for line in text.splitlines():
        in_table = in_table or line.startswith(("\\begin{tabular}", "\\begin{longtable}"))
        out.append(line if in_table or not line.strip() else "% " + line)
        in_table = in_table and not line.startswith(("\\end{tabular}", "\\end{longtable}"))
    header = "% latex_booktabs needs \\usepackage{booktabs}; latex_longtable needs \\usepackage{longtable}.\n"
    return header + "\n".join(out) + "\n"


# ---- text from records is text: one escape per place it lands ----
# A record is data anyone can edit: what it says reaches a table, a writeup or LaTeX as the characters it holds,
# never as a new line, a table cell, a code fence, a command or text that reads backwards.

LINE_BREAKS = re.compile(r"\r\n|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")
HIDDEN = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")  # control, bidi


def one_line(text: Any) -> str:
    """`text` on one line: line breaks as spaces, control and bidi (right-to-left override) characters as U+FFFD."""
    return HIDDEN.sub("\ufffd", LINE_BREAKS.sub(" ", str(text).expandtabs(1)))


def md_text(text: Any) -> str:
    """`text` inside a line of markdown: one line, '\\' and '`' escaped (no code span or fence can open)."""
    return re.sub(r"([\\`])", r"\\\1", one_line(text))


def md_cell(text: Any) -> str:
    """`text` as a markdown table cell: md_text with '|' escaped (a '|' would start another cell)."""
    return md_text(text).replace("|", "\\|")


def md_unescape(text: str) -> str:
    """What md_text and md_cell escaped, as it was (the writeup's LaTeX reads the markdown back)."""
    return re.sub(r"\\([\\`|])", r"\1", text)


ASCII = {"×": "x", "±": "+/-", "≈": "~", "—": "--", "–": "-", "µ": "u", "μ": "u", "≤": "<=", "≥": ">=",
         "→": "->", "…": "...", "’": "'", "‘": "'", "“": '"', "”": '"', "√": "sqrt", "·": "*", "²": "^2",
         "§": "sec. "}
TEX_ESCAPE = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
              "_": r"\_\allowbreak{}", "/": r"/\allowbreak{}",  # a long path may break there, not run off the page
              "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}", "<": r"\textless{}",
              ">": r"\textgreater{}"}


def ascii_fold(text: str) -> str:
    """pdflatex's input: ASCII, the few symbols the tables use spelled out, anything else '?'."""
    return "".join(ASCII.get(ch, ch if ord(ch) < 128 else "?") for ch in one_line(text))


def latex_text(text: Any) -> str:
    """`text` as LaTeX text: one ASCII line, every special character escaped, '--' as two hyphens."""
    return two_hyphens("".join(TEX_ESCAPE.get(ch, ch) for ch in ascii_fold(text)))


# A writeup's compile (docs/study.md; the tests run the same): no shell escape, no file written outside its folder,
# and an error stops it instead of waiting for an answer.
PDFLATEX = "openout_any=p pdflatex -no-shell-escape -interaction=nonstopmode -halt-on-error"


def cell_for(fmt: str) -> Callable[[Any], Any]:
    """How a table of `fmt` holds a text cell: markdown escaped, latex_raw and unsafehtml escaped here (their
    formats leave text raw), any other one line (tabulate escapes latex and html itself)."""
    escape = {"github": md_cell, "pipe": md_cell, "latex_raw": latex_text,
              "unsafehtml": lambda text: html.escape(one_line(text))}.get(fmt, one_line)
    return lambda v: escape(v) if isinstance(v, str) else v


def render_table(rows: list[Record], columns: list[str], fmt: str = "github", floatfmt: str | list[str] = ".2f"
                 ) -> str:
    """The one table renderer: rows (dicts) under `columns`, any tabulate format; None, NaN, missing: ''; text
    escaped for the format (cell_for); floats rounded alike in a column with text too (tabulate would print them
    whole)."""
    cell, digits = cell_for(fmt), [floatfmt] * len(columns) if isinstance(floatfmt, str) else floatfmt
    texts = {c for c in columns if any(isinstance(row.get(c), str) for row in rows)}
    body = [[None if isinstance(v := row.get(c), float) and math.isnan(v) else format(v, digits[i])
             if isinstance(v, float) and c in texts else cell(v) for i, c in enumerate(columns)] for row in rows]
    text = tabulate(body, headers=[cell(str(c)) for c in columns], tablefmt=fmt, floatfmt=floatfmt, missingval="")
    return latex_rows(text) if fmt in LATEX_FORMATS else text


def replace_text(path: Path, text: str) -> None:
    """Write beside `path`, then rename over it: a full disk or Ctrl-C leaves the previous version, and a link at
    `path` is replaced, never the (student's) file it names."""
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(text)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def two_hyphens(latex: str) -> str:
    """'--' as two hyphens: T1 fonts print it as an en dash ('--quick' would read '–quick')."""
    return re.sub(r"-(?=-)", "-{}", latex)


def latex_rows(table: str) -> str:
    """A tabulate LaTeX table's rows made safe: one opening with "[" would be read as \\\\'s or \\midrule's
    optional argument (pdflatex loops on nsys's "[CUDA memcpy ...]"); "--" would print as an en dash."""
    return "\n".join(two_hyphens(re.sub(r"^(\s*)\[", r"\1{}[", line)) if line.endswith("\\\\")
                     else line for line in table.splitlines())


def pick_columns(default: list[str], requested: list[str] | None, fmt: str, has: list[str] | None = None
                 ) -> list[str]:
    """--columns as given (a merge's run column kept first), else `default` (LaTeX: without the model shape);
    with `has`, the requested columns this table has (`default` when it has none of them)."""
    if not requested:
        return [c for c in default if not (fmt in LATEX_FORMATS and c in MODEL_SHAPE_COLUMNS)]
    picked = ([RUN_COLUMN] if RUN_COLUMN in default and RUN_COLUMN not in requested else []) + requested
    return [c for c in picked if has is None or c in has or c == RUN_COLUMN] or default


def unknown_column(requested: list[str], valid: list[str]) -> str | None:
    unknown = [c for c in requested if c not in valid]
    if not unknown:
        return None
    return f"unknown column {unknown[0]!r}; " + ("valid columns: " + ", ".join(valid) if valid
                                                 else "this report has no table whose columns can be chosen")


def run_of(record: Record) -> str | None:
    return record.get(RUN_KEY)


def by_run(records: list[Record]) -> dict[str | None, list[Record]]:
    return {run: [r for r in records if run_of(r) == run] for run in dict.fromkeys(map(run_of, records))}


def is_merged(records: list[Record]) -> bool:
    return len(by_run(records)) > 1


def with_run_column(columns: list[str], records: list[Record]) -> list[str]:
    return [RUN_COLUMN] + columns if is_merged(records) else columns


def environment_header(env: Record, **extra: Any) -> str:
    """One line naming what the numbers were measured on, then `extra` settings."""
    parts = [f"device: {env['device_name']} ({env['device']})", f"torch {env['torch']}"]
    parts += [f"CUDA {env['cuda']}"] if env.get("cuda") else []
    parts += [f"Python {env['python']}"] if env.get("python") else []
    if str(env["device"]).startswith("cuda"):
        parts.append(f"TF32 matmul {'on' if env.get('tf32_matmul') else 'off'}")
    else:
        parts.append(f"{env.get('threads')} threads")
    return " | ".join(parts + [f"{k}: {v}" for k, v in extra.items()])


Setting = str | Callable[[Record], Any]  # a config key, or a function of the record


def environment_lines(records: list[Record], settings: dict[str, Setting]) -> list[str]:
    """The header above a report's tables: environment, then the values each of `settings` (config keys or
    functions of a record) takes, joined with 'and' (none: left out); in a merge, a line per run."""
    lines = []
    for run, group in by_run(records).items():
        found = {}
        for label, field in settings.items():
            values = [field(r) if callable(field) else (r.get("config") or {}).get(field) for r in group]
            if shown := [str(v) for v in dict.fromkeys(values) if v is not None]:
                found[label] = " and ".join(shown)
        env = next((r["environment"] for r in group if "device_name" in (r.get("environment") or {})), None)
        line = environment_header(env, **found) if env else " | ".join(f"{k}: {v}" for k, v in found.items())
        lines.append(f"{run}: {line}" if is_merged(records) else line)
    return lines


def comparison_rows(records: list[Record], variant: Callable[[Record], str], row: Callable[[Record], Record],
                    ratios: dict[str, tuple[str, ...]], *, times: dict[str, tuple[str, ...]] | None = None,
                    calls: str = "steps", more_rounds: str = "--steps", control: str | None = None,
                    per_variant: str | None = None,
                    cells: Callable[[Record, Record | None], Record] | None = None
                    ) -> tuple[list[str], list[Record], list[str]]:
    """(variants, the first the baseline; rows; notes). A row per `row(record)`: each variant's time per `times`
    label, each other's PairedRatio per `ratios` label (phases summed), notes; a failure shows its status.
    per_variant: a row per variant, a "speed-up" cell, `cells(record, baseline)`; `control`: checked for drift."""
    times = times or ratios
    names = list(dict.fromkeys(variant(r) for r in records))
    key = lambda r: json.dumps(row(r), sort_keys=True, default=str)  # noqa: E731
    # in a merge where a configuration is in two runs, each run is compared within itself: nothing is dropped
    pairs = [(key(r), variant(r)) for r in records]
    split = len(set(zip(map(run_of, records), pairs))) > len(set(pairs))
    by_row: dict[tuple[int, str], dict[str, Record]] = {}
    for i, group in enumerate(by_run(records).values() if split else [records]):
        for r in group:
            by_row.setdefault((i, key(r)), {})[variant(r)] = r

    def timed(r: Record | None, phases: tuple[str, ...]) -> bool:  # a WRONG kernel is timed all the same
        return r is not None and all(number(r.get(f"{p}_ms_mean")) for p in phases)

    def failure(r: Record | None) -> str | None:  # "OOM", "error", "not run": a failed row's status, no detail
        if r is None or not finished(r) and not timed(r, next(iter(times.values()))):
            return "not run" if r is None else r["status"].split(":")[0]
        return None

    def time_cells(r: Record | None, name: Callable[[str], str]) -> Record:  # numbers or statuses
        return {name(label): sum(r[f"{p}_ms_mean"] for p in phases) if timed(r, phases) else failure(r)
                for label, phases in times.items()}

    rows, below = [], ([], {}, [], [])  # per_variant: unresolved, few rounds, pulled, other notes, all rows
    for found in by_row.values():
        runs = {RUN_COLUMN: ", ".join(map(str, by_run(list(found.values()))))} if is_merged(records) else {}
        ident: Record = {**runs, **row(next(iter(found.values())))}
        base, paired = found.get(names[0]), set()
        unresolved, few, pulled, others = below if per_variant else ([], {}, [], [])
        where = " ".join(f"{k}={v}" for k, v in ident.items()) + " " if per_variant else ""
        out = {**ident, **time_cells(base, lambda label: f"{label} ms: {names[0]}")}
        for name in names[1:]:
            if (r := found.get(name)) is None and per_variant:
                continue
            found_ratios = {}
            for label, phases in ratios.items():
                if not (timed(base, phases) and timed(r, phases)):
                    found_ratios[label] = failure(r) or (f"baseline {failure(base)}" if failure(base) else None)
                    continue
                found_ratios[label] = s = speedup(base, r, phases)
                paired.update((names[0], name) if s.rounds else ())
                if s.resolved is False:
                    interval = f" ({s.interval_text()})" if per_variant else ""
                    unresolved.append(f"{where}{label} {name}{interval}")
                if s.rounds and s.low is None:  # rounds are steps (calls), or whole runs (--interleave runs)
                    runs = (base.get("pairing") or {}).get("mode") == "runs"
                    few[name] = (s.rounds, "--interleave runs --repeats" if runs else more_rounds)
                # a few slow steps pull a mean: the ratio of the means outside the paired interval
                if s.low is not None and not s.low <= (means := ratio_of_means(base, r, phases)) <= s.high:
                    pulled.append(f"{where}{label} {name} {means:.2f}x")
            if per_variant:
                failed = (s for s in found_ratios.values() if not isinstance(s, PairedRatio))  # a status or None
                rows.append({**ident, per_variant: name, **time_cells(base, lambda label: f"{names[0]} {label}"),
                             **time_cells(r, lambda label: f"{label} ms"), "speed-up": next(failed, found_ratios),
                             **(cells(r, base) if cells else {})})
            else:
                out.update(time_cells(r, lambda label: f"{label} ms: {name}"))
                out.update({f"{label} speed-up: {name}": s for label, s in found_ratios.items()})
            if control and base and r and (moved := drift(base, r, control)):
                others.append(f"{where}drift: {control} changed by {moved.change:+.0%} ({name})")
        # a paired ratio says how sure it is (its interval); "noisy" is left for rows measured apart
        noisy = [n for n, r in found.items() if r["status"] == "noisy" and n not in paired]
        others += [f"{where}noisy: {', '.join(noisy)}"] if noisy else []
        if not per_variant:
            out["notes"] = "; ".join(interval_notes(unresolved, few, pulled, calls) + others) or None
            rows.append(out)
    return names, rows, interval_notes(*below[:3], calls) + below[3] if per_variant else []


def comparison_table(records: list[Record], variant: Callable[[Record], str], row: Callable[[Record], Record],
                     ratios: dict[str, tuple[str, ...]], fmt: str = "github",
                     columns: list[str] | None = None, floatfmt: str = ".2f", **options: Any) -> str | None:
    """comparison_rows' table (`options`: its keywords), what a speed-up means, the notes; None for one
    variant. A speed-up reads "1.93x (1.85-2.01x)" (estimate, 95% interval), per_variant "1.93/1.40/1.52x"."""
    names, rows, notes = comparison_rows(records, variant, row, ratios, **options)
    if len(names) < 2:
        return None
    for out in rows:
        for c, v in out.items():
            if isinstance(v, PairedRatio):
                out[c] = f"{v.ratio:.2f}x" + (f" ({v.interval_text()})" if v.low is not None else "")
            elif isinstance(v, dict):
                out[c] = "/".join(f"{s.ratio:.2f}" for s in v.values()) + "x"
            elif isinstance(v, float):  # a column of numbers and statuses is text to tabulate: formatted here
                out[c] = f"{v:{floatfmt}}"
    # each phase's times side by side, then each variant's speed-ups
    order = [f"{label} ms: {n}" for label in options.get("times") or ratios for n in names]
    order += [f"{label} speed-up: {n}" for n in names[1:] for label in ratios]
    default = sorted(dict.fromkeys(c for out in rows for c in out if c != "notes"),
                     key=lambda c: order.index(c) if c in order else -1)  # the configuration's cells first
    default += ["notes"] if any(out.get("notes") for out in rows) else []
    table = render_table(rows, pick_columns(default, columns, fmt, has=default), fmt, floatfmt)
    note = (f"Speed-up = the time of {names[0]} / the variant's (above 1: faster): for variants measured "
            "together, the Hodges-Lehmann estimate over the per-round ratios of their interleaved "
            f"{options.get('calls', 'steps')} (A B B A ...) with its 95% Wilcoxon signed-rank interval (not "
            "resolved when it contains 1); for rows measured apart, the ratio of the means.")
    return "\n".join([table, "", note, *(f"- {n}" for n in notes)])


# ---- result files and records ----

# A stem names files inside the results folder only: no folder, no leading '.' (hidden, '..') or '-' (a flag
# to the next command), and short enough that "<stem>-<n>_timeline.png" stays under 255 bytes.
MAX_STEM_BYTES = 200


def result_stem(text: str) -> str:
    """--out: a plain file-name stem, checked at parse time."""
    problems = [(not text, "must be a non-empty file-name stem"),
                ("/" in text or "\\" in text,  # os.sep and os.altsep are among them
                 f"must be a file-name stem without a folder, got {text!r} (use --results-dir to choose the folder)"),
                (text[:1] in (".", "-"), f"must not start with '.' or '-', got {text!r}"),
                (not text.isprintable(), f"must be printable characters only, got {text!r}"),
                (len(text.encode(errors="replace")) > MAX_STEM_BYTES, f"must be at most {MAX_STEM_BYTES} bytes long")]
    for broken, problem in problems:
        if broken:
            raise argparse.ArgumentTypeError(problem)
    return text


def stem_from(name: str, default: str) -> str:
    """`name` made a stem by --out's rules (bad characters replaced, cut); `default` when nothing is left."""
    text = "".join(c if c.isprintable() and c not in "/\\" else "_" for c in name).lstrip(".-")
    text = text.encode()[:MAX_STEM_BYTES].decode(errors="ignore")  # printable: no lone surrogates left
    return text or default


def results_folder(text: str) -> str:
    """--results-dir: a folder (created when missing); a file there is refused at parse time."""
    if not text:
        raise argparse.ArgumentTypeError("must be a folder name, got ''")
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
    return text


def to_json_line(record: Record) -> str:
    """`record` as strict JSON: NaN and infinities as None (json writes them as tokens, read back as None),
    dataclasses as dicts, paths and torch dtypes and devices as their names (by module: this file needs no torch)."""
    def plain(obj: Any) -> Any:
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return dataclasses.asdict(obj)
        if isinstance(obj, Path) or type(obj).__module__.split(".")[0] == "torch":
            return str(obj)
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")
    loose = json.dumps(record, default=plain)
    return json.dumps(json.loads(loose, parse_constant=lambda token: None), allow_nan=False)


READ_LIMIT_ENV = "CS336_READ_LIMIT_MB"  # how much one record file or expanded trace may hold


class TooLarge(ValueError):
    """A file whose contents would not fit in memory as Python objects: refused in one line."""


def read_limit_bytes() -> tuple[int, str]:
    """(bytes, where the limit comes from): $CS336_READ_LIMIT_MB, else a twentieth of the memory this process may
    use (a record file's rows, parsed and rendered, take ~14x its text; measured: 25 MiB of bench_e2e rows)."""
    given = os.environ.get(READ_LIMIT_ENV, "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given) * MIB, f"{READ_LIMIT_ENV}={given}"
    usable = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), resource.getrlimit(resource.RLIMIT_AS)[0]]
    return min(m for m in usable if m != resource.RLIM_INFINITY) // 20, \
        f"a twentieth of the memory this process may use, ulimit -v included; {READ_LIMIT_ENV}=MB sets it"


def too_large(path: str | os.PathLike, what: str) -> str:
    """The one line that refuses a file past the read limit."""
    limit, why = read_limit_bytes()
    return f"{path}: {what} holds more than {limit // MIB} MiB ({why}): refused: parsed, it would not fit in memory"


def read_bounded(f: Any, path: str | os.PathLike, what: str) -> bytearray:
    """All of the binary file `f` up to the read limit, a MiB at a time (a gzip file: as it expands, so a bomb
    stops at the limit); past it, TooLarge."""
    limit, data = read_limit_bytes()[0], bytearray()
    while chunk := f.read(min(MIB, limit + 1 - len(data))):
        data += chunk
    if len(data) > limit:
        raise TooLarge(too_large(path, what))
    return data


def parse_int_or_inf(text: str) -> int | float:
    """json's parse_int for records read to be used: an integer past float's range is infinity (one "inf" cell; as
    an int, tabulate, division and formatting refuse it: OverflowError)."""
    return float(text) if math.isinf(float(text)) else int(text)


def read_records(path: str | os.PathLike) -> list[Record]:
    """A .jsonl file's records (TooLarge past the read limit)."""
    with open(path, "rb") as f:
        return [json.loads(line, parse_int=parse_int_or_inf)
                for line in read_bounded(f, path, "the record file").splitlines() if line.strip()]


def exit_usage_error(message: str) -> NoReturn:
    """A user mistake found after parsing: one line, exit 2."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


class ResultFiles:
    """`<results_dir>/<subdir>/<stem>.{jsonl,md}` for one run: <stem>, <stem>-2, ... the first no file has,
    reserved by creating <stem><reserve> with O_EXCL (two runs never share one). Records are appended whole,
    reports replaced atomically. Exit 2 for an unwritable folder; 1 for a later failed write (a full disk)."""

    def __init__(self, results_dir: str | os.PathLike, subdir: str, stem: str | None, default_stem: str,
                 reserve: str = ".jsonl"):
        self.folder = Path(results_dir) / subdir
        self.records_written = 0
        self.records_elsewhere: str | None = None  # report.py: the inputs holding the records it renders
        wanted = stem or f"{default_stem}-{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M%S}"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for candidate in itertools.chain([wanted], (f"{wanted}-{n}" for n in itertools.count(2))):
                if any(p.name.startswith((candidate + ".", candidate + "_")) for p in self.folder.iterdir()):
                    continue
                # atomic: of two runs that both saw the stem free, exactly one creates the file
                with contextlib.suppress(FileExistsError):
                    open(self.folder / (candidate + reserve), "x").close()
                    self.stem = candidate
                    break
        except OSError as exc:
            exit_usage_error(f"cannot write results in {self.folder}: {exc.strerror or exc}")
        self.reserved, self.jsonl, self.markdown = self.path(reserve), self.path(".jsonl"), self.path(".md")
        if stem and self.stem != stem:
            progress(f"note: results for {stem!r} already exist; writing {self.stem!r} instead")

    def release(self) -> None:
        """Give the stem back when nothing was written: remove the empty reserved file."""
        with contextlib.suppress(OSError):
            if self.records_written == 0 and self.reserved.stat().st_size == 0:
                self.reserved.unlink()

    def path(self, suffix: str) -> Path:
        return self.folder / f"{self.stem}{suffix}"

    def kept(self) -> str:
        if self.records_elsewhere:
            return f"the records are unchanged in {self.records_elsewhere}"
        if self.records_written:
            return f"the {self.records_written} record(s) written before it are kept in {self.jsonl}"
        return "no record of this run was written"

    def _failed(self, path: Path, exc: OSError, more: str = "") -> NoReturn:
        self.release()
        progress(f"error: cannot write {path}: {exc.strerror or exc}; {self.kept()}{more}")
        raise SystemExit(1)

    def append_record(self, record: Record) -> None:
        """One line of strict JSON, whole or not at all: unbuffered (a buffered file writes a failed remainder
        again on close), cut back when a write fails; then the record goes to stdout, exit 1."""
        line = (to_json_line(record) + "\n").encode()
        try:
            with open(self.jsonl, "ab", buffering=0) as f:
                end, view = f.tell(), memoryview(line)
                try:
                    while view:  # a short write (a disk filling up): write the rest
                        view = view[os.write(f.fileno(), view):]
                except BaseException:
                    with contextlib.suppress(OSError):
                        f.truncate(end)
                    raise
        except OSError as exc:
            emit(line.decode().rstrip("\n"))
            self._failed(self.jsonl, exc, "; the record that could not be written is printed on stdout")
        self.records_written += 1

    def _replace(self, path: Path, text: str) -> None:
        try:
            replace_text(path, text if text.endswith("\n") else text + "\n")
        except OSError as exc:
            self._failed(path, exc)
            raise

    def write_report(self, render: Callable[[str], str], fmt: str) -> str:
        """Save the report `render(fmt)` makes: the .md always in markdown, the file of `fmt` beside it."""
        text, suffix = render(fmt), REPORT_SUFFIXES.get(fmt, ".txt")
        self._replace(self.markdown, text if suffix == ".md" else render("github"))
        if suffix != ".md":
            self._replace(self.path(suffix), as_report_file(text, fmt))
        return text

    def say_written(self, fmt: str, extra_paths: list[Any] = ()) -> None:
        paths = dict.fromkeys([self.markdown, self.path(REPORT_SUFFIXES.get(fmt, ".txt")), self.jsonl, *extra_paths])
        emit("\nwrote " + " and ".join(str(p) for p in paths if p != self.jsonl or p.is_file()))

    def publish(self, render: Callable[[str], str], fmt: str, extra_paths: list[Any] = ()) -> None:
        """Save the report, print it, say where the files are (files first: a closed stdout loses nothing)."""
        if emit(self.write_report(render, fmt)):
            self.say_written(fmt, extra_paths)


# ---- the command line ----


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's default said once: none added to a help that names it, or to a default of None/False."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is False or "default" in text:
            return text
        return super()._get_help_string(action)


class ArgParser(argparse.ArgumentParser):
    """argparse with a one-line error (`prog: error: message (see --help)`, exit 2), from rank 0 only."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        rank_0 = os.environ.get("RANK", "0") == "0"
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n" if rank_0 else None)


INT64_MAX = 2**63 - 1  # torch's sizes are int64: a larger dimension can never be allocated
MAX_STEPS = 1_000_000  # raw samples are kept in the record (~20 bytes each): a million is a 20 MB line
SEED_RANGE = (-(2**63), 2**64 - 1)  # torch.manual_seed's documented range


def _bounded(kind: type, low: float, high: float, what: str) -> Callable[[str], Any]:
    """An argparse type: `kind(text)` within [low, high], else "must be <what>" (exit 2)."""
    def parse(text: str) -> Any:
        value = kind(text)  # a non-number is argparse's "invalid ... value"
        if not (low <= value <= high and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value
    parse.__name__ = kind.__name__  # argparse's "invalid int value: 'x'"
    return parse


positive_int = _bounded(int, 1, INT64_MAX, f"a positive integer at most {INT64_MAX} (int64)")
non_negative_int = _bounded(int, 0, INT64_MAX, f">= 0 and at most {INT64_MAX} (int64)")
step_count = _bounded(int, 1, MAX_STEPS, f"a positive integer at most {MAX_STEPS:,} (raw samples are kept)")
warmup_count = _bounded(int, 0, MAX_STEPS, f">= 0 and at most {MAX_STEPS:,}")
seed_int = _bounded(int, *SEED_RANGE, f"within torch.manual_seed's range [{SEED_RANGE[0]}, {SEED_RANGE[1]}]")
positive_float = _bounded(float, math.ulp(0.0), math.inf, "a positive finite number")
non_negative_float = _bounded(float, 0.0, math.inf, "a finite number >= 0")


def refuse(parser: argparse.ArgumentParser, rules: list[tuple[bool, str]]) -> None:
    """The first rule whose condition holds is the user's mistake: one line, exit 2."""
    for broken, message in rules:
        if broken:
            parser.error(message)


def check_tensor_sizes(parser: argparse.ArgumentParser, shapes: dict[str, tuple[int, ...]]) -> None:
    """A tensor of more bytes than int64 counts (8 bytes per element, the widest here) is a usage error."""
    for name, shape in shapes.items():
        if math.prod(shape) * 8 > INT64_MAX:
            parser.error(f"the {name} tensor {tuple(shape)} would have more than 2**63 bytes; "
                         "use smaller sizes")


def add_device_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:N")


def add_workload_args(parser: argparse.ArgumentParser, modes: Any, dtypes: Any, attentions: Any, *,
                      several_modes: bool, several_warmups: bool, warmup: int, steps: int) -> None:
    """--mode, --dtype, --attn, --warmup, --steps, --seed: the LM workload (bench_e2e, mem_profile)."""
    parser.add_argument("--mode", nargs="+" if several_modes else None, choices=list(modes),
                        default=["forward", "train"] if several_modes else "train",
                        help="forward only, forward+backward, or a full training step "
                             "(forward, backward, AdamW)")
    parser.add_argument("--dtype", nargs="+", choices=list(dtypes), default=["fp32"],
                        help="fp32, or bf16/fp16 autocast mixed precision (fp32 master weights; fp16 with a "
                             "grad scaler); several to compare them")
    parser.add_argument("--attn", nargs="+", choices=list(attentions), default=None,
                        help="our model's attention: naive = softmax(QK^T)V in the model's own code, sdpa = "
                             "torch's fused scaled_dot_product_attention; both to compare them "
                             "(default: naive)")
    parser.add_argument("--warmup", type=warmup_count, nargs="+" if several_warmups else None,
                        default=[warmup] if several_warmups else warmup,
                        help="untimed warm-up steps before the timed ones"
                             + (" (several: the warm-up study)" if several_warmups else ""))
    parser.add_argument("--steps", type=step_count, default=steps, help="timed steps")
    parser.add_argument("--seed", type=seed_int, default=0, help="random seed for weights and data")


def add_size_args(parser: argparse.ArgumentParser, default_help: str) -> None:
    parser.add_argument("--size", nargs="+", default=None, metavar="SIZE",
                        help="model preset(s) of the handout's Table 1 ("
                             + "; ".join(f"{h.name}: {', '.join(h.presets)}" for h in HANDOUTS.values())
                             + f"), or 'all' for its Table 1 (default: {default_help})")
    add_handout_arg(parser)


SHAPE_FLAGS = {"d_model": "d_model", "d_ff": "d_ff", "num_layers": "number of layers", "num_heads": "number of heads",
               "vocab_size": "vocabulary size"}


def add_shape_args(parser: argparse.ArgumentParser, help_: str, **flags: str) -> None:
    """--d-model, --d-ff, --num-layers, --num-heads, --vocab-size (and `flags`, by dest: what they change), each
    a positive integer or None, with help_.format(what)."""
    for dest, what in {**SHAPE_FLAGS, **flags}.items():
        parser.add_argument("--" + dest.replace("_", "-"), type=positive_int, default=None, help=help_.format(what))


def add_handout_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--handout", choices=list(HANDOUTS), default=None,
                        help="which handout's Table 1 the size names and the defaults come from: "
                             + ", ".join(f"{h.name} = {h.version}" for h in HANDOUTS.values())
                             + f" (default: ${HANDOUT_ENV} if set, else {DEFAULT_HANDOUT})")


def handout_or_exit(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Handout:
    """--handout, else $CS336_HANDOUT, else the current one, into args.handout and args.handout_source."""
    if args.handout is not None:
        args.handout_source = "--handout"
    elif os.environ.get(HANDOUT_ENV, "").strip():
        args.handout, args.handout_source = os.environ[HANDOUT_ENV].strip(), HANDOUT_ENV
        if args.handout not in HANDOUTS:
            parser.error(f"{HANDOUT_ENV}={args.handout!r} is not a handout; "
                         f"valid handouts: {', '.join(HANDOUTS)}")
    else:
        args.handout, args.handout_source = DEFAULT_HANDOUT, "default"
    return HANDOUTS[args.handout]


def sizes_or_exit(parser: argparse.ArgumentParser, args: argparse.Namespace, names: list[str]) -> list[str]:
    """expand_sizes (a bad name: exit 2), with a note when the default handout's size is another model in
    the other handout (xl)."""
    try:
        sizes = expand_sizes(names, args.handout)
    except ConfigError as exc:
        parser.error(str(exc))
    mine = HANDOUTS[args.handout].presets
    for size, other in itertools.product(sizes if args.handout_source == "default" else [], HANDOUTS.values()):
        if (theirs := other.presets.get(size, mine[size])) != mine[size]:
            progress(f"note: {size} is handout {args.handout}'s {size} (d_model {mine[size].d_model}, "
                     f"{mine[size].num_layers} layers), not handout {other.name}'s "
                     f"(d_model {theirs.d_model}, {theirs.num_layers} layers): "
                     f"for that one pass --handout {other.name} "
                     f"(or set {HANDOUT_ENV}={other.name})")
    return sizes


def add_dry_run_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true",
                        help="print the configurations that would run, numbered, and exit: nothing is built, "
                             "run or written")


def print_dry_run(labels: list[str], preamble: str, notes: list[str] = (), at_most: bool = False) -> int:
    """--dry-run: the preamble (the settings or sizes), the numbered plan, the notes. Returns the exit status."""
    print(preamble + "\n")
    count = f"{'at most ' if at_most else ''}{len(labels)} configuration{'s' if len(labels) != 1 else ''}"
    print(f"dry run: {count} would run, in this order:")
    for i, label in enumerate(labels, 1):
        print(f"  {i:>{len(str(len(labels)))}}. {label}")
    for note in notes:
        print("\n" + note)
    print("\nnothing was built, run or written (drop --dry-run to run them)")
    return 0


def add_output_args(parser: argparse.ArgumentParser, default_stem: str) -> None:
    parser.add_argument("--fmt", default="github", choices=TABLE_FORMATS, metavar="FMT",
                        help="tabulate table format: github (markdown, default), latex_booktabs, plain, ...")
    parser.add_argument("--out", default=None, type=result_stem,
                        help=f"result file stem inside the results folder (default: {default_stem}); an existing result is "
                             "never overwritten: a numbered suffix is added instead")
    parser.add_argument("--results-dir", default="results", type=results_folder,
                        help="root folder for result files (created when missing)")


# ---- output and signals ----


def alive(pid: int) -> bool:
    """Whether process `pid` runs on this machine (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # kill's default, and a closed terminal: both stop as Ctrl-C does


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the run is, so that it stops as Ctrl-C does."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(signum)
        self.signum = signum


def signal_number(stop: KeyboardInterrupt) -> int:
    return stop.signum if isinstance(stop, Terminated) else signal.SIGINT


def signal_name(stop: KeyboardInterrupt) -> str:
    return signal.Signals(signal_number(stop)).name if isinstance(stop, Terminated) else "Ctrl-C"


def stop_process_group(proc: subprocess.Popen, signum: int = signal.SIGTERM, grace_s: float = 30) -> None:
    """`signum` to a child started with start_new_session=True and all it started; SIGKILL after `grace_s` to what
    is left of the group (a process it started may outlive it: nsys exits before the run it profiles)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signum)
        deadline = time.monotonic() + grace_s
        while proc.poll() is None or os.killpg(proc.pid, 0) is None:  # raises once the whole group is gone
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
    proc.wait()


@contextlib.contextmanager
def handling_signal(signum: int, handler: Any) -> Iterator[None]:
    """`handler` for `signum` while the block runs, the previous one back afterwards; outside the main thread,
    which alone gets signals, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)


def _raise_terminated(signum: int, frame: Any) -> NoReturn:
    raise Terminated(signum)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Terminated while the block runs (SIGHUP not under nohup, which ignores it)."""
    with contextlib.ExitStack() as stack:
        for signum in STOP_SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN or signum == signal.SIGTERM:
                stack.enter_context(handling_signal(signum, _raise_terminated))
        yield


# What a watchdog runs: it reads a pipe whose other end only the parent holds. A "done" from the parent: its
# child ended; end of file unsaid: the parent is gone (kill -9, its terminal closed), so the child's process group
# is stopped, SIGTERM, then SIGKILL after the grace. -I -S: no site, no working directory on its path.
WATCHDOG = """import os, signal, sys, time
group, grace = int(sys.argv[1]), float(sys.argv[2])
if os.read(0, 4):
    sys.exit()
for sig in (signal.SIGTERM, signal.SIGKILL):
    deadline = time.monotonic() + grace
    try:
        os.killpg(group, sig)
        while time.monotonic() < deadline:
            os.killpg(group, 0)
            time.sleep(0.05)
    except ProcessLookupError:
        sys.exit()
"""


@contextlib.contextmanager
def process_group(argv: list[str], grace_s: float = 30, **popen: Any) -> Iterator[subprocess.Popen]:
    """`argv` started in a process group of its own (start_new_session: Ctrl-C reaches only this process, which
    stops it), watched: if this process dies (even by kill -9) a watchdog stops the whole group, so nothing it
    started measures beside the next run. Still running at the block's end: stopped (stop_process_group)."""
    proc = subprocess.Popen(argv, start_new_session=True, **popen)
    read, write = os.pipe()
    try:
        watchdog = subprocess.Popen([sys.executable, "-I", "-S", "-c", WATCHDOG, str(proc.pid), str(grace_s)],
                                    stdin=read, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
    except BaseException:
        stop_process_group(proc, grace_s=grace_s)
        raise
    finally:
        os.close(read)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            stop_process_group(proc, grace_s=grace_s)
        with contextlib.suppress(OSError):
            os.write(write, b"done")
        os.close(write)
        watchdog.wait()


def progress(message: str) -> None:
    """Progress and notes go to stderr, so stdout stays a clean table."""
    print(message, file=sys.stderr, flush=True)


def emit(text: str) -> bool:
    """Print to stdout; False once stdout is closed (`| head -1`): later output goes to /dev/null, so no
    BrokenPipeError interrupts the work."""
    try:
        print(text, flush=True)
        return True
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        progress("stdout was closed: the rest of the report is only in the result files")
        return False
