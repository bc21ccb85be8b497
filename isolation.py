"""Running one function in a fresh child process, and saying what it does meanwhile: the fork server that starts
children with torch already imported, run_isolated (a value or a failure as data: OOM, error, a death the kernel's
OOM killer caused, a time limit, a peer's failure), and the heartbeat that names a long configuration's phase.

The sweep (sweep.py) runs every configuration through run_isolated; runner.py names its phases with phase() and
timed_phase(). How isolation works and what it costs is written up in docs/running.md.
Nothing here does work at import time or changes global state on import.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import timeit
import traceback
from typing import Any, Callable, Iterator

import torch

from common import failure_status

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
PRELOAD = ["__main__", "torch", "torch._dynamo", "torch.optim", "common", "model", "optim", "isolation", "runner",
           "sweep"]
_preloaded: list[bool] = []
EXIT_PARENT_GONE = 75  # what a child exits with when it finds its parent gone (nobody reads it)
STOP_GRACE_S = 5.0  # after SIGTERM, how long a child has to exit before SIGKILL
STOP_POLL_S = 0.2  # how often run_isolated asks stop_when() while a child runs


def _fork_server(fn: Callable, kwargs: dict[str, Any]) -> multiprocessing.context.BaseContext:
    """The forkserver context, preloaded on first use with PRELOAD (the running script is "__main__") and the
    modules of the first `fn` and of the functions among its arguments. Children are forked from the server, not
    from this process: they inherit no CUDA context, no threads and no locks."""
    ctx = multiprocessing.get_context("forkserver")
    if not _preloaded:
        modules = [getattr(f, "__module__", None) for f in (fn, *kwargs.values()) if callable(f)]
        ctx.set_forkserver_preload(PRELOAD + [m for m in dict.fromkeys(modules) if m])
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
    "traceback" or "detail": ...}, with the "pid" of the process that ran it when it answered. After `timeout_s`
    the child is stopped. KeyboardInterrupt (Ctrl-C, or SIGTERM through the sweep's handler) stops the child and
    propagates. `stop_when()`, asked every STOP_POLL_S while the
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
    ctx = _fork_server(fn, kwargs)
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


