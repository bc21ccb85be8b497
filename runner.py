"""Running a script's configurations, each in a fresh child process, so that an OOM, a crash or a poisoned CUDA
context never reaches the next row: a failure is a row (OOM, `error: ...`, `timeout after N s`), the larger sizes of
a group are skipped after an OOM, each record is appended and the report rewritten as it finishes, SIGTERM and
Ctrl-C keep the finished rows, and progress goes to stderr with a heartbeat naming a long configuration's phase.

    plan = runner.comparisons(runs, RunConfig.comparison_key)  # the variants of one comparison as one list
    records, code = runner.run_configurations(measure, plan, files, args, name="bench_e2e", device=device,
                                              finish=finish_record, render=live, measure_variants=measure_together)

A comparison's variants are interleaved, so that a machine that changes speed changes it for all of them alike:
--interleave steps (the default) measures them in one child, the script's measure_variants alternating their blocks
of timed steps through interleave(), or each alone if that child fails; --interleave runs gives each variant
children of its own, --repeats whole runs alternating A B B A (interleave() too). docs/running.md tells the rest.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
from dataclasses import dataclass
import functools
import itertools
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import signal
import sys
import threading
import timeit
import traceback
import uuid
from typing import Any, Callable

import torch

import results
import parallel
from common import environment, failure_status
from results import ResultFiles, SkipAfterOOM, Terminated, finished, is_oom_status, progress, sigterm_as_interrupt
from results import round_order

# ---- the toolkit's modules, in every process ----

HERE = os.path.dirname(os.path.abspath(__file__))


def safe_sys_path(path: list[str]) -> list[str]:
    """`path` with this folder first and without the working directory, where a student's optim.py would replace
    ours: their code is imported from there only where a flag names it (common.load)."""
    cwd = os.getcwd()
    return [HERE] + [p for p in path if os.path.abspath(p or ".") not in (HERE, cwd)]


# ---- child processes ----

# Imported once by the fork server, so a child starts in ~0.1 s (a fresh interpreter: 6-9 s, and 3-5 s more for
# torch._dynamo). None touches CUDA at import: a driver initialised before fork() is unusable in the children.
PRELOAD = ["__main__", "torch", "torch._dynamo", "torch.optim", "common", "model", "optim", "runner"]
HEARTBEAT_S = 10.0  # at most one heartbeat line per this many seconds
EXIT_PARENT_GONE = 75  # what a child exits with when its parent is gone (nobody reads it)
STOP_GRACE_S = 5.0  # after SIGTERM, how long a child has to exit before SIGKILL
STOP_POLL_S = 0.2  # how often stop_when() is asked while a child runs
_server: list[Any] = []  # the forkserver context, once started


def _fork_server(fn: Callable, kwargs: dict[str, Any]) -> Any:
    """The forkserver context, started on first use with PRELOAD and the modules of `fn` and its arguments.
    Children fork from the server: no CUDA context, threads or locks of this process. The server runs `python -c`,
    which puts the working directory first on its path (3.11 ignores the path it is handed): it starts with
    PYTHONSAFEPATH (no such entry) and this folder first on PYTHONPATH."""
    if not _server:
        ctx = multiprocessing.get_context("forkserver")
        todo, modules = [fn, *kwargs.values()], []
        while todo:
            f = todo.pop()
            if isinstance(f, functools.partial):
                todo += [f.func, *f.args, *f.keywords.values()]
            elif callable(f) and getattr(f, "__module__", None):
                modules.append(f.__module__)
        ctx.set_forkserver_preload(PRELOAD + list(dict.fromkeys(modules)))
        saved = {key: os.environ.get(key) for key in ("PYTHONSAFEPATH", "PYTHONPATH")}
        paths = [HERE] + ([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else [])
        os.environ.update(PYTHONSAFEPATH="1", PYTHONPATH=os.pathsep.join(paths))
        # Ctrl-C reaches the whole process group, but only the parent acts on it (it stops the children): the
        # server starts with SIGINT ignored, which exec and fork keep, so no traceback mid-import or mid-fork
        main = threading.current_thread() is threading.main_thread()  # where signal handlers can be set
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            if main:
                signal.signal(signal.SIGINT, handler)
            for key, value in saved.items():
                if value is None:
                    del os.environ[key]
                else:
                    os.environ[key] = value
        _server.append(ctx)
    return _server[0]


def _watch_parent(lifeline: Any) -> None:
    """Exit when the parent is gone, even killed with -9: only it holds the other end of `lifeline`. (Not
    PR_SET_PDEATHSIG: our OS parent is the fork server, which outlives the parent while children hold its pipe.)"""
    def wait() -> None:
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv()
        os._exit(EXIT_PARENT_GONE)

    threading.Thread(target=wait, daemon=True, name="parent-watch").start()


def _child_main(result: Any, lifeline: Any, fn: Callable, kwargs: dict[str, Any], environ: dict[str, str], cwd: str,
                path: list[str], beats: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us (the server's children ignore it already)
    _watch_parent(lifeline)
    os.environ.clear()  # the server started earlier: the parent's environment, folder and path as they are now
    os.environ.update(environ)
    os.chdir(cwd)
    sys.path[:] = safe_sys_path(path)
    if beats is not None:
        _tell.append(beats.send)
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
    """The kernel's OOM-kill counters, system-wide and this cgroup's (a container's limit); None where unreadable."""
    def read(path: str | None, key: str) -> int | None:
        with contextlib.suppress(OSError, ValueError, TypeError):
            with open(path) as f:
                return next(int(line.split()[1]) for line in f if line.split()[0] == key)
        return None

    cgroup = None
    with contextlib.suppress(OSError):
        with open("/proc/self/cgroup") as f:
            cgroup = next((f"/sys/fs/cgroup{line[3:].strip()}/memory.events" for line in f if line.startswith("0::")),
                          None)
    return read("/proc/vmstat", "oom_kill"), read(cgroup, "oom_kill")


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
    """`fn(**kwargs)` (module-level, returning a picklable value) in a fresh child of the fork server: {"ok": True,
    "value": ..., "pid": ...} or {"ok": False, "status": "OOM" | "error: ..." | "timeout after N s", ...}. The child
    is stopped after `timeout_s`, when `stop_when()` returns a status (a torchrun peer failed), or on Ctrl-C (which
    propagates). `on_heartbeat(line)` gets `<phase>... <s> s` every HEARTBEAT_S, written here: nothing runs in the
    child beside its work. `in_process`: here, failures alike, without isolation, time limit or heartbeat."""
    if in_process:
        return _run_here(fn, kwargs)
    ctx = _fork_server(fn, kwargs)
    result_r, result_w = ctx.Pipe(duplex=False)
    lifeline_r, lifeline_w = ctx.Pipe(duplex=False)
    beats_r, beats_w = ctx.Pipe(duplex=False) if on_heartbeat else (None, None)
    proc = ctx.Process(target=_child_main, daemon=True, args=(result_w, lifeline_r, fn, kwargs, dict(os.environ),
                                                               os.getcwd(), list(sys.path), beats_w))
    oom_before = oom_kill_counts()
    start = timeit.default_timer()
    deadline = None if timeout_s is None else start + timeout_s
    next_line, doing = start + HEARTBEAT_S, "setting up"
    try:
        proc.start()
        for end in (result_w, lifeline_r, beats_w):
            if end is not None:
                end.close()
        waiting = [c for c in (result_r, proc.sentinel, beats_r) if c is not None]
        while True:
            wakes = [t for t in (deadline, next_line if on_heartbeat else None) if t is not None]
            wait_s = max(0.0, min(wakes) - timeit.default_timer()) if wakes else None
            if stop_when is not None:
                wait_s = STOP_POLL_S if wait_s is None else min(wait_s, STOP_POLL_S)
            ready = multiprocessing.connection.wait(waiting, wait_s)
            if beats_r in ready:
                try:
                    doing = beats_r.recv()
                except (EOFError, OSError):  # the child is finishing
                    waiting.remove(beats_r)
            now = timeit.default_timer()
            if on_heartbeat and now >= next_line:
                on_heartbeat(f"{doing}... {now - start:.0f} s")
                next_line = now + HEARTBEAT_S
            if result_r in ready or proc.sentinel in ready:
                break
            if deadline is not None and now >= deadline:
                _stop(proc)
                return {"ok": False, "status": f"timeout after {timeout_s:g} s"}
            if stop_when is not None and (reason := stop_when()):
                _stop(proc)
                return {"ok": False, "status": reason}
        try:
            answer = result_r.recv() if result_r.poll() else None
        except EOFError:
            answer = None
        if answer is None:  # died without a word: a segfault, the OOM killer, os._exit
            proc.join()
            return died_status(proc.exitcode, oom_before, oom_kill_counts())
        proc.join(STOP_GRACE_S)
        if proc.is_alive():  # answered, but its teardown is stuck: the answer stands
            _stop(proc)
        return answer
    except KeyboardInterrupt:
        if proc.pid is not None:
            _stop(proc)
        raise
    finally:
        for end in (lifeline_w, result_r, beats_r):
            if end is not None:
                end.close()


def _run_here(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"ok": True, "value": fn(**kwargs), "pid": os.getpid()}
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a failure is data; Ctrl-C is not
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return {"ok": False, "status": failure_status(exc), "traceback": traceback.format_exc(), "pid": os.getpid()}


# ---- progress: what a configuration does now ----

_tell: list[Callable[[str], None]] = []  # in a child: the pipe through which phase() tells the parent
_told_at = [0.0]


def phase(name: str) -> None:
    """Name what this configuration does now (untimed code): the heartbeat says it. A no-op outside a child."""
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
INTERLEAVE = ("steps", "runs")


def time_limit(timeout_s: float | None, slowest_s: float) -> float | None:
    """--timeout (0 = none), or the larger of 15 min and 10x the slowest configuration so far (doubling a
    sequence length multiplies a quadratic cost by 4: 10x leaves 2.5x for a busy machine)."""
    if timeout_s is not None:
        return timeout_s or None
    return max(TIMEOUT_FLOOR_S, TIMEOUT_FACTOR * slowest_s)


def add_sweep_args(parser: argparse.ArgumentParser, compares: bool = False) -> None:
    """--in-process, --timeout, --no-skip, --quiet; with `compares`, --interleave and --repeats too."""
    parser.add_argument("--in-process", action="store_true",
                        help="run every configuration in this process instead of a fresh child process each "
                             "(no isolation and no --timeout; see docs/running.md)")
    parser.add_argument("--timeout", type=results.non_negative_float, default=None, metavar="SECONDS",
                        help="time limit of one configuration, after which its child is killed and the row says "
                             f"'timeout after N s'; 0 = none (default: the larger of {TIMEOUT_FLOOR_S // 60} min "
                             f"and {TIMEOUT_FACTOR}x the slowest configuration so far)")
    parser.add_argument("--no-skip", action="store_true",
                        help="after an OOM, still run the larger sizes (context / sequence lengths) of that group")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress on stderr: neither the start and end line of each configuration nor the "
                             f"heartbeat (its phase, at most every {HEARTBEAT_S:g} s) during a long one")
    if compares:
        parser.add_argument("--interleave", choices=INTERLEAVE, default="steps",
                            help="how the variants of a comparison are timed: steps = in one process, their timed "
                                 "steps alternating in rounds (A B B A ...); runs = each in its own process, "
                                 "--repeats whole runs alternating. See docs/running.md")
        parser.add_argument("--repeats", type=results.step_count, default=1,
                            help="--interleave runs: whole runs of every variant, alternating A B B A (2 or more "
                                 "give the speed-up an interval)")


def check_sweep_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A --repeats that cannot apply is a user mistake."""
    if getattr(args, "repeats", 1) > 1 and args.interleave != "runs":
        parser.error("--repeats applies to --interleave runs (with steps, the rounds are within one process)")


# ---- interleaving ----


def interleave(variants: int, rounds: int, run_block: Callable[[int, int], None]) -> None:
    """The interleaving loop of every comparison: `rounds` rounds, each calling run_block(variant, round) once per
    variant in round_order (A B | B A | A B ...), so that a machine that speeds up or slows down as time goes by
    does so for every variant alike. bench_e2e.py and bench_attention.py run their blocks of timed steps through
    it; the sweep its --interleave runs children."""
    for r in range(rounds):
        for variant in round_order(variants, r):
            run_block(variant, r)


# ---- the sweep ----


def comparisons(runs: list[Any], key: Callable[[Any], Any]) -> list[Any]:
    """A plan: the runs with an equal key(run) (not None) as one list, the variants of one comparison, where the
    first of them stood."""
    plan: list[Any] = []
    groups: dict[Any, list[Any]] = {}
    for run in runs:
        k = key(run)
        if k is None:
            plan.append(run)
        elif k in groups:
            groups[k].append(run)
        else:
            groups[k] = [run]
            plan.append(groups[k])
    return plan


def merge_repeats(values: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, list[list[int]]]]:
    """A configuration's records from its --repeats children as one: samples concatenated, the largest peaks,
    every child's compile_s (the first is quoted: later ones find torch's caches warm), the load around them all;
    and which samples came from which child, per phase: {phase: [[start, stop) per repetition]}."""
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
                       args: argparse.Namespace, *, name: str, device: torch.device,
                       finish: Callable[[Any, dict], None] | None = None,
                       render: Callable[[list[dict], str], str] | None = None,
                       summary: Callable[[dict], str] | None = None,
                       measure_variants: Callable[[list], list[dict]] | None = None,
                       resize: Callable[[Any, int], Any] | None = None,
                       search: bool = False) -> tuple[list[dict], int]:
    """Run every configuration of `plan` (a run, or a list of runs: the variants of one comparison) as
    add_sweep_args' flags say. Each run has label() and skip_key() -> (group, size name, size);
    measure(run) (module-level) returns its record in the child; measure_variants(runs) the records of a
    comparison's variants measured together in one child (None: each in children of its own). In this process,
    finish(run, record) adds derived figures to every row, `render(records, fmt)` is the report rewritten after
    each row, summary(record) the end of a finished row's progress line.

    Returns (records, exit status: 0, 130 after Ctrl-C, 143 after SIGTERM); an interrupted sweep keeps its rows.
    search=True: each group's runs are the probes of a search, in increasing size: its first failure ends them,
    and after an OOM that follows a fit a bisection between the two adds probes made by resize(run, size) (bounded
    by args.search_resolution and args.search_probes). Under torchrun (runs with .parallel set) every rank runs
    each configuration at once and gets the same records; only rank 0 (files given) prints and writes."""
    units = [unit if isinstance(unit, list) else [unit] for unit in plan]
    runs = [run for unit in units for run in unit]
    launch = parallel.torchrun_launch() if any(getattr(run, "parallel", None) for run in runs) else None
    ranks = parallel.RankSweep(launch) if launch else None
    state: Sweep | None = None
    with sigterm_as_interrupt():
        try:
            env = sweep_environment(device, args.in_process)
            state = Sweep(measure, runs, files, args, env, ranks, name=name, finish=finish, render=render,
                          summary=summary, measure_variants=measure_variants, resize=resize, search=search)
            index = itertools.count()  # a run's index: the same on every torchrun rank
            for unit in units:
                state.run_unit([(next(index), run) for run in unit])
            if ranks is not None:
                ranks.finish()
        except KeyboardInterrupt as exc:
            how, code = ("SIGTERM", 128 + signal.SIGTERM) if isinstance(exc, Terminated) else ("Ctrl-C", 130)
            records = state.records if state else []
            kept = f"; finished rows are in {files.markdown} and {files.jsonl}" if records and files else ""
            if parallel.is_rank_zero():  # said even under --quiet: where the finished rows are
                progress(f"interrupted by {how} after {len(records)} of {state.total if state else len(runs)} "
                         f"configurations{kept}")
            return records, code
    return state.records, 0


def sweep_environment(device: torch.device, in_process: bool) -> dict[str, Any]:
    """The environment of rows that carry none (failed, skipped), read in a child: this process never touches CUDA."""
    answer = run_isolated(environment, {"device": device}, in_process=in_process, timeout_s=TIMEOUT_FLOOR_S)
    return answer["value"] if answer["ok"] else {"device": str(device), "status": answer["status"]}


def run_on_every_rank(measure: Callable, run: Any, index: int, ranks: Any, timeout_s: float | None,
                      on_heartbeat: Callable[[str], None] | None = None) -> dict[str, Any]:
    """A torchrun configuration: this rank's child joins its process group and measures (stopped when another rank
    fails); then one agreed answer from every rank's (the slowest timings, or "OOM on rank k")."""
    kwargs = {"measure": measure, "run": run, "prefix": ranks.configuration_prefix(index), "device": run.device,
              "timeout_s": run.pg_timeout_s}
    answer = run_isolated(parallel.measure_on_rank, kwargs, timeout_s=timeout_s, stop_when=ranks.peer_failure(index),
                          on_heartbeat=on_heartbeat)
    # the others may run up to their own time limit before they answer; without one, up to a day
    answers = ranks.exchange(index, answer, (timeout_s or 24 * 3600) + 2 * run.pg_timeout_s)
    return parallel.agreed_answer(answers, parallel.merge_rank_records)


# ---- --context-length max: after the first OOM, bisect between it and the longest context that ran ----

RESOLUTION = 64  # the bisection's default step: the answer is a multiple of it (kernels like multiples of 64)
PROBE_BUDGET = 8  # bisection probes at most per search (from 64 to 65536 takes 10)


@dataclass
class Bisection:
    """Between `fits` (the longest that ran) and `fails` (the shortest that ran out of memory): each probe tries
    the middle multiple of `resolution` strictly between them, until none is left or `budget` probes are spent."""

    fits: int
    fails: int
    resolution: int = RESOLUTION
    budget: int = PROBE_BUDGET
    probes: int = 0

    def next_size(self) -> int | None:
        low, high = self.fits // self.resolution + 1, -(-self.fails // self.resolution) - 1  # multiples inside
        return None if low > high or self.probes >= self.budget else (low + high) // 2 * self.resolution

    def record(self, size: int, fits: bool) -> None:
        self.probes += 1
        self.fits, self.fails = (max(self.fits, size), self.fails) if fits else (self.fits, min(self.fails, size))

    @property
    def resolved(self) -> bool:
        return self.fits // self.resolution + 1 > -(-self.fails // self.resolution) - 1


class Sweep:
    """The state of one run_configurations: records so far, the skip rule, progress counts, searches."""

    def __init__(self, measure: Callable, runs: list[Any], files: ResultFiles | None, args: argparse.Namespace,
                 env: dict[str, Any], ranks: Any, **options: Any):
        self.measure, self.runs, self.files, self.args, self.env, self.ranks = measure, runs, files, args, env, ranks
        self.name, self.search = options["name"], options["search"]
        self.finish, self.render, self.summary = options["finish"], options["render"], options["summary"]
        self.measure_variants, self.resize = options["measure_variants"], options["resize"]
        self.records: list[dict[str, Any]] = []
        self.skip = SkipAfterOOM(enabled=not args.no_skip)
        self.ended: set = set()  # search: the groups whose search has ended
        self.fits: dict = {}  # search: the longest size of each group that ran
        self.slowest_s, self.total, self.done = 0.0, len(runs), 0
        self.next_index = len(runs)  # bisection probes' indices (the same on every torchrun rank)
        self.mode = getattr(args, "interleave", "runs")
        self.repeats = getattr(args, "repeats", 1) if self.mode == "runs" else 1
        self.loud = parallel.is_rank_zero() and not args.quiet

    def say(self, message: str) -> None:
        if self.loud:
            progress(message)

    def beat(self, prefix: str) -> Callable[[str], None] | None:
        return (lambda line: progress(f"{prefix} {line}")) if self.loud else None

    def limit(self, count: int = 1) -> float | None:
        single = time_limit(self.args.timeout, self.slowest_s)
        return None if single is None else single * count

    def record_of(self, run: Any, answer: dict[str, Any] | None) -> dict[str, Any]:
        record = {"experiment": self.name, "config": dataclasses.asdict(run), "label": run.label()}
        if answer is not None and answer["ok"]:
            record.update(answer["value"])
            record.setdefault("status", "ok")
            if answer.get("pid") is not None:
                record["pid"] = answer["pid"]
        elif answer is not None:
            record.update({k: v for k, v in answer.items() if k != "ok"})
        return record

    def add(self, run: Any, record: dict[str, Any], number: int, elapsed: float) -> None:
        group, _, size = run.skip_key()
        self.skip.record(group, size, record["status"])
        if not is_oom_status(record["status"]) and not record["status"].startswith(("skipped", "timeout")):
            self.slowest_s = max(self.slowest_s, elapsed)
        record.setdefault("environment", self.env)
        if self.finish is not None:
            self.finish(run, record)
        self.records.append(record)
        if self.files is not None:
            self.files.append_record(record)
            if self.render is not None:
                self.files.write_report(lambda fmt: self.render(self.records, fmt), self.args.fmt)
        said = self.summary(record) if self.summary and finished(record) else record["status"]
        self.say(f"[{number}/{self.total}] {run.label()}: {said} ({elapsed:.1f} s)")

    def run_unit(self, unit: list[tuple[int, Any]]) -> None:
        """A comparison's variants (or one run): skipped ones are rows; the rest together or each in its children."""
        todo = []
        for i, run in unit:
            group, size_name, size = run.skip_key()
            if self.search and group in self.ended:
                continue
            if reason := self.skip.reason(group, size_name, size):
                self.done += 1
                self.say(f"[{self.done}/{self.total}] starting {run.label()}")
                self.add(run, {**self.record_of(run, None), "status": reason}, self.done, 0.0)
            else:
                todo.append((i, run))
        if len(todo) > 1 and self.mode == "steps" and self.measure_variants is not None:
            self.together(todo)
        elif todo:
            self.interleave_runs(todo)

    def alone(self, run: Any, index: int, number: int, note: str = "") -> tuple[dict[str, Any], float]:
        self.say(f"[{number}/{self.total}] starting {run.label()}{note}")
        beat, start = self.beat(f"[{number}/{self.total}]"), timeit.default_timer()
        if self.ranks is not None:
            answer = run_on_every_rank(self.measure, run, index, self.ranks, self.limit(), beat)
        else:
            answer = run_isolated(self.measure, {"run": run}, in_process=self.args.in_process,
                                  timeout_s=self.limit(), on_heartbeat=beat)
        return answer, timeit.default_timer() - start

    def together(self, todo: list[tuple[int, Any]]) -> None:
        """The variants in one child (measure_variants); if it fails, each alone: an OOM row is always a real one."""
        where = f"[{self.done + 1}-{self.done + len(todo)}/{self.total}]"
        labels = [run.label() for _, run in todo]
        self.say(f"{where} starting {len(todo)} variants, interleaved: {' | '.join(labels)}")
        start = timeit.default_timer()
        answer = run_isolated(self.measure_variants, {"runs": [run for _, run in todo]},
                              in_process=self.args.in_process, timeout_s=self.limit(len(todo)),
                              on_heartbeat=self.beat(where))
        elapsed = (timeit.default_timer() - start) / len(todo)
        if not answer["ok"]:
            self.say(f"{where} the interleaved child failed ({answer['status']}): measuring each variant alone")
            self.interleave_runs(todo, fallback=answer["status"])
            return
        for (_, run), value in zip(todo, answer["value"]):
            record = self.record_of(run, {"ok": True, "value": value, "pid": answer.get("pid")})
            if "pairing" in record:
                record["pairing"]["labels"] = labels
            self.done += 1
            self.add(run, record, self.done, elapsed)

    def interleave_runs(self, todo: list[tuple[int, Any]], fallback: str | None = None) -> None:
        """The interleaving of runs: each in children of its own, `repeats` rounds (interleave: A B | B A),
        its children's records merged and paired with the others' by round. A failure ends that run's repeats;
        Ctrl-C keeps what finished; a search's probe may go on to a bisection."""
        group, labels = uuid.uuid4().hex[:12], [run.label() for _, run in todo]
        answers: dict[int, list[tuple[dict, float]]] = {i: [] for i, _ in todo}
        numbers: dict[int, int] = {}
        ended: set[int] = set()
        added: list[int] = []

        def add_in_order(interrupted: bool = False) -> None:
            for position, (i, run) in enumerate(todo[len(added):], len(added)):
                if i not in ended and not (interrupted and answers[i]):
                    return
                added.append(i)
                self.add_repeats(run, answers[i], numbers[i], position, group, labels, fallback)

        def run_child(position: int, r: int) -> None:
            i, run = todo[position]
            if i in ended:
                return
            if i not in numbers:
                self.done += 1
                numbers[i] = self.done
            note = f" (repeat {r + 1}/{self.repeats})" if self.repeats > 1 else ""
            answers[i].append(self.alone(run, i, numbers[i], note))
            if r == self.repeats - 1 or not answers[i][-1][0]["ok"]:
                ended.add(i)
                add_in_order()

        try:
            interleave(len(todo), self.repeats, run_child)
        except KeyboardInterrupt:
            add_in_order(interrupted=True)
            raise
        if self.search and len(todo) == 1:
            self.bisect(todo[0][1], self.records[-1])

    def add_repeats(self, run: Any, answers: list[tuple[dict, float]], number: int, position: int, group: str,
                    labels: list[str], fallback: str | None) -> None:
        elapsed = sum(seconds for _, seconds in answers)
        oks = [answer for answer, _ in answers if answer["ok"]]
        failed = next((answer for answer, _ in answers if not answer["ok"]), None)
        if failed is not None or any("status" in answer["value"] for answer in oks):
            record = self.record_of(run, failed or oks[0])
            if failed is not None and oks:
                record["repeats_before_failure"] = len(oks)
        else:
            value, bounds = merge_repeats([answer["value"] for answer in oks])
            record = self.record_of(run, {"ok": True, "value": value, "pid": oks[0].get("pid")})
            if len(oks) > 1:
                record["pids"] = [answer.get("pid") for answer in oks]
            if len(labels) > 1 and bounds:
                rounds = next(iter(bounds.values()))
                record["pairing"] = {"group": group, "mode": "runs", "position": position, "variants": len(labels),
                                     "rounds": rounds, "labels": labels}
                if any(b != rounds for b in bounds.values()):
                    record["pairing"]["rounds_by_phase"] = bounds
        if fallback:
            record["interleave_fallback"] = f"measured alone: the interleaved child failed ({fallback})"
        if self.search:
            record["search_probe"] = "doubling"
            self.note_probe(run, record)
        self.add(run, record, number, elapsed)

    def note_probe(self, run: Any, record: dict[str, Any]) -> None:
        """A fit moves the search on; its first failure ends the group's planned probes (and shrinks the count)."""
        group, _, size = run.skip_key()
        if finished(record):
            self.fits[group] = max(self.fits.get(group, size), size)
        elif group not in self.ended:
            self.ended.add(group)
            self.total -= sum(1 for later in self.runs if later.skip_key()[0] == group and later.skip_key()[2] > size)

    def bisect(self, run: Any, record: dict[str, Any]) -> None:
        """After a search's first OOM that follows a fit, search.Bisection between them, a child per probe."""
        group, _, size = run.skip_key()
        if not is_oom_status(record["status"]) or group not in self.fits or self.resize is None:
            return
        bisection = Bisection(self.fits[group], size, getattr(self.args, "search_resolution", RESOLUTION),
                              getattr(self.args, "search_probes", PROBE_BUDGET))
        while (next_size := bisection.next_size()) is not None:
            probe = self.resize(run, next_size)
            self.total += 1
            self.done += 1
            answer, elapsed = self.alone(probe, self.next_index, self.done, " (bisection)")
            self.next_index += 1
            probe_record = {**self.record_of(probe, answer), "search_probe": "bisection"}
            self.add(probe, probe_record, self.done, elapsed)
            if finished(probe_record) or is_oom_status(probe_record["status"]):
                bisection.record(next_size, finished(probe_record))
            else:  # an error or a timeout: the bounds stand, the answer says why it stopped
                break
