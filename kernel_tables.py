"""Kernel-level profile tables, from an Nsight Systems report or a torch.profiler trace.

Answers the study's profiling questions: where does the time of a step go, kernel by kernel; which kernels
dominate the forward pass and how many times they run per step; how the share of matrix multiplication changes
from inference to a training step; how softmax compares with the attention matmuls for its FLOPs.

    bash nsys_run.sh medium 256                                   # profiles with nsys, then runs this script
    python kernel_tables.py results/nsys/medium_ctx256_train.nsys-rep --e2e-jsonl results/nsys/medium_ctx256_train_e2e.jsonl
    python bench_e2e.py --size tiny --profile                     # torch.profiler instead, tables printed
    python kernel_tables.py results/profile/tiny_ctx128_train_fp32-20250101-120000.json   # re-read a saved trace
    python kernel_tables.py --summary results/nsys/*_ctx*.nsys-rep   # one table across several nsys reports

Four tables, the same for both sources:
  1. phase times: mean duration of the forward / backward / optimizer ranges per step, beside bench_e2e's own
     stopwatch for the same run, and the kernel time inside each phase;
  2. top kernels by total time, for the whole measured region and for each phase;
  3. category shares (matrix multiply, elementwise, reduction/softmax, memory copy/set, other) per phase;
  4. inside attention: time per call of "computing attention scores", "computing softmax" and "final matmul"
     beside their FLOPs.
With --summary (nsys_run.sh runs it after several configurations), one row per size, context and variant across
nsys reports, forward-only and training runs side by side: the forward pass (Nsight range vs stopwatch, its top
kernel and calls per forward pass), the matmul share of the forward pass vs the training step, softmax vs the
attention matmuls in time and in FLOPs.

A kernel belongs to the phase whose time window contains its LAUNCH (the CUDA runtime call), whatever thread
launched it: PyTorch launches backward kernels from its autograd worker thread, so the launching thread's own
range stack (what nsys's nvtx_kern_sum uses) would miss them. A kernel that runs after its window closed
(asynchronous launch) still counts for the phase that launched it. On a CPU there are no kernels: the unit of
work is an operator's self CPU time, attributed by when it started.
"""
from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import cli
import model_config
import results
from results import FINISHED

PHASES = ("forward", "backward", "optimizer")
MEASURE = "measure"
ATTENTION_STEPS = ("computing attention scores", "computing softmax", "final matmul")
CATEGORIES = ("matrix multiply", "elementwise", "reduction/softmax", "memory copy/set", "other")
OUTSIDE = "outside phases"
AGREEMENT = 0.10  # profiler range vs stopwatch: within 10% counts as agreeing

# The nsys stats reports the tables are built from (their names since the 2023 releases; older ones say gputrace,
# cudaapitrace, nvtxpptrace; nsys_run.sh checks the nsys at hand). cuda_gpu_kern_sum only cross-checks the total.
NSYS_TRACE_REPORTS = ("cuda_gpu_trace", "cuda_api_trace", "nvtx_pushpop_trace")


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


# ---- kernel-name classifier ----

# First match wins, so the specific families come first: PyTorch's copy and its gather / index kernels are
# elementwise_kernel templates (direct_copy_kernel_cuda, _scatter_gather_elementwise_kernel,
# index_elementwise_kernel), and cuBLAS's split-K epilogue is called splitKreduce but belongs to its GEMM.
# Inductor names its kernels triton_<first 3 letters of the kind>_: poi(ntwise), red(uction), per(sistent
# reduction), for(each), spl(it scan), tem(plate) (torch/_inductor/codegen/triton.py).
_KERNEL_RULES: list[tuple[str, re.Pattern]] = [
    # copies and fills, and the indexing kernels (gather, scatter, index, index_put, index_select, the embedding
    # lookup and its backward): they move data and compute nothing
    ("memory copy/set", re.compile(
        r"direct_copy_kernel|\[CUDA mem(cpy|set)|^Mem(cpy|set)\b|CatArrayBatchedCopy|FillFunctor|copy_kernel"
        r"|gather|scatter|index_elementwise|indexing_backward|index_put|indexSelect|index_select|embedding_backward",
        re.IGNORECASE)),
    # cuBLAS sgemm (ampere_/volta_sgemm_*), xmma (sm80_/sm90_xmma_*), CUTLASS (cutlass::Kernel2<cutlass_80_...gemm>),
    # Hopper cuBLAS (nvjet_*), gemv, inductor matmul templates (triton_tem_*), and fused attention kernels, whose
    # time is dominated by their two matmuls: FlashAttention (pytorch_flash::flash_fwd_kernel, flash::FlashAttn...
    # Sm90/Sm100), memory-efficient (fmha_cutlassF/B), cuDNN's (cudnn_generated_fort_native_sdpa_sm90_flash_fprop_*)
    ("matrix multiply", re.compile(
        r"gemm|gemv|nvjet|xmma|cutlass|cublas|splitKreduce|^triton_tem_|flash|fmha|_sdpa_", re.IGNORECASE)),
    # softmax kernels (cunn_SoftMax*, softmax_warp_*), at::native::reduce_kernel (sum, amax, mean), scans
    # (cumsum: tensor_kernel_scan_*, cub's DeviceScanKernel), inductor reductions and scans (triton_red_/per_/spl_)
    ("reduction/softmax", re.compile(r"softmax|reduce_kernel|scan|^triton_(red|per|spl)_|welford", re.IGNORECASE)),
    # at::native::{vectorized_,unrolled_,}elementwise_kernel, inductor pointwise and foreach kernels
    # (triton_poi_*, triton_for_*), the multi-tensor (foreach) kernels of the optimizer, and the grad scaler's
    # one-thread scale update (amp_update_scale_cuda_kernel)
    ("elementwise", re.compile(r"elementwise_kernel|^triton_(poi|for)_|multi_tensor_apply|foreach|amp_update_scale",
                               re.IGNORECASE)),
]

# CPU operators (torch.profiler without CUDA) by their aten name, without the trailing "_" of in-place variants.
_OP_CATEGORIES: dict[str, frozenset[str]] = {
    "matrix multiply": frozenset({
        "mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot", "einsum",
        "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention"}),
    "reduction/softmax": frozenset({
        "sum", "mean", "amax", "amin", "max", "min", "softmax", "_softmax", "_softmax_backward_data",
        "log_softmax", "_log_softmax", "_log_softmax_backward_data", "logsumexp", "norm", "var", "std",
        "argmax", "argmin", "prod", "cumsum"}),
    "memory copy/set": frozenset({
        "copy", "clone", "contiguous", "zero", "fill", "zeros", "zeros_like", "ones", "ones_like", "full",
        "full_like", "cat", "stack", "to", "_to_copy", "empty", "empty_like", "empty_strided", "new_zeros",
        "new_empty", "new_empty_strided", "gather", "scatter", "scatter_add", "index", "index_put",
        "_index_put_impl", "index_select", "embedding", "embedding_backward", "embedding_dense_backward"}),
    "elementwise": frozenset({
        "add", "sub", "rsub", "mul", "div", "neg", "exp", "log", "sigmoid", "silu", "rsqrt", "sqrt", "pow",
        "tanh", "gelu", "relu", "where", "masked_fill", "abs", "reciprocal", "lerp", "addcmul", "addcdiv",
        "maximum", "minimum", "clamp", "ge", "gt", "le", "lt", "eq", "ne", "cos", "sin", "square",
        "sigmoid_backward", "silu_backward", "tanh_backward", "threshold_backward", "gelu_backward"}),
}


def classify_kernel(name: str) -> str:
    """One of CATEGORIES for a GPU kernel name (any family PyTorch, cuBLAS, CUTLASS or inductor emits) or a CPU
    operator name ("aten::mm")."""
    if name.startswith("aten::"):
        op = name[len("aten::"):]
        if op.startswith("_foreach_"):
            return "elementwise"
        for category, ops in _OP_CATEGORIES.items():
            if op in ops or op.rstrip("_") in ops:
                return category
        return "other"
    for category, pattern in _KERNEL_RULES:
        if pattern.search(name):
            return category
    return "other"


def short_name(name: str, width: int = 90) -> str:
    """A kernel name as a table can show it: no leading 'void', no parameter list, at most `width` chars."""
    text = name.removeprefix("void ").strip()
    if text.endswith(")"):  # drop the trailing (parameter list), matching nested parentheses
        depth = 0
        for i in range(len(text) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(text[i], 0)
            if depth == 0:
                text = text[:i] if i > 0 else text
                break
    text = text.replace("|", "/")  # a pipe would split a markdown table cell
    return text if len(text) <= width else text[: width - 1] + "…"


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
    return path.with_suffix("") if path.suffix in (".nsys-rep", ".sqlite", ".qdrep") else path


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


def load_profile(source: str | Path) -> Profile:
    """A torch.profiler trace (.json / .json.gz) or an nsys report (X.nsys-rep, X.sqlite or the CSV prefix X)."""
    path = Path(source)
    if path.name.endswith((".json", ".json.gz")):
        return load_torch_trace(path)
    return load_nsys(nsys_prefix(path))


# ---- what bench_e2e's record says ----


def stopwatch_ms(record: dict[str, Any]) -> dict[str, float]:
    """A bench_e2e record's own mean time per phase and per step (ms), from its raw samples."""
    keys = ("forward", "backward", "optimizer", "step")
    return {k: statistics.fmean(record[f"{k}_ms"]) for k in keys if record.get(f"{k}_ms")}


def attention_shape(config: dict[str, Any] | None) -> dict[str, int] | None:
    """batch, seq, d_model, heads from a record's "config" (dataclasses.asdict(RunConfig)); None without one."""
    try:
        model = config["model"]
        return {"batch": config["batch_size"], "seq": model["context_length"], "d_model": model["d_model"],
                "heads": model["num_heads"]}
    except (KeyError, TypeError):
        return None


# ---- attributing work to ranges ----


class Windows:
    """Time windows (ranges) of some names, to find the innermost one that contains a timestamp. Windows of the
    same family may nest (then the innermost wins) or not; each timestamp gets at most one, so nested ranges are
    never counted twice."""

    def __init__(self, ranges: Iterable[Range]):
        self.ranges = sorted(ranges, key=lambda r: (r.start_ns, -r.end_ns))
        self._starts = [r.start_ns for r in self.ranges]
        self._max_end: list[float] = []  # running max of end: lets the backward scan stop early
        for r in self.ranges:
            self._max_end.append(max(r.end_ns, self._max_end[-1]) if self._max_end else r.end_ns)

    def find(self, t_ns: float) -> Range | None:
        i = bisect.bisect_right(self._starts, t_ns) - 1
        while i >= 0 and self._max_end[i] >= t_ns:
            if self.ranges[i].end_ns >= t_ns:
                return self.ranges[i]
            i -= 1
        return None

    def __len__(self) -> int:
        return len(self.ranges)


def measured(profile: Profile) -> tuple[list[Activity], list[Range]]:
    """The activities launched, and the ranges started, inside a "measure" range (bench_e2e's timed steps), so
    warm-up never pollutes the tables; everything when the trace has no measure range (an nsys capture range
    already cut it to the measured steps)."""
    measure = Windows(r for r in profile.ranges if r.name == MEASURE)
    if not len(measure):
        return profile.activities, profile.ranges
    return ([a for a in profile.activities if measure.find(a.launch_ns)],
            [r for r in profile.ranges if r.name != MEASURE and measure.find(r.start_ns)])


def attribute(activities: list[Activity], ranges: list[Range], names: Iterable[str]) -> dict[str, list[Activity]]:
    """Activities grouped by the innermost range of `names` containing their launch (OUTSIDE when none)."""
    windows = Windows(r for r in ranges if r.name in set(names))
    groups: dict[str, list[Activity]] = {}
    for a in activities:
        window = windows.find(a.launch_ns)
        groups.setdefault(window.name if window else OUTSIDE, []).append(a)
    return groups


# ---- FLOPs of the attention sub-steps ----


def softmax_flops(batch: int, heads: int, seq: int) -> int:
    """The hand-written softmax (model.softmax) over (batch, heads, seq, seq) scores: a max, a subtraction, an exp,
    a sum and a division per element, each counted as one FLOP (exp costs more instructions than that)."""
    return 5 * batch * heads * seq * seq


def attention_step_flops(shape: dict[str, int]) -> dict[str, int]:
    """FLOPs of one call (one layer, all heads) of each attention sub-step. The scores range also scales and
    masks, elementwise work not counted here."""
    matmul = model_config.attention_matmul_flops(shape["batch"], shape["seq"], shape["d_model"]) // 2  # one of QK^T, PV
    return {"computing attention scores": matmul, "final matmul": matmul,
            "computing softmax": softmax_flops(shape["batch"], shape["heads"], shape["seq"])}


# ---- the four tables ----


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _ms(ns: float) -> float:
    return ns / 1e6


def phase_rows(ranges: list[Range], groups: dict[str, list[Activity]], phases: list[str], steps: int,
               stopwatch: dict[str, float], measure_ns: float | None, has_work: bool = True) -> list[dict[str, Any]]:
    """Table 1: per phase, the mean range duration against the stopwatch, and the work time inside it (left
    empty, not zero, when the profile recorded no work at all)."""
    rows = []
    for phase in phases:
        range_ms = _mean([_ms(r.duration_ns) for r in ranges if r.name == phase])
        work_ms = _ms(sum(a.duration_ns for a in groups.get(phase, []))) / steps
        rows.append({"phase": phase, "range_ms": range_ms, "stopwatch_ms": stopwatch.get(phase), "work_ms": work_ms})
    if measure_ns is not None:
        work_ms = _ms(sum(a.duration_ns for acts in groups.values() for a in acts)) / steps
        rows.append({"phase": "step", "range_ms": _ms(measure_ns) / steps, "stopwatch_ms": stopwatch.get("step"),
                     "work_ms": work_ms})
    for row in rows:
        if row["range_ms"] and row["stopwatch_ms"]:
            row["ratio"] = row["range_ms"] / row["stopwatch_ms"]
            row["agrees"] = "yes" if abs(row["ratio"] - 1) <= AGREEMENT else "NO"
        if not has_work:
            row["work_ms"] = None
        elif row["range_ms"]:
            row["work_pct_of_range"] = 100 * row["work_ms"] / row["range_ms"]
    return rows


def top_rows(activities: list[Activity], steps: int, top: int) -> list[dict[str, Any]]:
    """Table 2 for one scope: the `top` names by total time, then one row for all the others."""
    by_name: dict[str, list[float]] = {}
    for a in activities:
        by_name.setdefault(a.name, []).append(a.duration_ns)
    total = sum(sum(d) for d in by_name.values()) or 1.0
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
    rows = [{"name": name, "category": classify_kernel(name), "total_ms": _ms(sum(d)),
             "share_pct": 100 * sum(d) / total, "instances": len(d), "per_step": len(d) / steps,
             "mean_us": sum(d) / len(d) / 1e3} for name, d in ranked[:top]]
    rest = ranked[top:]
    if rest:
        rest_ns = sum(sum(d) for _, d in rest)
        count = sum(len(d) for _, d in rest)
        rows.append({"name": f"({len(rest)} others)", "category": "", "total_ms": _ms(rest_ns),
                     "share_pct": 100 * rest_ns / total, "instances": count, "per_step": count / steps,
                     "mean_us": rest_ns / count / 1e3})
    return rows


def category_row(scope: str, activities: list[Activity], steps: int) -> dict[str, Any]:
    """Table 3 for one scope: percent of its time in each category (they add up to 100)."""
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for a in activities:
        totals[classify_kernel(a.name)] += a.duration_ns
    total = sum(totals.values())
    row: dict[str, Any] = {"scope": scope, "ms_per_step": _ms(total) / steps}
    for category, ns in totals.items():
        row[category] = 100 * ns / total if total else 0.0
    return row


def attention_rows(activities: list[Activity], ranges: list[Range], steps: int,
                   shape: dict[str, int] | None) -> list[dict[str, Any]]:
    """Table 4: time per call of each attention sub-step, its FLOPs and achieved GFLOP/s."""
    groups = attribute(activities, ranges, ATTENTION_STEPS)
    flops = attention_step_flops(shape) if shape else {}
    rows = []
    for step in ATTENTION_STEPS:
        calls = sum(1 for r in ranges if r.name == step)
        if not calls:
            continue
        ms_per_call = _ms(sum(a.duration_ns for a in groups.get(step, []))) / calls
        row = {"sub_step": step, "calls": calls, "calls_per_step": calls / steps, "ms_per_call": ms_per_call,
               "gflop_per_call": flops[step] / 1e9 if step in flops else None}
        if row["gflop_per_call"] and ms_per_call:
            row["gflops"] = row["gflop_per_call"] / (ms_per_call / 1e3)
        rows.append(row)
    return rows


def softmax_matmul_ratios(rows: list[dict[str, Any]]) -> tuple[float, float | None] | None:
    """(softmax's time per call / one attention matmul's, softmax's FLOPs / one matmul's) from table 4, the matmul
    being the mean of the two matmul sub-steps; the FLOP ratio is None without the model's shape, and the whole
    is None without the sub-steps (sdpa, compiled) or without matmul time."""
    by = {r["sub_step"]: r for r in rows}
    matmuls = [by[s] for s in ("computing attention scores", "final matmul") if s in by]
    softmax = by.get("computing softmax")
    if not (softmax and matmuls):
        return None
    matmul_ms = statistics.fmean(r["ms_per_call"] for r in matmuls)
    if not matmul_ms:
        return None
    gflops = [r["gflop_per_call"] for r in matmuls if r.get("gflop_per_call")]
    flop_ratio = (softmax["gflop_per_call"] / statistics.fmean(gflops)
                  if softmax.get("gflop_per_call") and gflops else None)
    return softmax["ms_per_call"] / matmul_ms, flop_ratio


def softmax_vs_matmul(rows: list[dict[str, Any]]) -> str | None:
    """One line: softmax's time and FLOPs against the mean of the two matmul sub-steps, and their quotient."""
    ratios = softmax_matmul_ratios(rows)
    if ratios is None:
        return None
    time_ratio, flop_ratio = ratios
    line = f"softmax takes {time_ratio:.2f}x the time of one attention matmul"
    if flop_ratio:
        line += f" for {flop_ratio:.3f}x its FLOPs: {time_ratio / flop_ratio:.0f}x more time per FLOP"
    return line


NO_KERNELS = ("no CUDA kernel data in this report: nsys recorded no GPU work (a machine without a GPU, or a "
              "profile without --trace=cuda), so only the phase ranges are shown")


def build_tables(profile: Profile, stopwatch: dict[str, float] | None = None,
                 shape: dict[str, int] | None = None, top: int = 10, compiled: bool = False) -> dict[str, Any]:
    """All four tables as JSON-ready rows, from the measured region of `profile`. A profile without any work
    (an nsys report of a CPU-only run) gets table 1's ranges and stopwatch only, and says so. `compiled`: the
    profiled run used torch.compile, which emits no attention sub-step ranges (common.annotate)."""
    activities, ranges = measured(profile)
    phases = [p for p in PHASES if any(r.name == p for r in ranges)]
    steps = max([sum(1 for r in ranges if r.name == p) for p in phases], default=0) or 1
    groups = attribute(activities, ranges, phases)
    measure = [r.duration_ns for r in profile.ranges if r.name == MEASURE]
    notes = list(profile.notes)
    if not phases:
        notes.append("no forward/backward/optimizer ranges in the trace: was bench_e2e run with --nvtx (nsys) or "
                     "--profile (torch.profiler)?")
    has_work = bool(profile.activities)
    phase_table = phase_rows(ranges, groups, phases, steps, stopwatch or {}, sum(measure) if measure else None,
                             has_work)
    if not has_work:
        notes.append(NO_KERNELS if profile.device == "gpu" else "no operator data in this trace")
        return {"device": profile.device, "source": profile.source, "steps": steps, "phases": phase_table,
                "top": {}, "top_forward_backward": [], "categories": [], "attention": [], "notes": notes}
    scopes = ["all"] + phases + ([OUTSIDE] if groups.get(OUTSIDE) and phases else [])
    scope_acts = {"all": activities, **{s: groups.get(s, []) for s in scopes[1:]}}
    attention = attention_rows(activities, ranges, steps, shape)
    comparison = softmax_vs_matmul(attention)
    if comparison:
        notes.append(comparison)
    elif not attention and compiled:
        notes.append("no attention sub-step ranges: under torch.compile the attention runs as fused kernels and "
                     "no range is emitted inside compiled code, so per-sub-step times would not mean anything; "
                     "profile an eager run for table 4")
    elif not attention:
        notes.append("no attention sub-step ranges (they come from the naive attention; --attn sdpa has none)")
    # nsys_profile (b) asks whether the forward pass's top kernel also tops forward and backward together
    forward_backward = groups.get("forward", []) + groups.get("backward", [])
    return {"device": profile.device, "source": profile.source, "steps": steps, "phases": phase_table,
            "top": {s: top_rows(scope_acts[s], steps, top) for s in scopes  # a phase that is all of it: once
                    if s == "all" or len(scope_acts[s]) < len(activities)},
            "top_forward_backward": top_rows(forward_backward, steps, 1)[:1] if "backward" in phases else [],
            "categories": [category_row(s, scope_acts[s], steps) for s in scopes],
            "attention": attention, "notes": notes}


# ---- rendering ----


def _render(rows: list[dict[str, Any]], spec: list[tuple[str, str]], fmt: str, floatfmt: str = ".2f") -> str:
    shown = [{header: row.get(key) for key, header in spec} for row in rows]
    return results.render_table(shown, [header for _, header in spec], fmt, floatfmt)


def render_tables(tables: dict[str, Any], fmt: str = "github") -> str:
    """The four tables as text (markdown by default), with a heading each and the notes at the end."""
    gpu = tables["device"] == "gpu"
    work = "kernel" if gpu else "op self-CPU"
    steps = tables["steps"]
    out = [f"### 1. Phase times (mean per step over {steps} steps): profiler ranges vs bench_e2e's stopwatch", "",
           _render(tables["phases"], [("phase", "phase"), ("range_ms", "range ms"), ("stopwatch_ms", "stopwatch ms"),
                                      ("ratio", "range/stopwatch"), ("agrees", "agrees (±10%)"),
                                      ("work_ms", f"{work} ms/step"), ("work_pct_of_range", f"{work} % of range")],
                   fmt, ".3f")]
    for scope, rows in tables["top"].items():
        what = "kernels by GPU time" if gpu else "operators by self CPU time"
        out += ["", f"### 2. Top {what}: {scope}", "",
                _render([{**r, "name": short_name(r["name"])} for r in rows],
                        [("name", "kernel" if gpu else "operator"), ("category", "category"),
                         ("total_ms", "total ms"), ("share_pct", "share %"), ("instances", "instances"),
                         ("per_step", "per step"), ("mean_us", "mean µs")], fmt)]
    if tables["categories"]:
        out += ["", f"### 3. Category shares of {work} time (%)", "",
                _render(tables["categories"], [("scope", "scope"), ("ms_per_step", f"{work} ms/step")]
                        + [(c, c) for c in CATEGORIES], fmt, ".1f")]
    if tables["attention"]:
        out += ["", f"### 4. Inside attention ({work} time per call; FLOPs per call, one layer, all heads)", "",
                _render(tables["attention"], [("sub_step", "sub-step"), ("calls", "calls"),
                                              ("calls_per_step", "calls/step"), ("ms_per_call", "ms/call"),
                                              ("gflop_per_call", "GFLOP/call"), ("gflops", "GFLOP/s")], fmt, ".4g")]
    if tables["notes"]:
        out += [""] + [f"- {note}" for note in tables["notes"]]
    return "\n".join(out)


# ---- one table across several reports (nsys_run.sh with several configurations) ----

# How nsys_run.sh names a report: <size>_ctx<context>_<mode>[_<dtype>][_pytorch][_cudamem][_h2025]
REPORT_NAME = re.compile(r"(?P<size>.+?)_ctx(?P<context>[0-9]+)_(?P<mode>forward-backward|forward|train)"
                         r"(?:_(?P<variant>.+))?")


@dataclass
class ReportSummary:
    """One configuration of the summary: what its report's name says, and its tables or why it has none."""

    prefix: Path
    size: str
    context: int
    mode: str
    variant: str  # the name's suffix after the mode: dtype, nsys pass-through flags, handout ("" for none)
    status: str
    tables: dict[str, Any] | None = None
    record: dict[str, Any] | None = None


def parse_report_name(prefix: str | Path) -> tuple[str, int, str, str]:
    """(size, context, mode, variant) from a report name nsys_run.sh wrote; ProfileFormatError otherwise."""
    match = REPORT_NAME.fullmatch(Path(prefix).name)
    if not match:
        raise ProfileFormatError(f"{prefix}: not a report name that nsys_run.sh writes "
                                 "(<size>_ctx<context>_<mode>[_<variant>])")
    return match["size"], int(match["context"]), match["mode"], match["variant"] or ""


def load_report_summary(prefix: str | Path, status: str | None = None) -> ReportSummary:
    """A report's tables (from its CSVs and its <report>_e2e.jsonl), or, when it has none, why: `status` as given
    (nsys_run.sh: skipped after an OOM, kept, failed), the profiled run's own status (OOM before or during the
    measured steps), or what is missing."""
    size, context, mode, variant = parse_report_name(prefix)
    entry = ReportSummary(Path(prefix), size, context, mode, variant, status or "")
    if status:
        return entry
    jsonl = Path(f"{prefix}_e2e.jsonl")
    try:
        record = last_e2e_record(jsonl) if jsonl.exists() else None
        if record is not None and record.get("status") not in FINISHED:
            entry.status = str(record.get("status"))
            return entry
        if not nsys_report_path(prefix, NSYS_TRACE_REPORTS[0]).exists():
            entry.status = ("not exported: run nsys_run.sh again" if Path(f"{prefix}.nsys-rep").exists()
                            else "no report")
            return entry
        config = (record or {}).get("config") or {}
        entry.tables = build_tables(load_nsys(prefix), stopwatch_ms(record) if record else None,
                                    attention_shape(config), top=1, compiled=bool(config.get("compile")))
        entry.record = record
        entry.status = record["status"] if record else "ok (no _e2e.jsonl: no stopwatch)"
    except ProfileFormatError as exc:
        entry.status = f"error: {exc}"
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a record or CSV of another shape
        entry.status = f"error: {prefix}: malformed: {type(exc).__name__}: {exc}"
    return entry


def _first_kernel(rows: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    return rows[0] if rows and not rows[0]["name"].startswith("(") else None


def summary_rows(entries: list[ReportSummary]) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per (size, context, variant), its modes side by side: the forward pass (Nsight range vs
    stopwatch, top kernel and its calls per forward pass, matmul share, softmax vs the attention matmuls) from
    the forward-only run, the matmul share of the whole step from the training run, the top kernel of forward +
    backward from the training (else forward-backward) run. Rows keep the order of the entries. Also the notes
    the table needs."""
    groups: dict[tuple[str, int, str], dict[str, ReportSummary]] = {}
    for entry in entries:
        groups.setdefault((entry.size, entry.context, entry.variant), {})[entry.mode] = entry
    rows, borrowed = [], False
    for (size, context, variant), runs in groups.items():
        done = {mode: entry for mode, entry in runs.items() if entry.tables is not None}
        row: dict[str, Any] = {"size": size, "context_length": context, "variant": variant,
                               "runs": {mode: entry.status for mode, entry in runs.items()},
                               "reports": {mode: str(entry.prefix) for mode, entry in runs.items()}}
        forward = next((done[m] for m in ("forward", "forward-backward", "train") if m in done), None)
        if forward is not None:
            tables = forward.tables
            borrowed |= forward.mode != "forward"
            row["forward_from"] = forward.mode
            phase = next((r for r in tables["phases"] if r["phase"] == "forward"), {})
            row["forward_nsight_ms"], row["forward_stopwatch_ms"] = phase.get("range_ms"), phase.get("stopwatch_ms")
            # a forward-only run whose forward range holds all the work has only the "all" table
            top = _first_kernel(tables["top"].get("forward") or tables["top"].get("all"))
            if top:
                row["top_forward_kernel"] = top["name"]
                row["top_forward_kernel_calls_per_forward"] = top["per_step"]
            share = next((c for c in tables["categories"] if c["scope"] == "forward"), None)
            row["matmul_pct_forward"] = share["matrix multiply"] if share else None
            ratios = softmax_matmul_ratios(tables["attention"])
            if ratios:
                row["softmax_matmul_time_ratio"], row["softmax_matmul_flop_ratio"] = ratios
        if "train" in done:
            share = next((c for c in done["train"].tables["categories"] if c["scope"] == "all"), None)
            row["matmul_pct_train_step"] = share["matrix multiply"] if share else None
        backward = done.get("train") or done.get("forward-backward")
        top = _first_kernel(backward.tables.get("top_forward_backward")) if backward else None
        if top:
            row["top_forward_backward_kernel"] = top["name"]
        rows.append(row)
    notes = []
    if borrowed:
        notes.append("rows without a forward-only report take the forward columns from the forward phase of "
                     "their training (or forward-backward) run: `forward_from` in the records")
    finished = [entry for entry in entries if entry.tables is not None]
    if finished and not any(entry.tables["top"] for entry in finished):
        notes.append("no CUDA kernel data in these reports (nsys recorded no GPU work, as on a machine without a "
                     "GPU): the kernel, matmul and softmax columns are empty")
    if any(entry.tables is not None and entry.tables["device"] == "gpu" and entry.tables["top"] for entry in entries):
        notes.append("kernel names are shortened; each report's <report>.md has them in full, the JSONL here too")
    return rows, notes


def render_summary(rows: list[dict[str, Any]], notes: list[str], fmt: str = "github") -> str:
    """The summary table: forward pass (nsys_profile (a)-(c), (e)) and matmul shares (d) side by side."""
    shown = [{**row, "top_forward_kernel": short_name(row.get("top_forward_kernel") or "", 48) or None,
              "top_forward_backward_kernel": short_name(row.get("top_forward_backward_kernel") or "", 48) or None,
              "runs": ", ".join(f"{mode} {status}" for mode, status in row["runs"].items())} for row in rows]
    spec = [("size", "size", ""), ("context_length", "ctx", "")]
    if any(row["variant"] for row in rows):
        spec.append(("variant", "variant", ""))
    spec += [("forward_nsight_ms", "fwd ms Nsight", ".2f"), ("forward_stopwatch_ms", "fwd ms stopwatch", ".2f"),
             ("top_forward_kernel", "top forward kernel", ""),
             ("top_forward_kernel_calls_per_forward", "calls/fwd", ".1f"),
             ("top_forward_backward_kernel", "top fwd+bwd kernel", ""),
             ("matmul_pct_forward", "matmul % fwd-only", ".1f"),
             ("matmul_pct_train_step", "matmul % train step", ".1f"),
             ("softmax_matmul_time_ratio", "softmax/matmul time", ".3g"),
             ("softmax_matmul_flop_ratio", "softmax/matmul FLOPs", ".3g"), ("runs", "runs", "")]
    table = results.render_table([{header: row.get(key) for key, header, _ in spec} for row in shown],
                                 [header for _, header, _ in spec], fmt, [f or "g" for _, _, f in spec])
    out = ["### nsys_run.sh summary: the forward pass, and the matmul share of inference vs a training step", "",
           table]
    if notes:
        out += [""] + [f"- {note}" for note in notes]
    return "\n".join(out)


def summary_main(args: argparse.Namespace) -> int:
    """--summary: the table across the given reports, printed and written to results/nsys/summary-<time>."""
    statuses = {}
    for given in args.status or []:
        source = next(s for s in args.source if given.startswith(s + "="))  # parse_args checked there is one
        statuses[source] = given[len(source) + 1:]
    entries = [load_report_summary(nsys_prefix(source), statuses.get(source)) for source in args.source]
    rows, notes = summary_rows(entries)
    env = next((e.record["environment"] for e in entries if e.record and e.record.get("environment")), None)
    header = results.environment_header(env, reports=len(entries)) if env else f"reports: {len(entries)}"
    files = results.ResultFiles(args.results_dir, "nsys", args.out, "summary")
    for row in rows:
        files.append_record(row)
    files.publish(lambda fmt: header + "\n\n" + render_summary(rows, notes, fmt), args.fmt)
    return 0


# ---- command line ----


def last_e2e_record(path: str | Path) -> dict[str, Any]:
    """The record of the profiled configuration in a bench_e2e JSONL file (the last one)."""
    try:
        records = results.read_records(path)
    except (OSError, ValueError) as exc:  # a folder, unreadable, not UTF-8, not JSON lines
        raise ProfileFormatError(f"{path}: not a bench_e2e JSONL file: {exc}") from None
    if not records:
        raise ProfileFormatError(f"{path}: no records")
    if not isinstance(records[-1], dict):
        raise ProfileFormatError(f"{path}: its last line is not a JSON object")
    return records[-1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.ArgParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", nargs="+",
                   help="a torch.profiler trace (.json, .json.gz) or an nsys report: X.nsys-rep, X.sqlite or the "
                        "prefix X of the CSVs `nsys stats --output X` wrote; with --summary, several nsys reports")
    p.add_argument("--summary", action="store_true",
                   help="one table across several nsys_run.sh reports (one row per size, context and variant, "
                        "forward-only and training runs side by side), written to <results-dir>/nsys/summary-<time>"
                        ".{md,jsonl}; each report's stopwatch comes from its own <report>_e2e.jsonl")
    p.add_argument("--status", action="append", metavar="REPORT=TEXT",
                   help="--summary: REPORT was not profiled, for this reason (nsys_run.sh: skipped after an OOM, "
                        "kept, failed); its row says so")
    p.add_argument("--out", default=None, type=results.result_stem,
                   help="--summary: result file stem (default: summary-<UTC timestamp>); never overwritten")
    p.add_argument("--results-dir", default="results", type=results.results_folder,
                   help="--summary: root folder for the result files (they go to its nsys/ folder)")
    p.add_argument("--e2e-jsonl", default=None,
                   help="bench_e2e's JSONL record of the profiled run: stopwatch times for table 1, model shape "
                        "for the FLOPs of table 4, environment for the header")
    p.add_argument("--top", type=cli.positive_int, default=10, help="kernels per top-kernels table")
    p.add_argument("--fmt", default="github", choices=results.TABLE_FORMATS, metavar="FMT",
                   help="tabulate table format: github (markdown, default), latex_booktabs, plain, ...")
    p.add_argument("--md", default=None,
                   help="also write the tables to this file, replacing it (nsys_run.sh: beside the report)")
    args = p.parse_args(argv)
    if args.top <= 0:
        p.error(f"--top must be positive, got {args.top}")
    if args.summary:
        return check_summary_args(p, args)
    if args.status or args.out is not None:
        p.error("--status and --out go with --summary")
    if len(args.source) != 1:
        p.error(f"one report or trace at a time ({len(args.source)} given); --summary tabulates several")
    args.source = args.source[0]
    source = Path(args.source)
    if source.name.endswith((".json", ".json.gz")):
        if not source.exists():
            p.error(f"no such trace: {source}")
    elif not nsys_report_path(nsys_prefix(source), NSYS_TRACE_REPORTS[0]).exists():
        p.error(f"no trace found for {source}: expected {nsys_report_path(nsys_prefix(source), 'cuda_gpu_trace')} "
                "(from nsys stats --format csv --output PREFIX) or a .json torch.profiler trace")
    if args.e2e_jsonl and not Path(args.e2e_jsonl).exists():
        p.error(f"no such file: {args.e2e_jsonl}")
    if args.md is not None:
        md = Path(args.md)
        if not args.md or md.is_dir() or args.md.endswith("/"):
            p.error(f"--md must name a file, and {args.md!r} is a folder")
        if not md.parent.is_dir():
            p.error(f"--md: no such folder: {md.parent}")
    return args


def check_summary_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    if args.e2e_jsonl or args.md:
        p.error("--summary reads each report's own <report>_e2e.jsonl and writes <results-dir>/nsys/summary-<time>"
                ".md: no --e2e-jsonl or --md")
    args.source = [str(nsys_prefix(source)) for source in args.source]
    for source in args.source:
        try:
            parse_report_name(source)
        except ProfileFormatError as exc:
            p.error(str(exc))
    for given in args.status or []:
        if not any(given.startswith(source + "=") for source in args.source):
            p.error(f"--status {given!r} names none of the reports (give REPORT=TEXT, REPORT as in the list)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summary:
        return summary_main(args)
    try:  # a malformed input is one line and exit 2, like any other bad input
        record = last_e2e_record(args.e2e_jsonl) if args.e2e_jsonl else {}
        stopwatch = stopwatch_ms(record) if record else None
        env = record.get("environment")
        header = results.environment_header(env, source=args.source) if env else f"source: {args.source}"
    except ProfileFormatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a JSON object of another shape
        print(f"error: {args.e2e_jsonl}: not a bench_e2e record: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if record and record.get("status") not in FINISHED:
        print(f"the profiled run did not finish: status {record.get('status')!r}", file=sys.stderr)
        return 1
    try:
        profile = load_profile(args.source)
        if profile.device == "gpu" and not args.source.endswith((".json", ".json.gz")):
            check = nsys_kernel_total_check(nsys_prefix(args.source), profile)
            if check:
                profile.notes.append(check)
    except ProfileFormatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, ValueError) as exc:  # events or rows lacking a field, or of the wrong type
        print(f"error: {args.source}: malformed profile: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    config = record.get("config") or {}
    tables = build_tables(profile, stopwatch, attention_shape(config), args.top,
                          compiled=bool(config.get("compile")))
    text = header + "\n\n" + render_tables(tables, args.fmt)
    print(text)
    if args.md:
        try:
            Path(args.md).write_text(text + "\n")
        except OSError as exc:
            print(f"error: cannot write {args.md}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"\nwrote {args.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
