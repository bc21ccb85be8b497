"""Run-time helpers: torch-release differences, device and precision, the synchronised timer and do_bench, memory,
NVTX and profiler ranges, GPU peaks, the environment record, failures as data, your code as MODULE:CALLABLE."""
from __future__ import annotations

import argparse
import atexit
import builtins
import contextlib
import datetime
import functools
import gc
import importlib
import importlib.machinery
import json
import math
import os
import platform
import re
import socket
import statistics
import sys
import threading
import time
import timeit
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from results import OURS, ConfigError, progress, replace_text

HERE = os.path.dirname(os.path.abspath(__file__))
# The clocks that time a step, bound when this module is imported, before any student module: code that replaces
# time.perf_counter or timeit.default_timer later does not reach them. The second one cross-checks the first.
clock, second_clock_ns = time.perf_counter, time.monotonic_ns
# torch's million objects, imported, live as long as the process: out of the collector's way, so that its full
# passes and the interpreter's exit do not walk them (about half a second of every script's run on a small CPU);
# at exit, what the run made since too (inductor's modules, models, records): a second of mem_profile.py's exit
gc.freeze()
atexit.register(gc.freeze)

# ---- torch releases: tested from 2.6 (the 2025 course's pin) to 2.13 (docs/compat.md) ----


def torch_release(version: str) -> tuple[int, int]:
    """(major, minor): "2.11.0+cu130" -> (2, 11), "2.13.0a0+git1234" -> (2, 13)."""
    major, minor = version.split(".")[:2]
    return int(major), int(re.match(r"\d+", minor).group())


TORCH_VERSION = torch_release(torch.__version__)
KINETO_PRINTS_MARKERS = TORCH_VERSION >= (2, 12)  # USDT lines in the 2.12.1 and 2.13.0 binaries


def ddp_no_forward_buffer_sync() -> dict[str, bool]:
    """DDP's keyword to skip the buffers' broadcast before every forward: forward_sync_buffers from 2.13,
    which deprecates broadcast_buffers (the same for buffers every rank computes alike, the RoPE cache)."""
    return {"forward_sync_buffers": False} if TORCH_VERSION >= (2, 13) else {"broadcast_buffers": False}


def tf32_enabled() -> bool:
    """Whether TF32 matmuls are allowed: from 2.9 the fp32_precision API when it is set (reading the legacy
    flag then raises), else the legacy allow_tf32 flag."""
    matmul = torch.backends.cuda.matmul
    if TORCH_VERSION >= (2, 9) and matmul.fp32_precision != "none":
        return matmul.fp32_precision == "tf32"
    return bool(matmul.allow_tf32)


def fsdp2_unsupported(device: torch.device) -> str | None:
    """Why FSDP2 cannot run on `device`: on a CPU, 2.6's fully_shard calls 2.7's Stream.record_event."""
    if device.type == "cpu" and TORCH_VERSION < (2, 7):
        return (f"FSDP2 on the CPU needs torch 2.7 or later (torch.cpu.Stream.record_event); this is torch "
                f"{torch.__version__}")
    return None


def fsdp_root_reshard_after_forward(reshard_after_forward: bool) -> bool | None:
    """fully_shard's reshard_after_forward for the root: None (torch's rule: stay gathered) from 2.8; before,
    None is a ValueError and the root stays gathered whatever it is told, so the blocks' bool goes through."""
    if TORCH_VERSION < (2, 8):
        return reshard_after_forward
    return None if reshard_after_forward else False


# ---- device and precision ----

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' = CUDA when present, else CPU. CUDA asked for on a machine without it is a ConfigError."""
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


def device_or_exit(parser: argparse.ArgumentParser, name: str) -> torch.device:
    try:
        return resolve_device(name)
    except ConfigError as exc:
        parser.error(str(exc))


def precision_context(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """fp32: nothing. bf16 / fp16: torch.autocast on `device`; parameters stay fp32 (master weights)."""
    return contextlib.nullcontext() if dtype == "fp32" else torch.autocast(device.type, dtype=DTYPES[dtype])


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on `device` (CUDA kernels run asynchronously; a CPU has none to wait for)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SyncTimer:
    """Seconds, the device synchronised at both clock reads: `with SyncTimer(device) as t:`, t.elapsed_s."""

    def __init__(self, device: torch.device | None = None):
        self.device = device or torch.device("cpu")
        self.elapsed_s = float("nan")

    def __enter__(self) -> SyncTimer:
        synchronize(self.device)
        self._start = clock()
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.device)
        self.elapsed_s = clock() - self._start

    def time(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        """(fn(), seconds)."""
        with self:
            result = fn()
        return result, self.elapsed_s


# ---- do_bench: triton's on CUDA when it imports, else its plan with the synchronised timer ----


def triton_do_bench() -> Callable[..., Any] | None:
    try:  # triton 3.2+, with torch 2.6+'s CUDA wheels: return_mode="all" gives every sample
        from triton.testing import do_bench
    except ImportError:
        return None
    return do_bench


def sync_times(fn: Callable[[], Any], device: torch.device, calls: int) -> list[float]:
    """ms of each of `calls` calls of fn() (SyncTimer); what fn returns is freed after the clock stops."""
    timer, samples = SyncTimer(device), []
    for _ in range(calls):
        with timer:
            result = fn()
        samples.append(timer.elapsed_s * 1e3)
        del result
    return samples


ESTIMATE_CALLS = 5  # do_bench's: the calls after the first whose mean sizes the warm-up and the repetitions
CLOCKS_AGREE = 0.05  # the two clocks' largest relative disagreement on the timed calls before a figure is refused


def leaderboard_time(fn: Callable[[], Any], device: torch.device, warmup_ms: float, rep_ms: float,
                     agree: Callable[[int], int] | None = None,
                     do_bench: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Mean ms per call of fn() as the leaderboards time it: `do_bench` (default: triton's on CUDA when it imports
    and no `agree`), else its method with the sync timer: one call (it may compile), ESTIMATE_CALLS calls whose mean
    sizes the rest, warm-up calls for warmup_ms, then rep_ms of timed calls. Under torchrun `agree` makes every rank
    run the same counts (each rank would size them from its own pace, and the ranks' collectives would not pair).
    The second clock times the same calls: "clocks_disagree" is their relative difference (a clock replaced by the
    code under test shows there)."""
    calls, marks = [0], []
    do_bench = do_bench or (triton_do_bench() if device.type == "cuda" and agree is None else None)

    def counted() -> Any:
        calls[0] += 1
        result = fn()
        if calls[0] == 1:  # the first call may compile: the second clock starts after it
            synchronize(device)
            marks.append(second_clock_ns())
        return result

    if do_bench is not None:  # triton's: its counts are its own; the second clock spans every call after the first
        ms = float(do_bench(counted, warmup=warmup_ms, rep=rep_ms))
        second_ms = (second_clock_ns() - marks[0]) / 1e6 / max(1, calls[0] - 1)
        timed = {"ms": ms, "method": "triton.testing.do_bench"}
    else:
        agree = agree or (lambda n: n)
        first = sync_times(counted, device, 1)[0]
        estimate = statistics.fmean(sync_times(counted, device, ESTIMATE_CALLS))
        warmup_calls = agree(max(1, int(warmup_ms / max(estimate, 1e-3))))
        sync_times(counted, device, warmup_calls)
        repetitions = agree(max(1, int(rep_ms / max(estimate, 1e-3))))  # before the clock: it waits for the ranks
        start = second_clock_ns()
        samples = sync_times(counted, device, repetitions)
        second_ms = (second_clock_ns() - start) / 1e6 / len(samples)
        ms = statistics.fmean(samples)
        timed = {"ms": ms, "method": "sync timer", "calls": len(samples), "first_call_ms": first,
                 "estimate_ms": estimate, "warmup_calls": warmup_calls}
    return {**timed, "calls_in_all": calls[0], "warmup_ms": warmup_ms, "rep_ms": rep_ms, "second_clock_ms": second_ms,
            "clocks_disagree": abs(second_ms / ms - 1) if ms > 0 else math.inf}


# ---- memory ----


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> dict[str, int]:
    """Peak bytes since the reset, allocated (live tensors) and reserved (the allocator's); {} on a CPU."""
    if device.type != "cuda":
        return {}
    torch.cuda.synchronize(device)
    return {"peak_mem_allocated_bytes": torch.cuda.max_memory_allocated(device),
            "peak_mem_reserved_bytes": torch.cuda.max_memory_reserved(device)}


def free_memory_bytes(device: torch.device, meminfo: str = "/proc/meminfo") -> int | None:
    """Free CUDA memory (asked in the child: the parent has no CUDA context) or MemAvailable."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with contextlib.suppress(OSError), open(meminfo) as f:
        return next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")),
                    None)
    return None


def storage_key(t: torch.Tensor) -> int:
    """One key per storage, shared by its views (the StorageImpl's address: fake tensors' data_ptr is 0)."""
    return t.untyped_storage()._cdata


@contextlib.contextmanager
def saved_tensors(describe: Callable[[torch.Tensor], Any] | None = None,
                  exclude: set[int] = frozenset()) -> Iterator[dict[int, Any]]:
    """What autograd saves for backward inside the block, once per storage: {storage_key: describe(tensor) or
    the storage's bytes}, less the storages in `exclude` (weights). Works on fake tensors; read the dict while
    the graph lives (keys are addresses)."""
    saved: dict[int, Any] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key not in exclude and key not in saved:
            saved[key] = describe(t) if describe else t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield saved


# ---- NVTX and profiler ranges ----

_RANGES: list[Callable[[str], contextlib.AbstractContextManager]] = []  # annotate's: record_function, NVTX
_NULL_RANGE = contextlib.nullcontext()


def nvtx_functions() -> tuple[Callable[[str], Any], Callable[[], Any]]:
    """torch.cuda.nvtx's (push, pop), tried once; ValueError where this torch has no NVTX (a CPU-only build)."""
    try:
        torch.cuda.nvtx.range_push("NVTX check")
        torch.cuda.nvtx.range_pop()
    except RuntimeError:
        raise ValueError(f"NVTX ranges need a CUDA build of torch; this one ({torch.__version__}) has no NVTX"
                         ) from None
    return torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop


def set_ranges(nvtx: bool = False, profiler: bool = False) -> None:
    """Switch on NVTX ranges and/or record_function labels (annotate's)."""
    if nvtx:
        nvtx_functions()
    _RANGES[:] = [torch.profiler.record_function] * profiler + [torch.cuda.nvtx.range] * nvtx


@contextlib.contextmanager
def _active_range(name: str) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for open_range in _RANGES:
            stack.enter_context(open_range(name))
        yield


def annotate(name: str) -> contextlib.AbstractContextManager:
    """A named range when set_ranges switched them on, else one shared no-op. None where torch.compile
    traces: Dynamo cannot trace the calls, and fused kernels cross the boundaries anyway."""
    if not _RANGES or torch.compiler.is_compiling():
        return _NULL_RANGE
    return _active_range(name)


# libkineto writes "USDT:... profiler_start" / "profiler_stop" markers to std::cerr at every profiler start
# and stop (2.12 and later), and a CUDA build without a GPU logs "ERROR:... gpuGetDeviceCount failed with code
# 35" once. The one setting that hides them, KINETO_LOG_LEVEL=6, hides kineto's real errors too: so these
# lines, and only they, are filtered out of file descriptor 2 while a profiler runs.
KINETO_NO_GPU_ERROR = re.compile(rb"ERROR:.*\] gpuGetDeviceCount failed with code \d+$")


def is_kineto_noise(line: bytes, gpu: bool) -> bool:
    return line.startswith(b"USDT:") or (not gpu and KINETO_NO_GPU_ERROR.match(line.rstrip()) is not None)


class QuietProfiler(torch.profiler.profile):
    """torch.profiler.profile with fd 2 routed through a thread that drops kineto's noise while it runs."""

    def __enter__(self) -> QuietProfiler:
        gpu = torch.cuda.is_available()
        sys.stderr.flush()
        self._stderr = os.dup(2)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)

        def forward() -> None:
            with os.fdopen(read_fd, "rb") as pipe:
                for line in pipe:
                    if not is_kineto_noise(line, gpu):
                        os.write(self._stderr, line)

        self._reader = threading.Thread(target=forward, daemon=True)
        self._reader.start()
        try:
            return super().__enter__()
        except BaseException:
            self._restore()
            raise

    def _restore(self) -> None:
        sys.stderr.flush()
        os.dup2(self._stderr, 2)  # drops the pipe's last write end: the reader sees EOF
        self._reader.join()
        os.close(self._stderr)

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._restore()


def quiet_profiler(activities: list[torch.profiler.ProfilerActivity]) -> QuietProfiler:
    """acc_events=True silences 2.10-2.12's warning at every first start: one cycle, the same events."""
    return QuietProfiler(activities=activities, acc_events=True)


# ---- hardware peaks ----

# Peak dense TFLOP/s (fp32, tf32, bf16, fp16) from the vendors' datasheets; where one quotes only sparse
# figures the dense one is half. tf32 is the fp32-matmul figure with TF32 allowed; bf16/fp16 are tensor-core
# figures with fp32 accumulation (GeForce cards run that at half their fp16-accumulate rate). None = no such
# unit, or no datasheet figure: then no MFU, never a guess (--peak-tflops supplies one). The first pattern
# that matches torch.cuda.get_device_name() wins, so specific names come first.
NO_FIGURES = (None, None, None, None)
PEAK_TFLOPS: list[tuple[str, str, tuple[float | None, ...]]] = [
    (r"Laptop", "laptop GPU (power-limited: no datasheet peak)", NO_FIGURES),
    (r"GB200", "GB200", (80.0, 1250.0, 2500.0, 2500.0)),  # GB200 NVL72: 360 PFLOPS* bf16 / 72
    (r"\bB200\b", "B200", (75.0, 1125.0, 2250.0, 2250.0)),  # HGX B200: 36 PFLOPS* bf16 / 8
    (r"RTX PRO 6000 Blackwell (Max-Q|Server)", "RTX PRO 6000 Blackwell (Max-Q / Server: no figures here)",
     NO_FIGURES),
    (r"RTX PRO 6000 Blackwell", "RTX PRO 6000 Blackwell Workstation", (125.0, 250.0, 500.0, 500.0)),
    (r"GH200", "GH200", (67.0, 494.7, 989.4, 989.4)),
    (r"H200 NVL", "H200 NVL", (60.0, 417.5, 835.5, 835.5)),
    (r"H200", "H200 SXM", (67.0, 494.7, 989.4, 989.4)),
    (r"H20\b", "H20", (44.0, 74.0, 148.0, 148.0)),
    (r"H100 NVL", "H100 NVL", (60.0, 417.5, 835.5, 835.5)),
    (r"H100.*PCIe", "H100 PCIe", (51.2, 378.0, 756.0, 756.0)),
    (r"H100", "H100 SXM", (67.0, 494.7, 989.4, 989.4)),
    (r"H800.*PCIe", "H800 PCIe", (51.2, 378.0, 756.0, 756.0)),
    (r"H800", "H800 SXM", (67.0, 494.7, 989.4, 989.4)),
    (r"A100", "A100", (19.5, 156.0, 312.0, 312.0)),  # every A100 / A800 form factor: the same compute
    (r"A800", "A800", (19.5, 156.0, 312.0, 312.0)),
    (r"L40S", "L40S", (91.6, 183.0, 362.05, 362.05)),
    (r"\bL40\b", "L40", (90.5, 90.5, 181.0, 181.0)),
    (r"\bL4\b", "L4", (30.3, 60.0, 121.0, 121.0)),
    (r"\bA40\b", "A40", (37.4, 74.8, 149.7, 149.7)),
    (r"\bA10\b", "A10", (31.2, 62.5, 125.0, 125.0)),
    (r"\bA10G\b", "A10G (AWS: no NVIDIA datasheet)", NO_FIGURES),
    (r"RTX 6000 Ada", "RTX 6000 Ada", (91.1, 182.1, 364.2, 364.2)),
    (r"RTX A6000", "RTX A6000", (38.7, 77.4, 154.8, 154.8)),
    (r"RTX (5090|4090) D", "RTX 5090 D / 4090 D (no figures here)", NO_FIGURES),
    (r"RTX 5090", "RTX 5090", (104.8, 104.8, 209.5, 209.5)),
    (r"RTX 4090", "RTX 4090", (82.6, 82.6, 165.2, 165.2)),
    (r"RTX 3090 Ti", "RTX 3090 Ti", (40.0, 40.0, 80.0, 80.0)),
    (r"RTX 3090", "RTX 3090", (35.6, 35.6, 71.0, 71.0)),
    (r"V100S", "V100S PCIe", (16.4, None, None, 130.0)),  # Volta / Turing / Pascal: no TF32 or bf16 units
    (r"V100-SXM2", "V100 SXM2", (15.7, None, None, 125.0)),
    (r"V100-PCIE", "V100 PCIe", (14.0, None, None, 112.0)),
    (r"V100", "V100 (other variant: no figures here)", NO_FIGURES),
    (r"\bT4\b", "T4", (8.1, None, None, 65.0)),
    (r"P100-SXM2", "P100 SXM2", (10.6, None, None, 21.2)),
    (r"P100", "P100 PCIe", (9.3, None, None, 18.7)),
]
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def peak_tflops(device_name: str, precision: str) -> tuple[float | None, str | None]:
    """(peak dense TFLOP/s, matched label) for a CUDA device name and one of PRECISIONS; (None, None) for an
    unknown device, (None, label) where the chip has no such unit or no datasheet gives it."""
    peaks, label = datasheet_row(PEAK_TFLOPS, device_name)
    return (peaks[PRECISIONS.index(precision)] if peaks and precision in PRECISIONS else None), label


def datasheet_row(table: list[tuple[str, str, Any]], device_name: str) -> tuple[Any, str | None]:
    """(figure, label) of the first row of a datasheet table whose pattern the device name matches; (None, None)
    when none does: no figure, never a guess."""
    return next(((figure, label) for pattern, label, figure in table if re.search(pattern, device_name)), (None, None))


# Peak link bandwidth per GPU, GB/s in one direction (10^9 bytes/s), for collectives between the GPUs of one node:
# what nccl-tests' bus bandwidth is compared against (each byte it counts is sent by one GPU and received by
# another; a GPU sends and receives at once, so one direction's figure is the bound). The datasheets quote both
# directions together: NVLink 5 (B200, GB200) 1.8 TB/s, NVLink 4 (H100/H200 SXM) 900 GB/s, H800 400 GB/s, NVLink 3
# (A100 SXM) 600 GB/s, H100 NVL's bridge 600 GB/s; PCIe 5.0 x16 128 GB/s, 4.0 x16 64 GB/s (NVIDIA's B200, H100,
# H200 and A100 datasheets; PCI-SIG: 32 / 16 GT/s per lane). A PCIe card's peers may be joined by an NVLink bridge
# instead, which nothing here detects: its figure is the PCIe slot's. First matching pattern wins, as PEAK_TFLOPS.
LINK_PEAK_GBPS: list[tuple[str, str, float]] = [
    (r"GB200", "NVLink 5 (GB200)", 900.0),
    (r"\bB200\b", "NVLink 5 (B200)", 900.0),
    (r"H200 NVL", "NVLink 4 bridge (H200 NVL)", 450.0),
    (r"H100 NVL", "NVLink 4 bridge (H100 NVL)", 300.0),
    (r"H100.*PCIe", "PCIe 5.0 x16 (H100 PCIe; a bridge would be 300)", 64.0),
    (r"H800.*PCIe", "PCIe 5.0 x16 (H800 PCIe)", 64.0),
    (r"H800", "NVLink 4 (H800 SXM)", 200.0),
    (r"H100|H200|GH200", "NVLink 4 (H100/H200 SXM)", 450.0),
    (r"A100.*PCIe", "PCIe 4.0 x16 (A100 PCIe; a bridge would be 300)", 32.0),
    (r"A100", "NVLink 3 (A100 SXM)", 300.0),
]


def link_peak_gbps(device_name: str) -> tuple[float | None, str | None]:
    """(GB/s per direction, the link's label) of the GPU-to-GPU link of a CUDA device name; (None, None) for an
    unknown device or a CPU: no figure, never a guess."""
    return datasheet_row(LINK_PEAK_GBPS, device_name)


def matmul_precision_key(dtype: str, tf32: bool) -> str:
    """Which peak applies: autocast dtypes their tensor-core peak; fp32 TF32's when it is allowed."""
    return ("tf32" if tf32 else "fp32") if dtype == "fp32" else dtype


# Memory bandwidth (GB/s, 10^9 bytes/s) of the GPUs of PEAK_TFLOPS, from the same vendors' datasheets; split where
# one compute figure covers memories of several speeds. None: no figure (then the measured copy bandwidth).
MEMORY_BANDWIDTH_GBS: list[tuple[str, str, float | None]] = [
    (r"Laptop", "laptop GPU", None),
    (r"GB200", "GB200", 8000.0),  # GB200 NVL72: 576 TB/s / 72 GPUs
    (r"\bB200\b", "B200", 8000.0),  # HGX B200: 64 TB/s / 8 GPUs
    (r"RTX PRO 6000 Blackwell", "RTX PRO 6000 Blackwell", 1792.0),
    (r"GH200", "GH200 (96 GB HBM3 at 4.0 TB/s or 144 GB HBM3e at 4.9 TB/s: no single figure)", None),
    (r"H200", "H200", 4800.0),  # SXM and NVL alike
    (r"H20\b", "H20", 4000.0),
    (r"H100 NVL", "H100 NVL", 3900.0),
    (r"H100.*PCIe", "H100 PCIe", 2000.0),
    (r"H100", "H100 SXM", 3350.0),
    (r"H800.*PCIe", "H800 PCIe", 2000.0),
    (r"H800", "H800 SXM", 3350.0),
    (r"A[18]00.*80GB.*PCIe", "A100 / A800 80GB PCIe", 1935.0),
    (r"A[18]00.*80GB", "A100 / A800 80GB SXM", 2039.0),
    (r"A[18]00", "A100 / A800 40GB", 1555.0),
    (r"L40S|\bL40\b", "L40S / L40", 864.0),
    (r"\bL4\b", "L4", 300.0),
    (r"\bA40\b", "A40", 696.0),
    (r"\bA10\b", "A10", 600.0),
    (r"\bA10G\b", "A10G (AWS: no NVIDIA datasheet)", None),
    (r"RTX 6000 Ada", "RTX 6000 Ada", 960.0),
    (r"RTX A6000", "RTX A6000", 768.0),
    (r"RTX (5090|4090) D", "RTX 5090 D / 4090 D", None),
    (r"RTX 5090", "RTX 5090", 1792.0),
    (r"RTX 4090", "RTX 4090", 1008.0),
    (r"RTX 3090 Ti", "RTX 3090 Ti", 1008.0),
    (r"RTX 3090", "RTX 3090", 936.0),
    (r"V100S", "V100S PCIe", 1134.0),
    (r"V100", "V100", 900.0),
    (r"\bT4\b", "T4", 320.0),
    (r"P100.*12GB", "P100 12GB", 549.0),
    (r"P100", "P100 16GB", 732.0),
]


def memory_bandwidth(device_name: str) -> tuple[float | None, str | None]:
    """(datasheet GB/s, matched label) for a CUDA device name; (None, None) for an unknown device."""
    return datasheet_row(MEMORY_BANDWIDTH_GBS, device_name)


# ---- the measured ceiling: what this machine reaches, for a CPU or a GPU no datasheet row names ----

CEILINGS_FILE = "ceilings.json"  # in the results folder: {"<host> | <device name> | torch <version>": ceiling}
CEILINGS_ENV = "CS336_CEILINGS"  # a ceilings file to use instead: one machine's ceiling shared by result folders
CALIBRATION = {"budget_s": 3.0, "max_matmul": {"cuda": 8192, "cpu": 2048}, "copy_bytes": {"cuda": 2**30, "cpu": 2**28}}
CALIBRATED = ("fp32", "tf32", "bf16", "fp16")  # on a CPU without tf32: TF32 is a CUDA setting


def best_rate(fn: Callable[[], Any], work: float, device: torch.device, budget_s: float) -> float:
    """The best work per second of `fn` over blocks of calls within budget_s; the first call untimed, blocks
    doubled until one lasts 10 ms (a CUDA launch and sync cost microseconds)."""
    fn()
    deadline, calls, best = timeit.default_timer() + budget_s, 1, 0.0
    while True:
        with SyncTimer(device) as timer:
            for _ in range(calls):
                fn()
        best = max(best, work * calls / timer.elapsed_s)
        if timeit.default_timer() + timer.elapsed_s > deadline:
            return best
        calls *= 2 if timer.elapsed_s < 0.01 else 1


def matmul_routes(a: torch.Tensor, b: torch.Tensor) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """The two routes a model's matmuls take: `a @ b` and F.linear. On a CPU they differ for bf16 and fp16 (linear
    goes to oneDNN, `@` to a kernel ~10x slower), so a ceiling from `@` alone is below what a model reaches."""
    return (lambda: a @ b), (lambda: torch.nn.functional.linear(a, b))


def matmul_tflops(device: torch.device, precision: str, max_n: int, budget_s: float) -> tuple[float, int]:
    """Best TFLOP/s of an n x n matmul by its faster route (matmul_routes, chosen at the first n: the slower one
    at the largest n could take minutes): n = 256, 512, ... max_n, the best of a few calls each while the next
    size's call (8x the FLOPs, at twice the rate: larger matmuls run faster) fits half the budget left, then the
    rest of the budget at the fastest n; (TFLOP/s, n)."""
    dtype = DTYPES["fp32" if precision == "tf32" else precision]
    deadline, rates, route = timeit.default_timer() + budget_s, {}, None
    matmul, before = torch.backends.cuda.matmul, tf32_enabled()
    if device.type == "cuda":  # the legacy flag, as bench_e2e's --tf32 sets it
        matmul.allow_tf32 = precision == "tf32"
    try:
        for n in [n for n in (256 * 2**k for k in range(8)) if n <= max_n] or [max_n]:
            a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
            if route is None:
                first = [best_rate(call, 2 * n**3, device, budget_s / 40) for call in matmul_routes(a, b)]
                route = first.index(max(first))
            rates[n] = best_rate(matmul_routes(a, b)[route], 2 * n**3, device, budget_s / 20)
            if 4 * 2 * n**3 / rates[n] > (deadline - timeit.default_timer()) / 2:  # 8x the work, 2x the rate
                break
        n = max(rates, key=rates.get)
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        rates[n] = max(rates[n], best_rate(matmul_routes(a, b)[route], 2 * n**3, device,
                                           deadline - timeit.default_timer()))
    finally:
        if device.type == "cuda":
            matmul.allow_tf32 = before
    return rates[n] / 1e12, n


def measure_ceiling(device: torch.device, budget_s: float, max_matmul: int, copy_bytes: int) -> dict[str, Any]:
    """Best matmul TFLOP/s per precision and copy bandwidth (bytes read + written / s of a copy_bytes tensor copy),
    each in its share of budget_s; the 1-minute load average before (other work lowers every figure)."""
    start, precisions = timeit.default_timer(), CALIBRATED if device.type == "cuda" else ("fp32", "bf16", "fp16")
    share = budget_s / (len(precisions) + 1)
    out: dict[str, Any] = {"matmul_tflops": {}, "matmul_n": {}, "loadavg_1m": machine_load(device)["loadavg_1m"]}
    for precision in precisions:
        out["matmul_tflops"][precision], out["matmul_n"][precision] = matmul_tflops(device, precision, max_matmul,
                                                                                     share)
    if device.type == "cuda":  # two tensors in at most half the free memory
        copy_bytes = min(copy_bytes, torch.cuda.mem_get_info(device)[0] // 4)
    src = torch.ones(copy_bytes // 4, device=device)
    dst = torch.empty_like(src)
    out["copy_gbs"] = best_rate(lambda: dst.copy_(src), 2 * src.nbytes, device, share) / 1e9
    out["copy_bytes"] = src.nbytes
    del src, dst
    if device.type == "cuda":  # --in-process: the sweep's configurations get the memory back
        torch.cuda.empty_cache()
    return {**out, "budget_s": budget_s, "seconds": timeit.default_timer() - start,
            "device_name": device_name(device), "hostname": socket.gethostname(), "torch": torch.__version__,
            "utc_time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def best_ceiling(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Figure by figure, the higher of two measurements of this machine: load only lowers a figure, so the best
    seen is the nearest to what it can do. loadavg_1m: the highest of the measurements whose figures are kept."""
    def rate(entry: dict[str, Any], figure: str) -> float:  # a precision's matmul TFLOP/s, or the copy's GB/s
        return entry["copy_gbs"] if figure == "copy" else entry["matmul_tflops"].get(figure) or 0

    source = {k: old if rate(old, k) > rate(new, k) else new for k in [*new["matmul_tflops"], "copy"]}
    loads = [e["loadavg_1m"] for e in source.values() if isinstance(e.get("loadavg_1m"), (int, float))]
    copy = source.pop("copy")
    return {**new, "matmul_tflops": {k: e["matmul_tflops"][k] for k, e in source.items()},
            "matmul_n": {k: (e.get("matmul_n") or {}).get(k) for k, e in source.items()},
            "copy_gbs": copy["copy_gbs"], "copy_bytes": copy.get("copy_bytes"), "loadavg_1m": max(loads, default=None)}


def ceiling_line(entry: dict[str, Any]) -> str:
    """'fp32 0.51 TFLOP/s, bf16 ..., copy 12.3 GB/s at load 0.4' (the 1-minute load average when measured)."""
    rates = [f"{k} {v:.3g} TFLOP/s" for k, v in entry["matmul_tflops"].items()]
    return ", ".join([*rates, f"copy {entry['copy_gbs']:.3g} GB/s at load {entry.get('loadavg_1m')}"])


def machine_ceiling(device: torch.device, results_dir: str, recalibrate: bool = False,
                    calibration: dict[str, Any] | None = None, quiet: bool = False) -> dict[str, Any]:
    """This machine's measured ceiling from <results_dir>/ceilings.json (or $CS336_CEILINGS), measured (a few
    seconds) when absent or when `recalibrate`, and saved as the best seen (best_ceiling): a measurement under load
    never lowers it. `calibration`: CALIBRATION's settings; `quiet`: nothing said."""
    say = (lambda message: None) if quiet else progress
    settings = {**CALIBRATION, **(calibration or {})}
    path = Path(os.environ.get(CEILINGS_ENV) or Path(results_dir, CEILINGS_FILE))
    key = f"{socket.gethostname()} | {device_name(device)} | torch {torch.__version__}"
    cache: dict[str, Any] | None = {}
    if path.exists():
        try:
            cache = json.loads(path.read_text())
        except (OSError, ValueError):
            cache = None
        if not isinstance(cache, dict):  # not ours, or damaged: measured, and the file left as it is
            say(f"note: {path} is not a ceilings file: the ceiling is measured and not saved")
            cache = None
    entry = (cache or {}).get(key)
    valid = isinstance(entry, dict) and isinstance(entry.get("matmul_tflops"), dict) and all(
        isinstance(v, (int, float)) for v in [*entry["matmul_tflops"].values(), entry.get("copy_gbs")])
    if valid and not recalibrate:
        return {**entry, "cache": str(path), "cached": True}
    say(f"measuring this machine's ceiling on {key.split(' | ')[1]}: best matmul TFLOP/s per dtype and copy "
        f"bandwidth, ~{settings['budget_s']:g} s (the best seen is saved in {path}; --recalibrate measures again)")
    new = measure_ceiling(device, settings["budget_s"], settings["max_matmul"][device.type],
                          settings["copy_bytes"][device.type])
    best = best_ceiling(entry, new) if valid else new
    say(f"measured in {new['seconds']:.1f} s: {ceiling_line(new)}"
        + (f"; kept, the best seen: {ceiling_line(best)}" if best != new else ""))
    if cache is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            replace_text(path, json.dumps({**cache, key: best}, indent=1) + "\n")
        except OSError as exc:  # a read-only folder: this run still has its ceiling
            say(f"note: the measured ceiling is not saved: {path}: {exc.strerror or exc}")
    return {**best, "cache": str(path), "cached": False}


def roofs(environment: dict[str, Any], precision: str, measured: dict[str, Any] | None,
          peak_override: float | None = None) -> dict[str, Any]:
    """The ceilings a floor divides by: the datasheet's for a GPU it names (--peak-tflops over its FLOP/s), else
    the measured ones; both kept for the roofline. `ceiling` says which a floor used."""
    name, cuda = environment.get("device_name") or "", str(environment.get("device")).startswith("cuda")
    sheet_tflops, label = peak_tflops(name, precision) if cuda else (None, None)
    sheet_gbs, bandwidth_label = memory_bandwidth(name) if cuda else (None, None)
    datasheet = ({"tflops": sheet_tflops, "gbs": sheet_gbs, "label": label or bandwidth_label}
                 if sheet_tflops or sheet_gbs else None)
    own = None
    if measured and isinstance(measured.get("matmul_tflops"), dict):
        tflops = measured["matmul_tflops"]
        own = {"tflops": tflops.get(precision) or (tflops.get("fp32") if precision == "tf32" else None),
               "gbs": measured.get("copy_gbs"), "loadavg_1m": measured.get("loadavg_1m")}
    tflops, compute_source = next(((v, source) for v, source in (
        (peak_override, "--peak-tflops"), (sheet_tflops, "datasheet"), ((own or {}).get("tflops"), "measured"))
        if v), (None, None))
    gbs, memory_source = next(((v, source) for v, source in (
        (sheet_gbs, "datasheet"), ((own or {}).get("gbs"), "measured")) if v), (None, None))
    ceiling = ((compute_source or "none") if compute_source == memory_source
               else f"{compute_source or 'no'} FLOP/s, {memory_source or 'no'} GB/s")
    return {"precision": precision, "tflops": tflops, "gbs": gbs, "ceiling": ceiling, "datasheet": datasheet,
            "measured": own}


# ---- environment record ----


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    # Linux: the CPU's name from /proc/cpuinfo (platform.processor() is often empty)
    with contextlib.suppress(OSError, StopIteration):
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    return platform.processor() or platform.machine() or "cpu"


def environment(device: torch.device) -> dict[str, Any]:
    """What a number was measured on: device, versions, TF32, threads, time."""
    env: dict[str, Any] = {
        "device": str(device), "device_name": device_name(device), "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "tf32_matmul": tf32_enabled(), "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(), "python": platform.python_version(),
        "utc_time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        env["gpu_memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
    return env


# record key -> torch.cuda's reader of it (through NVML: needs pynvml)
GPU_READERS = {"gpu_utilization_pct": "utilization", "gpu_temperature_c": "temperature",
               "gpu_power_mw": "power_draw", "gpu_sm_clock_mhz": "clock_rate"}


def machine_load(device: torch.device) -> dict[str, Any]:
    """What else the machine was doing, read (untimed) around a measurement: the 1-minute load average (above
    the usable CPUs, work is queued), the CPUs and the usable ones; on CUDA the GPU's utilisation, temperature,
    power, SM clock and other processes, or {"nvml": why} when NVML is unreadable."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    load: dict[str, Any] = {"loadavg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
                            "cpu_count": os.cpu_count(), "cpus_usable": usable}
    if device.type != "cuda":
        return load
    try:
        gpu = {key: getattr(torch.cuda, read)(device) for key, read in GPU_READERS.items()}
        listing = torch.cuda.list_gpu_processes(device)  # "process   1234 uses  512.000 MB GPU memory" lines
    except Exception as exc:  # noqa: BLE001 - no pynvml, no NVML, a MIG slice: the load is unknown
        return {**load, "nvml": f"unavailable: {type(exc).__name__}: {exc}"}
    pids = map(int, re.findall(r"process\s+(\d+)\s+uses", listing))
    return {**load, **gpu, "gpu_other_pids": [pid for pid in pids if pid != os.getpid()]}


# ---- failures as data ----


def is_oom(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or isinstance(exc, RuntimeError) and (
        "out of memory" in text.lower() or "DefaultCPUAllocator: can't allocate" in text)


def failure_status(exc: BaseException) -> str:
    return "OOM" if is_oom(exc) else f"error: {one_line(exc)}"


# ---- the student's code: --model / --optimizer / --impl [NAME=]MODULE:CALLABLE ----

_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"  # cs336_basics.model:BasicsTransformerLM, flash:Outer.Inner
SPEC = re.compile(rf"^(?:([\w.+-]+)=)?({_DOTTED}):({_DOTTED})$")  # NAME= labels tables and records


class LoadError(Exception):
    """The code a spec names cannot be found or imported; the message is one line: which and why."""


def is_spec(text: str) -> bool:
    return SPEC.match(text) is not None


def named_or_spec(names: list[str]) -> Callable[[str], str]:
    """argparse type of a flag taking one of `names` (ours) or [NAME=]MODULE:CALLABLE (yours)."""
    def parse(text: str) -> str:
        if text in names or is_spec(text):
            return text
        ours = f"choose from {', '.join(names)}, or " if names else ""
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} ({ours}[NAME=]MODULE:CALLABLE for your own)")
    return parse


def named_model(text: str) -> tuple[str | None, str]:
    """--model: ours, MODULE:CALLABLE, or NAME=either -> (NAME or None, the model)."""
    name, _, spec = text.rpartition("=")
    if name and not re.fullmatch(r"[A-Za-z0-9_.+-]+", name):  # a short name for tables and records
        raise argparse.ArgumentTypeError(f"model name {name!r}: letters, digits and _ . + - only")
    return name or None, named_or_spec([OURS])(spec)


def load(spec: str) -> Any:
    """The object [NAME=]MODULE:CALLABLE names: imported from the working directory first (then PYTHONPATH and
    the installed packages), as `python -c` would, though never in place of one of this toolkit's modules."""
    match = SPEC.match(spec)
    if match is None:
        raise LoadError(f"{spec!r} is not [NAME=]MODULE:CALLABLE")
    _, module_name, attribute = match.groups()
    cwd, top = os.getcwd(), module_name.partition(".")[0]
    theirs = [p for p in (os.path.join(cwd, top + ".py"), os.path.join(cwd, top)) if os.path.exists(p)]
    elsewhere = os.path.realpath(cwd) != os.path.realpath(HERE)
    if theirs and os.path.exists(os.path.join(HERE, top + ".py")) and elsewhere:
        raise LoadError(f"{theirs[0]} has the name of this toolkit's {top}.py: rename it or put it in a "
                        f"package (for {spec})")
    if cwd not in sys.path:  # after the toolkit's folder, before the installed packages
        sys.path.insert(sys.path.index(HERE) + 1 if HERE in sys.path else 0, cwd)
    try:
        with refusing_our_names(spec):
            module = importlib.import_module(module_name)
    except LoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - an error in the student's module is theirs to see, in one line
        name = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if name is not None and (module_name + ".").startswith(name + "."):
            raise LoadError(f"cannot import {module_name} (for {spec}): no module named {name!r} in the "
                            f"current directory ({cwd}), PYTHONPATH or the installed packages") from None
        raise LoadError(f"importing {module_name} (for {spec}) failed: {one_line(exc)}") from None
    try:
        return functools.reduce(getattr, attribute.split("."), module)
    except AttributeError:
        where = getattr(module, "__file__", None) or "a namespace package"
        raise LoadError(f"{module_name} ({where}) has no {attribute!r} (for {spec})") from None


@contextlib.contextmanager
def refusing_our_names(spec: str) -> Iterator[None]:
    """While the student's code is imported: its `import optim` (model, common, ...) that would find a module of
    its own on the path (the working directory's optim.py) gets ours, already imported. Refused in one line."""
    real, here = builtins.__import__, os.path.realpath(HERE)
    path = [p for p in sys.path if os.path.realpath(p or ".") != here]

    def guarded(name: str, globals: dict | None = None, locals: dict | None = None, fromlist: Any = (),
                level: int = 0) -> Any:
        top, importer = name.partition(".")[0], (globals or {}).get("__file__")
        if (level == 0 and importer and os.path.dirname(os.path.realpath(importer)) != here
                and os.path.exists(os.path.join(HERE, top + ".py"))
                and (theirs := importlib.machinery.PathFinder.find_spec(top, path)) is not None):
            raise LoadError(f"{importer} imports {top}, but this toolkit's {top}.py would run in place of "
                            f"{theirs.origin or theirs.name}: rename yours or put it in a package (for {spec})")
        return real(name, globals, locals, fromlist, level)

    builtins.__import__ = guarded
    try:
        yield
    finally:
        builtins.__import__ = real


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message`, with the file and line of a SyntaxError."""
    first = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, SyntaxError) and exc.filename:
        first = f"{exc.msg} ({exc.filename}, line {exc.lineno})"
    return f"{type(exc).__name__}: {first}"


def add_model_args(parser: argparse.ArgumentParser, optimizer_help: str, flops: bool) -> None:
    """--model and --optimizer (and bench_e2e's --flops): our model and AdamW, or yours."""
    parser.add_argument("--model", nargs="+", type=named_or_spec([OURS]), default=[OURS], metavar="MODEL",
                        help="ours = model.TransformerLM (the staff architecture); or yours as "
                             "[NAME=]MODULE:CALLABLE, a factory of an nn.Module taking the staff "
                             "constructor's keywords (vocab_size, context_length, d_model, num_layers, "
                             "num_heads, d_ff, rope_theta) whose forward maps token ids (batch, seq) to "
                             "logits (batch, seq, vocab), e.g. "
                             "staff=cs336_basics.model:BasicsTransformerLM (NAME labels the tables); "
                             "imported from the current directory or PYTHONPATH; several to compare them "
                             "(docs/your_code.md)")
    parser.add_argument("--optimizer", nargs="+", type=named_or_spec([OURS, "torch"]), default=[OURS],
                        metavar="OPTIMIZER", help=optimizer_help + "; or yours as [NAME=]MODULE:CLASS, built "
                        "as CLASS(params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01) "
                        "(model.ADAMW_SETTINGS) passing only the keywords its signature names (CLASS(params) "
                        "when it names none of them)")
    if flops:
        parser.add_argument("--flops", choices=["formula", "counted", "none"], default=None,
                            help="the FLOPs behind TFLOP/s and MFU: formula = results.step_flops, for our "
                                 "architecture (the default for our model; for yours only if it is the same "
                                 "architecture, as the staff model is); counted = torch.utils.flop_counter's "
                                 "count of one more, untimed step; none (the default for yours): no TFLOP/s, "
                                 "no MFU")


def once_each(flag: str, values: list, shown: Callable[[Any], str] = str) -> list:
    """A list flag's values in the order given, each once; a repeat is said (it would be the same configuration
    again: it runs once), from rank 0 only under torchrun."""
    unique = list(dict.fromkeys(values))
    for value in (v for v in unique if values.count(v) > 1 and os.environ.get("RANK", "0") == "0"):
        progress(f"note: {flag} {shown(value)} is given {values.count(value)} times: it runs once")
    return unique


def models_or_exit(parser: argparse.ArgumentParser, args: argparse.Namespace,
                   ours_only: dict[str, bool]) -> None:
    """--model without repeats; a flag of our model only (`ours_only`: flag -> given) without ours: exit 2."""
    args.model = once_each("--model", args.model)
    if OURS not in args.model:
        for flag, given in ours_only.items():
            if given:
                parser.error(f"{flag} changes our model only, and --model runs only yours "
                             f"({', '.join(args.model)}): drop it, or add ours (--model ours ...)")


def model_factory(name: str) -> str | None:
    return None if name == OURS else name


def flops_source(name: str, given: str | None) -> str:
    """--flops as given, else formula for our model and none for yours (the formula is our architecture's)."""
    return given or ("formula" if name == OURS else "none")
