"""The four tables of a profile, and the phases they are built on, from a profile_readers.Profile: kernel_tables.py
prints them for an nsys report or a torch.profiler trace, bench_e2e.py --profile under its results table.

  1. phase times: mean duration of the forward / backward / optimizer (and step) ranges per step, beside a
     stopwatch for the same run (bench_e2e's record, or the user's own times), and the work time inside each;
  2. top kernels by total time, for the whole measured region and for each phase;
  3. category shares (matrix multiply, elementwise, reduction/softmax, memory copy/set, other) per phase;
  4. inside attention: time per call of "computing attention scores", "computing softmax" and "final matmul"
     beside their FLOPs.

Phases come from anyone's range names: bench_e2e's own (forward, backward, optimizer inside measure), or the
usual spellings in any case (Forward, fwd, Backward, optimizer step, train step, ...), or the names given with
--ranges; ranges inside warm-up ranges ("warmup", "Warm-up Step 3") never count. A kernel belongs to the phase
whose time window contains its LAUNCH (the CUDA runtime call), whatever thread launched it: PyTorch launches
backward kernels from its autograd worker thread, so the launching thread's own range stack (what nsys's
nvtx_kern_sum uses) would miss them. On a CPU the unit of work is an operator's self CPU time. torch-free.
"""
from __future__ import annotations

import bisect
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

import model_config
import results
from kernel_categories import CATEGORIES, classify_kernel
from profile_readers import Activity, Profile, Range

PHASES = ("forward", "backward", "optimizer")
STEP = "step"
MEASURE = "measure"  # bench_e2e's range around its timed steps
ATTENTION_STEPS = ("computing attention scores", "computing softmax", "final matmul")
OUTSIDE = "outside phases"
AGREEMENT = 0.10  # profiler range vs stopwatch: within 10% counts as agreeing
RANGE_KEYS = (*PHASES, STEP, MEASURE)  # what --ranges KEY=NAME can name


# ---- phases from anyone's range names ----

# The usual names of each phase's range, as people write them in their own NVTX / record_function ranges,
# compared after normalise_range_name (any case; "_", "-", "." and ":" read as spaces; a trailing step number
# dropped, so "Forward", "forward_pass", "Step 3" and "train-step" are recognised).
RANGE_SPELLINGS = {
    "forward": {"forward", "fwd", "forward pass", "model forward"},
    "backward": {"backward", "bwd", "backward pass", "loss backward"},
    "optimizer": {"optimizer", "optimizer step", "optim", "optim step", "opt", "opt step", "optimizer update"},
    STEP: {"step", "train step", "training step", "train iteration", "training iteration", "iteration"},
}
_WARMUP = re.compile(r"\bwarm ?up\b")  # on a normalised name: "warmup", "Warm-up Step 3", "warm up"


def normalise_range_name(name: str) -> str:
    text = re.sub(r"[\s_.:-]+", " ", name.lower()).strip()
    return re.sub(r" ?\d+$", "", text)


def is_warmup(name: str) -> bool:
    return bool(_WARMUP.search(normalise_range_name(name)))


def phase_of(name: str, given: dict[str, str]) -> str | None:
    """The phase (or STEP) a range stands for: the one it was given for with --ranges, else the one whose usual
    spelling it is, unless that phase was given another name."""
    for key, value in given.items():
        if name == value and key != MEASURE:
            return key
    normalised = normalise_range_name(name)
    return next((key for key, names in RANGE_SPELLINGS.items() if key not in given and normalised in names), None)


# ---- what a bench_e2e record says ----


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


# ---- the measured region and its phases ----


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


@dataclass
class Selection:
    """What the tables are made of: the work launched in the measured region, the ranges started in it (phase
    ranges renamed to their phase), and what was used, for table 1 to say."""

    activities: list[Activity]
    ranges: list[Range]
    used: dict[str, Counter] = field(default_factory=dict)  # phase -> {range name as recorded: instances}
    in_warmup: Counter = field(default_factory=Counter)  # phase -> instances inside warm-up ranges, left out
    region: str = ""  # how the measured region was found
    measure_ns: float | None = None  # total duration of the measure ranges, when there are some


def select_measured(profile: Profile, given: dict[str, str] | None = None) -> Selection:
    """The measured region: inside the measure ranges (bench_e2e's timed steps; --ranges measure=NAME for
    another name) when there are some; else from the first to the last phase range outside warm-up ranges (a
    student's own profile: model set-up before and teardown after are not steps); else the whole profile
    without its warm-up ranges. Phase ranges inside warm-up ranges are left out and counted."""
    given = given or {}
    measure_name = given.get(MEASURE, MEASURE)
    measure = Windows(r for r in profile.ranges if r.name == measure_name)
    warmup = Windows(r for r in profile.ranges if is_warmup(r.name))
    chosen = Selection([], [])
    for r in profile.ranges:
        if r.name == measure_name or is_warmup(r.name) or (len(measure) and not measure.find(r.start_ns)):
            continue
        phase = phase_of(r.name, given)
        if phase and warmup.find(r.start_ns):
            chosen.in_warmup[phase] += 1
        elif phase:
            chosen.used.setdefault(phase, Counter())[r.name] += 1
            chosen.ranges.append(Range(phase, r.start_ns, r.end_ns))
        elif not warmup.find(r.start_ns):  # a range that is no phase keeps its name, unless it reads like one
            # (an inner "forward" when --ranges forward=NAME chose another): renamed, it cannot join that phase
            taken = r.name in (*PHASES, STEP)
            chosen.ranges.append(Range(f"{r.name} (not the phase)", r.start_ns, r.end_ns) if taken else r)
    phase_ranges = [r for r in chosen.ranges if r.name in chosen.used]
    if len(measure):
        chosen.activities = [a for a in profile.activities if measure.find(a.launch_ns)]
        chosen.measure_ns = sum(r.duration_ns for r in measure.ranges)
        chosen.region = f"inside the {measure_name!r} ranges"
    elif phase_ranges:
        first, last = min(r.start_ns for r in phase_ranges), max(r.end_ns for r in phase_ranges)
        chosen.activities = [a for a in profile.activities
                             if first <= a.launch_ns <= last and not warmup.find(a.launch_ns)]
        chosen.ranges = [r for r in chosen.ranges if first <= r.start_ns <= last]
        chosen.region = "from the first to the last phase range"
    else:
        chosen.activities = [a for a in profile.activities if not warmup.find(a.launch_ns)]
        chosen.region = "the whole profile"
    if len(warmup) and not len(measure):
        chosen.region += ", warm-up ranges left out"
    return chosen


def ranges_used_line(chosen: Selection, steps: int, steps_from: str) -> str:
    """Table 1's account of its ranges: which names stood for which phase, how many, what was left out."""
    parts = []
    for phase in (*PHASES, STEP):
        names = chosen.used.get(phase)
        if names:
            parts.append(f"{phase} = " + ", ".join(f"'{name}' x{count}" for name, count in names.items()))
    left = [f"{count} {phase}" for phase, count in chosen.in_warmup.items()]
    if STEP not in chosen.used and chosen.measure_ns is not None:  # phase_rows' step row: measured region / steps
        parts.append("step = the measured region over the steps (it also holds what runs between steps, so it "
                     "exceeds a stopwatch's step, the more the shorter the step)")
    line = "ranges used: " + ("; ".join(parts) if parts else "none")
    if left:
        line += f" (left out, inside warm-up ranges: {', '.join(left)})"
    return line + f"; {steps} step{'s' if steps != 1 else ''} ({steps_from}); measured region: {chosen.region}"


NO_PHASE = ("no phase range found: none named forward, backward, optimizer or step in any usual spelling "
            "(Forward, fwd, optimizer step, train step, ...); name yours with --ranges forward=NAME backward=NAME "
            "optimizer=NAME step=NAME (bench_e2e: --nvtx under nsys, --profile for torch.profiler)")


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


def phase_rows(chosen: Selection, groups: dict[str, list[Activity]], phases: list[str], steps: int,
               stopwatch: dict[str, float], has_work: bool = True) -> list[dict[str, Any]]:
    """Table 1: per phase, its ranges' time per step against the stopwatch, and the work time inside it (left
    empty, not zero, when the profile recorded no work at all). The step row comes from step ranges, else from
    the measure ranges over the steps; a profile without any phase gets one row that says so."""
    rows = []
    for phase in phases:  # per step, as the work and the stopwatch are: a phase may run more than once a step
        range_ms = _ms(sum(r.duration_ns for r in chosen.ranges if r.name == phase)) / steps
        work_ms = _ms(sum(a.duration_ns for a in groups.get(phase, []))) / steps
        rows.append({"phase": phase, "range_ms": range_ms, "stopwatch_ms": stopwatch.get(phase), "work_ms": work_ms})
    all_work_ms = _ms(sum(a.duration_ns for acts in groups.values() for a in acts)) / steps
    if STEP in chosen.used:
        rows.append({"phase": STEP, "range_ms": _mean([_ms(r.duration_ns) for r in chosen.ranges if r.name == STEP]),
                     "stopwatch_ms": stopwatch.get(STEP), "work_ms": all_work_ms})
    elif chosen.measure_ns is not None:
        rows.append({"phase": STEP, "range_ms": _ms(chosen.measure_ns) / steps, "stopwatch_ms": stopwatch.get(STEP),
                     "work_ms": all_work_ms})
    if not rows:
        return [{"phase": "no phase range found", "range_ms": None, "stopwatch_ms": None, "work_ms": None}]
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
                 shape: dict[str, int] | None = None, top: int = 10, compiled: bool = False,
                 ranges: dict[str, str] | None = None, stopwatch_source: str = "bench_e2e's stopwatch"
                 ) -> dict[str, Any]:
    """All four tables as JSON-ready rows, from the measured region of `profile` (select_measured). `ranges`:
    --ranges KEY=NAME, range names standing for phases. A profile without any work (an nsys report of a CPU-only
    run) gets table 1's ranges and stopwatch only, and says so. `compiled`: the profiled run used torch.compile,
    which emits no attention sub-step ranges (common.annotate). Without a stopwatch, table 1 says so."""
    chosen = select_measured(profile, ranges)
    phases = [p for p in PHASES if p in chosen.used]
    if STEP in chosen.used:
        steps, steps_from = sum(chosen.used[STEP].values()), "the step ranges"
    elif phases:  # the optimizer runs once a step; forward and backward may run more (gradient accumulation)
        counted = next(p for p in ("optimizer", "backward", "forward") if p in phases)
        steps, steps_from = sum(chosen.used[counted].values()), f"the {counted} ranges"
    else:
        steps, steps_from = 1, "no phase range: the whole region counts as one"
    activities = chosen.activities
    groups = attribute(activities, chosen.ranges, phases)
    notes = list(profile.notes) + ([] if phases or STEP in chosen.used else [NO_PHASE])
    has_work = bool(profile.activities)
    tables = {"device": profile.device, "source": profile.source, "steps": steps,
              "ranges_used": ranges_used_line(chosen, steps, steps_from),
              "stopwatch_source": stopwatch_source if stopwatch else None,
              "phases": phase_rows(chosen, groups, phases, steps, stopwatch or {}, has_work),
              "top": {}, "top_forward_backward": [], "categories": [], "attention": [], "notes": notes}
    if not has_work:
        notes.append(NO_KERNELS if profile.device == "gpu" else "no operator data in this trace")
        return tables
    scopes = ["all"] + phases + ([OUTSIDE] if groups.get(OUTSIDE) and phases else [])
    scope_acts = {"all": activities, **{s: groups.get(s, []) for s in scopes[1:]}}
    attention = attention_rows(activities, chosen.ranges, steps, shape)
    comparison = softmax_vs_matmul(attention)
    if comparison:
        notes.append(comparison)
    elif not attention and compiled:
        notes.append("no attention sub-step ranges: under torch.compile the attention runs as fused kernels and "
                     "no range is emitted inside compiled code, so per-sub-step times would not mean anything; "
                     "profile an eager run for table 4")
    elif not attention:
        notes.append("no attention sub-step ranges (they come from bench_e2e's naive attention; --attn sdpa and "
                     "other models have none)")
    # nsys_profile (b) asks whether the forward pass's top kernel also tops forward and backward together
    forward_backward = groups.get("forward", []) + groups.get("backward", [])
    tables.update(top={s: top_rows(scope_acts[s], steps, top) for s in scopes  # a phase that is all of it: once
                       if s == "all" or len(scope_acts[s]) < len(activities)},
                  top_forward_backward=top_rows(forward_backward, steps, 1)[:1] if "backward" in phases else [],
                  categories=[category_row(s, scope_acts[s], steps) for s in scopes], attention=attention)
    return tables


# ---- rendering ----


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



def _render(rows: list[dict[str, Any]], spec: list[tuple[str, str]], fmt: str, floatfmt: str = ".2f") -> str:
    shown = [{header: row.get(key) for key, header in spec} for row in rows]
    return results.render_table(shown, [header for _, header in spec], fmt, floatfmt)


NO_STOPWATCH = "no stopwatch record"


def render_tables(tables: dict[str, Any], fmt: str = "github") -> str:
    """The four tables as text (markdown by default), with a heading each and the notes at the end. Table 1
    names the ranges it used; without a stopwatch its stopwatch column says so."""
    gpu = tables["device"] == "gpu"
    work = "kernel" if gpu else "op self-CPU"
    steps = tables["steps"]
    # records written before these keys existed were all bench_e2e's own runs, with its stopwatch
    source = tables.get("stopwatch_source", "bench_e2e's stopwatch")
    phases = tables["phases"] if source else [{**row, "stopwatch_ms": NO_STOPWATCH} for row in tables["phases"]]
    against = f"vs {source}" if source else f"({NO_STOPWATCH}: --e2e-jsonl or --stopwatch PHASE=MS gives one)"
    out = [f"### 1. Phase times (mean per step over {steps} steps): profiler ranges {against}", ""]
    if tables.get("ranges_used"):
        out += [tables["ranges_used"], ""]
    out.append(_render(phases, [("phase", "phase"), ("range_ms", "range ms"), ("stopwatch_ms", "stopwatch ms"),
                                ("ratio", "range/stopwatch"), ("agrees", "agrees (±10%)"),
                                ("work_ms", f"{work} ms/step"), ("work_pct_of_range", f"{work} % of range")],
                       fmt, ".3f"))
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
