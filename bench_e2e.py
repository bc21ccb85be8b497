"""End-to-end timing of the Transformer LM: forward, backward and optimizer step, each timed on its own.

Answers the study's benchmarking questions: how long does a step take for each model size, what does warm-up
do, what do bf16 mixed precision and torch.compile buy.

    python bench_e2e.py --size large --warmup 0                  # one size, no warm-up
    python bench_e2e.py --size all                                # the handout's Table 1, one row each
    python bench_e2e.py --size xl --handout 2025                  # sizes from the Spring 2025 handout
    python bench_e2e.py --size all --dtype fp32 bf16 --dry-run    # list the configurations, run nothing
    python bench_e2e.py --size small --warmup 0 1 2 5             # the warm-up study, rows side by side
    python bench_e2e.py --size all --dtype fp32 bf16              # fp32 vs bf16 autocast, with a speed-up table
    python bench_e2e.py --size all --compile off on               # eager vs torch.compile, with a speed-up table
    python bench_e2e.py --size tiny --attn naive sdpa             # naive vs fused (SDPA) attention in the model
    python bench_e2e.py --size tiny --context-length 128 256 512  # a context sweep; OOM stops larger contexts
    python bench_e2e.py --size xl --context-length max            # the longest context that trains
    python bench_e2e.py --size 10B --parallel fsdp --world-size 8 --dry-run   # plan: the state per rank on 8 GPUs
    python bench_e2e.py --size tiny --profile --steps 3           # torch.profiler kernel tables (no nsys needed)
    torchrun --nproc-per-node 8 bench_e2e.py --size xl --parallel ddp fsdp   # 8 GPUs: DDP vs FSDP2, batch per rank

Method. A configuration is built (prepare: runner.Workload makes the model, wraps it in torch.compile when asked,
the optimizer, and one random batch of token ids, all on the device), then measured (runner.measure_steps): with
--compile the first step is timed apart as compile_s; --warmup untimed steps; the CUDA peak counter reset; --steps
timed steps. The timed step is runner.run_step: the forward pass with the loss, loss.backward(), optimizer.step()
with zero_grad(set_to_none=True), each phase between two device synchronisations (common.SyncTimer: synchronise,
read timeit.default_timer, run, synchronise, read), and the whole step the same way. Nothing else is inside the
timers: no data creation (the batch is made once), no .item(), no printing, no compile (its step is timed apart),
no warm-up. Each raw sample is kept; mean and std (and median, min, max) are derived from them.

Variants of one configuration (--dtype, --compile, --attn, --optimizer values) are compared: by default all of them
are built in one process and their timed steps alternate in rounds (A B | B A | ..., runner.measure_interleaved),
each variant with its own compile step, warm-up and memory figures, so that a machine that slows down meanwhile
slows every variant alike; the speed-up is a paired ratio with a 95% interval (stats.py), and a phase the variants
run identically (the optimizer step under --compile) is the control that says when the machine drifted anyway.

Size names and the default context length (512; 128 under --handout 2025) come from the study's handout: the
current one (2026, v26.1.1) unless --handout or CS336_HANDOUT says 2025. Each configuration (or comparison) runs in
its own child process (an OOM cannot poison the next one). The table is printed on stdout and saved with one JSON
record per configuration under results/e2e/. A sweep over variants adds a comparison table (speed-ups over the
first variant); --context-length max adds the longest context of each search. docs/bench_e2e.md says more.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import itertools
import json
import os
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Callable

import torch

import cli
import common
import isolation
import kernel_tables
import model_config
import parallel
import report
import results
import runner
import search
import stats
import sweep
from cli import positive_float, positive_int
from common import DTYPES, matmul_precision_key, peak_tflops, set_ranges
from model import ATTENTION
from model_config import DEFAULT_BATCH_SIZE, DEFAULT_HANDOUT, HANDOUTS, ModelConfig, get_config
from results import FINISHED, GIB, ResultFiles, environment_header, finished, render_table
from runner import MODES, PHASES_BY_MODE, RunConfig, Workload, run_step
from search import SEARCH_START

NOISY_CV = 0.10  # a phase whose std/mean is above this is flagged: don't quote it without a second look


# ---- one configuration: what is timed ----


def prepare(run: RunConfig) -> runner.Prepared:
    """The configuration built on its device (runner.Workload) and its step to time, run_step(work): forward with
    the loss, backward, optimizer step, each between synchronisations. With --profile, torch.profiler around the
    timed steps and its tables after them."""
    set_ranges(nvtx=run.nvtx, profiler=run.profile_results_dir is not None)
    work = Workload(run)
    profiler = profiler_for(run, work.device)
    after = None if run.profile_results_dir is None else (lambda record: profile_tables(run, profiler, record))
    return runner.Prepared(step=lambda: run_step(work), device=work.device, warmup=run.warmup, steps=run.steps,
                           compile_first=run.compile, profiler=profiler, after=after)


def run_config(run: RunConfig) -> dict[str, Any]:
    """One configuration alone (in a child process of the sweep): its record. Failures propagate as exceptions
    (the sweep makes them rows)."""
    return runner.measure(prepare(run))


def measure_together(runs: list[RunConfig], faults: list) -> list[dict[str, Any]]:
    """The variants of one comparison in one process (a child of the sweep), their timed steps interleaved."""
    device = common.resolve_device(runs[0].device)
    return runner.measure_interleaved(device, [functools.partial(prepare, run) for run in runs], faults)


# ---- --profile: torch.profiler over the measured steps ----


def profiler_for(run: RunConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """torch.profiler around the measured steps (CPU activity always, CUDA when on a GPU) when --profile is on;
    a context yielding None otherwise."""
    if run.profile_results_dir is None:
        return contextlib.nullcontext()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return common.quiet_profiler(activities)


def profile_tables(run: RunConfig, profiler: torch.profiler.profile, record: dict[str, Any]) -> dict[str, Any]:
    """Write the Chrome/Perfetto trace under results/profile/ and build kernel_tables' four tables from it, in
    the process that profiled: the parent (and the JSONL record) gets {"profile": trace path and rows}, not the
    profiler object. With --parallel, every rank also measures its time in collectives per phase
    ({"collectives": rows}); only rank 0 keeps its trace and builds the kernel tables."""
    isolation.phase("writing the profiler trace")
    keep = parallel.is_rank_zero()
    if keep:
        stem = f"{run.size}_ctx{run.context_length}_{run.mode}_{run.dtype}"
        stem += f"_{run.parallel}x{run.world_size}" if run.parallel else ""
        trace = ResultFiles(run.profile_results_dir, "profile", None, stem, reserve=".json").path(".json")
    else:
        handle, name = tempfile.mkstemp(suffix=".json")
        os.close(handle)
        trace = Path(name)
    profiler.export_chrome_trace(str(trace))
    out: dict[str, Any] = {}
    try:
        if run.parallel:
            with open(trace) as f:
                out["collectives"] = parallel.collective_rows(json.load(f)["traceEvents"], PHASES_BY_MODE[run.mode])
        if keep:
            tables = kernel_tables.build_tables(kernel_tables.load_torch_trace(trace),
                                                kernel_tables.stopwatch_ms(record),
                                                kernel_tables.attention_shape(dataclasses.asdict(run)),
                                                compiled=run.compile)
            out["profile"] = {"trace": str(trace), "tables": tables}
    finally:
        if not keep:
            trace.unlink()
    return out


def profile_report(records: list[dict], fmt: str) -> str:
    """The --profile tables of every configuration that has them (rank 0's, under --parallel), and with
    --parallel the time in collectives per phase on every rank."""
    parts = []
    for rec in records:
        if "profile" in rec:
            whose = " (rank 0)" if rec["config"].get("parallel") else ""
            parts.append(f"## torch.profiler: {rec['label']}{whose} (timings above were taken with the profiler on)"
                         "\n\n" + kernel_tables.render_tables(rec["profile"]["tables"], fmt)
                         + f"\n\ntrace: {rec['profile']['trace']} (open in https://ui.perfetto.dev)")
        collectives = collectives_table(rec, fmt)
        if collectives:
            parts.append(f"## Collectives per phase: {rec['label']} (every rank, ms per step)\n\n{collectives}")
    return "\n\n".join(parts)


COLLECTIVE_COLUMNS = [("rank", "rank"), ("phase", "phase"), ("phase_ms", "phase ms"),
                      *[(f"{kind}_ms", f"{kind} ms") for kind, _ in parallel.COLLECTIVE_KINDS],
                      ("other collective_ms", "other ms"), ("collective_ms", "in collectives ms"),
                      ("share", "share of phase")]


def collectives_table(record: dict[str, Any], fmt: str) -> str | None:
    """Per rank and phase, the milliseconds per step in each kind of collective and the share of the phase's
    wall time covered by any (parallel.collective_rows), from a --parallel --profile record."""
    rows = [{**row, "rank": rank["rank"], "share": f"{row['share']:.0%}" if row.get("share") is not None else None}
            for rank in record.get("ranks", []) for row in rank.get("collectives", [])]
    if not rows:
        return None
    columns = [(key, header) for key, header in COLLECTIVE_COLUMNS
               if key in ("rank", "phase", "phase_ms", "collective_ms", "share") or any(key in r for r in rows)]
    shown = [{header: row.get(key) for key, header in columns} for row in rows]
    return render_table(shown, [header for _, header in columns], fmt, ".3f") + (
        "\n\nA collective counts for the phase in which it starts; the time is on the wire, and compute may run beside "
        "it (FSDP2 prefetches the next block's all-gather). gloo runs a reduce-scatter as an all-reduce.")


# ---- derived figures ----


def derive_figures(run: RunConfig, record: dict[str, Any], peak_override: float | None = None) -> dict[str, Any]:
    """Statistics per phase, noisy flags, tokens/s, FLOPs, achieved TFLOP/s and MFU for one finished record."""
    phases = PHASES_BY_MODE[run.mode] + ("step",)
    out: dict[str, Any] = runner.sample_stats(record, phases)
    out["noisy"] = [f"{phase} {out[f'{phase}_ms_cv']:.0%}" for phase in phases
                    if out[f"{phase}_ms_cv"] is not None and out[f"{phase}_ms_cv"] > NOISY_CV]
    if out["step_ms_n"] < 2:
        out["note"] = runner.ONE_SAMPLE_NOTE
    step_s = out["step_ms_mean"] / 1e3  # under --parallel: the slowest rank's step, what the global step costs
    # the global batch: --batch-size is per rank, and every rank does the same work on its own sequences
    tokens = run.batch_size * run.context_length * run.world_size
    flops = model_config.step_flops(run.model, run.batch_size, run.context_length, run.mode) * run.world_size
    out["tokens_per_s"] = tokens / step_s
    out["step_flops"] = flops
    out["achieved_tflops"] = flops / step_s / 1e12
    env = record["environment"]
    precision = matmul_precision_key(run.dtype, bool(env.get("tf32_matmul")))
    if peak_override is not None:
        peak, label = peak_override, "--peak-tflops"
    elif env["device"].startswith("cuda"):
        peak, label = peak_tflops(env["device_name"], precision)
    else:
        peak, label = None, None  # a CPU has no entry in the peak table: no MFU rather than a guess
    out["peak_tflops"], out["peak_source"], out["mfu_precision"] = peak, label, precision
    out["mfu"] = out["achieved_tflops"] / (peak * run.world_size) if peak else None  # N GPUs: N x the peak
    return out


# ---- the table ----

COLUMNS = ["size", "d_model", "d_ff", "layers", "heads", "ctx", "dtype", "warmup", "attn", "optimizer", "parallel",
           "fwd ms", "fwd std", "bwd ms", "bwd std", "opt ms", "opt std", "step ms", "step std", "tokens/s", "TFLOP/s",
           "MFU", "state GiB/rank", "peak mem GiB", "status"]


def parallel_label(config: dict[str, Any]) -> str | None:
    """"fsdp x8", "fsdp x8 bf16-params no-reshard", "ddp x2"; None for one process."""
    if not config.get("parallel"):
        return None
    text = f"{config['parallel']} x{config['world_size']}"
    if config["parallel"] == "fsdp":
        text += " bf16-params" if config["fsdp_mixed_precision"] == "bf16" else ""
        text += "" if config["reshard_after_forward"] else " no-reshard"
    return text


def table_row(record: dict[str, Any]) -> dict[str, Any]:
    """One row of the results table, from a JSONL record alone."""
    config, m = record["config"], record["config"]["model"]
    row: dict[str, Any] = {"size": config["size"], "d_model": m["d_model"], "d_ff": m["d_ff"],
                           "layers": m["num_layers"], "heads": m["num_heads"], "ctx": m["context_length"],
                           "dtype": config["dtype"] + (" compiled" if config["compile"] else ""),
                           "warmup": config["warmup"], "status": record["status"],
                           "parallel": parallel_label(config)}
    if record.get("predicted"):  # beside the measured peak, and on an OOM row too: the state alone may not fit
        row["state GiB/rank"] = record["predicted"]["state_bytes"] / GIB
    if not finished(record):
        return row
    for phase, short in (("forward", "fwd"), ("backward", "bwd"), ("optimizer", "opt"), ("step", "step")):
        if f"{phase}_ms_mean" in record:
            row[f"{short} ms"] = record[f"{phase}_ms_mean"]
            row[f"{short} std"] = record[f"{phase}_ms_std"]
    row["tokens/s"] = f"{record['tokens_per_s']:,.0f}"
    row["TFLOP/s"] = record["achieved_tflops"]
    row["MFU"] = f"{record['mfu']:.1%}" if record.get("mfu") is not None else None
    if record.get("peak_mem_allocated_bytes") is not None:
        row["peak mem GiB"] = record["peak_mem_allocated_bytes"] / GIB
    if record["noisy"]:
        row["status"] = "NOISY cv>10%: " + ", ".join(record["noisy"])
    if record.get("note"):
        row["status"] += f" ({record['note']})"
    return row


def config_table(configs: list[dict[str, Any]], fmt: str) -> str:
    """The model configurations of a sweep (one row per size), from records' or runs' "config" dicts, under the
    handout whose table the names come from."""
    handout = HANDOUTS[configs[0].get("handout", DEFAULT_HANDOUT)]
    return model_config.config_table([(c["size"], ModelConfig(**c["model"])) for c in configs], handout, fmt)


# ---- comparisons: the same configuration in several variants (--dtype, --compile, --attn, ...) ----

# The sweep axes whose values are variants of one configuration, compared side by side; how each names a value.
VARIANT_AXES: dict[str, Callable[[dict[str, Any]], str]] = {
    "dtype": lambda c: c["dtype"],
    "compile": lambda c: "compiled" if c["compile"] else "eager",
    "attn": lambda c: c["attn"],
    "optimizer": lambda c: "our AdamW" if c["optimizer"] == "ours" else "torch AdamW",
    "parallel": lambda c: parallel_label(c) or "1 process",
}
VARIANT_FIELDS = ("dtype", "compile", "attn", "optimizer", "parallel", "world_size", "fsdp_mixed_precision",
                  "reshard_after_forward")  # the config fields behind VARIANT_AXES
PHASE_SHORT = {"forward": "fwd", "backward": "bwd", "optimizer": "opt", "step": "step"}


def varied_axes(configs: list[dict[str, Any]]) -> list[str]:
    """The variant axes that take more than one value in these configs ([] = nothing to compare)."""
    return [axis for axis, name in VARIANT_AXES.items() if len({name(c) for c in configs}) > 1]


def variant_label(config: dict[str, Any], axes: list[str]) -> str:
    """"bf16", "fp32 compiled", "sdpa ddp x2": the values of the varied axes only."""
    return " ".join(VARIANT_AXES[axis](config) for axis in axes)


def variants(configs: list[dict[str, Any]]) -> list[str]:
    """The variants of a sweep in the order they ran (the first is the baseline of the speed-ups); [] when the sweep
    has a single variant."""
    axes = varied_axes(configs)
    return list(dict.fromkeys(variant_label(c, axes) for c in configs)) if axes else []


def config_key(config: dict[str, Any], leave_out: tuple[str, ...] = (), context: bool = True) -> str:
    """A config as a hashable key, without the fields `leave_out` (and without the context length when
    context=False): configurations that differ only there share a key."""
    kept = {k: v for k, v in config.items() if k not in leave_out}
    if not context:
        kept["model"] = {k: v for k, v in kept["model"].items() if k != "context_length"}
    return json.dumps(kept, sort_keys=True, default=str)


def short_status(status: str) -> str:
    """"OOM", "error", "timeout after 900 s", "skipped", "OOM on rank 3": a failed row's status without detail."""
    return status.split(":")[0]


def speedup_cell(base: dict[str, Any] | None, other: dict[str, Any] | None, phases: tuple[str, ...]) -> str:
    """The speed-up of the other variant over the baseline over these phases ("1.93x": 1.93 times as fast),
    stats.speedup: paired by round when the two were measured together, else the ratio of their summed means; a
    failed or missing row gives its status instead of a number."""
    if other is None or other["status"] not in FINISHED:
        return short_status(other["status"]) if other else "not run"
    if base is None or base["status"] not in FINISHED:
        return f"baseline {short_status(base['status']) if base else 'not run'}"
    return f"{stats.speedup(base, other, phases).ratio:.2f}x"


def speedup_interval(base: dict[str, Any] | None, other: dict[str, Any] | None,
                     phases: tuple[str, ...]) -> stats.PairedRatio | None:
    """The paired speed-up with its interval (stats.speedup) when both rows finished, else None."""
    if base is None or other is None or not finished(base) or not finished(other):
        return None
    return stats.speedup(base, other, phases)


def control_phase(configs: list[dict[str, Any]]) -> str | None:
    """The phase every variant of a comparison runs identically, the control for drift (stats.drift): the optimizer
    step when only the model's settings vary (dtype, compile, attention: the fp32 master weights and gradients are
    the same; fp16's grad scaler is not), the forward pass when only the optimizer varies; None otherwise (forward
    mode, or every phase differs). A control that moved says the machine changed between the variants."""
    varied = {f for f in ("dtype", "compile", "attn", "optimizer", "parallel") if len({str(c[f]) for c in configs}) > 1}
    if configs[0]["mode"] != "train" or not varied or "parallel" in varied:
        return None
    if varied == {"optimizer"}:
        return "forward"
    if "optimizer" not in varied and not any(c["dtype"] == "fp16" for c in configs):
        return "optimizer"
    return None


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The comparison of a sweep's variants: the table's rows and columns, and what report.py draws from them."""

    variants: list[str]  # in the order they ran; the first is the baseline of the speed-ups
    ratios: list[str]  # the speed-up columns per variant: "fwd", "fwd+bwd" (with a backward), "step"
    rows: list[dict[str, Any]]  # one per (size, context[, warm-up]); cells "<label> speed-up: <variant>"
    columns: list[str]


def comparison(records: list[dict]) -> Comparison | None:
    """One row per (size, context) with each variant's mean forward, backward, optimizer and step time side by
    side, then each variant's speed-up over the first (forward, forward+backward, step), computed from the rows'
    means. None when the sweep has a single variant."""
    configs = [r["config"] for r in records]
    names = variants(configs)
    if not names:
        return None
    axes = varied_axes(configs)
    phases = PHASES_BY_MODE[configs[0]["mode"]] + ("step",)
    ratios = [("fwd", ("forward",))] + ([("fwd+bwd", ("forward", "backward"))] if "backward" in phases else [])
    ratios.append(("step", ("step",)))
    by_row: dict[str, dict[str, dict]] = {}
    for rec in records:
        by_row.setdefault(config_key(rec["config"], VARIANT_FIELDS), {})[variant_label(rec["config"], axes)] = rec
    warmups = len({c["warmup"] for c in configs}) > 1
    control = control_phase(configs)
    rows = []
    for cells in by_row.values():
        config = next(iter(cells.values()))["config"]
        row: dict[str, Any] = {"size": config["size"], "ctx": config["model"]["context_length"]}
        if warmups:
            row["warmup"] = config["warmup"]
        for phase in phases:
            for name in names:
                rec = cells.get(name)
                ok = rec is not None and rec["status"] in FINISHED
                # numbers formatted here: a column that mixes numbers and statuses is text to tabulate
                row[f"{PHASE_SHORT[phase]} ms: {name}"] = (f"{rec[f'{phase}_ms_mean']:.2f}" if ok else
                                                           short_status(rec["status"]) if rec else "not run")
        unresolved, drifts, paired_names = [], [], set()
        for name in names[1:]:
            base, other = cells.get(names[0]), cells.get(name)
            for label, summed in ratios:
                row[f"{label} speed-up: {name}"] = speedup_cell(base, other, summed)
                found = speedup_interval(base, other, summed)
                row[f"{label} 95% CI: {name}"] = found.interval_text() if found else None
                if found and found.rounds:
                    paired_names.update((names[0], name))
                if found and found.resolved is False:
                    unresolved.append(f"{label} {name}")
            both = base is not None and other is not None and finished(base) and finished(other)
            moved = stats.drift(base, other, control) if control and both else None
            if moved:
                drifts.append(f"{moved.text()} ({name})")
        # a paired ratio says how sure it is (its interval); "noisy" is left for rows measured apart
        noisy = [name for name in names if name in cells and cells[name]["status"] == "noisy"
                 and name not in paired_names]
        notes = ([f"not resolved (the interval contains 1): {', '.join(unresolved)}"] if unresolved else []) + drifts
        row["notes"] = "; ".join(notes + ([f"noisy: {', '.join(noisy)}"] if noisy else [])) or None
        rows.append(row)
    intervals = any(row.get(f"{label} 95% CI: {n}") for row in rows for n in names[1:] for label, _ in ratios)
    columns = ["size", "ctx"] + (["warmup"] if warmups else [])
    columns += [f"{PHASE_SHORT[p]} ms: {n}" for p in phases for n in names]
    columns += [c for n in names[1:] for label, _ in ratios
                for c in [f"{label} speed-up: {n}"] + ([f"{label} 95% CI: {n}"] if intervals else [])]
    columns += ["notes"] if any(row["notes"] for row in rows) else []
    return Comparison(names, [label for label, _ in ratios], rows, columns)


def comparison_table(records: list[dict], fmt: str) -> str | None:
    """The comparison (see comparison()) as a table with its heading and note; None for a single variant."""
    found = comparison(records)
    if found is None:
        return None
    names = found.variants
    return (f"## Comparison: {' vs '.join(names)} (speed-ups over {names[0]})\n\n"
            + render_table(found.rows, found.columns, fmt)
            + f"\n\nMean ms per phase from the rows above. Speed-up = {names[0]}'s time / the variant's (above 1: "
            "faster), fwd+bwd sums the two phases: for variants measured together, the geometric mean over the rounds "
            "of their interleaved steps (A B B A ...) with a 95% t-interval on the log-ratios (not resolved when it "
            "contains 1); for rows measured apart, the ratio of the means. drift: a phase every variant runs alike "
            "changed between them by more than its spread. A failed row shows its status, not a number.")


# ---- --context-length max: the longest context that runs ----

MAX_CONTEXT_DEFAULT = {"cuda": 131072, "cpu": 4096}  # the last doubling probe, unless --max-context; build_parser


def probe_contexts(max_context: int) -> list[int]:
    """The doubling probes: 128, 256, ... up to the largest power of two <= max_context."""
    return search.doubling_sizes(SEARCH_START, max_context)


def context_searches(records: list[dict]) -> list[dict[str, Any]]:
    """The answer of every --context-length max search in a sweep's records (one search per configuration but
    the context: size x dtype x compile x ...), as a record: the longest context that ran (bisected), the longest
    power of two, the probe that ended the search and what that means (search.answer). A search doubles to its
    first failure, then bisects after an OOM (sweep.run_sweep with search=True)."""
    groups: dict[str, list[dict]] = {}
    for rec in records:
        if "context_search" in rec:
            groups.setdefault(config_key(rec["config"], context=False), []).append(rec)
    answers = []
    for probes in groups.values():
        probes.sort(key=lambda r: r["config"]["model"]["context_length"])
        settings = probes[0]["context_search"]
        found = search.answer([{"context_length": r["config"]["model"]["context_length"], "status": r["status"]}
                               for r in probes], settings["max_context"], settings.get("resolution"),
                              settings.get("probe_budget"))
        longest = found["longest_context"]
        best = next((r for r in probes if r["config"]["model"]["context_length"] == longest and finished(r)), None)
        answers.append({
            "experiment": "bench_e2e", "kind": "longest_context", "label": (best or probes[0])["label"],
            "config": (best or probes[0])["config"], **found, "max_context": settings["max_context"],
            "probes": [{"context_length": r["config"]["model"]["context_length"], "status": r["status"]}
                       for r in probes],
            "status": f"longest context {longest or 'none'}: {found['answer']}"})
    return answers


def search_table(records: list[dict], fmt: str) -> str | None:
    """The longest context of every search, one row each, beside its step time and peak memory at that context;
    None when the sweep was not a search."""
    answers = context_searches(records)
    if not answers:
        return None
    probes = {config_key(r["config"]): r for r in records if "context_search" in r}
    rows = []
    for ans in answers:
        config = ans["config"]
        best = probes.get(config_key(config)) if ans["longest_context"] else None
        last = ans["probes"][-1]
        row = {"size": config["size"], "mode": config["mode"] + (" no-grad" if config["no_grad"] else ""),
               "dtype": config["dtype"] + (" compiled" if config["compile"] else ""), "attn": config["attn"],
               "optimizer": config["optimizer"], "parallel": parallel_label(config), "warmup": config["warmup"],
               "longest ctx": ans["longest_context"], "longest 2^k": ans.get("longest_power_of_two"),
               "last probe": f"{last['context_length']}: {short_status(last['status'])}",
               "answer": ans["answer"]}
        if best is not None:
            row["step ms"] = best["step_ms_mean"]
            if best.get("peak_mem_allocated_bytes") is not None:
                row["peak mem GiB"] = best["peak_mem_allocated_bytes"] / GIB
        rows.append(row)
    columns = ["size", "mode", "dtype", "attn"]
    columns += [c for c in ("optimizer", "warmup") if len({str(r[c]) for r in rows}) > 1]
    columns += ["parallel"] if any(r["parallel"] for r in rows) else []
    bisected = [a for a in answers if a.get("resolution")]
    columns += ["longest ctx"] + (["longest 2^k"] if bisected else []) + ["step ms"]
    columns += (["peak mem GiB"] if any("peak mem GiB" in r for r in rows) else []) + ["last probe", "answer"]
    if bisected:
        how = (f"powers of two from {SEARCH_START} up to --max-context {answers[0]['max_context']}, then after an OOM "
               f"a bisection to a multiple of {bisected[0]['resolution']}")
        note = ("longest ctx: the longest that ran, bisected between the last power of two that ran and the first "
                "that ran out of memory; longest 2^k: the doubling's answer.")
    else:
        how = f"powers of two from {SEARCH_START} up to --max-context {answers[0]['max_context']}"
        note = ("The true limit lies between the longest context and twice it: bisect with an explicit "
                "--context-length list to get closer.")
    return f"## Longest context that runs ({how})\n\n" + render_table(rows, columns, fmt) + "\n\n" + note


def measured(records: list[dict]) -> list[dict]:
    """The configurations' own records, without the answers of --context-length max searches that follow them in a
    JSONL file (context_searches makes those again from the configurations' records)."""
    return [r for r in records if r.get("kind") != "longest_context"]


def results_report(records: list[dict], fmt: str, columns: list[str] | None = None) -> str:
    """Environment header, the results table (with `columns`: report.pick_columns), compile times, the comparison
    and longest-context tables and the --profile tables, from the records alone."""
    records = measured(records)
    env = next((r["environment"] for r in records if "device_name" in r.get("environment", {})), None)
    config0 = records[0]["config"]
    optimizers = list(dict.fromkeys(r["config"]["optimizer"] for r in records))
    attns = list(dict.fromkeys(r["config"]["attn"] for r in records))
    settings = {"sizes from": HANDOUTS[config0.get("handout", DEFAULT_HANDOUT)].title,
                "batch": config0["batch_size"], "steps": config0["steps"],
                "mode": config0["mode"] + (" no-grad" if config0["no_grad"] else "")}
    if len(attns) == 1:
        settings["attn"] = attns[0]
    if config0["mode"] == "train" and len(optimizers) == 1:
        settings["optimizer"] = optimizers[0]
    if config0.get("parallel"):  # torchrun: the world, and what the batch means
        backend = parallel.backend_for(torch.device(env["device"] if env else "cpu"))
        settings["batch"] = f"{config0['batch_size']} per rank"
        settings["ranks"] = f"{config0['world_size']} ({backend}; times: slowest rank per phase)"
    lines = [environment_header(env, **settings) if env else f"settings: {settings}", ""]
    rows = [table_row(rec) for rec in records]
    for rec, row in zip(records, rows):  # a compared setting: one column says which row is which
        if len(optimizers) > 1:
            row["optimizer"] = rec["config"]["optimizer"]
        if len(attns) > 1:
            row["attn"] = rec["config"]["attn"]
    shown = [c for c in COLUMNS if any(row.get(c) is not None for row in rows) or c in COLUMNS[:8]]
    lines.append(render_table(rows, report.pick_columns(shown, columns, fmt), fmt))
    compile_times = [f"{rec['label']}: {rec['compile_s']:.1f} s" for rec in records if "compile_s" in rec]
    if compile_times:
        lines += ["", "compile time (first step, not in the timings): " + "; ".join(compile_times)]
    for table in (comparison_table(records, fmt), search_table(records, fmt)):
        if table:
            lines += ["", table]
    profiles = profile_report(records, fmt)
    return "\n".join(lines) + ("\n\n" + profiles if profiles else "")


def render_report(records: list[dict], fmt: str, columns: list[str] | None = None) -> str:
    """The whole report of a run from its JSONL records: the model configurations, then the results (with
    `columns` in the results table: report.pick_columns)."""
    return (config_table([r["config"] for r in measured(records)], fmt) + "\n\n"
            + results_report(records, fmt, columns))


# ---- command line ----


def build_parser() -> argparse.ArgumentParser:
    p = cli.ArgParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    cli.add_size_args(p, "tiny, or 'custom' when --d-model, --d-ff, --num-layers and --num-heads are all given")
    for flag, what in (("--d-model", "d_model"), ("--d-ff", "d_ff"), ("--num-layers", "the number of layers"),
                       ("--num-heads", "the number of heads")):
        p.add_argument(flag, type=positive_int, help=f"override {what}")
    p.add_argument("--vocab-size", type=positive_int, default=10_000, help="vocabulary size")
    p.add_argument("--context-length", type=context_length_value, nargs="+", default=None,
                   help="sequence length(s) (default: the handout's, 512 for 2026 and 128 for 2025), or 'max': the "
                        f"longest that runs, trying {SEARCH_START}, {2 * SEARCH_START}, ... (each in its own child "
                        "process) until the first failure or --max-context, then bisecting after an OOM; one search "
                        "per variant. See docs/bench_e2e.md#the-longest-context-that-fits")
    p.add_argument("--max-context", type=positive_int, default=None, metavar="N",
                   help="--context-length max: the last power of two tried (default: "
                        f"{MAX_CONTEXT_DEFAULT['cuda']} on CUDA, {MAX_CONTEXT_DEFAULT['cpu']} on a CPU, whose memory "
                        "is rarely the limit and where each doubling costs 2-4x the time)")
    p.add_argument("--search-resolution", type=positive_int, default=search.RESOLUTION, metavar="N",
                   help="--context-length max: after the first OOM, bisect to a multiple of N")
    p.add_argument("--search-probes", type=cli.non_negative_int, default=search.PROBE_BUDGET, metavar="N",
                   help="--context-length max: at most N bisection probes per search (0: no bisection)")
    p.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE, help="batch size")
    cli.add_workload_args(p, MODES, DTYPES, ATTENTION, several_modes=False, several_warmups=True, warmup=5,
                          steps=10)
    p.add_argument("--no-grad", action="store_true", help="forward mode only: run under torch.inference_mode()")
    p.add_argument("--compile", nargs="*", choices=["off", "on"], default=["off"],
                   help="torch.compile the whole model (--compile alone = on; 'off on' compares them); the compile "
                        "step is timed apart")
    p.add_argument("--optimizer", nargs="+", choices=["ours", "torch"], default=["ours"],
                   help="ours = optim.AdamW; torch = torch.optim.AdamW (fused on CUDA, foreach on CPU); both to "
                        "compare them (train mode)")
    p.add_argument("--tf32", choices=["on", "off"], default=None,
                   help="CUDA only: allow TF32 tensor cores for fp32 matmuls (default: PyTorch's default, off)")
    p.add_argument("--nvtx", action="store_true",
                   help="CUDA only: emit NVTX ranges (warmup, measure, forward, backward, optimizer, attention)")
    p.add_argument("--profile", action="store_true",
                   help="profile the timed steps with torch.profiler (CPU, and CUDA when present): a Perfetto trace "
                        "under results/profile/ and kernel tables; the way to profile without nsys")
    p.add_argument("--peak-tflops", type=positive_float, default=None,
                   help="peak TFLOP/s of one GPU for MFU, overriding the built-in table (e.g. for an unlisted GPU)")
    cli.add_device_args(p)
    parallel.add_parallel_args(p)
    sweep.add_sweep_args(p, compares=True)
    cli.add_output_args(p, default_stem="e2e")
    report.add_columns_and_plot_args(p, "bench_e2e")
    cli.add_dry_run_arg(p)
    return p


def context_length_value(text: str) -> int | str:
    """--context-length: a positive integer, or 'max' (the search)."""
    if text == "max":
        return text
    try:
        return positive_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer or max, got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[RunConfig]]:
    parser = build_parser()
    args = parser.parse_args(argv)
    handout = cli.handout_or_exit(parser, args)
    report.columns_or_exit(parser, args.columns, COLUMNS)
    sweep.check_sweep_args(parser, args)
    dims = {"d_model": args.d_model, "d_ff": args.d_ff, "num_layers": args.num_layers, "num_heads": args.num_heads}
    if args.size is None:
        args.size = ["custom"] if all(v is not None for v in dims.values()) else ["tiny"]
    else:
        args.size = cli.sizes_or_exit(parser, args, args.size)
    # sweep values in the order given (the first is the comparison's baseline); --compile alone means on
    args.optimizer, args.attn = list(dict.fromkeys(args.optimizer)), list(dict.fromkeys(args.attn))
    args.compile = [v == "on" for v in dict.fromkeys(args.compile or ["on"])]
    cli.refuse(parser, [
        (args.no_grad and args.mode != "forward",
         "--no-grad only applies to --mode forward (backward needs the autograd graph)"),
        (len(args.optimizer) > 1 and args.mode != "train",
         "comparing optimizers needs --mode train (other modes take no optimizer step)")])
    device = common.device_or_exit(parser, args.device)
    world_size = parallel.check_parallel_args(parser, args, device)
    args.context_length = context_lengths(parser, args, handout, device)
    if device.type != "cuda":  # NVTX on a CPU only through a library named by BENCH_NVTX_LIBRARY (real-nsys tests)
        cli.refuse(parser, [(args.nvtx and not os.environ.get(common.NVTX_LIBRARY_ENV),
                         f"--nvtx needs a CUDA device, and this run is on {device}"),
                        (args.tf32 is not None, f"--tf32 needs a CUDA device, and this run is on {device}")])
    if args.nvtx:
        try:
            common.nvtx_functions()
        except ValueError as exc:
            parser.error(str(exc))
    return args, plan_runs(parser, args, dims, world_size)


def plan_runs(parser: argparse.ArgumentParser, args: argparse.Namespace, dims: dict[str, int | None],
              world_size: int) -> list[RunConfig]:
    """Every configuration of the sweep, in order: size x parallel x context x dtype x compile x attn x optimizer x
    warmup (x FSDP2's settings); a search's probes in a row, shortest first (the context the innermost axis)."""
    axes = {"size": args.size, "parallel": args.parallel or [None], "ctx": args.context_length, "dtype": args.dtype,
            "compile": args.compile, "attn": args.attn, "optimizer": args.optimizer, "warmup": args.warmup,
            "fsdp_mp": args.fsdp_mixed_precision, "reshard": args.reshard_after_forward}
    order = [axis for axis in axes if axis != "ctx"] + ["ctx"] if args.context_search else list(axes)
    runs = []
    try:
        for values in itertools.product(*(axes[axis] for axis in order)):
            c = dict(zip(order, values))
            kind = c["parallel"]
            if kind != "fsdp":  # FSDP-only settings do not multiply the other rows
                c["fsdp_mp"], c["reshard"] = "off", "on"
            if c["size"] == "custom":
                model = ModelConfig(**dims, vocab_size=args.vocab_size, context_length=c["ctx"])
            else:
                model = get_config(c["size"], args.handout, **dims, vocab_size=args.vocab_size, context_length=c["ctx"])
            runs.append(RunConfig(size=c["size"], handout=args.handout, model=model, batch_size=args.batch_size,
                                  warmup=c["warmup"], steps=args.steps, mode=args.mode, no_grad=args.no_grad,
                                  dtype=c["dtype"], compile=c["compile"], attn=c["attn"], optimizer=c["optimizer"],
                                  tf32=None if args.tf32 is None else args.tf32 == "on", device=args.device,
                                  seed=args.seed, nvtx=args.nvtx,
                                  profile_results_dir=args.results_dir if args.profile else None,
                                  parallel=kind, world_size=world_size if kind else 1,
                                  fsdp_mixed_precision=c["fsdp_mp"], reshard_after_forward=c["reshard"] == "on",
                                  pg_timeout_s=args.pg_timeout))
    except model_config.ConfigError as exc:
        parser.error(str(exc))
    runs = list(dict.fromkeys(runs))  # ddp rows are not multiplied by the FSDP-only axes
    for run in runs:
        cli.check_tensor_sizes(parser, model_config.model_tensor_shapes(run.model, run.batch_size))
    return runs


def context_lengths(parser: argparse.ArgumentParser, args: argparse.Namespace, handout: model_config.Handout,
                    device: torch.device) -> list[int]:
    """The contexts to run: those given, the handout's default, or for 'max' the doubling probes of the search
    (sets args.context_search, args.max_context and args.max_context_default). A search needs a child per probe
    and at least the steps that reach the training peak."""
    given = list(dict.fromkeys(args.context_length or [handout.default_context_length]))
    args.context_search = "max" in given
    search_flags = [flag for flag, default in (("--max-context", None), ("--search-resolution", search.RESOLUTION),
                                               ("--search-probes", search.PROBE_BUDGET))
                    if getattr(args, flag[2:].replace("-", "_")) != default]
    if not args.context_search:
        cli.refuse(parser, [(bool(search_flags), f"{search_flags[0] if search_flags else ''} only applies to "
                                             "--context-length max")])
        return given
    args.max_context_default = None  # which default --max-context took, for --dry-run; None when given
    if args.max_context is None:
        args.max_context = MAX_CONTEXT_DEFAULT["cuda" if device.type == "cuda" else "cpu"]
        args.max_context_default = ("the default on CUDA" if device.type == "cuda" else
                                    f"the default on a CPU; on CUDA {MAX_CONTEXT_DEFAULT['cuda']}")
    cli.refuse(parser, [
        (len(given) > 1, "--context-length max searches for the longest context on its own: give max or numbers, "
                         f"not both (got {' '.join(map(str, given))})"),
        (args.max_context < SEARCH_START,
         f"--max-context must be at least {SEARCH_START}, where the search starts; got {args.max_context}"),
        (args.in_process, "--context-length max runs every probe in its own child process (an OOM must not leave "
                          "memory behind for the next probe): drop --in-process"),
        (args.no_skip, "--no-skip does not apply to --context-length max: a search ends at its first failure"),
        (len(set(args.warmup)) > 1,  # a search is a skip group, which warm-up counts share
         "--context-length max takes one --warmup value: the warm-up does not change what fits"),
        (args.mode == "train" and min(args.warmup) + args.steps < 2,
         "--context-length max --mode train needs --warmup + --steps >= 2 per probe: AdamW makes its moments in the "
         "first step, so only the second reaches the training peak")])
    return probe_contexts(args.max_context)


# ---- the sweep ----


def finish_record(run: RunConfig, record: dict[str, Any], args: argparse.Namespace) -> None:
    """The derived figures of a finished configuration; its status says whether a phase was noisy. Under
    --parallel, every row (failed ones too) gets the predicted state bytes per rank; in a --context-length max
    search, the search's settings (its upper bound, the bisection's resolution and budget)."""
    if run.parallel:
        record["predicted"] = parallel.state_bytes_per_rank(run.model, run.parallel, run.world_size, run.mode)
    if record["status"] == "ok":
        record.update(derive_figures(run, record, args.peak_tflops))
        record["status"] = "noisy" if record["noisy"] else "ok"
    if args.context_search:  # a probe of --context-length max: context_searches finds it by this
        record["context_search"] = {"max_context": args.max_context, "resolution": args.search_resolution,
                                    "probe_budget": args.search_probes}


def dry_run_label(run: RunConfig) -> str:
    """A planned configuration, with the training state each rank will hold (parallel.state_bytes_per_rank), so
    whether it fits is known before the run."""
    state = parallel.state_bytes_per_rank(run.model, run.parallel, run.world_size, run.mode)["state_bytes"]
    return f"{run.label()} (predicted state {state / GIB:.2f} GiB per rank, activations aside)"


def plan_notes(runs: list[RunConfig], args: argparse.Namespace) -> list[str]:
    """What --dry-run adds below the plan: the comparison table's variants (and how they are timed) and the
    context searches."""
    notes = []
    configs = [dataclasses.asdict(run) for run in runs]
    names = variants(configs)
    if names:
        how = ("each comparison's variants in one process, their timed steps interleaved" if args.interleave == "steps"
               else f"each variant in its own process, {args.repeats} run(s) each, alternating")
        notes.append(f"then a comparison table: {' vs '.join(names)}, one row per size and context, speed-ups over "
                     f"{names[0]} ({how}).")
    if args.context_search:
        searches = len({config_key(c, context=False) for c in configs})
        contexts = probe_contexts(args.max_context)
        source = f"; {args.max_context_default}" if args.max_context_default else ""
        bisect = (f" After an OOM that follows a fit, up to {args.search_probes} more probes bisect between them to a "
                  f"multiple of {args.search_resolution}." if args.search_probes else "")
        notes.append(f"context search: {searches} search{'es' if searches > 1 else ''} (one per configuration but the "
                     f"context), each trying ctx {', '.join(map(str, contexts))} in turn, every probe in its own child "
                     "process. A search ends at its first OOM (the answer: the context before it), error or timeout "
                     f"(inconclusive), or after {contexts[-1]} (--max-context {args.max_context}{source}).{bisect}")
    return [textwrap.fill(note, width=116) for note in notes]


def main(argv: list[str] | None = None) -> int:
    args, runs = parse_args(argv)
    rank_zero = parallel.is_rank_zero()  # under torchrun only rank 0 prints and writes files
    configs = config_table([dataclasses.asdict(run) for run in runs], args.fmt)
    if args.dry_run:
        if not rank_zero:
            return 0
        return cli.print_dry_run([dry_run_label(run) for run in runs], preamble=configs,
                                 notes=plan_notes(runs, args), at_most=args.context_search)
    files = ResultFiles(args.results_dir, "e2e", args.out, "e2e") if rank_zero else None
    if rank_zero:
        results.emit(configs + "\n")  # people quote the model config first
    experiment = sweep.Experiment(
        name="bench_e2e", measure=run_config, measure_together=measure_together, resize=RunConfig.with_context,
        finish=lambda run, record: finish_record(run, record, args),
        summary=lambda record: f"{record['step_ms_mean'] / 1e3:.3f} s/step",
        render=lambda records, fmt: render_report(records, fmt, args.columns))
    records, code = sweep.run_sweep(experiment, runs, files, common.resolve_device(args.device), args,
                                    search=args.context_search)
    if records and rank_zero:
        for answer in context_searches(records):  # each search's answer as a record of its own, after its probes
            files.append_record(answer)
        # the saved files also hold the config table, which was printed first
        files.write_report(lambda fmt: render_report(records, fmt, args.columns), args.fmt)
        figures = report.figures_after_run("bench_e2e", records, files) if args.plot else []
        if results.emit(results_report(records, args.fmt, args.columns)):
            files.say_written(args.fmt, figures)
    return code


if __name__ == "__main__":
    sys.exit(main())
