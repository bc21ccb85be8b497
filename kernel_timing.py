"""How the latency of one call (a kernel, a forward, a backward) is measured, chosen by where it runs:

- CUDA with triton importable: triton.testing.do_bench, what the handout's flash_benchmarking asks for. It sizes
  its warm-up and repetitions by time (`warmup_ms`, `rep_ms`), flushes the L2 cache before every call and times
  each call with CUDA events; we ask for every sample (return_mode="all") and compute the quantiles ourselves.
- CUDA without triton: CUDA events around each call, `warmup` untimed calls first (no L2 flush).
- CPU: common.SyncTimer around each call (timeit.default_timer; nothing to synchronise), `warmup` calls first.

Every method returns milliseconds per call, one sample per call, and says in `settings` what it did (the record
keeps it). Nothing here does work at import time or changes global state on import.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import isolation
from common import SyncTimer

# do_bench's own defaults (triton.testing.do_bench(warmup=25, rep=100), in milliseconds of calls)
DO_BENCH_WARMUP_MS = 25.0
DO_BENCH_REP_MS = 100.0
# the quantiles recorded for every method: do_bench's documented summary (median with the 20th and 80th percentile)
QUANTILES = (0.2, 0.5, 0.8)


@dataclass(frozen=True)
class TimingMethod:
    name: str  # "triton.testing.do_bench", "cuda events" or "sync timer"
    settings: dict[str, Any]  # what it did, for the record (warm-up, repetitions, quantiles, why this method)
    samples: Callable[[Callable[[], Any]], list[float]] = field(repr=False)  # fn -> milliseconds per call

    def describe(self) -> dict[str, Any]:
        return {"method": self.name, **self.settings}


def sync_timer_samples(fn: Callable[[], Any], timer: SyncTimer, warmup: int, iters: int,
                       label: str = "call") -> list[float]:
    """`warmup` untimed calls, then `iters` calls each inside the sync timer. What a call returns is dropped after
    its timer stops: freeing a forward's graph is not part of the forward."""
    for i in range(warmup):
        isolation.phase(f"warm-up {label} {i + 1}/{warmup}")
        fn()
    samples = []
    for i in range(iters):
        with isolation.timed_phase(f"{label} {i + 1}/{iters}"), timer:
            result = fn()
        samples.append(timer.elapsed_s * 1e3)
        del result
    return samples


def cuda_event_samples(fn: Callable[[], Any], warmup: int, iters: int, label: str = "call") -> list[float]:
    """`warmup` untimed calls, then a pair of CUDA events around each of `iters` calls, read after one final
    synchronisation (the host runs ahead: a call's time is the GPU's, launch overhead included only where the GPU
    waited for it)."""
    for i in range(warmup):
        isolation.phase(f"warm-up {label} {i + 1}/{warmup}")
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    with isolation.timed_phase(f"{iters} x {label}"):
        torch.cuda.synchronize()
        for start, end in events:
            start.record()
            result = fn()
            end.record()
            del result  # a free is stream-ordered: the memory is reused only after this call's kernels
        torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def do_bench_samples(fn: Callable[[], Any], do_bench: Callable[..., Any], warmup_ms: float, rep_ms: float,
                     label: str = "call") -> list[float]:
    """triton.testing.do_bench's samples (ms), one per timed call."""
    with isolation.timed_phase(f"do_bench {label}"):
        return list(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all"))


@functools.cache  # a property of the installed triton: bench_attention chooses a timing per round, probes once
def do_bench_returns_samples(do_bench: Callable[..., Any], device: torch.device) -> bool:
    """Whether this triton's do_bench takes return_mode="all" (triton 3.x; 2.x asserts on it before running
    anything). Probed on a tiny kernel: its estimate of one call must not be 0 ms, which do_bench divides by."""
    try:
        do_bench(lambda: torch.ones(1024, device=device).add_(1), warmup=1, rep=1, return_mode="all")
    except AssertionError:
        return False
    return True


def choose_timing(device: torch.device, warmup: int, iters: int, warmup_ms: float = DO_BENCH_WARMUP_MS,
                  rep_ms: float = DO_BENCH_REP_MS) -> TimingMethod:
    """The method for `device` (see the module docstring). `warmup`/`iters` count calls for the sync timer and CUDA
    events; do_bench sizes its own from `warmup_ms`/`rep_ms`."""
    counted = {"warmup_calls": warmup, "timed_calls": iters, "quantiles": list(QUANTILES)}
    if device.type != "cuda":
        return TimingMethod("sync timer", {**counted, "clock": "timeit.default_timer, device synchronised at both "
                                                                "ends of every call"},
                            functools.partial(sync_timer_samples, timer=SyncTimer(device), warmup=warmup, iters=iters))
    events = functools.partial(cuda_event_samples, warmup=warmup, iters=iters)
    try:
        import triton  # optional: installed with torch on Linux CUDA builds
        from triton.testing import do_bench
    except ImportError as exc:
        return TimingMethod("cuda events", {**counted, "why": f"triton is not importable ({exc}); no L2 flush"},
                            events)
    version = getattr(triton, "__version__", "unknown")
    if not do_bench_returns_samples(do_bench, device):
        return TimingMethod("cuda events", {**counted, "why": f"triton {version}'s do_bench cannot return its samples "
                                                              "(return_mode='all'); no L2 flush"}, events)
    return TimingMethod("triton.testing.do_bench",
                        {"warmup_ms": warmup_ms, "rep_ms": rep_ms, "return_mode": "all", "quantiles": list(QUANTILES),
                         "l2_flush": "before every timed call", "triton": version},
                        functools.partial(do_bench_samples, do_bench=do_bench, warmup_ms=warmup_ms, rep_ms=rep_ms))


def quantile(samples: list[float], q: float) -> float:
    """The q-quantile with linear interpolation between order statistics, as torch.quantile (and so do_bench's
    quantiles) computes it."""
    ordered = sorted(samples)
    position = q * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
