"""Reading a profile into one shape, whatever made it: the CSVs that `nsys stats --format csv` writes for an
Nsight Systems report, or a torch.profiler Chrome trace (.json, .json.gz). Each becomes a Profile: the units of
device work (kernels, memcpys, memsets; on a CPU, operators' self time) with the time their launch was asked for,
and the named ranges (NVTX, record_function). profile_tables.py makes its tables from a Profile. torch-free.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

# The nsys stats reports a Profile is read from (their names since the 2023 releases; nsys_tool.py falls back to
# the older gputrace, cudaapitrace, nvtxpptrace and writes the CSVs under these names). cuda_gpu_kern_sum only
# cross-checks the kernel total.
NSYS_TRACE_REPORTS = ("cuda_gpu_trace", "cuda_api_trace", "nvtx_pushpop_trace")
NSYS_REPORT_SUFFIXES = (".nsys-rep", ".sqlite", ".qdrep")

# ---- the common shape of a profile ----


@dataclass(frozen=True)
class Activity:
    """One unit of device work: a GPU kernel, memcpy or memset; on a CPU, one operator's self time."""

    name: str
    duration_ns: float
    launch_ns: float  # when the host asked for it (the runtime API call); phases are attributed by this


@dataclass(frozen=True)
class Range:
    """One NVTX / record_function range instance (name without its NVTX domain prefix)."""

    name: str
    start_ns: float
    end_ns: float

    @property
    def duration_ns(self) -> float:
        return self.end_ns - self.start_ns


@dataclass
class Profile:
    activities: list[Activity]
    ranges: list[Range]
    device: str  # "gpu" (kernel time) or "cpu" (operator self CPU time)
    source: str
    notes: list[str] = field(default_factory=list)


class ProfileFormatError(ValueError):
    """A report or trace that does not have the expected shape."""


# ---- reading nsys stats CSV reports ----


def strip_domain(name: str) -> str:
    """nsys prints a range as 'domain:name', with an empty domain for the default one (':forward'); torch's
    ranges live in the default domain. 'aten::mm' (no leading colon) is left alone."""
    return name[1:] if name.startswith(":") else name


def split_nsys_csv_line(line: str) -> list[str]:
    """The fields of one line that `nsys stats --format csv` wrote. nsys quotes a field that holds a comma but
    does not double the quotes inside it: the kernel `k<"a, b">(int)` is written `"k<"a, b">(int)"`, which
    Python's csv module splits wrongly. Here a quoted field ends at a quote followed by a comma or the end of the
    line; other quotes inside it are kept (and a doubled quote, should a later nsys escape them, is one quote)."""
    fields: list[str] = []
    i, n = 0, len(line)
    while True:
        if i < n and line[i] == '"':
            chars, j = [], i + 1
            while j < n:
                if line[j] == '"':
                    if j + 1 == n or line[j + 1] == ",":
                        break
                    if line[j + 1] == '"':
                        j += 1
                chars.append(line[j])
                j += 1
            fields.append("".join(chars))
            i = j + 1
        else:
            end = line.find(",", i)
            if end == -1:
                fields.append(line[i:])
                return fields
            fields.append(line[i:end])
            i = end
        if i >= n:
            return fields
        i += 1  # the comma


def read_nsys_csv(source: str | Path, required: Iterable[str]) -> list[dict[str, str]]:
    """Rows of one report that `nsys stats --format csv --output PREFIX` wrote, keys lower-cased ('start (ns)',
    'corrid', 'name').

    As nsys writes them: the file starts at its header (the "Generating SQLite file", "Processing [...]" and
    "SKIPPED: ..." lines go to the console, not into the file), and a report with no data, such as the CUDA
    reports of a run that launched no kernel, is an empty file: no rows."""
    path = Path(source)
    if not path.exists():
        raise ProfileFormatError(f"{path}: no such report (did `nsys stats` write it?)")
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    if not lines:
        return []
    header = [name.strip().lower() for name in split_nsys_csv_line(lines[0])]
    missing = sorted({c.lower() for c in required} - set(header))
    if missing:
        raise ProfileFormatError(f"{path}: the header has no column {', '.join(missing)} (nsys stats with the "
                                 f"default --timeunit nsec writes them); it is: {lines[0][:200]!r}")
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        values = split_nsys_csv_line(line)
        if len(values) != len(header):
            raise ProfileFormatError(f"{path}:{number}: {len(values)} fields where the header has {len(header)}: "
                                     f"{line[:200]!r}")
        rows.append(dict(zip(header, values)))
    return rows


def _number(row: dict[str, str], key: str) -> float | None:
    text = row.get(key, "").strip()
    return float(text) if text else None


def nsys_report_path(prefix: str | Path, report: str) -> Path:
    """Where `nsys stats --format csv --output PREFIX` writes a report: PREFIX_<report>.csv."""
    return Path(f"{prefix}_{report}.csv")


def nsys_prefix(source: str | Path) -> Path:
    """The CSV prefix of a report given as X.nsys-rep, X.sqlite or X itself."""
    path = Path(source)
    return path.with_suffix("") if path.suffix in NSYS_REPORT_SUFFIXES else path


def load_nsys(prefix: str | Path) -> Profile:
    """A profile from the three nsys trace reports: each GPU operation joined to the runtime call that launched
    it by correlation id (exact, whatever thread launched it), and every NVTX push/pop range."""
    gpu = read_nsys_csv(nsys_report_path(prefix, "cuda_gpu_trace"), ("start (ns)", "duration (ns)", "corrid", "name"))
    api = read_nsys_csv(nsys_report_path(prefix, "cuda_api_trace"), ("start (ns)", "corrid"))
    nvtx = read_nsys_csv(nsys_report_path(prefix, "nvtx_pushpop_trace"), ("start (ns)", "end (ns)", "name"))
    launch_at = {row["corrid"]: _number(row, "start (ns)") for row in api if row.get("corrid")}
    activities, unmatched = [], 0
    for row in gpu:
        start, duration = _number(row, "start (ns)"), _number(row, "duration (ns)")
        if start is None or duration is None:
            continue
        launch = launch_at.get(row["corrid"])
        if launch is None:
            unmatched += 1
            launch = start
        activities.append(Activity(row["name"], duration, launch))
    ranges = [Range(strip_domain(row["name"]), _number(row, "start (ns)"), _number(row, "end (ns)"))
              for row in nvtx if row.get("end (ns)", "").strip()]
    profile = Profile(activities, ranges, "gpu", str(prefix))
    if unmatched:
        profile.notes.append(f"{unmatched} GPU operations had no launch record in cuda_api_trace; they were "
                             "attributed by their start time on the GPU")
    return profile


def nsys_kernel_total_check(prefix: str | Path, profile: Profile) -> str | None:
    """Cross-check: the kernel total of cuda_gpu_kern_sum against the trace's (memcpy/memset excluded, as in
    that report). A note when they differ by more than 0.5% (a truncated or mismatched export)."""
    path = nsys_report_path(prefix, "cuda_gpu_kern_sum")
    if not path.exists():
        return None
    summary = read_nsys_csv(path, ("total time (ns)", "instances", "name"))
    summary_ns = sum(_number(row, "total time (ns)") or 0.0 for row in summary)
    trace_ns = sum(a.duration_ns for a in profile.activities if not a.name.startswith("[CUDA mem"))
    if summary_ns and abs(summary_ns - trace_ns) > 0.005 * summary_ns:
        return (f"cuda_gpu_kern_sum totals {summary_ns / 1e6:.3f} ms of kernels but the trace has "
                f"{trace_ns / 1e6:.3f} ms: the exports do not match")
    return None


# ---- reading torch.profiler Chrome traces ----

_GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
_LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")


def load_torch_trace(path: str | Path) -> Profile:
    """A profile from a torch.profiler Chrome trace (.json or .json.gz; times in µs). With CUDA activity, the
    kernels, memcpys and memsets joined to their launching runtime/driver call by correlation id; without, the
    self CPU time of every operator. Ranges are the record_function labels (category user_annotation)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            trace = json.load(f)
    except (OSError, EOFError, ValueError) as exc:  # unreadable, not gzip, truncated, not UTF-8, not JSON
        raise ProfileFormatError(f"{path}: not a readable JSON trace: {exc}") from None
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise ProfileFormatError(f"{path}: not a torch.profiler trace (no traceEvents list)")
    events = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]
    ranges = [Range(e["name"], e["ts"] * 1e3, (e["ts"] + e["dur"]) * 1e3)
              for e in events if e.get("cat") == "user_annotation"]
    gpu_events = [e for e in events if e.get("cat") in _GPU_CATEGORIES]
    if not gpu_events:
        return Profile(cpu_self_times(events), ranges, "cpu", str(path))
    launch_at = {e["args"]["correlation"]: e["ts"] * 1e3
                 for e in events if e.get("cat") in _LAUNCH_CATEGORIES and "correlation" in e.get("args", {})}
    activities, unmatched = [], 0
    for e in gpu_events:
        launch = launch_at.get(e.get("args", {}).get("correlation"))
        if launch is None:
            unmatched += 1
            launch = e["ts"] * 1e3
        activities.append(Activity(e["name"], e["dur"] * 1e3, launch))
    profile = Profile(activities, ranges, "gpu", str(path))
    if unmatched:
        profile.notes.append(f"{unmatched} GPU operations had no launch event; attributed by their GPU start")
    return profile


def cpu_self_times(events: list[dict[str, Any]]) -> list[Activity]:
    """Self CPU time of every operator (category cpu_op): its duration minus that of the operators nested
    directly inside it on the same thread, so aten::linear -> aten::matmul -> aten::mm counts each microsecond
    once. Attributed by the operator's start."""
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in events:
        if e.get("cat") == "cpu_op":
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    activities = []
    for ops in by_thread.values():
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))  # a parent before the children that start with it
        stack: list[list[Any]] = []  # [end µs, event, self µs]
        finished = []
        for e in ops:
            while stack and e["ts"] >= stack[-1][0]:
                finished.append(stack.pop())
            if stack:
                stack[-1][2] -= e["dur"]
            stack.append([e["ts"] + e["dur"], e, e["dur"]])
        finished.extend(stack)
        activities += [Activity(e["name"], max(self_us, 0.0) * 1e3, e["ts"] * 1e3) for _, e, self_us in finished]
    return activities


