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
    python bench_e2e.py --size xl --context-length max            # the longest power-of-two context that trains
    python bench_e2e.py --size 10B --parallel fsdp --world-size 8 --dry-run   # plan: the state per rank on 8 GPUs
    python bench_e2e.py --size tiny --profile --steps 3           # torch.profiler kernel tables (no nsys needed)
    torchrun --nproc-per-node 8 bench_e2e.py --size xl --parallel ddp fsdp   # 8 GPUs: DDP vs FSDP2, batch per rank

Size names and the default context length (512; 128 under --handout 2025) come from the study's handout: the
current one (2026, v26.1.1) unless --handout or CS336_HANDOUT says 2025. Each configuration of a sweep runs in
its own child process (an OOM cannot poison the next one). The table is printed on stdout and saved with one JSON
record per configuration under results/e2e/. A sweep over dtype, compile, attention, optimizer or parallelism adds a
comparison table (speed-ups over the first variant); --context-length max adds the longest context of each search.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Callable

import torch

import common
import kernel_tables
import parallel
import report
import runner
from common import (DEFAULT_BATCH_SIZE, DEFAULT_HANDOUT, DTYPES, GIB, HANDOUTS, ModelConfig, ResultFiles,
                    environment_header, get_config, matmul_precision_key, peak_tflops,
                    positive_float, positive_int, render_table, set_ranges)
from model import ATTENTION
from runner import MODES, PHASES_BY_MODE, RunConfig, Workload, run_step

NOISY_CV = 0.10  # a phase whose std/mean is above this is flagged: don't quote it without a second look


# ---- one configuration ----


def run_config(run: RunConfig) -> dict[str, Any]:
    """Build the workload and measure it on the shared run path (compile step apart, warm-up, timed steps,
    peaks). Runs in a child process during sweeps; failures propagate as exceptions (the runner makes them rows)."""
    common.maybe_inject_fault({"size": run.size, "context_length": run.context_length, "dtype": run.dtype,
                               "warmup": run.warmup, "parallel": run.parallel, "mode": run.mode,
                               "compile": run.compile, "attn": run.attn})
    set_ranges(nvtx=run.nvtx, profiler=run.profile_results_dir is not None)
    work = Workload(run)
    profiler = profiler_for(run, work.device)
    record = runner.measure_steps(lambda: run_step(work), work.device, run.warmup, run.steps,
                                  compile_first=run.compile, profiler=profiler)
    if run.profile_results_dir is not None:
        record.update(profile_tables(run, profiler, record))
    return record


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
    runner.phase("writing the profiler trace")
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
            tables = kernel_tables.build_tables(kernel_tables.load_torch_trace(trace), runner.stopwatch_ms(record),
                                                runner.attention_shape(dataclasses.asdict(run)), compiled=run.compile)
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
    flops = common.step_flops(run.model, run.batch_size, run.context_length, run.mode) * run.world_size
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
    if record["status"] not in ("ok", "noisy"):
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
    return common.config_table([(c["size"], ModelConfig(**c["model"])) for c in configs], handout, fmt)


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
OK = ("ok", "noisy")


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
    """The baseline's summed mean time over these phases divided by the other variant's ("1.93x": the other is
    1.93 times as fast); a failed or missing row gives its status instead of a number."""
    if other is None or other["status"] not in OK:
        return short_status(other["status"]) if other else "not run"
    if base is None or base["status"] not in OK:
        return f"baseline {short_status(base['status']) if base else 'not run'}"
    return f"{sum(base[f'{p}_ms_mean'] for p in phases) / sum(other[f'{p}_ms_mean'] for p in phases):.2f}x"


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
    rows = []
    for cells in by_row.values():
        config = next(iter(cells.values()))["config"]
        row: dict[str, Any] = {"size": config["size"], "ctx": config["model"]["context_length"]}
        if warmups:
            row["warmup"] = config["warmup"]
        for phase in phases:
            for name in names:
                rec = cells.get(name)
                ok = rec is not None and rec["status"] in OK
                # numbers formatted here: a column that mixes numbers and statuses is text to tabulate
                row[f"{PHASE_SHORT[phase]} ms: {name}"] = (f"{rec[f'{phase}_ms_mean']:.2f}" if ok else
                                                           short_status(rec["status"]) if rec else "not run")
        for name in names[1:]:
            for label, summed in ratios:
                row[f"{label} speed-up: {name}"] = speedup_cell(cells.get(names[0]), cells.get(name), summed)
        noisy = [name for name in names if name in cells and cells[name]["status"] == "noisy"]
        row["notes"] = f"noisy: {', '.join(noisy)}" if noisy else None
        rows.append(row)
    columns = ["size", "ctx"] + (["warmup"] if warmups else [])
    columns += [f"{PHASE_SHORT[p]} ms: {n}" for p in phases for n in names]
    columns += [f"{label} speed-up: {n}" for n in names[1:] for label, _ in ratios]
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
            + f"\n\nMean ms per phase from the rows above; speed-up = {names[0]}'s mean / the variant's (above 1: "
            "faster), fwd+bwd sums the two phases. A failed row shows its status, not a number.")


# ---- --context-length max: the longest power-of-two context that runs ----

SEARCH_START = 128  # the first probe; the study's contexts are powers of two from 128
MAX_CONTEXT_DEFAULT = {"cuda": 131072, "cpu": 4096}  # the last probe, unless --max-context; see build_parser


def probe_contexts(max_context: int) -> list[int]:
    """128, 256, ... up to the largest power of two <= max_context."""
    out = [SEARCH_START]
    while out[-1] * 2 <= max_context:
        out.append(out[-1] * 2)
    return out


def context_searches(records: list[dict]) -> list[dict[str, Any]]:
    """The answer of every --context-length max search in a sweep's records (one search per configuration but
    the context: size x dtype x compile x ...), as a record: the longest context that ran, the probe that ended
    the search and what that means. A search ends at its first failure (runner.run_sweep with search=True)."""
    groups: dict[str, list[dict]] = {}
    for rec in records:
        if "context_search" in rec:
            groups.setdefault(config_key(rec["config"], context=False), []).append(rec)
    answers = []
    for probes in groups.values():
        probes.sort(key=lambda r: r["config"]["model"]["context_length"])
        fits = [r for r in probes if r["status"] in OK]
        failed = next((r for r in probes if r["status"] not in OK), None)
        best = fits[-1] if fits else None
        longest = best["config"]["model"]["context_length"] if best else None
        cap = probes[0]["context_search"]["max_context"]
        conclusive = False
        if failed is None:
            ended = longest >= probe_contexts(cap)[-1]
            answer = (f"at least this: the search stops at --max-context {cap}" if ended
                      else "incomplete: the search was interrupted")
        else:
            ctx, status = failed["config"]["model"]["context_length"], failed["status"]
            if status == "OOM" or status.startswith("OOM on rank"):
                conclusive = True
                answer = f"the longest that fits: {ctx} runs out of memory" if best else f"none: OOM already at {ctx}"
            elif status.startswith(("timeout", "process-group timeout")):
                answer = f"the longest within the time limit: {ctx} timed out, whether it fits is unknown"
            else:
                answer = f"inconclusive: {ctx} failed with an error, not an OOM (see its row)"
        answers.append({
            "experiment": "bench_e2e", "kind": "longest_context", "label": (best or probes[0])["label"],
            "config": (best or probes[0])["config"], "longest_context": longest, "max_context": cap,
            "probes": [{"context_length": r["config"]["model"]["context_length"], "status": r["status"]}
                       for r in probes],
            "conclusive": conclusive, "answer": answer,
            "status": f"longest context {longest or 'none'}: {answer}"})
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
               "longest ctx": ans["longest_context"],
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
    columns += ["longest ctx", "step ms"] + (["peak mem GiB"] if any("peak mem GiB" in r for r in rows) else [])
    columns += ["last probe", "answer"]
    return (f"## Longest context that runs (powers of two from {SEARCH_START} up to --max-context "
            f"{answers[0]['max_context']})\n\n"
            + render_table(rows, columns, fmt)
            + "\n\nThe true limit lies between the longest context and twice it: bisect with an explicit "
              "--context-length list to get closer.")


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
    p = common.ArgParser(description=__doc__.split("\n\n")[0],
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_size_args(p, "tiny, or 'custom' when --d-model, --d-ff, --num-layers and --num-heads are all given")
    p.add_argument("--d-model", type=positive_int, help="override d_model")
    p.add_argument("--d-ff", type=positive_int, help="override d_ff")
    p.add_argument("--num-layers", type=positive_int, help="override the number of layers")
    p.add_argument("--num-heads", type=positive_int, help="override the number of heads")
    p.add_argument("--vocab-size", type=positive_int, default=10_000, help="vocabulary size")
    p.add_argument("--context-length", type=context_length_value, nargs="+", default=None,
                   help="sequence length(s) (default: the handout's, 512 for 2026 and 128 for 2025), or 'max': search "
                        f"the longest that runs, trying {SEARCH_START}, {2 * SEARCH_START}, ... (each in its own "
                        "child process) until the first OOM, error or timeout, or --max-context; one search per "
                        "size x dtype x compile x attn x optimizer (x parallel). See "
                        "docs/bench_e2e.md#the-longest-context-that-fits")
    p.add_argument("--max-context", type=positive_int, default=None, metavar="N",
                   help="with --context-length max: the last context tried, powers of two up to N; when not "
                        f"given {MAX_CONTEXT_DEFAULT['cuda']} on CUDA and {MAX_CONTEXT_DEFAULT['cpu']} on a CPU, "
                        "whose memory is rarely the limit (each doubling costs 2-4x the time, so it stops there)")
    p.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE, help="batch size")
    p.add_argument("--warmup", type=common.warmup_count, nargs="+", default=[5], help="warm-up step count(s)")
    p.add_argument("--steps", type=common.step_count, default=10, help="timed steps")
    p.add_argument("--mode", choices=MODES, default="train",
                   help="forward only, forward+backward, or a full training step (forward, backward, AdamW)")
    p.add_argument("--no-grad", action="store_true", help="forward mode only: run under torch.inference_mode()")
    p.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=["fp32"],
                   help="fp32, or bf16/fp16 autocast mixed precision (fp32 master weights; fp16 with a grad scaler)")
    p.add_argument("--compile", nargs="*", choices=["off", "on"], default=["off"],
                   help="torch.compile the whole model (--compile alone = on); 'off on' runs both and compares them. "
                        "Compile time is reported apart from the timed steps")
    p.add_argument("--attn", nargs="+", choices=list(ATTENTION), default=["naive"],
                   help="attention implementation(s): naive = softmax(QK^T)V in the model's own code, sdpa = "
                        "torch's fused scaled_dot_product_attention; both to compare them")
    p.add_argument("--optimizer", nargs="+", choices=["ours", "torch"], default=["ours"],
                   help="ours = optim.AdamW; torch = torch.optim.AdamW (fused on CUDA, foreach on CPU); give both "
                        "to compare them in one table (train mode)")
    p.add_argument("--tf32", choices=["on", "off"], default=None,
                   help="CUDA only: allow TF32 tensor cores for fp32 matmuls (default: PyTorch's default, off)")
    p.add_argument("--seed", type=common.seed_int, default=0, help="random seed for weights and data")
    p.add_argument("--nvtx", action="store_true",
                   help="CUDA only: emit NVTX ranges (warmup, measure, forward, backward, optimizer, attention)")
    p.add_argument("--profile", action="store_true",
                   help="after the warm-up, profile the measured steps with torch.profiler (CPU, and CUDA when "
                        "present), write a Chrome/Perfetto trace under results/profile/ and print kernel tables "
                        "(phases, top kernels, categories, attention); the way to profile without nsys")
    p.add_argument("--peak-tflops", type=positive_float, default=None,
                   help="peak TFLOP/s of one GPU for MFU, overriding the built-in table (e.g. for an unlisted GPU)")
    common.add_device_args(p)
    p.add_argument("--parallel", nargs="+", choices=parallel.PARALLEL, default=None,
                   help="run under torchrun on every rank: ddp = DistributedDataParallel, fsdp = FSDP2 (fully_shard "
                        "on every block and the root); give both to compare them. --batch-size is per rank. See "
                        "docs/bench_e2e.md#more-than-one-gpu")
    p.add_argument("--fsdp-mixed-precision", nargs="+", choices=parallel.FSDP_MIXED_PRECISION, default=None,
                   help="fsdp: bf16 = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), parameters gathered "
                        "and used in bf16 with fp32 sharded master weights and gradient reduction; off (default) = "
                        "fp32. Unlike --dtype bf16 (autocast, any mode), this casts the parameters themselves")
    p.add_argument("--reshard-after-forward", nargs="+", choices=["on", "off"], default=None,
                   help="fsdp: on (default) = each block frees its gathered parameters after forward and gathers "
                        "them again for backward; off = keeps them until backward (more memory, fewer all-gathers)")
    p.add_argument("--pg-timeout", type=positive_float, default=parallel.DEFAULT_PG_TIMEOUT_S, metavar="SECONDS",
                   help="--parallel: a collective waiting longer than this for a peer fails its configuration")
    p.add_argument("--world-size", type=positive_int, default=None, metavar="N",
                   help="--parallel --dry-run without torchrun: plan for N ranks (the predicted state per rank); a "
                        "real run takes its world size from torchrun")
    runner.add_sweep_args(p)
    common.add_output_args(p, default_stem="e2e")
    report.add_columns_and_plot_args(p, "bench_e2e")
    common.add_dry_run_arg(p)
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
    handout = common.handout_or_exit(parser, args)
    report.columns_or_exit(parser, args.columns, COLUMNS)
    dims = {"d_model": args.d_model, "d_ff": args.d_ff, "num_layers": args.num_layers, "num_heads": args.num_heads}
    if args.size is None:
        args.size = ["custom"] if all(v is not None for v in dims.values()) else ["tiny"]
    else:
        args.size = common.sizes_or_exit(parser, args, args.size)
    if args.no_grad and args.mode != "forward":
        parser.error("--no-grad only applies to --mode forward (backward needs the autograd graph)")
    args.optimizer = list(dict.fromkeys(args.optimizer))
    if len(args.optimizer) > 1 and args.mode != "train":
        parser.error("comparing optimizers needs --mode train (other modes take no optimizer step)")
    # --compile alone means on; sweep values in the order given (the first is the comparison's baseline)
    args.compile = [v == "on" for v in dict.fromkeys(args.compile or ["on"])]
    args.attn = list(dict.fromkeys(args.attn))
    device = common.device_or_exit(parser, args.device)
    world_size = check_parallel_args(parser, args, device)
    args.context_length = context_lengths(parser, args, handout, device)
    if device.type != "cuda":
        # NVTX on a CPU only through a library named by BENCH_NVTX_LIBRARY (the real-nsys tests use one)
        for flag, given in (("--nvtx", args.nvtx and not os.environ.get(common.NVTX_LIBRARY_ENV)),
                            ("--tf32", args.tf32 is not None)):
            if given:
                parser.error(f"{flag} needs a CUDA device, and this run is on {device}")
    if args.nvtx:
        try:
            common.nvtx_functions()
        except ValueError as exc:
            parser.error(str(exc))
    axes = {"size": args.size, "parallel": args.parallel or [None], "ctx": args.context_length, "dtype": args.dtype,
            "compile": args.compile, "attn": args.attn, "optimizer": args.optimizer, "warmup": args.warmup,
            "fsdp_mp": args.fsdp_mixed_precision, "reshard": args.reshard_after_forward}
    order = [axis for axis in axes if axis != "ctx"] + ["ctx"] if args.context_search else list(axes)
    runs = []  # a search's probes in a row, shortest first: runner.run_sweep(search=True) ends it at a failure
    try:
        for values in itertools.product(*(axes[axis] for axis in order)):
            c = dict(zip(order, values))
            kind = c["parallel"]
            if kind != "fsdp":  # FSDP-only settings do not multiply the other rows
                c["fsdp_mp"], c["reshard"] = "off", "on"
            if c["size"] == "custom":
                model = ModelConfig(**dims, vocab_size=args.vocab_size, context_length=c["ctx"])
            else:
                model = get_config(c["size"], args.handout, **dims, vocab_size=args.vocab_size,
                                   context_length=c["ctx"])
            runs.append(RunConfig(size=c["size"], handout=args.handout, model=model, batch_size=args.batch_size,
                                  warmup=c["warmup"], steps=args.steps, mode=args.mode, no_grad=args.no_grad,
                                  dtype=c["dtype"], compile=c["compile"], attn=c["attn"], optimizer=c["optimizer"],
                                  tf32=None if args.tf32 is None else args.tf32 == "on", device=args.device,
                                  seed=args.seed, nvtx=args.nvtx,
                                  profile_results_dir=args.results_dir if args.profile else None,
                                  parallel=kind, world_size=world_size if kind else 1,
                                  fsdp_mixed_precision=c["fsdp_mp"], reshard_after_forward=c["reshard"] == "on",
                                  pg_timeout_s=args.pg_timeout))
    except common.ConfigError as exc:
        parser.error(str(exc))
    runs = list(dict.fromkeys(runs))  # ddp rows are not multiplied by the FSDP-only axes
    for run in runs:
        common.check_tensor_sizes(parser, common.model_tensor_shapes(run.model, run.batch_size))
    return args, runs


def context_lengths(parser: argparse.ArgumentParser, args: argparse.Namespace, handout: common.Handout,
                    device: torch.device) -> list[int]:
    """The contexts to run: those given, the handout's default, or for 'max' the probes of the search (sets
    args.context_search and args.max_context). A search needs a child per probe and at least the steps that reach
    the training peak."""
    given = list(dict.fromkeys(args.context_length or [handout.default_context_length]))
    args.context_search = "max" in given
    if not args.context_search:
        if args.max_context is not None:
            parser.error("--max-context only applies to --context-length max")
        return given
    if len(given) > 1:
        parser.error("--context-length max searches for the longest context on its own: give max or numbers, not "
                     f"both (got {' '.join(map(str, given))})")
    args.max_context_default = None  # which default --max-context took, for --dry-run; None when given
    if args.max_context is None:
        args.max_context = MAX_CONTEXT_DEFAULT["cuda" if device.type == "cuda" else "cpu"]
        args.max_context_default = ("the default on CUDA" if device.type == "cuda" else
                                    f"the default on a CPU; on CUDA {MAX_CONTEXT_DEFAULT['cuda']}")
    if args.max_context < SEARCH_START:
        parser.error(f"--max-context must be at least {SEARCH_START}, where the search starts; got {args.max_context}")
    if args.in_process:
        parser.error("--context-length max runs every probe in its own child process (an OOM must not leave memory "
                     "behind for the next probe): drop --in-process")
    if args.no_skip:
        parser.error("--no-skip does not apply to --context-length max: a search ends at its first failure")
    if len(set(args.warmup)) > 1:  # a search is a skip group (runner), which warm-up counts share
        parser.error("--context-length max takes one --warmup value: the warm-up does not change what fits")
    if args.mode == "train" and min(args.warmup) + args.steps < 2:
        parser.error("--context-length max --mode train needs --warmup + --steps >= 2 per probe: AdamW makes its "
                     "moments in the first step, so only the second reaches the training peak")
    return probe_contexts(args.max_context)


def check_parallel_args(parser: argparse.ArgumentParser, args: argparse.Namespace, device: torch.device) -> int:
    """--parallel and torchrun belong together (or --world-size, to plan with --dry-run); a bad combination is a
    one-line exit 2 (from rank 0 only), too many CPU processes a one-line warning. Fills the FSDP-only flags'
    defaults. Returns the world size (1 without --parallel)."""
    launch = parallel.torchrun_launch()
    fsdp_flags = [f for f, v in (("--fsdp-mixed-precision", args.fsdp_mixed_precision),
                                 ("--reshard-after-forward", args.reshard_after_forward)) if v is not None]
    args.fsdp_mixed_precision = args.fsdp_mixed_precision or ["off"]
    args.reshard_after_forward = args.reshard_after_forward or ["on"]
    if args.world_size is not None:
        if not args.parallel:
            parser.error("--world-size only applies to --parallel (with --dry-run)")
        if not args.dry_run:
            parser.error("--world-size only plans a --parallel run with --dry-run; a real run takes its world size "
                         "from torchrun: torchrun --nproc-per-node N bench_e2e.py --parallel ...")
        if launch is not None:
            parser.error(f"--world-size plans without torchrun; this is a torchrun launch (WORLD_SIZE="
                         f"{launch.world_size})")
    if not args.parallel:
        if launch is not None and launch.world_size > 1:
            parser.error(f"launched by torchrun with WORLD_SIZE={launch.world_size} but without --parallel: every "
                         "rank would run the whole sweep on its own; add --parallel ddp or --parallel fsdp")
        if fsdp_flags:
            parser.error(f"{' and '.join(fsdp_flags)} only apply to --parallel fsdp")
        return 1
    args.parallel = list(dict.fromkeys(args.parallel))
    if fsdp_flags and "fsdp" not in args.parallel:
        parser.error(f"{' and '.join(fsdp_flags)} only apply to --parallel fsdp")
    if args.in_process:
        parser.error("--parallel with --in-process is not supported yet: every rank runs each configuration in a "
                     "child process of its own, which joins that configuration's process group")
    if device.type == "cuda" and device.index is not None:
        parser.error(f"--parallel gives each rank the GPU of its LOCAL_RANK: pass --device cuda, not {device}")
    if args.world_size is not None:  # a plan: nothing is launched, so there are no processes to check
        return args.world_size
    if "fsdp" in args.parallel and (reason := common.fsdp2_unsupported(device)):
        parser.error(f"--parallel fsdp: {reason}: use --parallel ddp, a GPU or a newer torch")
    if launch is None:
        parser.error("--parallel needs torchrun, which starts one process per rank and sets RANK and WORLD_SIZE: "
                     "torchrun --nproc-per-node N bench_e2e.py --parallel ... (to plan without it: --dry-run "
                     "--world-size N)")
    if device.type == "cuda":
        if torch.cuda.device_count() < launch.local_world_size:
            parser.error(f"--parallel on CUDA needs one GPU per process: {launch.local_world_size} processes on this "
                         f"node but {torch.cuda.device_count()} GPU(s) visible")
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        if launch.local_world_size > cores and launch.rank == 0:
            common.progress(f"warning: {launch.local_world_size} processes on this node but {cores} CPU cores: the "
                            "ranks share cores and every timing includes the others' work")
    return launch.world_size


# ---- the sweep ----


def finish_record(run: RunConfig, record: dict[str, Any], peak_override: float | None,
                  max_context: int | None = None) -> None:
    """The derived figures of a finished configuration; its status says whether a phase was noisy. Under
    --parallel, every row (failed ones too) gets the predicted state bytes per rank; in a --context-length max
    search, the search's upper bound."""
    if run.parallel:
        record["predicted"] = parallel.state_bytes_per_rank(run.model, run.parallel, run.world_size, run.mode)
    if record["status"] == "ok":
        record.update(derive_figures(run, record, peak_override))
        record["status"] = "noisy" if record["noisy"] else "ok"
    if max_context is not None:  # a probe of --context-length max: context_searches finds it by this
        record["context_search"] = {"max_context": max_context}


def dry_run_label(run: RunConfig) -> str:
    """A planned configuration, with the training state each rank will hold (parallel.state_bytes_per_rank), so
    whether it fits is known before the run."""
    state = parallel.state_bytes_per_rank(run.model, run.parallel, run.world_size, run.mode)["state_bytes"]
    return f"{run.label()} (predicted state {state / GIB:.2f} GiB per rank, activations aside)"


def plan_notes(runs: list[RunConfig], args: argparse.Namespace) -> list[str]:
    """What --dry-run adds below the plan: the comparison table's variants and the context searches."""
    notes = []
    configs = [dataclasses.asdict(run) for run in runs]
    names = variants(configs)
    if names:
        notes.append(f"then a comparison table: {' vs '.join(names)}, one row per size and context, speed-ups over "
                     f"{names[0]}.")
    if args.context_search:
        searches = len({config_key(c, context=False) for c in configs})
        contexts = probe_contexts(args.max_context)
        source = f"; {args.max_context_default}" if args.max_context_default else ""
        notes.append(f"context search: {searches} search{'es' if searches > 1 else ''} (one per configuration but the "
                     f"context), each trying ctx {', '.join(map(str, contexts))} in turn, every probe in its own child "
                     "process. A search ends at its first OOM (the answer: the context before it), error or timeout "
                     f"(inconclusive), or after {contexts[-1]} (--max-context {args.max_context}{source}).")
    return [textwrap.fill(note, width=116) for note in notes]


def main(argv: list[str] | None = None) -> int:
    args, runs = parse_args(argv)
    rank_zero = parallel.is_rank_zero()  # under torchrun only rank 0 prints and writes files
    configs = config_table([dataclasses.asdict(run) for run in runs], args.fmt)
    if args.dry_run:
        if not rank_zero:
            return 0
        return common.print_dry_run([dry_run_label(run) for run in runs], preamble=configs,
                                    notes=plan_notes(runs, args), at_most=args.context_search)
    files = ResultFiles(args.results_dir, "e2e", args.out, "e2e") if rank_zero else None
    if rank_zero:
        common.emit(configs + "\n")  # people quote the model config first
    experiment = runner.Experiment(
        name="bench_e2e", measure=run_config,
        finish=lambda run, record: finish_record(run, record, args.peak_tflops,
                                                 args.max_context if args.context_search else None),
        summary=lambda record: f"{record['step_ms_mean'] / 1e3:.3f} s/step",
        render=lambda records, fmt: render_report(records, fmt, args.columns))
    records, code = runner.run_sweep(experiment, runs, files, common.resolve_device(args.device), args,
                                     search=args.context_search)
    if records and rank_zero:
        for answer in context_searches(records):  # each search's answer as a record of its own, after its probes
            files.append_record(answer)
        # the saved files also hold the config table, which was printed first
        files.write_report(lambda fmt: render_report(records, fmt, args.columns), args.fmt)
        figures = report.figures_after_run("bench_e2e", records, files) if args.plot else []
        if common.emit(results_report(records, args.fmt, args.columns)):
            files.say_written(args.fmt, figures)
    return code


if __name__ == "__main__":
    sys.exit(main())
