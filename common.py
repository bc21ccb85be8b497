"""Shared machinery for every experiment script: presets, device and precision contexts, the synchronised
timer, NVTX / profiler ranges, hardware peaks, the environment record, tables, result files and the
child-process runner.

Nothing here does work at import time or changes global state on import.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import multiprocessing
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import threading
import timeit
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn

import torch
from tabulate import tabulate, tabulate_formats

# ---- model configuration and presets ----


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of the Transformer LM in model.py (the course's reference "basics" model)."""

    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int = 10_000
    context_length: int = 128  # longest sequence the RoPE cache covers
    rope_theta: float = 10_000.0

    def __post_init__(self) -> None:
        for name in ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "context_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if self.d_head % 2:
            raise ValueError(f"d_model / num_heads = {self.d_head} must be even for RoPE (it rotates pairs)")

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads

    @property
    def matmul_params(self) -> int:
        """Parameters used as matmul weights: every Linear (attention, SwiGLU, lm_head); not the embedding
        lookup and not the RMSNorm gains."""
        per_layer = 4 * self.d_model * self.d_model + 3 * self.d_model * self.d_ff
        return self.num_layers * per_layer + self.d_model * self.vocab_size

    @property
    def num_params(self) -> int:
        """Exact parameter count of model.py's TransformerLM (untied embedding and lm_head)."""
        norms = (2 * self.num_layers + 1) * self.d_model
        return self.matmul_params + self.vocab_size * self.d_model + norms


# ---- the study's handouts ----
# The model sizes of the study's Table 1 (vocab 10,000) changed between the handout students worked from in
# Spring 2025 (the writeups people published) and the current one (assignment 2 v26.1.1, Spring 2026): the same
# name can mean a different model, so every script resolves names in one handout's table and says which.
# Rows shared by both handouts are written once and referenced by both dicts.

TINY = ModelConfig(d_model=512, d_ff=1344, num_layers=4, num_heads=16)  # the CPU size, not in Table 1
_SMALL = ModelConfig(d_model=768, d_ff=3072, num_layers=12, num_heads=12)
_MEDIUM = ModelConfig(d_model=1024, d_ff=4096, num_layers=24, num_heads=16)
_LARGE = ModelConfig(d_model=1280, d_ff=5120, num_layers=36, num_heads=20)
_D2560 = ModelConfig(d_model=2560, d_ff=10240, num_layers=32, num_heads=32)  # 2026's xl = 2025's 2.7B

PRESETS_2026: dict[str, ModelConfig] = {
    "tiny": TINY, "small": _SMALL, "medium": _MEDIUM, "large": _LARGE, "xl": _D2560,
    "10B": ModelConfig(d_model=4608, d_ff=12288, num_layers=50, num_heads=36),
}
PRESETS_2025: dict[str, ModelConfig] = {
    "tiny": TINY, "small": _SMALL, "medium": _MEDIUM, "large": _LARGE,
    "xl": ModelConfig(d_model=1600, d_ff=6400, num_layers=48, num_heads=25), "2.7B": _D2560,
}


@dataclass(frozen=True)
class Handout:
    """One handout of the study: its Table 1 and the setups its questions name."""

    name: str  # what --handout and CS336_HANDOUT take
    version: str  # how the course names it
    presets: dict[str, ModelConfig]  # Table 1 plus tiny
    default_context_length: int  # the benchmarking script's default sequence length
    memory_size: str  # memory_profiling: the size ...
    memory_contexts: tuple[int, ...]  # ... and its context lengths
    # gradient_checkpointing (b): (size, batch, context), or None where the handout has no such question
    checkpoint_setup: tuple[str, int, int] | None

    @property
    def table1(self) -> list[str]:
        """The sizes of the handout's Table 1 (what --size all runs): every preset but the CPU size."""
        return [name for name in self.presets if name != "tiny"]

    @property
    def title(self) -> str:
        return f"handout {self.name} ({self.version})"


HANDOUTS: dict[str, Handout] = {
    "2026": Handout("2026", "v26.1.1", PRESETS_2026, default_context_length=512, memory_size="xl",
                    memory_contexts=(128, 2048), checkpoint_setup=("xl", 4, 2048)),
    "2025": Handout("2025", "Spring 2025", PRESETS_2025, default_context_length=128, memory_size="2.7B",
                    memory_contexts=(128, 256, 512), checkpoint_setup=None),
}
DEFAULT_HANDOUT = "2026"  # the current handout
HANDOUT_ENV = "CS336_HANDOUT"  # set once in the shell instead of --handout on every command
DEFAULT_BATCH_SIZE = 4


def get_handout(name: str) -> Handout:
    if name not in HANDOUTS:
        raise ValueError(f"unknown handout {name!r}; valid handouts: {', '.join(HANDOUTS)}")
    return HANDOUTS[name]


def get_config(name: str, handout: str = DEFAULT_HANDOUT, **overrides: Any) -> ModelConfig:
    """The preset called exactly `name` in `handout`'s table, at that handout's default context length, with
    any non-None overrides applied (and validated). A name only the other handout has says which one has it."""
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
        raise ValueError(f"preset {name!r} is in handout {elsewhere[0]}'s table, not in handout {handout.name}'s "
                         f"({', '.join(handout.presets)}); use --handout {elsewhere[0]} "
                         f"(or {HANDOUT_ENV}={elsewhere[0]})")
    raise ValueError(f"unknown preset {name!r}; valid presets in handout {handout.name}: "
                     f"{', '.join([*handout.presets, *also_valid])}")


def expand_sizes(names: list[str], handout: str) -> list[str]:
    """--size values with 'all' replaced by the handout's Table 1 (in order, no repeats), each checked
    (ValueError naming the valid presets, or the handout that has the name)."""
    sizes: list[str] = []
    chosen = get_handout(handout)
    for name in names:
        if name != "all":
            _check_preset(name, chosen, also_valid=("all",))
        for size in chosen.table1 if name == "all" else [name]:
            if size not in sizes:
                sizes.append(size)
    return sizes


def config_row(name: str, cfg: ModelConfig) -> dict[str, Any]:
    """One row describing a model config, as people quote it."""
    return {"size": name, "d_model": cfg.d_model, "d_ff": cfg.d_ff, "layers": cfg.num_layers,
            "heads": cfg.num_heads, "vocab": cfg.vocab_size, "params": cfg.num_params}


def config_table(models: list[tuple[str, ModelConfig]], handout: Handout, fmt: str = "github") -> str:
    """The model configurations of a run, one row per size (context lengths aside), under a line naming the
    handout whose table the names come from."""
    seen = dict.fromkeys((size, dataclasses.replace(cfg, context_length=1)) for size, cfg in models)
    rows = [config_row(size, cfg) for size, cfg in seen]
    for row in rows:
        row["params"] = f"{row['params']:,}"
    return (f"Model sizes from {handout.title}:\n\n"
            + render_table(rows, ["size", "d_model", "d_ff", "layers", "heads", "vocab", "params"], fmt))


# ---- FLOPs ----
# Counting convention: a multiply-add is 2 FLOPs, so (m x k) @ (k x n) costs 2*m*k*n (Kaplan et al. 2020,
# "Scaling Laws for Neural Language Models", Table 1; the same convention as torch.utils.flop_counter).


def attention_matmul_flops(batch: int, seq: int, d_model: int) -> int:
    """QK^T plus PV over all heads for one layer: 2 matmuls x 2*B*S*S*d_model. Full S x S, as the naive and the
    math kernels compute it (the causal half is masked, not skipped)."""
    return 2 * (2 * batch * seq * seq * d_model)


def forward_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """Forward pass: 2 x matmul parameters x tokens (every Linear, lm_head included; the embedding is a lookup)
    plus the attention score and value matmuls of every layer. Elementwise work (norms, softmax, RoPE, SwiGLU
    gating) is not counted: it is < 1% of the total at these shapes."""
    return 2 * cfg.matmul_params * batch * seq + cfg.num_layers * attention_matmul_flops(batch, seq, cfg.d_model)


def step_flops(cfg: ModelConfig, batch: int, seq: int, mode: str) -> int:
    """Forward only: forward FLOPs. With backward: 3x forward, since backward computes two matmuls (the gradient
    with respect to the input and to the weight) for every forward matmul. The AdamW update is elementwise and
    not counted."""
    return forward_flops(cfg, batch, seq) * (1 if mode == "forward" else 3)


# ---- device and precision ----

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' = CUDA when present, else CPU. Asking for CUDA on a machine without it is a ValueError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"invalid device {name!r}: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available on this machine")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {name!r}; use auto, cpu or cuda[:N]")
    return device


def precision_context(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """fp32: nothing (fp32 everywhere). bf16 / fp16: torch.autocast mixed precision on `device`,
    parameters stay fp32 (master weights)."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on `device` (CUDA kernels run asynchronously; the CPU has nothing to wait for)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- timing ----


class SyncTimer:
    """Wall-clock timer that synchronises the device before reading the clock at both ends.

        with SyncTimer(device) as t:
            step()
        t.elapsed_s

    `sync` replaces the device synchronisation (tests pass a fake to see it is called at both ends).
    """

    def __init__(self, device: torch.device | None = None, sync: Callable[[], None] | None = None):
        self._sync = sync if sync is not None else (lambda: synchronize(device or torch.device("cpu")))
        self.elapsed_s = float("nan")

    def __enter__(self) -> "SyncTimer":
        self._sync()
        self._start = timeit.default_timer()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sync()
        self.elapsed_s = timeit.default_timer() - self._start

    def time(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        """Run `fn` inside the timer; return (its result, seconds)."""
        with self:
            result = fn()
        return result, self.elapsed_s


def summarize(samples: list[float]) -> dict[str, float]:
    """Mean, sample standard deviation (n-1), median, min, max and coefficient of variation of `samples`."""
    if not samples:
        return {}
    mean = statistics.fmean(samples)
    std = statistics.stdev(samples) if len(samples) > 1 else 0.0
    return {"mean": mean, "std": std, "median": statistics.median(samples), "min": min(samples),
            "max": max(samples), "cv": std / mean if mean else float("nan"), "n": len(samples)}


# ---- NVTX and profiler ranges ----

_RANGES = {"nvtx": False, "profiler": False}
_NULL_RANGE = contextlib.nullcontext()


def set_ranges(nvtx: bool = False, profiler: bool = False) -> None:
    """Switch named ranges on: NVTX (for Nsight; only where CUDA is available, since CPU builds of torch raise
    in torch.cuda.nvtx) and/or torch.profiler.record_function labels. Both off by default."""
    _RANGES["nvtx"] = bool(nvtx) and torch.cuda.is_available()
    _RANGES["profiler"] = bool(profiler)


def ranges_enabled() -> bool:
    return _RANGES["nvtx"] or _RANGES["profiler"]


@contextlib.contextmanager
def _active_range(name: str) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        if _RANGES["profiler"]:
            stack.enter_context(torch.profiler.record_function(name))
        if _RANGES["nvtx"]:
            torch.cuda.nvtx.range_push(name)
            stack.callback(torch.cuda.nvtx.range_pop)
        yield


def annotate(name: str) -> contextlib.AbstractContextManager:
    """A named range around a region of work: an NVTX range and/or a profiler label when switched on with
    set_ranges(), a shared no-op context otherwise (free: no allocation, no CUDA call)."""
    if not (_RANGES["nvtx"] or _RANGES["profiler"]):
        return _NULL_RANGE
    return _active_range(name)


# ---- hardware peaks ----

# Peak dense (no sparsity) throughput in TFLOP/s from the vendors' datasheets. "tf32" is the fp32-matmul
# figure when TF32 tensor cores are allowed; bf16/fp16 are tensor-core figures with fp32 accumulation (what
# PyTorch uses). None = the chip has no such unit. Patterns are tried in order, so specific names come first
# (H200 before H20, H100 NVL/PCIe before H100 SXM).
PEAK_TFLOPS: list[tuple[str, str, dict[str, float | None]]] = [
    # (regex on torch.cuda.get_device_name, label, peaks)
    (r"H200 NVL", "H200 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    (r"H200", "H200 SXM", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    (r"H20\b", "H20", {"fp32": 44.0, "tf32": 74.0, "bf16": 148.0, "fp16": 148.0}),
    (r"H100 NVL", "H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    (r"H100.*PCIe", "H100 PCIe", {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0}),
    (r"H100", "H100 SXM", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    (r"A100", "A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    (r"L40S", "L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05}),
    (r"RTX 5090", "RTX 5090", {"fp32": 104.8, "tf32": 104.8, "bf16": 209.5, "fp16": 209.5}),
    (r"RTX 4090", "RTX 4090", {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2}),
    (r"\bL4\b", "L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    (r"V100", "V100 SXM2", {"fp32": 15.7, "tf32": None, "bf16": None, "fp16": 125.0}),
    (r"\bT4\b", "T4", {"fp32": 8.1, "tf32": None, "bf16": None, "fp16": 65.0}),
    (r"P100", "P100 PCIe", {"fp32": 9.3, "tf32": None, "bf16": None, "fp16": 18.7}),
]


def peak_tflops(device_name: str, precision: str) -> tuple[float | None, str | None]:
    """(peak dense TFLOP/s, matched GPU label) for a CUDA device name and a precision key
    ('fp32', 'tf32', 'bf16', 'fp16'); (None, None) for an unknown device, (None, label) where the chip has
    no such unit. Never a guess."""
    for pattern, label, peaks in PEAK_TFLOPS:
        if re.search(pattern, device_name):
            return peaks.get(precision), label
    return None, None


def matmul_precision_key(dtype: str, tf32: bool) -> str:
    """Which peak applies: autocast dtypes use their tensor-core peak; fp32 uses TF32's when it is allowed."""
    if dtype == "fp32":
        return "tf32" if tf32 else "fp32"
    return dtype


# ---- environment record ----


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:  # Linux: the CPU's marketing name; platform.processor() is often empty there
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def environment(device: torch.device) -> dict[str, Any]:
    """Everything needed to interpret (or reproduce) a number: device, versions, TF32, threads, commit, time."""
    env: dict[str, Any] = {
        "device": str(device),
        "device_name": device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "git_commit": git_commit(),
        "utc_time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu_memory_bytes"] = props.total_memory
        env["gpu_sm_count"] = props.multi_processor_count
    return env


def environment_header(env: dict[str, Any], **extra: Any) -> str:
    """One line to print above a table, naming what the numbers were measured on."""
    parts = [f"device: {env['device_name']} ({env['device']})", f"torch {env['torch']}"]
    if env.get("cuda"):
        parts.append(f"CUDA {env['cuda']}")
    if env["device"].startswith("cuda"):
        parts.append(f"TF32 matmul {'on' if env['tf32_matmul'] else 'off'}")
    else:
        parts.append(f"{env['threads']} threads")
    parts += [f"{k}: {v}" for k, v in extra.items()]
    return " | ".join(parts)


# ---- command line ----


class ArgParser(argparse.ArgumentParser):
    """argparse with a one-line error: `prog: error: message (see --help)` and exit status 2, no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def add_device_args(parser: argparse.ArgumentParser) -> None:
    """--device and --in-process, the same in every script that sweeps configurations in child processes."""
    parser.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:N")
    parser.add_argument("--in-process", action="store_true",
                        help="run every configuration in this process instead of a fresh child process each")


def add_handout_arg(parser: argparse.ArgumentParser) -> None:
    """--handout, in every script that takes a model size."""
    parser.add_argument("--handout", choices=list(HANDOUTS), default=None,
                        help="which handout's Table 1 the size names and this script's defaults come from: "
                             f"2026 = {HANDOUTS['2026'].version} (current), 2025 = {HANDOUTS['2025'].version} "
                             f"(default: ${HANDOUT_ENV} if set, else {DEFAULT_HANDOUT})")


def handout_or_exit(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Handout:
    """The handout to use: --handout, else $CS336_HANDOUT (read now, at parse time), else the current one.
    Sets args.handout to its name and args.handout_source to where it came from; a bad value in the
    variable is a one-line exit 2, like a bad --handout."""
    if args.handout is not None:
        args.handout_source = "--handout"
    elif os.environ.get(HANDOUT_ENV, "").strip():
        args.handout, args.handout_source = os.environ[HANDOUT_ENV].strip(), HANDOUT_ENV
        if args.handout not in HANDOUTS:
            parser.error(f"{HANDOUT_ENV}={args.handout!r} is not a handout; valid handouts: {', '.join(HANDOUTS)}")
    else:
        args.handout, args.handout_source = DEFAULT_HANDOUT, "default"
    return HANDOUTS[args.handout]


def sizes_or_exit(parser: argparse.ArgumentParser, args: argparse.Namespace, names: list[str]) -> list[str]:
    """expand_sizes in args.handout, with a bad name as a one-line exit 2. When the handout was not chosen
    explicitly and a name means another model in the other handout (xl), a note on stderr says which one runs:
    the student who types --size xl from the 2025 handout must not get 2026's xl silently."""
    try:
        sizes = expand_sizes(names, args.handout)
    except ValueError as exc:
        parser.error(str(exc))
    if args.handout_source == "default":
        mine = HANDOUTS[args.handout].presets
        for size in sizes:
            for other in HANDOUTS.values():
                if other.presets.get(size, mine[size]) != mine[size]:
                    progress(f"note: {size} is handout {args.handout}'s {size} ({_dims(mine[size])}), not handout "
                             f"{other.name}'s ({_dims(other.presets[size])}): for that one pass --handout "
                             f"{other.name} (or set {HANDOUT_ENV}={other.name})")
    return sizes


def _dims(cfg: ModelConfig) -> str:
    return f"d_model {cfg.d_model}, {cfg.num_layers} layers"


def add_dry_run_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true",
                        help="print the configurations that would run, numbered, and exit: nothing is built, "
                             "run or written")


def print_dry_run(labels: list[str], preamble: str = "") -> int:
    """--dry-run: the preamble (the configuration table), then the numbered plan. Returns the exit status."""
    if preamble:
        print(preamble + "\n")
    print(f"dry run: {len(labels)} configuration{'s' if len(labels) != 1 else ''} would run, in this order:")
    width = len(str(len(labels)))
    for i, label in enumerate(labels, 1):
        print(f"  {i:>{width}}. {label}")
    print("\nnothing was built, run or written (drop --dry-run to run them)")
    return 0


def device_or_exit(parser: argparse.ArgumentParser, name: str) -> torch.device:
    """resolve_device, with a user mistake (no CUDA, unknown device) as a one-line exit 2."""
    try:
        return resolve_device(name)
    except ValueError as exc:
        parser.error(str(exc))


# ---- tables and result files ----

TABLE_FORMATS = sorted(tabulate_formats)


def render_table(rows: list[dict[str, Any]], columns: list[str], fmt: str = "github",
                 floatfmt: str = ".2f") -> str:
    """Rows (dicts) as a table with `columns` as headers, in any tabulate format; missing values print empty."""
    body = [[row.get(c) for c in columns] for row in rows]
    return tabulate(body, headers=columns, tablefmt=fmt, floatfmt=floatfmt, missingval="")


def add_output_args(parser: Any, default_stem: str) -> None:
    """--fmt, --out and --results-dir, the same in every script."""
    parser.add_argument("--fmt", default="github", choices=TABLE_FORMATS, metavar="FMT",
                        help="tabulate table format: github (markdown, default), latex_booktabs, plain, ...")
    parser.add_argument("--out", default=None,
                        help=f"result file stem (default: {default_stem}-<UTC timestamp>); an existing result is "
                             "never overwritten: a numbered suffix is added instead")
    parser.add_argument("--results-dir", default="results", help="root folder for result files")


def json_default(obj: Any) -> Any:
    if isinstance(obj, (torch.dtype, torch.device, Path)):
        return str(obj)
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    if isinstance(obj, float) and math.isnan(obj):
        return None
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


class ResultFiles:
    """`<results_dir>/<subdir>/<stem>.{jsonl,md}` for one run. A stem already used (by any file with that stem)
    gets a numbered suffix, so an earlier result is never overwritten; records are appended and flushed one by
    one, so an interrupted run keeps what it finished."""

    def __init__(self, results_dir: str | os.PathLike, subdir: str, stem: str | None, default_stem: str):
        self.folder = Path(results_dir) / subdir
        self.folder.mkdir(parents=True, exist_ok=True)
        if stem is None:
            stem = f"{default_stem}-{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M%S}"
        self.stem = self._free_stem(stem)
        if self.stem != stem:
            print(f"note: results for {stem!r} already exist; writing {self.stem!r} instead", file=sys.stderr)

    def _free_stem(self, stem: str) -> str:
        taken = {p.name for p in self.folder.iterdir()}
        candidate, n = stem, 1
        # a stem is taken if any file of an earlier run uses it: <stem>.jsonl, <stem>.md, <stem>_timeline.png, ...
        while any(name.startswith((candidate + ".", candidate + "_")) for name in taken):
            n += 1
            candidate = f"{stem}-{n}"
        return candidate

    def path(self, suffix: str) -> Path:
        """Path for a file of this run, e.g. path('.md') or path('_timeline.png')."""
        return self.folder / f"{self.stem}{suffix}"

    @property
    def jsonl(self) -> Path:
        return self.path(".jsonl")

    @property
    def markdown(self) -> Path:
        return self.path(".md")

    def append_record(self, record: dict[str, Any]) -> None:
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(record, default=json_default) + "\n")
            f.flush()

    def write_markdown(self, text: str) -> None:
        self.markdown.write_text(text if text.endswith("\n") else text + "\n")

    def publish(self, text: str, extra_paths: list[str] = ()) -> None:
        """Print the report, save it as the markdown file, and say where it and the other files are."""
        print(text)
        self.write_markdown(text)
        print(f"\nwrote {self.markdown} and {self.jsonl}" + "".join(f" and {p}" for p in extra_paths))


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---- failures as data ----


def is_oom(exc: BaseException) -> bool:
    """True for an out-of-memory error from any allocator (CUDA's or the CPU's)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        isinstance(exc, MemoryError) or "out of memory" in text.lower() or "DefaultCPUAllocator: can't allocate" in text)


def failure_status(exc: BaseException) -> str:
    """'OOM' or 'error: <one line>' for a failed configuration."""
    if is_oom(exc):
        return "OOM"
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return f"error: {type(exc).__name__}: {first_line}"[:200]


FAULT_ENV = "BENCH_INJECT_FAULT"


def maybe_inject_fault(fields: dict[str, Any]) -> None:
    """Test hook: `BENCH_INJECT_FAULT="oom:context_length=256,dtype=fp32"` makes the configuration whose fields
    match raise an out-of-memory error (`error:...` raises RuntimeError), so sweeps can be tested without a real
    OOM. Read at call time, inherited by child processes."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    for clause in spec.split(";"):
        kind, _, conditions = clause.partition(":")
        pairs = [c.split("=", 1) for c in conditions.split(",") if "=" in c]
        if all(str(fields.get(k)) == v for k, v in pairs):
            if kind == "oom":
                raise torch.OutOfMemoryError("CUDA out of memory (injected by BENCH_INJECT_FAULT)")
            raise RuntimeError(f"injected failure ({clause})")


# ---- child-process runner ----


def _child_main(conn: Any, fn: Callable[..., dict], kwargs: dict[str, Any]) -> None:
    try:
        result = {"ok": True, "value": fn(**kwargs)}
    except BaseException as exc:  # noqa: BLE001 - a failure is data, sent back to the parent
        result = {"ok": False, "status": failure_status(exc), "traceback": traceback.format_exc()}
    conn.send(result)
    conn.close()


def run_isolated(fn: Callable[..., dict], kwargs: dict[str, Any], in_process: bool = False) -> dict[str, Any]:
    """Run `fn(**kwargs)` (a module-level function returning a picklable dict) in a fresh child process, so an
    OOM or a broken CUDA context cannot poison later work and every run starts with a fresh allocator.

    Returns {"ok": True, "value": ...} or {"ok": False, "status": "OOM" | "error: ...", "traceback": ...}.
    KeyboardInterrupt in the parent terminates the child and propagates. `in_process=True` calls `fn` here
    (faster, no isolation) with the same failure handling."""
    if in_process:
        try:
            return {"ok": True, "value": fn(**kwargs)}
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            return {"ok": False, "status": failure_status(exc), "traceback": traceback.format_exc()}
    ctx = multiprocessing.get_context("spawn")  # fork would inherit an initialised CUDA context
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(child_conn, fn, kwargs), daemon=True)
    # The child inherits an ignored SIGINT, so a terminal's Ctrl-C (sent to the whole process group) reaches only
    # this process, which then stops the child: no half-printed traceback from a child interrupted mid-import.
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main_thread else None
    try:
        proc.start()
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, previous)
    child_conn.close()
    try:
        try:
            result = parent_conn.recv()
        except EOFError:  # the child died without answering (segfault, killed by the OOM killer, ...)
            proc.join()
            result = {"ok": False, "status": f"error: child process died with exit code {proc.exitcode}"}
        proc.join()
    except KeyboardInterrupt:
        proc.terminate()
        proc.join()
        raise
    return result


def sweep_exit_status(interrupted: bool, done: int, total: int) -> int:
    """0 for a finished sweep; 130 (the shell's code for Ctrl-C) for an interrupted one, saying how far it got."""
    if not interrupted:
        return 0
    print(f"interrupted after {done} of {total} configurations", file=sys.stderr)
    return 130


def progress(message: str) -> None:
    """Progress lines go to stderr so stdout stays a clean table."""
    print(message, file=sys.stderr, flush=True)
