"""Each configuration in a fresh child process: an OOM, a crash or a poisoned CUDA context is a row, never the
next row's problem; SIGTERM and Ctrl-C keep the finished rows; variants interleave A B | B A (docs/running.md).
And what a configuration of the training step is (RunConfig), what it builds (Workload: model, optimizer, batch),
and its steps timed phase by phase (run_step, measure_steps), as bench_e2e, leaderboard and mem_profile run them.

    plan = runner.comparisons(runs, RunConfig.comparison_key)  # the variants of one comparison as one list
    records, code = runner.run_configurations(measure, plan, files, args, name="bench_e2e", device=device,
                                              finish=finish_record, render=live, measure_variants=together)

And nsys_run.sh's sweep, which `bash nsys_run.sh ARGS` runs as `python3 runner.py ARGS`: bench_e2e.py under
`nsys profile` per configuration, kernel_tables' tables of each report beside it, a summary across them.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import glob
import itertools
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import timeit
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import torch

import common
import parallel
import results
from common import (CEILINGS_ENV, CEILINGS_FILE, DTYPES, SyncTimer, annotate, environment, failure_status,
                    machine_ceiling, machine_load, matmul_precision_key, peak_memory_bytes, peak_tflops,
                    precision_context, quiet_profiler, reset_peak_memory,
                    resolve_device, set_ranges)
from kernel_tables import (INSTALL_HINT, ProfileFormatError, find_nsys, last_e2e_record, profile_header, profiled,
                           render_summary, render_tables)
from model import build_model, build_optimizer, check_logits, cross_entropy
from parallel import DEFAULT_PG_TIMEOUT_S
from results import (DEFAULT_BATCH_SIZE, DEFAULT_HANDOUT, FINISHED, PHASES_BY_MODE, ModelConfig, ResultFiles,
                     finished, is_oom_status, parallel_label, progress, round_order, summarize)

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- child processes ----

# Imported once by the fork server, so a child starts in ~0.1 s (a fresh interpreter: 6-9 s, and 3-5 s more
# for torch._dynamo). None touches CUDA at import: a driver initialised before fork() is unusable in children.
PRELOAD = ["__main__", "torch", "torch._dynamo", "torch.optim", "common", "model", "optim", "runner"]
HEARTBEAT_S = 10.0  # at most one heartbeat line per this many seconds
EXIT_PARENT_GONE = 75  # what a child exits with when its parent is gone (nobody reads it)
STOP_GRACE_S = 5.0  # after SIGTERM, how long a child has to exit before SIGKILL
STOP_POLL_S = 0.2  # how often the parent looks at a running child's time limit, stop_when() and heartbeat
_server: list[Any] = []  # the forkserver context, once started


def _os_threads() -> int | None:
    with contextlib.suppress(OSError):
        return len(os.listdir("/proc/self/task"))
    return None


_THREADS_AT_IMPORT = _os_threads()


def _fork_server(fn: Callable, kwargs: dict[str, Any]) -> Any:
    """The forkserver context, started on first use with PRELOAD and the modules of `fn` and its arguments:
    children fork from it, with no CUDA context, threads or locks of this process. Its `python -c` would put
    the working directory first on its path: it starts with PYTHONSAFEPATH, and this folder on PYTHONPATH.
    When one of our scripts is the program and no thread has started since its imports (so no OpenMP pool,
    whose state a fork would break, and no CUDA), the server is this process forked instead: the same server,
    without importing torch a second time (seconds of every run)."""
    if not _server:
        ctx = multiprocessing.get_context("forkserver")
        modules = [getattr(f, "func", f).__module__ for f in (fn, *kwargs.values()) if callable(f)]
        preload = list(dict.fromkeys(PRELOAD + modules))
        ctx.set_forkserver_preload(preload)
        program, threads = os.path.abspath(getattr(sys.modules["__main__"], "__file__", None) or ""), _os_threads()
        fork = (os.path.dirname(program) == HERE and threading.active_count() == 1 and threads is not None
                and threads == _THREADS_AT_IMPORT and not torch.cuda.is_initialized())
        saved = dict(os.environ)
        paths = [HERE, saved["PYTHONPATH"]] if saved.get("PYTHONPATH") else [HERE]
        os.environ.update(PYTHONSAFEPATH="1", PYTHONPATH=os.pathsep.join(paths))
        # Ctrl-C reaches the whole process group, but only the parent acts on it (it stops the children): the
        # server starts with SIGINT ignored, which exec and fork keep, so no traceback mid-import or mid-fork
        try:
            with results.handling_signal(signal.SIGINT, signal.SIG_IGN), contextlib.ExitStack() as stack:
                if fork:  # the resource tracker, which the server starts with the same call, started apart
                    multiprocessing.resource_tracker.ensure_running()
                    stack.enter_context(mock.patch.object(multiprocessing.util, "spawnv_passfds",
                                                          functools.partial(_forked_server, preload)))
                multiprocessing.forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _server.append(ctx)
    return _server[0]


def _forked_server(preload: list[str], path: str, args: list[str], passfds: list[int]) -> int:
    """multiprocessing's `spawnv_passfds(path, args, passfds)` for its fork server, forking this process instead
    of starting `path`: the child runs the same server loop, multiprocessing.forkserver.main."""
    sys.stdout.flush()  # a child's exit flushes what its copy of the buffers holds: printed once, here
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    try:
        listener, alive_r = passfds
        alive = os.fstat(alive_r)
        for fd in map(int, os.listdir("/proc/self/fd")):  # the alive pipe's other end: our exit at its EOF
            with contextlib.suppress(OSError):
                if fd != alive_r and (os.fstat(fd).st_ino, os.fstat(fd).st_dev) == (alive.st_ino, alive.st_dev):
                    os.close(fd)
        for signum in results.STOP_SIGNALS:  # as a new process has them, not as this one's run handles them
            signal.signal(signum, signal.SIG_DFL)
        multiprocessing.forkserver.main(listener, alive_r, preload)
    finally:
        os._exit(0)


def _child_main(result: Any, lifeline: Any, fn: Callable, kwargs: dict[str, Any], environ: dict[str, str],
                cwd: str, path: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us (the server's children ignore it too)

    def watch_parent() -> None:
        """Exit once the parent is gone, even killed with -9: only it holds the other end of `lifeline`.
        (Not PR_SET_PDEATHSIG: our OS parent is the fork server, which outlives the parent.)"""
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv()
        os._exit(EXIT_PARENT_GONE)

    threading.Thread(target=watch_parent, daemon=True, name="parent-watch").start()
    os.environ.clear()  # the server started earlier: the parent's environment, folder and path as of now
    os.environ.update(environ)
    os.chdir(cwd)
    # this folder first, never the working directory, where a student's optim.py would replace ours: their
    # code is imported from there only where a flag names it (common.load)
    sys.path[:] = [HERE] + [p for p in path if os.path.abspath(p or ".") not in (HERE, cwd)]
    _tell.append(result.send)  # phase() names go to the parent before the answer
    try:
        answer = {"ok": True, "value": fn(**kwargs)}
    except BaseException as exc:  # noqa: BLE001 - a failure is data (sys.exit in a student's code too)
        answer = {"ok": False, "status": failure_status(exc), "traceback": traceback.format_exc()}
    answer["pid"] = os.getpid()  # to match a row with nsys, top or the kernel's OOM log
    try:
        result.send(answer)
        result.close()
    except OSError:  # the parent died meanwhile
        os._exit(EXIT_PARENT_GONE)


def oom_kill_counts() -> tuple[int | None, int | None]:
    """The kernel's OOM-kill counters, system-wide and this cgroup's (a container's limit), or None."""
    def read(path: str, prefix: str) -> str | None:  # the first such line, after `prefix`
        with contextlib.suppress(OSError, StopIteration):
            with open(path) as f:
                return next(line[len(prefix):].strip() for line in f if line.startswith(prefix))
        return None

    cgroup = read("/proc/self/cgroup", "0::")
    events = read(f"/sys/fs/cgroup{cgroup}/memory.events", "oom_kill ") if cgroup else None
    return tuple(int(n) if n and n.isdigit() else None for n in (read("/proc/vmstat", "oom_kill "), events))


def died_status(exitcode: int | None, oom_before: tuple, oom_after: tuple) -> dict[str, Any]:
    """A child that died without a word: SIGKILL while an OOM-kill counter rose is an OOM; else an error."""
    rose = any(a is not None and b is not None and a > b for a, b in zip(oom_after, oom_before))
    if exitcode == -signal.SIGKILL and rose:
        return {"ok": False, "status": "OOM",
                "detail": "killed by the kernel's OOM killer (exit -9 while its oom_kill counter rose)"}
    return {"ok": False, "status": f"error: child process died with exit code {exitcode}"}


def _stop(proc: Any) -> None:
    """SIGTERM, then SIGKILL after a grace period: never wait forever on a hung child."""
    proc.terminate()
    proc.join(STOP_GRACE_S)
    if proc.is_alive():
        proc.kill()
        proc.join()


def run_isolated(fn: Callable[..., Any], kwargs: dict[str, Any], in_process: bool = False,
                 timeout_s: float | None = None, stop_when: Callable[[], str | None] | None = None,
                 on_heartbeat: Callable[[str], None] | None = None) -> dict[str, Any]:
    """`fn(**kwargs)` in a fresh child of the fork server: {"ok": True, "value": ..., "pid": ...} or {"ok": False,
    "status": "OOM" | "error: ..." | "timeout after N s", ...}; stopped at `timeout_s`, when `stop_when()` returns
    a status (a torchrun peer failed), or on Ctrl-C (re-raised). `on_heartbeat` gets `<phase>... <s> s` lines."""
    if in_process:
        cwd = os.getcwd()
        try:
            return {"ok": True, "value": fn(**kwargs), "pid": os.getpid()}
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a failure is data; Ctrl-C is not
            torch.cuda.empty_cache()
            return {"ok": False, "status": failure_status(exc), "traceback": traceback.format_exc(),
                    "pid": os.getpid()}
        finally:  # your code's os.chdir would move the relative results folder under the next rows
            os.chdir(cwd)
    ctx = _fork_server(fn, kwargs)
    (result_r, result_w), (lifeline_r, lifeline_w) = ctx.Pipe(duplex=False), ctx.Pipe(duplex=False)
    child_args = (result_w, lifeline_r, fn, kwargs, dict(os.environ), os.getcwd(), list(sys.path))
    proc = ctx.Process(target=_child_main, args=child_args, daemon=True)
    oom_before, start, doing = oom_kill_counts(), timeit.default_timer(), "setting up"
    next_line = start + HEARTBEAT_S
    try:
        # a Ctrl-C meanwhile is raised after the start: interrupted mid-start, the new child would read half its
        # arguments and print the fork server's traceback
        pending: list[int] = []
        with results.handling_signal(signal.SIGINT, lambda signum, frame: pending.append(signum)):
            proc.start()
        if pending:
            raise KeyboardInterrupt
        result_w.close()
        lifeline_r.close()
        while True:
            ready = multiprocessing.connection.wait([result_r], min(STOP_POLL_S, HEARTBEAT_S))
            if ready:
                try:
                    message = result_r.recv()  # what phase() names, or the answer
                except EOFError:  # died without a word: a segfault, the OOM killer, os._exit
                    proc.join()
                    return died_status(proc.exitcode, oom_before, oom_kill_counts())
                if isinstance(message, dict):
                    break
                doing = message
            now = timeit.default_timer()
            if on_heartbeat and now >= next_line:
                on_heartbeat(f"{doing}... {now - start:.0f} s")
                next_line = now + HEARTBEAT_S
            timed_out = timeout_s is not None and now - start >= timeout_s
            if reason := f"timeout after {timeout_s:g} s" if timed_out else stop_when and stop_when():
                _stop(proc)
                return {"ok": False, "status": reason}
        proc.join(STOP_GRACE_S)
        if proc.is_alive():  # answered, but its teardown is stuck: the answer stands
            _stop(proc)
        return message
    except KeyboardInterrupt:
        if proc.pid is not None:
            _stop(proc)
        raise
    finally:
        lifeline_w.close()
        result_r.close()


# ---- progress: what a configuration does now ----

_tell: list[Callable[[str], None]] = []  # in a child: the pipe through which phase() tells the parent
_told_at = [0.0]


def phase(name: str) -> None:
    """Name what this configuration does now (untimed code) for the heartbeat. A no-op outside a child."""
    if _tell:
        _tell[-1](name)
        _told_at[0] = timeit.default_timer()


def timed_phase(name: str) -> contextlib.AbstractContextManager:
    """`with timed_phase(name), timer:` names a timed step (at most once a second) before its timer starts."""
    if _tell and timeit.default_timer() - _told_at[0] >= 1.0:
        phase(name)
    return contextlib.nullcontext()


# ---- the command line ----

# The default time limit of one configuration: generous, and scaled by the sweep's own timings.
TIMEOUT_FLOOR_S = 15 * 60
TIMEOUT_FACTOR = 10


def time_limit(timeout_s: float | None, slowest_s: float) -> float | None:
    """--timeout (0 = none), or the larger of 15 min and 10x the slowest so far (2x the sequence: 4x the cost)."""
    if timeout_s is not None:
        return timeout_s or None
    return max(TIMEOUT_FLOOR_S, TIMEOUT_FACTOR * slowest_s)


def add_sweep_args(parser: argparse.ArgumentParser, compares: bool = False) -> None:
    """--in-process, --timeout, --no-skip, --quiet; with `compares`, --interleave and --repeats too."""
    arg = parser.add_argument
    arg("--in-process", action="store_true", help="run every configuration in this process instead of a "
        "fresh child process each (no isolation and no --timeout; see docs/running.md)")
    arg("--timeout", type=results.non_negative_float, default=None, metavar="SECONDS",
        help="time limit of one configuration, after which its child is killed and the row says 'timeout "
             f"after N s'; 0 = none (default: the larger of {TIMEOUT_FLOOR_S // 60} min and "
             f"{TIMEOUT_FACTOR}x the slowest configuration so far)")
    arg("--no-skip", action="store_true",
        help="after an OOM, still run the larger sizes (context / sequence lengths) of that group")
    arg("--quiet", action="store_true", help="no progress on stderr: neither the start and end line of each "
        f"configuration nor the heartbeat (its phase, at most every {HEARTBEAT_S:g} s) during a long one")
    if compares:
        arg("--interleave", choices=("steps", "runs"), default="steps",
            help="how the variants of a comparison are timed: steps = in one process, their timed steps "
                 "alternating in rounds (A B B A ...); runs = each in its own process, --repeats whole runs "
                 "alternating. See docs/running.md")
        arg("--repeats", type=results.step_count, default=1, help="--interleave runs: whole runs of every "
            "variant, alternating A B B A (2 or more give the speed-up an interval)")


def add_recalibrate_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recalibrate", action="store_true",
                        help="measure this machine's ceiling again (best matmul TFLOP/s per dtype, copy GB/s; a few "
                             "seconds), the floors' ceiling where no datasheet names the device; the best seen is kept "
                             f"in <results-dir>/{CEILINGS_FILE} (or the file ${CEILINGS_ENV} names)")


def measured_ceiling(args: argparse.Namespace, device: torch.device, again: bool = False) -> dict[str, Any] | None:
    """This machine's measured ceiling (common.machine_ceiling), read or measured in a child (no CUDA here), before
    a run makes any file: Ctrl-C meanwhile is one line and exit 130 (SIGTERM 143); `again`: measured again within
    a sweep, whose interrupt it is. None on a torchrun rank but 0, or when it failed (said: the floors then use the
    datasheet only)."""
    if not parallel.is_rank_zero():
        return None
    kwargs = {"device": device, "results_dir": args.results_dir, "recalibrate": args.recalibrate or again,
              "quiet": args.quiet}
    try:
        with results.sigterm_as_interrupt():
            got = run_isolated(machine_ceiling, kwargs, args.in_process, timeout_s=TIMEOUT_FLOOR_S)
    except KeyboardInterrupt as exc:
        if again:
            raise
        progress(f"interrupted by {results.signal_name(exc)} while this machine's ceiling was measured: no file made")
        raise SystemExit(128 + results.signal_number(exc)) from None
    if not got["ok"]:
        progress(f"note: no measured ceiling ({got['status']}): floors only where a datasheet names the device")
        return None
    return got["value"]


def check_sweep_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if getattr(args, "repeats", 1) > 1 and args.interleave != "runs":
        parser.error("--repeats applies to --interleave runs (with steps, the rounds are within one process)")


def interleave(variants: int, rounds: int, run_block: Callable[[int, int], None]) -> None:
    """run_block(variant, round) for every variant, `rounds` times in round_order (A B | B A | A B ...)."""
    for r in range(rounds):
        for variant in round_order(variants, r):
            run_block(variant, r)


# ---- the sweep ----


def comparisons(runs: list[Any], key: Callable[[Any], Any]) -> list[Any]:
    """A plan: the runs with an equal key(run) (not None) as one list where the first of them stood."""
    units: dict[Any, list[Any]] = {}
    for i, run in enumerate(runs):
        units.setdefault(("alone", i) if key(run) is None else ("compared", key(run)), []).append(run)
    return [unit[0] if k[0] == "alone" else unit for k, unit in units.items()]


def merge_repeats(values: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, list[list[int]]]]:
    """A configuration's records from its --repeats children as one: samples concatenated, the largest peaks,
    every child's compile_s (the first is quoted: later ones find torch's caches warm), the load around them
    all; and which samples came from which child, per phase: {phase: [[start, stop) per repetition]}."""
    merged = dict(values[0])
    bounds: dict[str, list[list[int]]] = {}
    for key in [k for k, v in values[0].items() if k.endswith("_ms") and isinstance(v, list)]:
        merged[key] = [x for value in values for x in value[key]]
        ends = list(itertools.accumulate(len(value[key]) for value in values))
        bounds[key.removesuffix("_ms")] = [[end - len(value[key]), end] for end, value in zip(ends, values)]
    for key in ("peak_mem_allocated_bytes", "peak_mem_reserved_bytes"):
        if all(key in value for value in values):
            merged[key] = max(value[key] for value in values)
    if len(values) > 1:
        if "compile_s" in values[0]:
            merged["compile_s_repeats"] = [value.get("compile_s") for value in values]
        if all("load" in value for value in values):
            merged["load"] = {"before": values[0]["load"]["before"], "after": values[-1]["load"]["after"]}
        merged["repeats"] = len(values)
    return merged, bounds


def run_configurations(measure: Callable[[Any], dict], plan: list[Any], files: ResultFiles | None,
                       args: argparse.Namespace, *, name: str, device: torch.device | None,
                       finish: Callable | None = None, render: Callable | None = None,
                       summary: Callable | None = None, measure_variants: Callable | None = None,
                       resize: Callable | None = None, search: bool = False,
                       ceiling: dict[str, Any] | None = None) -> tuple[list[dict], int]:
    """Each run of `plan` (a run with label() and skip_key() -> (group, size name, size), or a list: a comparison's
    variants) as add_sweep_args' flags say: measure(run) / measure_variants(runs) in children, finish(run, record),
    render(records, fmt), summary(record) here; `ceiling` (measured_ceiling's, which finish divides by) measured
    again, in place, after the first row that beat its floor on it. Returns (records, 0 | 130 after Ctrl-C | 128 +
    the signal after SIGTERM or SIGHUP)."""
    units = [unit if isinstance(unit, list) else [unit] for unit in plan]
    runs = [run for unit in units for run in unit]
    launch = parallel.torchrun_launch() if any(getattr(run, "parallel", None) for run in runs) else None
    ranks = parallel.RankSweep(launch) if launch else None
    sweep = Sweep(measure, runs, files, args, ranks, name=name, finish=finish, render=render, summary=summary,
                  measure_variants=measure_variants, resize=resize, search=search, ceiling=ceiling, device=device)
    with results.sigterm_as_interrupt():
        try:
            if device is not None:  # the environment of rows that carry none, read in a child: no CUDA here
                env = run_isolated(environment, {"device": device}, args.in_process, timeout_s=TIMEOUT_FLOOR_S)
                sweep.env = env["value"] if env["ok"] else {"device": str(device), "status": env["status"]}
            index = itertools.count()  # a run's index: the same on every torchrun rank
            for unit in units:
                sweep.run_unit([(next(index), run) for run in unit])
            if ranks is not None:
                ranks.finish()
        except KeyboardInterrupt as exc:
            how, code = results.signal_name(exc), 128 + results.signal_number(exc)
            done = len(sweep.records)
            kept = f"; finished rows are in {files.markdown} and {files.jsonl}" if done and files else ""
            if parallel.is_rank_zero():  # said even under --quiet: where the finished rows are
                progress(f"interrupted by {how} after {done} of {sweep.total} configurations{kept}")
            return sweep.records, code
    return sweep.records, 0


def all_failed(records: list[dict], counted: Callable[[dict], bool] = lambda record: False) -> int:
    """1, said in one line, when configurations ran and none was measured (a misspelt --model or --impl fails
    them all): a script's exit status says so, after its table of causes. `counted`: a record that measured what
    its script could on this machine, though its status is not ok (mem_profile's accounting, peaks skipped)."""
    measured = [r for r in records if finished(r) or str(r.get("status")).startswith("WRONG")  # timed all the same
                or counted(r)]
    failed = [r for r in records if r not in measured and not str(r.get("status")).startswith("skipped")]
    if not failed or measured or not parallel.is_rank_zero():
        return 0
    progress(f"error: every configuration failed ({len(failed)} of {len(records)}; the status column says why): "
             "nothing was measured")
    return 1


# ---- --context-length max: after the first OOM, bisect between it and the longest context that ran ----

RESOLUTION = 64  # the bisection's default step: the answer is a multiple of it (kernels like multiples of 64)
PROBE_BUDGET = 8  # bisection probes at most per search (from 64 to 65536 takes 10)


@dataclasses.dataclass
class Bisection:
    """Between `fits` (the longest that ran) and `fails` (the shortest OOM): each probe tries the middle multiple
    of `resolution` strictly between them, until none is left or `budget` probes are spent."""

    fits: int
    fails: int
    resolution: int = RESOLUTION
    budget: int = PROBE_BUDGET
    probes: int = 0

    def next_size(self) -> int | None:
        low, high = self.fits // self.resolution + 1, -(-self.fails // self.resolution) - 1  # the multiples
        return None if low > high or self.probes >= self.budget else (low + high) // 2 * self.resolution

    def record(self, size: int, fits: bool) -> None:
        self.probes += 1
        if fits:
            self.fits = max(self.fits, size)
        else:
            self.fails = min(self.fails, size)


class Sweep:
    """The state of one run_configurations: records so far, the skip rule, progress counts, searches."""

    def __init__(self, measure: Callable, runs: list[Any], files: ResultFiles | None,
                 args: argparse.Namespace, ranks: Any, **options: Any):
        self.measure, self.runs, self.files, self.args, self.ranks = measure, runs, files, args, ranks
        self.env: dict[str, Any] = {}  # the sweep's environment, for the rows that carry none
        self.name, self.search = options["name"], options["search"]
        self.finish, self.render, self.summary = options["finish"], options["render"], options["summary"]
        self.measure_variants, self.resize = options["measure_variants"], options["resize"]
        self.ceiling, self.device = options["ceiling"], options["device"]  # the ceiling: measured again once at most
        self.records: list[dict[str, Any]] = []
        self.oom_at: dict = {}  # group -> its smallest OOM size; larger ones would need more: skipped (--no-skip)
        self.ended: set = set()  # search: the groups whose search has ended
        self.slowest_s, self.total = 0.0, len(runs)
        self.probe_index = itertools.count(len(runs))  # bisection probes' (the same on every torchrun rank)
        self.repeats = getattr(args, "repeats", 1)  # more than 1 with --interleave runs only (check_sweep_args)
        self.say = progress if parallel.is_rank_zero() and not args.quiet else lambda message: None

    def record_of(self, run: Any, answer: dict[str, Any]) -> dict[str, Any]:
        """The row of run_isolated's `answer`: its value and pid, or its failure."""
        record = {"experiment": self.name, "config": dataclasses.asdict(run), "label": run.label(),
                  **answer.get("value", {})}
        record.setdefault("status", "ok")  # a failure's own status replaces it
        return {**record, **{k: v for k, v in answer.items() if k not in ("ok", "value") and v is not None}}

    def add(self, run: Any, record: dict[str, Any], elapsed: float, shared: int = 1) -> None:
        """`elapsed`: seconds of the child that measured it, `shared` with that many variants interleaved."""
        group, _, size = run.skip_key()
        if is_oom_status(record["status"]):
            self.oom_at[group] = min(self.oom_at.get(group, size), size)
        if self.search and group not in self.ended:  # a doubling probe: its first failure ends the group's plan
            record["search_probe"] = "doubling"
            if not finished(record):
                self.ended.add(group)
                self.total -= sum(1 for later in self.runs
                                  if later.skip_key()[0] == group and later.skip_key()[2] > size)
        if not is_oom_status(record["status"]) and not record["status"].startswith(("skipped", "timeout")):
            self.slowest_s = max(self.slowest_s, elapsed / shared)
        record.setdefault("environment", self.env)
        if self.finish is not None:
            self.finish(run, record)
        self.records.append(record)
        if self.files is not None:
            self.files.append_record(record)
            if self.render is not None:
                self.files.write_report(lambda fmt: self.render(self.records, fmt), self.args.fmt)
        said = self.summary(record) if self.summary and finished(record) else record["status"]
        took = f"{elapsed:.1f} s" + (f" for {shared} variants" if shared > 1 else "")
        self.say(f"[{len(self.records)}/{self.total}] {run.label()}: {said} ({took})")
        if self.ceiling and any(results.number(f.get("of_floor")) and f["of_floor"] > 1  # its ceiling too low
                                for f in (record.get("floors") or {}).get("phases", {}).values()):
            self.say("a phase beat its floor: the measured ceiling is too low; measuring it again for the next rows")
            self.ceiling.update(measured_ceiling(self.args, self.device, again=True) or {})
            self.ceiling = None

    def run_unit(self, unit: list[tuple[int, Any]]) -> None:
        """A comparison's variants (or one run): skipped ones are rows; the rest together or each alone."""
        todo = []
        for i, run in unit:
            group, size_name, size = run.skip_key()
            if self.search and group in self.ended:
                continue
            if not self.args.no_skip and size > self.oom_at.get(group, size):
                self.say(f"[{len(self.records) + 1}/{self.total}] starting {run.label()}")
                status = f"skipped: OOM at {size_name}={self.oom_at[group]}"
                self.add(run, self.record_of(run, {"status": status}), 0.0)
            else:
                todo.append((i, run))
        # a first step timed (no warm-up) needs a process of its own: in one shared, only the first variant would
        # pay the process's one-time costs (CUDA context, cuBLAS handles, lazy kernel loading)
        cold = any(getattr(run, "warmup", None) == 0 for _, run in todo)
        if len(todo) > 1 and self.measure_variants is not None and self.args.interleave == "steps" and not cold:
            self.together(todo)
        elif todo:
            self.interleave_runs(todo)
            if self.search:
                self.bisect(todo[0][1], self.records[-1])

    def alone(self, run: Any, index: int, number: int, note: str = "") -> tuple[dict[str, Any], float]:
        """One run in its child; under torchrun, each rank's child joins the run's process group (stopped when
        another rank fails), then one answer agreed from every rank's (slowest timings, "OOM on rank k")."""
        self.say(f"[{number}/{self.total}] starting {run.label()}{note}")
        start, limit = timeit.default_timer(), time_limit(self.args.timeout, self.slowest_s)
        beat = lambda line: self.say(f"[{number}/{self.total}] {line}")  # noqa: E731
        if self.ranks is None:
            answer = run_isolated(self.measure, {"run": run}, self.args.in_process, limit, on_heartbeat=beat)
        else:
            kwargs = {"measure": self.measure, "run": run, "prefix": self.ranks.configuration_prefix(index),
                      "device": run.device, "timeout_s": run.pg_timeout_s}
            answer = run_isolated(parallel.measure_on_rank, kwargs, timeout_s=limit,
                                  stop_when=self.ranks.peer_failure(index), on_heartbeat=beat)
            # the others may run up to their own time limit before they answer; without one, up to a day
            answers = self.ranks.exchange(index, answer, (limit or 24 * 3600) + 2 * run.pg_timeout_s)
            answer = parallel.agreed_answer(answers, parallel.merge_rank_records)
        return answer, timeit.default_timer() - start

    def together(self, todo: list[tuple[int, Any]]) -> None:
        """The variants in one child (measure_variants); if it fails, each alone: an OOM row is a real one."""
        where = f"[{len(self.records) + 1}-{len(self.records) + len(todo)}/{self.total}]"
        labels = [run.label() for _, run in todo]
        self.say(f"{where} starting {len(todo)} variants, interleaved: {' | '.join(labels)}")
        start, limit = timeit.default_timer(), time_limit(self.args.timeout, self.slowest_s)
        answer = run_isolated(self.measure_variants, {"runs": [run for _, run in todo]},
                              in_process=self.args.in_process, timeout_s=limit and limit * len(todo),
                              on_heartbeat=lambda line: self.say(f"{where} {line}"))
        elapsed = timeit.default_timer() - start
        if not answer["ok"]:
            self.say(f"{where} the interleaved child failed ({answer['status']}): measuring each alone")
            self.interleave_runs(todo, fallback=answer["status"])
            return
        for (_, run), value in zip(todo, answer["value"]):
            record = self.record_of(run, {"value": value, "pid": answer.get("pid")})
            if "pairing" in record:
                record["pairing"]["labels"] = labels
            self.add(run, record, elapsed, shared=len(todo))

    def interleave_runs(self, todo: list[tuple[int, Any]], fallback: str | None = None) -> None:
        """Each run in children of its own, `repeats` rounds A B | B A, merged and paired by round. A failure ends
        that run's repeats; rows are added in the plan's order as runs end; Ctrl-C keeps what finished."""
        group, labels = uuid.uuid4().hex[:12], [run.label() for _, run in todo]
        answers: list[list[tuple[dict, float]]] = [[] for _ in todo]
        first = len(self.records) + 1  # round 0 starts every run, in order: run p is number first + p

        def ended(p: int) -> bool:
            return len(answers[p]) == self.repeats or not answers[p][-1][0]["ok"]

        def add_in_order(interrupted: bool = False) -> None:
            while (p := len(self.records) + 1 - first) < len(todo) and answers[p] and (interrupted or ended(p)):
                self.add_repeats(todo[p][1], answers[p], p, group, labels, fallback)

        def run_child(p: int, r: int) -> None:
            if answers[p] and ended(p):
                return
            note = f" (repeat {r + 1}/{self.repeats})" if self.repeats > 1 else ""
            answers[p].append(self.alone(todo[p][1], todo[p][0], first + p, note))
            add_in_order()

        try:
            interleave(len(todo), self.repeats, run_child)
        except KeyboardInterrupt:
            add_in_order(interrupted=True)
            raise

    def add_repeats(self, run: Any, answers: list[tuple[dict, float]], position: int, group: str,
                    labels: list[str], fallback: str | None) -> None:
        """A run's children as one row: its failure, or their records merged (and paired, in a comparison)."""
        oks = [answer for answer, _ in answers if answer["ok"]]
        failed = None if answers[-1][0]["ok"] else answers[-1][0]  # a failure ends the repeats
        if failed is not None or any("status" in answer["value"] for answer in oks):
            record = self.record_of(run, failed or oks[0])
            if failed is not None and oks:
                record["repeats_before_failure"] = len(oks)
        else:
            value, bounds = merge_repeats([answer["value"] for answer in oks])
            record = self.record_of(run, {"value": value, "pid": oks[0].get("pid")})
            if len(oks) > 1:
                record["pids"] = [answer.get("pid") for answer in oks]
            if len(labels) > 1 and bounds:
                rounds = next(iter(bounds.values()))
                record["pairing"] = {"group": group, "mode": "runs", "position": position,
                                     "variants": len(labels), "rounds": rounds, "labels": labels}
                if any(b != rounds for b in bounds.values()):
                    record["pairing"]["rounds_by_phase"] = bounds
        if fallback:
            record["interleave_fallback"] = f"measured alone: the interleaved child failed ({fallback})"
        self.add(run, record, sum(seconds for _, seconds in answers))

    def bisect(self, run: Any, record: dict[str, Any]) -> None:
        """After a search's first OOM that follows a fit (a smaller size of its group: all ran, in order of
        size), a Bisection between them, a child per probe resize(run, size)."""
        group, _, size = run.skip_key()
        fits = [r.skip_key()[2] for r in self.runs if r.skip_key()[0] == group and r.skip_key()[2] < size]
        if not is_oom_status(record["status"]) or not fits or self.resize is None:
            return
        bisection = Bisection(max(fits), size, getattr(self.args, "search_resolution", RESOLUTION),
                              getattr(self.args, "search_probes", PROBE_BUDGET))
        while (next_size := bisection.next_size()) is not None:
            probe = self.resize(run, next_size)
            self.total += 1
            answer, elapsed = self.alone(probe, next(self.probe_index), len(self.records) + 1, " (bisection)")
            probe_record = {**self.record_of(probe, answer), "search_probe": "bisection"}
            self.add(probe, probe_record, elapsed)
            if finished(probe_record) or is_oom_status(probe_record["status"]):
                bisection.record(next_size, finished(probe_record))
            else:  # an error or a timeout: the bounds stand, the answer says why it stopped
                break


# ---- one configuration of the training step (bench_e2e, leaderboard, mem_profile): built, warmed up, timed ----

NOISY_CV = 0.10  # a phase whose std/mean is above this is flagged: don't quote it without a second look


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One configuration: what the sweep runs in a child process and what every record keeps as "config"."""

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
    optimizer: str = "ours"  # ours, torch, or yours as MODULE:CLASS (model.build_optimizer)
    model_factory: str | None = None  # yours as MODULE:CALLABLE (model.build_model); None = ours
    model_name: str | None = None  # --model NAME=...: the model's name in tables and records
    flops: str = "formula"  # formula (our architecture), counted (FlopCounterMode) or none
    tf32: bool | None = None  # None = leave PyTorch's default
    device: str = "auto"
    seed: int = 0
    nvtx: bool = False
    checkpoint_every: int = 0  # mem_profile's activation checkpointing
    profile_results_dir: str | None = None  # --profile: torch.profiler trace under <this>/profile/
    parallel: str | None = None  # torchrun: "ddp" or "fsdp" (parallel.shard_model), each rank its own batch
    world_size: int = 1
    fsdp_mixed_precision: str = "off"  # fsdp: "bf16" = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
    reshard_after_forward: bool = True  # fsdp: blocks free their gathered parameters after forward
    pg_timeout_s: float = DEFAULT_PG_TIMEOUT_S  # a collective waiting longer for a peer fails

    @property
    def context_length(self) -> int:
        return self.model.context_length

    def label(self) -> str:
        """The configuration in progress lines and file names; settings at their default are left out."""
        model = [self.model_name or self.model_factory] if self.model_factory else [self.model_name, self.attn]
        optimizer = f"optimizer={self.optimizer}" if self.optimizer != "ours" else None
        parts = [self.size, f"ctx={self.context_length}", self.mode + (" no-grad" if self.no_grad else ""),
                 self.dtype, *model, f"warmup={self.warmup}", optimizer, parallel_label(vars(self)),
                 "compiled" if self.compile else None]
        return " ".join(filter(None, parts))

    def skip_key(self) -> tuple[tuple, str, int]:
        """(group, "ctx", context): after an OOM the sweep skips the group's larger contexts."""
        return dataclasses.replace(self.with_context(1), warmup=0, steps=0), "ctx", self.context_length

    def comparison_key(self) -> RunConfig | None:
        """Without the variant fields: runs that share it are measured together, interleaved. None when a variant
        must run alone: under --parallel (its own process group), --profile or --nvtx (a profile holds one)."""
        if self.parallel or self.profile_results_dir is not None or self.nvtx:
            return None
        return dataclasses.replace(self, dtype="", compile=False, attn="", optimizer="", model_factory=None,
                                   model_name=None, flops="")

    def with_context(self, context_length: int) -> RunConfig:  # a search's next probe
        return dataclasses.replace(self, model=dataclasses.replace(self.model, context_length=context_length))


class Workload:
    """Model, optimizer and one random batch on the device, a step's three phases, and the profiler (--profile)
    around the timed steps. Under --parallel this process is one rank of a process group already joined: the model is in
    DDP or FSDP2 and the batch is this rank's."""

    def __init__(self, run: RunConfig):
        phase("building the model")
        self.run = run
        launch = parallel.torchrun_launch() if run.parallel else None
        self.device = parallel.rank_device(resolve_device(run.device), launch)
        set_ranges(nvtx=run.nvtx, profiler=run.profile_results_dir is not None)
        kinds = ["CPU", "CUDA"] if self.device.type == "cuda" else ["CPU"]
        self.profiler = (quiet_profiler([getattr(torch.profiler.ProfilerActivity, k) for k in kinds])
                         if run.profile_results_dir is not None else contextlib.nullcontext())  # around timed steps
        if run.tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = run.tf32
        torch.manual_seed(run.seed)
        with self.device:  # initialise directly on the device: CPU init of a 2.7B model takes minutes
            self.model = build_model(run.model, run.attn, run.checkpoint_every, run.model_factory)
        wrapped = self.model
        if run.parallel:
            wrapped = parallel.shard_model(self.model, run.parallel, self.device, run.fsdp_mixed_precision,
                                           run.reshard_after_forward)
            torch.manual_seed(run.seed + 1 + launch.rank)  # each rank its own batch
        self.callable_model = torch.compile(wrapped) if run.compile else wrapped
        shape = (run.batch_size, run.context_length)
        self.tokens = torch.randint(0, run.model.vocab_size, shape, device=self.device)  # made once, not timed
        self.targets = torch.randint(0, run.model.vocab_size, shape, device=self.device)
        self.optimizer = (build_optimizer(run.optimizer, self.model.parameters(), self.device)
                          if run.mode == "train" else None)
        self.logits_checked = run.model_factory is None  # ours is known to be right; yours is checked once
        # fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range and needs none
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=run.dtype == "fp16" and run.mode != "forward")

    def forward(self, eager: bool = False) -> torch.Tensor:
        """The loss of the batch; `eager`: through the model itself, not torch.compile's or DDP's wrapper."""
        grad_mode = torch.inference_mode() if self.run.no_grad else torch.enable_grad()
        with grad_mode, precision_context(self.device, self.run.dtype):
            logits = (self.model if eager else self.callable_model)(self.tokens)
            if not self.logits_checked:
                check_logits(logits, tuple(self.tokens.shape), self.run.model.vocab_size,
                             self.run.model_name or self.run.model_factory)
                self.logits_checked = True
            return cross_entropy(logits, self.targets)

    def backward(self, loss: torch.Tensor) -> None:  # the scaler is a pass-through but for fp16
        self.scaler.scale(loss).backward()

    def optimizer_step(self) -> None:
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> dict[str, float]:
        return run_step(self)

    def untimed_step(self, mark: Callable[[str], None] = lambda phase: None) -> None:
        """run_step's phases with no synchronisation between them (the leaderboard's step, mem_profile's), calling
        mark(phase) before each and mark("end") after."""
        mark("forward")
        loss = self.forward()
        if self.run.mode != "forward":
            mark("backward")
            self.backward(loss)
        if self.run.mode == "train":
            mark("optimizer")
            self.optimizer_step()
        elif self.run.mode == "forward-backward":
            self.model.zero_grad(set_to_none=True)
        mark("end")


def run_step(work: Workload) -> dict[str, float]:
    """One step, timed: seconds per phase and for the whole step. SyncTimer synchronises, reads the clock, runs,
    synchronises, reads: each phase is timed to its last kernel, the step timer holds the phases back to back.
    Nothing else runs inside the timers: no data creation, no .item() (a hidden sync), no printing."""
    times: dict[str, float] = {}
    with SyncTimer(work.device) as step:
        for name in PHASES_BY_MODE[work.run.mode]:  # forward[, backward[, optimizer]]
            with annotate(name), SyncTimer(work.device) as timer:  # annotate: an NVTX / profiler range
                if name == "forward":
                    loss = work.forward()
                elif name == "backward":
                    work.backward(loss)
                else:
                    work.optimizer_step()
            times[name] = timer.elapsed_s
    times["step"] = step.elapsed_s
    if work.run.mode == "forward-backward":
        work.model.zero_grad(set_to_none=True)  # untimed: each step starts without gradients, as a train step does
    return times


def warm_up(work: Workload, of: str = "") -> tuple[dict[str, Any], float | None]:
    """Untimed: the compile step (compile_s) and the warm-up steps -> (the record so far, the last warm-up step's s)."""
    record: dict[str, Any] = {"environment": environment(work.device), "load": {"before": machine_load(work.device)},
                              "model_num_params": sum(p.numel() for p in work.model.parameters())}  # as built
    if work.run.compile:  # the first call compiles (forward, and backward on the first backward)
        phase(f"compiling (first step){of}")
        _, record["compile_s"] = SyncTimer(work.device).time(work.step)
    last_s = None
    with annotate("warmup"):
        for i in range(work.run.warmup):
            phase(f"warm-up {i + 1}/{work.run.warmup}{of}")
            last_s = work.step()["step"]
    return record, last_s


def with_samples(work: Workload, record: dict[str, Any], samples: list[dict[str, float]]) -> dict[str, Any]:
    """The record after the timed steps: `<phase>_ms` samples (ms, in step order), the load."""
    record.update({f"{key}_ms": [s[key] * 1e3 for s in samples] for key in samples[0]})
    record["load"]["after"] = machine_load(work.device)
    return record


def measure_steps(work: Workload) -> dict[str, Any]:
    """One configuration: compile step and warm-up (untimed), the peak counter reset, the timed steps, the peaks."""
    record, _ = warm_up(work)
    reset_peak_memory(work.device)
    samples = []
    with work.profiler, annotate("measure"):
        for i in range(work.run.steps):
            with timed_phase(f"step {i + 1}/{work.run.steps}"):  # the progress heartbeat stays quiet inside
                samples.append(work.step())
    phase("after the timed steps")
    return with_samples(work, {**record, **peak_memory_bytes(work.device)}, samples)


def derive_figures(run: RunConfig, record: dict[str, Any], peak_override: float | None = None,
                   measured: dict[str, Any] | None = None) -> dict[str, Any]:
    """Statistics per phase, noisy flags, tokens/s, FLOPs, achieved TFLOP/s, MFU and floors of a finished record;
    `measured`: the machine's measured ceiling (measured_ceiling), the floors' where no datasheet is."""
    phases = PHASES_BY_MODE[run.mode] + ("step",)
    out = {f"{p}_ms_{stat}": value for p in phases for stat, value in summarize(record[f"{p}_ms"]).items()}
    out["noisy"] = [f"{p} {out[f'{p}_ms_cv']:.0%}" for p in phases
                    if out[f"{p}_ms_cv"] is not None and out[f"{p}_ms_cv"] > NOISY_CV]
    if out["step_ms_n"] < 2:
        out["note"] = "1 timed step: no std"
    step_s = out["step_ms_mean"] / 1e3  # under --parallel: the slowest rank's step, what the global step costs
    out["tokens_per_s"] = run.batch_size * run.context_length * run.world_size / step_s  # the global batch
    # FLOPs of one global step: the formula for our architecture, FlopCounterMode's count, or none
    flops = (results.step_flops(run.model, run.batch_size, run.context_length, run.mode) if run.flops == "formula"
             else record["counted_step_flops"] if run.flops == "counted" else None)
    flops = flops and flops * run.world_size
    out["floors"] = phase_floors(run, {**record, **out}, peak_override, measured)
    out.update(step_flops=flops, flops_source=run.flops, achieved_tflops=None, peak_tflops=None, peak_source=None,
               mfu_precision=None, mfu=None)
    if flops is None:  # no FLOPs, so no TFLOP/s and no MFU rather than a formula for another model
        return out
    env = record["environment"]
    precision = matmul_precision_key(run.dtype, bool(env.get("tf32_matmul")))
    peak, label = ((peak_override, "--peak-tflops") if peak_override is not None
                   else peak_tflops(env["device_name"], precision) if env["device"].startswith("cuda")
                   else (None, None))  # a CPU has no entry in the peak table: no MFU rather than a guess
    achieved = flops / step_s / 1e12
    out.update(achieved_tflops=achieved, peak_tflops=peak, peak_source=label, mfu_precision=precision,
               mfu=achieved / (peak * run.world_size) if peak else None)  # N GPUs: N x the peak
    return out


def phase_floors(run: RunConfig, record: dict[str, Any], peak_override: float | None,
                 measured: dict[str, Any] | None) -> dict[str, Any]:
    """results.step_floors per phase of one process's step beside its times: forward and backward for our
    architecture (--flops formula), the optimizer step as AdamW's bytes for any model and optimizer."""
    env = record["environment"]
    roofs = common.roofs(env, matmul_precision_key(run.dtype, bool(env.get("tf32_matmul"))), measured, peak_override)
    if run.parallel:  # per-rank bytes and the collectives' links are not modelled here
        return {"phases": {}, "roofs": roofs}
    floors = results.step_floors(run.model, run.batch_size, run.context_length, run.mode, DTYPES[run.dtype].itemsize,
                                 run.attn, roofs["tflops"], roofs["gbs"], record.get("model_num_params"))
    if run.flops != "formula":  # another model's FLOPs and bytes are not the formula's
        floors = {k: v for k, v in floors.items() if k == "optimizer"}
    if "optimizer" in floors and run.optimizer not in (common.OURS, "torch"):
        floors["optimizer"]["note"] = "assumes AdamW's state: 28 bytes per parameter"
    return results.beside_measured(floors, record, roofs)


# ---- nsys_run.sh: one nsys profile of bench_e2e.py per configuration, through the sweep above ----

NSYS_RUN_EPILOG = """\
Environment: NSYS = the nsys binary (default: nsys on PATH); PYTHON = the interpreter (default: python3);
CS336_HANDOUT = the handout when --handout is not given.
A report made with the same arguments (<report>.args, written once its tables exist) is reused, another kept
and that configuration fails (--force replaces it, once the new one exists); files nsys_run.sh did not make are
never replaced: the profile takes the name <report>-2 (-3, ...). After an OOM the larger contexts of that size and
mode are skipped.
Exit status: 0 when every configuration has its tables; 2 for a usage error (here or bench_e2e.py's) or no
usable nsys; else the first failed configuration's. Ctrl-C 130, SIGTERM 143, SIGHUP 129 (nsys and the run
stopped, also when this process is killed)."""
NSYS_PLANS = {"2025": (["all"], [128, 256, 512, 1024]),  # every size of Table 1 x four contexts
              "2026": (["small", "medium"], [256, 512, 1024])}  # two sizes x three contexts > 128
ONE_VALUE_OPTIONS = ("--dtype", "--compile", "--attn", "--optimizer", "--warmup")  # two: bench_e2e sweeps
OWN_OPTIONS = ("--size", "--context-length", "--mode", "--handout", "--dry-run", "--results-dir", "--out")
# torch's NVTX ranges are unregistered strings, which an NVTX capture range matches only with this set to 0
REGISTER_ONLY = "NSYS_NVTX_PROFILER_REGISTER_ONLY"
BENCH_E2E = os.path.join(HERE, "bench_e2e.py")


def nsys_say(message: str) -> None:
    progress(f"nsys_run.sh: {message}")


@dataclasses.dataclass
class NsysConfig:
    """One profile of nsys_run.sh's plan, as run_configurations runs it (label, skip_key)."""

    size: str
    context_length: int
    mode: str
    report: str  # results/nsys/<size>_ctx<ctx>_<mode><suffix>, without .nsys-rep
    app: list[str]  # bench_e2e.py's arguments
    made_with: str  # the nsys command line, kept as <report>.args: a report is reused only for the same line

    def file(self, suffix: str) -> Path:
        return Path(f"{self.report}{suffix}")

    def held(self) -> list[str]:
        """The names of this profile's files that exist (links too)."""
        return [self.file(s).name for s in (*PROFILE_FILES, ".args") if os.path.lexists(self.file(s))]

    def label(self) -> str:
        return f"{self.size} ctx={self.context_length} {self.mode}"

    def skip_key(self) -> tuple[Any, str, int]:
        """After an OOM, the larger contexts of the same size and mode are skipped."""
        return (self.size, self.mode), "context_length", self.context_length


def parse_nsys_run_args(argv: list[str]) -> argparse.Namespace:
    p = results.ArgParser(prog="nsys_run.sh", epilog=NSYS_RUN_EPILOG,
                          formatter_class=argparse.RawDescriptionHelpFormatter,
                          description="Nsight Systems profiles of bench_e2e.py's measured steps, one report "
                                      "per configuration in results/nsys/,\nits kernel tables beside it, and "
                                      "a summary across them. Anything after -- goes to bench_e2e.py.")
    p.add_argument("config", nargs="*", metavar="SIZE CTX [MODE]", help="one configuration (MODE: train)")
    results.add_size_args(p, "the handout's plan")  # and --handout
    p.add_argument("--context-length", nargs="+", metavar="CTX", help="context lengths")
    p.add_argument("--mode", nargs="+", help="forward, forward-backward, train (default: forward train)")
    p.add_argument("--force", action="store_true", help="profile again where a report exists, replacing it")
    p.add_argument("--no-skip", action="store_true", help="after an OOM, still profile the larger contexts")
    p.add_argument("--dry-run", action="store_true", help="list the configurations and what happens to each")
    p.add_argument("--backtrace", "--python-backtrace", action="store_true",
                   help="Python + CUDA backtraces of CUDA calls (slower)")
    p.add_argument("--pytorch", metavar="VALUES", help="to nsys profile (autograd-nvtx: PyTorch's own "
                   "NVTX labels); adds _pytorch to the name. Not in nsys 2023.4")
    p.add_argument("--cuda-memory-usage", choices=("true", "false"), default="false",
                   help="true: to nsys profile (GPU memory over time); adds _cudamem to the name")
    p.add_argument("--results-dir", default="results", type=results.results_folder,
                   help="results root (reports go to its nsys/ folder)")
    own, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    # a bare --cuda-memory-usage means true and must not take the SIZE after it
    a = p.parse_intermixed_args([arg + "=true" * (arg == "--cuda-memory-usage") for arg in own])
    results.handout_or_exit(p, a)
    results.refuse(p, [
        (a.pytorch is not None and not a.pytorch.strip(),
         "--pytorch needs a value, e.g. --pytorch=autograd-nvtx"),
        (a.config and (a.size or a.context_length or a.mode),
         "give SIZE CTX [MODE] or --size/--context-length/--mode, not both"),
        (a.config and not 2 <= len(a.config) <= 3,
         "usage: bash nsys_run.sh [options] SIZE CTX [MODE] [-- bench_e2e.py arguments]")])
    if a.config:
        a.size, a.context_length, a.mode = [a.config[0]], [a.config[1]], a.config[2:] or ["train"]
    dtype = ""
    for i, arg in enumerate(extra):
        name, _, value = arg.partition("=")
        # bench_e2e's argparse takes abbreviations: --context would change a configuration this script names
        full = [o for o in OWN_OPTIONS + ONE_VALUE_OPTIONS if o.startswith(name) and o != name]
        if name.startswith("--") and len(name) > 2 and full:
            p.error(f"{name} after --: spell out {' or '.join(full)} (nsys_run.sh reads it to plan and name the "
                    "reports)")
        if name in OWN_OPTIONS:
            p.error(f"{name} after -- would reach bench_e2e.py: nsys_run.sh plans, names and places the "
                    "reports (give sizes, contexts, modes, --handout, --dry-run and --results-dir before --)")
        if name == "--dtype":
            dtype = value or (extra[i + 1:] or [""])[0]
        if arg in ONE_VALUE_OPTIONS and len([v for v in extra[i + 1:i + 3] if not v.startswith("-")]) == 2:
            p.error(f"profile one {arg} at a time")
    results.refuse(p, [  # a size and a dtype name the report: nothing that could leave the results folder
        (any(not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", s) for s in a.size or []),
         f"SIZE must be a preset name such as tiny or 2.7B, got {a.size!r}"),
        (any(not re.fullmatch(r"[1-9][0-9]*", c) for c in a.context_length or []),
         f"CTX must be a positive integer, got {a.context_length!r}"),
        (any(m not in results.MODES for m in a.mode or []),
         f"MODE must be forward, forward-backward or train, got {a.mode!r}"),
        (dtype not in ("", "fp32", "bf16", "fp16"), f"--dtype must be fp32, bf16 or fp16, got {dtype!r}")])
    sizes, contexts = NSYS_PLANS[a.handout]
    # ascending: after an OOM the rest are skipped
    a.context_length = sorted({int(c) for c in a.context_length or contexts})
    a.mode = list(dict.fromkeys(a.mode or ["forward", "train"]))
    a.size = results.sizes_or_exit(p, a, a.size or sizes)
    a.extra = extra
    # flags that change what a report holds also name it: such a report never stands in for a plain one
    memory = a.cuda_memory_usage == "true"
    a.pass_through = [f"--pytorch={a.pytorch}"] * bool(a.pytorch) + ["--cuda-memory-usage=true"] * memory
    a.nsys_options = ["--trace=cuda,nvtx,osrt", "--capture-range=nvtx", "--nvtx-capture=measure",
                      "--capture-range-end=stop", f"--env-var={REGISTER_ONLY}=0", "--force-overwrite=true",
                      *["--cudabacktrace=all", "--python-backtrace=cuda"] * a.backtrace, *a.pass_through]
    suffix = (f"_{dtype}" * (dtype not in ("", "fp32")) + "_pytorch" * bool(a.pytorch) + "_cudamem" * memory
              + f"_h{a.handout}" * (a.handout != results.DEFAULT_HANDOUT))
    a.plan = []
    for size, ctx, mode in itertools.product(a.size, a.context_length, a.mode):
        # --in-process: the measured steps and their kernels live in the process that nsys runs; --quiet: the
        # sweep says each configuration's start and end
        app = ["--size", size, "--context-length", str(ctx), "--mode", mode, "--nvtx", "--in-process", "--quiet",
               *extra, "--handout", a.handout]
        made_with = shlex.join(["nsys", "profile", *a.nsys_options, "--", "bench_e2e.py", *app])
        report = str(Path(a.results_dir, "nsys", f"{size}_ctx{ctx}_{mode}{suffix}"))
        a.plan.append(NsysConfig(size, ctx, mode, report, app, made_with))
    return a


def completion_marker(config: NsysConfig) -> str:
    """<report>.args, written last, once the report, its export and tables are in place: the nsys command line
    and the report's size. A report whose profile was cut short (its wrapper killed), or replaced since, has none
    that matches: it is never reused, nor replaced (own_name)."""
    return f"{config.made_with}\n# complete: a report of {config.file('.nsys-rep').stat().st_size} bytes\n"


def report_action(config: NsysConfig, args: argparse.Namespace) -> str:
    """profile (nothing there, or --force); reuse (a complete report made with these arguments); kept (one made
    with others); taken (files nsys_run.sh did not make: no completion marker names the report beside them)."""
    if not config.held():
        return "profile"
    with contextlib.suppress(OSError, UnicodeDecodeError):
        made_with, _, complete = config.file(".args").read_text().rstrip("\n").rpartition("\n")
        if f"{made_with}\n{complete}\n" == completion_marker(dataclasses.replace(config, made_with=made_with)):
            return "profile" if args.force else "reuse" if made_with == config.made_with else "kept"
    return "taken"


def own_name(config: NsysConfig, args: argparse.Namespace) -> NsysConfig:
    """`config` under the first of its name, <name>-2, -3, ... not taken by another's files: a file nsys_run.sh
    did not make is never replaced (said in one line)."""
    names = (dataclasses.replace(config, report=config.report + f"-{n}" * (n > 1)) for n in itertools.count(1))
    named = next(c for c in names if report_action(c, args) != "taken")
    if named.report != config.report:
        nsys_say(f"note: {', '.join(config.held())} in {Path(config.report).parent} not made by nsys_run.sh (no "
                 f"completion marker): kept; this profile is {named.report}")
    return named


def check_with_bench_e2e(args: argparse.Namespace) -> int:
    """bench_e2e.py --dry-run of the plan (its first mode): sizes and options checked before anything runs."""
    if args.dry_run:
        print(f"nsys_run.sh: the arguments, checked by bench_e2e.py --dry-run (its plan for --mode {args.mode[0]} "
              "alone; the profiles follow below):", flush=True)
    return subprocess.run([sys.executable, BENCH_E2E, "--size", *args.size, "--context-length",
                           *map(str, args.context_length), "--mode", args.mode[0], "--in-process",
                           *args.extra, "--handout", args.handout, "--dry-run"],
                          stdout=None if args.dry_run else subprocess.DEVNULL).returncode


def nsys_dry_run(args: argparse.Namespace) -> int:
    print(f"\nnsys_run.sh: dry run: {len(args.plan)} configuration(s), one nsys profile each, in this order:")
    for i, config in enumerate(args.plan, 1):
        todo = {"reuse": "reuse the existing report",
                "kept": "keep the existing report, made with other arguments: fails (--force replaces it)",
                "profile": "profile again, replacing the report (--force)" if config.held() else "profile"}
        print(f"  {i}. {config.label()} -> {config.report}: {todo[report_action(config, args)]}")
    print(f"each: nsys profile {' '.join(args.nsys_options)} --output=<report> {sys.executable} bench_e2e.py "
          f"{' '.join(args.plan[0].app)} ...")
    if not args.no_skip:
        print("after an OOM, the larger contexts of that size and mode are skipped (--no-skip runs them)")
    print("nothing was profiled or written (drop --dry-run to run them)")
    return 0


def run_under_nsys(config: NsysConfig, args: argparse.Namespace, nsys: str, staging: Path) -> int:
    """`nsys profile` of bench_e2e.py in its own process group (SIGTERM, SIGKILL after 30 s on an interrupt, or
    when this process dies), its report and bench_e2e's record (<report>_e2e.*) written into `staging`."""
    staged = staging / Path(config.report).name
    with tempfile.TemporaryDirectory(prefix="nsys_run-") as tmp:
        app = [sys.executable, BENCH_E2E, *config.app, "--results-dir", tmp, "--out", "e2e"]
        nsys_say(f"profiling {config.label()}: bench_e2e.py {' '.join(config.app)}")
        with results.process_group([nsys, "profile", *args.nsys_options, f"--output={staged}", *app],
                                   stdout=subprocess.PIPE, env={**os.environ, REGISTER_ONLY: "0"}) as proc:
            for line in proc.stdout:  # its "wrote" lines name the files kept
                results.emit(line.decode(errors="replace").replace(f"{tmp}/e2e/e2e", f"{config.report}_e2e")
                             .rstrip("\n"))
            proc.wait()
        for made in Path(tmp, "e2e").glob("e2e*"):
            shutil.copyfile(made, f"{staged}_{made.name}")
    return proc.returncode


PROFILE_FILES = (".nsys-rep", ".sqlite", "_e2e.jsonl", "_e2e.md", ".md")  # a profile's files; .args comes last


def profile_one(run: NsysConfig, args: argparse.Namespace, nsys: str) -> dict[str, Any]:
    """Profile (or reuse) one configuration, print its tables and keep them as <report>.md: its summary
    record's status and facts (profiled), with "exit_status": 0, or nsys_run.sh's exit status for it."""
    run = own_name(run, args)  # another's file made there since the plan was named: kept as well
    todo, report = report_action(run, args), run.file(".nsys-rep")
    if todo == "kept":
        nsys_say(f"error: {report} exists, made with other arguments ({run.report}.args); it is kept: --force "
                 "profiles this configuration again, replacing it")
        return {"status": "kept: made with other arguments (--force replaces it)", "exit_status": 1}
    if todo == "reuse":
        nsys_say(f"reusing {report}, made with the same arguments (--force profiles it again)")
        return tables_of(run, run, 0)
    # the new profile is made beside, under a temporary name: the earlier files are replaced only once the new
    # ones exist, and an interrupted or refused run leaves them as they were
    folder, name = Path(run.report).parent, Path(run.report).name
    folder.mkdir(parents=True, exist_ok=True)
    remove_orphaned_staging(folder, name)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.partial-{socket.gethostname()}-{os.getpid()}-", dir=folder))
    try:
        status = run_under_nsys(run, args, nsys, staging)
        if status == 2:  # bench_e2e's usage error (its arguments are checked before nsys starts: a later mode)
            nsys_say("error: the profiled bench_e2e.py refused its arguments (exit status 2); nothing of it was "
                     "kept")
            return {"status": "refused: bench_e2e.py's usage error (exit status 2)", "exit_status": 2}
        return tables_of(run, dataclasses.replace(run, report=str(staging / Path(run.report).name)), status)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def remove_orphaned_staging(folder: Path, name: str) -> None:
    """The staging folders of `name` whose nsys_run.sh was killed with -9 (its process on this machine is gone):
    removed, partial report and all. A live run's, another machine's, or a folder not named by us is left."""
    for staging in folder.glob(f".{glob.escape(name)}.partial-*"):
        host, pid, _ = (staging.name.split(".partial-", 1)[1].rsplit("-", 2) + ["", ""])[:3]
        if (host == socket.gethostname() and pid.isdigit() and not results.alive(int(pid))
                and staging.is_dir() and not staging.is_symlink()):
            shutil.rmtree(staging, ignore_errors=True)


def tables_of(run: NsysConfig, made: NsysConfig, status: int) -> dict[str, Any]:
    """The tables of the profile `made` (the reused one, or a new one beside), printed; a new one's files then
    replace `run`'s, the completion marker last."""
    jsonl, report = made.file("_e2e.jsonl"), run.file(".nsys-rep")
    said = ""  # the status the profiled run recorded
    with contextlib.suppress(ProfileFormatError):
        said = str(last_e2e_record(jsonl).get("status", ""))
    if status:
        nsys_say(f"the profiled run failed with exit status {status}")
        return {"status": said or f"failed: the profiled run's exit status was {status}", "exit_status": status}
    if not made.file(".nsys-rep").is_file() and said not in ("", *FINISHED):  # bench_e2e exits 0 when it failed
        nsys_say(f'nsys wrote no {report}: the profiled run recorded "status": "{said}"')
        return {"status": said, "exit_status": 1}
    if not made.file(".nsys-rep").is_file():
        nsys_say(f"nsys wrote no {report}: the 'measure' range never started (no NVTX range of bench_e2e reached "
                 "nsys)")
        return {"status": "failed: nsys wrote no report (the measure range never started)", "exit_status": 1}
    value = profiled(made.report)
    if "tables" not in value:
        nsys_say(f"no tables for {report}: {value['status']}")
        return {**value, "exit_status": 1}
    text = profile_header(value.get("environment"), report) + "\n\n" + render_tables(value.pop("tables"))
    results.replace_text(made.file(".md"), text + "\n")
    if made is not run:
        run.file(".args").unlink(missing_ok=True)  # the earlier set's marker: it no longer names these files
        for suffix in PROFILE_FILES:
            if made.file(suffix).exists():
                os.replace(made.file(suffix), run.file(suffix))
        results.replace_text(run.file(".args"), completion_marker(run))
    if results.emit(text):
        results.emit(f"\nwrote {run.report}.md\nreport: {report} (open it with nsys-ui, the Nsight Systems GUI)")
    return {**value, "exit_status": 0}


def nsys_run_main(argv: list[str]) -> int:
    args = parse_nsys_run_args(argv)
    if status := check_with_bench_e2e(args):  # bench_e2e's one line, not nsys's start and end around it
        return status  # a mistyped option fails in seconds, not after the first hour of a sweep
    args.plan = [own_name(config, args) for config in args.plan]  # the names the summary and the dry run show
    if args.dry_run:
        return nsys_dry_run(args)
    nsys, why = find_nsys()
    if nsys is None:
        first = args.plan[0]
        print(f"nsys_run.sh: error: {why}; {INSTALL_HINT}. Without nsys, torch.profiler gives the same "
              f"tables: python3 bench_e2e.py --size {first.size} --context-length {first.context_length} "
              f"--mode {first.mode} --profile", file=sys.stderr)
        return 2
    for name in [flag.split("=")[0] for flag in args.pass_through]:
        known = subprocess.run([nsys, "profile", "--help"], capture_output=True, text=True).stdout
        if not re.search(rf"(^|[\s,]){re.escape(name)}=", known):
            version = subprocess.run([nsys, "--version"], capture_output=True, text=True).stdout.strip()
            nsys_say(f"error: {version or nsys} does not know {name} (not in its nsys profile --help): it needs "
                     "a newer Nsight Systems")
            return 2
    folder = Path(args.results_dir, "nsys")
    created = [f for f in (folder, *folder.parents) if not f.exists()]
    # nsys runs each profile in a process of its own: the sweep measures in this one (no child, no time limit)
    # one configuration: its refusal or failure in its own line, without the sweep's progress lines around it
    args.in_process, args.timeout, args.quiet, args.fmt = True, None, len(args.plan) == 1, "github"
    files = results.ResultFiles(args.results_dir, "nsys", None, "summary") if len(args.plan) > 1 else None
    records, code = run_configurations(functools.partial(profile_one, args=args, nsys=nsys), args.plan, files, args,
                                       name="nsys_run", device=None, render=render_summary)
    for made in created:  # the folders made for this run, when nothing is in them (a refused profile)
        with contextlib.suppress(OSError):
            made.rmdir()
    if code:
        nsys_say("nsys and the profiled run stopped; finished reports are kept")
        return code
    if files is not None:
        results.emit("")
        files.publish(lambda fmt: render_summary(records, fmt), args.fmt)
    failures = [r.get("exit_status", 1) for r in records if not r["status"].startswith("skipped")]
    return next((status for status in failures if status), 0)  # an error row (a crash here) has none: 1


if __name__ == "__main__":
    sys.exit(nsys_run_main(sys.argv[1:]))
