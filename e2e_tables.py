"""bench_e2e's report from its JSONL records alone (the live .md of a sweep, the printed table and report.py's
re-render all come from render_e2e_report): the model configurations, the results, the comparison of a sweep's
variants with paired speed-ups, the longest context of each --context-length max search (with the search's own
rules: the sweep plans its probes with Bisection), and the --profile tables. torch-free. In a merge of several
runs every table gets a `run` column.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable

import kernel_tables
import results
from results import DEFAULT_HANDOUT, HANDOUTS, PHASES_BY_MODE, ModelConfig, config_row
from results import config_table as model_config_table
from results import (FINISHED, GIB, RUN_COLUMN, by_run, comparison_groups, environment_lines, finished,
                     is_merged, is_oom_status, pick_columns, render_table, run_of, runs_cell, with_run_column)

FLOPS_SOURCES = {"formula": "model_config's formula (our architecture)",
                 "counted": "torch.utils.flop_counter.FlopCounterMode, one untimed step",
                 "none": "none (no TFLOP/s, no MFU)"}
E2E_COLUMNS = ["size", "d_model", "d_ff", "layers", "heads", "ctx", "dtype", "compile", "warmup", "attn", "model",
               "optimizer", "parallel", "fwd ms", "fwd std", "bwd ms", "bwd std", "opt ms", "opt std", "step ms",
               "step std", "tokens/s", "TFLOP/s", "MFU", "state GiB/rank", "peak mem GiB", "status"]
E2E_PHASE_SHORT = {"forward": "fwd", "backward": "bwd", "optimizer": "opt", "step": "step"}
STATUS_CELL = 100  # characters of a status in a table; the record and stderr keep the whole of it


# ---- the results table ----


def parallel_label(config: dict[str, Any]) -> str | None:
    """"fsdp x8", "fsdp x8 bf16-params no-reshard", "ddp x2"; None for one process."""
    if not config.get("parallel"):
        return None
    text = f"{config['parallel']} x{config['world_size']}"
    if config["parallel"] == "fsdp":
        text += (" bf16-params" if config["fsdp_mixed_precision"] == "bf16" else "") + (
            "" if config["reshard_after_forward"] else " no-reshard")
    return text


def model_label(config: dict[str, Any]) -> str:
    """The model of a row: its --model NAME, else its MODULE:CALLABLE, else ours."""
    return config.get("model_name") or config.get("model_factory") or "ours"


def whose_model(config: dict[str, Any]) -> str:
    """The settings line's model: "ours (model.TransformerLM)", "student_lm:TinyLM", "mine (student_lm:TinyLM)"."""
    factory, name = config.get("model_factory"), config.get("model_name")
    return f"{name} ({factory})" if name and factory else factory or f"{name or 'ours'} (model.TransformerLM)"


def status_cell(status: str) -> str:
    return status if len(status) <= STATUS_CELL else status[:STATUS_CELL - 1] + "…"


def e2e_row(record: dict[str, Any]) -> dict[str, Any]:
    """One row of the results table."""
    config, m = record["config"], record["config"]["model"]
    row: dict[str, Any] = {"size": config["size"], "d_model": m["d_model"], "d_ff": m["d_ff"],
                           "layers": m["num_layers"], "heads": m["num_heads"], "ctx": m["context_length"],
                           "dtype": config["dtype"], "compile": "on" if config["compile"] else None,
                           "warmup": config["warmup"], "status": status_cell(record["status"]),
                           "parallel": parallel_label(config), "attn": config["attn"], "model": model_label(config),
                           "optimizer": config["optimizer"]}
    if record.get("predicted"):  # beside the measured peak, and on an OOM row too: the state alone may not fit
        row["state GiB/rank"] = record["predicted"]["state_bytes"] / GIB
    if not finished(record):
        return row
    for phase, short in E2E_PHASE_SHORT.items():
        if f"{phase}_ms_mean" in record:
            row[f"{short} ms"], row[f"{short} std"] = record[f"{phase}_ms_mean"], record[f"{phase}_ms_std"]
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
    """The model configurations of a sweep (one row per size) under the handout its size names come from."""
    handout = HANDOUTS[configs[0].get("handout", DEFAULT_HANDOUT)]
    return model_config_table([(c["size"], ModelConfig(**c["model"])) for c in configs], handout, fmt)


def config_section(records: list[dict[str, Any]], fmt: str) -> str:
    """config_table of the records; for a merge, one row per run and size, with the handout of each run."""
    if not is_merged(records):
        return config_table([r["config"] for r in records], fmt)
    rows = []
    for run, group in by_run(records).items():
        handout = HANDOUTS[group[0]["config"].get("handout", DEFAULT_HANDOUT)]
        for size, model in dict.fromkeys((r["config"]["size"], dataclasses.replace(
                ModelConfig(**r["config"]["model"]), context_length=1)) for r in group):
            row = {RUN_COLUMN: run, **config_row(size, model), "sizes from": handout.title}
            rows.append({**row, "params": f"{row['params']:,}"})
    columns = [RUN_COLUMN, "size", "d_model", "d_ff", "layers", "heads", "vocab", "params", "sizes from"]
    return "Model sizes of the runs merged:\n\n" + render_table(rows, columns, fmt)


def e2e_run_settings(records: list[dict]) -> dict[str, Any]:
    """The settings line of one run: what its rows share."""
    c0 = records[0]["config"]
    models = list(dict.fromkeys(r["config"].get("model_factory") for r in records))
    settings = {"sizes from": HANDOUTS[c0.get("handout", DEFAULT_HANDOUT)].title,
                "model": " and ".join(dict.fromkeys(whose_model(r["config"]) for r in records)),
                "batch": c0["batch_size"], "steps": c0["steps"],
                "mode": c0["mode"] + (" no-grad" if c0["no_grad"] else "")}
    flops = list(dict.fromkeys(r["config"].get("flops", "formula") for r in records))
    if flops != ["formula"] or models != [None]:  # whose FLOPs the TFLOP/s and MFU columns divide by
        settings["FLOPs"] = " and ".join(FLOPS_SOURCES[f] for f in flops)
    if c0.get("parallel"):  # the backend follows parallel.backend_for's rule, read from the record (no torch here)
        env = next((r["environment"] for r in records if "device" in (r.get("environment") or {})), {})
        settings["batch"] = f"{c0['batch_size']} per rank"
        settings["ranks"] = (f"{c0['world_size']} ({'nccl' if str(env.get('device')).startswith('cuda') else 'gloo'}"
                             "; times: slowest rank per phase)")
    return settings


def results_report(records: list[dict], fmt: str, columns: list[str] | None = None) -> str:
    """Environment line, the results table (a column only where it tells rows apart or holds a figure), compile
    times, the comparison and search tables, the --profile tables."""
    records = measured(records)
    rows = [{**e2e_row(rec), RUN_COLUMN: run_of(rec)} for rec in records]
    varying = {c for c in ("attn", "model", "optimizer") if len({str(row[c]) for row in rows}) > 1}
    shown = [c for c in E2E_COLUMNS if c in E2E_COLUMNS[:6] + ["dtype", "warmup"] or c in varying
             or (c not in ("attn", "model", "optimizer") and any(row.get(c) is not None for row in rows))]
    lines = environment_lines(records, e2e_run_settings) + [""]
    lines.append(render_table(rows, pick_columns(with_run_column(shown, records), columns, fmt), fmt))
    compile_times = [f"{run_of(rec) + ': ' if is_merged(records) else ''}{rec['label']}: {rec['compile_s']:.1f} s"
                     for rec in records if "compile_s" in rec]
    if compile_times:
        lines += ["", "compile time (first step, not in the timings): " + "; ".join(compile_times)]
    lines += [t for table in comparison_section(records, fmt) + [search_table(records, fmt), profile_report(
        records, fmt)] if table for t in ("", table)]
    return "\n".join(lines)


def render_e2e_report(records: list[dict], fmt: str, columns: list[str] | None = None) -> str:
    """The whole report of a run (or of runs merged): the model configurations, then the results."""
    return config_section(measured(records), fmt) + "\n\n" + results_report(records, fmt, columns)


def measured(records: list[dict]) -> list[dict]:
    """The configurations' records, without the search answers that follow them in a JSONL file."""
    return [r for r in records if r.get("kind") != "longest_context"]


# ---- comparisons: one configuration in several variants (--dtype, --compile, --attn, --model, ...) ----

VARIANT_AXES: dict[str, Callable[[dict[str, Any]], str]] = {  # how each axis names its value
    "dtype": lambda c: c["dtype"],
    "compile": lambda c: "compiled" if c["compile"] else "eager",
    "attn": lambda c: c["attn"],
    "model": lambda c: model_label(c) if model_label(c) != "ours" else "our model",
    "optimizer": lambda c: {"ours": "our AdamW", "torch": "torch AdamW"}.get(c["optimizer"], c["optimizer"]),
    "parallel": lambda c: parallel_label(c) or "1 process",
}
VARIANT_FIELDS = ("dtype", "compile", "attn", "model_factory", "model_name", "flops", "optimizer", "parallel",
                  "world_size", "fsdp_mixed_precision", "reshard_after_forward")  # the config fields behind them


def varied_axes(configs: list[dict[str, Any]]) -> list[str]:
    """The variant axes that take more than one value ([] = nothing to compare)."""
    return [axis for axis, name in VARIANT_AXES.items() if len({name(c) for c in configs}) > 1]


def variant_label(config: dict[str, Any], axes: list[str]) -> str:
    """"bf16", "bf16 compiled", "sdpa ddp x2": the values of the varied axes only."""
    return " ".join(VARIANT_AXES[axis](config) for axis in axes)


def variants(configs: list[dict[str, Any]]) -> list[str]:
    """The variants in the order they ran (the first is the baseline); [] for a single variant."""
    axes = varied_axes(configs)
    return list(dict.fromkeys(variant_label(c, axes) for c in configs)) if axes else []


def config_key(config: dict[str, Any], leave_out: tuple[str, ...] = (), context: bool = True) -> str:
    """A config as a key without the fields `leave_out` (and without the context when context=False)."""
    kept = {k: v for k, v in config.items() if k not in leave_out}
    if not context:
        kept["model"] = {k: v for k, v in kept["model"].items() if k != "context_length"}
    return json.dumps(kept, sort_keys=True, default=str)


def short_status(status: str) -> str:
    """"OOM", "error", "timeout after 900 s", "skipped": a failed row's status without its detail."""
    return status.split(":")[0]


def control_phase(configs: list[dict[str, Any]]) -> str | None:
    """The phase every variant runs identically, whose drift says the machine changed: the optimizer step when
    only the model's settings vary (dtype but fp16, compile, attention: fp32 master weights either way), the
    forward when only the optimizer varies; None otherwise."""
    varied = {f for f in ("dtype", "compile", "attn", "optimizer", "model_factory", "parallel")
              if len({str(c.get(f)) for c in configs}) > 1}
    if configs[0]["mode"] != "train" or not varied or varied & {"parallel", "model_factory"}:
        return None
    if varied == {"optimizer"}:
        return "forward"
    return "optimizer" if "optimizer" not in varied and not any(c["dtype"] == "fp16" for c in configs) else None


@dataclass(frozen=True)
class Comparison:
    variants: list[str]  # in the order they ran; the first is the baseline of the speed-ups
    ratios: list[str]  # the speed-up columns per variant: "fwd", "fwd+bwd" (with a backward), "step"
    rows: list[dict[str, Any]]  # one per (size, context[, warm-up]); cells "<label> speed-up: <variant>"
    columns: list[str]


def comparison(records: list[dict]) -> Comparison | None:
    """One row per (size, context) with each variant's mean time per phase side by side, then each variant's
    speed-up over the first (forward, forward+backward, step) with its interval and notes. None for one variant."""
    configs = [r["config"] for r in records]
    if not (names := variants(configs)):
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
        row.update({"warmup": config["warmup"]} if warmups else {})
        for phase in phases:
            for name in names:  # numbers formatted here: a column mixing numbers and statuses is text to tabulate
                rec = cells.get(name)
                row[f"{E2E_PHASE_SHORT[phase]} ms: {name}"] = (
                    f"{rec[f'{phase}_ms_mean']:.2f}" if rec and finished(rec) else
                    short_status(rec["status"]) if rec else "not run")
        unresolved, drifts, paired, few_rounds, pulled = [], [], set(), {}, []
        base = cells.get(names[0])
        for name in names[1:]:
            other = cells.get(name)
            both = bool(base and other and finished(base) and finished(other))
            for label, summed in ratios:
                found = results.speedup(base, other, summed) if both else None
                row[f"{label} speed-up: {name}"] = (
                    f"{found.ratio:.2f}x" if found else short_status(other["status"]) if other and not finished(other)
                    else "not run" if not other else f"baseline {short_status(base['status']) if base else 'not run'}")
                row[f"{label} 95% CI: {name}"] = found.interval_text() if found else None
                if found and found.rounds:
                    paired.update((names[0], name))
                    if found.low is None:  # rounds are steps, or whole runs (--interleave runs --repeats)
                        few_rounds[name] = (found.rounds, "--repeats" if (base.get("pairing") or {}).get(
                            "mode") == "runs" else "--steps")
                if found and found.resolved is False:
                    unresolved.append(f"{label} {name}")
                if found and (means := results.means_outside(found, base, other, summed)) is not None:
                    pulled.append(f"{label} {name} {means:.2f}x")
            if both and control and (moved := results.drift(base, other, control)):
                drifts.append(f"{moved.text()} ({name})")
        # a paired ratio says how sure it is (its interval); "noisy" is left for rows measured apart
        noisy = [n for n in names if n in cells and cells[n]["status"] == "noisy" and n not in paired]
        notes = results.interval_notes(unresolved, few_rounds, pulled, "steps") + drifts
        row["notes"] = "; ".join(notes + ([f"noisy: {', '.join(noisy)}"] if noisy else [])) or None
        rows.append(row)
    intervals = any(row.get(f"{label} 95% CI: {n}") for row in rows for n in names[1:] for label, _ in ratios)
    columns = ["size", "ctx"] + (["warmup"] if warmups else [])
    columns += [f"{E2E_PHASE_SHORT[p]} ms: {n}" for p in phases for n in names]
    columns += [c for n in names[1:] for label, _ in ratios
                for c in [f"{label} speed-up: {n}"] + ([f"{label} 95% CI: {n}"] if intervals else [])]
    columns += ["notes"] if any(row["notes"] for row in rows) else []
    return Comparison(names, [label for label, _ in ratios], rows, columns)


def comparison_note(baseline: str) -> str:
    return ("Mean ms per phase from the rows above; fwd+bwd sums the two phases. "
            f"{results.speedup_note(baseline, 'steps')} drift: a phase every variant runs alike changed between them by more than twice its standard error. "
            "A failed row shows its status, not a number.")


def run_comparisons(records: list[dict]) -> list[tuple[Comparison, list[str | None]]]:
    """comparison() of possibly merged records, with the run(s) each row comes from (None: not merged). A
    configuration measured in two runs makes each run compared within itself (results.comparison_groups)."""
    out = []
    for group in comparison_groups(records, lambda r: config_key(r["config"])):
        if (found := comparison(group)) is None:
            continue
        rows: dict[str, list[dict]] = {}  # comparison()'s rows, in the same order
        for rec in group:
            rows.setdefault(config_key(rec["config"], VARIANT_FIELDS), []).append(rec)
        out.append((found, [runs_cell(rs) if is_merged(records) else None for rs in rows.values()]))
    return out


def comparison_section(records: list[dict], fmt: str) -> list[str]:
    """The comparison tables: one per set of variants, with a run column for a merge."""
    tables: dict[tuple, tuple[list[str], list[dict]]] = {}
    for found, runs in run_comparisons(records):
        columns, rows = tables.setdefault(tuple(found.variants), ([], []))
        columns[:] = merged_columns(columns, found.columns)
        rows.extend({RUN_COLUMN: run, **row} for run, row in zip(runs, found.rows))
    merged = is_merged(records)
    return [f"## Comparison: {' vs '.join(names)} (speed-ups over {names[0]}{'; runs merged' if merged else ''})\n\n"
            + render_table(rows, ([RUN_COLUMN] if merged else []) + columns, fmt) + f"\n\n{comparison_note(names[0])}"
            + (" A configuration measured in several runs is compared within each run, never across." if merged else "")
            for names, (columns, rows) in tables.items()]


def merged_columns(first: list[str], second: list[str]) -> list[str]:
    """Two comparisons' columns in one order: each interval after its speed-up, `notes` last."""
    union = [c for c in dict.fromkeys(first + second) if c != "notes" and " 95% CI: " not in c]
    intervals = {c.replace(" 95% CI: ", " speed-up: "): c for c in first + second if " 95% CI: " in c}
    return [x for c in union for x in ([c, intervals[c]] if c in intervals else [c])] + (
        ["notes"] if "notes" in first + second else [])


# ---- --context-length max: the longest context that runs ----

SEARCH_START = 128  # the first probe; the study's contexts are powers of two from 128
RESOLUTION = 64  # the bisection's default step: the answer is a multiple of it (kernels like multiples of 64)
PROBE_BUDGET = 8  # bisection probes at most per search (from 64 to 65536 takes 10)


def doubling_sizes(start: int, cap: int) -> list[int]:
    """start, 2 start, 4 start, ... up to the largest <= cap."""
    out = [start]
    while out[-1] * 2 <= cap:
        out.append(out[-1] * 2)
    return out


def probe_contexts(max_context: int) -> list[int]:
    return doubling_sizes(SEARCH_START, max_context)


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


def search_answer(probes: list[dict[str, Any]], cap: int, resolution: int, budget: int) -> dict[str, Any]:
    """One search's answer from its probes ({"context_length", "status"}): the longest context that ran, the
    longest power of two, the first OOM, whether conclusive, and the answer in words."""
    probes = sorted(probes, key=lambda p: p["context_length"])
    fits = [p["context_length"] for p in probes if p["status"] in FINISHED]
    ooms = [p["context_length"] for p in probes if is_oom_status(p["status"])]
    others = [p for p in probes if p["status"] not in FINISHED and not is_oom_status(p["status"])]
    longest, first_oom = max(fits, default=None), min(ooms, default=None)
    powers = [n for n in fits if n & (n - 1) == 0]
    out = {"longest_context": longest, "longest_power_of_two": max(powers, default=None), "first_oom": first_oom,
           "resolution": resolution, "conclusive": False}
    if others and (first_oom is None or others[0]["context_length"] < first_oom):
        ctx, status = others[0]["context_length"], others[0]["status"]
        out["answer"] = (f"the longest within the time limit: {ctx} timed out, whether it fits is unknown"
                         if status.startswith(("timeout", "process-group timeout"))
                         else f"inconclusive: {ctx} failed with an error, not an OOM (see its row)")
        if first_oom is not None and longest is not None:  # a bisection probe failed otherwise: bounds stand
            out["answer"] += f"; the limit lies between {longest} and {first_oom}"
    elif first_oom is None:
        out["answer"] = (f"at least this: the search stops at --max-context {cap}"
                         if longest is not None and longest >= probe_contexts(cap)[-1]
                         else "incomplete: the search was interrupted")
    elif longest is None:
        out.update(conclusive=True, answer=f"none: OOM already at {first_oom}")
    elif first_oom - longest <= resolution:
        out.update(conclusive=True, answer=f"the longest that fits, to within {resolution}: {first_oom} runs out of "
                                           f"memory (the longest power of two: {out['longest_power_of_two']})")
    elif sum(1 for p in probes if p["context_length"] & (p["context_length"] - 1)) >= budget:
        out["answer"] = (f"between {longest} and {first_oom}: the bisection spent its budget of {budget} probes "
                         "(--search-probes)")
    else:
        out["answer"] = f"between {longest} and {first_oom}: the bisection was interrupted"
    return out


def context_searches(records: list[dict]) -> list[dict[str, Any]]:
    """The answer of every search in a sweep's records (one per configuration but the context), as a record."""
    groups: dict[str, list[dict]] = {}
    for rec in records:
        if "context_search" in rec:
            groups.setdefault(config_key(rec["config"], context=False), []).append(rec)
    answers = []
    for probes in groups.values():
        settings = probes[0]["context_search"]
        seen = [{"context_length": r["config"]["model"]["context_length"], "status": r["status"]} for r in probes]
        found = search_answer(seen, settings["max_context"], settings.get("resolution", RESOLUTION),
                              settings.get("probe_budget", PROBE_BUDGET))
        best = next((r for r in probes if r["config"]["model"]["context_length"] == found["longest_context"]
                     and finished(r)), probes[0])
        answers.append({"experiment": "bench_e2e", "kind": "longest_context", "label": best["label"],
                        "config": best["config"], **found, "max_context": settings["max_context"], "probes": seen,
                        "status": f"longest context {found['longest_context'] or 'none'}: {found['answer']}"})
    return answers


def search_table(records: list[dict], fmt: str) -> str | None:
    """The longest context of every search, beside its step time and peak memory there; None without a search."""
    answers, rows = [], []
    for run, group in by_run(records).items():
        probes = {config_key(r["config"]): r for r in group if "context_search" in r}
        for ans in context_searches(group):
            c, last = ans["config"], ans["probes"][-1]
            best = probes.get(config_key(c)) if ans["longest_context"] else None
            row = {RUN_COLUMN: run, "size": c["size"], "mode": c["mode"] + (" no-grad" if c["no_grad"] else ""),
                   "dtype": c["dtype"], "compile": "on" if c["compile"] else "off", "attn": c["attn"],
                   "model": model_label(c), "optimizer": c["optimizer"], "parallel": parallel_label(c),
                   "longest ctx": ans["longest_context"], "longest 2^k": ans["longest_power_of_two"],
                   "last probe": f"{last['context_length']}: {short_status(last['status'])}", "answer": ans["answer"]}
            if best is not None:
                row["step ms"] = best["step_ms_mean"]
                if best.get("peak_mem_allocated_bytes") is not None:
                    row["peak mem GiB"] = best["peak_mem_allocated_bytes"] / GIB
            answers.append(ans)
            rows.append(row)
    if not answers:
        return None
    columns = with_run_column(["size", "mode", "dtype"], records)
    columns += [c for c in ("compile", "attn", "model", "optimizer") if len({str(r[c]) for r in rows}) > 1]
    columns += ["parallel"] if any(r["parallel"] for r in rows) else []
    columns += ["longest ctx", "longest 2^k", "step ms"] + (["peak mem GiB"] if any("peak mem GiB" in r for r in rows)
                                                            else []) + ["last probe", "answer"]
    caps = " / ".join(str(cap) for cap in dict.fromkeys(a["max_context"] for a in answers))
    resolutions = " / ".join(str(r) for r in dict.fromkeys(a["resolution"] for a in answers))
    return (f"## Longest context that runs (powers of two from {SEARCH_START} up to --max-context {caps}, then after "
            f"an OOM a bisection to a multiple of {resolutions})\n\n" + render_table(rows, columns, fmt)
            + "\n\nlongest ctx: the longest that ran, bisected between the last power of two that ran and the first "
              "that ran out of memory; longest 2^k: the doubling's answer.")


# ---- --profile: torch.profiler's kernel tables and the time in collectives ----


def profile_report(records: list[dict], fmt: str) -> str | None:
    """The --profile tables of every configuration that has them (rank 0's under --parallel), and under
    --parallel each rank's time in collectives per phase."""
    parts = []
    for rec in records:
        label = rec["label"] + (f" ({run_of(rec)})" if is_merged(records) else "")
        if "profile" in rec:
            whose = " (rank 0)" if rec["config"].get("parallel") else ""
            parts.append(f"## torch.profiler: {label}{whose} (timings above were taken with the profiler on)\n\n"
                         + kernel_tables.render_tables(rec["profile"]["tables"], fmt)
                         + f"\n\ntrace: {rec['profile']['trace']} (open in https://ui.perfetto.dev)")
        rows = [{**row, "rank": rank["rank"], "share": f"{row['share']:.0%}" if row.get("share") is not None else None}
                for rank in rec.get("ranks", []) for row in rank.get("collectives", [])]
        if rows:  # one column per kind of collective that ran (parallel.collective_rows' "all-reduce_ms", ...)
            kinds = [k for k in dict.fromkeys(k for r in rows for k in r)
                     if k.endswith("_ms") and k not in ("phase_ms", "collective_ms")]
            named = ([("rank", "rank"), ("phase", "phase"), ("phase_ms", "phase ms")]
                     + [(k, f"{k.removesuffix('_ms').removesuffix(' collective')} ms") for k in kinds]
                     + [("collective_ms", "in collectives ms"), ("share", "share of phase")])
            table = render_table([{h: r.get(k) for k, h in named} for r in rows], [h for _, h in named], fmt, ".3f")
            parts.append(f"## Collectives per phase: {label} (every rank, ms per step)\n\n{table}\n\nA collective "
                         "counts for the phase in which it starts; compute may run beside it (FSDP2 prefetches the "
                         "next block's all-gather). gloo runs a reduce-scatter as an all-reduce.")
    return "\n\n".join(parts) or None


# ---- the names report.py, figures.py, memory_tables.py and the tests use until integration ----
COLUMNS, table_row, run_settings, render_report = E2E_COLUMNS, e2e_row, e2e_run_settings, render_e2e_report
PHASE_SHORT = E2E_PHASE_SHORT


def comparison_table(records: list[dict], fmt: str) -> str | None:
    return (comparison_section(records, fmt) or [None])[0]
