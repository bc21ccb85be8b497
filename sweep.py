"""Running a script's configurations: each in a fresh child process (isolation.run_isolated), its record appended to
the JSONL and the report rewritten as it finishes, a failure as a row (OOM, error, timeout), the larger sizes of a
group skipped after an OOM, SIGTERM and Ctrl-C keeping the finished rows, progress on stderr.

Comparisons: the variants of one configuration (bench_e2e's --dtype, --compile, --attn, --optimizer values,
bench_attention's --impl values) are measured together, so that a machine that changes speed meanwhile changes it
for all of them alike. --interleave steps (the default): one child builds every variant and alternates their timed
steps in rounds (runner.measure_interleaved); if that child fails (a variant ran out of memory beside the others,
say), each variant is measured alone instead, so that an OOM row is always a real one. --interleave runs: each
variant in a child of its own (its memory peak and OOM its own), `--repeats` whole repetitions alternating A B B A.
Either way each record says how it was paired (`pairing`), and stats.py turns the pairs into a speed-up with an
interval. Searches (bench_e2e's --context-length max): probes doubling up to the first failure, then a bisection
between the last fit and the first OOM (search.Bisection).

Also here: the fault hook for tests (BENCH_INJECT_FAULT), called in the child with the run's fault_fields() before it
is measured; only its `slow:` context reaches measuring code (around each timed block). How a sweep runs is
written up in docs/running.md.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import itertools
import os
import signal
import sys
import time
import timeit
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import cli
import parallel
from common import environment
from isolation import HEARTBEAT_S, run_isolated
from results import ResultFiles, SkipAfterOOM, Terminated, finished, is_oom_status, progress, sigterm_as_interrupt
from search import PROBE_BUDGET, RESOLUTION, Bisection
from stats import round_order

# ---- fault injection (tests) ----

FAULT_ENV = "BENCH_INJECT_FAULT"


SLOW_OP_S = 0.005  # what a `slow:` fault adds to every torch op: far beyond a busy machine's noise


class SlowOps(TorchDispatchMode):
    """The `slow:` fault: while entered, every torch op (forward, backward and the optimizer's alike) first sleeps
    SLOW_OP_S, a slow-down of one variant that no drift of the machine could hide. Entered around each block of
    that variant's timed steps, and left between them."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        time.sleep(SLOW_OP_S)
        return func(*args, **(kwargs or {}))


def injected_fault(fields: dict[str, Any]) -> contextlib.AbstractContextManager:
    """Test hook, so that failure handling is tested end to end without a real fault: with
    `BENCH_INJECT_FAULT="oom:context_length=256,dtype=fp32"` the configuration whose fields all match raises an
    out-of-memory error; `error:` raises RuntimeError; `hang:` sleeps for an hour (a stuck kernel, for --timeout and
    signal tests; it says its pid on stderr); `kill:` SIGKILLs its own process (a crash without a word); `slow:`
    runs it under SlowOps (alone: all of it; in an interleaved comparison: its timed blocks), a drift on one side.
    Clauses are separated by ';'. A condition `field>=N` matches a numeric field at least N
    (`oom:context_length>=1024`: every context from 1024 up runs out of memory, as on a real device). Every
    configuration also matches `rank=` (torchrun's RANK, 0 without torchrun). Read at call time; child processes get
    the parent's value. Returns the context to measure under: a SlowOps for `slow:`, else a null context."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return contextlib.nullcontext()
    fields = {"rank": os.environ.get("RANK", "0"), **fields}  # torchrun's rank: `oom:rank=1,...` fails one rank
    slow = False
    for clause in spec.split(";"):
        kind, _, conditions = clause.partition(":")
        if not all(_fault_condition_holds(c, fields) for c in conditions.split(",") if "=" in c):
            continue
        if kind == "slow":
            slow = True
        elif kind == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory (injected by BENCH_INJECT_FAULT)")
        elif kind == "hang":
            print(f"injected hang in pid {os.getpid()}", file=sys.stderr, flush=True)
            time.sleep(3600)
        elif kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            raise RuntimeError(f"injected failure ({clause})")
    return SlowOps() if slow else contextlib.nullcontext()


def _fault_condition_holds(condition: str, fields: dict[str, Any]) -> bool:
    """`field=value` (compared as text) or `field>=N` (compared as numbers) against a configuration's fields."""
    if ">=" in condition:
        key, _, bound = condition.partition(">=")
        value = fields.get(key)
        return isinstance(value, (int, float)) and value >= float(bound)
    key, _, value = condition.partition("=")
    return str(fields.get(key)) == value


def fault_fields(run: Any) -> dict[str, Any]:
    """The run's own fields for the fault hook (run.fault_fields()); none for a run that names none."""
    return run.fault_fields() if hasattr(run, "fault_fields") else {}


def measured_alone(measure: Callable[..., dict], run: Any) -> dict[str, Any]:
    """In the child: the fault hook with the run's fields, then the script's measure(run=run) under what it
    returned."""
    with injected_fault(fault_fields(run)):
        return measure(run=run)


def measured_together(measure_together: Callable[..., list], runs: list[Any]) -> list[dict[str, Any]]:
    """In the child: the fault hook for each variant, then the script's measure_together(runs, faults), which
    enters faults[i] around variant i's timed steps."""
    return measure_together(runs, [injected_fault(fault_fields(run)) for run in runs])


# ---- signals and time limits ----


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


# ---- the command line ----

INTERLEAVE = ("steps", "runs")


def add_sweep_args(parser: argparse.ArgumentParser, compares: bool = False) -> None:
    """--in-process, --timeout, --no-skip and --quiet, the same in every script that sweeps configurations; with
    `compares`, --interleave and --repeats too (the scripts whose sweeps compare variants)."""
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
    if compares:
        parser.add_argument("--interleave", choices=INTERLEAVE, default="steps",
                            help="how the variants of a comparison are timed: steps = in one process, their timed "
                                 "steps alternating in rounds (A B B A ...); runs = each in its own process, "
                                 "--repeats whole runs alternating. See docs/running.md#comparisons")
        parser.add_argument("--repeats", type=cli.step_count, default=1,
                            help="--interleave runs: whole runs of every variant, alternating A B B A (2 or more "
                                 "give the speed-up an interval)")


def check_sweep_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A --repeats that cannot apply is a user mistake."""
    if getattr(args, "repeats", 1) > 1 and args.interleave != "runs":
        parser.error("--repeats applies to --interleave runs (with steps, the rounds are within one process)")


# ---- the sweep ----


@dataclass(frozen=True)
class Experiment:
    """What a script tells the sweep about itself."""

    name: str  # the script's stem: every record's "experiment"
    measure: Callable[..., dict]  # module-level; measure(run=config) in the child: the configuration's own fields
    finish: Callable[[Any, dict], None]  # in this process, on every record: derived figures, predictions, status
    summary: Callable[[dict], str]  # the end-of-configuration progress line of a finished ("ok") row
    render: Callable[[list[dict], str], str]  # (rows so far, table format) -> the report, rewritten after each row
    # module-level; (runs, faults) -> one record per run: the variants of one comparison in one child. None: the
    # script cannot interleave, and its variants run in children of their own
    measure_together: Callable[[list, list], list[dict]] | None = None
    resize: Callable[[Any, int], Any] | None = None  # (run, size) -> the run at another size: a search's bisection


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
    kwargs = {"measure": functools.partial(measured_alone, experiment.measure), "run": run,
              "prefix": ranks.configuration_prefix(index), "device": run.device, "timeout_s": run.pg_timeout_s}
    answer = run_isolated(parallel.measure_on_rank, kwargs, timeout_s=timeout_s, stop_when=ranks.peer_failure(index),
                          on_heartbeat=on_heartbeat)
    # the others may run up to their own time limit before they answer; without one, up to a day
    answers = ranks.exchange(index, answer, (timeout_s or 24 * 3600) + 2 * run.pg_timeout_s)
    return parallel.agreed_answer(answers, parallel.merge_rank_records)


def comparison_units(runs: list[Any], grouped: bool) -> list[list[int]]:
    """The runs' indices in the order they run, grouped into comparisons: runs that share a comparison_key() are
    the variants of one configuration, measured together where the first of them stands in the plan. Without
    `grouped` (a search), or for a run whose key is None, each run is a unit of its own."""
    units: list[list[int]] = []
    groups: dict[Any, list[int]] = {}
    for i, run in enumerate(runs):
        key = run.comparison_key() if grouped and hasattr(run, "comparison_key") else None
        if key is None:
            units.append([i])
        elif key in groups:
            groups[key].append(i)
        else:
            groups[key] = [i]
            units.append(groups[key])
    return units


def merge_repeats(values: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, list[list[int]]]]:
    """One configuration's records from several children (--repeats) as one: the raw samples (`<phase>_ms` lists)
    concatenated in the order they ran, the largest peaks, the first child's compile time (later children find
    torch's compile caches warm) with every child's beside it, the load before the first and after the last. Also
    returns which samples came from which child, per phase: {phase: [[start, stop) per repetition]} (the phases'
    counts differ where the timer decides them, as do_bench does)."""
    merged = dict(values[0])
    sample_keys = [key for key, value in values[0].items() if key.endswith("_ms") and isinstance(value, list)]
    bounds: dict[str, list[list[int]]] = {}
    for key in sample_keys:
        merged[key] = [x for value in values for x in value[key]]
        ends = list(itertools.accumulate(len(value[key]) for value in values))
        bounds[key.removesuffix("_ms")] = [[end - len(value[key]), end] for end, value in zip(ends, values)]
    for key in ("peak_mem_allocated_bytes", "peak_mem_reserved_bytes"):
        if all(key in value for value in values):
            merged[key] = max(value[key] for value in values)
    if len(values) == 1:
        return merged, bounds
    if "compile_s" in values[0]:
        merged["compile_s_repeats"] = [value.get("compile_s") for value in values]
    if all("load" in value for value in values):
        merged["load"] = {"before": values[0]["load"]["before"], "after": values[-1]["load"]["after"]}
    merged["repeats"] = len(values)
    return merged, bounds


class Sweep:
    """The state of one run_sweep: records so far, the skip rule, progress counts, searches."""

    def __init__(self, experiment: Experiment, runs: list[Any], files: ResultFiles | None, args: argparse.Namespace,
                 search: bool, ranks: parallel.RankSweep | None, env: dict[str, Any]):
        self.experiment, self.runs, self.files, self.args, self.search = experiment, runs, files, args, search
        self.ranks, self.env = ranks, env
        self.records: list[dict[str, Any]] = []
        self.skip = SkipAfterOOM(enabled=not args.no_skip)
        self.ended: set[tuple] = set()  # search: the groups whose search has ended
        self.fits: dict[tuple, int] = {}  # search: the longest size of each group that ran
        self.slowest_s = 0.0
        self.total, self.done = len(runs), 0
        self.next_index = len(runs)  # bisection probes' configuration indices (the same on every torchrun rank)
        self.mode = getattr(args, "interleave", "runs")
        self.repeats = getattr(args, "repeats", 1) if self.mode == "runs" else 1
        rank_zero = parallel.is_rank_zero()
        self.rank_zero = rank_zero
        self.say = progress if rank_zero and not args.quiet else (lambda message: None)

    def beat(self, prefix: str) -> Callable[[str], None] | None:
        return None if self.args.quiet or not self.rank_zero else (lambda line: self.say(f"{prefix} {line}"))

    def limit(self, count: int = 1) -> float | None:
        single = time_limit(self.args.timeout, self.slowest_s)
        return None if single is None else single * count

    def record_of(self, run: Any, answer: dict[str, Any] | None) -> dict[str, Any]:
        """A run's record from the child's answer (its value, or its failure)."""
        record: dict[str, Any] = {"experiment": self.experiment.name, "config": dataclasses.asdict(run),
                                  "label": run.label()}
        if answer is None:
            return record
        if answer["ok"]:
            record.update(answer["value"])
            record.setdefault("status", "ok")
            if "pid" in answer:
                record["pid"] = answer["pid"]
        else:
            record.update({k: v for k, v in answer.items() if k != "ok"})
        return record

    def add(self, run: Any, record: dict[str, Any], number: int, elapsed: float) -> None:
        """A finished row: the skip rule told, derived figures added, appended, the report rewritten, said."""
        group, _, size = run.skip_key()
        self.skip.record(group, size, record["status"])
        if not is_oom_status(record["status"]) and not record["status"].startswith(("skipped", "timeout")):
            self.slowest_s = max(self.slowest_s, elapsed)
        record.setdefault("environment", self.env)
        self.experiment.finish(run, record)
        self.records.append(record)
        if self.files is not None:
            self.files.append_record(record)
            self.files.write_report(lambda fmt: self.experiment.render(self.records, fmt), self.args.fmt)
        said = self.experiment.summary(record) if finished(record) else record["status"]
        self.say(f"[{number}/{self.total}] {run.label()}: {said} ({elapsed:.1f} s)")

    def alone(self, run: Any, index: int, number: int, note: str = "") -> tuple[dict[str, Any], float]:
        """One child for one run (on every rank under torchrun): its answer and seconds."""
        self.say(f"[{number}/{self.total}] starting {run.label()}{note}")
        beat = self.beat(f"[{number}/{self.total}]")
        start = timeit.default_timer()
        if self.ranks is not None:
            answer = run_on_every_rank(self.experiment, run, index, self.ranks, self.limit(), beat)
        else:
            answer = run_isolated(measured_alone, {"measure": self.experiment.measure, "run": run},
                                  in_process=self.args.in_process, timeout_s=self.limit(), on_heartbeat=beat)
        return answer, timeit.default_timer() - start

    def run_unit(self, indices: list[int]) -> None:
        """One unit of the plan (a comparison's variants, or one run): the ones the skip rule or an ended search
        leave out are rows or nothing; the rest are measured together (--interleave steps) or in rounds."""
        todo = []
        for i in indices:
            run = self.runs[i]
            group, size_name, size = run.skip_key()
            if self.search and group in self.ended:
                continue
            if reason := self.skip.reason(group, size_name, size):
                self.done += 1
                self.say(f"[{self.done}/{self.total}] starting {run.label()}")
                self.add(run, {**self.record_of(run, None), "status": reason}, self.done, 0.0)
                continue
            todo.append((i, run))
        if len(todo) > 1 and self.mode == "steps" and self.experiment.measure_together is not None:
            self.together(todo)
        elif todo:
            self.in_rounds(todo)

    def together(self, todo: list[tuple[int, Any]]) -> None:
        """The variants of one comparison in one child; if it fails, each alone (in_rounds)."""
        first, last = self.done + 1, self.done + len(todo)
        labels = [run.label() for _, run in todo]
        self.say(f"[{first}-{last}/{self.total}] starting {len(todo)} variants, interleaved: {' | '.join(labels)}")
        start = timeit.default_timer()
        answer = run_isolated(measured_together, {"measure_together": self.experiment.measure_together,
                                                  "runs": [run for _, run in todo]},
                              in_process=self.args.in_process, timeout_s=self.limit(len(todo)),
                              on_heartbeat=self.beat(f"[{first}-{last}/{self.total}]"))
        elapsed = (timeit.default_timer() - start) / len(todo)
        if not answer["ok"]:
            self.say(f"[{first}-{last}/{self.total}] the interleaved child failed ({answer['status']}): "
                     "measuring each variant alone")
            self.in_rounds(todo, fallback=answer["status"])
            return
        for (i, run), value in zip(todo, answer["value"]):
            record = self.record_of(run, {"ok": True, "value": value, "pid": answer.get("pid")})
            if "pairing" in record:
                record["pairing"]["labels"] = labels
            self.done += 1
            self.add(run, record, self.done, elapsed)

    def in_rounds(self, todo: list[tuple[int, Any]], fallback: str | None = None) -> None:
        """Each run in a child of its own, `repeats` rounds in the order stats.round_order gives (A B | B A ...);
        each run's children merged into one record (merge_repeats), paired with the others by round, and added once
        its last repetition ended and the runs before it in the plan were added (the first is the comparison's
        baseline). A run that fails stops its own repetitions; Ctrl-C keeps what finished. A search's probe (a unit
        of one) may go on to a bisection."""
        group, labels = uuid.uuid4().hex[:12], [run.label() for _, run in todo]
        answers: dict[int, list[tuple[dict, float]]] = {i: [] for i, _ in todo}
        numbers: dict[int, int] = {}
        ended: set[int] = set()  # runs with every repetition done (or a failure)
        added: list[int] = []

        def add_in_order(interrupted: bool = False) -> None:
            for position, (i, run) in enumerate(todo[len(added):], len(added)):
                if i not in ended and not (interrupted and answers[i]):
                    return
                added.append(i)
                self.add_repeats(run, answers[i], numbers[i], position, group, labels, fallback)

        try:
            for r in range(self.repeats):
                for position in round_order(len(todo), r):
                    i, run = todo[position]
                    if i in ended:
                        continue
                    if i not in numbers:
                        self.done += 1
                        numbers[i] = self.done
                    note = f" (repeat {r + 1}/{self.repeats})" if self.repeats > 1 else ""
                    answers[i].append(self.alone(run, i, numbers[i], note))
                    if r == self.repeats - 1 or not answers[i][-1][0]["ok"]:
                        ended.add(i)
                        add_in_order()
        except KeyboardInterrupt:  # the runs that ran are rows
            add_in_order(interrupted=True)
            raise
        if self.search and len(todo) == 1:
            self.bisect(todo[0][1], self.records[-1])

    def add_repeats(self, run: Any, answers: list[tuple[dict, float]], number: int, position: int, group: str,
                    labels: list[str], fallback: str | None) -> None:
        """A run's row from its children's answers: a failure (or a skip) is the row; else their merged record,
        paired with the other variants of its unit (`labels`) by repetition."""
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
                record["pairing"] = {"group": group, "mode": "runs", "position": position, "variants": len(labels),
                                     "rounds": next(iter(bounds.values())), "labels": labels}
                if any(b != record["pairing"]["rounds"] for b in bounds.values()):
                    record["pairing"]["rounds_by_phase"] = bounds
        if fallback:
            record["interleave_fallback"] = f"measured alone: the interleaved child failed ({fallback})"
        if self.search:
            record["search_probe"] = "doubling"
            self.note_probe(run, record)
        self.add(run, record, number, elapsed)

    def note_probe(self, run: Any, record: dict[str, Any]) -> None:
        """A search's planned probe has its outcome: a fit moves the search on; its first failure ends the group's
        planned probes (the progress count shrinks by as many)."""
        group, _, size = run.skip_key()
        if finished(record):
            self.fits[group] = max(self.fits.get(group, size), size)
        elif group not in self.ended:
            self.ended.add(group)
            self.total -= sum(1 for later in self.runs if later.skip_key()[0] == group and later.skip_key()[2] > size)

    def bisect(self, run: Any, record: dict[str, Any]) -> None:
        """After a search's first OOM that follows a fit: the bisection between them (search.Bisection), each
        probe in its own child, until the resolution is reached, the budget spent, or a probe fails otherwise."""
        group, _, size = run.skip_key()
        if not is_oom_status(record["status"]) or group not in self.fits or self.experiment.resize is None:
            return
        bisection = Bisection(self.fits[group], size, getattr(self.args, "search_resolution", RESOLUTION),
                              getattr(self.args, "search_probes", PROBE_BUDGET))
        while (next_size := bisection.next_size()) is not None:
            probe = self.experiment.resize(run, next_size)
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


def run_sweep(experiment: Experiment, runs: list[Any], files: ResultFiles | None, device: torch.device,
              args: argparse.Namespace, search: bool = False) -> tuple[list[dict], int]:
    """Run every configuration (each with label() and skip_key(); fault_fields() and comparison_key() when it has
    them) as add_sweep_args' flags say, appending its record and rewriting the report as each finishes. Returns
    (records, exit status: 0, 130 after Ctrl-C, 143 after SIGTERM). An interrupted sweep keeps the rows it finished.

    search=True: each skip group's runs are the probes of a search, in increasing size (bench_e2e's
    --context-length max), never grouped into comparisons. The group's first failure of any kind (OOM, error,
    timeout) ends its planned probes, and the progress count shrinks by as many; after an OOM that follows a fit,
    a bisection between the two (experiment.resize makes its probes; args.search_resolution and
    args.search_probes bound it) adds probes, each counted as it starts.

    Under torchrun (configurations with .parallel set), every rank runs this same sweep, each configuration on
    every rank at once (run_on_every_rank); all ranks get the same records, and only rank 0 (files given, None on
    the others) prints progress and writes files. --quiet: no progress lines and no heartbeat."""
    launch = parallel.torchrun_launch() if any(getattr(run, "parallel", None) for run in runs) else None
    ranks = parallel.RankSweep(launch) if launch else None
    sweep: Sweep | None = None
    with sigterm_as_interrupt():
        try:
            env = sweep_environment(device, args.in_process)
            sweep = Sweep(experiment, runs, files, args, search, ranks, env)
            # comparisons only in the scripts that compare variants (their command line has --interleave)
            for unit in comparison_units(runs, grouped=not search and hasattr(args, "interleave")):
                sweep.run_unit(unit)
            if ranks is not None:
                ranks.finish()
        except KeyboardInterrupt as exc:
            how, code = ("SIGTERM", 128 + signal.SIGTERM) if isinstance(exc, Terminated) else ("Ctrl-C", 130)
            records = sweep.records if sweep else []
            kept = f"; finished rows are in {files.markdown} and {files.jsonl}" if records and files else ""
            if parallel.is_rank_zero():  # said even under --quiet: where the finished rows are
                total = sweep.total if sweep else len(runs)
                progress(f"interrupted by {how} after {len(records)} of {total} configurations{kept}")
            return records, code
    return sweep.records, 0
