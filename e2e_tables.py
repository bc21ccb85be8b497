"""bench_e2e's report, from its JSONL records alone: the model configurations, the results table, the comparison
of a sweep's variants (speed-ups), the longest context of each --context-length max search, and the --profile
kernel and collective tables. report.render("bench_e2e", ...) is the one caller: the live .md of a sweep, the
files of --fmt, the table bench_e2e.py prints at the end, report.py's re-render and merges all come from here.

torch-free, like everything the reports are made of (report.py's docstring has the layout). In a merge of
several runs (results.RUN_KEY on each record) every table gets a `run` column and no run's configuration is
dropped.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

import profile_tables
import search
import stats
from model_config import DEFAULT_HANDOUT, HANDOUTS, PHASES_BY_MODE, ModelConfig, config_row
from model_config import config_table as model_config_table
from results import (GIB, RUN_COLUMN, by_run, comparison_groups, environment_lines, finished, is_merged,
                     pick_columns, render_table, run_of, runs_cell, with_run_column)
from search import SEARCH_START

# ---- the table ----

FLOPS_SOURCES = {"formula": "model_config's formula (our architecture)",
                 "counted": "torch.utils.flop_counter.FlopCounterMode, one untimed step",
                 "none": "none (no TFLOP/s, no MFU)"}

COLUMNS = ["size", "d_model", "d_ff", "layers", "heads", "ctx", "dtype", "warmup", "attn", "model", "optimizer",
           "parallel", "fwd ms", "fwd std", "bwd ms", "bwd std", "opt ms", "opt std", "step ms", "step std", "tokens/s",
           "TFLOP/s", "MFU", "state GiB/rank", "peak mem GiB", "status"]


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
                           "parallel": parallel_label(config), "model": config.get("model_factory")}
    if record.get("predicted"):  # beside the measured peak, and on an OOM row too: the state alone may not fit
        row["state GiB/rank"] = record["predicted"]["state_bytes"] / GIB
    if not finished(record):
        return row
    for phase, short in (("forward", "fwd"), ("backward", "bwd"), ("optimizer", "opt"), ("step", "step")):
        if f"{phase}_ms_mean" in record:
            row[f"{short} ms"] = record[f"{phase}_ms_mean"]
            row[f"{short} std"] = record[f"{phase}_ms_std"]
    row["tokens/s"] = f"{record['tokens_per_s']:,.0f}"
    row["TFLOP/s"] = record.get("achieved_tflops")
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
    return model_config_table([(c["size"], ModelConfig(**c["model"])) for c in configs], handout, fmt)


def config_section(records: list[dict[str, Any]], fmt: str) -> str:
    """config_table of the records' configurations; for a merge, one row per run and size, with the run and the
    handout whose table each run's size names come from."""
    if not is_merged(records):
        return config_table([r["config"] for r in records], fmt)
    rows = []
    for run, group in by_run(records).items():
        handout = HANDOUTS[group[0]["config"].get("handout", DEFAULT_HANDOUT)]
        models = dict.fromkeys((r["config"]["size"], dataclasses.replace(ModelConfig(**r["config"]["model"]),
                                                                          context_length=1)) for r in group)
        for size, model in models:
            row = {RUN_COLUMN: run, **config_row(size, model), "sizes from": handout.title}
            row["params"] = f"{row['params']:,}"
            rows.append(row)
    columns = [RUN_COLUMN, "size", "d_model", "d_ff", "layers", "heads", "vocab", "params", "sizes from"]
    return "Model sizes of the runs merged:\n\n" + render_table(rows, columns, fmt)



# ---- comparisons: the same configuration in several variants (--dtype, --compile, --attn, ...) ----

# The sweep axes whose values are variants of one configuration, compared side by side; how each names a value.
VARIANT_AXES: dict[str, Callable[[dict[str, Any]], str]] = {
    "dtype": lambda c: c["dtype"],
    "compile": lambda c: "compiled" if c["compile"] else "eager",
    "attn": lambda c: c["attn"],
    "model": lambda c: c.get("model_factory") or "our model",
    "optimizer": lambda c: {"ours": "our AdamW", "torch": "torch AdamW"}.get(c["optimizer"], c["optimizer"]),
    "parallel": lambda c: parallel_label(c) or "1 process",
}
VARIANT_FIELDS = ("dtype", "compile", "attn", "model_factory", "flops", "optimizer", "parallel", "world_size",
                  "fsdp_mixed_precision", "reshard_after_forward")  # the config fields behind VARIANT_AXES
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


def speedup_of(base: dict[str, Any] | None, other: dict[str, Any] | None,
               phases: tuple[str, ...]) -> tuple[str, stats.PairedRatio | None]:
    """The speed-up of the other variant over the baseline over these phases, as its cell ("1.93x": 1.93 times as
    fast) and as stats.speedup found it (paired by round when the two were measured together, else the ratio of
    their summed means). A failed or missing row gives its status in the cell, and None."""
    if other is None or not finished(other):
        return (short_status(other["status"]) if other else "not run"), None
    if base is None or not finished(base):
        return f"baseline {short_status(base['status']) if base else 'not run'}", None
    found = stats.speedup(base, other, phases)
    return f"{found.ratio:.2f}x", found


def control_phase(configs: list[dict[str, Any]]) -> str | None:
    """The phase every variant of a comparison runs identically, the control for drift (stats.drift): the optimizer
    step when only the model's settings vary (dtype, compile, attention: the fp32 master weights and gradients are
    the same; fp16's grad scaler is not), the forward pass when only the optimizer varies; None otherwise (forward
    mode, your model against ours, or every phase differs). A control that moved says the machine changed."""
    varied = {f for f in ("dtype", "compile", "attn", "optimizer", "model_factory", "parallel")
              if len({str(c.get(f)) for c in configs}) > 1}
    if configs[0]["mode"] != "train" or not varied or varied & {"parallel", "model_factory"}:
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
                ok = rec is not None and finished(rec)
                # numbers formatted here: a column that mixes numbers and statuses is text to tabulate
                row[f"{PHASE_SHORT[phase]} ms: {name}"] = (f"{rec[f'{phase}_ms_mean']:.2f}" if ok else
                                                           short_status(rec["status"]) if rec else "not run")
        unresolved, drifts, paired_names, few_rounds, pulled = [], [], set(), {}, []
        for name in names[1:]:
            base, other = cells.get(names[0]), cells.get(name)
            for label, summed in ratios:
                row[f"{label} speed-up: {name}"], found = speedup_of(base, other, summed)
                row[f"{label} 95% CI: {name}"] = found.interval_text() if found else None
                if found and found.rounds:
                    paired_names.update((names[0], name))
                    if found.low is None:  # rounds are steps, or whole runs (--interleave runs --repeats)
                        knob = "--repeats" if (base.get("pairing") or {}).get("mode") == "runs" else "--steps"
                        few_rounds[name] = (found.rounds, knob)
                if found and found.resolved is False:
                    unresolved.append(f"{label} {name}")
                if found and (means := stats.means_outside(found, base, other, summed)) is not None:
                    pulled.append(f"{label} {name} {means:.2f}x")
            both = base is not None and other is not None and finished(base) and finished(other)
            moved = stats.drift(base, other, control) if control and both else None
            if moved:
                drifts.append(f"{moved.text()} ({name})")
        # a paired ratio says how sure it is (its interval); "noisy" is left for rows measured apart
        noisy = [name for name in names if name in cells and cells[name]["status"] == "noisy"
                 and name not in paired_names]
        notes = stats.interval_notes(unresolved, few_rounds, pulled, "steps") + drifts
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
            + f"\n\n{comparison_note(names[0])}")


def comparison_note(baseline: str) -> str:
    """The note under every comparison table, merged or not."""
    return (f"Mean ms per phase from the rows above; fwd+bwd sums the two phases. "
            f"{stats.speedup_note(baseline, 'steps')} drift: a phase every variant runs alike changed between them by more than twice its standard error. A "
            "failed row shows its status, not a number.")


# ---- --context-length max: the longest context that runs ----


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
    for probes in groups.values():  # in the order they ran: the last one ended the search
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
    None when the sweep was not a search. In a merge, each run's searches are answered from its own probes."""
    answers, rows = [], []
    for run, group in by_run(records).items():
        run_answers = context_searches(group)
        answers += run_answers
        probes = {config_key(r["config"]): r for r in group if "context_search" in r}
        for ans in run_answers:
            config = ans["config"]
            best = probes.get(config_key(config)) if ans["longest_context"] else None
            last = ans["probes"][-1]
            row = {RUN_COLUMN: run, "size": config["size"],
                   "mode": config["mode"] + (" no-grad" if config["no_grad"] else ""),
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
    if not answers:
        return None
    columns = with_run_column(["size", "mode", "dtype", "attn"], records)
    columns += [c for c in ("optimizer", "warmup") if len({str(r[c]) for r in rows}) > 1]
    columns += ["parallel"] if any(r["parallel"] for r in rows) else []
    bisected = [a for a in answers if a.get("resolution")]
    columns += ["longest ctx"] + (["longest 2^k"] if bisected else []) + ["step ms"]
    columns += (["peak mem GiB"] if any("peak mem GiB" in r for r in rows) else []) + ["last probe", "answer"]
    caps = " / ".join(str(cap) for cap in dict.fromkeys(a["max_context"] for a in answers))
    how = f"powers of two from {SEARCH_START} up to --max-context {caps}"
    if bisected:
        resolutions = " / ".join(str(r) for r in dict.fromkeys(a["resolution"] for a in bisected))
        how += f", then after an OOM a bisection to a multiple of {resolutions}"
        note = ("longest ctx: the longest that ran, bisected between the last power of two that ran and the first "
                "that ran out of memory; longest 2^k: the doubling's answer.")
    else:
        note = ("The true limit lies between the longest context and twice it: bisect with an explicit "
                "--context-length list to get closer.")
    return f"## Longest context that runs ({how})\n\n" + render_table(rows, columns, fmt) + "\n\n" + note


def measured(records: list[dict]) -> list[dict]:
    """The configurations' own records, without the answers of --context-length max searches that follow them in a
    JSONL file (context_searches makes those again from the configurations' records)."""
    return [r for r in records if r.get("kind") != "longest_context"]


def run_settings(records: list[dict]) -> dict[str, Any]:
    """The settings line of one run: what its rows share (handout, batch, steps, mode; attention and optimizer
    when there is one of each; under torchrun the world)."""
    env = next((r["environment"] for r in records if "device_name" in (r.get("environment") or {})), None)
    config0 = records[0]["config"]
    optimizers = list(dict.fromkeys(r["config"]["optimizer"] for r in records))
    attns = list(dict.fromkeys(r["config"]["attn"] for r in records))
    models = list(dict.fromkeys(r["config"].get("model_factory") for r in records))
    settings = {"sizes from": HANDOUTS[config0.get("handout", DEFAULT_HANDOUT)].title,
                "model": " and ".join(m or "ours (model.TransformerLM)" for m in models),
                "batch": config0["batch_size"], "steps": config0["steps"],
                "mode": config0["mode"] + (" no-grad" if config0["no_grad"] else "")}
    flops = list(dict.fromkeys(r["config"].get("flops", "formula") for r in records))
    if flops != ["formula"] or models != [None]:  # whose FLOPs the TFLOP/s and MFU columns divide by
        settings["FLOPs"] = " and ".join(FLOPS_SOURCES[f] for f in flops)
    if len(attns) == 1 and None in models:
        settings["attn"] = attns[0]
    if config0["mode"] == "train" and len(optimizers) == 1:
        settings["optimizer"] = optimizers[0]
    if config0.get("parallel"):  # torchrun: the world, and what the batch means
        # parallel.backend_for's rule, read from the record here: this module does not import torch
        backend = "nccl" if env and str(env["device"]).startswith("cuda") else "gloo"
        settings["batch"] = f"{config0['batch_size']} per rank"
        settings["ranks"] = f"{config0['world_size']} ({backend}; times: slowest rank per phase)"
    return settings


def comparison_section(records: list[dict], fmt: str) -> list[str]:
    """The comparison tables: comparison_table for one run; for a merge, run_comparisons with a run column, one
    table per set of variants."""
    if not is_merged(records):
        table = comparison_table(records, fmt)
        return [table] if table else []
    tables: dict[tuple, list[dict[str, Any]]] = {}
    columns_of: dict[tuple, list[str]] = {}  # one table per set of variants, whatever columns each run's has
    for found, runs in run_comparisons(records):
        key = tuple(found.variants)
        columns_of[key] = merged_columns(columns_of.get(key, []), found.columns)
        tables.setdefault(key, []).extend({RUN_COLUMN: run, **row} for run, row in zip(runs, found.rows))
    parts = []
    for names, rows in tables.items():
        parts.append(f"## Comparison: {' vs '.join(names)} (speed-ups over {names[0]}; runs merged)\n\n"
                     + render_table(rows, [RUN_COLUMN] + columns_of[names], fmt)
                     + f"\n\n{comparison_note(names[0])} A configuration measured in several runs is compared "
                       "within each run (its run column), never across.")
    return parts


def merged_columns(first: list[str], second: list[str]) -> list[str]:
    """The columns of two runs' comparisons of the same variants, in one order: each interval right after its
    speed-up (a run measured apart has none), `notes` last (a run may have none)."""
    union = [c for c in dict.fromkeys(first + second) if c != "notes" and " 95% CI: " not in c]
    intervals = {c.replace(" 95% CI: ", " speed-up: "): c for c in first + second if " 95% CI: " in c}
    columns = [x for c in union for x in ([c, intervals[c]] if c in intervals else [c])]
    return columns + (["notes"] if "notes" in first + second else [])


def run_comparisons(records: list[dict]) -> list[tuple[Comparison, list[str | None]]]:
    """comparison() of possibly merged records, with the run(s) each row's cells come from (None: not merged).
    Runs are compared across (an fp32 run beside a bf16 run) unless a configuration appears in two runs; then
    each run is compared within itself (results.comparison_groups), so both pairs are kept."""
    out = []
    for group in comparison_groups(records, lambda r: config_key(r["config"])):
        found = comparison(group)
        if found is None:
            continue
        # comparison() makes one row per config_key without the variant fields, in the order the records come
        rows: dict[str, list[dict]] = {}
        for rec in group:
            rows.setdefault(config_key(rec["config"], VARIANT_FIELDS), []).append(rec)
        assert len(rows) == len(found.rows), "comparison() rows no longer follow config_key(.., VARIANT_FIELDS)"
        runs = [runs_cell(rs) if is_merged(records) else None for rs in rows.values()]
        out.append((found, runs))
    return out


def results_report(records: list[dict], fmt: str, columns: list[str] | None = None) -> str:
    """Environment header, the results table (with `columns`: results.pick_columns), compile times, the
    comparison and longest-context tables and the --profile tables, from the records alone."""
    records = measured(records)
    merged = is_merged(records)
    optimizers = list(dict.fromkeys(r["config"]["optimizer"] for r in records))
    attns = list(dict.fromkeys(r["config"]["attn"] for r in records))
    models = list(dict.fromkeys(r["config"].get("model_factory") for r in records))
    lines = environment_lines(records, run_settings) + [""]
    rows = [table_row(rec) for rec in records]
    for rec, row in zip(records, rows):  # a compared setting: one column says which row is which
        if len(optimizers) > 1:
            row["optimizer"] = rec["config"]["optimizer"]
        if len(attns) > 1:
            row["attn"] = rec["config"]["attn"]
        if len(models) > 1:
            row["model"] = rec["config"].get("model_factory") or "ours"
        row[RUN_COLUMN] = run_of(rec)
    shown = [c for c in COLUMNS if any(row.get(c) is not None for row in rows) or c in COLUMNS[:8]]
    lines.append(render_table(rows, pick_columns(with_run_column(shown, records), columns, fmt), fmt))
    compile_times = [f"{run_of(rec) + ': ' if merged else ''}{rec['label']}: {rec['compile_s']:.1f} s"
                     for rec in records if "compile_s" in rec]
    if compile_times:
        lines += ["", "compile time (first step, not in the timings): " + "; ".join(compile_times)]
    for table in comparison_section(records, fmt) + [search_table(records, fmt)]:
        if table:
            lines += ["", table]
    profiles = profile_report(records, fmt)
    return "\n".join(lines) + ("\n\n" + profiles if profiles else "")


def render_report(records: list[dict], fmt: str, columns: list[str] | None = None) -> str:
    """The whole report of a run (or of runs merged) from its JSONL records: the model configurations, then the
    results (with `columns` in the results table: results.pick_columns)."""
    return config_section(measured(records), fmt) + "\n\n" + results_report(records, fmt, columns)


# ---- --profile: torch.profiler's kernel tables and the time in collectives ----


def profile_report(records: list[dict], fmt: str) -> str:
    """The --profile tables of every configuration that has them (rank 0's, under --parallel), and with
    --parallel the time in collectives per phase on every rank."""
    parts = []
    for rec in records:
        label = rec["label"] + (f" ({run_of(rec)})" if is_merged(records) else "")
        if "profile" in rec:
            whose = " (rank 0)" if rec["config"].get("parallel") else ""
            parts.append(f"## torch.profiler: {label}{whose} (timings above were taken with the profiler on)"
                         "\n\n" + profile_tables.render_tables(rec["profile"]["tables"], fmt)
                         + f"\n\ntrace: {rec['profile']['trace']} (open in https://ui.perfetto.dev)")
        collectives = collectives_table(rec, fmt)
        if collectives:
            parts.append(f"## Collectives per phase: {label} (every rank, ms per step)\n\n{collectives}")
    return "\n\n".join(parts)


def collectives_table(record: dict[str, Any], fmt: str) -> str | None:
    """Per rank and phase, the milliseconds per step in each kind of collective and the share of the phase's
    wall time covered by any (parallel.collective_rows), from a --parallel --profile record."""
    rows = [{**row, "rank": rank["rank"], "share": f"{row['share']:.0%}" if row.get("share") is not None else None}
            for rank in record.get("ranks", []) for row in rank.get("collectives", [])]
    if not rows:
        return None
    # one column per kind of collective that ran ("all-reduce_ms", ...), in the order parallel.collective_rows
    # writes them: read from the rows, so that this module needs neither torch nor parallel.py's patterns
    kinds = [key for key in dict.fromkeys(k for r in rows for k in r)
             if key.endswith("_ms") and key not in ("phase_ms", "collective_ms")]
    columns = ([("rank", "rank"), ("phase", "phase"), ("phase_ms", "phase ms")]
               + [(key, "other ms" if key == "other collective_ms" else f"{key.removesuffix('_ms')} ms")
                  for key in kinds]
               + [("collective_ms", "in collectives ms"), ("share", "share of phase")])
    shown = [{header: row.get(key) for key, header in columns} for row in rows]
    return render_table(shown, [header for _, header in columns], fmt, ".3f") + (
        "\n\nA collective counts for the phase in which it starts; the time is on the wire, and compute may run beside "
        "it (FSDP2 prefetches the next block's all-gather). gloo runs a reduce-scatter as an all-reduce.")
