"""What every experiment shares at run time: device and precision contexts, the synchronised timer, memory
counters and the saved-for-backward counter, NVTX / profiler ranges (and a profiler without kineto's marker
lines), the GPU peak table, the environment record and the machine's load, and failures as data.

The model's configuration and the handouts' sizes are in model_config.py, the command line in cli.py, result
files and tables in results.py, the LM workload and its measured steps in runner.py, statistics of samples in
stats.py, the sweep (and its fault injection for tests) in sweep.py.
Nothing here does work at import time or changes global state on import.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import os
import platform
import re
import subprocess
import sys
import threading
import timeit
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from model_config import ConfigError

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


# ---- memory ----

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
# NVTX binding: the CPU build of torch has none, so nsys_run.sh on a CPU builds a tiny library from the NVTX3
# headers that ship with Nsight Systems into a cache (nsys_tool.nvtx_library_for_cpu) and names it here
# (docs/nsys_run.md). On a GPU machine leave it unset.
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


def machine_load(device: torch.device) -> dict[str, Any]:
    """What else the machine was doing, read (untimed) before and after a measurement: the 1-minute load average
    (runnable processes; above the usable CPUs means work is queued), the CPUs and the usable ones (affinity); on
    CUDA also gpu_load. A CPU run never reaches a CUDA call."""
    load: dict[str, Any] = {"loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
                            "cpu_count": os.cpu_count(),
                            "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}
    if device.type == "cuda":
        load.update(gpu_load(device))
    return load


# record key (its unit in the name) -> the torch.cuda reader of it (each reads NVML: needs pynvml, or amdsmi on ROCm)
GPU_READERS: dict[str, str] = {"gpu_utilization_pct": "utilization", "gpu_temperature_c": "temperature",
                               "gpu_power_mw": "power_draw", "gpu_sm_clock_mhz": "clock_rate"}


def gpu_load(device: torch.device) -> dict[str, Any]:
    """Through NVML (torch.cuda's readers, which need pynvml): the GPU's utilisation over its last sample period
    (%), temperature (C), power draw (mW), SM clock (MHz) and the pids of the other processes using it (a
    neighbour's job, a throttled clock or a hot GPU changes every timing). {"nvml": why} when NVML cannot be read."""
    out: dict[str, Any] = {}
    try:
        for key, reader in GPU_READERS.items():
            out[key] = getattr(torch.cuda, reader)(device)
        listing = torch.cuda.list_gpu_processes(device)  # "process   1234 uses  512.000 MB GPU memory" lines
    except Exception as exc:  # noqa: BLE001 - no pynvml, no NVML in the driver, a MIG slice: the load is unknown
        return {"nvml": f"unavailable: {type(exc).__name__}: {exc}"[:200]}
    out["gpu_other_pids"] = [pid for pid in map(int, re.findall(r"process\s+(\d+)\s+uses", listing))
                             if pid != os.getpid()]
    return out


def device_or_exit(parser: argparse.ArgumentParser, name: str) -> torch.device:
    """resolve_device, with a user mistake (no CUDA, unknown device) as a one-line exit 2."""
    try:
        return resolve_device(name)
    except ConfigError as exc:
        parser.error(str(exc))


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
