"""Saved runs, again, and every experiment's tables and figures: a study script's JSONL records rendered in
any tabulate format, several runs merged into one report (a `run` column in every table), the figures as PNG.

    python3 report.py results/e2e/e2e-20250101-120000.jsonl          # the report again (markdown)
    python3 report.py results/e2e/run.jsonl --fmt latex_booktabs     # a .tex file for the writeup
    python3 report.py results/e2e/run.jsonl --columns size ctx dtype "step ms" "step std"
    python3 report.py results/e2e/fp32.jsonl results/e2e/bf16.jsonl  # one report, a 'run' column
    python3 report.py results/e2e/warmup.jsonl --plot                 # the figures, as PNG
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import os
import shlex
import statistics
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import kernel_tables
import results
from results import (DEFAULT_HANDOUT, FINISHED, GIB, HANDOUTS, LEADERBOARD, LEADERBOARD_2025_SHAPE,
                     LEADERBOARD_BATCH, MIB, MODES, OURS, PHASES_BY_MODE, RUN_COLUMN, RUN_KEY, ArgParser,
                     ModelConfig, PairedRatio, Record, ResultFiles, Setting, hodges_lehmann, paired_ratio,
                     add_output_args, by_run, comparison_rows, comparison_table, config_row, config_table,
                     emit, environment_lines, finished, format_bytes, is_merged, is_oom_status, number, parallel_label,
                     pick_columns, progress, render_table, run_of, share, sizes_from, stem_from, to_json_line,
                     unknown_column, with_run_column)


def keys_of(rows: list[Record], last: tuple[str, ...] = ()) -> list[str]:
    """Every key of the rows in the order they first appear, those in `last` at the end."""
    return [k for k in dict.fromkeys(k for row in rows for k in row) if k not in last] + list(last)


def shown_columns(rows: list[Record], columns: list[str], always: list[str], vary: tuple[str, ...] = ()
                  ) -> list[str]:
    """The columns to show: `always`, those in `vary` where rows differ, the rest where a row has a value."""
    return [c for c in columns if c in always or (len({str(row.get(c)) for row in rows}) > 1 if c in vary
                                                  else any(row.get(c) is not None for row in rows))]


def split_tables(rows: list[Record], picked: list[str], ids: list[str], groups: list[list[str]], fmt: str,
                 floatfmt: str) -> list[str]:
    """Tables narrow enough to paste (within 160 characters): the identifying `ids` beside each group's picked
    columns, then beside the rest; no groups (--columns): one table."""
    parts = [[c for c in picked if c in group] for group in groups]
    parts.append([c for c in picked if c not in ids and not any(c in part for part in parts)])
    return [render_table(rows, ids + part, fmt, floatfmt) for part in parts if part]


def scaled(value: float | None, unit: int = GIB) -> float | None:
    return None if value is None else value / unit


def labelled(record: Record, records: list[Record]) -> str:
    return record["label"] + (f" ({run_of(record)})" if is_merged(records) else "")


# ---- floors: each timed phase beside the least time the hardware allows (results.floor) ----

FLOOR_COLUMNS = ["phase", "measured ms", "GFLOP", "MB moved", "floor ms", "of floor", "bound", "fused floor ms",
                 "ceiling"]


def floor_rows(record: Record, cells: Record, short: dict[str, str]) -> list[Record]:
    """One row per phase of a record's floors (results.beside_measured), after the identifying `cells`."""
    floors = record.get("floors") or {}
    fused = floors.get("fused_floor_ms") or {}
    return [{**cells, "phase": short.get(phase, phase), "measured ms": record.get(f"{phase}_ms_mean"),
             "GFLOP": f["flops"] / 1e9, "MB moved": f["bytes"] / 1e6, "floor ms": f["floor_ms"],
             "of floor": (share(f["of_floor"]) + " (!)" * (f["of_floor"] > 1)) if number(f.get("of_floor")) else None,
             "bound": (f["bound"] or "no ceiling") + (f" ({f['note']})" if f.get("note") else ""),
             "fused floor ms": fused.get(phase), "ceiling": floors["roofs"]["ceiling"]}
            for phase, f in floors.get("phases", {}).items()]


def roof_line(roofs: Record) -> str:
    """'bf16: datasheet H100 SXM 989 TFLOP/s, 3350 GB/s; measured 612 TFLOP/s, 2900 GB/s at load 0.12'."""
    parts = [f"{name} {roof.get('label', '') + ' ' if roof.get('label') else ''}{roof['tflops'] or 0:.3g} TFLOP/s, "
             f"{roof['gbs'] or 0:.4g} GB/s" + f" at load {roof.get('loadavg_1m')}" * number(roof.get("loadavg_1m"))
             for name, roof in (("datasheet", roofs["datasheet"]), ("measured", roofs["measured"])) if roof]
    return f"{roofs['precision']}: " + ("; ".join(parts) or "none")


def floors_section(records: list[Record], cells: Callable[[Record], Record], short: dict[str, str], fmt: str,
                   what: str, columns: list[str] | None = None) -> str | None:
    """The floors table of the records that have floors, with what it counts and the ceilings; None if none.
    --columns picks its columns when it names one only this table has."""
    rows = [row for r in records if finished(r) for row in floor_rows(r, cells(r), short)]
    if not rows:
        return None
    shown = [c for c in keys_of(rows) if any(row.get(c) is not None for row in rows)]
    if columns and set(columns) & set(FLOOR_COLUMNS) - {"phase"}:  # in this table's order, the phase always
        shown = [c for c in shown if c in columns or c in ("phase", RUN_COLUMN)]
    roofs = dict.fromkeys(roof_line(r["floors"]["roofs"]) for r in records if r.get("floors"))
    over = any(str(row.get("of floor", "")).endswith("(!)") for row in rows)
    return (f"## Floors: how far from the hardware\n\n{render_table(rows, shown, fmt, '.5g')}\n\n"
            "floor ms: max(GFLOP / peak FLOP/s, MB moved / memory bandwidth), the larger its bound; of floor: floor "
            f"/ measured, the share of the hardware's limit reached. {what} Ceilings (datasheet when it names "
            "the GPU, else measured: best matmul, tensor copy): " + " | ".join(roofs) + "." + OVER_CEILING * over)


# a phase faster than its floor: the ceiling divided by is below what the machine does, so that floor bounds nothing
OVER_CEILING = (" (!) over 100%: this phase ran faster than its floor, so the ceiling it used is too low (a measured "
                "ceiling taken under load, or at shapes slower than the model's): that floor is no bound. A run "
                "measures its ceiling again after such a row, for the rows that follow (the best seen is kept).")


# ---- bench_e2e tables ----

E2E_COLUMNS = ["size", "d_model", "d_ff", "layers", "heads", "ctx", "mode", "dtype", "compile", "warmup", "attn",
               "model", "params", "optimizer", "parallel", "fwd ms", "fwd std", "bwd ms", "bwd std", "opt ms",
               "opt std", "step ms", "step std", "tokens/s", "TFLOP/s", "MFU", "state GiB/rank",
               "peak mem GiB", "status"] + [c for c in FLOOR_COLUMNS if c != "fused floor ms"]  # the floors table's
E2E_PHASE_SHORT = {"forward": "fwd", "backward": "bwd", "optimizer": "opt", "step": "step"}
FLOPS_SOURCES = {"formula": "the formula for our architecture (results.step_flops)",
                 "counted": "torch.utils.flop_counter.FlopCounterMode, one untimed step",
                 "none": "none (no TFLOP/s, no MFU)"}
STATUS_CELL = 120  # characters of a status in a table; the record and stderr keep the whole of it


def status_cell(status: str) -> str:
    """A status within STATUS_CELL characters: a long one loses its middle, since its start says what failed and
    its end how to fix it (where a module is looked for, which names exist)."""
    if len(status) <= STATUS_CELL:
        return status
    head = STATUS_CELL // 3  # "error: Type: what failed", then the rest from its end
    return status[:head] + "…" + status[len(status) - (STATUS_CELL - head - 1):]


def model_label(config: Record) -> str:
    """The model of a row: its --model NAME, else its MODULE:CALLABLE, else ours."""
    return config.get("model_name") or config.get("model_factory") or OURS


def optimizer_label(config: Record) -> str:
    """The optimizer of a row: NAME of --optimizer NAME=MODULE:CLASS, else the value as given."""
    name, sep, spec = config["optimizer"].partition("=")
    return name if sep and ":" in spec else config["optimizer"]


def e2e_row(record: Record) -> Record:
    c, m, status = record["config"], record["config"]["model"], record["status"]
    row: Record = {"size": c["size"], "d_model": m["d_model"], "d_ff": m["d_ff"], "layers": m["num_layers"],
                   "heads": m["num_heads"], "ctx": m["context_length"], "dtype": c["dtype"],
                   "mode": c["mode"] + " no-grad" * bool(c.get("no_grad")),
                   "compile": "on" if c["compile"] else None, "warmup": c["warmup"],
                   "status": status_cell(status),
                   "parallel": parallel_label(c), "attn": c["attn"], "model": model_label(c),
                   "optimizer": optimizer_label(c), RUN_COLUMN: run_of(record)}
    if record.get("predicted"):  # beside the measured peak, and on an OOM row: the state alone may not fit
        row["state GiB/rank"] = record["predicted"]["state_bytes"] / GIB
    if not finished(record):
        return row
    for phase, short in E2E_PHASE_SHORT.items():
        if f"{phase}_ms_mean" in record:
            row[f"{short} ms"], row[f"{short} std"] = record[f"{phase}_ms_mean"], record[f"{phase}_ms_std"]
    if c.get("model_factory") and record.get("model_num_params"):  # yours: the sizes table counts ours
        row["params"] = f"{record['model_num_params']:,}"
    row.update({"tokens/s": f"{record['tokens_per_s']:,.0f}", "TFLOP/s": record.get("achieved_tflops"),
                "MFU": f"{record['mfu']:.1%}" if record.get("mfu") is not None else None,
                "peak mem GiB": scaled(record.get("peak_mem_allocated_bytes"))})
    if record["noisy"]:
        row["status"] = "NOISY cv>10%: " + ", ".join(record["noisy"])
    if record.get("note"):
        row["status"] += f" ({record['note']})"
    return row


def params_column(configs: list[Record]) -> str:
    """The sizes table's count is our model's: named so when another model ran (its rows have their own)."""
    return "params (model.TransformerLM)" if any(c.get("model_factory") for c in configs) else "params"


def sizes_table(configs: list[Record], fmt: str) -> str:
    """The model configurations of a sweep (one row per size) under the handout its size names come from."""
    handout = HANDOUTS[configs[0].get("handout", DEFAULT_HANDOUT)]
    return config_table([(c["size"], ModelConfig(**c["model"])) for c in configs], handout, fmt,
                        params_column(configs))


def sizes_section(records: list[Record], fmt: str) -> str:
    """sizes_table of the records; for a merge, one row per run and size, with the handout of each run."""
    if not is_merged(records):
        return sizes_table([r["config"] for r in records], fmt)
    rows, params = [], params_column([r["config"] for r in records])
    for run, group in by_run(records).items():
        models = [(r["config"]["size"], ModelConfig(**r["config"]["model"] | {"context_length": 1})) for r in group]
        for size, model in dict.fromkeys(models):  # a row per model, whatever its context
            row = config_row(size, model)
            rows.append({RUN_COLUMN: run, **row, params: f"{row['params']:,}", "sizes from": sizes_from(group[0])})
    columns = [RUN_COLUMN, "size", "d_model", "d_ff", "layers", "heads", "vocab", params, "sizes from"]
    return "Model sizes of the runs merged:\n\n" + render_table(rows, columns, fmt)


def e2e_settings(records: list[Record]) -> dict[str, Setting]:
    """The settings line: what a run's rows share (FLOPs: whose TFLOP/s and MFU divide by, when not ours)."""
    flops = any(r["config"].get("flops", "formula") != "formula" or r["config"].get("model_factory")
                for r in records)

    def model(r: Record) -> str:  # "ours (model.TransformerLM)", "my:Net", "mine (my:Net)"
        factory, name = r["config"].get("model_factory"), r["config"].get("model_name")
        ours = f"{name or OURS} (model.TransformerLM)"
        return f"{name} ({factory})" if name and factory else factory or ours

    def ranks(r: Record) -> str | None:
        backend = "nccl" if str((r.get("environment") or {}).get("device")).startswith("cuda") else "gloo"
        return (f"{r['config']['world_size']} ({backend}; times: the slowest step's rank)"
                if r["config"].get("parallel") else None)

    return {"sizes from": sizes_from, "model": model,
            "batch": lambda r: str(r["config"]["batch_size"])
                               + " per rank" * bool(r["config"].get("parallel")),
            "steps": "steps",
            "mode": lambda r: r["config"]["mode"] + " no-grad" * r["config"]["no_grad"],
            "FLOPs": lambda r: FLOPS_SOURCES[r["config"].get("flops", "formula")] if flops else None,
            "ranks": ranks}


def render_e2e(records: list[Record], fmt: str, columns: list[str] | None = None) -> str:
    """Model sizes, settings, the results table, compile times, comparison, longest contexts, --profile."""
    records = [r for r in records if r.get("kind") != "longest_context"]  # rebuilt from the probes
    rows = [e2e_row(r) for r in records]
    always = E2E_COLUMNS[:6] + ["dtype", "warmup"]  # compile: only when on somewhere; mode: where runs differ
    shown = shown_columns(rows, E2E_COLUMNS, always, ("mode", "attn", "model", "optimizer"))
    main = [c for c in E2E_COLUMNS if c not in FLOOR_COLUMNS]
    lines = [sizes_section(records, fmt), "", *environment_lines(records, e2e_settings(records)), "",
             render_table(rows, pick_columns(with_run_column(shown, records), columns, fmt, main), fmt)]
    compile_times = [f"{run_of(r) + ': ' if is_merged(records) else ''}{r['label']}: {r['compile_s']:.1f} s"
                     for r in records if "compile_s" in r]
    if compile_times:
        lines += ["", "compile time (first step, not in the timings): " + "; ".join(compile_times)]
    if floors := e2e_floors(records, rows, fmt, columns):
        lines += ["", floors]
    if spec := e2e_comparison(records):
        names, merged = variants([r["config"] for r in records]), is_merged(records)
        lines += ["", f"## Comparison: {' vs '.join(names)} (speed-ups over {names[0]}"
                  f"{'; runs merged' if merged else ''})\n\n" + comparison_table(records, fmt=fmt, **spec)
                  + "\n\nMean ms per phase from the rows above; fwd+bwd sums the two phases. drift: a phase every "
                  "variant runs alike changed between them by more than twice its standard error. A failed row "
                  "shows its status, not a number."
                  + " A configuration measured in several runs is compared within each run, never across." * merged]
    sections = [search_table(records, fmt), profile_report(records, fmt)]
    return "\n".join(lines + [t for section in sections if section for t in ("", section)])


def e2e_floors(records: list[Record], rows: list[Record], fmt: str, columns: list[str] | None) -> str | None:
    """floors_section for bench_e2e: a row per configuration and phase, named by the cells that vary."""
    named = ["size", "ctx"] + [c for c in ("mode", "dtype", "compile", "warmup", "attn", "model", "optimizer",
                                           "parallel") if len({str(row.get(c)) for row in rows}) > 1]
    cells = {id(r): {c: row.get(c) for c in with_run_column(named, records)} for r, row in zip(records, rows)}
    return floors_section(records, lambda r: cells[id(r)], E2E_PHASE_SHORT, fmt,
                          "GFLOP: results.forward_flops, backward 2x; MB moved, a lower bound: every matmul weight "
                          "read (fp32), the activations backward reads written by forward and read by backward "
                          "(results.saved_activations: layer inputs of the matmuls, Q, K, V, W1x, W3x, logits; "
                          "naive attention's probabilities), backward's fp32 gradients written; opt: AdamW's 28 "
                          "bytes per parameter. Left out: activation gradients, intermediates, re-reads, autocast's "
                          "weight copies (docs/bench_e2e.md#floors).", columns)


# comparisons: one configuration in several variants (--dtype, --compile, --attn, --model, ...)
VARIANT_AXES: dict[str, Callable[[Record], str]] = {  # each axis's config fields, as a row names them
    "dtype": lambda c: c["dtype"],
    "compile": lambda c: "compiled" if c["compile"] else "eager",
    "attn": lambda c: c["attn"],
    "model": model_label,
    "optimizer": lambda c: {OURS: "our AdamW", "torch": "torch AdamW"}.get(c["optimizer"], optimizer_label(c)),
    "parallel": lambda c: parallel_label(c) or "1 process",
}


def varied_axes(configs: list[Record]) -> list[str]:
    """The variant axes that take more than one value ([] = nothing to compare)."""
    return [axis for axis, name in VARIANT_AXES.items() if len({name(c) for c in configs}) > 1]


def variant_label(config: Record, axes: list[str]) -> str:
    """"bf16", "bf16 compiled", "sdpa ddp x2": the values of the varied axes only."""
    return " ".join(VARIANT_AXES[axis](config) for axis in axes)


def variants(configs: list[Record]) -> list[str]:
    """The variants in the order they ran (the first is the baseline); [] for a single variant."""
    axes = varied_axes(configs)
    return list(dict.fromkeys(variant_label(c, axes) for c in configs)) if axes else []


def control_phase(configs: list[Record]) -> str | None:
    """The phase all variants run alike, whose drift says the machine changed (the optimizer: fp32 either way)."""
    varied = set(varied_axes(configs))
    if configs[0]["mode"] != "train" or not varied or varied & {"parallel", "model"}:
        return None
    if varied == {"optimizer"}:
        return "forward"
    return None if "optimizer" in varied or any(c["dtype"] == "fp16" for c in configs) else "optimizer"


def e2e_comparison(records: list[Record]) -> dict[str, Any] | None:
    """results.comparison_rows' arguments for a sweep's variants; None for one variant."""
    configs = [r["config"] for r in records]
    if not (axes := varied_axes(configs)):
        return None
    phases = PHASES_BY_MODE[configs[0]["mode"]] + ("step",)
    also = [k for k in ("warmup", "mode") if len({c[k] for c in configs}) > 1]
    fwd_bwd = {"fwd+bwd": ("forward", "backward")} if "backward" in phases else {}
    return {"variant": lambda r: variant_label(r["config"], axes),
            "row": lambda r: {"size": r["config"]["size"], "ctx": r["config"]["model"]["context_length"],
                              **{k: r["config"][k] for k in also}},
            "ratios": {"fwd": ("forward",), **fwd_bwd, "step": ("step",)},
            "times": {E2E_PHASE_SHORT[p]: (p,) for p in phases}, "control": control_phase(configs)}


# --context-length max: the longest context that runs (runner.Bisection probes after the first OOM)
SEARCH_START = 128  # the first probe; the study's contexts are powers of two from 128


def probe_contexts(max_context: int) -> list[int]:
    """SEARCH_START, twice that, ... up to the largest <= max_context."""
    return [SEARCH_START * 2**k for k in range(max(1, (max_context // SEARCH_START).bit_length()))]


def config_key(config: Record, context: bool = True) -> str:
    """A config as a key (without the context length when context=False: a search's probes share it)."""
    model = {k: v for k, v in config["model"].items() if context or k != "context_length"}
    return json.dumps({**config, "model": model}, sort_keys=True, default=str)


def search_answer(probes: list[Record], cap: int, resolution: int, budget: int) -> Record:
    """One search's answer from its probes ({"context_length", "status"}): longest, first OOM, in words."""
    probes = sorted(probes, key=lambda p: p["context_length"])
    fits = [p["context_length"] for p in probes if p["status"] in FINISHED]
    ooms = [p["context_length"] for p in probes if is_oom_status(p["status"])]
    others = [p for p in probes if p["status"] not in FINISHED and not is_oom_status(p["status"])]
    longest, first_oom = max(fits, default=None), min(ooms, default=None)
    power = max((n for n in fits if n & (n - 1) == 0), default=None)
    out = {"longest_context": longest, "longest_power_of_two": power, "first_oom": first_oom,
           "resolution": resolution, "conclusive": False}
    between = f"between {longest} and {first_oom}"
    if others and (first_oom is None or others[0]["context_length"] < first_oom):
        ctx, status = others[0]["context_length"], others[0]["status"]
        out["answer"] = (f"the longest within the time limit: {ctx} timed out, whether it fits is unknown"
                         if status.startswith(("timeout", "process-group timeout"))
                         else f"inconclusive: {ctx} failed with an error, not an OOM (see its row)")
        if first_oom is not None and longest is not None:  # a bisection probe failed otherwise: bounds stand
            out["answer"] += f"; the limit lies {between}"
    elif first_oom is None:
        out["answer"] = (f"at least this: the search stops at --max-context {cap}"
                         if longest is not None and longest >= probe_contexts(cap)[-1]
                         else "incomplete: the search was interrupted")
    elif longest is None:
        out.update(conclusive=True, answer=f"none: OOM already at {first_oom}")
    elif first_oom - longest <= resolution:
        out.update(conclusive=True, answer=f"the longest that fits, to within {resolution}: {first_oom} runs "
                                           f"out of memory (the longest power of two: {power})")
    elif sum(1 for p in probes if p["context_length"] & (p["context_length"] - 1)) >= budget:
        out["answer"] = (f"{between}: the bisection spent its budget of {budget} probe{'s' * (budget != 1)} "
                         "(--search-probes)")
    else:
        out["answer"] = f"{between}: the bisection was interrupted"
    return out


def context_searches(records: list[Record]) -> list[Record]:
    """The answer of every search (one per configuration but the context), as a record."""
    groups: dict[str, list[Record]] = {}
    for r in records:
        if "context_search" in r:
            groups.setdefault(config_key(r["config"], context=False), []).append(r)
    answers = []
    for probes in groups.values():
        settings = probes[0]["context_search"]
        seen = [{"context_length": r["config"]["model"]["context_length"], "status": r["status"]}
                for r in probes]
        found = search_answer(seen, settings["max_context"], settings["resolution"], settings["probe_budget"])
        best = next((r for r in probes if r["config"]["model"]["context_length"] == found["longest_context"]
                     and finished(r)), probes[0])
        answers.append({"experiment": "bench_e2e", "kind": "longest_context", "label": best["label"],
                        "config": best["config"], **found, "max_context": settings["max_context"],
                        "probes": seen,
                        "status": f"longest context {found['longest_context'] or 'none'}: {found['answer']}"})
    return answers


def search_table(records: list[Record], fmt: str) -> str | None:
    """The longest context of every search, beside its step time and peak memory there; None without one."""
    rows = []
    for run, group in by_run(records).items():
        probes = {config_key(r["config"]): r for r in group if "context_search" in r}
        for ans in context_searches(group):
            c, last = ans["config"], ans["probes"][-1]
            best = probes.get(config_key(c)) if ans["longest_context"] else None
            rows.append({RUN_COLUMN: run, "size": c["size"], "mode": c["mode"] + " no-grad" * c["no_grad"],
                         "dtype": c["dtype"], "compile": "on" if c["compile"] else "off", "attn": c["attn"],
                         "model": model_label(c), "optimizer": optimizer_label(c), "parallel": parallel_label(c),
                         "longest ctx": ans["longest_context"], "longest 2^k": ans["longest_power_of_two"],
                         "step ms": best and best["step_ms_mean"],
                         "peak mem GiB": best and scaled(best.get("peak_mem_allocated_bytes")),
                         "last probe": f"{last['context_length']}: {last['status'].split(':')[0]}",
                         "answer": ans["answer"]})
    if not rows:
        return None
    optional = ("compile", "attn", "model", "optimizer", "parallel", "peak mem GiB")
    always = [c for c in rows[0] if c not in optional]
    columns = with_run_column(shown_columns(rows, list(rows[0])[1:], always, optional[:4]), records)
    searches = [r["context_search"] for r in records if "context_search" in r]
    caps = " / ".join(str(cap) for cap in dict.fromkeys(s["max_context"] for s in searches))
    resolutions = " / ".join(str(r) for r in dict.fromkeys(s["resolution"] for s in searches))
    return (f"## Longest context that runs (powers of two from {SEARCH_START} up to --max-context {caps}, "
            f"then after an OOM a bisection to a multiple of {resolutions})\n\n"
            + render_table(rows, columns, fmt) + "\n\nlongest ctx: the longest that ran, bisected between "
            "the last power of two that ran and the first that ran out of memory; longest 2^k: the "
            "doubling's answer.")


def profile_report(records: list[Record], fmt: str) -> str | None:
    """--profile's kernel tables (rank 0's under --parallel) and each rank's time in collectives per phase."""
    parts = []
    for r in records:
        if "profile" in r:
            whose = " (rank 0)" if r["config"].get("parallel") else ""
            parts.append(f"## torch.profiler: {labelled(r, records)}{whose} (timings above were taken with "
                         "the profiler on)\n\n" + kernel_tables.render_tables(r["profile"]["tables"], fmt)
                         + f"\n\ntrace: {r['profile']['trace']} (open in https://ui.perfetto.dev)")
        # a column per kind of collective that ran (parallel.collective_rows' "all-reduce_ms", ...)
        rows = [{"rank": rank["rank"], "phase": row["phase"], "phase ms": row["phase_ms"],
                 **{f"{k.removesuffix('_ms').removesuffix(' collective')} ms": v for k, v in row.items()
                    if k.endswith("_ms") and k not in ("phase_ms", "collective_ms")},
                 "in collectives ms": row["collective_ms"],
                 "share of phase": None if row["share"] is None else f"{row['share']:.0%}"}
                for rank in r.get("ranks", []) for row in rank.get("collectives", [])]
        if rows:
            table = render_table(rows, keys_of(rows, ("in collectives ms", "share of phase")), fmt, ".3f")
            parts.append(f"## Collectives per phase: {labelled(r, records)} (every rank, ms per step)\n\n"
                         f"{table}\n\nA collective counts for the phase in which it starts; compute may "
                         "run beside it (FSDP2 prefetches the next block's all-gather). gloo runs a "
                         "reduce-scatter as an all-reduce.")
    return "\n\n".join(parts) or None


# ---- bench_attention tables ----

BASELINE = "naive"  # the speed-ups are over it (the handout's "PyTorch")
ATTENTION_PHASE_SHORT = {"forward": "fwd", "backward": "bwd", "forward_backward": "fwd+bwd"}  # timed phases
ATTENTION_IMPL_COLUMNS = [
    "impl", "d", "seq", "dtype", "fwd ms", "fwd std", "bwd ms", "bwd std", "fwd+bwd ms", "fwd+bwd std",
    "fwd TFLOP/s", "mem before bwd", "peak mem", "saved (autograd)", "naive predicted", "backend",
    "compile s", "max err", "tol", "status"]
ATTENTION_TIME_COLUMNS = ["fwd ms", "fwd std", "bwd ms", "bwd std", "fwd+bwd ms", "fwd+bwd std", "fwd TFLOP/s"]
ATTENTION_COLUMNS = ATTENTION_IMPL_COLUMNS + ["batch", "naive fwd", "naive bwd", "naive fwd+bwd", "speed-up",
                                              "check"] + FLOOR_COLUMNS[1:]  # the floors table's
ATTENTION_NOTE = (
    "fwd TFLOP/s: QK^T and PV, 4*B*S^2*d halved for the causal mask, as FlashAttention's benchmarks count; "
    "mem before bwd, peak mem: torch.cuda.memory_allocated after the forward, graph alive, and the peak with "
    "its backward (CUDA only); saved (autograd): bytes the graph keeps for backward (saved-tensor hooks, any "
    "device); naive predicted: what model.naive_attention keeps, 2*B*S^2*e (exp, probabilities) + S^2 "
    "(bool mask) + (3d+1)*B*S*e (Q, K, V, row sum) + 8*B*S (row max's indices), equal to naive's saved "
    "bytes on any device, bf16 as fp32 (Q, K, V are made in the dtype: no autocast)")


def check_summary(check: Record) -> str:
    """'WRONG: modifies q in place; dk error 5.1e-01 > tolerance 5e-02'; '' for a passed check."""
    if check["ok"]:
        return ""
    error, tolerance = check["max_error"], check["tolerance"]
    over = error is not None and math.isfinite(error) and error > tolerance  # NaN: named already
    return "WRONG: " + "; ".join(check["problems"] + over * [
        f"{check['worst']} error {error:.1e} > tolerance {tolerance:.0e}"])


def check_cell(record: Record) -> str:
    """The comparison's word on a record: ok, WRONG and what first, or why it has no times."""
    if "forward_ms_mean" not in record:
        return record["status"].split(":")[0]
    problems = record["check"]["problems"] or [record["check"]["worst"]]
    return "ok" if record["check"]["ok"] else "WRONG: " + problems[0].split(" (")[0]


WRONG_CELL = 60  # a longer WRONG (its check's every problem) goes under the tables: a table to paste stays narrow


def cut_cell(status: str) -> str:
    """A status within WRONG_CELL: a longer one by its head ("WRONG on rank 1"), the whole under the tables."""
    return status if len(status) <= WRONG_CELL else status.split(":")[0] + " (below)"


def wrong_lines(records: list[Record], label: Callable[[Record], str], fmt: str) -> list[str]:
    """The whole status of each row whose cell was cut (what failed and by how much), as one block; [] if none."""
    lines = [f"- {label(r)}: {r['status']}" for r in records if len(r["status"]) > WRONG_CELL]
    return ["\n".join(results.md_text(line) if fmt in ("github", "pipe") else line for line in lines)] * bool(lines)


def impl_row(record: Record) -> Record:
    config = record["config"]
    status = record["status"] + (f" ({record['note']})" if record.get("note") else "")
    if status.startswith("WRONG") and len(status) > WRONG_CELL:  # the whole check under the tables (wrong_lines)
        status = check_cell(record) + " (below)"
    row = {"impl": config["impl"], "dtype": config["dtype"], "d": config["d"], "seq": config["seq_len"],
           "status": status,
           "naive predicted": format_bytes(record.get("predicted_naive_saved_bytes")),
           RUN_COLUMN: run_of(record)}
    if "forward_ms_mean" not in record:
        return row
    for phase, short in ATTENTION_PHASE_SHORT.items():
        row.update({f"{short} ms": record[f"{phase}_ms_mean"], f"{short} std": record[f"{phase}_ms_std"]})
    check, error = record["check"], record["check"]["max_error"]
    finite = error is not None and math.isfinite(error)  # the error as text: .3f would show 0.000
    return {**row, "fwd TFLOP/s": record["forward_tflops"], "backend": record.get("sdpa_backend"),
            "mem before bwd": format_bytes(record.get("mem_before_backward_bytes")),
            "peak mem": format_bytes(record.get("peak_mem_allocated_bytes")),
            "saved (autograd)": format_bytes(record["saved_tensor_bytes"]),
            "compile s": record.get("compile_s"), "tol": check["tolerance"],
            "max err": f"{f'{error:.1e}' if finite else 'not finite'} ({check['worst']})"}


def attention_comparison(records: list[Record], fmt: str, columns: list[str] | None = None) -> str | None:
    """Each implementation's times beside the baseline's, the speed-ups and the check; None for one impl."""
    several = {k: name for k, name in (("dtype", "dtype"), ("batch_size", "batch"))
               if len({r["config"][k] for r in records}) > 1}

    def check(record: Record, base: Record | None) -> dict[str, str]:
        wrong = f"{base['config']['impl']} {check_cell(base)}; " if base and check_cell(base) != "ok" else ""
        return {"check": wrong + check_cell(record)}

    return comparison_table(
        sorted(records, key=lambda r: r["config"]["impl"] != BASELINE), lambda r: r["config"]["impl"],
        lambda r: {"d": r["config"]["d"], "seq": r["config"]["seq_len"],
                   **{name: r["config"][k] for k, name in several.items()}},
        {short: (phase,) for phase, short in ATTENTION_PHASE_SHORT.items()}, fmt, columns, ".3f",
        calls="calls", more_rounds="--iters", per_variant="impl", cells=check)


def timing_label(record: Record) -> str | None:
    """How a record was timed; None when nothing was."""
    if (timing := record.get("timing")) is None:
        return None
    if timing["method"] == "triton.testing.do_bench":
        return (f"triton.testing.do_bench (warmup {timing['warmup_ms']:g} ms, rep {timing['rep_ms']:g} ms, "
                f"L2 flushed before every call, triton {timing['triton']})")
    why = f"; {timing['why']}" if timing.get("why") else ""
    return (f"{timing['method']} ({timing['warmup_calls']} warm-up and {timing['timed_calls']} timed calls "
            f"per phase{why})")


def render_attention(records: list[Record], fmt: str, columns: list[str] | None = None) -> str:
    """The environment, a table per implementation, the comparison and what the columns mean."""
    lines = environment_lines(records, {"batch": "batch_size", "dtype": "dtype", "causal": lambda r: "yes",
                                        "timing": timing_label})
    impls = list(dict.fromkeys(r["config"]["impl"] for r in records))
    for impl in impls:
        rows = [impl_row(r) for r in records if r["config"]["impl"] == impl]
        always = ["d", "seq", "status", "naive predicted"]
        default = shown_columns(rows, ATTENTION_IMPL_COLUMNS[1:], always, ("dtype",))
        picked = pick_columns(with_run_column(default, records), columns, fmt, ATTENTION_IMPL_COLUMNS)
        ids = [c for c in picked if c in (RUN_COLUMN, "impl", "d", "seq", "dtype")]
        lines += ["", f"### {impl}", *(line for table in split_tables(  # times, then memory and check
            rows, picked, ids, [] if columns else [ATTENTION_TIME_COLUMNS], fmt, ".3f") for line in ("", table))]
        if wrong := wrong_lines([r for r in records if r["config"]["impl"] == impl and r["status"].startswith(
                "WRONG")], lambda r: f"d={r['config']['d']} seq={r['config']['seq_len']} {r['config']['dtype']}", fmt):
            lines += ["", *wrong]
    if table := attention_comparison(records, fmt, columns):
        base = BASELINE if BASELINE in impls else impls[0]
        lines += ["", "### comparison", "", table, "", f"{base} fwd, bwd, fwd+bwd: ms; speed-up: {base}'s "
                  "time / the implementation's, forward/backward/forward+backward"]
    tolerances = ", ".join(dict.fromkeys(f"{r['config']['dtype']} {r['check']['tolerance']:.0e}"
                                         for r in records if r.get("check")))
    checked = (f"; max err: max |x - ref| / (1 + |ref|) over the output and the gradients of Q, K, V (the "
               "worst named; the output's when over tol) against causal attention in float64 on copies of the "
               f"inputs; WRONG above tol ({tolerances}), or for a kernel writing into its inputs or returning "
               "NaN/inf; a WRONG kernel is still timed") if tolerances else ""
    lines += ["", ATTENTION_NOTE + checked + "."]
    several = [k for k in ("dtype", "batch_size") if len({r["config"][k] for r in records}) > 1]
    if floors := floors_section(records, lambda r: {
            **({RUN_COLUMN: run_of(r)} if is_merged(records) else {}), "impl": r["config"]["impl"],
            "d": r["config"]["d"], "seq": r["config"]["seq_len"], **{k: r["config"][k] for k in several}},
            ATTENTION_PHASE_SHORT, fmt, "GFLOP: causal QK^T and PV, backward 2x. MB moved, a lower bound: Q, K, V "
            "read and O written (fused, FlashAttention's O(seq x d)), backward reading Q, K, V, O, dO and writing "
            "dQ, dK, dV; naive and compiled add the seq x seq scores and probabilities written and read (forward: 4 "
            "passes, backward: 5), their fused floor ms beside (results.attention_phase_bytes).", columns):
        lines += ["", floors]
    if timed := [r for r in records if r["config"].get("leaderboard")]:  # leaderboard-2025: beside the published
        yours = [(f"{r['config']['impl']} ({r['leaderboard']['method']})"
                  + " WRONG" * r["status"].startswith("WRONG"), r["leaderboard"]["ms"]) if "leaderboard" in r
                 else (f"{r['config']['impl']}: {r['status']}", None) for r in timed]
        c = timed[0]["config"]
        lines += ["", where_it_stands(yours, "2025", timed[0]["environment"]["device_name"],
                                      (c["batch_size"], c["seq_len"], c["d"]) != LEADERBOARD_2025_SHAPE, fmt)]
    return "\n".join(lines)


# ---- mem_profile tables ----

MEMORY_PEAK_COLUMNS = ["size", "ctx", "mode", "dtype", "attn", "ckpt", "model", "optimizer", "peak alloc MiB",
                       "peak alloc GiB", "peak reserved MiB", "peak reserved GiB", "step ms", "status"]
MEMORY_CHECKPOINT_COLUMNS = ["size", "ctx", "mode", "dtype", "attn", "K", "kept MiB", "recomputed MiB",
                             "transient MiB", "state GiB", "predicted GiB", "at", "measured GiB",
                             "measured / predicted"]


MEMORY_CELLS: dict[str, Callable[[Record], Any]] = {  # a memory row's identifying cells, from its config
    "size": lambda c: c["size"], "ctx": lambda c: c["model"]["context_length"], "mode": lambda c: c["mode"],
    "dtype": lambda c: c["dtype"], "attn": lambda c: c["attn"], "ckpt": lambda c: c["checkpoint_every"],
    "heads": lambda c: c["model"]["num_heads"], "model": model_label, "optimizer": optimizer_label}


def memory_rows(records: list[Record], keys: list[str], among: list[Record] | None = None, unique: bool = True
                ) -> list[tuple[Record, Record]]:
    """(record, its identifying cells: run in a merge, `keys`, model only when yours ran `among` them)."""
    among = records if among is None else among
    yours = any(r["config"].get("model_factory") for r in among)
    seen: dict[tuple, tuple[Record, Record]] = {}
    for rec in records:
        ident = {**({RUN_COLUMN: run_of(rec)} if is_merged(among) else {}),
                 **{k: MEMORY_CELLS[k](rec["config"]) for k in keys if k != "model" or yours}}
        seen.setdefault(tuple(ident.values()) if unique else len(seen), (rec, ident))
    return list(seen.values())


def accounting_table(records: list[Record], fmt: str) -> str:
    rows = []
    for rec, ident in memory_rows(records, ["size", "ctx", "mode", "dtype", "model"]):
        if "weights_bytes" not in rec:  # your model failed before its parameters were counted
            rows.append({**ident, "status": f"not counted: {rec['saved_status']}"})
            continue
        static = rec["weights_bytes"] + rec["grads_bytes"] + rec["adamw_state_bytes"]
        rows.append({**ident, "weights MiB": rec["weights_bytes"] / MIB,
                     "grads MiB": rec["grads_bytes"] / MIB,
                     "AdamW state MiB": rec["adamw_state_bytes"] / MIB, "static GiB": static / GIB,
                     "residual stream MiB": rec["residual_stream_bytes"] / MIB,
                     "= B x S x d_model x 4 B":
                         f"{rec['residual_stream_formula']} = {rec['residual_stream_bytes']:,} B",
                     "scores/layer MiB": rec["attention_scores_layer_bytes"] / MIB,
                     "= B x H x S x S x bytes": rec["attention_scores_formula"]})
    return render_table(rows, keys_of(rows), fmt)


def saved_tables(records: list[Record], fmt: str) -> str:
    summary, largest = [], []
    for rec, ident in memory_rows(records, ["size", "ctx", "dtype", "attn", "ckpt", "model"]):
        if rec["saved_status"] != "ok":
            summary.append({**ident, "status": rec["saved_status"]})
            continue
        summary.append({**ident, "per block MiB": rec["saved_block_bytes_mean"] / MIB,
                        "grads per block MiB": scaled(rec.get("block_grad_bytes"), MIB),
                        "x blocks": rec["num_blocks"], "blocks MiB": rec["saved_blocks_bytes"] / MIB,
                        "outside blocks MiB": rec["saved_outside_bytes"] / MIB,
                        "total MiB": rec["saved_total_bytes"] / MIB,
                        "status": "ok" if rec["num_blocks"]
                        else "ok (no nn.ModuleList of repeated blocks: all counted outside)"})
        for scope, rows in (("per block", rec["saved_block_top"]),
                            ("outside blocks", rec["saved_outside_top"])):
            largest += [{**ident, "scope": scope, "module": r["module"], "op": r["op"], "shape": r["shape"],
                         "tensor dtype": r["dtype"], "tensors": f"{r['tensors']:g}", "MiB": r["bytes"] / MIB,
                         "share": f"{r['share']:.1%}"} for r in rows]
    text = render_table(summary, keys_of(summary, ("status",)), fmt)
    if largest:
        text += ("\n\nLargest saved tensors, grouped by module, op, shape and dtype (tensors: how many the "
                 "row adds up, per block): the top 5 per block (share of the blocks' total) and the top 3 "
                 "outside (share of the total):\n\n" + render_table(largest, list(largest[0]), fmt))
    return text


def compiled_block_table(records: list[Record], fmt: str) -> str | None:
    """--compile: one block's saved tensors as the handout's §3.2 counts them, eager beside compiled."""
    rows = []
    for rec, ident in memory_rows([r for r in records if "compiled_status" in r],
                                  ["size", "ctx", "dtype", "heads", "model"]):
        row = {**ident, "batch": rec["config"]["batch_size"], "status": rec["compiled_status"]}
        if rec["compiled_status"] == "ok":
            row.update({"eager MiB": rec["block_eager_saved_bytes"] / MIB,
                        "eager tensors": rec["block_eager_saved_tensors"],
                        "compiled MiB": rec["block_compiled_saved_bytes"] / MIB,
                        "compiled tensors": rec["block_compiled_saved_tensors"],
                        "compile + forward s": rec["block_compile_s"]})
        rows.append(row)
    return render_table(rows, keys_of(rows, ("status",)), fmt) if rows else None


def checkpoint_table(records: list[Record], fmt: str) -> str | None:
    """One row per K, its predicted peak beside the measured one; then per setting the best K and the nested."""
    predicted = [r for r in records if r.get("checkpoint_prediction")]
    if not any(r["config"]["checkpoint_every"] for r in predicted):
        return None
    rows, notes = [], {}
    for rec, ident in memory_rows(predicted, ["size", "ctx", "mode", "dtype", "attn"], records, unique=False):
        c, p, k = rec["config"], rec["checkpoint_prediction"], rec["config"]["checkpoint_every"]
        row = {**ident, "K": k, "kept MiB": p["kept_bytes"] / MIB,
               "recomputed MiB": min(k, c["model"]["num_layers"]) * p["block_bytes"] / MIB if k else None,
               "transient MiB": p["transient_bytes"] / MIB, "state GiB": p["state_bytes"] / GIB,
               "predicted GiB": p["predicted_peak_bytes"] / GIB, "at": p["peak_moment"]}
        if rec["status"] == "ok":
            row["measured GiB"] = rec["peak_mem_allocated_bytes"] / GIB
            row["measured / predicted"] = f"{rec['peak_mem_allocated_bytes'] / p['predicted_peak_bytes']:.2f}"
        rows.append(row)
        notes[tuple(ident.values())] = (
            f"{' '.join(map(str, ident.values()))}: N = {c['model']['num_layers']}, "
            f"a = {p['block_bytes'] / MIB:.2f} MiB per block (its backward rises "
            f"{p['block_transient_bytes'] / MIB:.2f} MiB above it), b = {p['boundary_bytes'] / MIB:.2f} MiB per "
            f"boundary; single level: K* = sqrt(N b / a) = {p['sqrt_k'] or 0:.2f}, smallest predicted peak "
            f"at K = {p['best_k']} ({p['best_predicted_peak_bytes'] / GIB:.3f} GiB); nested (recursive "
            f"halving, ceil(log2 N) + 1 = {p['nested_kept_bytes'] // p['boundary_bytes']} boundaries kept, "
            f"one block recomputed): {p['nested_predicted_peak_bytes'] / GIB:.3f} GiB")
    columns = with_run_column(shown_columns(rows, MEMORY_CHECKPOINT_COLUMNS, []), records)
    return (render_table(rows, columns, fmt, floatfmt=".3f") + "\n\nPredicted peak: "
            "the largest of the moments (at) a step's peak can fall in; kept: what the forward leaves for "
            "backward (with K > 0, ceil(N/K) segment inputs); recomputed: one segment's K blocks. "
            "Activations: N a without checkpointing, ceil(N/K) b + K a single level, (ceil(log2 N) + 1) b "
            "+ a nested (predicted, not run).\n\n"
            + "\n".join(f"- {note}" for note in notes.values()))


def peak_table(records: list[Record], fmt: str, columns: list[str] | None = None) -> str:
    """The measured peaks; the model and optimizer columns only when yours or several ran."""
    rows = []
    for rec, ident in memory_rows(records, MEMORY_PEAK_COLUMNS[:8], unique=False):
        ok = rec["status"] == "ok"
        rows.append({**ident, "status": rec["status"], "step ms": rec["step_ms_mean"] if ok else None,
                     **{f"peak {short} {unit}": rec[f"peak_mem_{what}_bytes"] / size if ok else None
                        for short, what in (("alloc", "allocated"), ("reserved", "reserved"))
                        for unit, size in (("MiB", MIB), ("GiB", GIB))}})
    hidden = {k for k in ("model", "optimizer") if {row.get(k, OURS) for row in rows} == {OURS}}
    default = with_run_column([c for c in MEMORY_PEAK_COLUMNS if c not in hidden], records)
    return render_table(rows, pick_columns(default, columns, fmt), fmt)


def peak_by_context_table(records: list[Record], fmt: str) -> str | None:
    """The memory_profiling answer: a row per size and context, a column per dtype and mode."""
    if all(rec["status"].startswith("skipped") for rec in records):
        return None
    varying = [k for k in ("attn", "ckpt", "model", "optimizer")
               if len({MEMORY_CELLS[k](r["config"]) for r in records}) > 1]
    dtypes = list(dict.fromkeys(r["config"]["dtype"] for r in records))
    modes = [m for m in MODES if any(r["config"]["mode"] == m for r in records)]
    rows: dict[tuple, Record] = {}
    for rec, ident in memory_rows(records, ["size", "ctx"] + varying, unique=False):
        c, cell = rec["config"], rec["peak_mem_allocated_bytes"] / GIB if rec["status"] == "ok" else rec["status"]
        rows.setdefault(tuple(ident.values()), ident)[f"{c['dtype']} {c['mode']} GiB"] = cell
    return render_table(list(rows.values()), with_run_column(["size", "ctx"] + varying, records)
                        + [f"{d} {m} GiB" for d in dtypes for m in modes], fmt, floatfmt=".3f")


def snapshot_report(title: str, fields: Record, fmt: str) -> str:
    """The peak check, the largest allocations and what was live at the peak, for one snapshot."""
    check = fields["snapshot_peak_check"]
    mib = lambda key: scaled(check.get(key), MIB)  # noqa: E731
    check_row = {"check": "peak rebuilt from the trace vs requested_bytes.all.peak",
                 "rebuilt MiB": mib("rebuilt_peak_bytes"), "requested peak MiB": mib("requested_peak_bytes"),
                 "diff MiB": mib("diff_bytes"), "status": check["status"],
                 "max_memory_allocated MiB (rounded blocks)": mib("max_memory_allocated_bytes")}
    largest = [{"size MiB": r["size_bytes"] / MIB, "count": r["count"], "total MiB": r["total_bytes"] / MIB,
                "first frame in the code studied": r["sites"], "phase": r["phases"]}
               for r in fields["snapshot_largest"]]
    live = [{"live at the peak, by site": r["site"], "count": r["count"], "MiB": r["bytes"] / MIB,
             "share of peak": f"{r['share']:.1%}"} for r in fields["snapshot_live_at_peak"]]
    parts = [f"#### Snapshot: {title}", "", render_table([check_row], list(check_row), fmt), "",
             "Largest allocations in the recorded step:", "",
             render_table(largest, list(largest[0]) if largest else ["size MiB"], fmt), "",
             render_table(live, list(live[0]), fmt)]
    parts += [f"\ntimeline: {fields[k]}" for k in ("snapshot_png", "snapshot_html") if k in fields]
    parts += [f"\n{fields['snapshot_png_note']}"] if "snapshot_png_note" in fields else []
    return "\n".join(parts)


def render_snapshots(records: list[Record], fmt: str, columns: list[str] | None = None) -> str:
    """mem_profile.py --analyze: each snapshot's tables."""
    return "\n\n".join(snapshot_report(r["snapshot_path"], r, fmt) for r in records)


def autocast_note(records: list[Record]) -> list[str]:
    """Under the tables whose rows ran autocast off CUDA: CPU and CUDA autocast follow different op lists."""
    devices = sorted({d for r in records if r["config"]["dtype"] != "fp32"
                      and not (d := r["environment"].get("device", "")).startswith("cuda")})
    return [f"note: the bf16/fp16 rows ran under {'/'.join(devices)} autocast, so their dtypes and bytes are its; "
            "CUDA autocast runs more ops in float32 (exp, softmax, pow, rsqrt, sum, ...: torch.amp's \"Autocast Op "
            "Reference\"): run on a GPU for the GPU's figures.", ""] if devices else []


def render_memory(records: list[Record], fmt: str, columns: list[str] | None = None) -> str:
    """Every table of a mem_profile run, from its records alone."""
    settings: dict[str, Setting] = {"sizes from": sizes_from, "model": lambda r: model_label(r["config"]),
                                    "batch": "batch_size", "warmup": "warmup", "steps": "steps"}
    parts = [*environment_lines(records, settings), "", sizes_section(records, fmt), "",
             "### Accounting from the config (MiB and GiB are 2^20 and 2^30 bytes; your --model's own "
             "parameters; AdamW's two moments per parameter whatever the optimizer)", "",
             accounting_table(records, fmt), "",
             "### Saved for backward (one forward pass and the loss; each storage once; blocks: the repeated "
             "modules of the model's nn.ModuleList; grads per block: one block's parameter gradients)", "",
             saved_tables(records, fmt), "", *autocast_note(records)]
    if compiled := compiled_block_table(records, fmt):
        parts += ["### One block compiled, as the handout's §3.2 counts it (torch.compile(block, "
                  "fullgraph=True); every saved tensor's numel x element size, parameters left out)", "",
                  compiled, ""]
    if checkpointing := checkpoint_table(records, fmt):
        parts += ["### Activation checkpointing: the predicted peak for each K (any device)", "",
                  checkpointing, "", *autocast_note(records)]
    devices = sorted({r["environment"].get("device", "") for r in records})
    if not any(d.startswith("cuda") for d in devices):
        parts.append(f"note: measured peaks and snapshots need a CUDA device, and this run is on "
                     f"{', '.join(devices)}: the tables above are the ones that need no GPU.")
        return "\n".join(parts)
    parts += ["### Peak memory (after warm-up, peak counter reset; allocated = tensors, reserved = "
              "allocator)", "", peak_table(records, fmt, columns)]
    if by_context := peak_by_context_table(records, fmt):
        parts += ["", "### Peak allocated memory per context length (GiB): forward-only beside a training "
                  "step", "", by_context]
    for rec in records:
        if "snapshot_peak_check" in rec:
            parts += ["", snapshot_report(labelled(rec, records), rec, fmt)]
        elif "snapshot_status" in rec:
            parts += ["", f"snapshot of {labelled(rec, records)}: {rec['snapshot_status']}"]
    return "\n".join(parts)


# ---- precision_demo and toy_autocast tables ----

PRECISION_COLUMNS = ["case", "accumulator", "addend", "addend as stored (exact)", "count x stored (float64)",
                     "result", "abs error", "rel error", "accumulator spacing at result"]
# CPU and CUDA autocast follow different op lists (torch.amp docs, "Autocast Op Reference"): a CPU
# table must not be quoted as the CUDA answer.
TOY_CPU_NOTE = ("NOTE: these are CPU autocast results. CUDA autocast runs layer_norm (and "
                "softmax, log_softmax, cross_entropy) in float32, so on a GPU the LayerNorm output "
                "is float32. Do not quote it as the CUDA answer: run --device cuda on a GPU.")


def precision_row(r: Record) -> Record:
    """Floats in full (floatfmt=""), errors to 3 digits; the stored addend also as n/2^k (its bits)."""
    numerator, denominator = float(r["addend_stored_exact"]).as_integer_ratio()
    overflow = r["result"] is None  # an infinite sum: strict JSON holds it as None
    return {RUN_COLUMN: run_of(r), "case": r["case"], "accumulator": r["accumulator_dtype"],
            "addend": r["addend_dtype"] + (" -> float32" * r["addend_converted_to_float32"]),
            "addend as stored (exact)":
                f"{r['addend_stored_exact']} = {numerator}/2^{denominator.bit_length() - 1}",
            "count x stored (float64)": r["count_times_stored"],
            "result": ("-inf" if r["value"] < 0 else "inf") if overflow else r["result"],
            **{f"{k} error": "inf" if overflow else float(f"{r[f'{k}_error']:.3g}") for k in ("abs", "rel")},
            "accumulator spacing at result": r["result_spacing"]}


def precision_notes(records: list[Record]) -> list[str]:
    """Why case 3 equals case 4 (type promotion), then how each low-precision accumulator loses the sum."""
    by_case = {r["case"]: r for r in records}
    notes = []
    if {"1", "3", "4"} <= by_case.keys():
        r1, r3, r4 = by_case["1"], by_case["3"], by_case["4"]
        same, exact = r3["result"] == r4["result"], r3["result"] == r3["count_times_stored"]
        notes.append(
            f"Cases 3 and 4 are {'equal' if same else 'NOT equal'} ({r3['result']!r} and {r4['result']!r}): "
            f"torch promotes a float16 addend to {r3['promoted_dtype']} before adding it to a float32 "
            "(torch.result_type), so case 4's .type(torch.float32) changes nothing. Their error is the "
            f"addend's: {r3['value']} in float16 is {r3['addend_stored_exact']}, and {r3['count']} x that is "
            f"{r3['count_times_stored']!r}, {'exactly' if exact else 'close to'} what both print. Case 1 "
            f"stores {r1['value']} as {r1['addend_stored_exact']}; the rest of its error is float32 rounding "
            "in the sum.")
    for r in [r for r in records if r["accumulator_dtype"] != "float32"]:
        if r["result"] is None:
            notes.append(f"The {r['accumulator_dtype']} accumulator (case {r['case']}) overflows: rounded up at "
                         f"each add, its sum passes the largest finite {r['accumulator_dtype']} and becomes inf.")
            continue
        half_step = r["result_spacing"] / 2
        stalled = half_step >= abs(float(r["addend_stored_exact"]))
        notes.append(
            f"The {r['accumulator_dtype']} accumulator (case {r['case']}) ends at {r['result']!r}: near "
            f"there it moves in steps of {r['result_spacing']!r}, so each add is rounded to a multiple of "
            "that step"
            + f"; half a step ({half_step!r}) is at least the addend: every add rounds away" * stalled + ".")
    return notes


def render_precision(records: list[Record], fmt: str, columns: list[str] | None = None) -> str:
    """The environment, the sum, the table (`columns`: pick_columns), the notes; runs named."""
    merged = is_merged(records)
    titles, notes = [], []
    for run, rs in by_run(records).items():
        named, value, count = f"{run}: " * merged, rs[0]["value"], rs[0]["count"]
        titles.append(f"{named}Sum of {value} added {count} times (exact answer {value * count!r})")
        notes += [named + note for note in precision_notes(rs)]
    columns = pick_columns([RUN_COLUMN] * merged + PRECISION_COLUMNS, columns, fmt)
    table = render_table([precision_row(r) for r in records], columns, fmt, floatfmt="")
    return "\n".join([*environment_lines(records, {}), "", *titles, "", table, "", "\n\n".join(notes)])


def toy_columns(records: list[Record]) -> list[str]:
    return ["tensor"] + list(dict.fromkeys(f"{r['autocast_dtype']} autocast" for r in records))


def render_toy(records: list[Record], fmt: str, columns: list[str] | None = None) -> str:
    """The title, the CPU note off CUDA, a row per tensor, a column per autocast dtype (or its status)."""
    merged = is_merged(records)
    lines, rows = [*environment_lines(records, {}), ""], []
    for run, rs in by_run(records).items():
        named, r0, c = f"{run}: " * merged, rs[0], rs[0]["config"]
        lines += [f"{named}ToyModel dtypes under torch.autocast on {r0['device']} "
                  f"({r0['environment']['device_name']}), batch {c['batch_size']}, "
                  f"{c['in_features']} -> 10 -> {c['out_features']}", ""]
        if not r0["device"].startswith("cuda"):
            lines += [named + TOY_CPU_NOTE, ""]
        ok = [r for r in rs if r["status"] == "ok"]
        labels = list(dict.fromkeys(label for r in ok for label in r["dtypes"])) or ["(run)"]
        rows += [{RUN_COLUMN: run, "tensor": label,
                  **{f"{r['autocast_dtype']} autocast": r["dtypes"].get(label) if r["status"] == "ok"
                     else r["status"] for r in rs}} for label in labels]
    columns = pick_columns([RUN_COLUMN] * merged + toy_columns(records), columns, fmt)
    return "\n".join(lines + [render_table(rows, columns, fmt)])


# ---- the leaderboards ----

# The published figures (name, ms, GPU, when), from the README of stanford-cs336/assignment2-systems-leaderboard at
# df82f2f (2026-05-13): its Spring 2026 class table (the training step) and Spring 2025 table (FlashAttention-2)
PUBLISHED = {"2026": [("2026 naive baseline", 10_000.0, "two B200s", "Spring 2026"),
                      ("2026 best", 3_837.0, "two B200s", "Spring 2026")],
             "2025": [("2025 naive baseline", 80.0, "one H100", "Spring 2025"),
                      ("2025 best", 5.364, "one H100", "Spring 2025")]}
LEADERBOARD_COLUMNS = [RUN_COLUMN, "step ms", "method", "floor ms", "of floor", "bound", "fwd ms", "bwd ms", "opt ms",
                       "split step ms", "peak mem GiB", "MFU %", "wall s", "status"]


def where_it_stands(yours: list[tuple[str, float | None]], year: str, device_name: str, scaled: bool,
                    fmt: str) -> str:
    """The published leaderboard figures beside yours, and what compares."""
    rows = [{"": name, "ms": ms, "GPU": device_name, "when": "this run"} for name, ms in yours]
    rows += [{"": name, "ms": ms, "GPU": gpu, "when": when} for name, ms, gpu, when in PUBLISHED[year]]
    note = ("scaled-down shape: not comparable with the published figures" if scaled else
            "only a run on the same GPU compares with a published figure")
    return f"## Where it stands\n\n{render_table(rows, ['', 'ms', 'GPU', 'when'], fmt, floatfmt=',.3f')}\n\n{note}"


def leaderboard_header(config: Record) -> str:
    """What ran: your model and optimizer, the shape (the leaderboard's, changed, or scaled down), the layout."""
    m, batch = config["model"], config["batch_size"] * config["world_size"]
    exact = ModelConfig(**m) == LEADERBOARD and batch == LEADERBOARD_BATCH
    shape = ("the leaderboard's shape" + ("" if exact else ", changed") if config["size"] == "leaderboard-full"
             else "a scaled-down shape (the leaderboard's: d_model 4096, d_ff 11008, 34 layers, 32 heads, vocab "
                  "151936, context 32768, batch 2)")
    spread = f"{config['parallel']} over {config['world_size']} ranks" if config["parallel"] else "one process"
    return (f"# 2026 leaderboard: {model_label(config)}, optimizer {config['optimizer']}\n\n"
            f"{shape}: d_model {m['d_model']}, d_ff {m['d_ff']}, {m['num_layers']} layers, {m['num_heads']} heads, "
            f"vocab {m['vocab_size']}, context {m['context_length']}, batch {batch} ({spread}), bf16 autocast, causal")


def render_leaderboard(records: list[Record], fmt: str, columns: list[str] | None = None) -> str:
    """Each leaderboard.py run: what ran, do_bench's figure, the split of the step, where it stands."""
    sections = []
    for r in records:
        env, check = r["environment"], r.get("check")
        said = "" if check is None else (f"; reference {check['reference']}, check "
                                         + ("passed" if check["ok"] else "failed"))
        if recheck := r.get("recheck"):
            said += ("; " + recheck["skipped"] if "skipped" in recheck else
                     f"; rechecked after the timing: {'passed' if recheck['ok'] else 'failed'}")
        if changed := r.get("global_settings_changed"):
            said += "; your code changed (put back before the timing): " + ", ".join(
                f"{k} {v}" for k, v in changed.items())
        lines = [leaderboard_header(r["config"]), f"device: {env['device_name']}; torch {env['torch']}{said}"]
        if not finished(r):
            sections.append("\n\n".join(lines + [r["status"]]))
            continue
        lb, step_floor = r["leaderboard"], ((r.get("floors") or {}).get("phases") or {}).get("step") or {}
        row = {RUN_COLUMN: run_of(r), "step ms": lb["ms"], "method": lb["method"], "floor ms": step_floor.get("floor_ms"),
               "of floor": (share(lb["of_floor"]) + " (!)" * (lb["of_floor"] > 1)) if lb.get("of_floor") else None,
               "bound": step_floor.get("bound"), "fwd ms": r.get("forward_ms_mean"),
               "bwd ms": r.get("backward_ms_mean"), "opt ms": r.get("optimizer_ms_mean"),
               "split step ms": r["step_ms_mean"],
               "peak mem GiB": (r.get("peak_mem_allocated_bytes") or 0) / GIB or None,
               "MFU %": 100 * lb["mfu"] if lb.get("mfu") else None,
               "wall s": r["wall_s"], "status": r["status"] + ("; over 10 min" if r["over_10_min"] else "")}
        shown = pick_columns(with_run_column(LEADERBOARD_COLUMNS[1:], records), columns, fmt, LEADERBOARD_COLUMNS)
        lines.append(render_table([row], shown, fmt, floatfmt=",.1f"))
        calls = (f"; mean of {lb['calls']} timed calls after {lb['calls_in_all'] - lb['calls']} untimed"
                 if "calls" in lb else f"; {lb['calls_in_all']} calls in all" if "calls_in_all" in lb else "")
        lines.append(f"step ms: {lb['method']} (warmup {lb['warmup_ms']:g} ms, rep {lb['rep_ms']:g} ms{calls}), the "
                     f"headline, {r.get('precision', 'bf16 autocast')} over parameters in "
                     f"{', '.join(r.get('trained_dtypes') or ['float32'])}; fwd/bwd/opt: {r['config']['steps']} "
                     "steps, each phase between synchronisations; wall s: from the start to do_bench's figure, caches "
                     "empty (flagged over 10 min); MFU on do_bench's figure")
        if len(r.get("peak_mem_by_device") or {}) > 1:
            lines.append("peak per device: " + ", ".join(f"{d} {b / GIB:.1f} GiB"
                                                         for d, b in r["peak_mem_by_device"].items()))
        lines.append(where_it_stands([(f"yours ({lb['method']})", lb["ms"])], "2026", env["device_name"],
                                     r["config"]["size"] != "leaderboard-full", fmt))
        if floors := floors_section([r], lambda record: {}, E2E_PHASE_SHORT, fmt, "Of floor in the table above: the "
                                    "step's floor over do_bench's figure; below, each phase over the split's.", None):
            lines.append(floors)
        sections.append("\n\n".join(lines))
    return "\n\n".join(sections)


# ---- bench_comm tables ----

COMM_COLUMNS = ["op", "size", "ranks", "backend", "median ms", "min-max ms", "algbw GB/s", "busbw GB/s",
                "of link peak", "status"]
COMM_FIT_COLUMNS = ["backend", "op", "ranks", "sizes", "alpha us", "beta GB/s", "R^2", "max resid %", "fit"]


POOR_FIT_R2 = 0.9  # under it, a line leaves more than a tenth of the times' spread unexplained: beta is no bandwidth


def latency_bandwidth_fit(sizes_bytes: list[float], seconds: list[float]) -> Record:
    """time = alpha + bytes / beta by least squares on relative residuals (numpy.polyfit weighted 1 / time: the
    sizes span decades, and plain least squares would fit the largest alone); R^2 of the times, the largest
    |residual| / time, why it is poor (a negative alpha, or R^2 under POOR_FIT_R2: beta is then no bandwidth to
    use) and whether the largest size is bandwidth-bound (a fit not poor; its bytes / beta at least alpha). Refused,
    {"refused": "no fit: why"}, under three sizes (a line meets two points exactly, whatever they are) or where
    time does not grow with size (the largest size no slower than the smallest, or a falling line)."""
    if (distinct := len(set(sizes_bytes))) < 3:
        return {"refused": f"no fit: too few sizes ({distinct}; three or more)"}
    import numpy as np
    x, t = np.asarray(sorted(zip(sizes_bytes, seconds)), dtype=float).T
    slope, alpha = np.polyfit(x, t, 1, w=1 / t)
    if slope <= 0 or t[-1] <= t[0]:
        return {"refused": "no fit: time does not grow with size"}
    fitted = alpha + slope * x
    r2 = 1 - float(((t - fitted) ** 2).sum()) / float(((t - t.mean()) ** 2).sum())
    poor = "a negative alpha" if alpha < 0 else f"R^2 {r2:.2f}" if r2 < POOR_FIT_R2 else ""
    return {"alpha_s": float(alpha), "beta_bytes_per_s": float(1 / slope), "r2": r2,
            "max_residual": float((abs(t - fitted) / t).max()), "poor": poor,
            "bandwidth_bound": not poor and bool(x[-1] * slope >= alpha)}


def comm_row(record: Record) -> Record:
    c = record["config"]
    row = {"op": c["op"], "size": f"{c['size_mb']:g} MB", "ranks": c["world_size"], "backend": c["backend"],
           "status": record["status"][:STATUS_CELL], RUN_COLUMN: run_of(record)}
    if not finished(record):
        return row
    peak = f"{record['of_link_peak']:.0%}" if record.get("of_link_peak") is not None else "—"
    return {**row, "median ms": record["ms_median"], "min-max ms": f"{record['ms_min']:.3f}-{record['ms_max']:.3f}",
            "algbw GB/s": record["algbw_gbps"], "busbw GB/s": record["busbw_gbps"], "of link peak": peak}


def comm_fits(records: list[Record]) -> list[Record]:
    """A latency + bandwidth fit per (run, backend, op, world size) over its finished sizes."""
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        if finished(r):
            c = r["config"]
            groups.setdefault((run_of(r), c["backend"], c["op"], c["world_size"]), []).append(r)
    rows = []
    for (run, backend, op, ranks), group in groups.items():
        fit = latency_bandwidth_fit([r["bytes"] for r in group], [r["ms_median"] / 1e3 for r in group])
        row = {RUN_COLUMN: run, "backend": backend, "op": op, "ranks": ranks, "sizes": len(group)}
        rows.append({**row, "fit": fit["refused"]} if "refused" in fit else {
            **row, "alpha us": fit["alpha_s"] * 1e6, "beta GB/s": fit["beta_bytes_per_s"] / 1e9, "R^2": fit["r2"],
            "max resid %": 100 * fit["max_residual"],
            "fit": f"poor fit ({fit['poor']}): the times do not follow a line" if fit["poor"] else
            "bandwidth-bound" if fit["bandwidth_bound"] else "latency-bound: every size under alpha x beta"})
    return rows


def render_comm(records: list[Record], fmt: str, columns: list[str] | None = None) -> str:
    """The environment, a row per op, size and world size, the fit per op and world size, what the columns mean."""
    lines = environment_lines(records, {"dtype": lambda r: "float32", "warm-up": "warmup", "timed calls": "reps",
                                        "process-group timeout s": "timeout_s"})
    rows = [comm_row(r) for r in records]
    picked = pick_columns(with_run_column(COMM_COLUMNS, records), columns, fmt, COMM_COLUMNS)
    lines += ["", render_table(rows, picked, fmt, floatfmt=".3f")]
    if fits := comm_fits(records):
        fit_columns = with_run_column(COMM_FIT_COLUMNS, records)
        digits = [{"alpha us": ".1f", "beta GB/s": ".3g", "R^2": ".3f", "max resid %": ".1f"}.get(c, "g")
                  for c in fit_columns]
        lines += ["", "### latency and bandwidth: time = alpha + bytes / beta", "",
                  render_table(fits, fit_columns, fmt, floatfmt=digits)]
    links = dict.fromkeys(f"{r['link']} {r['link_peak_gbps']:g} GB/s" for r in records if r.get("link"))
    link_note = (f"of link peak: busbw / the link's peak in one direction per GPU ({', '.join(links)}; "
                 "common.LINK_PEAK_GBPS gives the sources)" if links else
                 "of link peak: — where the link has no datasheet figure (gloo between processes of one machine: "
                 "TCP over loopback, no link to compare with; or a GPU not in common.LINK_PEAK_GBPS)")
    lines += ["", f"size: the full buffer in MB (10^6 bytes) as nccl-tests counts it (all_reduce's tensor, "
              "all_gather's output, reduce_scatter's input); median ms and min-max ms: over every rank's every "
              f"timed call (after the warm-up calls, a barrier before each, the device "
              "synchronised at both clock reads); algbw = size / median time; busbw = algbw x 2(n-1)/n for "
              "all_reduce, x (n-1)/n for all_gather and reduce_scatter (nccl-tests' doc/PERFORMANCE.md): the "
              f"bytes each rank's link carries per second; {link_note}. The fit: least squares on relative "
              "residuals over the finished sizes of an op and world size, three or more with time growing in size "
              "(else no fit); alpha is the latency, beta the bandwidth the largest sizes approach (an algbw); "
              "bandwidth-bound: the largest size's bytes / beta at least alpha, so beta was measured, not guessed "
              f"from latency; a poor fit, a negative alpha or R^2 under {POOR_FIT_R2}: the times do not follow a "
              "line, and bench_ddp takes no link figure from it"]
    lines += [f"note: {note}" for note in dict.fromkeys(n for r in records for n in r.get("notes") or [])]
    return "\n".join(lines)


# ---- bench_ddp tables ----

DDP_BASELINE = "nocomm"  # bench_ddp's variant that communicates nothing: the others' cost is their difference


def ddp_row(r: Record, baseline: Record | None) -> Record:
    """One variant: its step (median over rounds, the slowest rank's each), what communicating costs it against
    the baseline in the same rounds, the profiled split of its communication, the bytes and their floor."""
    baseline_ok = r["variant"] == DDP_BASELINE and r["status"] == "ok"
    row: Record = {"variant": r["variant"], "check": "baseline (not checked)" if baseline_ok else cut_cell(r["status"])}
    steps = r.get("step_ms")
    if steps:
        row["step ms"] = statistics.median(steps)
        row["spread ms"] = f"{min(steps):.1f}-{max(steps):.1f}"
    if steps and baseline and baseline.get("step_ms") and r is not baseline and len(baseline["step_ms"]) == len(steps):
        cost, low, high = hodges_lehmann([v - b for v, b in zip(steps, baseline["step_ms"])])
        resolved = low is None and cost >= 0 or low is not None and low > 0  # else its interval beside it
        row["vs nocomm ms"] = f"{cost:.1f}" + ("" if resolved else " (too few rounds)" if low is None else
                                               f" ({low:.1f} to {high:.1f})")
        paired = paired_ratio(baseline["step_ms"], steps)
        row["step/nocomm"] = f"{1 / paired.ratio:.2f}x" + (
            f" ({1 / paired.high:.2f}-{1 / paired.low:.2f})" if paired.low else " (too few rounds)")
    if "comm_ms" in r:
        row.update({"comm ms": r["comm_ms"], "exposed ms": r["exposed_ms"], "hidden ms": r["hidden_ms"]})
        row["comm % of step"] = f"{r['comm_ms'] / r['profiled_step_ms']:.0%}" if r.get("profiled_step_ms") else None
        row["hidden % of comm"] = f"{r['hidden_ms'] / r['comm_ms']:.0%}" if r["comm_ms"] else None
    if "wire_bytes" in r:  # a row the run never reached has none
        row["MB sent/rank"] = r["wire_bytes"] / 1e6
        row["floor ms"] = r.get("floor_ms", "link unknown" if r["wire_bytes"] else 0.0)
    return row


DDP_COLUMNS = ["variant", "check", "step ms", "spread ms", "vs nocomm ms", "step/nocomm", "MB sent/rank", "floor ms",
               "comm ms", "exposed ms", "hidden ms", "comm % of step", "hidden % of comm"]
DDP_TABLES = [DDP_COLUMNS[1:4], DDP_COLUMNS[4:8]]  # the check and step; what communicating costs; its profiled split


DDP_MEMORY_POINTS = ("after model init", "before optimizer step", "after optimizer step")


def sharding_table(records: list[Record], fmt: str) -> str | None:
    """Optimizer state sharding: the largest rank's tensors at three points of the second step, by part."""
    rows = []
    for r in records:
        ranks = [points for points in r.get("ranks", []) if points]
        if not ranks:
            rows.append({"optimizer": r["variant"], "status": r["status"]})
            continue
        largest = max(ranks, key=lambda points: points[DDP_MEMORY_POINTS[2]]["total"])
        for i, point in enumerate(DDP_MEMORY_POINTS):
            parts = largest[point]
            counted = parts["params"] + parts["grads"] + parts["optimizer_state"]
            peak = parts.get("peak_mem_allocated_bytes")
            rows.append({"optimizer": r["variant"] if i == 0 else "", "point": point,
                         **{f"{k.replace('_', ' ')} MB": parts[k] / 1e6 for k in ("params", "grads",
                                                                                 "optimizer_state", "rest", "total")},
                         "peak MB": "not measured on this machine" if r.get("unmeasured") else peak and peak / 1e6,
                         "bytes/param": counted / r["num_params"],
                         "expected": r["expected_bytes_per_param"][point],
                         "step ms": statistics.median(r["step_ms"]) if i == 0 and r.get("step_ms") else None,
                         "status": "" if i else cut_cell(r["status"])})
    if not rows:
        return None
    memory = ["params MB", "grads MB", "optimizer state MB", "rest MB", "total MB", "peak MB"]
    columns = [c for c in ["optimizer", "point", *memory, "bytes/param", "expected", "step ms", "status"]
               if any(row.get(c) not in (None, "") for row in rows)]
    return "\n\n".join([
        "### Optimizer state sharding: memory per rank (the largest rank's) and time per step",
        *split_tables(rows, columns, ["optimizer", "point"], [memory], fmt, ".1f"),
        *wrong_lines(records, lambda r: r["variant"], fmt),
        textwrap.fill(
            "bytes/param: parameters + gradients + optimizer state over the model's parameters; expected: 4 + 4 + 8 "
            "(AdamW's two fp32 moments), the 8 split over the ranks when sharded. rest: every other tensor of the "
            "rank (the batch, buffers: each optimizer is measured alone, every variant before it released; on CUDA "
            "the allocator's total less the parts). peak: max_memory_allocated since the point before (on CUDA). "
            "Measured in the second step: the first creates the optimizer state.", 116)])


def fsdp_memory_table(records: list[Record], fmt: str) -> str | None:
    """FSDP: each rank's parameters, gradients and optimizer state after a step, the largest rank's against
    the prediction (parallel.state_bytes_per_rank: all three sharded over the ranks)."""
    rows = []
    for r in records:
        if not r.get("memory"):
            continue
        largest = max(r["memory"], key=lambda parts: parts["params"] + parts["grads"] + parts["optimizer_state"])
        state = largest["params"] + largest["grads"] + largest["optimizer_state"]
        rows.append({"variant": r["variant"], **{f"{k.replace('_', ' ')} MB": largest[k] / 1e6 for k in
                                                 ("params", "grads", "optimizer_state")},
                     "state MB": state / 1e6, "predicted MB": r["predicted"]["state_bytes"] / 1e6,
                     "measured/predicted": f"{state / r['predicted']['state_bytes']:.2f}x"})
    if not rows:
        return None
    return ("### FSDP: memory per rank (the largest rank's) after a step, against the prediction\n\n"
            + render_table(rows, list(rows[0]), fmt, ".2f") + "\n\n" + textwrap.fill(
                "predicted: fp32 parameters, gradients and AdamW's two moments, each sharded over the ranks (dim 0 "
                "split, the largest shard); measured: the tensors this rank's parameters, their gradients and the "
                "optimizer hold after a step (gathered weights in flight not counted).", 116))


def fsdp_layer_table(records: list[Record], fmt: str) -> str | None:
    """FSDP, per block of the first profiled forward: its all-gather's time and how long before the block's first
    matmul it ended (the tightest rank's)."""
    rows = []
    for r in records:
        for index, per_rank in enumerate(zip(*r.get("layers") or [])):
            gathers = [x["all_gather_ms"] for x in per_rank if x["all_gather_ms"] is not None]
            slacks = [x["slack_ms"] for x in per_rank if x["slack_ms"] is not None]
            slack = min(slacks) if slacks else None
            rows.append({"variant": r["variant"] if index == 0 else "", "layer": per_rank[0]["layer"],
                         "all-gather ms": max(gathers) if gathers else None, "slack ms": slack,
                         "in time": "gathered earlier" if slack is None else "yes" if slack >= 0 else "no: waited"})
    if not rows:
        return None
    return ("### FSDP: per layer, did its weights' all-gather finish before its forward began?\n\n"
            + render_table(rows, list(rows[0]), fmt, ".3f") + "\n\n" + textwrap.fill(
                "From each rank's trace of the first profiled step: a layer's all-gathers are those launched after "
                "the previous layer's first matmul (the forward's start for layer 0); slack ms = the layer's first "
                "matmul start - their last end, the smallest over the ranks (negative: the compute waited). "
                "gathered earlier: no all-gather was launched for it there.", 116))


def render_ddp(records: list[Record], fmt: str, columns: list[str] | None = None) -> str:
    """bench_ddp: a row per variant, the setting and the machine above."""
    steps = [r for r in records if r.get("kind") != "memory"]
    merged = is_merged(steps)  # two runs: a run column, and each variant against its own run's rounds
    baselines = {run_of(r): r for r in steps if r["variant"] == DDP_BASELINE}
    rows = [{**({RUN_COLUMN: run_of(r)} if merged else {}), **ddp_row(r, baselines.get(run_of(r)))} for r in steps]
    cfg, env = steps[0]["config"], steps[0].get("environment") or {}
    load = (steps[0].get("load") or {}).get("before", {}).get("loadavg_1m")
    lines = [environment_lines(steps, {"size": "size", "ranks": "world_size", "backend": "backend",
                                       "batch": "batch_size"})[0] if env.get("device_name") else "",
             f"load average before: {load:.2f}" if load is not None else ""]
    present = [c for c in with_run_column(DDP_COLUMNS, steps) if any(c in row for row in rows)]
    chosen = pick_columns(present, columns, fmt, present)
    link = steps[0].get("link_gbps")
    notes = [f"step ms: median of {cfg['steps']} rounds (each the slowest rank's step; variants interleaved in "
             "rounds). vs nocomm ms: the paired per-round difference to the variant that communicates nothing (what "
             "communicating costs; Hodges-Lehmann), with its 95% interval where that spans 0 or it is negative: a "
             "difference within the rounds' noise, which is how one can come out below 0 (a step gains nothing from "
             "communicating); step/nocomm: the ratio with its 95% interval. comm / exposed / hidden: from "
             "each rank's profiler trace (mean of the ranks): the union of the collectives (with the wait for the "
             "slower rank); hidden while compute ran, exposed while none did (a memcpy or memset hides none). "
             f"check: the weights after {cfg['check_steps']} steps against one process on the whole batch.",
             "floor: MB sent per rank (a ring all-reduce sends 2(n-1)/n of the gradients; FSDP all-gathers the "
             "weights twice and reduce-scatters the gradients, (n-1)/n each) over the link's "
             + (f"{link:.3g} GB/s ({steps[0].get('link_source') or '--link-gbps'})" if link else
                f"bandwidth: {steps[0].get('link_source') or 'link unknown'} (--link-gbps GB/s, or 'measured': "
                "bench_comm's bus bandwidth)")]
    command = " ".join(shlex.quote(a) for a in cfg.get("command") or ["bench_ddp.py"])
    nsys = ("Nsight's view of the same steps (the screenshot deliverable, on GPUs):\n\n    nsys profile -o ddp "
            f"--trace=cuda,nvtx torchrun --nproc-per-node {cfg['world_size']} {command}")
    ids = [RUN_COLUMN, "variant"] if merged else ["variant"]
    tables = split_tables(rows, chosen, ids, [] if columns else DDP_TABLES, fmt, ".1f")
    tables += wrong_lines([r for r in steps if r["variant"] != DDP_BASELINE],
                          lambda r: r["variant"] + f" ({run_of(r)})" * merged, fmt)
    sharding = sharding_table([r for r in records if r.get("kind") == "memory"], fmt)
    fsdp = [t for t in (fsdp_memory_table(steps, fmt), fsdp_layer_table(steps, fmt)) if t]
    return "\n\n".join([line for line in lines if line] + tables + [textwrap.fill(n, 116) for n in notes]
                       + [nsys] + fsdp + [sharding] * bool(sharding))


# ---- the experiments ----

# experiment -> (render: (records, fmt, --columns) -> report, what --columns may name)
RENDERERS: dict[str, tuple[Callable[..., str], Callable[[list[Record]], list[str]]]] = {
    "bench_e2e": (render_e2e, lambda records: E2E_COLUMNS),
    "bench_attention": (render_attention, lambda records: ATTENTION_COLUMNS),
    "bench_comm": (render_comm, lambda records: COMM_COLUMNS),
    "mem_profile": (render_memory, lambda records: MEMORY_PEAK_COLUMNS),
    "mem_profile-analyze": (render_snapshots, lambda records: []),
    "precision_demo": (render_precision, lambda records: PRECISION_COLUMNS),
    "toy_autocast": (render_toy, toy_columns),
    "leaderboard-2026": (render_leaderboard, lambda records: LEADERBOARD_COLUMNS),
    "bench_ddp": (render_ddp, lambda records: DDP_COLUMNS),
}


class ReportError(Exception):
    """Bad input, said in one line (exit status 2)."""


def as_saved(records: list[Record]) -> list[Record]:
    """The records as their file holds them (strict JSON read back), so a re-render is the run's own file, byte for
    byte; an integer past float's range infinite; every text one line (a hand-edited record's newline never starts
    a line of markdown)."""
    def text_on_one_line(obj: Any) -> Any:
        return {k: text_on_one_line(v) for k, v in obj.items()} if isinstance(obj, dict) else \
            [text_on_one_line(v) for v in obj] if isinstance(obj, list) else \
            results.one_line(obj) if isinstance(obj, str) else obj
    return [text_on_one_line(json.loads(to_json_line(r), parse_int=results.parse_int_or_inf)) for r in records]


def render(experiment: str, records: list[Record], fmt: str, columns: list[str] | None = None) -> str:
    """The one path from records to a report (a sweep's live .md, a script's table, report.py), as_saved."""
    return RENDERERS[experiment][0](as_saved(records), fmt, columns)


def LiveReport(experiment: str, columns: list[str] | None = None) -> Callable[[list[Record], str], str]:
    """A sweep's report, rewritten as rows finish (runner's render: records, fmt)."""
    return functools.partial(render, experiment, columns=columns)


def publish(experiment: str, records: list[Record], files: ResultFiles, fmt: str,
            columns: list[str] | None = None, plot: bool = False, extra_paths: list[Any] = (), *,
            append: list[Record] = ()) -> int:
    """Append `append`, save and print the report, draw the figures: 0, 1 when a figure failed, 130 on Ctrl-C
    (the table of what finished printed all the same, as its file holds it)."""
    printed = None
    try:
        for record in append:
            files.append_record(record)
        printed = emit(files.write_report(lambda f: render(experiment, records, f, columns), fmt))
        drawn, failed = draw(experiment, records, files) if plot else ([], False)
        if printed:
            files.say_written(fmt, [*extra_paths, *drawn])
        return 1 if failed else 0
    except KeyboardInterrupt:
        try:  # a sweep's live report (or an earlier write) left the finished rows' tables in the .md
            if printed is None and (held := files.markdown.read_text().strip()):
                emit(held)
        except (OSError, KeyboardInterrupt):
            pass
        progress(f"interrupted by Ctrl-C while the report was written: {files.kept()}")
        return 130


# ---- reading saved runs ----

MAX_LINE_BYTES = 256 * MIB  # a million raw samples per phase is ~80 MB; more is not a results file


def read_run(path: str) -> dict[int, Record]:
    """A file's records by line number, parsed as they are read: a file past the read limit refused before a row
    is parsed, lines bounded (endless input is one error), a bad last line skipped."""
    found, bad, total = {}, None, 0
    limit = results.read_limit_bytes()[0]
    try:
        with open(path, "rb") as f:
            for n, line in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
                total += len(line)  # a file by its size, before parsing a line; a pipe as it is read
                if max(total, os.fstat(f.fileno()).st_size) > limit:
                    raise ReportError(results.too_large(path, "the record file"))
                if len(line) > MAX_LINE_BYTES:
                    raise ReportError(f"{path}:{n}: more than {MAX_LINE_BYTES // MIB} MiB without a record's "
                                      "end; is this a results .jsonl file?")
                if not line.strip():
                    continue
                if bad:
                    raise ReportError(bad)
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep
                    reason = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
                    bad = f"{path}:{n}: not a JSON record ({reason}); is this a results .jsonl file?"
                    continue
                if not isinstance(record, dict):
                    raise ReportError(f"{path}:{n}: not a JSON object; is this a results .jsonl file?")
                if (name := record.get("experiment")) not in RENDERERS:
                    what = "no experiment field" if name is None else f"experiment {str(name)[:60]!r}"
                    raise ReportError(f"{path}:{n}: {what}; report.py renders the records of "
                                      + ", ".join(RENDERERS))
                found[n] = record
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if bad and not found:
        raise ReportError(bad)
    if bad:
        progress(f"note: {path}: skipped a truncated last line (an interrupted run)")
    if not found:
        raise ReportError(f"{path}: no records (an empty file, or a run that finished no configuration)")
    kinds = list(dict.fromkeys(r["experiment"] for r in found.values()))
    if len(kinds) > 1:
        raise ReportError(f"{path}: records of {' and '.join(kinds)} in one file")
    return found


def renderable(experiment: str, records: list[Record], where: list[str], fmt: str,
               columns: list[str] | None) -> tuple[str, list[Record]]:
    """The report, leaving out with a note each record the tables cannot use; a ReportError if none can."""
    try:
        return render(experiment, records, fmt, columns), records
    except Exception:  # noqa: BLE001 - data of any shape: find the records that break it
        kept, left_out = [], {}  # place -> why
        for record, place in zip(records, where):
            try:
                render(experiment, [record], fmt, columns)
                kept.append(record)
            except Exception as exc:  # noqa: BLE001
                left_out[place] = (f"no field {exc.args[0]!r}" if isinstance(exc, KeyError)
                                   else f"{type(exc).__name__}: {exc}")[:200]
        if not kept:  # one refusal, one line
            reasons = set(left_out.values())
            why = (f"none of its {len(left_out)} records: {reasons.pop()}" if len(reasons) == 1 else
                   "the first, " + ": ".join(next(iter(left_out.items()))) + f"; {len(left_out)} in all")
            raise ReportError(f"{where[0].rsplit(':', 1)[0]}: no record a {experiment} report can use ({why})"
                              ) from None
        for place, reason in left_out.items():
            progress(f"note: {place}: left out, not a {experiment} record as its script writes it: {reason}")
        try:
            return render(experiment, kept, fmt, columns), kept
        except Exception as exc:  # noqa: BLE001 - each renders alone, together they do not
            raise ReportError(f"records that do not make one {experiment} report: {type(exc).__name__}"
                              ) from None


# ---- figures ----

def matplotlib_missing() -> str | None:
    found = importlib.util.find_spec("matplotlib")
    return None if found else "--plot needs matplotlib, which is not installed: pip install matplotlib"


def new_figure(records: list[Record], title: str, ncols: int = 1, width: float = 6.4
               ) -> tuple[Any, list[Any]]:
    """A Figure made without pyplot (no global state, no display), titled with the run's device and torch."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width * ncols, 4.4), layout="constrained")
    env = next((r["environment"] for r in records if isinstance(r.get("environment"), dict)), {})
    device = f"{env.get('device_name', '?')} ({env.get('device', '?')}) | torch {env.get('torch', '?')}"
    handout = next((c["handout"] for r in records if (c := r.get("config") or {}).get("handout")), None)
    title = textwrap.fill(title, int(11 * width * ncols))  # 10 pt: about 11 characters an inch
    fig.suptitle(f"{title}\n{device}" + (f" | handout {handout}" if handout else ""), fontsize=10)
    return fig, list(fig.subplots(1, ncols, squeeze=False).flat)


def log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks at 1, 2, 5 x 10^k over lo..hi, and the next one out within 1.5x of an end; decades when many; at least
    two (matplotlib's log locator labels only decades: within one decade it would show a single label)."""
    steps = [m * 10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
             for m in (1, 2, 5)]
    below, above = max(t for t in steps if t <= lo), min(t for t in steps if t >= hi)
    ticks = sorted({t for t in steps if lo <= t <= hi} | ({below} if lo <= 1.5 * below else set())
                   | ({above} if above <= 1.5 * hi else set()))
    ticks = [t for t in ticks if f"{t:.0e}"[0] == "1"] if len(ticks) > 8 else ticks
    return ticks if len(ticks) >= 2 else sorted({float(f"{lo:.2g}"), float(f"{hi:.2g}")})


def log_axes(ax: Any, xlabel: str, ylabel: str, x_base: int | None = 2) -> None:
    """Labels; log axes (x too unless x_base is None) with labelled ticks, x ticks at the plotted x."""
    from matplotlib.ticker import NullLocator
    ax.set(xlabel=xlabel, ylabel=ylabel)
    points = [(x, y) for line in ax.get_lines() for x, y in zip(line.get_xdata(), line.get_ydata())
              if number(y) and y > 0]
    if not points:
        return
    xs, ys = sorted({x for x, _ in points}), [y for _, y in points]
    ax.set_yscale("log")
    ax.set_yticks(ticks := log_ticks(min(ys), max(ys)), [f"{t:g}" for t in ticks])
    ax.yaxis.set_minor_locator(NullLocator())
    if x_base:
        ax.set_xscale("log", base=x_base)
        # base 2 (sequence lengths, sizes): at the plotted x, at most 10; base 10: 1, 2, 5 x 10^k
        ticked = xs[::math.ceil(len(xs) / 10)] if x_base == 2 else log_ticks(xs[0], xs[-1])
        ax.set_xticks(ticked, [f"{x:g}" for x in ticked])
        ax.xaxis.set_minor_locator(NullLocator())


def bar_labels(ax: Any, labels: list[str], width: float) -> None:
    """Labels under the bars, slanted where the longest line is wider than a bar's share of a `width`-inch figure
    (the legend and the y label take about 2 inches; 8 pt: about 0.065 inch a character)."""
    slant = 0.065 * max(len(line) for label in labels for line in label.split("\n")) > (width - 2) / len(labels)
    ax.set_xticks(range(len(labels)), labels, fontsize=8, rotation=30 if slant else 0,
                  ha="right" if slant else "center", rotation_mode="anchor")


def legend_outside(fig: Any, ax: Any) -> Any:
    """The legend right of the axes, where it covers no bar or line; returns the figure."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right center", fontsize=8)  # clear of the suptitle
    return fig


def label_of(record: Record, keys: list[str]) -> str:
    c = record.get("config", {})
    c = {**c, "ctx": (c.get("model") or {}).get("context_length"), "run": run_of(record)}
    named = {"ctx": "ctx ", "batch_size": "batch ", "warmup": "warm-up "}
    return " ".join(named.get(k, "") + str(c[k]) for k in keys if c.get(k) is not None)


def varying(records: list[Record], keys: list[str]) -> list[str]:
    """The keys whose value differs between records (what a label must show); `run` in a merge."""
    seen = lambda k: {json.dumps(r.get("config", {}).get(k), default=str) for r in records}  # noqa: E731
    return [k for k in keys if len(seen(k)) > 1] + (["run"] if is_merged(records) else [])


def plot_e2e_phases(records: list[Record]) -> Any | None:
    """Step time per configuration, stacked by phase, with the step's std as error bar."""
    done = [r for r in records if finished(r) and number(r.get("step_ms_mean"))]
    if not done:
        return None
    keys, axes = ["size"] + varying(done, ["warmup", "mode"]), varied_axes([r["config"] for r in done])
    fig_width = max(6.4, 0.9 * len(done) + 2)
    fig, (ax,) = new_figure(done, "Step time by phase", width=fig_width)
    bottom = [0.0] * len(done)
    for phase in ("forward", "backward", "optimizer"):
        heights = [r.get(f"{phase}_ms_mean") if number(r.get(f"{phase}_ms_mean")) else 0.0 for r in done]
        if any(heights):
            ax.bar(range(len(done)), heights, bottom=bottom, label=phase)
            bottom = [b + h for b, h in zip(bottom, heights)]
    stds = [r.get("step_ms_std") if number(r.get("step_ms_std")) else 0.0 for r in done]
    ax.errorbar(range(len(done)), [r["step_ms_mean"] for r in done], yerr=stds, fmt="none", ecolor="black",
                capsize=3, label="step mean ± std")
    if 0.0 in stds:
        progress(f"note: figure phases: {stds.count(0.0)} configuration(s) without a step std (one timed step)")
    bar_labels(ax, [f"{label_of(r, keys)} {variant_label(r['config'], axes)}".strip()
                    + f"\nctx {r['config']['model']['context_length']}" for r in done], fig_width)
    ax.set_ylabel("time per step (ms)")
    return legend_outside(fig, ax)


def plot_e2e_speedups(records: list[Record]) -> Any | None:
    """Each variant's speed-ups over the first, as the comparison has them; a failed one's status as a bar."""
    measured = [r for r in records if r.get("kind") != "longest_context"]
    if (spec := e2e_comparison(measured)) is None:
        return None
    names, rows, _ = comparison_rows(measured, **spec)
    bars = [(row, name) for row in rows for name in names[1:]]
    fig_width = max(6.4, 1.2 * len(bars) + 2)
    fig, (ax,) = new_figure(measured, f"Speed-up over {names[0]}: {' vs '.join(names)}", width=fig_width)
    width, spans = 0.8 / len(spec["ratios"]), []
    for i, label in enumerate(spec["ratios"]):
        xs = [j + (i - (len(spec["ratios"]) - 1) / 2) * width for j in range(len(bars))]
        found = [row.get(f"{label} speed-up: {name}") for row, name in bars]
        ax.bar(xs, [s.ratio if isinstance(s, PairedRatio) else math.nan for s in found], width, label=label)
        spans += [(x, s) for x, s in zip(xs, found) if isinstance(s, PairedRatio) and s.low is not None]
        for x, s in zip(xs, found):
            if isinstance(s, str):  # OOM, error: said where the bar would be
                ax.annotate(s, (x, 1.0), rotation=90, ha="center", va="bottom", fontsize=7)
    if spans:  # the comparison's 95% intervals, where the variants were paired
        ax.errorbar([x for x, _ in spans], [s.ratio for _, s in spans], fmt="none", color="black", capsize=3,
                    yerr=[[s.ratio - s.low for _, s in spans], [s.high - s.ratio for _, s in spans]],
                    label="95% interval")
    ax.axhline(1.0, color="black", linewidth=0.8)
    bar_labels(ax, [f"{row['size']} ctx {row['ctx']}" + (f" warm-up {row['warmup']}" if "warmup" in row else "")
                    + f"\n{name}" + (f"\n{row[RUN_COLUMN]}" if RUN_COLUMN in row else "") for row, name in bars],
               fig_width)
    ax.set_ylabel(f"speed-up over {names[0]} (x)")
    return legend_outside(fig, ax)


def plot_e2e_warmup(records: list[Record]) -> Any | None:
    """Time of each timed step against its index, one line per warm-up count, one panel per configuration."""
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        if finished(r) and isinstance(r.get("step_ms"), list) and all(map(number, r["step_ms"])):
            groups.setdefault((run_of(r), config_key({**r["config"], "warmup": None})), []).append(r)
    groups = {k: g for k, g in groups.items() if len({r["config"]["warmup"] for r in g}) > 1}
    if not groups:
        return None
    fig, axes = new_figure(records, "Warm-up: time of each timed step", ncols=len(groups))
    keys, variant_axes = ["size", *varying(records, [])], varied_axes([r["config"] for r in records])
    for ax, group in zip(axes, groups.values()):
        for r in sorted(group, key=lambda r: r["config"]["warmup"]):
            runs = r.get("repeats", 1)  # --repeats: each run's steps in turn; step i is the mean of the runs' i-th
            steps = len(r["step_ms"]) // runs
            ax.plot(range(1, steps + 1), [sum(r["step_ms"][i::steps]) / runs for i in range(steps)], marker="o",
                    label=f"warm-up {r['config']['warmup']}" + f" (mean of {runs} runs)" * (runs > 1))
        ax.set_title(f"{label_of(group[0], keys)} {variant_label(group[0]['config'], variant_axes)}".strip(),
                     fontsize=9)
        log_axes(ax, "timed step index", "step time (ms)", x_base=None)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=8)
    return fig


def plot_attention(records: list[Record]) -> Any | None:
    """Forward, backward time and memory against sequence length; failed configurations marked on top."""
    if not any(finished(r) for r in records):
        return None
    mem_key = "mem_before_backward_bytes" if any("mem_before_backward_bytes" in r for r in records) \
        else "saved_tensor_bytes"
    panels = [("forward_ms_mean", "forward (ms)", 1), ("backward_ms_mean", "backward (ms)", 1),
              (mem_key, "memory (MiB)", 1 / MIB)]
    keys = ["impl", "d"] + varying(records, ["dtype", "batch_size"])
    fig, axes = new_figure(records, "Attention: time and memory against sequence length", ncols=3, width=5.2)
    failed = [r for r in records if not finished(r)]
    for ax, (key, label, scale) in zip(axes, panels):
        lines: dict[str, list] = {}
        for r in records:
            if finished(r) and number(r.get(key)):
                lines.setdefault(label_of(r, keys), []).append((r["config"]["seq_len"], r[key] * scale))
        for name, points in lines.items():
            ax.plot(*zip(*sorted(points)), marker="o", label=name)
        if failed:
            ax.scatter([r["config"]["seq_len"] for r in failed], [0.96] * len(failed), marker="X", color="red",
                       transform=ax.get_xaxis_transform(), label="not drawn: OOM, error, skipped, WRONG",
                       clip_on=False)
        log_axes(ax, "sequence length", label)
    return legend_outside(fig, axes[0])


def plot_memory(records: list[Record], by: str = "context") -> Any | None:
    """Measured peak, saved for backward, predicted peak against context (at the smallest K) or K (by="K")."""
    ks = sorted({r["config"]["checkpoint_every"] for r in records})
    chosen = records if by == "K" else [r for r in records if r["config"]["checkpoint_every"] == ks[0]]
    contexts = {r["config"]["model"]["context_length"] for r in chosen}
    if len(ks if by == "K" else contexts) < 2:
        return None
    keys = ["dtype"] + varying(chosen, ["size", "attn", "model_factory", "optimizer", "batch_size"])
    keys += ["ctx"] if by == "K" and len(contexts) > 1 else []
    lines: dict[str, list] = {}
    for r in chosen:
        x = ks.index(r["config"]["checkpoint_every"]) if by == "K" else r["config"]["model"]["context_length"]
        predicted = (r.get("checkpoint_prediction") or {}).get("predicted_peak_bytes")
        for what, value, ok in (("peak", r.get("peak_mem_allocated_bytes"), r.get("status") == "ok"),
                                ("saved for backward", r.get("saved_total_bytes"),
                                 r.get("saved_status") == "ok"), ("predicted peak", predicted, True)):
            if ok and number(value):
                mode = f"{r['config']['mode']} " if what != "saved for backward" else ""
                lines.setdefault(f"{what}, {mode}{label_of(r, keys)}", []).append((x, value / MIB))
    if not lines:
        return None
    against = "checkpoint block size" if by == "K" else "context length"
    fig, (ax,) = new_figure(chosen, f"Memory against {against}")
    for name, points in lines.items():
        ax.plot(*zip(*sorted(set(points))), "-" if name.startswith("peak") else "--", marker="o", label=name)
    log_axes(ax, "checkpoint every K blocks" if by == "K" else "context length", "memory (MiB)",
             x_base=None if by == "K" else 2)
    if by == "K":  # evenly spaced: K = 0 has no place on a log axis
        ax.set_xticks(range(len(ks)), [str(k) if k else "0 (off)" for k in ks])
    return legend_outside(fig, ax)


def plot_precision(records: list[Record]) -> Any | None:
    """The running sum against the number of additions for each accumulator, and its relative error."""
    cases = [r for r in records if r.get("partial_sums")]
    if not cases:
        return None
    fig, (ax_sum, ax_err) = new_figure(cases, "Accumulating in low precision", ncols=2, width=5.6)
    (n, _), value = zip(*cases[0]["partial_sums"]), cases[0]["value"]
    ax_sum.plot(n, [k * value for k in n], color="0.75", linewidth=4, label=f"exact: n x {value:g}")
    for i, r in enumerate(cases):
        n, sums = zip(*r["partial_sums"])
        label = (f"case {r['case']}: {r['accumulator_dtype']} += {r['addend_dtype']}"
                 + " -> float32" * bool(r.get("addend_converted_to_float32"))
                 + (f" ({run_of(r)})" if is_merged(records) else ""))
        style = ["-", "--", "-.", ":"][i % 4]  # cases that coincide stay visible
        ax_sum.plot(n, sums, style, marker=".", label=label)
        # an exact partial sum has no place on a log axis: a gap (nan), not a made-up value
        errors = [abs(s - k * r["value"]) / abs(k * r["value"]) or math.nan for k, s in zip(n, sums)]
        ax_err.plot(n, errors, style, marker=".", label=label)
    log_axes(ax_sum, "number of additions", "accumulated sum", x_base=10)
    log_axes(ax_err, "number of additions", "relative error (gap: exact)", x_base=10)
    return legend_outside(fig, ax_sum)


def plot_comm(records: list[Record]) -> Any | None:
    """Median time against size, log-log, a line per world size (and backend), one panel per op."""
    done = [r for r in records if finished(r) and number(r.get("ms_median"))]
    ops = list(dict.fromkeys(r["config"]["op"] for r in done))
    if not ops:
        return None
    fig, axes = new_figure(done, "Collective time against size", ncols=len(ops), width=5.2)
    backends = len({r["config"]["backend"] for r in done}) > 1
    for ax, op in zip(axes, ops):
        lines: dict[str, list] = {}
        for r in done:
            if r["config"]["op"] == op:
                name = f"{r['config']['world_size']} ranks" + f" {r['config']['backend']}" * backends
                lines.setdefault(name + (f" ({run_of(r)})" if is_merged(records) else ""), []).append(
                    (r["bytes"] / 1e6, r["ms_median"]))
        for name, points in lines.items():
            ax.plot(*zip(*sorted(points)), marker="o", label=name)
        ax.set_title(op, fontsize=9)
        log_axes(ax, "size (MB)", "median time (ms)", x_base=10)
        ax.legend(fontsize=8)
    return fig


def plot_ddp_timeline(records: list[Record]) -> Any | None:
    """Each variant's first profiled step, a lane per rank: compute below, communication above, as the trace
    recorded them (the screenshot deliverable, drawn from the data)."""
    shown = [r for r in records if r.get("kind") != "memory" and r.get("ranks")
             and all((rank.get("communication") or {}).get("lanes") for rank in r["ranks"])]
    if not shown:
        return None
    from matplotlib.figure import Figure
    fig = Figure(figsize=(9, 0.9 * sum(len(r["ranks"]) for r in shown) + 1.2), layout="constrained")
    axes = fig.subplots(len(shown), 1, squeeze=False, sharex=True).flat
    env = shown[0].get("environment") or {}
    fig.suptitle(f"One profiled step per variant: compute (grey) and communication (orange) per rank\n"
                 f"{env.get('device_name', '?')} ({env.get('device', '?')})", fontsize=10)
    for ax, r in zip(axes, shown):
        for y, rank in enumerate(r["ranks"]):
            lane = rank["communication"]["lanes"]
            ax.broken_barh([(a, b - a) for a, b in lane["compute"]], (y - 0.4, 0.35), color="0.6")
            ax.broken_barh([(a, b - a) for a, b in lane["comm"]], (y + 0.05, 0.35), color="tab:orange")
            for name, at in lane["phases"].items():
                ax.axvline(at, color="black", linewidth=0.5, linestyle=":")
                ax.text(at, y + 0.42, name, fontsize=6, va="bottom")
        ax.set_yticks(range(len(r["ranks"])), [f"rank {rank['rank']}" for rank in r["ranks"]], fontsize=7)
        ax.set_ylim(-0.5, len(r["ranks"]) - 0.5 + 0.3)
        ax.set_title(r["variant"], fontsize=8, loc="left")
    axes[-1].set_xlabel("ms from the start of the step")
    return fig


def roofline_points(records: list[Record]) -> list[Record]:
    """Each timed phase with FLOPs as a roofline point: x = FLOPs / bytes of its floor's byte model (FLOP per byte),
    y = achieved TFLOP/s (the phase's FLOPs / its mean time); `series` groups them (e2e: the phase, attention:
    the implementation and phase), `label` names the configuration. Sums (step, fwd+bwd) are left out."""
    points = []
    for r in records:
        floors, c = r.get("floors") or {}, r.get("config") or {}
        for phase, f in (floors.get("phases") or {}).items():
            if phase in ("step", "forward_backward") or not f.get("flops") or not number(f.get("achieved_tflops")):
                continue
            attention = "impl" in c
            label = (f"d {c['d']} seq {c['seq_len']}" if attention
                     else f"{c['size']} ctx {c['model']['context_length']} {c['dtype']} {c.get('attn', '')}".strip())
            points.append({"series": f"{c['impl']} {phase}" if attention else phase, "label": label,
                           "intensity": f["flops"] / f["bytes"], "tflops": f["achieved_tflops"],
                           "precision": floors["roofs"]["precision"]})
    return points


def roofline_roofs(records: list[Record]) -> dict[str, tuple[float, float, bool]]:
    """Each distinct roof of the records: name -> (peak TFLOP/s, GB/s, from a datasheet)."""
    roofs: dict[str, tuple[float, float, bool]] = {}
    for r in records:
        if not (found := (r.get("floors") or {}).get("roofs")):
            continue
        for source, roof in (("datasheet", found["datasheet"]), ("measured", found["measured"])):
            if roof and number(roof.get("tflops")) and number(roof.get("gbs")):
                name = f"{source} {roof.get('label') or ''} {found['precision']}".replace("  ", " ")
                roofs[name] = (roof["tflops"], roof["gbs"], source == "datasheet")
    return roofs


def plot_roofline(records: list[Record]) -> Any | None:
    """Achieved TFLOP/s against arithmetic intensity under the roofs min(peak, intensity x bandwidth)."""
    points, roofs = roofline_points(records), roofline_roofs(records)
    if not points or not roofs:
        return None
    fig, (ax,) = new_figure(records, "Roofline: each timed phase under the ceilings", width=9.0)
    ridges = [t * 1e3 / g for t, g, _ in roofs.values()]  # where a roof's slope meets its peak
    xs = [p["intensity"] for p in points] + ridges
    x = sorted({min(xs) / 4, 4 * max(xs), *ridges})
    for name, (tflops, gbs, datasheet) in roofs.items():
        ax.plot(x, [min(tflops, i * gbs / 1e3) for i in x], "--" if datasheet else "-", color="0.3" if datasheet
                else "0.6", linewidth=1.2, label=f"roof: {name} ({tflops:.3g} TFLOP/s, {gbs:.4g} GB/s)")
    for series in dict.fromkeys(p["series"] for p in points):
        mine = [p for p in points if p["series"] == series]
        ax.scatter([p["intensity"] for p in mine], [p["tflops"] for p in mine], label=series, zorder=3)
        if len(points) <= 8:  # a few points: each named
            for p in mine:
                ax.annotate(p["label"], (p["intensity"], p["tflops"]), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP per byte of the floor's byte model)",
           ylabel="achieved TFLOP/s")
    return legend_outside(fig, ax)


# experiment -> (what its figures need, its figures by name)
FIGURES: dict[str, tuple[str, dict[str, Callable[[list[Record]], Any]]]] = {
    "bench_e2e": ("finished configurations (several --warmup values for the warm-up figure, several variants for "
                  "the speed-ups)",
                  {"phases": plot_e2e_phases, "speedup": plot_e2e_speedups, "warmup": plot_e2e_warmup,
                   "roofline": plot_roofline}),
    "bench_attention": ("at least one finished configuration",
                        {"attention": plot_attention, "roofline": plot_roofline}),
    "bench_comm": ("at least one finished row", {"time": plot_comm}),
    "mem_profile": ("two or more context lengths, or two or more --checkpoint values",
                    {"memory_context": plot_memory, "memory_checkpoint": functools.partial(plot_memory, by="K")}),
    "mem_profile-analyze": ("nothing: --analyze draws the snapshot's timeline itself", {}),
    "precision_demo": ("records with partial sums", {"sums": plot_precision}),
    "toy_autocast": ("nothing: its answer is a table of dtypes", {}),
    "leaderboard-2026": ("nothing: its answer is a table", {}),
    "bench_ddp": ("variants that were profiled", {"timeline": plot_ddp_timeline}),
}


def draw(experiment: str, records: list[Record], files: ResultFiles) -> tuple[list[Path], bool]:
    """Each figure as `<stem>_<name>.png` (renamed over: no partial image); those that failed, one line on stderr
    (a full disk fails them all alike)."""
    paths, failed = [], {}  # failed: why -> the figures
    if missing := matplotlib_missing():
        progress(f"note: no figures: {missing}")
        return paths, failed
    records = as_saved(records)
    for name, plot in FIGURES[experiment][1].items():
        path = files.path(f"_{name}.png")
        partial = path.with_name(path.name + ".partial")
        try:
            if (fig := plot(records)) is not None:
                fig.savefig(partial, dpi=120, format="png")
                os.replace(partial, path)
                paths.append(path)
        except Exception as exc:  # noqa: BLE001 - records a figure cannot use, a full disk: the tables stand
            partial.unlink(missing_ok=True)
            failed.setdefault(getattr(exc, "strerror", None) or f"{type(exc).__name__}: {exc}", []).append(name)
    if failed:
        progress("error: " + "; ".join(f"figure {', '.join(names)} not drawn: {why}" for why, names in failed.items()))
    elif not paths:
        progress(f"note: no figures: {experiment}'s figures need {FIGURES[experiment][0]}")
    return paths, bool(failed)


# ---- command line ----


def add_columns_and_plot_args(parser: argparse.ArgumentParser, experiment: str | None = None) -> None:
    """--columns and --plot; the help of --plot says what the experiment's figures need."""
    parser.add_argument("--columns", nargs="+", default=None, metavar="NAME",
                        help="columns of the main table, in this order, named as in the printed table")
    needs = f": {FIGURES[experiment][0]}" if experiment else ""
    parser.add_argument("--plot", action="store_true",
                        help=f"also draw the study's figures as PNG (needs matplotlib){needs}")


def columns_or_exit(parser: argparse.ArgumentParser, requested: list[str] | None, valid: list[str]) -> None:
    if requested and (message := unknown_column(requested, valid)):
        parser.error(f"--columns: {message}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgParser(description=__doc__.split("\n\n")[0])
    p.add_argument("jsonl", nargs="+", metavar="JSONL",
                   help="results file(s) of one script; several are merged")
    add_columns_and_plot_args(p)
    add_output_args(p, default_stem="<first input's stem>")
    args = p.parse_args(argv)
    if args.plot and (message := matplotlib_missing()):
        p.error(message)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return report_runs(args)
    except ReportError as exc:
        progress(f"report.py: error: {exc}")
        return 2
    except KeyboardInterrupt:
        progress("interrupted by Ctrl-C: nothing written; the records are unchanged in "
                 + ", ".join(args.jsonl))
        return 130


def report_runs(args: argparse.Namespace) -> int:
    """Read, check, merge (a run named by its stem, its path when stems clash), render, save, plot."""
    given = list({os.path.realpath(p): p for p in reversed(args.jsonl)}.values())[::-1]  # a file once
    runs: dict[Path, dict[int, Record]] = {}
    for path in given:
        try:
            runs[Path(path)] = read_run(path)
        except ReportError as exc:
            progress(f"report.py: error: {exc}")
    if not runs:
        return 2
    kinds = {path: next(iter(found.values()))["experiment"] for path, found in runs.items()}
    if len(set(kinds.values())) > 1:
        raise ReportError("cannot merge records of different experiments: "
                          + ", ".join(f"{path.name} is {kind}" for path, kind in kinds.items()))
    first, experiment = next(iter(kinds.items()))
    stems = [path.stem for path in runs]
    records = [r if len(runs) == 1 else {**r, RUN_KEY: path.stem if stems.count(path.stem) == 1 else str(path)}
               for path, found in runs.items() for r in found.values()]
    valid = [RUN_COLUMN] * (len(runs) > 1) + RENDERERS[experiment][1](records)
    if args.columns and (message := unknown_column(args.columns, valid)):
        raise ReportError(message)
    where = [f"{path}:{n}" for path, found in runs.items() for n in found]
    _, kept = renderable(experiment, records, where, args.fmt, args.columns)
    stem = stem_from(first.stem + (f"-merged-{len(runs)}" if len(runs) > 1 else ""), "report")
    files = ResultFiles(args.results_dir, "report", args.out or stem, "report", reserve=".md")
    files.records_elsewhere = ", ".join(map(str, runs))
    code = publish(experiment, kept, files, args.fmt, args.columns)
    if args.plot and code == 0:
        paths, failed = draw(experiment, kept, files)
        if paths:
            emit("wrote " + " and ".join(map(str, paths)))
        code = 1 if failed else 0 if paths else 2
    return code or (2 if len(runs) < len(given) or len(kept) < len(records) else 0)


if __name__ == "__main__":
    sys.exit(main())
