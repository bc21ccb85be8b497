"""Shared machinery for every experiment script: presets, device and precision contexts, the synchronised
timer, peak memory, the saved-for-backward counter, NVTX / profiler ranges, hardware peaks, the environment
record, tables, result files and failures as data. The run path (workload, measured steps, child processes,
sweep) is in runner.py.

Nothing here does work at import time or changes global state on import.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import datetime
import itertools
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
import timeit
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn

import torch
from tabulate import tabulate, tabulate_formats

# ---- torch version compatibility ----
# Tested from torch 2.6 (the Spring 2025 course's pin, and the first release with FSDP2's public
# torch.distributed.fsdp.fully_shard) to 2.13 (docs/compat.md). What differs between those releases is listed and
# decided here, from each release's own sources:
# - DDP's "no buffer broadcast before forward" keyword: ddp_no_forward_buffer_sync() (parallel.shard_model);
# - TF32 settings: read through the fp32_precision API from 2.9 (torch.backends.cudnn.conv exists from then):
#   tf32_enabled();
# - FSDP2 on the CPU (gloo), 2.7 and later: fsdp2_unsupported() (bench_e2e's --parallel check, the tests);
# - FSDP2's reshard_after_forward=None (the root stays gathered after forward), 2.8 and later:
#   fsdp_root_reshard_after_forward() (parallel.shard_model);
# - kineto's USDT start/stop markers on stderr, 2.12 and later: KINETO_PRINTS_MARKERS (without_kineto_markers drops
#   them on every release, as it drops kineto's "gpuGetDeviceCount failed" line on a CUDA build without a GPU);
# - torch.profiler.profile's warning "Profiler clears events at the end of each cycle" at every first start, 2.10
#   to 2.12 (2.13 warns from the second cycle only, 2.9 and before never): quiet_profiler passes acc_events=True,
#   which a single cycle does not otherwise notice.


def torch_release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string: "2.11.0+cu130" -> (2, 11), "2.13.0a0+git1234" -> (2, 13)."""
    major, minor = version.split(".")[:2]
    return int(major), int(re.match(r"\d+", minor).group())


TORCH_VERSION = torch_release(torch.__version__)
OLDEST_TORCH = (2, 6)  # the oldest release the test suite has passed on
KINETO_PRINTS_MARKERS = TORCH_VERSION >= (2, 12)  # seen in the 2.12.1 and 2.13.0 binaries, not in 2.6.0 or 2.11.0


def ddp_no_forward_buffer_sync() -> dict[str, bool]:
    """DistributedDataParallel's keyword argument to skip broadcasting buffers before every forward:
    forward_sync_buffers=False from torch 2.13, where broadcast_buffers is deprecated (a FutureWarning);
    broadcast_buffers=False before, where forward_sync_buffers does not exist (TypeError). The old keyword also
    skips the buffers' broadcast at construction, which the new one keeps: for buffers that every rank computes
    identically (the RoPE cache) both mean the same."""
    return {"forward_sync_buffers": False} if TORCH_VERSION >= (2, 13) else {"broadcast_buffers": False}


def tf32_enabled(kind: str) -> bool:
    """Whether TF32 is allowed for "matmul" (torch.backends.cuda.matmul) or "cudnn" (cuDNN convolutions). From
    torch 2.9, read through the fp32_precision API ("tf32", "ieee", or "none" when only the legacy flag was used),
    since reading the legacy allow_tf32 flag raises once that API has set the precision; from allow_tf32 when the
    API is unset, and before 2.9, where it does not exist."""
    if kind not in ("matmul", "cudnn"):
        raise ValueError(f"unknown TF32 setting {kind!r}; choose from matmul, cudnn")
    legacy = torch.backends.cuda.matmul if kind == "matmul" else torch.backends.cudnn
    if TORCH_VERSION >= (2, 9):
        precision = (torch.backends.cuda.matmul if kind == "matmul" else torch.backends.cudnn.conv).fp32_precision
        if precision != "none":
            return precision == "tf32"
    return bool(legacy.allow_tf32)


def fsdp2_unsupported(device: torch.device) -> str | None:
    """Why FSDP2 cannot run on `device` with this torch, or None when it can. On the CPU it needs torch 2.7: 2.6's
    fully_shard calls record_event() on torch.cpu.Stream, which gained it in 2.7 (AttributeError at the first
    forward). On CUDA, 2.6's FSDP2 works."""
    if device.type == "cpu" and TORCH_VERSION < (2, 7):
        return (f"FSDP2 on the CPU needs torch 2.7 or later (torch.cpu.Stream.record_event); this is torch "
                f"{torch.__version__}")
    return None


def fsdp_root_reshard_after_forward(reshard_after_forward: bool) -> bool | None:
    """fully_shard's reshard_after_forward for the root module, given the blocks' choice. From torch 2.8, None
    means torch's rule (the root stays gathered after forward, since backward begins with it) and a bool is
    obeyed; before 2.8, None is a ValueError and the root stays gathered whatever it is told (FSDPState._lazy_init
    clears its post-forward mesh), so the blocks' bool goes through unchanged."""
    if TORCH_VERSION < (2, 8):
        return reshard_after_forward
    return None if reshard_after_forward else False


# ---- model configuration and presets ----


class ConfigError(ValueError):
    """A configuration the user asked for cannot exist (unknown preset, bad shape, no such device): scripts turn
    it into a one-line usage error; any other exception is a bug and keeps its traceback."""


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
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.num_heads:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if self.d_head % 2:
            raise ConfigError(f"d_model / num_heads = {self.d_head} must be even for RoPE (it rotates pairs)")

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
        raise ConfigError(f"unknown handout {name!r}; valid handouts: {', '.join(HANDOUTS)}")
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
        raise ConfigError(f"preset {name!r} is in handout {elsewhere[0]}'s table, not in handout {handout.name}'s "
                         f"({', '.join(handout.presets)}); use --handout {elsewhere[0]} "
                         f"(or {HANDOUT_ENV}={elsewhere[0]})")
    raise ConfigError(f"unknown preset {name!r}; valid presets in handout {handout.name}: "
                     f"{', '.join([*handout.presets, *also_valid])}")


def expand_sizes(names: list[str], handout: str) -> list[str]:
    """--size values with 'all' replaced by the handout's Table 1 (in order, no repeats), each checked
    (ConfigError naming the valid presets, or the handout that has the name)."""
    sizes: list[str] = []
    chosen = get_handout(handout)
    for name in names:
        if name != "all":
            _check_preset(name, chosen, also_valid=("all",))
        for size in chosen.table1 if name == "all" else [name]:
            if size not in sizes:
                sizes.append(size)
    return sizes


def model_tensor_shapes(cfg: ModelConfig, batch: int) -> dict[str, tuple[int, ...]]:
    """The largest tensors a step of model.py builds, by name: the bounds check of check_tensor_sizes."""
    seq = cfg.context_length
    return {"logits": (batch, seq, cfg.vocab_size), "attention scores": (batch, cfg.num_heads, seq, seq),
            "embedding": (cfg.vocab_size, cfg.d_model), "feed-forward weight": (cfg.d_ff, cfg.d_model)}


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


def dtype_name(dtype: torch.dtype) -> str:
    """torch.float16 -> 'float16', as tables print a tensor's dtype."""
    return str(dtype).removeprefix("torch.")


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' = CUDA when present, else CPU. Asking for CUDA on a machine without it is a ConfigError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"invalid device {name!r}: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available on this machine")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"unsupported device {name!r}; use auto, cpu or cuda[:N]")
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
    """Mean, sample standard deviation (n-1), median, min, max and coefficient of variation of `samples`.
    One sample has no standard deviation: std and cv are None, never a made-up 0."""
    if not samples:
        return {}
    mean = statistics.fmean(samples)
    std = statistics.stdev(samples) if len(samples) > 1 else None
    return {"mean": mean, "std": std, "median": statistics.median(samples), "min": min(samples),
            "max": max(samples), "cv": std / mean if std is not None and mean else None, "n": len(samples)}


# ---- memory ----

MIB, GIB = 2**20, 2**30  # MiB and GiB are powers of two


def format_bytes(n: int | float | None) -> str | None:
    """Bytes in the largest power-of-two unit that keeps the number >= 1 (KiB, MiB, GiB)."""
    if n is None:
        return None
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def reset_peak_memory(device: torch.device) -> None:
    """Wait for queued work, then restart CUDA's peak counters (a CPU has none)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> dict[str, int]:
    """Peak bytes since the last reset: allocated (live tensors) and reserved (the caching allocator's segments);
    {} on a CPU, which has no allocator counter."""
    if device.type != "cuda":
        return {}
    torch.cuda.synchronize(device)
    return {"peak_mem_allocated_bytes": torch.cuda.max_memory_allocated(device),
            "peak_mem_reserved_bytes": torch.cuda.max_memory_reserved(device)}


def storage_key(t: torch.Tensor) -> int:
    """One key per storage, shared by all its views: the address of the StorageImpl. (The data pointer would
    do for real tensors, but fake tensors have no data and all report 0.)"""
    return t.untyped_storage()._cdata


@contextlib.contextmanager
def saved_tensors(describe: Callable[[torch.Tensor], Any] | None = None,
                  exclude: set[int] = frozenset()) -> Iterator[dict[int, Any]]:
    """Every storage autograd saves for backward inside the block, once per storage (a view shares its base's),
    measured with saved-tensor hooks: {storage_key: describe(tensor), or the storage's bytes}. Storages in
    `exclude` (weights: resident anyway) are left out. Works on every device and on fake tensors. Keys are only
    unique while the graph lives: read the dict before freeing it."""
    saved: dict[int, Any] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key not in exclude and key not in saved:
            saved[key] = describe(t) if describe else t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield saved


# ---- NVTX and profiler ranges ----

# Names a shared library that exports the NVTX C API (nvtxRangePushA, nvtxRangePop), to use instead of torch's
# NVTX binding: the CPU build of torch has none, so the real-nsys tests build a tiny library from the NVTX3
# headers that ship with Nsight Systems and name it here (docs/nsys_run.md). On a GPU machine leave it unset.
NVTX_LIBRARY_ENV = "BENCH_NVTX_LIBRARY"

_RANGES: dict[str, Any] = {"nvtx": None, "profiler": False}  # nvtx: (push, pop) while switched on
_NULL_RANGE = contextlib.nullcontext()


def nvtx_functions() -> tuple[Callable[[str], Any], Callable[[], Any]]:
    """(push, pop) of NVTX ranges: from the library named by $BENCH_NVTX_LIBRARY when set, else torch.cuda.nvtx
    where CUDA is available. ValueError when there is no NVTX to call (a CPU build of torch raises in
    torch.cuda.nvtx) or the named library cannot be loaded."""
    library = os.environ.get(NVTX_LIBRARY_ENV)
    if library:
        try:
            lib = ctypes.CDLL(library)
            push, pop = lib.nvtxRangePushA, lib.nvtxRangePop
        except (OSError, AttributeError) as exc:
            raise ValueError(f"{NVTX_LIBRARY_ENV}={library} is not a library exporting nvtxRangePushA and "
                             f"nvtxRangePop: {exc}") from None
        push.argtypes, push.restype, pop.restype = [ctypes.c_char_p], ctypes.c_int, ctypes.c_int
        return (lambda name: push(name.encode())), pop
    if not torch.cuda.is_available():
        raise ValueError("NVTX ranges need CUDA: this machine's torch has no NVTX without it")
    return torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop


def set_ranges(nvtx: bool = False, profiler: bool = False) -> None:
    """Switch named ranges on: NVTX (for Nsight; a no-op where there is no NVTX to call, see nvtx_functions)
    and/or torch.profiler.record_function labels. Both off by default."""
    try:
        _RANGES["nvtx"] = nvtx_functions() if nvtx else None
    except ValueError:
        if os.environ.get(NVTX_LIBRARY_ENV):
            raise  # a library was named and is broken: say so rather than profile without ranges
        _RANGES["nvtx"] = None
    _RANGES["profiler"] = bool(profiler)


@contextlib.contextmanager
def _active_range(name: str) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        if _RANGES["profiler"]:
            stack.enter_context(torch.profiler.record_function(name))
        if _RANGES["nvtx"] is not None:
            push, pop = _RANGES["nvtx"]
            push(name)
            stack.callback(pop)
        yield


def annotate(name: str) -> contextlib.AbstractContextManager:
    """A named range around a region of work: an NVTX range and/or a profiler label when switched on with
    set_ranges(), a shared no-op context otherwise (free: no allocation, no CUDA call).

    Inside code that torch.compile traces, never a range: Dynamo cannot trace the push/pop calls (it breaks the
    graph there or drops them), and the kernels inductor generates fuse work across those boundaries, so a
    range inside a compiled region would not hold the kernels it names. Ranges around the compiled call (the
    forward / backward / optimizer phases) are unaffected."""
    if not (_RANGES["nvtx"] is not None or _RANGES["profiler"]) or torch.compiler.is_compiling():
        return _NULL_RANGE
    return _active_range(name)


# ---- torch.profiler without kineto's trace-marker lines ----

# libkineto (torch.profiler's backend) writes "USDT:<time> <pid>:<tid> SyncActivityProfilerHandler.cpp:52]
# profiler_start" and "...profiler_stop" to std::cerr at every profiler start and stop (torch 2.12 and later):
# probe markers for tracing tools, logged at its highest level (USDT = 5, above ERROR = 4, in libkineto's
# ILoggerObserver.h). The only setting that hides them, KINETO_LOG_LEVEL=6, read once when kineto first starts,
# would hide kineto's errors too; so instead these lines, and only they, are filtered out of file descriptor 2
# while a profiler runs. So is one error that is none: a CUDA build of torch on a machine without a GPU (a login
# node) logs "ERROR:<time> <pid>:<tid> DeviceProperties.cpp:48] gpuGetDeviceCount failed with code 35" (35 =
# cudaErrorInsufficientDriver: no driver) at the first profiler start of a process, whatever the activities; it
# is dropped only where torch.cuda.is_available() is False, so a GPU machine still shows it.
KINETO_MARKER_PREFIX = b"USDT:"
KINETO_NO_GPU_ERROR = re.compile(rb"ERROR:.*\] gpuGetDeviceCount failed with code \d+$")


def is_kineto_noise(line: bytes, gpu: bool) -> bool:
    """Whether one stderr line (bytes, newline stripped or not) is what without_kineto_markers drops: a USDT
    marker, or on a machine without a usable GPU (gpu=False) kineto's failed GPU count."""
    return line.startswith(KINETO_MARKER_PREFIX) or (not gpu and KINETO_NO_GPU_ERROR.match(line.rstrip()) is not None)


@contextlib.contextmanager
def without_kineto_markers() -> Iterator[None]:
    """Route file descriptor 2 (where C++ std::cerr writes) through a pipe whose reader thread forwards every
    line except kineto's noise (is_kineto_noise); restored on exit. Python's own stderr writes pass through
    unchanged."""
    gpu = torch.cuda.is_available()
    sys.stderr.flush()
    original = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)

    def forward() -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for line in pipe:
                if not is_kineto_noise(line, gpu):
                    os.write(original, line)

    reader = threading.Thread(target=forward, daemon=True)
    reader.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)  # drops the pipe's last write end: the reader sees EOF and ends
        reader.join()
        os.close(original)


class QuietProfiler(torch.profiler.profile):
    """torch.profiler.profile with kineto's noise (is_kineto_noise) kept off the terminal and files while it runs.
    The object itself is the profiler (export_chrome_trace, events, ...), as with torch.profiler.profile."""

    def __enter__(self) -> "QuietProfiler":
        self._markers = without_kineto_markers()
        self._markers.__enter__()
        try:
            return super().__enter__()
        except BaseException:
            self._markers.__exit__(*sys.exc_info())
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._markers.__exit__(None, None, None)


def quiet_profiler(activities: list[torch.profiler.ProfilerActivity]) -> QuietProfiler:
    """torch.profiler.profile(activities=...) without kineto's noise (is_kineto_noise). acc_events=True only silences
    torch 2.10-2.12's warning at every first start (see "torch version compatibility"): one cycle, same events."""
    return QuietProfiler(activities=activities, acc_events=True)


# ---- hardware peaks ----

# Peak dense (no sparsity) throughput in TFLOP/s from the vendors' datasheets; where a datasheet quotes only
# sparse tensor figures (marked *), the dense figure is half of it. "tf32" is the fp32-matmul figure when TF32
# tensor cores are allowed; bf16/fp16 are tensor-core figures with fp32 accumulation (what PyTorch uses; GeForce
# cards run it at half their fp16-accumulate rate). None = the chip has no such unit, or no datasheet gives the
# figure (laptop and power-limited variants, AWS's A10G): then no MFU, never a guess; --peak-tflops supplies one.
# Patterns are tried in order on torch.cuda.get_device_name() ("NVIDIA H100 80GB HBM3", "Tesla V100-PCIE-16GB"),
# so specific names come first: GH200 before H200, H100 NVL/PCIe before H100, V100S before V100, L40S before L40.
_NO_FIGURES: dict[str, float | None] = {"fp32": None, "tf32": None, "bf16": None, "fp16": None}


def _peaks(fp32: float | None, tf32: float | None, bf16: float | None, fp16: float | None) -> dict[str, float | None]:
    return {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": fp16}


PEAK_TFLOPS: list[tuple[str, str, dict[str, float | None]]] = [
    # (regex on torch.cuda.get_device_name, label, peaks)
    (r"Laptop", "laptop GPU (power-limited: no datasheet peak)", _NO_FIGURES),
    # Blackwell: GB200 NVL72 per GPU (360 PFLOPS* bf16 / 72), HGX B200 per GPU (36 PFLOPS* bf16 / 8)
    (r"GB200", "GB200", _peaks(80.0, 1250.0, 2500.0, 2500.0)),
    (r"\bB200\b", "B200", _peaks(75.0, 1125.0, 2250.0, 2250.0)),
    # RTX PRO 6000 Blackwell Workstation Edition: 125 TFLOPS fp32, 4000 AI TOPS (fp4*): bf16 = 4000 / 2 / 4
    (r"RTX PRO 6000 Blackwell (Max-Q|Server)", "RTX PRO 6000 Blackwell (Max-Q / Server: no figures here)",
     _NO_FIGURES),
    (r"RTX PRO 6000 Blackwell", "RTX PRO 6000 Blackwell Workstation", _peaks(125.0, 250.0, 500.0, 500.0)),
    # Hopper: the GH200 superchip's GPU, H200 and H800 have H100's compute
    (r"GH200", "GH200", _peaks(67.0, 494.7, 989.4, 989.4)),
    (r"H200 NVL", "H200 NVL", _peaks(60.0, 417.5, 835.5, 835.5)),
    (r"H200", "H200 SXM", _peaks(67.0, 494.7, 989.4, 989.4)),
    (r"H20\b", "H20", _peaks(44.0, 74.0, 148.0, 148.0)),
    (r"H100 NVL", "H100 NVL", _peaks(60.0, 417.5, 835.5, 835.5)),
    (r"H100.*PCIe", "H100 PCIe", _peaks(51.2, 378.0, 756.0, 756.0)),
    (r"H100", "H100 SXM", _peaks(67.0, 494.7, 989.4, 989.4)),
    (r"H800.*PCIe", "H800 PCIe", _peaks(51.2, 378.0, 756.0, 756.0)),
    (r"H800", "H800 SXM", _peaks(67.0, 494.7, 989.4, 989.4)),
    # Ampere / Ada data centre: every A100 and A800 form factor has the same compute
    (r"A100", "A100", _peaks(19.5, 156.0, 312.0, 312.0)),
    (r"A800", "A800", _peaks(19.5, 156.0, 312.0, 312.0)),
    (r"L40S", "L40S", _peaks(91.6, 183.0, 362.05, 362.05)),
    (r"\bL40\b", "L40", _peaks(90.5, 90.5, 181.0, 181.0)),
    (r"\bL4\b", "L4", _peaks(30.3, 60.0, 121.0, 121.0)),
    (r"\bA40\b", "A40", _peaks(37.4, 74.8, 149.7, 149.7)),
    (r"\bA10\b", "A10", _peaks(31.2, 62.5, 125.0, 125.0)),
    (r"\bA10G\b", "A10G (AWS: no NVIDIA datasheet)", _NO_FIGURES),
    # workstation: full-rate fp32 accumulation
    (r"RTX 6000 Ada", "RTX 6000 Ada", _peaks(91.1, 182.1, 364.2, 364.2)),
    (r"RTX A6000", "RTX A6000", _peaks(38.7, 77.4, 154.8, 154.8)),
    # GeForce (whitepapers: Ampere GA102, Ada AD102, Blackwell GB202); the China-only D variants differ
    (r"RTX (5090|4090) D", "RTX 5090 D / 4090 D (no figures here)", _NO_FIGURES),
    (r"RTX 5090", "RTX 5090", _peaks(104.8, 104.8, 209.5, 209.5)),
    (r"RTX 4090", "RTX 4090", _peaks(82.6, 82.6, 165.2, 165.2)),
    (r"RTX 3090 Ti", "RTX 3090 Ti", _peaks(40.0, 40.0, 80.0, 80.0)),
    (r"RTX 3090", "RTX 3090", _peaks(35.6, 35.6, 71.0, 71.0)),
    # Volta / Turing / Pascal: no TF32 or bf16 units
    (r"V100S", "V100S PCIe", _peaks(16.4, None, None, 130.0)),
    (r"V100-SXM2", "V100 SXM2", _peaks(15.7, None, None, 125.0)),
    (r"V100-PCIE", "V100 PCIe", _peaks(14.0, None, None, 112.0)),
    (r"V100", "V100 (other variant: no figures here)", _NO_FIGURES),
    (r"\bT4\b", "T4", _peaks(8.1, None, None, 65.0)),
    (r"P100-SXM2", "P100 SXM2", _peaks(10.6, None, None, 21.2)),
    (r"P100", "P100 PCIe", _peaks(9.3, None, None, 18.7)),
]


def peak_tflops(device_name: str, precision: str) -> tuple[float | None, str | None]:
    """(peak dense TFLOP/s, matched GPU label) for a CUDA device name and a precision key
    ('fp32', 'tf32', 'bf16', 'fp16'); (None, None) for an unknown device, (None, label) where the chip has
    no such unit or no datasheet gives the figure. Never a guess."""
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


def float32_matmul_precision() -> str | None:
    """torch.get_float32_matmul_precision(); None when the new fp32_precision API has set the precision, where
    that legacy getter raises (tf32_matmul then says what matters)."""
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        return None


def environment(device: torch.device) -> dict[str, Any]:
    """Everything needed to interpret (or reproduce) a number: device, versions, TF32, threads, commit, time."""
    env: dict[str, Any] = {
        "device": str(device),
        "device_name": device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "tf32_matmul": tf32_enabled("matmul"),
        "tf32_cudnn": tf32_enabled("cudnn"),
        "float32_matmul_precision": float32_matmul_precision(),
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
    """argparse with a one-line error: `prog: error: message (see --help)` and exit status 2, no usage dump. Under
    torchrun every rank parses the same command line and exits; only rank 0 says why (one line, not N)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n" if os.environ.get("RANK", "0") == "0" else None)


# Bounds on numbers from the command line, so a number that cannot be used is a parse error, not an error row.
# torch stores sizes, strides and element counts as int64: a dimension beyond this can never be allocated.
INT64_MAX = 2**63 - 1
# Timed steps and warm-up steps are Python loops whose raw samples are kept in the JSONL record (~20 bytes each):
# a million makes a 20 MB line, far beyond what a mean or a standard deviation needs; more only fills the disk.
MAX_STEPS = 1_000_000
# torch.manual_seed's documented range: [-0x8000_0000_0000_0000, 0xffff_ffff_ffff_ffff] (negative ones are
# remapped); anything else raises at seeding time, inside a configuration.
SEED_RANGE = (-(2**63), 2**64 - 1)


def _bounded_int(text: str, low: int, high: int, what: str) -> int:
    value = int(text)  # a non-integer is argparse's "invalid ... value"
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def positive_int(text: str) -> int:
    """A size: 1 .. 2**63-1 (torch's int64 sizes)."""
    return _bounded_int(text, 1, INT64_MAX, f"a positive integer at most {INT64_MAX} (int64)")


def non_negative_int(text: str) -> int:
    return _bounded_int(text, 0, INT64_MAX, f">= 0 and at most {INT64_MAX} (int64)")


def step_count(text: str) -> int:
    """A number of timed steps or iterations: 1 .. MAX_STEPS."""
    return _bounded_int(text, 1, MAX_STEPS, f"a positive integer at most {MAX_STEPS:,} (raw samples are kept)")


def warmup_count(text: str) -> int:
    return _bounded_int(text, 0, MAX_STEPS, f">= 0 and at most {MAX_STEPS:,}")


def seed_int(text: str) -> int:
    low, high = SEED_RANGE
    return _bounded_int(text, low, high, f"within torch.manual_seed's range [{low}, {high}]")


def positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def check_tensor_sizes(parser: argparse.ArgumentParser, shapes: dict[str, tuple[int, ...]]) -> None:
    """A user mistake if a tensor the run will build has more bytes than torch can count (int64), at 8 bytes per
    element (the widest dtype these scripts allocate: int64 token ids). `shapes` names each tensor's shape."""
    for name, shape in shapes.items():
        if math.prod(shape) * 8 > INT64_MAX:
            parser.error(f"the {name} tensor {tuple(shape)} would have more than 2**63 bytes; use smaller sizes")


def add_device_args(parser: argparse.ArgumentParser) -> None:
    """--device, the same in every script that sweeps configurations (runner.add_sweep_args adds the rest)."""
    parser.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:N")


def add_size_args(parser: argparse.ArgumentParser, default_help: str) -> None:
    """--size (names of either handout's Table 1, or 'all') and --handout, in every script that takes a size;
    `default_help` says what runs without --size."""
    parser.add_argument("--size", nargs="+", default=None, metavar="SIZE",
                        help="model preset(s) of the handout's Table 1 (2026: "
                             f"{', '.join(HANDOUTS['2026'].presets)}; 2025: {', '.join(HANDOUTS['2025'].presets)}), "
                             f"or 'all' for its Table 1 (default: {default_help})")
    add_handout_arg(parser)


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
    except ConfigError as exc:
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


def print_dry_run(labels: list[str], preamble: str = "", notes: list[str] = (), at_most: bool = False) -> int:
    """--dry-run: the preamble (the configuration table), then the numbered plan, then `notes` (what the run will
    make of it). `at_most`: the plan is an upper bound (a search stops early). Returns the exit status."""
    if preamble:
        print(preamble + "\n")
    count = f"{'at most ' if at_most else ''}{len(labels)} configuration{'s' if len(labels) != 1 else ''}"
    print(f"dry run: {count} would run, in this order:")
    width = len(str(len(labels)))
    for i, label in enumerate(labels, 1):
        print(f"  {i:>{width}}. {label}")
    for note in notes:
        print("\n" + note)
    print("\nnothing was built, run or written (drop --dry-run to run them)")
    return 0


def device_or_exit(parser: argparse.ArgumentParser, name: str) -> torch.device:
    """resolve_device, with a user mistake (no CUDA, unknown device) as a one-line exit 2."""
    try:
        return resolve_device(name)
    except ConfigError as exc:
        parser.error(str(exc))


# ---- tables and result files ----

TABLE_FORMATS = sorted(tabulate_formats)
LATEX_FORMATS = ("latex", "latex_raw", "latex_booktabs", "latex_longtable")
# file suffix for a report in each table format: only markdown goes into a .md file
REPORT_SUFFIXES = {"github": ".md", "pipe": ".md", "html": ".html", "unsafehtml": ".html", "rst": ".rst",
                   "tsv": ".tsv", **{fmt: ".tex" for fmt in LATEX_FORMATS}}


def report_suffix(fmt: str) -> str:
    """'.md' for markdown formats, '.tex' for LaTeX ones, '.html', '.rst', '.tsv'; '.txt' for the rest."""
    return REPORT_SUFFIXES.get(fmt, ".txt")


def as_report_file(text: str, fmt: str) -> str:
    """A report in `fmt` as its file holds it. LaTeX: a file to \\input, the tables as they are and every other
    line a comment; any other format: the text itself."""
    if fmt not in LATEX_FORMATS:
        return text if text.endswith("\n") else text + "\n"
    out, in_table = [], False
    for line in text.splitlines():
        if line.startswith(("\\begin{tabular}", "\\begin{longtable}")):
            in_table = True
        out.append(line if in_table or not line.strip() else "% " + line)
        if line.startswith(("\\end{tabular}", "\\end{longtable}")):
            in_table = False
    header = (f"% Generated by {Path(sys.argv[0]).name}. latex_booktabs needs \\usepackage{{booktabs}}; "
              "latex_longtable needs \\usepackage{longtable}.\n")
    return header + "\n".join(out) + "\n"


def render_table(rows: list[dict[str, Any]], columns: list[str], fmt: str = "github",
                 floatfmt: str = ".2f") -> str:
    """Rows (dicts) as a table with `columns` as headers, in any tabulate format; missing values print empty."""
    body = [[row.get(c) for c in columns] for row in rows]
    return tabulate(body, headers=columns, tablefmt=fmt, floatfmt=floatfmt, missingval="")


# A result stem names files inside the results folder, nothing else: no path separators (a stem cannot reach
# another folder, so the no-overwrite rule holds), no leading '.' (hidden files, '.', '..') or '-' (read as a
# flag by the next command), and short enough that the longest file name made from it ("<stem>-<n>_timeline.png")
# stays under the 255-byte name limit of common file systems.
MAX_STEM_BYTES = 200


def result_stem(text: str) -> str:
    """--out: a plain file-name stem, checked at parse time."""
    if not text:
        raise argparse.ArgumentTypeError("must be a non-empty file-name stem")
    if "/" in text or "\\" in text or (os.sep in text) or (os.altsep and os.altsep in text):
        raise argparse.ArgumentTypeError(f"must be a file-name stem without a folder, got {text!r} "
                                         "(use --results-dir to choose the folder)")
    if text[0] in ".-":
        raise argparse.ArgumentTypeError(f"must not start with '.' or '-', got {text!r}")
    if not text.isprintable():
        raise argparse.ArgumentTypeError(f"must be printable characters only, got {text!r}")
    if len(text.encode("utf-8", "surrogateescape")) > MAX_STEM_BYTES:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_STEM_BYTES} bytes long")
    return text


def results_folder(text: str) -> str:
    """--results-dir: a folder, created with its parents when missing; what cannot be created or written is
    refused when the result files are opened, before any work."""
    if not text:
        raise argparse.ArgumentTypeError("must be a folder name, got ''")
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
    return text


def add_output_args(parser: Any, default_stem: str) -> None:
    """--fmt, --out and --results-dir, the same in every script."""
    parser.add_argument("--fmt", default="github", choices=TABLE_FORMATS, metavar="FMT",
                        help="tabulate table format: github (markdown, default), latex_booktabs, plain, ...")
    parser.add_argument("--out", default=None, type=result_stem,
                        help=f"result file stem, a plain name inside the results folder (default: {default_stem}-"
                             "<UTC timestamp>); an existing result is never overwritten: a numbered suffix is "
                             "added instead")
    parser.add_argument("--results-dir", default="results", type=results_folder,
                        help="root folder for result files (created when missing)")


def json_default(obj: Any) -> Any:
    if isinstance(obj, (torch.dtype, torch.device, Path)):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def strict_json_value(obj: Any) -> Any:
    """`obj` with every NaN or infinity (in nested dicts, lists and dataclasses too) replaced by None, since
    NaN and Infinity are not JSON and strict readers (jq, JavaScript, most JSON libraries) refuse them."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json_value(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json_value(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return strict_json_value(dataclasses.asdict(obj))
    return obj


def to_json_line(record: dict[str, Any]) -> str:
    """One record as one line of strict JSON (no NaN/Infinity tokens)."""
    return json.dumps(strict_json_value(record), default=json_default, allow_nan=False)


def exit_usage_error(message: str) -> NoReturn:
    """A user mistake found after parsing (e.g. a results folder that cannot be written): one line, exit 2."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


class ResultFiles:
    """`<results_dir>/<subdir>/<stem>.{jsonl,md}` for one run, the stem reserved for this run alone.

    A stem is taken when any file of that stem exists (<stem>.jsonl, <stem>.md, <stem>_timeline.png, ...); then
    <stem>-2, <stem>-3, ... are tried. The stem is reserved by creating <stem>.jsonl with O_EXCL, so two runs
    started together (same --out, or the same second for the default stem) never share one, and no run
    overwrites another's files (a run that writes no JSONL reserves the file it does write: `reserve`). Records
    are appended and flushed one by one, so an interrupted run keeps what it finished; the markdown is replaced
    atomically, so a failed write leaves the previous version.

    A folder that cannot be created or written is a one-line exit 2; a write that fails later (a full disk) is a
    one-line exit 1 that keeps the records already written."""

    def __init__(self, results_dir: str | os.PathLike, subdir: str, stem: str | None, default_stem: str,
                 reserve: str = ".jsonl"):
        self.folder = Path(results_dir) / subdir
        self.records_written = 0
        chosen = stem is not None
        if stem is None:
            stem = f"{default_stem}-{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M%S}"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.stem = self._reserve_stem(stem, reserve)
        except OSError as exc:
            exit_usage_error(f"cannot write results in {self.folder}: {exc.strerror or exc}")
        if self.stem != stem and chosen:  # (a default stem taken in the same second needs no note)
            print(f"note: results for {stem!r} already exist; writing {self.stem!r} instead", file=sys.stderr)

    def _reserve_stem(self, stem: str, reserve: str) -> str:
        for n in itertools.count(1):
            candidate = stem if n == 1 else f"{stem}-{n}"
            # a stem is taken if any file of an earlier run uses it: <stem>.jsonl, <stem>.md, <stem>_timeline.png
            if any(p.name.startswith((candidate + ".", candidate + "_")) for p in self.folder.iterdir()):
                continue
            try:  # atomic: of two runs that both saw the stem free, exactly one creates the file
                os.close(os.open(self.folder / f"{candidate}{reserve}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            except FileExistsError:
                continue
            return candidate
        raise AssertionError("unreachable")

    def release(self) -> None:
        """Give the stem back when the run failed before writing any record: remove the empty reserved JSONL."""
        if self.records_written == 0 and self.jsonl.is_file() and self.jsonl.stat().st_size == 0:
            self.jsonl.unlink()

    def path(self, suffix: str) -> Path:
        """Path for a file of this run, e.g. path('.md') or path('_timeline.png')."""
        return self.folder / f"{self.stem}{suffix}"

    @property
    def jsonl(self) -> Path:
        return self.path(".jsonl")

    @property
    def markdown(self) -> Path:
        return self.path(".md")

    def _write_failed(self, path: Path, exc: OSError) -> NoReturn:
        print(f"error: cannot write {path}: {exc.strerror or exc}; the {self.records_written} records written "
              f"before it are kept in {self.jsonl}", file=sys.stderr)
        raise SystemExit(1)

    def append_record(self, record: dict[str, Any]) -> None:
        """Append one record as a line of strict JSON; a failed write (a full disk) is cut back to the last whole
        line, so the file stays readable, and ends the run."""
        line = to_json_line(record) + "\n"
        with open(self.jsonl, "a") as f:
            end = f.tell()
            try:
                f.write(line)
                f.flush()
            except OSError as exc:
                with contextlib.suppress(OSError):
                    f.truncate(end)
                self._write_failed(self.jsonl, exc)
        self.records_written += 1

    def _replace(self, path: Path, text: str) -> None:
        """Replace a report file (called again as rows finish): written beside it, then renamed over it."""
        partial = path.with_name(path.name + ".partial")
        try:
            partial.write_text(text if text.endswith("\n") else text + "\n")
            os.replace(partial, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                partial.unlink()
            self._write_failed(path, exc)

    def write_markdown(self, text: str) -> None:
        """Replace this run's markdown with `text`."""
        self._replace(self.markdown, text)

    def report_paths(self, fmt: str) -> list[Path]:
        """The report files of a run printed in `fmt`: the .md, and <stem>.tex (.html, .rst, ...) beside it."""
        suffix = report_suffix(fmt)
        return [self.markdown] + ([self.path(suffix)] if suffix != ".md" else [])

    def write_report(self, render: Callable[[str], str], fmt: str) -> str:
        """Save the report that `render(fmt)` makes: the .md always in markdown, and when `fmt` is not markdown
        (LaTeX, plain, html, ...) also in `fmt` beside it (report_paths). Returns the text in `fmt`."""
        text = render(fmt)
        if report_suffix(fmt) == ".md":
            self.write_markdown(text)
        else:
            self.write_markdown(render("github"))
            self._replace(self.path(report_suffix(fmt)), as_report_file(text, fmt))
        return text

    def publish(self, render: Callable[[str], str], fmt: str, extra_paths: list[str] = ()) -> None:
        """Save the report (write_report), print it, and say where it and the other files are. The files are
        written first, so a closed stdout (`... | head -1`) loses nothing."""
        text = self.write_report(render, fmt)
        if emit(text):
            self.say_written(fmt, extra_paths)

    def say_written(self, fmt: str, extra_paths: list[str] = ()) -> None:
        emit("\nwrote " + " and ".join(map(str, [*self.report_paths(fmt), self.jsonl, *extra_paths])))


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
    """Test hook, so that failure handling is tested end to end without a real fault:
    `BENCH_INJECT_FAULT="oom:context_length=256,dtype=fp32"` makes the configuration whose fields all match raise
    an out-of-memory error; `error:` raises RuntimeError; `hang:` sleeps for an hour (a stuck kernel, for
    --timeout and signal tests; it says its pid on stderr); `kill:` SIGKILLs its own process (a crash without a
    word). Clauses are separated by ';'. A condition `field>=N` matches a numeric field at least N
    (`oom:context_length>=1024`: every context from 1024 up runs out of memory, as on a real device). Every
    configuration also matches `rank=` (torchrun's RANK, 0 without torchrun). Read at call time; child processes get
    the parent's value."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    fields = {"rank": os.environ.get("RANK", "0"), **fields}  # torchrun's rank: `oom:rank=1,...` fails one rank
    for clause in spec.split(";"):
        kind, _, conditions = clause.partition(":")
        if all(_fault_condition_holds(c, fields) for c in conditions.split(",") if "=" in c):
            if kind == "oom":
                raise torch.OutOfMemoryError("CUDA out of memory (injected by BENCH_INJECT_FAULT)")
            if kind == "hang":
                print(f"injected hang in pid {os.getpid()}", file=sys.stderr, flush=True)
                time.sleep(3600)
            if kind == "kill":
                os.kill(os.getpid(), 9)  # SIGKILL
            raise RuntimeError(f"injected failure ({clause})")


def _fault_condition_holds(condition: str, fields: dict[str, Any]) -> bool:
    """`field=value` (compared as text) or `field>=N` (compared as numbers) against a configuration's fields."""
    if ">=" in condition:
        key, _, bound = condition.partition(">=")
        value = fields.get(key)
        return isinstance(value, (int, float)) and value >= float(bound)
    key, _, value = condition.partition("=")
    return str(fields.get(key)) == value


def progress(message: str) -> None:
    """Progress lines go to stderr so stdout stays a clean table."""
    print(message, file=sys.stderr, flush=True)


def emit(text: str) -> bool:
    """Print to stdout; False once stdout is closed (`... | head -1`): later output then goes to /dev/null, so
    neither a BrokenPipeError nor Python's exit-time flush interrupts the work or its result files."""
    try:
        print(text, flush=True)
        return True
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        progress("stdout was closed: the rest of the report is only in the result files")
        return False
