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
import itertools
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


# The study's model sizes (vocab 10,000). Keys are the names people type.
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(d_model=512, d_ff=1344, num_layers=4, num_heads=16),
    "small": ModelConfig(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": ModelConfig(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": ModelConfig(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
    "xl": ModelConfig(d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
    "2.7B": ModelConfig(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
    "10B": ModelConfig(d_model=4608, d_ff=12288, num_layers=50, num_heads=36),
}
DEFAULT_BATCH_SIZE = 4
DEFAULT_CONTEXT_LENGTH = 128


def get_config(name: str, **overrides: Any) -> ModelConfig:
    """The preset called exactly `name`, with any non-None overrides applied (and validated)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(PRESETS[name], **changes)


def model_tensor_shapes(cfg: ModelConfig, batch: int) -> dict[str, tuple[int, ...]]:
    """The largest tensors a step of model.py builds, by name: the bounds check of check_tensor_sizes."""
    seq = cfg.context_length
    return {"logits": (batch, seq, cfg.vocab_size), "attention scores": (batch, cfg.num_heads, seq, seq),
            "embedding": (cfg.vocab_size, cfg.d_model), "feed-forward weight": (cfg.d_ff, cfg.d_model)}


def config_row(name: str, cfg: ModelConfig) -> dict[str, Any]:
    """One row describing a model config, as people quote it."""
    return {"size": name, "d_model": cfg.d_model, "d_ff": cfg.d_ff, "layers": cfg.num_layers,
            "heads": cfg.num_heads, "vocab": cfg.vocab_size, "params": cfg.num_params}


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
    """--device and --in-process, the same in every script that sweeps configurations in child processes."""
    parser.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:N")
    parser.add_argument("--in-process", action="store_true",
                        help="run every configuration in this process instead of a fresh child process each")


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

    def write_markdown(self, text: str) -> None:
        """Replace this run's markdown (called again as rows finish): written beside it, then renamed over it."""
        partial = self.path(".md.partial")
        try:
            partial.write_text(text if text.endswith("\n") else text + "\n")
            os.replace(partial, self.markdown)
        except OSError as exc:
            with contextlib.suppress(OSError):
                partial.unlink()
            self._write_failed(self.markdown, exc)

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
