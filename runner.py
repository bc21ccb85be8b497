"""The one run path shared by the experiment scripts: the Transformer-LM workload (bench_e2e and mem_profile),
the measured steps of one configuration (warm-up, peak reset, timed steps, peaks), the child-process runner and
the sweep (child per configuration, failure / OOM / timeout rows, skip after an OOM, progress, signals).

How a sweep runs, and what isolation costs, is written up in docs/running.md.
Nothing here does work at import time or changes global state on import.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import timeit
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn

import cli
import parallel
import user_code
from common import (SyncTimer, annotate, environment, failure_status, peak_memory_bytes, precision_context,
                    reset_peak_memory, resolve_device, summarize)
from model import TransformerLM, cross_entropy
from model_config import DEFAULT_BATCH_SIZE, DEFAULT_HANDOUT, PHASES_BY_MODE, ModelConfig
from optim import AdamW
from parallel import DEFAULT_PG_TIMEOUT_S
from results import ResultFiles, SkipAfterOOM, finished, is_oom_status, progress

# ---- the Transformer-LM workload (bench_e2e times it, mem_profile measures its memory) ----
# (MODES and PHASES_BY_MODE live in model_config.py, torch-free, where the reports read them too)


@dataclass(frozen=True)
class RunConfig:
    size: str  # preset name, or "custom"
    model: ModelConfig  # its context_length is the benchmarked sequence length
    handout: str = DEFAULT_HANDOUT  # whose Table 1 the size name comes from
    batch_size: int = DEFAULT_BATCH_SIZE
    warmup: int = 5
    steps: int = 10
    mode: str = "train"
    no_grad: bool = False  # forward mode only: run under torch.inference_mode()
    dtype: str = "fp32"  # fp32, or bf16/fp16 autocast with fp32 master weights
    compile: bool = False
    attn: str = "naive"
    # ours = optim.AdamW; torch = torch.optim.AdamW (fused on CUDA, foreach on CPU); yours = MODULE:CLASS
    optimizer: str = "ours"  # (build_optimizer)
    model_factory: str | None = None  # your model as MODULE:CALLABLE (build_model); None = ours, model.TransformerLM
    flops: str = "formula"  # bench_e2e's FLOPs: formula (our architecture), counted (FlopCounterMode) or none
    tf32: bool | None = None  # None = leave PyTorch's default
    device: str = "auto"
    seed: int = 0
    nvtx: bool = False
    checkpoint_every: int = 0
    profile_results_dir: str | None = None  # --profile: torch.profiler trace under <this>/profile/; None = off
    # --parallel (torchrun): each rank runs this configuration on its own batch of batch_size sequences
    parallel: str | None = None  # None = one process; "ddp" or "fsdp" (parallel.shard_model)
    world_size: int = 1  # ranks of the torchrun launch
    fsdp_mixed_precision: str = "off"  # fsdp: "bf16" = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
    reshard_after_forward: bool = True  # fsdp: blocks free their gathered parameters after forward
    pg_timeout_s: float = DEFAULT_PG_TIMEOUT_S  # a collective waiting longer for a peer fails

    @property
    def context_length(self) -> int:
        return self.model.context_length

    def label(self) -> str:
        """The configuration as progress lines, snapshot titles and file names name it; settings at their
        default (no checkpointing, our AdamW, eager) are left out."""
        parts = [self.size, f"ctx={self.context_length}", self.mode + (" no-grad" if self.no_grad else ""),
                 self.dtype, self.model_factory or self.attn, f"warmup={self.warmup}"]
        if self.checkpoint_every:
            parts.append(f"ckpt={self.checkpoint_every}")
        if self.optimizer != "ours":
            parts.append(f"optimizer={self.optimizer}")
        if self.parallel:
            parts.append(f"{self.parallel} x{self.world_size}")
        if self.parallel == "fsdp" and self.fsdp_mixed_precision != "off":
            parts.append(f"{self.fsdp_mixed_precision}-params")
        if self.parallel == "fsdp" and not self.reshard_after_forward:
            parts.append("no-reshard")
        return " ".join(parts + (["compiled"] if self.compile else []))

    def skip_key(self) -> tuple[tuple, str, int]:
        """(group, size name, size) for the sweep's rule: after an OOM, the larger contexts of the same model and
        settings are skipped (they need more memory still)."""
        m = self.model
        group = (self.size, m.d_model, m.d_ff, m.num_layers, m.num_heads, m.vocab_size, self.batch_size, self.mode,
                 self.dtype, self.attn, self.checkpoint_every, self.optimizer, self.compile, self.parallel,
                 self.world_size, self.fsdp_mixed_precision, self.reshard_after_forward, self.model_factory)
        return group, "ctx", self.context_length


# The staff model's constructor keywords (cs336_basics.model.BasicsTransformerLM), each a ModelConfig field: what
# --model MODULE:CALLABLE is called with.
STAFF_MODEL_KEYWORDS = ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta")


def build_model(cfg: ModelConfig, attn: str = "naive", checkpoint_every: int = 0,
                factory: str | None = None) -> nn.Module:
    """Ours (model.TransformerLM, with its attention and checkpointing), or yours: `factory` (MODULE:CALLABLE)
    called with the staff constructor's keywords, so cs336_basics.model:BasicsTransformerLM works unchanged. Built
    on the current default device (Workload: the run's; mem_profile: meta). A factory that cannot take those
    keywords, or returns something that is not an nn.Module, is a LoadError (one line, the row's status)."""
    if factory is None:
        return TransformerLM(cfg, attn=attn, checkpoint_every=checkpoint_every)
    make = user_code.load(factory)
    keywords = {name: getattr(cfg, name) for name in STAFF_MODEL_KEYWORDS}
    try:
        inspect.signature(make).bind(**keywords)
    except TypeError as exc:
        raise user_code.LoadError(f"{factory} cannot be called with the staff model's keywords "
                                  f"({', '.join(STAFF_MODEL_KEYWORDS)}): {exc}") from None
    except ValueError:  # no signature to read (a builtin): let the call say
        pass
    model = make(**keywords)
    if not isinstance(model, nn.Module):
        raise user_code.LoadError(f"{factory} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def check_logits(logits: Any, run: RunConfig) -> None:
    """Your model must map token ids (batch, seq) to logits (batch, seq, vocab): the loss and every figure assume
    it. A ValueError naming the model otherwise (checked once, on the first forward)."""
    expected = (run.batch_size, run.context_length, run.model.vocab_size)
    if isinstance(logits, torch.Tensor) and tuple(logits.shape) == expected and logits.is_floating_point():
        return
    got = f"{tuple(logits.shape)} {logits.dtype}" if isinstance(logits, torch.Tensor) else f"a {type(logits).__name__}"
    raise ValueError(f"{run.model_factory or 'the model'} returned {got} for token ids {expected[:2]}; expected "
                     f"floating-point logits (batch, seq, vocab) = {expected}")


USER_OPTIMIZER_LR = 1e-3  # what ours and torch's AdamW default to: the step's cost does not depend on it


def build_optimizer(name: str, params: Any, device: torch.device) -> torch.optim.Optimizer:
    """ours = optim.AdamW; torch = torch.optim.AdamW (fused on CUDA, foreach on CPU); else yours, MODULE:CLASS,
    constructed as CLASS(params, lr=1e-3) (or CLASS(params) when it takes no lr)."""
    if name == "ours":
        return AdamW(params)
    if name == "torch":
        return (torch.optim.AdamW(params, fused=True) if device.type == "cuda"
                else torch.optim.AdamW(params, foreach=True))
    make = user_code.load(name)
    try:
        takes_lr = "lr" in inspect.signature(make).parameters
    except (TypeError, ValueError):
        takes_lr = True
    optimizer = make(params, lr=USER_OPTIMIZER_LR) if takes_lr else make(params)
    if not (callable(getattr(optimizer, "step", None)) and callable(getattr(optimizer, "zero_grad", None))):
        raise user_code.LoadError(f"{name} made a {type(optimizer).__name__}, which has no step() and zero_grad()")
    return optimizer


class Workload:
    """Model, optimizer, one random batch and the three phases of a training step, set up on a device.

    forward() is the model call plus the loss; backward() is loss.backward() (through the gradient scaler for
    fp16); optimizer_step() is step() plus zero_grad(set_to_none=True).

    With run.parallel, this process is one rank of a process group already joined (parallel.configuration_group):
    the device is the GPU of its local rank, the model (the same initial weights on every rank) is wrapped in DDP
    or sharded with FSDP2, and the batch is this rank's own, so the global batch is world_size x batch_size."""

    def __init__(self, run: RunConfig):
        phase("building the model")
        self.run = run
        launch = parallel.torchrun_launch() if run.parallel else None
        self.device = parallel.rank_device(resolve_device(run.device), launch)
        if run.tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = run.tf32
            torch.backends.cudnn.allow_tf32 = run.tf32
        torch.manual_seed(run.seed)
        with self.device:  # initialise directly on the device: CPU init of a 2.7B model takes minutes
            self.model = build_model(run.model, run.attn, run.checkpoint_every, run.model_factory)
        wrapped = self.model
        if run.parallel:
            wrapped = parallel.shard_model(self.model, run.parallel, self.device, run.fsdp_mixed_precision,
                                           run.reshard_after_forward)
            torch.manual_seed(run.seed + 1 + launch.rank)  # each rank its own batch
        self.callable_model = torch.compile(wrapped) if run.compile else wrapped
        self.tokens = torch.randint(0, run.model.vocab_size, (run.batch_size, run.context_length), device=self.device)
        self.targets = torch.randint(0, run.model.vocab_size, (run.batch_size, run.context_length), device=self.device)
        self.optimizer = (build_optimizer(run.optimizer, self.model.parameters(), self.device)
                          if run.mode == "train" else None)
        self.logits_checked = run.model_factory is None  # ours is known to be right; yours is checked once
        # fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range and needs none
        self.scaler = torch.amp.GradScaler(self.device.type) if run.dtype == "fp16" and run.mode != "forward" else None

    def forward(self, eager: bool = False) -> torch.Tensor:
        """The loss of the batch; `eager`: through the model itself, not torch.compile's or DDP's wrapper."""
        grad_mode = torch.inference_mode() if self.run.no_grad else torch.enable_grad()
        with grad_mode, precision_context(self.device, self.run.dtype):
            logits = (self.model if eager else self.callable_model)(self.tokens)
            if not self.logits_checked:  # a shape and a dtype, no synchronisation
                check_logits(logits, self.run)
                self.logits_checked = True
            return cross_entropy(logits, self.targets)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def optimizer_step(self) -> None:
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def zero_grad(self) -> None:
        """Between forward-backward steps, drop the gradients (untimed) so each step starts alike."""
        self.model.zero_grad(set_to_none=True)


def run_step(work: Workload, on_phase: Callable[[str], None] | None = None) -> dict[str, float]:
    """One step of work.run.mode with a device synchronisation at every phase boundary. Returns seconds per
    phase and for the whole step. `on_phase(name)` is called (outside the timers) before each phase and with
    "end" after the last; mem_profile uses it to mark phases in a memory timeline."""
    device = work.device
    times: dict[str, float] = {}
    phases = PHASES_BY_MODE[work.run.mode]
    with SyncTimer(device) as step_timer:
        for phase in phases:
            if on_phase:
                on_phase(phase)
            with annotate(phase), SyncTimer(device) as timer:
                if phase == "forward":
                    loss = work.forward()
                elif phase == "backward":
                    work.backward(loss)
                else:
                    work.optimizer_step()
            times[phase] = timer.elapsed_s
        if on_phase:
            on_phase("end")
    times["step"] = step_timer.elapsed_s
    if work.run.mode == "forward-backward":
        work.zero_grad()
    return times


# The part of bench_e2e's record that kernel_tables reads back (its table 1 and the FLOPs of its table 4).


# ---- one configuration: the measured steps ----


def measure_steps(step: Callable[[], dict[str, float]], device: torch.device, warmup: int, steps: int,
                  compile_first: bool = False,
                  profiler: contextlib.AbstractContextManager = contextlib.nullcontext()) -> dict[str, Any]:
    """The measurement every script makes of a configuration whose workload is built: (when compiling) the first
    step timed apart as compile_s, `warmup` untimed steps, the peak counter reset, `steps` timed steps (each
    returns seconds per phase), the peaks read. Returns the record: raw samples as `<phase>_ms` lists, the
    environment, and on CUDA peak allocated / reserved bytes. `profiler` is entered around the timed steps."""
    record: dict[str, Any] = {"environment": environment(device)}
    if compile_first:  # the first call compiles (forward, and backward on the first backward)
        phase("compiling (first step)")
        _, record["compile_s"] = SyncTimer(device).time(step)
    with annotate("warmup"):
        for i in range(warmup):
            phase(f"warm-up {i + 1}/{warmup}")
            step()
    reset_peak_memory(device)
    samples: list[dict[str, float]] = []
    with profiler, annotate("measure"):
        for i in range(steps):
            with timed_phase(f"step {i + 1}/{steps}"):  # no heartbeat runs inside: see Heartbeat
                samples.append(step())
    phase("after the timed steps")
    record.update(peak_memory_bytes(device))
    for key in samples[0]:
        record[f"{key}_ms"] = [s[key] * 1e3 for s in samples]
    return record


def sample_stats(record: dict[str, Any], phases: tuple[str, ...]) -> dict[str, Any]:
    """`<phase>_ms_<stat>` (mean, std, median, min, max, cv, n) of each phase's raw samples in a record."""
    return {f"{phase}_ms_{stat}": value for phase in phases for stat, value in summarize(record[f"{phase}_ms"]).items()}


ONE_SAMPLE_NOTE = "1 timed step: no std"


# ---- progress while a configuration runs ----

HEARTBEAT_S = 10.0  # at most one heartbeat line per this many seconds (read when a configuration starts)


class Heartbeat:
    """Says what a long configuration is doing, so that a two-minute compile or a slow step never looks like a
    hang: a daemon thread writes `<phase>... <s> s` (seconds since the configuration started) whenever
    `interval_s` have passed since its last line.

    The measured code only sets the phase, between timed spans: phase() before an untimed stretch (building the
    model, compiling, a warm-up step), timed() around each timed step. The thread never runs while a timed step
    is open: timed() lets the step start only once the thread is parked on the condition with no timeout, and the
    thread is woken only after the step, and only when a line is due; a line that falls due during a timed step
    is written between it and the next. The compile step (compile_s, reported to 0.1 s) is not held back: a
    heartbeat there is the point."""

    def __init__(self, write: Callable[[str], None], interval_s: float = HEARTBEAT_S):
        self._write = write
        self.interval_s = interval_s
        self._cond = threading.Condition()
        self._phase = "setting up"
        self._timed = False  # a timed step is about to start or running
        self._parked = False  # the thread waits, without a timeout, for the timed step to end
        self._stopped = False
        self._start = self._last = timeit.default_timer()
        self._thread = threading.Thread(target=self._run, daemon=True, name="heartbeat")

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=5.0)

    def _due(self, now: float) -> bool:
        return now - self._last >= self.interval_s

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                now = timeit.default_timer()
                if self._due(now):  # safe even when _timed: the step waits for this thread to park
                    self._last = now
                    try:
                        self._write(f"{self._phase}... {now - self._start:.0f} s")
                    except (OSError, ValueError):  # nobody to tell (the parent is gone): stop quietly
                        self._stopped = True
                        self._cond.notify_all()
                        return
                if self._timed:
                    self._parked = True
                    self._cond.notify_all()
                    self._cond.wait()  # no timeout: woken by the end of the step (a line due), phase(), stop()
                    self._parked = False
                else:
                    self._cond.wait(max(0.0, self._last + self.interval_s - timeit.default_timer()))

    def _wake(self) -> None:
        """Unpark the thread (the lock held). It counts as unparked from now on, though it runs only once the lock
        is free: a timed step that starts next must wait for it to park again."""
        if self._parked:
            self._parked = False
            self._cond.notify_all()

    def phase(self, name: str) -> None:
        """An untimed stretch starts: the thread may write during it."""
        with self._cond:
            self._phase, self._timed = name, False
            self._wake()

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """A timed step: it starts once the thread is parked; afterwards the thread is woken if a line is due."""
        with self._cond:
            self._phase, self._timed = name, True
            if self._thread.is_alive() and not self._parked:
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._parked or self._stopped)
        try:
            yield
        finally:
            with self._cond:
                self._timed = False
                if self._due(timeit.default_timer()):
                    self._wake()


_heartbeat: list[Heartbeat] = []  # the heartbeat of the configuration running in this process, if any


def phase(name: str) -> None:
    """Name what this configuration does now (untimed code only); a no-op without a heartbeat."""
    if _heartbeat:
        _heartbeat[-1].phase(name)


def timed_phase(name: str) -> contextlib.AbstractContextManager:
    """Around one timed step: the heartbeat stays silent inside (Heartbeat.timed)."""
    return _heartbeat[-1].timed(name) if _heartbeat else contextlib.nullcontext()


@contextlib.contextmanager
def heartbeat(write: Callable[[str], None] | None, interval_s: float = HEARTBEAT_S) -> Iterator[None]:
    """A Heartbeat writing to `write` while the block runs (none when `write` is None)."""
    if write is None:
        yield
        return
    beat = Heartbeat(write, interval_s).start()
    _heartbeat.append(beat)
    try:
        yield
    finally:
        _heartbeat.remove(beat)
        beat.stop()


# ---- child processes ----

# Modules the fork server imports once, so that a child starts with torch and the project loaded (~0.1 s instead
# of a fresh interpreter's import of torch, 6-9 s). torch._dynamo is imported lazily by the first optimizer built
# (torch.optim.Optimizer.__init__), 3-5 s on this CPU: preloaded too. None of them touches CUDA at import (the
# server must not: a CUDA driver initialised before fork() is unusable in the children); test_runner checks.
PRELOAD = ["__main__", "torch", "torch._dynamo", "torch.optim", "common", "model", "optim", "runner"]
_preloaded: list[bool] = []
EXIT_PARENT_GONE = 75  # what a child exits with when it finds its parent gone (nobody reads it)
STOP_GRACE_S = 5.0  # after SIGTERM, how long a child has to exit before SIGKILL
STOP_POLL_S = 0.2  # how often run_isolated asks stop_when() while a child runs


def _fork_server(fn: Callable) -> multiprocessing.context.BaseContext:
    """The forkserver context, preloaded on first use with the project and the module of `fn`. Children are
    forked from the server, not from this process: they inherit no CUDA context, no threads and no locks."""
    ctx = multiprocessing.get_context("forkserver")
    if not _preloaded:
        ctx.set_forkserver_preload(PRELOAD + [fn.__module__])
        _preloaded.append(True)
    return ctx


def _watch_parent(lifeline: multiprocessing.connection.Connection) -> None:
    """Exit at once, quietly, when the parent is gone: only the parent holds the other end of `lifeline`, so a
    read returns EOF exactly when it dies (a forkserver child's OS parent is the server, not the sweep)."""
    def wait() -> None:
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv()
        os._exit(EXIT_PARENT_GONE)

    threading.Thread(target=wait, daemon=True, name="parent-watch").start()


def _child_main(result: Any, lifeline: Any, fn: Callable[..., dict], kwargs: dict[str, Any],
                environ: dict[str, str], cwd: str, beats: Any = None, interval_s: float = HEARTBEAT_S) -> None:
    # Ctrl-C reaches the whole process group; stopping the child is the parent's job (no half-printed traceback).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_parent(lifeline)
    # The server was started earlier: take the parent's environment (BENCH_INJECT_FAULT, ...) and folder as now.
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    try:
        # heartbeat lines go to the parent, which prints them: this process's stderr is the fork server's
        with heartbeat(beats.send if beats is not None else None, interval_s):
            answer = {"ok": True, "value": fn(**kwargs)}
    except BaseException as exc:  # noqa: BLE001 - a failure is data, sent back to the parent
        answer = {"ok": False, "status": failure_status(exc), "traceback": traceback.format_exc()}
    answer["pid"] = os.getpid()  # which process ran it: to match a row with nsys, top or the kernel's OOM log
    try:
        result.send(answer)
        result.close()
    except OSError:  # the parent died meanwhile: nobody to tell
        os._exit(EXIT_PARENT_GONE)


def oom_kill_counts() -> tuple[int | None, int | None]:
    """The kernel's OOM-kill counters: system-wide (/proc/vmstat oom_kill, Linux >= 4.13) and this process's
    cgroup v2 (memory.events oom_kill, which also counts kills under a container's memory limit). None where
    unreadable."""
    def read(path: str, key: str) -> int | None:
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value)
        except (OSError, ValueError):
            pass
        return None

    cgroup = None
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    cgroup = f"/sys/fs/cgroup{line[3:].strip()}/memory.events"
    except OSError:
        pass
    return read("/proc/vmstat", "oom_kill"), read(cgroup, "oom_kill") if cgroup else None


def died_status(exitcode: int | None, oom_before: tuple, oom_after: tuple) -> dict[str, Any]:
    """The row of a child that died without answering. Killed by SIGKILL while an OOM-kill counter rose: the
    kernel's OOM killer, an OOM like any other (later contexts are skipped); else an error with the exit code."""
    rose = any(a is not None and b is not None and a > b for a, b in zip(oom_after, oom_before))
    if exitcode == -signal.SIGKILL and rose:
        return {"ok": False, "status": "OOM",
                "detail": "killed by the kernel's OOM killer (exit -9 while its oom_kill counter rose)"}
    return {"ok": False, "status": f"error: child process died with exit code {exitcode}"}


def _stop(proc: multiprocessing.process.BaseProcess) -> None:
    """SIGTERM, then SIGKILL after a grace period: never wait forever on a hung child."""
    proc.terminate()
    proc.join(STOP_GRACE_S)
    if proc.is_alive():
        proc.kill()
        proc.join()


def run_isolated(fn: Callable[..., dict], kwargs: dict[str, Any], in_process: bool = False,
                 timeout_s: float | None = None, stop_when: Callable[[], str | None] | None = None,
                 on_heartbeat: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run `fn(**kwargs)` (a module-level function returning a picklable dict) in a fresh child process forked
    from a preloaded fork server, so an OOM or a broken CUDA context cannot poison later work and every run starts
    with a fresh allocator.

    Returns {"ok": True, "value": ...} or {"ok": False, "status": "OOM" | "error: ..." | "timeout after N s",
    "traceback" or "detail": ...}, with the "pid" of the process that ran it when it answered. After `timeout_s` the child is stopped. KeyboardInterrupt (Ctrl-C, or SIGTERM
    through the sweep's handler) stops the child and propagates. `stop_when()`, asked every STOP_POLL_S while the
    child runs, stops it early with the reason it returns as the status (a torchrun peer that failed: see
    parallel.py). `in_process=True` calls `fn` here (no isolation, no time limit) with the same failure handling.
    `on_heartbeat(line)` gets the Heartbeat's lines while `fn` runs (in this process: from the child through a
    pipe, or from the heartbeat thread with in_process); None = no heartbeat."""
    interval_s = HEARTBEAT_S
    if in_process:
        try:
            with heartbeat(on_heartbeat, interval_s):
                return {"ok": True, "value": fn(**kwargs), "pid": os.getpid()}
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            return {"ok": False, "status": failure_status(exc), "traceback": traceback.format_exc(),
                    "pid": os.getpid()}
    ctx = _fork_server(fn)
    result_r, result_w = ctx.Pipe(duplex=False)
    lifeline_r, lifeline_w = ctx.Pipe(duplex=False)
    beats_r, beats_w = ctx.Pipe(duplex=False) if on_heartbeat is not None else (None, None)
    proc = ctx.Process(target=_child_main, daemon=True,
                       args=(result_w, lifeline_r, fn, kwargs, dict(os.environ), os.getcwd(), beats_w, interval_s))
    oom_before = oom_kill_counts()
    try:
        proc.start()
        result_w.close()
        lifeline_r.close()
        waiting = [result_r, proc.sentinel]
        if beats_w is not None:
            beats_w.close()
            waiting.append(beats_r)
        deadline = None if timeout_s is None else timeit.default_timer() + timeout_s
        while True:
            wait_s = None if deadline is None else max(0.0, deadline - timeit.default_timer())
            if stop_when is not None:
                wait_s = STOP_POLL_S if wait_s is None else min(wait_s, STOP_POLL_S)
            ready = multiprocessing.connection.wait(waiting, wait_s)
            if beats_r in ready:  # a heartbeat line: print it and wait on
                ready.remove(beats_r)
                try:
                    on_heartbeat(beats_r.recv())
                except (EOFError, OSError):  # the child closed its end (it is finishing)
                    waiting.remove(beats_r)
                if not ready and (deadline is None or timeit.default_timer() < deadline):
                    continue
            if ready or (deadline is not None and timeit.default_timer() >= deadline):
                break
            reason = stop_when() if stop_when is not None else None
            if reason:
                _stop(proc)
                return {"ok": False, "status": reason}
        if result_r in ready or result_r.poll():
            try:
                answer = result_r.recv()
            except EOFError:  # died while answering
                proc.join()
                answer = died_status(proc.exitcode, oom_before, oom_kill_counts())
        elif ready:  # the child died without answering (segfault, the OOM killer, os._exit, ...)
            proc.join()
            answer = died_status(proc.exitcode, oom_before, oom_kill_counts())
        else:
            _stop(proc)
            return {"ok": False, "status": f"timeout after {timeout_s:g} s"}
        proc.join(STOP_GRACE_S)
        if proc.is_alive():  # answered but will not exit (a stuck teardown): the answer stands
            _stop(proc)
        return answer
    except KeyboardInterrupt:
        if proc.pid is not None:
            _stop(proc)
        raise
    finally:
        lifeline_w.close()
        result_r.close()
        if beats_r is not None:
            beats_r.close()


# ---- the sweep ----


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the sweep is so that it stops like Ctrl-C does (child stopped, rows kept)."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler's time limit, `timeout`, plain `kill`) raises Terminated while the sweep runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# The default time limit of one configuration: generous, and scaled by the sweep's own timings.
TIMEOUT_FLOOR_S = 15 * 60
TIMEOUT_FACTOR = 10


def time_limit(timeout_s: float | None, slowest_s: float) -> float | None:
    """--timeout: a given number of seconds (0 = none), or by default the larger of 15 minutes and 10x the slowest
    configuration finished so far. A sweep that doubles the sequence length multiplies a quadratic cost by 4 per
    step; 10x leaves 2.5x on top of that for noise, a cold cache or a busy machine."""
    if timeout_s is not None:
        return timeout_s or None
    return max(TIMEOUT_FLOOR_S, TIMEOUT_FACTOR * slowest_s)


def add_sweep_args(parser: argparse.ArgumentParser) -> None:
    """--in-process, --timeout and --no-skip, the same in every script that sweeps configurations."""
    parser.add_argument("--in-process", action="store_true",
                        help="run every configuration in this process instead of a fresh child process each "
                             "(no isolation and no --timeout; see docs/running.md)")
    parser.add_argument("--timeout", type=cli.non_negative_float, default=None, metavar="SECONDS",
                        help="time limit of one configuration, after which its child is killed and the row says "
                             f"'timeout after N s'; 0 = none (default: the larger of {TIMEOUT_FLOOR_S // 60} min "
                             f"and {TIMEOUT_FACTOR}x the slowest configuration so far: see docs/running.md)")
    parser.add_argument("--no-skip", action="store_true",
                        help="after an OOM, still run the larger sizes (context / sequence lengths) of that group")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress on stderr: neither the start and end line of each configuration nor the "
                             f"heartbeat (its phase, at most every {HEARTBEAT_S:g} s) during a long one")


@dataclass(frozen=True)
class Experiment:
    """What a script tells the sweep about itself."""

    name: str  # the script's stem: every record's "experiment"
    measure: Callable[..., dict]  # module-level; measure(run=config) in the child: the configuration's own fields
    finish: Callable[[Any, dict], None]  # in this process, on every record: derived figures, predictions, status
    summary: Callable[[dict], str]  # the end-of-configuration progress line of a finished ("ok") row
    render: Callable[[list[dict], str], str]  # (rows so far, table format) -> the report, rewritten after each row


def sweep_environment(device: torch.device, in_process: bool) -> dict[str, Any]:
    """The environment for rows that carry none of their own (failed, skipped, timed out), read in a child like
    the configurations (this process never touches CUDA)."""
    answer = run_isolated(environment, {"device": device}, in_process=in_process, timeout_s=TIMEOUT_FLOOR_S)
    return answer["value"] if answer["ok"] else {"device": str(device), "status": answer["status"]}


def run_on_every_rank(experiment: Experiment, run: Any, index: int, ranks: parallel.RankSweep,
                      timeout_s: float | None, on_heartbeat: Callable[[str], None] | None = None) -> dict[str, Any]:
    """One configuration of a torchrun sweep: this rank's child joins the configuration's process group and
    measures; it is stopped as soon as another rank fails; then every rank's answer is read and one agreed
    answer made (the slowest rank's timings, or "OOM on rank k"), the same on every rank."""
    kwargs = {"measure": experiment.measure, "run": run, "prefix": ranks.configuration_prefix(index),
              "device": run.device, "timeout_s": run.pg_timeout_s}
    answer = run_isolated(parallel.measure_on_rank, kwargs, timeout_s=timeout_s, stop_when=ranks.peer_failure(index),
                          on_heartbeat=on_heartbeat)
    # the others may run up to their own time limit before they answer; without one, up to a day
    answers = ranks.exchange(index, answer, (timeout_s or 24 * 3600) + 2 * run.pg_timeout_s)
    return parallel.agreed_answer(answers, parallel.merge_rank_records)


def run_sweep(experiment: Experiment, runs: list[Any], files: ResultFiles | None, device: torch.device,
              args: argparse.Namespace, search: bool = False) -> tuple[list[dict], int]:
    """Run every configuration (each with label() and skip_key()) as add_sweep_args' flags say, appending its
    record and rewriting the .md as each finishes. Returns (records, exit status: 0, 130 after Ctrl-C, 143 after
    SIGTERM). An interrupted sweep keeps the rows it finished.

    search=True: each skip group's runs are the probes of a search, in increasing size (bench_e2e's
    --context-length max). The group's first failure of any kind (OOM, error, timeout) ends its search: its later
    probes are dropped, not run and not recorded, and the progress count shrinks by as many.

    Under torchrun (configurations with .parallel set), every rank runs this same sweep, each configuration on
    every rank at once (run_on_every_rank); all ranks get the same records, and only rank 0 (files given, None on
    the others) prints progress and writes files. --quiet: no progress lines and no heartbeat."""
    records: list[dict[str, Any]] = []
    skip = SkipAfterOOM(enabled=not args.no_skip)
    ended: set[tuple] = set()  # search=True: the groups whose search has ended
    slowest_s = 0.0
    total, done = len(runs), 0
    launch = parallel.torchrun_launch() if any(getattr(run, "parallel", None) for run in runs) else None
    ranks = parallel.RankSweep(launch) if launch else None
    rank_zero = parallel.is_rank_zero()
    say = progress if rank_zero and not args.quiet else (lambda message: None)
    with sigterm_as_interrupt():
        try:
            env = sweep_environment(device, args.in_process)
            for i, run in enumerate(runs, 1):  # i: the configuration's index, the same on every torchrun rank
                group, size_name, size = run.skip_key()
                if group in ended:
                    continue
                done += 1
                label = run.label()
                say(f"[{done}/{total}] starting {label}")
                beat = None if args.quiet or not rank_zero else (
                    lambda line, prefix=f"[{done}/{total}]": say(f"{prefix} {line}"))
                record: dict[str, Any] = {"experiment": experiment.name, "config": dataclasses.asdict(run),
                                          "label": label}
                start = timeit.default_timer()
                if reason := skip.reason(group, size_name, size):
                    record["status"] = reason
                elif ranks is not None:
                    answer = run_on_every_rank(experiment, run, i, ranks, time_limit(args.timeout, slowest_s), beat)
                else:
                    answer = run_isolated(experiment.measure, {"run": run}, in_process=args.in_process,
                                          timeout_s=time_limit(args.timeout, slowest_s), on_heartbeat=beat)
                if "status" not in record:
                    if answer["ok"]:
                        record.update(answer["value"])
                        record.setdefault("status", "ok")
                        if "pid" in answer:
                            record["pid"] = answer["pid"]
                    else:
                        record.update({k: v for k, v in answer.items() if k != "ok"})
                elapsed = timeit.default_timer() - start
                skip.record(group, size, record["status"])
                if not is_oom_status(record["status"]) and not record["status"].startswith(("skipped", "timeout")):
                    slowest_s = max(slowest_s, elapsed)
                if search and not finished(record):  # the search of this group has its answer
                    ended.add(group)
                    total -= sum(1 for later in runs[i:] if later.skip_key()[0] == group)
                record.setdefault("environment", env)
                experiment.finish(run, record)
                records.append(record)
                if files is not None:
                    files.append_record(record)
                    files.write_report(lambda fmt: experiment.render(records, fmt), args.fmt)
                said = experiment.summary(record) if finished(record) else record["status"]
                say(f"[{done}/{total}] {label}: {said} ({elapsed:.1f} s)")
            if ranks is not None:
                ranks.finish()
        except KeyboardInterrupt as exc:
            how, code = ("SIGTERM", 128 + signal.SIGTERM) if isinstance(exc, Terminated) else ("Ctrl-C", 130)
            kept = f"; finished rows are in {files.markdown} and {files.jsonl}" if records and files else ""
            if rank_zero:  # said even under --quiet: where the finished rows are
                progress(f"interrupted by {how} after {len(records)} of {total} configurations{kept}")
            return records, code
    return records, 0
