"""Kernel tables of a profile (an Nsight Systems report or a torch.profiler trace, anyone's): where a step's time
goes, kernel by kernel; the top kernels of the forward pass and their calls; the matmul share of inference vs a
training step; softmax vs the attention matmuls; communication hidden behind compute or exposed. It reads; nsys_run.sh
(runner.py) makes the profiles.

    bash nsys_run.sh medium 256                                 # profile with nsys, then these tables
    python3 kernel_tables.py results/nsys/medium_ctx256_train.nsys-rep \\
        --e2e-jsonl results/nsys/medium_ctx256_train_e2e.jsonl     # the tables again, with the stopwatch
    python3 kernel_tables.py result.nsys-rep --ranges forward="Model Forward" --stopwatch forward=66.5
    python3 kernel_tables.py results/profile/tiny_ctx128_train_fp32_naive_warmup_5-20250101-120000.json  # a torch trace
    python3 kernel_tables.py --summary results/nsys/*_ctx*.nsys-rep   # one table across nsys_run.sh's reports
"""
from __future__ import annotations

import argparse
import bisect
import contextlib
import functools
import gzip
import itertools
import json
import math
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, NamedTuple

import results
from results import FINISHED

# ---- reading a profile: an nsys SQLite export or a torch.profiler trace ----


class Activity(NamedTuple):
    """One unit of device work: a kernel, memcpy or memset; on a CPU, one operator's self time."""
    name: str
    duration_ns: float
    launch_ns: float  # when the host asked for it: phases are attributed by this


class Range(NamedTuple):
    """One NVTX / record_function range."""
    name: str
    start_ns: float
    end_ns: float

    @property
    def duration_ns(self) -> float:
        return self.end_ns - self.start_ns


class Interval(NamedTuple):
    """One stretch of work as it ran, for overlap: a GPU operation on its stream, or a CPU operator or
    communication range on its thread (nested ones included: only unions of them are taken)."""
    name: str
    start_ns: float
    end_ns: float
    lane: str  # "stream 7", "thread 4242"
    launch_ns: float  # when the host asked for it: phases are attributed by this


@dataclass
class Profile:
    activities: list[Activity]
    ranges: list[Range]
    device: str  # "gpu" (kernel time) or "cpu" (operator self CPU time)
    source: str
    notes: list[str] = field(default_factory=list)
    intervals: list[Interval] = field(default_factory=list)


class ProfileFormatError(ValueError):
    """A report, trace or record that cannot be read (no nsys, a failed export): one line, exit 2."""


def gpu_profile(work: list[tuple[str, float, float]], launches: list[float | None], ranges: list[Range],
                source: str | Path, streams: list[Any] | None = None) -> Profile:
    """(name, start, end) of each GPU operation, attributed by its launch (by its own start when unknown)."""
    profile = Profile([Activity(name, end - start, start if at is None else at)
                       for (name, start, end), at in zip(work, launches)], ranges, "gpu", str(source))
    profile.intervals = [Interval(name, start, end, f"stream {stream}", start if at is None else at)
                         for (name, start, end), at, stream in zip(work, launches, streams or [None] * len(work))]
    if None in launches:
        profile.notes.append(f"{launches.count(None)} GPU operations had no launch record; attributed by "
                             "their GPU start")
    return profile


_GPU_WORK = {  # the name of each kind of GPU operation, as nsys's cuda_gpu_trace report gives it
    "CUPTI_ACTIVITY_KIND_KERNEL": "(SELECT value FROM StringIds WHERE id = g.demangledName)",
    "CUPTI_ACTIVITY_KIND_MEMCPY": "'[CUDA memcpy ' || COALESCE((SELECT label FROM ENUM_CUDA_MEMCPY_OPER "
                                  "WHERE id = g.copyKind), 'Unknown') || ']'",
    "CUPTI_ACTIVITY_KIND_MEMSET": "'[CUDA memset]'"}
_NVTX_SQL = ("SELECT COALESCE(e.text, s.value), e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s "
             "ON s.id = e.textId WHERE e.eventType IN (59, 60) AND e.end IS NOT NULL")  # push/pop, start/end


def load_nsys(source: str | Path) -> Profile:
    """An nsys SQLite export (X.sqlite, or the prefix X): GPU work joined to its launching runtime call (same
    correlation id and process: globalTid >> 24 is the globalPid's), and the NVTX ranges."""
    path = Path(source) if str(source).endswith(".sqlite") else Path(f"{source}.sqlite")
    if not path.is_file():
        raise ProfileFormatError(f"{path}: no such nsys SQLite export")
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "StringIds" not in tables:
                raise ProfileFormatError(f"{path}: not an nsys SQLite export (no StringIds table)")
            launch_at = {(corr, pid): at for corr, pid, at in db.execute(
                "SELECT correlationId, globalTid >> 24, start FROM CUPTI_ACTIVITY_KIND_RUNTIME")} \
                if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables else {}
            stream = lambda table: "g.streamId" if any(  # noqa: E731  (a column of every real export)
                col == "streamId" for _, col, *_ in db.execute(f"PRAGMA table_info({table})")) else "NULL"
            work = [row for table, name in _GPU_WORK.items() if table in tables for row in db.execute(
                f"SELECT {name}, start, end, correlationId, globalPid >> 24, {stream(table)} FROM {table} g")]
            ranges = [Range(*row) for row in db.execute(_NVTX_SQL)] if "NVTX_EVENTS" in tables else []
    except sqlite3.Error as exc:
        raise ProfileFormatError(f"{path}: not a readable SQLite export: {exc}") from None
    return gpu_profile([row[:3] for row in work], [launch_at.get(row[3:5]) for row in work], ranges, path,
                       [row[5] for row in work])


def load_torch_trace(path: str | Path) -> Profile:
    """A torch.profiler Chrome trace (.json, .json.gz; µs): GPU work joined to its launch by correlation id,
    else every operator's self CPU time; the record_function labels as ranges."""
    path = Path(path)
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            trace = json.loads(results.read_bounded(f, path, "the trace" + " expanded" * (path.suffix == ".gz")))
    except results.TooLarge as exc:
        raise ProfileFormatError(str(exc)) from None
    except (OSError, EOFError, ValueError, RecursionError) as exc:  # unreadable, not gzip, not JSON, too deep
        raise ProfileFormatError(f"{path}: not a readable JSON trace: {exc}") from None
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise ProfileFormatError(f"{path}: not a torch.profiler trace (no traceEvents list)")
    events = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]
    ranges = [Range(e["name"], e["ts"] * 1e3, (e["ts"] + e["dur"]) * 1e3)
              for e in events if e.get("cat") == "user_annotation"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:  # a CPU run: operators, and the communication ranges of the backend's threads (gloo:all_reduce)
        profile = Profile(cpu_self_times(events), ranges, "cpu", str(path))
        profile.intervals = [Interval(e["name"], e["ts"] * 1e3, (e["ts"] + e["dur"]) * 1e3, f"thread {e.get('tid')}",
                                      e["ts"] * 1e3) for e in events if e.get("cat") == "cpu_op" or
                             (e.get("cat") == "user_annotation" and collective_kind(e["name"]))]
        return profile
    launch_at = {e["args"]["correlation"]: e["ts"] * 1e3 for e in events
                 if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    return gpu_profile([(e["name"], e["ts"] * 1e3, (e["ts"] + e["dur"]) * 1e3) for e in gpu],
                       [launch_at.get(e.get("args", {}).get("correlation")) for e in gpu], ranges, path,
                       [e.get("tid") for e in gpu])  # a kernel's tid in a torch trace is its stream


def cpu_self_times(events: list[dict[str, Any]]) -> list[Activity]:
    """Self CPU time of every operator (cpu_op): minus the operators directly inside it on its thread."""
    def thread(e: dict[str, Any]) -> tuple[str, str]:
        return str(e.get("pid")), str(e.get("tid"))

    # thread by thread, and a parent before the children that start with it
    ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (thread(e), e["ts"], -e["dur"]))
    stack: list[list[Any]] = []  # [end µs, event, self µs]
    done = []
    for e in ops:
        while stack and (e["ts"] >= stack[-1][0] or thread(e) != thread(stack[-1][1])):
            done.append(stack.pop())
        if stack:
            stack[-1][2] -= e["dur"]
        stack.append([e["ts"] + e["dur"], e, e["dur"]])
    return [Activity(e["name"], max(us, 0.0) * 1e3, e["ts"] * 1e3) for _, e, us in done + stack]


# ---- nsys: exporting a report to SQLite ----

DOWNLOAD = "https://developer.nvidia.com/nsight-systems"
INSTALL_HINT = (f"install Nsight Systems ({DOWNLOAD}; also in the CUDA toolkit, /usr/local/cuda/bin/nsys), "
                "then put it on PATH or set NSYS=/path/to/nsys")
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")


def find_nsys() -> tuple[str | None, str]:
    """(the nsys binary, '') or (None, why there is none): $NSYS when set, else `nsys` on PATH."""
    given = os.environ.get("NSYS")
    found = shutil.which(given or "nsys")
    return found, "" if found else f"NSYS={given} is not an executable nsys binary" if given else \
        "nsys (Nsight Systems) is not on PATH"


def nsys_version(text: str) -> tuple[int, ...] | None:
    """(2023, 4, 4) from "NVIDIA Nsight Systems version 2023.4.4.54-..." or a report's "2023@4@4@54-..."."""
    match = re.search(r"(20\d\d)[.@](\d+)[.@](\d+)", text)
    return tuple(int(part) for part in match.groups()) if match else None


def export_failure(report: Path, nsys: str, result: subprocess.CompletedProcess) -> str:
    """Why `nsys export` failed, naming both versions when a newer nsys wrote the report (its first bytes)."""
    with open(report, "rb") as f:
        written_by = nsys_version(f.read(256).decode("latin-1"))
    mine = nsys_version(subprocess.run([nsys, "--version"], capture_output=True, text=True).stdout)
    if written_by and mine and written_by > mine:
        newer, this = ".".join(map(str, written_by)), ".".join(map(str, mine))
        return (f"{report} was written by Nsight Systems {newer}, newer than this nsys ({this}, {nsys}), "
                f"which cannot read it: install Nsight Systems {newer.rsplit('.', 1)[0]} or newer "
                f"({DOWNLOAD}) and set NSYS=/path/to/it, or export it where it was made (nsys export --type "
                f"sqlite {report.name}) and give the .sqlite")
    said = [line.strip() for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    said_line = next((line for line in said if "error" in line.lower()), said[-1] if said else "no output")
    return f"nsys export could not read {report} (exit status {result.returncode}): {said_line}"


def report_file(source: str | Path) -> Path:
    """The file behind a source: X.sqlite, X.nsys-rep, or for a prefix X, X.nsys-rep else X.sqlite."""
    path = Path(source)
    if path.suffix in (*REPORT_SUFFIXES, ".sqlite"):
        return path
    return next((p for p in (Path(f"{path}.nsys-rep"), Path(f"{path}.sqlite")) if p.is_file()),
                Path(f"{path}.nsys-rep"))


def as_operand(path: Path) -> str:
    """A path on another program's command line: ./-g.nsys-rep is a file, where -g.nsys-rep would be an option."""
    return str(path) if path.is_absolute() else os.path.join(".", path)


def load_report(source: str | Path, folder: Path | None = None) -> Profile:
    """An nsys export, or a .nsys-rep through its export X.sqlite in `folder` (default: the report's) unless
    that is older; else a fresh export into X.sqlite when there is none, else into a temporary folder."""
    report = report_file(source)
    if report.suffix == ".sqlite":
        return load_nsys(report)
    folder = folder or report.parent
    folder.mkdir(parents=True, exist_ok=True)
    export = folder / f"{report.stem}.sqlite"
    older = export.is_file() and export.stat().st_mtime < report.stat().st_mtime
    nsys, why = find_nsys()
    if export.is_file() and (not older or nsys is None):
        try:
            profile = load_nsys(export)
        except ProfileFormatError as exc:
            raise ProfileFormatError(f"{exc}, read as the export of {report.name}: move it away for a fresh "
                                     "export") from None
        profile.notes += [f"{export} is older than {report.name} and {why}: read as it is"] * older
        return profile
    if nsys is None:
        raise ProfileFormatError(f"{report} needs nsys to be exported, and {why}: {INSTALL_HINT}")
    keep = not export.exists() and os.access(folder, os.W_OK)
    with tempfile.TemporaryDirectory(prefix=".kernel_tables-", dir=folder if keep else None) as work:
        made = Path(work) / export.name
        result = subprocess.run([nsys, "export", "--type=sqlite", "--quiet=true", f"--output={made}",
                                 as_operand(report)], capture_output=True, text=True, errors="replace")
        if result.returncode or not made.is_file():
            raise ProfileFormatError(export_failure(report, nsys, result))
        profile = load_nsys(made.rename(export) if keep else made)
    profile.notes += [f"{export} is older than {report.name}: left as it is, a fresh export read"] * older
    return profile


# ---- what kind of work a kernel is ----

CATEGORIES = ("matrix multiply", "elementwise", "reduction/softmax", "memory copy/set", "communication", "other")
MEMCPY_MEMSET = re.compile(r"\[CUDA mem(cpy|set)|^Mem(cpy|set)\b", re.IGNORECASE)  # nsys's, torch.profiler's names

# Inductor names its kernels triton_<kind>_ (torch/_inductor/codegen/triton.py): poi(ntwise), for(each),
# red(uction), per(sistent reduction), spl(it scan), tem(plate: matmuls). The prefix decides before any
# substring rule: triton_poi_fused_arange_index_put_0 is one pointwise kernel, not an index_put.
INDUCTOR_PREFIXES = {"triton_tem_": "matrix multiply", "triton_poi_": "elementwise",
                     "triton_for_": "elementwise", "triton_red_": "reduction/softmax",
                     "triton_per_": "reduction/softmax", "triton_spl_": "reduction/softmax"}
# First match wins. PyTorch's copies and gathers are elementwise_kernel templates, and cuBLAS's splitKreduce
# is part of its GEMM, so the specific families come first.
_KERNEL_RULES: list[tuple[str, re.Pattern]] = [
    # indexing that ADDS values sharing an index: the embedding backward, scatter_add / index_add, nll_loss
    ("reduction/softmax", re.compile(
        r"indexing_backward|embedding_backward|compute_grad_weight|sum_and_scatter|scatter_add|ReduceAdd"
        r"|indexFunc(Small|Large)Index|index_add|nll_loss", re.IGNORECASE)),
    # copies, fills, and indexing that only moves data (gather, scatter, index, index_select: the embedding)
    ("memory copy/set", re.compile(
        rf"{MEMCPY_MEMSET.pattern}|direct_copy_kernel|CatArrayBatchedCopy|FillFunctor|copy_kernel|gather|scatter"
        r"|index_elementwise|index_put|indexSelect|index_select", re.IGNORECASE)),
    # cuBLAS (ampere_sgemm, sm80_xmma), CUTLASS (a `:base` report prints cutlass::Kernel2 as "Kernel2"),
    # Hopper's nvjet, gemv, and fused attention kernels, whose time is their two matmuls (flash, fmha, sdpa)
    ("matrix multiply", re.compile(
        r"gemm|gemv|nvjet|xmma|cutlass|cublas|splitKreduce|flash|fmha|_sdpa_|^Kernel2$", re.IGNORECASE)),
    ("reduction/softmax", re.compile(r"softmax|reduce_kernel|scan|welford", re.IGNORECASE)),
    # ATen's elementwise kernels, the optimizer's multi-tensor kernels, the grad scaler, random numbers
    ("elementwise", re.compile(r"elementwise_kernel|multi_tensor_apply|foreach|amp_update_scale"
                               r"|distribution_elementwise", re.IGNORECASE)),
    ("other", re.compile(r"RadixSort|DeviceSegmentedSort|bitonicSort", re.IGNORECASE)),  # sorting
]
# CPU operators (torch.profiler without CUDA) by aten name, without the trailing "_" of in-place variants
_OP_CATEGORIES = {category: frozenset(names.split()) for category, names in {
    "matrix multiply": ("mm bmm addmm baddbmm matmul linear addmv mv dot einsum scaled_dot_product_attention "
                        "_scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_flash_attention "
                        "_scaled_dot_product_efficient_attention _scaled_dot_product_flash_attention_for_cpu_backward "
                        "_scaled_dot_product_flash_attention_backward "
                        "_scaled_dot_product_efficient_attention_backward"),
    "reduction/softmax": ("sum mean amax amin max min softmax _softmax _softmax_backward_data log_softmax "
                          "_log_softmax _log_softmax_backward_data logsumexp norm var std argmax argmin prod "
                          "cumsum nll_loss nll_loss_forward nll_loss_backward nll_loss_nd cross_entropy_loss "
                          "embedding_backward embedding_dense_backward scatter_add index_add"),
    "memory copy/set": ("copy clone contiguous zero fill zeros zeros_like ones ones_like full full_like cat "
                        "stack to _to_copy empty empty_like empty_strided new_zeros new_empty "
                        "new_empty_strided gather scatter index index_put _index_put_impl index_select "
                        "embedding"),
    "elementwise": ("add sub rsub mul div neg exp log sigmoid silu rsqrt sqrt pow tanh gelu relu where "
                    "masked_fill abs reciprocal lerp addcmul addcdiv maximum minimum clamp ge gt le lt eq ne "
                    "cos sin square sigmoid_backward silu_backward tanh_backward threshold_backward "
                    "gelu_backward randint rand randn normal uniform random bernoulli"),
}.items()}


@functools.cache  # a report repeats a few hundred names thousands of times; the patterns are the cost
def classify_kernel(name: str) -> str:
    """One of CATEGORIES for a GPU kernel name or a CPU operator name ("aten::mm")."""
    if name.startswith("aten::"):
        op = name[len("aten::"):]
        if op.startswith("_foreach_"):
            return "elementwise"
        return next((c for c, ops in _OP_CATEGORIES.items() if op in ops or op.rstrip("_") in ops), "other")
    # a `:nvtx-name` report names kernels "RANGE/KERNEL": the kernel follows the last '/' before any template
    # or parameter list (a '/' inside those, as in `operator/`, belongs to the kernel)
    cut = re.split(r"[<(\[]", name, maxsplit=1)[0].rfind("/")
    kernel = name[cut + 1:].removeprefix("void ")
    category = "communication" if collective_kind(kernel) else next(
        (c for prefix, c in INDUCTOR_PREFIXES.items() if kernel.startswith(prefix)), None)
    return category or next((c for c, pattern in _KERNEL_RULES if pattern.search(kernel)), "other")


# ---- phases, from anyone's range names ----

PHASES = ("forward", "backward", "optimizer")
STEP = "step"
MEASURE = "measure"  # bench_e2e's range around its timed steps
RANGE_KEYS = (*PHASES, STEP, MEASURE)  # what --ranges KEY=NAME can name
ATTENTION_STEPS = ("computing attention scores", "computing softmax", "final matmul")
OUTSIDE = "outside phases"
AGREEMENT = 0.10  # profiler range vs stopwatch: within 10% counts as agreeing
# usual names, compared after normalise_range_name ("Forward", "forward_pass", "Step 3", "train-step")
RANGE_SPELLINGS = {
    "forward": {"forward", "fwd", "forward pass", "model forward"},
    "backward": {"backward", "bwd", "backward pass", "loss backward"},
    "optimizer": {"optimizer", "optimizer step", "optim", "optim step", "opt", "opt step",
                  "optimizer update"},
    STEP: {"step", "train step", "training step", "train iteration", "training iteration", "iteration",
           "profilerstep"},  # torch.profiler's own ProfilerStep#N (a schedule's prof.step()): see select_measured
}


def normalise_range_name(name: str) -> str:
    """Lower case; '_', '-', '.', ':', '#' as spaces; a trailing step number dropped."""
    return re.sub(r" ?\d+$", "", re.sub(r"[\s_.:#-]+", " ", name.lower()).strip())


def is_warmup(name: str) -> bool:
    return bool(re.search(r"\bwarm ?up\b", normalise_range_name(name)))


def phase_of(name: str, given: dict[str, str]) -> str | None:
    """The phase (or STEP) a range stands for: by --ranges, else by its usual spelling if --ranges left it."""
    key = next((key for key, value in given.items() if name == value and key != MEASURE), None)
    usual = normalise_range_name(name)
    return key or next((k for k, names in RANGE_SPELLINGS.items() if k not in given and usual in names), None)


def stopwatch_ms(record: dict[str, Any]) -> dict[str, float]:
    """A bench_e2e record's mean time per phase and per step (ms), from its raw samples."""
    return {k: statistics.fmean(record[f"{k}_ms"]) for k in (*PHASES, STEP) if record.get(f"{k}_ms")}


def attention_shape(config: dict[str, Any] | None) -> dict[str, int] | None:
    """batch, seq, d_model, heads from a bench_e2e record's "config"; None without one."""
    try:
        model = config["model"]
        return {"batch": config["batch_size"], "seq": model["context_length"], "d_model": model["d_model"],
                "heads": model["num_heads"]}
    except (KeyError, TypeError):
        return None


class Windows:
    """Ranges, to find the innermost one holding a time: a bisection, then a scan back while they reach it."""

    def __init__(self, ranges: Iterable[Range]):
        self.ranges = sorted(ranges, key=lambda r: (r.start_ns, -r.end_ns))
        # the latest end among this range and those before it
        self._reach = list(itertools.accumulate((r.end_ns for r in self.ranges), max))

    def find(self, t_ns: float) -> Range | None:
        i = bisect.bisect_right(self.ranges, t_ns, key=lambda r: r.start_ns) - 1
        while i >= 0 and self._reach[i] >= t_ns:
            if self.ranges[i].end_ns >= t_ns:
                return self.ranges[i]
            i -= 1
        return None


@dataclass
class Selection:
    """The measured region: its work, its ranges (phase ranges renamed to their phase), and what was used."""
    activities: list[Activity] = field(default_factory=list)
    ranges: list[Range] = field(default_factory=list)
    used: dict[str, Counter] = field(default_factory=dict)  # phase -> {range name as recorded: instances}
    in_warmup: Counter = field(default_factory=Counter)  # phase -> instances inside warm-up ranges, left out
    region: str = ""


def select_measured(profile: Profile, given: dict[str, str] | None = None) -> Selection:
    """Inside the measure ranges; else from the first to the last phase range (a student's set-up and teardown
    are not steps); else the whole profile. Warm-up ranges are left out."""
    given = given or {}
    measure_name = given.get(MEASURE, MEASURE)
    measure = Windows(r for r in profile.ranges if r.name == measure_name)
    warmup = Windows(r for r in profile.ranges if is_warmup(r.name))
    chosen = Selection()
    # torch.profiler's ProfilerStep#N ranges are the steps only where the run has no step range of its own
    profiler_step = lambda name: re.fullmatch(r"ProfilerStep#\d+", name) is not None  # noqa: E731
    own_steps = any(phase_of(r.name, given) == STEP and not profiler_step(r.name) for r in profile.ranges)
    for r in (r for r in profile.ranges if not (own_steps and profiler_step(r.name))):
        if r.name == measure_name or is_warmup(r.name) or (measure.ranges and not measure.find(r.start_ns)):
            continue
        phase = phase_of(r.name, given)
        if phase and warmup.find(r.start_ns):
            chosen.in_warmup[phase] += 1
        elif phase:
            chosen.used.setdefault(phase, Counter())[r.name] += 1
            chosen.ranges.append(Range(phase, r.start_ns, r.end_ns))
        elif not warmup.find(r.start_ns):  # renamed when it reads like a phase that --ranges named otherwise
            name = f"{r.name} (not the phase)" if r.name in (*PHASES, STEP) else r.name
            chosen.ranges.append(Range(name, r.start_ns, r.end_ns))
    phase_ranges = [r for r in chosen.ranges if r.name in chosen.used]
    if measure.ranges:  # a student's measure range may hold their set-up and warm-up too
        inside = lambda t: measure.find(t) is not None  # noqa: E731
        chosen.ranges += [Range(STEP, r.start_ns, r.end_ns) for r in measure.ranges] * (STEP not in chosen.used)
        chosen.region = f"inside the {measure_name!r} ranges"
    else:
        first, last = min((r.start_ns for r in phase_ranges), default=-math.inf), \
            max((r.end_ns for r in phase_ranges), default=math.inf)
        inside = lambda t: first <= t <= last  # noqa: E731
        chosen.ranges = [r for r in chosen.ranges if inside(r.start_ns)]
        chosen.region = "from the first to the last phase range" if phase_ranges else "the whole profile"
    chosen.activities = [a for a in profile.activities if inside(a.launch_ns) and not warmup.find(a.launch_ns)]
    chosen.region += ", warm-up ranges left out" * bool(warmup.ranges)
    return chosen


def attribute(activities: list[Activity], ranges: list[Range],
              names: Iterable[str]) -> dict[str, list[Activity]]:
    """Work grouped by the innermost range of `names` holding its LAUNCH (OUTSIDE when none): backward kernels
    come from the autograd thread, which a thread's own range stack (nvtx_kern_sum's) misses."""
    windows = Windows(r for r in ranges if r.name in set(names))
    groups: dict[str, list[Activity]] = {}
    for a in activities:
        window = windows.find(a.launch_ns)
        groups.setdefault(window.name if window else OUTSIDE, []).append(a)
    return groups


# ---- communication: how much of it the step waits for ----

# NCCL kernels on a GPU (ncclDevKernel_AllReduce_Sum_f32_RING_LL, ncclKernel_AllReduce_RING_LL_Sum_float); on a CPU
# gloo's "gloo:<op>" ranges on its own threads and the "c10d::<op>_" operators that hand it the work (gloo runs a
# reduce-scatter as an all-reduce); matched case-insensitively
COLLECTIVE_KINDS = {"all-reduce": r"all_?reduce", "all-gather": r"all_?gather", "reduce-scatter": r"reduce_?scatter",
                    "broadcast": r"broadcast"}
BETWEEN = "between phases"  # communication launched in a step outside its phase ranges (a sync after backward)
WHOLE_STEP = "whole step"


def collective_kind(name: str) -> str | None:
    """The kind of an NCCL kernel, a gloo range or a c10d operator; None for anything that is not a collective."""
    if not (name.startswith(("gloo:", "c10d::")) or "nccl" in name.lower()):
        return None
    return next((kind for kind, pattern in COLLECTIVE_KINDS.items() if re.search(pattern, name, re.I)),
                "other collective")


def merged(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals as disjoint (start, end) pairs in order."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def covered(union: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in union)


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """How long two unions (merged) run at the same time: one walk through both."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def work_kind(name: str) -> str:
    """Holistic Trace Analysis's kinds of GPU work: communication (NCCL kernels; on a CPU gloo's ranges and c10d's
    operators), memory (memcpy and memset: the copy engines, not the SMs) and computation (every other)."""
    return "communication" if collective_kind(name) else "memory" if MEMCPY_MEMSET.search(name) else "computation"


def communication_split(comm: list[Interval], compute: list[tuple[float, float]],
                        busy: list[tuple[float, float]]) -> dict[str, Any]:
    """ms of communication (the union of its intervals), hidden (while compute ran: `compute` is the union of the
    computation), exposed (the rest) and, of the exposed, beside copies (a memcpy or memset ran, hiding none of it:
    `busy` is the union of computation and copies), and how many collectives of each kind."""
    union = merged((c.start_ns, c.end_ns) for c in comm)
    total, hidden = covered(union), overlap(union, compute)
    kinds = Counter(collective_kind(c.name) for c in comm)
    return {"comm_ms": total / 1e6, "hidden_ms": hidden / 1e6, "exposed_ms": (total - hidden) / 1e6,
            "copies_ms": (overlap(union, busy) - hidden) / 1e6, "hidden_share": hidden / total if total else None,
            "collectives": ", ".join(f"{kind} x{n}" for kind, n in kinds.most_common())}


def communication_rows(profile: Profile, given: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Per measured step and phase (each collective in the phase whose range holds its launch; BETWEEN when
    none does), then the mean over the steps: communication time, hidden behind compute, exposed. A step is a
    step range (ProfilerStep#N where the run has none of its own); without any, the measured region is one.
    Compute is every computation kernel (on any stream), or on a CPU every other operator (on any thread)."""
    comm = [i for i in profile.intervals if collective_kind(i.name)]
    if not comm:
        return []
    compute = merged((i.start_ns, i.end_ns) for i in profile.intervals if work_kind(i.name) == "computation")
    busy = merged((i.start_ns, i.end_ns) for i in profile.intervals if work_kind(i.name) != "communication")
    chosen = select_measured(profile, given)
    steps = sorted((r for r in chosen.ranges if r.name == STEP), key=lambda r: r.start_ns)
    phase_ranges = [r for r in chosen.ranges if r.name in PHASES]
    if not steps:
        spans = phase_ranges or [Range(STEP, i.launch_ns, i.end_ns) for i in comm]
        steps = [Range(STEP, min(r.start_ns for r in spans), max(r.end_ns for r in spans))]
    phases = Windows(phase_ranges)
    rows = []
    for number, step in enumerate(steps, 1):
        within = lambda t: step.start_ns <= t <= step.end_ns  # noqa: E731
        groups: dict[str, list[Interval]] = {}
        for c in (c for c in comm if within(c.launch_ns)):
            window = phases.find(c.launch_ns)
            groups.setdefault(window.name if window and within(window.start_ns) else BETWEEN, []).append(c)
        phase_ms = {p: sum(r.duration_ns for r in phase_ranges if r.name == p and within(r.start_ns)) / 1e6
                    for p in PHASES}
        for phase in [p for p in PHASES if phase_ms[p] or p in groups] + [BETWEEN] * (BETWEEN in groups):
            rows.append({"step": number, "phase": phase, "phase_ms": phase_ms.get(phase),
                         **communication_split(groups.get(phase, []), compute, busy)})
        rows.append({"step": number, "phase": WHOLE_STEP, "phase_ms": step.duration_ns / 1e6,
                     **communication_split([c for group in groups.values() for c in group], compute, busy)})
    means = []
    for phase in dict.fromkeys(r["phase"] for r in rows):
        same = [r for r in rows if r["phase"] == phase]
        mean = {k: sum(r[k] or 0 for r in same) / len(steps)
                for k in ("comm_ms", "hidden_ms", "exposed_ms", "copies_ms")}
        phase_ms = [r["phase_ms"] for r in same if r["phase_ms"]]
        means.append({"step": "mean", "phase": phase, "phase_ms": statistics.fmean(phase_ms) if phase_ms else None,
                      **mean, "hidden_share": mean["hidden_ms"] / mean["comm_ms"] if mean["comm_ms"] else None})
    for row in rows + means:
        row["comm_share"] = row["comm_ms"] / row["phase_ms"] if row["phase_ms"] else None
    return rows + means


# ---- the four tables ----

NO_PHASE = ("no phase range found: none named forward, backward, optimizer or step in any usual spelling "
            "(Forward, fwd, optimizer step, train step, ...); name yours with --ranges forward=NAME "
            "backward=NAME optimizer=NAME step=NAME (bench_e2e: --nvtx under nsys, --profile for "
            "torch.profiler)")
NO_KERNELS = ("no CUDA kernel data in this report: nsys recorded no GPU work (a machine without a GPU, or a "
              "profile without --trace=cuda), so only the phase ranges are shown")
NO_STOPWATCH = "no stopwatch record"


def ranges_used_line(chosen: Selection, steps: int, steps_from: str) -> str:
    """Table 1's account of its ranges: which names stood for which phase, how many, what was left out."""
    parts = [f"{phase} = " + ", ".join(f"'{name}' x{n}" for name, n in chosen.used[phase].items())
             for phase in (*PHASES, STEP) if chosen.used.get(phase)]
    if STEP not in chosen.used and any(r.name == STEP for r in chosen.ranges):
        parts.append("step = the measured region over the steps (it also holds what runs between steps, so "
                     "it exceeds a stopwatch's step, the more the shorter the step)")
    line = "ranges used: " + ("; ".join(parts) or "none")
    if chosen.in_warmup:
        left_out = ", ".join(f"{n} {p}" for p, n in chosen.in_warmup.items())
        line += f" (left out, inside warm-up ranges: {left_out})"
    return f"{line}; {steps} step{'s' * (steps != 1)} ({steps_from}); measured region: {chosen.region}"


def phase_rows(chosen: Selection, groups: dict[str, list[Activity]], phases: list[str], steps: int,
               stopwatch: dict[str, float], has_work: bool) -> list[dict[str, Any]]:
    """Table 1: per phase, its ranges' time per step (a phase may run more than once a step) against the
    stopwatch, and the work inside. The step row: step ranges, else the measure ranges over the steps."""
    def per_step(items: Iterable[Activity | Range]) -> float:
        return sum(item.duration_ns for item in items) / 1e6 / steps

    rows = [{"phase": phase, "range_ms": per_step(r for r in chosen.ranges if r.name == phase),
             "stopwatch_ms": stopwatch.get(phase), "work_ms": per_step(groups.get(phase, []))}
            for phase in phases]
    if step_ms := per_step(r for r in chosen.ranges if r.name == STEP):
        rows.append({"phase": STEP, "range_ms": step_ms, "stopwatch_ms": stopwatch.get(STEP),
                     "work_ms": per_step(a for acts in groups.values() for a in acts)})
    for row in rows:
        if row["range_ms"] and row["stopwatch_ms"]:
            row["ratio"] = row["range_ms"] / row["stopwatch_ms"]
            row["agrees"] = "yes" if abs(row["ratio"] - 1) <= AGREEMENT else "NO"
        if not has_work:
            row["work_ms"] = None
        elif row["range_ms"]:
            row["work_pct_of_range"] = 100 * row["work_ms"] / row["range_ms"]
    return rows or [{"phase": "no phase range found"}]


def top_rows(activities: list[Activity], steps: int, top: int) -> list[dict[str, Any]]:
    """Table 2 for one scope: the `top` names by total time, then one row for all the others."""
    by_name: dict[str, list[float]] = {}
    for a in activities:
        by_name.setdefault(a.name, []).append(a.duration_ns)
    total = sum(sum(d) for d in by_name.values()) or 1.0
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
    rest = [d for _, durations in ranked[top:] for d in durations]
    shown = ranked[:top] + ([(f"({len(ranked) - top} others)", rest)] if rest else [])
    return [{"name": name, "category": classify_kernel(name) if i < top else "", "total_ms": sum(d) / 1e6,
             "share_pct": 100 * sum(d) / total, "instances": len(d), "per_step": len(d) / steps,
             "mean_us": sum(d) / len(d) / 1e3} for i, (name, d) in enumerate(shown)]


def category_row(scope: str, activities: list[Activity], steps: int) -> dict[str, Any]:
    """Table 3 for one scope: percent of its time in each category (they add up to 100)."""
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for a in activities:
        totals[classify_kernel(a.name)] += a.duration_ns
    total = sum(totals.values())
    return {"scope": scope, "ms_per_step": total / 1e6 / steps,
            **{c: 100 * ns / total if total else 0.0 for c, ns in totals.items()}}


def attention_rows(activities: list[Activity], ranges: list[Range], steps: int,
                   shape: dict[str, int] | None) -> list[dict[str, Any]]:
    """Table 4: time per call of each attention sub-step, its FLOPs (one layer, all heads) and GFLOP/s. QK^T
    and PV are each half of results.attention_matmul_flops; softmax: max, sub, exp, sum, divide per score."""
    groups = attribute(activities, ranges, ATTENTION_STEPS)
    flops = {}
    if shape:
        b, s = shape["batch"], shape["seq"]
        matmul = results.attention_matmul_flops(b, s, shape["d_model"]) // 2
        flops = {"computing attention scores": matmul, "final matmul": matmul,
                 "computing softmax": 5 * b * shape["heads"] * s * s}
    rows, calls = [], Counter(r.name for r in ranges)
    for step in (step for step in ATTENTION_STEPS if calls[step]):
        ms_per_call = sum(a.duration_ns for a in groups.get(step, [])) / 1e6 / calls[step]
        row = {"sub_step": step, "calls": calls[step], "calls_per_step": calls[step] / steps,
               "ms_per_call": ms_per_call, "gflop_per_call": flops[step] / 1e9 if step in flops else None}
        if row["gflop_per_call"] and ms_per_call:
            row["gflops"] = row["gflop_per_call"] / (ms_per_call / 1e3)
        rows.append(row)
    return rows


def softmax_matmul_ratios(rows: list[dict[str, Any]]) -> tuple[float, float | None] | None:
    """(softmax / the mean attention matmul in time per call, the same in FLOPs or None), or None."""
    by = {r["sub_step"]: r for r in rows}
    matmuls = [by[s] for s in ("computing attention scores", "final matmul") if s in by]
    softmax = by.get("computing softmax")
    matmul_ms = statistics.fmean(r["ms_per_call"] for r in matmuls) if matmuls else 0
    if not (softmax and matmul_ms):
        return None
    gflops = [r["gflop_per_call"] for r in matmuls if r.get("gflop_per_call")]
    flops = softmax["gflop_per_call"] and gflops and softmax["gflop_per_call"] / statistics.fmean(gflops)
    return softmax["ms_per_call"] / matmul_ms, flops or None


def build_tables(profile: Profile, stopwatch: dict[str, float] | None = None,
                 shape: dict[str, int] | None = None, top: int = 10, compiled: bool = False,
                 ranges: dict[str, str] | None = None,
                 stopwatch_source: str = "bench_e2e's stopwatch") -> dict[str, Any]:
    """The four tables as JSON-ready rows. `ranges`: --ranges KEY=NAME; `compiled`: a torch.compile run."""
    chosen = select_measured(profile, ranges)
    phases = [p for p in PHASES if p in chosen.used]
    # the optimizer runs once a step; forward and backward may run more (gradient accumulation)
    counted = next((p for p in (STEP, "optimizer", "backward", "forward") if p in chosen.used), None)
    steps = sum(chosen.used[counted].values()) if counted else 1
    steps_from = f"the {counted} ranges" if counted else "no phase range: the whole region counts as one"
    groups = attribute(chosen.activities, chosen.ranges, phases)
    notes = list(profile.notes) + ([] if phases or STEP in chosen.used else [NO_PHASE])
    recorded = {r.name for r in profile.ranges}
    notes += [f"--ranges {key}={name!r}: no range of that name in this profile, so {key} is not in the "
              f"tables (its ranges: {', '.join(sorted(recorded)[:12]) or 'none'})"
              for key, name in (ranges or {}).items() if name not in recorded]
    tables = {"device": profile.device, "source": profile.source, "steps": steps,
              "ranges_used": ranges_used_line(chosen, steps, steps_from),
              "stopwatch_source": stopwatch_source if stopwatch else None,
              "phases": phase_rows(chosen, groups, phases, steps, stopwatch or {}, bool(profile.activities)),
              "top": {}, "top_forward_backward": [], "categories": [], "attention": [], "notes": notes,
              "communication": communication_rows(profile, ranges)}
    if not profile.activities:
        notes.append(NO_KERNELS if profile.device == "gpu" else "no operator data in this trace")
        return tables
    activities = chosen.activities
    scopes = ["all"] + phases + ([OUTSIDE] if groups.get(OUTSIDE) and phases else [])
    scope_acts = {"all": activities, **{s: groups.get(s, []) for s in scopes[1:]}}
    attention = attention_rows(activities, chosen.ranges, steps, shape)
    if ratios := softmax_matmul_ratios(attention):
        line = f"softmax takes {ratios[0]:.2f}x the time of one attention matmul"
        if ratios[1]:
            line += f" for {ratios[1]:.3f}x its FLOPs: {ratios[0] / ratios[1]:.0f}x more time per FLOP"
        notes.append(line)
    elif not attention:
        notes.append("no attention sub-step ranges: under torch.compile the attention runs as fused kernels, "
                     "with no range inside compiled code; profile an eager run for table 4" if compiled else
                     "no attention sub-step ranges (they come from bench_e2e's naive attention; --attn sdpa "
                     "and other models have none)")
    forward_backward = groups.get("forward", []) + groups.get("backward", [])  # nsys_profile (b)
    tables.update(top={s: top_rows(scope_acts[s], steps, top) for s in scopes  # a phase that is all: once
                       if s == "all" or len(scope_acts[s]) < len(activities)},
                  top_forward_backward=top_rows(forward_backward, steps, 1)[:1] * ("backward" in phases),
                  categories=[category_row(s, scope_acts[s], steps) for s in scopes], attention=attention)
    return tables


def short_name(name: str, width: int = 90) -> str:
    """A kernel name as a table shows it: no leading 'void', no parameter list, at most `width` characters."""
    text = name.removeprefix("void ").strip()
    if text.endswith(")"):  # drop the trailing (parameter list), matching nested parentheses
        depth = 0
        for i in range(len(text) - 1, 0, -1):
            depth += {")": 1, "(": -1}.get(text[i], 0)
            if depth == 0:
                text = text[:i]
                break
    text = text.replace("|", "/")  # a pipe would split a markdown cell
    return text if len(text) <= width else text[: width - 1] + "…"


def short_names(names: list[str], width: int = 90) -> list[str]:
    """short_name of each; where different names would read the same, each keeps its start and, after '…', its
    part from where it parts from the others (a functor among the template arguments, say)."""
    texts = [name.removeprefix("void ").strip().replace("|", "/") for name in names]
    shown = [short_name(name, width) for name in names]
    head, tail = width // 3, width - width // 3 - 2
    out = []
    for text, cut in zip(texts, shown):
        parts = max((len(os.path.commonprefix([text, other])) for other, seen in zip(texts, shown)
                     if seen == cut and other != text), default=None)
        if parts is None:
            out.append(cut)
            continue
        start = max(head, parts - tail // 2, *(text.rfind(sep, 0, parts) + len(sep) for sep in ("::", "<", ", ")))
        rest = text[start:]
        out.append(text[:head] + "…" + (rest if len(rest) <= tail + 1 else rest[:tail] + "…"))
    return out


def _render(rows: list[dict[str, Any]], spec: list[tuple[str, str]], fmt: str,
            floatfmt: str | list[str] = ".2f") -> str:
    return results.render_table([{header: row.get(key) for key, header in spec} for row in rows],
                                [header for _, header in spec], fmt, floatfmt)


def render_tables(tables: dict[str, Any], fmt: str = "github") -> str:
    """The four tables as text (markdown by default), a heading each, the notes at the end."""
    gpu = tables["device"] == "gpu"
    work = "kernel" if gpu else "op self-CPU"
    source = tables.get("stopwatch_source")
    phases = [row if source else {**row, "stopwatch_ms": NO_STOPWATCH} for row in tables["phases"]]
    against = f"vs {source}" if source else f"({NO_STOPWATCH}: --e2e-jsonl or --stopwatch PHASE=MS gives one)"
    out = [f"### 1. Phase times (mean per step over {tables['steps']} steps): profiler ranges {against}", "",
           tables["ranges_used"], "",
           _render(phases, [("phase", "phase"), ("range_ms", "range ms"), ("stopwatch_ms", "stopwatch ms"),
                            ("ratio", "range/stopwatch"), ("agrees", "agrees (±10%)"),
                            ("work_ms", f"{work} ms/step"), ("work_pct_of_range", f"{work} % of range")],
                   fmt, ".3f")]
    for scope, rows in tables["top"].items():
        what = "kernels by GPU time" if gpu else "operators by self CPU time"
        out += ["", f"### 2. Top {what}: {scope}", "",
                _render([{**r, "name": name} for r, name in zip(rows, short_names([r["name"] for r in rows]))],
                        [("name", "kernel" if gpu else "operator"), ("category", "category"),
                         ("total_ms", "total ms"), ("share_pct", "share %"), ("instances", "instances"),
                         ("per_step", "per step"), ("mean_us", "mean µs")], fmt)]
    if tables["categories"]:
        out += ["", f"### 3. Category shares of {work} time (%)", "",
                _render(tables["categories"], [("scope", "scope"), ("ms_per_step", f"{work} ms/step")]
                        + [(c, c) for c in CATEGORIES], fmt, ".1f")]
    if tables["attention"]:
        out += ["", f"### 4. Inside attention ({work} time per call; FLOPs per call, one layer, all heads)",
                "",
                _render(tables["attention"], [("sub_step", "sub-step"), ("calls", "calls"),
                                              ("calls_per_step", "calls/step"), ("ms_per_call", "ms/call"),
                                              ("gflop_per_call", "GFLOP/call"), ("gflops", "GFLOP/s")],
                        fmt, ".4g")]
    if tables.get("communication"):
        out += ["", "", render_communication(tables["communication"], gpu, fmt)]
    return "\n".join(out + ([""] + [f"- {note}" for note in tables["notes"]] if tables["notes"] else []))


COMMUNICATION_COLUMNS = [("step", "step"), ("phase", "phase"), ("phase_ms", "phase ms"), ("comm_ms", "comm ms"),
                         ("hidden_ms", "hidden ms"), ("exposed_ms", "exposed ms"), ("copies_ms", "beside copies ms"),
                         ("comm_share", "comm % of phase"),
                         ("hidden_share", "hidden % of comm"), ("collectives", "collectives")]


def render_communication(rows: list[dict[str, Any]], gpu: bool, fmt: str = "github") -> str:
    """Table 5: communication per step and phase, hidden behind compute or exposed."""
    shown = [{**r, **{k: None if r.get(k) is None else f"{r[k]:.0%}" for k in ("comm_share", "hidden_share")}}
             for r in rows]
    where = ("NCCL kernels against computation kernels, on any stream; a memcpy or memset is neither" if gpu else
             "gloo ranges and c10d operators against every other operator, on any thread")
    return "\n".join([f"### 5. Communication: hidden behind compute or exposed ({where})", "",
                      _render(shown, COMMUNICATION_COLUMNS, fmt, ".3f"), "",
                      "comm ms: the union of the collectives' intervals (a collective counts for the phase whose "
                      "range holds its launch); hidden: while compute ran; exposed: while none did; beside copies: "
                      "the part of exposed while a memcpy or memset ran, which hides none of it (Holistic Trace "
                      "Analysis's kinds of GPU work)."])


def profile_header(env: dict[str, Any] | None, source: str | Path) -> str:
    """The line above the tables: the profile and, from bench_e2e's record, its machine."""
    return results.environment_header(env, source=source) if env else f"source: {source}"


# ---- the summary: one table across nsys_run.sh's reports ----

# <size>_ctx<context>_<mode>[_<dtype>][_pytorch][_cudamem][_h2025], as nsys_run.sh names its reports
# -N: nsys_run.sh's new name where another's file holds the plain one (own_name)
REPORT_NAME = re.compile(r"(?P<size>.+?)_ctx(?P<context>[0-9]+)_(?P<mode>forward-backward|forward|train)"
                         r"(?:_(?P<variant>.+?))?(?:-[0-9]+)?")


def last_e2e_record(path: str | Path) -> dict[str, Any]:
    """The last record of a bench_e2e JSONL file: the profiled configuration's."""
    try:
        records = results.read_records(path)
    except (OSError, ValueError, RecursionError) as exc:  # a folder, unreadable, not JSON lines, too deep
        raise ProfileFormatError(f"{path}: not a bench_e2e JSONL file: {exc}") from None
    if not records or not isinstance(records[-1], dict):
        raise ProfileFormatError(f"{path}: its last line is not a record")
    return records[-1]


def summary_facts(tables: dict[str, Any]) -> dict[str, Any]:
    """What the summary takes from one report's tables: its forward pass, top kernels, matmul shares."""
    def first_kernel(rows: list[dict[str, Any]] | None) -> dict[str, Any] | None:
        return rows[0] if rows and not rows[0]["name"].startswith("(") else None

    def matmul_pct(scope: str) -> float | None:
        return next((c["matrix multiply"] for c in tables["categories"] if c["scope"] == scope), None)

    phase = next((r for r in tables["phases"] if r["phase"] == "forward"), {})
    top = first_kernel(tables["top"].get("forward") or tables["top"].get("all")) or {}
    ratios = softmax_matmul_ratios(tables["attention"]) or (None, None)
    return {"forward_nsight_ms": phase.get("range_ms"), "forward_stopwatch_ms": phase.get("stopwatch_ms"),
            "top_forward_kernel": top.get("name"), "top_forward_kernel_calls_per_forward": top.get("per_step"),
            "top_forward_backward_kernel": (first_kernel(tables["top_forward_backward"]) or {}).get("name"),
            "matmul_pct_forward": matmul_pct("forward"), "matmul_pct_all": matmul_pct("all"),
            "softmax_matmul_time_ratio": ratios[0], "softmax_matmul_flop_ratio": ratios[1],
            "kernels": bool(tables["top"])}


def profiled(prefix: str | Path) -> dict[str, Any]:
    """One of nsys_run.sh's reports as a summary record's value: its status, environment and summary_facts;
    with "tables" (its four, in full) when there are some."""
    jsonl = Path(f"{prefix}_e2e.jsonl")
    try:
        record = last_e2e_record(jsonl) if jsonl.exists() else {}
        if record and record.get("status") not in FINISHED:
            return {"status": str(record.get("status"))}
        if not report_file(prefix).is_file():
            return {"status": "no report"}
        config = record.get("config") or {}
        tables = build_tables(load_report(prefix), record and stopwatch_ms(record), attention_shape(config),
                              compiled=bool(config.get("compile")))
        return {"status": record.get("status", "ok (no _e2e.jsonl: no stopwatch)"), "tables": tables,
                "summary": summary_facts(tables), **({"environment": record["environment"]}
                                                     if record.get("environment") else {})}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # ProfileFormatError is a ValueError
        said = exc if isinstance(exc, ProfileFormatError) else \
            f"{prefix}: malformed: {type(exc).__name__}: {exc}"
        return {"status": f"error: {said}"}


FORWARD_FACTS = ("forward_nsight_ms", "forward_stopwatch_ms", "top_forward_kernel",
                 "top_forward_kernel_calls_per_forward", "matmul_pct_forward", "softmax_matmul_time_ratio",
                 "softmax_matmul_flop_ratio")


SUMMARY_COLUMNS = [("size", "size", ""), ("context_length", "ctx", ""), ("variant", "variant", ""),
                   ("forward_nsight_ms", "fwd ms Nsight", ".2f"),
                   ("forward_stopwatch_ms", "fwd ms stopwatch", ".2f"),
                   ("top_forward_kernel", "top forward kernel", ""),
                   ("top_forward_kernel_calls_per_forward", "calls/fwd", ".1f"),
                   ("top_forward_backward_kernel", "top fwd+bwd kernel", ""),
                   ("matmul_pct_forward", "matmul % fwd-only", ".1f"),
                   ("matmul_pct_train_step", "matmul % train step", ".1f"),
                   ("softmax_matmul_time_ratio", "softmax/matmul time", ".3g"),
                   ("softmax_matmul_flop_ratio", "softmax/matmul FLOPs", ".3g"), ("runs", "runs", "")]


def summary_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A row per (size, context, variant) of the records (one per report), in the order they were made: the
    forward pass from the forward-only run (else a training run's forward phase), the matmul share of a training
    step, the top kernel of forward + backward."""
    groups: dict[tuple[str, int, str], dict[str, dict[str, Any]]] = {}
    for record in records:
        size, context, mode, variant = REPORT_NAME.fullmatch(Path(record["config"]["report"]).name).groups()
        groups.setdefault((size, int(context), variant or ""), {})[mode] = record
    rows = []
    for (size, context, variant), runs in groups.items():
        done = {mode: record["summary"] for mode, record in runs.items() if "summary" in record}
        row: dict[str, Any] = {"size": size, "context_length": context, "variant": variant,
                               "runs": {mode: record["status"] for mode, record in runs.items()}}
        if mode := next((m for m in ("forward", "forward-backward", "train") if m in done), None):
            row["forward_from"] = mode
            row.update({k: done[mode][k] for k in FORWARD_FACTS})
        if "train" in done:
            row["matmul_pct_train_step"] = done["train"]["matmul_pct_all"]
        row["top_forward_backward_kernel"] = (done.get("train") or done.get("forward-backward") or {}).get(
            "top_forward_backward_kernel")
        rows.append(row)
    return rows


def render_summary(records: list[dict[str, Any]], fmt: str = "github") -> str:
    """nsys_profile (a)-(e) across nsys_run.sh's reports, with notes on where the columns come from."""
    rows = summary_rows(records)
    notes = ["rows without a forward-only report take the forward columns from the forward phase of their "
             "training (or forward-backward) run: `forward_from` in the records"] * any(
        row.get("forward_from", "forward") != "forward" for row in rows)
    made = [r["summary"] for r in records if "summary" in r]
    if made and not any(facts["kernels"] for facts in made):
        notes.append("no CUDA kernel data in these reports (nsys recorded no GPU work, as on a machine "
                     "without a GPU): the kernel, matmul and softmax columns are empty")
    elif made:
        notes.append("kernel names are shortened; each report's <report>.md has them in full, the JSONL too")
    env = next((r["environment"] for r in records if "summary" in r and r.get("environment")), None)
    header = results.environment_header(env, reports=len(records)) if env else f"reports: {len(records)}"
    spec = [c for c in SUMMARY_COLUMNS if c[0] != "variant" or any(row["variant"] for row in rows)]
    shown = [{**row, "runs": ", ".join(f"{mode} {status}" for mode, status in row["runs"].items()),
              **{k: short_name(row[k], 48) for k in ("top_forward_kernel", "top_forward_backward_kernel")
                 if row.get(k)}} for row in rows]
    table = _render(shown, [(key, head) for key, head, _ in spec], fmt, [f or "g" for *_, f in spec])
    return "\n".join([header, "", "### nsys_run.sh summary: the forward pass, and the matmul share of inference "
                      "vs a training step", "", table] + [""] * bool(notes) + [f"- {note}" for note in notes])


def write_summary(prefixes: list[Path], results_dir: str, out: str | None = None, fmt: str = "github") -> None:
    """--summary: the summary of reports made earlier, printed and saved as
    <results_dir>/nsys/<out or summary-<time>>.{md,jsonl}, a record per report."""
    files = results.ResultFiles(results_dir, "nsys", out, "summary")
    records = []
    for prefix in prefixes:
        size, context, mode, _ = REPORT_NAME.fullmatch(prefix.name).groups()
        value = {k: v for k, v in profiled(prefix).items() if k != "tables"}
        records.append({"experiment": "nsys_run", "config": {"size": size, "context_length": int(context),
                                                             "mode": mode, "report": str(prefix)},
                        "label": f"{size} ctx={context} {mode}", **value})
        files.append_record(records[-1])
    files.publish(lambda chosen: render_summary(records, chosen), fmt)


# ---- command line ----


def key_values(p: argparse.ArgumentParser, items: list[str], keys: tuple[str, ...], flag: str, what: str,
               convert: Any = str) -> dict[str, Any]:
    """--ranges forward=NAME ... / --stopwatch forward=MS,...: KEY=VALUE, KEY one of `keys`, each once."""
    pairs: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        results.refuse(p, [(not sep or key not in keys or not value,
                            f"{flag}: give KEY={what} with KEY one of {', '.join(keys)}, got {item!r}"),
                           (key in pairs, f"{flag}: {key} given twice")])
        try:
            pairs[key] = convert(value)
        except ValueError as exc:
            p.error(f"{flag}: {exc}")
    return pairs


def milliseconds(text: str) -> float:
    with contextlib.suppress(ValueError):
        if 0 < float(text) < math.inf:
            return float(text)
    raise ValueError(f"times are milliseconds (positive finite numbers), got {text!r}")


def is_trace(source: str | Path) -> bool:
    return str(source).endswith((".json", ".json.gz"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = results.ArgParser(description=__doc__.split("\n\n")[0],
                          epilog="Profiles with nsys, and these tables beside each: bash nsys_run.sh (its --help: "
                                 "bash nsys_run.sh --help).")
    p.add_argument("source", nargs="+", help="a torch.profiler trace (.json, .json.gz), an nsys report "
                   "X.nsys-rep, its export X.sqlite, or the prefix X; with --summary, nsys_run.sh's reports")
    p.add_argument("--summary", action="store_true", help="one table across nsys_run.sh's reports, a row per "
                   "size, context and variant, in <results-dir>/nsys/summary-<time>.{md,jsonl}")
    one = p.add_argument_group("one report or trace (not with --summary)")
    one.add_argument("--e2e-jsonl", help="bench_e2e's record of the profiled run: the stopwatch of table 1, "
                     "the model's shape for the FLOPs of table 4")
    one.add_argument("--stopwatch", nargs="+", metavar="PHASE=MS", help="your own ms per step for table 1, "
                     "e.g. forward=66.5 backward=80 or forward=66.5,backward=80 (PHASE: forward, backward, "
                     "optimizer, step)")
    one.add_argument("--ranges", nargs="+", metavar="KEY=NAME", help="your range names where they are not a "
                     f"usual spelling, e.g. forward='Model Forward' (KEY: {', '.join(RANGE_KEYS)})")
    one.add_argument("--export-dir", metavar="DIR",
                     help="where the SQLite export of a .nsys-rep goes (default: beside it)")
    one.add_argument("--top", type=results.positive_int, help="kernels per top-kernels table (default: 10)")
    one.add_argument("--md", help="also write the tables to this file, replacing it")
    results.add_output_args(p.add_argument_group("with --summary only: its files (but --fmt either way)"),
                            "summary-<UTC time>")
    args = p.parse_args(argv)
    if args.summary:
        args.source = [Path(s).with_suffix("") if Path(s).suffix in (*REPORT_SUFFIXES, ".sqlite") else Path(s)
                       for s in args.source]
        results.refuse(p, [(args.e2e_jsonl or args.stopwatch or args.ranges or args.export_dir or args.top or args.md,
                            "--summary reads each report's own export and <report>_e2e.jsonl: no --e2e-jsonl, "
                            "--stopwatch, --ranges, --export-dir, --top or --md")] + [
            (is_trace(s) or not REPORT_NAME.fullmatch(s.name), f"{s}: --summary reads nsys_run.sh's reports "
             "(<size>_ctx<context>_<mode>[_<variant>]); a torch.profiler trace or another report: "
             "kernel_tables.py SOURCE") for s in args.source])
        return args
    results.refuse(p, [(args.out is not None or args.results_dir != "results", "--out and --results-dir go with "
                        "--summary (its files); one report's tables go to stdout, and to a file with --md FILE"),
                       (len(args.source) != 1, f"one report or trace at a time ({len(args.source)} given); "
                                               "--summary tabulates several"),
                       (args.stopwatch and args.e2e_jsonl,
                        "give --e2e-jsonl (bench_e2e's record) or --stopwatch (your own times), not both")])
    args.source = args.source[0]
    args.stopwatch = key_values(p, [part for given in args.stopwatch or [] for part in given.split(",")],
                                (*PHASES, STEP), "--stopwatch", "MS", milliseconds)
    args.ranges = key_values(p, args.ranges or [], RANGE_KEYS, "--ranges", "NAME")
    found = Path(args.source) if is_trace(args.source) else report_file(args.source)
    export_dir = Path(args.export_dir or ".")
    while not export_dir.exists():  # made when missing: its first existing parent must be a writable folder
        export_dir = export_dir.parent
    md = Path(args.md or "x")
    results.refuse(p, [
        (not found.is_file(), f"no such trace or report: {found} (a .json trace, X.nsys-rep, X.sqlite or X)"),
        (args.export_dir and not export_dir.is_dir(), f"--export-dir: {export_dir} is not a folder"),
        (args.export_dir and not os.access(export_dir, os.W_OK), f"--export-dir: {export_dir} is not writable"),
        (args.e2e_jsonl and not Path(args.e2e_jsonl).exists(), f"no such file: {args.e2e_jsonl}"),
        (md.is_dir() or str(args.md).endswith("/") or not md.parent.is_dir() or args.md == "",
         f"--md must name a file in an existing folder, got {args.md!r}")])
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summary:
        write_summary(args.source, args.results_dir, args.out, args.fmt)
        return 0
    try:  # a malformed input is one line and exit 2, like any other bad input
        record = last_e2e_record(args.e2e_jsonl) if args.e2e_jsonl else {}
        header = profile_header(record.get("environment"), args.source)
        if record and record.get("status") not in FINISHED:
            print(f"the profiled run did not finish: status {record.get('status')!r}", file=sys.stderr)
            return 1
        stopwatch = stopwatch_ms(record) if record else args.stopwatch
        profile = load_torch_trace(args.source) if is_trace(args.source) else \
            load_report(args.source, args.export_dir and Path(args.export_dir))
    except (KeyError, TypeError, ValueError, AttributeError, OSError) as exc:  # fields of another shape
        said = exc if isinstance(exc, ProfileFormatError) else \
            f"{args.e2e_jsonl or args.source}: malformed or unreadable: {type(exc).__name__}: {exc}"
        print(f"error: {said}", file=sys.stderr)
        return 2
    config = record.get("config") or {}
    tables = build_tables(profile, stopwatch, attention_shape(config), args.top or 10, bool(config.get("compile")),
                          args.ranges, "bench_e2e's stopwatch" if record else "your stopwatch (--stopwatch)")
    text = header + "\n\n" + render_tables(tables, args.fmt)
    if args.md:
        try:
            Path(args.md).write_text(text + "\n")
        except OSError as exc:
            print(f"error: cannot write {args.md}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    if results.emit(text) and args.md:
        results.emit(f"\nwrote {args.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
