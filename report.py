"""Saved runs, again: the tables of any experiment script's JSONL records in any format, several runs merged into
one table, and the study's figures as PNG, all without rerunning anything.

Answers the practical question of every writeup: the GPU time is spent, the numbers are in results/, and the
table is needed in LaTeX, with fewer columns, next to Tuesday's run, or as a picture.

    python report.py results/e2e/e2e-20250101-120000.jsonl                    # the tables again (markdown)
    python report.py results/e2e/run.jsonl --fmt latex_booktabs               # a .tex file for the writeup
    python report.py results/e2e/run.jsonl --columns size ctx dtype "step ms" "step std"
    python report.py results/e2e/fp32.jsonl results/e2e/bf16.jsonl            # one table, a 'run' column
    python report.py results/e2e/warmup.jsonl --plot                           # the figures, as PNG
    python report.py results/attention/*.jsonl --plot --fmt plain

Reads what bench_e2e.py, bench_attention.py, mem_profile.py and precision_demo.py write. The report is printed
and saved under results/report/ (.md for markdown, .tex for the LaTeX formats), figures beside it; nothing
already there is overwritten. The experiment scripts call figures() and write_figures() for their own --plot.
An interrupted run's truncated last line is skipped with a note; any other bad input is one line and exit 2.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import cli
import results
from results import LATEX_FORMATS, ResultFiles, environment_header, render_table

# results subfolder -> the experiment script that writes it (for records older than the "experiment" field)
EXPERIMENT_BY_SUBDIR = {"e2e": "bench_e2e", "attention": "bench_attention", "memory": "mem_profile",
                        "precision": "precision_demo"}
SOURCE_COLUMN = "run"  # the column that names the file (stem) each row came from when runs are merged
# the model's shape, which the config table above the results already shows: left out of LaTeX tables by default
MODEL_SHAPE_COLUMNS = ("d_model", "d_ff", "layers", "heads")
MIB = 2**20


class ReportError(Exception):
    """Bad input, said in one line (exit status 2)."""


# ---- reading records ----


def load_records(path: str | Path) -> tuple[list[dict[str, Any]], int]:
    """The records of one JSONL file and how many truncated lines were skipped. Records are appended one line at
    a time, so an interrupted run can leave a partial last line: it is skipped (and counted). A bad line before
    the last, a missing file or a file without records is a ReportError."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read: {exc}") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    records, skipped = [], 0
    for i, (n, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == len(lines) - 1 and records:
                skipped += 1  # the run stopped while writing its last record
                continue
            raise ReportError(f"{path}:{n}: not a JSON record ({exc.msg}); is this a results .jsonl file?") from None
        if not isinstance(record, dict):
            raise ReportError(f"{path}:{n}: not a JSON object; is this a results .jsonl file?")
        records.append(record)
    if not records:
        raise ReportError(f"{path}: no records (an empty file, or a run that finished no configuration)")
    return records, skipped


def experiment_of(record: dict[str, Any], path: Path | None = None) -> str:
    """The script stem that wrote `record`: its "experiment" field, else the results subfolder, else its shape."""
    if record.get("experiment"):
        return record["experiment"]
    if path is not None and path.parent.name in EXPERIMENT_BY_SUBDIR:
        return EXPERIMENT_BY_SUBDIR[path.parent.name]
    config = record.get("config") or {}
    if "accumulator_dtype" in record:
        return "precision_demo"
    if "impl" in config:
        return "bench_attention"
    if "weights_bytes" in record:
        return "mem_profile"
    if "model" in config and "mode" in config:
        return "bench_e2e"
    raise ReportError(f"{path or 'record'}: cannot tell which experiment wrote it (no 'experiment' field)")


@dataclass
class Run:
    """The records of one file, with where they came from."""

    path: Path
    records: list[dict[str, Any]]
    experiment: str
    skipped_lines: int = 0

    @property
    def stem(self) -> str:
        return self.path.stem


def load_runs(paths: list[str]) -> list[Run]:
    """Every file's records; a ReportError when the files hold records of different experiments."""
    runs = []
    for p in paths:
        records, skipped = load_records(p)
        path = Path(p)
        if "snapshot_path" in records[0] and "config" not in records[0]:
            raise ReportError(f"{path}: a memory-snapshot analysis; re-render it with "
                              "python mem_profile.py --analyze <pickle>")
        kinds = {experiment_of(r, path) for r in records}
        if len(kinds) > 1:
            raise ReportError(f"{path}: records of several experiments ({', '.join(sorted(kinds))})")
        runs.append(Run(path, records, kinds.pop(), skipped))
    kinds = {run.experiment: run.stem for run in runs}
    if len(kinds) > 1:
        raise ReportError("cannot merge records of different experiments: "
                          + ", ".join(f"{stem} is {kind}" for kind, stem in kinds.items()))
    return runs


def script(experiment: str) -> Any:
    """The experiment script's module, imported only now (scripts import this module for --plot)."""
    return importlib.import_module(experiment)


def handout_of(record: dict[str, Any]) -> str | None:
    """The handout whose preset table the size names came from, where the record says (older records do not)."""
    for source in (record, record.get("config") or {}, record.get("environment") or {}):
        if source.get("handout"):
            return str(source["handout"])
    return None


def ok(record: dict[str, Any]) -> bool:
    return results.finished(record)


# ---- tables ----


@dataclass
class Table:
    """The experiment's main table: what --columns chooses from and what a merge puts in one table."""

    rows: list[dict[str, Any]]
    columns: list[str]  # shown by default
    floatfmt: str = ".2f"
    available: list[str] = field(default_factory=list)  # every column a row may have; default: columns
    shown: bool = True  # False: printed only when --columns asks for it (a table of statuses only)

    def valid_columns(self) -> list[str]:
        return list(dict.fromkeys(self.columns + self.available))


@dataclass
class Sections:
    """A report as the script printed it: text before the main table, the table, text after."""

    before: list[str]
    table: Table
    after: list[str]


def add_columns_arg(parser: argparse.ArgumentParser) -> None:
    """--columns, the same in report.py and the experiment scripts."""
    parser.add_argument("--columns", nargs="+", default=None, metavar="NAME",
                        help="columns of the main table, in this order, named as in the printed table (default: "
                             "the script's; LaTeX formats leave out the model shape, which the config table shows)")


def unknown_column(requested: list[str], valid: list[str]) -> str | None:
    """The message for the first requested column that is not one of `valid` (listing them); None if all are."""
    unknown = [c for c in requested if c not in valid]
    return f"unknown column {unknown[0]!r}; valid columns: " + ", ".join(valid) if unknown else None


def columns_or_exit(parser: argparse.ArgumentParser, requested: list[str] | None, valid: list[str]) -> None:
    """An experiment script's --columns, checked before anything runs: an unknown name is a one-line exit 2."""
    if requested and (message := unknown_column(requested, valid)):
        parser.error(f"--columns: {message}")


def pick_columns(default: list[str], requested: list[str] | None, fmt: str) -> list[str]:
    """--columns as given, else `default` without the model-shape columns for LaTeX formats (a table that fits a
    page: the config table above it already shows the shape)."""
    if requested:
        return requested
    return [c for c in default if not (fmt in LATEX_FORMATS and c in MODEL_SHAPE_COLUMNS)]


def choose_columns(table: Table, requested: list[str] | None, fmt: str, merged: bool) -> list[str]:
    """--columns as given (each must exist; the error lists the valid ones); else the default columns
    (pick_columns), with the source column first when runs are merged."""
    source = [SOURCE_COLUMN] if merged else []
    if requested and (message := unknown_column(requested, source + table.valid_columns())):
        raise ReportError(message)
    return pick_columns(source + table.columns, requested, fmt)


def settings_header(records: list[dict[str, Any]], settings: dict[str, Any]) -> str:
    env = next((r["environment"] for r in records if "environment" in r), None)
    return environment_header(env, **settings) if env else f"settings: {settings}"


# -- bench_e2e --


def e2e_sections(records: list[dict[str, Any]], fmt: str) -> Sections:
    """bench_e2e's results report split around its main table (the same row code), then the speed-ups."""
    bench_e2e = script("bench_e2e")
    config0 = records[0]["config"]
    optimizers = list(dict.fromkeys(r["config"]["optimizer"] for r in records))
    settings = {"batch": config0["batch_size"], "steps": config0["steps"],
                "mode": config0["mode"] + (" no-grad" if config0["no_grad"] else ""), "attn": config0["attn"]}
    if config0["mode"] == "train" and len(optimizers) == 1:
        settings["optimizer"] = optimizers[0]
    rows = []
    for rec in records:
        row = bench_e2e.table_row(rec)
        if len(optimizers) > 1:
            row["optimizer"] = rec["config"]["optimizer"]
        rows.append(row)
    # as bench_e2e prints it: the configuration columns always, the measured ones where a row has a value
    columns = [c for c in bench_e2e.COLUMNS if any(row.get(c) is not None for row in rows)
               or c in bench_e2e.COLUMNS[:8]]
    after = []
    compile_times = [f"{rec['label']}: {rec['compile_s']:.1f} s" for rec in records if "compile_s" in rec]
    if compile_times:
        after.append("compile time (first step, not in the timings): " + "; ".join(compile_times))
    profiles = bench_e2e.profile_report(records, fmt)
    if profiles:
        after.append(profiles)
    return Sections([bench_e2e.config_table([r["config"] for r in records], fmt), settings_header(records, settings)],
                    Table(rows, columns, available=bench_e2e.COLUMNS),
                    after + [t for t in (bench_e2e.comparison_table(records, fmt), bench_e2e.search_table(records, fmt))
                             if t])


# -- bench_attention --


def attention_sections(records: list[dict[str, Any]], fmt: str) -> Sections:
    bench_attention = script("bench_attention")
    c0 = records[0]["config"]
    settings = {"batch": c0["batch_size"], "dtype": c0["dtype"], "iters": c0["iters"], "warmup": c0["warmup"],
                "causal": "yes"}
    rows = [bench_attention.impl_row(r) for r in records]
    columns = ["impl"] + [c for c in bench_attention.IMPL_COLUMNS if c in bench_attention.ALWAYS_SHOWN
                          or any(row.get(c) is not None for row in rows)]
    impls = list(dict.fromkeys(r["config"]["impl"] for r in records))
    after = ["### comparison\n\n" + bench_attention.comparison_table(records, impls, fmt)]
    return Sections([settings_header(records, settings)],
                    Table(rows, columns, ".3f", bench_attention.TABLE_COLUMNS), after)


# -- mem_profile --


def memory_sections(records: list[dict[str, Any]], fmt: str) -> Sections:
    mem_profile = script("mem_profile")
    c0 = records[0]["config"]
    before = [settings_header(records, {"batch": c0["batch_size"], "warmup": c0["warmup"], "steps": c0["steps"]}),
              "### Accounting from the config (MiB and GiB are 2^20 and 2^30 bytes)\n\n"
              + mem_profile.accounting_table(records, fmt),
              "### Saved for backward (autograd's residuals for one forward pass and the loss; each storage once)"
              "\n\n" + mem_profile.saved_tables(records, fmt)]
    measured = any("peak_mem_allocated_bytes" in r for r in records)
    if measured:
        before.append("### Peak memory (after warm-up, peak counter reset; allocated = tensors, reserved = allocator)")
    else:
        before.append("note: no measured peaks in these records (the run was not on a CUDA device); the peak "
                      "table holds only statuses and is printed when --columns asks for it")
    after = [mem_profile.snapshot_report(r["label"], r, fmt) for r in records if "snapshot_peak_check" in r]
    return Sections(before, Table(mem_profile.peak_rows(records), mem_profile.PEAK_COLUMNS, shown=measured), after)


# -- precision_demo --


def precision_sections(records: list[dict[str, Any]], fmt: str) -> Sections:
    precision_demo = script("precision_demo")
    r0 = records[0]
    title = f"Sum of {r0['value']} added {r0['count']} times (exact answer {r0['value'] * r0['count']!r})"
    after = ["\n\n".join(precision_demo.notes(records))] if {"3", "4"} <= {r["case"] for r in records} else []
    return Sections([settings_header(records, {}), title],
                    Table([precision_demo.table_row(r) for r in records], precision_demo.COLUMNS, ""), after)


SECTIONS: dict[str, Callable[[list[dict[str, Any]], str], Sections]] = {
    "bench_e2e": e2e_sections, "bench_attention": attention_sections, "mem_profile": memory_sections,
    "precision_demo": precision_sections,
}



def render_runs(runs: list[Run], fmt: str, columns: list[str] | None = None) -> str:
    """The report of one run as its script printed it, or of several runs merged into one main table with a
    `run` column, in `fmt`, with the chosen columns."""
    experiment = runs[0].experiment
    module = script(experiment)
    merged = len(runs) > 1
    if not merged and columns is None and fmt not in LATEX_FORMATS:
        return module.render_report(runs[0].records, fmt)  # exactly what the script printed
    records = []
    for run in runs:  # a script's measured() leaves out its summary records (bench_e2e's longest-context answers)
        records += [{**r, "_source": run.stem} for r in getattr(module, "measured", list)(run.records)]
    try:
        sections = SECTIONS[experiment](records, fmt)
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportError(f"{runs[0].path}: records in an unexpected layout for {experiment} ({exc!r})") from None
    if merged:
        sections.before[-1:] = [f"{run.stem}: {settings_header(run.records, {})}" for run in runs]
        for row, record in zip(sections.table.rows, records):
            row[SOURCE_COLUMN] = record["_source"]
    chosen = choose_columns(sections.table, columns, fmt, merged)
    table = render_table(sections.table.rows, chosen, fmt, sections.table.floatfmt)
    shown = [table] if sections.table.shown or columns else []
    return "\n\n".join(sections.before + shown + sections.after)


# ---- figures ----


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 6.4, height: float = 4.4) -> Any:
    """A matplotlib Figure with its axes, made without pyplot (no global state, no display needed)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("figures need matplotlib: pip install matplotlib") from None
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, list(axes.flat)


def figure_title(fig: Any, what: str, records: list[dict[str, Any]]) -> None:
    """`what`, then the device, torch version and handout (when the records say) of the run."""
    env = next((r["environment"] for r in records if "environment" in r), {})
    parts = ([f"{env.get('device_name', '?')} ({env.get('device', '?')})", f"torch {env.get('torch', '?')}"] if env
             else ["device and torch version not recorded"])
    handout = next((h for h in map(handout_of, records) if h), None)
    if handout:
        parts.append(f"handout {handout}")
    fig.suptitle(what + ("\n" + " | ".join(parts) if parts else ""), fontsize=11)


def varying(configs: list[dict[str, Any]], keys: list[str]) -> list[str]:
    """The keys whose value differs between configs: what a label must show to tell them apart."""
    return [k for k in keys if len({json.dumps(c.get(k), default=str) for c in configs}) > 1]


def e2e_label(record: dict[str, Any], keys: list[str]) -> str:
    c = {**record["config"], "ctx": record["config"]["model"]["context_length"], "run": record.get("_source")}
    parts = [c["size"]]
    for key in keys:
        value = c[key]
        parts.append({"ctx": f"ctx {value}", "warmup": f"warm-up {value}", "compile": "compiled" if value else "eager",
                      "optimizer": f"{value} AdamW"}.get(key, str(value)))
    return "\n".join([parts[0], " ".join(parts[1:])]) if len(parts) > 1 else parts[0]


E2E_LABEL_KEYS = ["ctx", "dtype", "compile", "warmup", "optimizer", "attn", "mode", "run"]


def plot_e2e_phases(records: list[dict[str, Any]]) -> Any | None:
    """Step time per configuration, stacked by phase (forward, backward, optimizer), std of the step as error."""
    done = [r for r in records if ok(r) and "step_ms_mean" in r]
    if not done:
        return None
    keys = varying([{**r["config"], "ctx": r["config"]["model"]["context_length"], "run": r.get("_source")}
                    for r in done], E2E_LABEL_KEYS)
    fig, (ax,) = new_figure(width=max(6.4, 0.9 * len(done) + 2))
    x = range(len(done))
    bottom = [0.0] * len(done)
    for phase, color in (("forward", "tab:blue"), ("backward", "tab:orange"), ("optimizer", "tab:green")):
        heights = [r.get(f"{phase}_ms_mean", 0.0) for r in done]
        if any(heights):
            ax.bar(x, heights, bottom=bottom, label=phase, color=color)
            bottom = [b + h for b, h in zip(bottom, heights)]
    means, stds = [r["step_ms_mean"] for r in done], [r["step_ms_std"] for r in done]
    ax.errorbar(x, means, yerr=[[min(s, m) for m, s in zip(means, stds)], stds], fmt="none",  # no time below 0
                ecolor="black", capsize=3, label="step mean ± std")
    ax.set_xticks(list(x), [e2e_label(r, keys) for r in done], fontsize=8)
    ax.set_xlabel("configuration")
    ax.set_ylabel("time per step (ms)")
    ax.legend()
    figure_title(fig, "Step time by phase", done)
    return fig


def plot_e2e_speedups(records: list[dict[str, Any]]) -> Any | None:
    """bench_e2e's comparison as bars: each variant's speed-up over the first (forward, forward+backward, step) for
    each (size, context) row; a variant that failed has no bar, its status is written instead."""
    bench_e2e = script("bench_e2e")
    found = bench_e2e.comparison(bench_e2e.measured(records))
    if found is None:
        return None
    bars = [(row, name) for row in found.rows for name in found.variants[1:]]
    fig, (ax,) = new_figure(width=max(6.4, 1.2 * len(bars) + 2))
    width = 0.8 / len(found.ratios)
    for i, label in enumerate(found.ratios):
        xs = [j + (i - (len(found.ratios) - 1) / 2) * width for j in range(len(bars))]
        cells = [row[f"{label} speed-up: {name}"] for row, name in bars]
        ax.bar(xs, [float(c[:-1]) if c.endswith("x") else math.nan for c in cells], width, label=label)
        for x, cell in zip(xs, cells):
            if not cell.endswith("x"):  # OOM, error, not run: said where the bar would be
                ax.annotate(cell, (x, 1.0), rotation=90, ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(bars)), [f"{row['size']} ctx {row['ctx']}" + (f" warm-up {row['warmup']}" if "warmup" in row
                                     else "") + f"\n{name}" for row, name in bars], fontsize=8)
    ax.set_xlabel("configuration and variant")
    ax.set_ylabel(f"speed-up over {found.variants[0]} (x)")
    ax.legend(title="phases")
    figure_title(fig, f"Speed-up over {found.variants[0]}: {' vs '.join(found.variants)}", records)
    return fig


def plot_e2e_warmup(records: list[dict[str, Any]]) -> Any | None:
    """The warm-up study: time of each timed step against its index, one line per warm-up count, one panel per
    configuration that was run with several warm-up counts."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        if ok(r) and "step_ms" in r:
            key = json.dumps({k: v for k, v in r["config"].items() if k != "warmup"}, sort_keys=True, default=str)
            groups.setdefault(key, []).append(r)
    groups = {k: g for k, g in groups.items() if len({r["config"]["warmup"] for r in g}) > 1}
    if not groups:
        return None
    fig, axes = new_figure(ncols=len(groups))
    for ax, group in zip(axes, groups.values()):
        for r in sorted(group, key=lambda r: r["config"]["warmup"]):
            samples = r["step_ms"]
            ax.plot(range(1, len(samples) + 1), samples, marker="o", label=f"warm-up {r['config']['warmup']}")
        c = group[0]["config"]
        variant = script("bench_e2e").variant_label(c, ["dtype", "compile"])
        ax.set_title(f"{c['size']} ctx {c['model']['context_length']} {variant}", fontsize=9)
        ax.set_yscale("log")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("timed step index")
        ax.set_ylabel("step time (ms, log)")
        ax.legend()
    figure_title(fig, "Warm-up: time of each timed step", records)
    return fig


# -- bench_attention --

FAILURE_MARKERS = {"OOM": ("X", "red"), "skipped": ("s", "grey"), "error": ("P", "purple")}


def failure_kind(status: str) -> str:
    return "OOM" if status == "OOM" else "skipped" if status.startswith("skipped") else "error"


def plot_attention(records: list[dict[str, Any]]) -> Any | None:
    """Forward time, backward time and memory against sequence length (log-log), one line per d and
    implementation; configurations that ran out of memory, were skipped or failed are marked along the top."""
    if not any(ok(r) for r in records):
        return None
    cuda = any("mem_before_backward_bytes" in r for r in records)
    mem_key, mem_label = (("mem_before_backward_bytes", "allocated before backward (MiB)") if cuda
                          else ("saved_tensor_bytes", "saved for backward (MiB)"))
    panels = [("forward_ms_mean", "forward (ms)", 1), ("backward_ms_mean", "backward (ms)", 1),
              (mem_key, mem_label, 1 / MIB)]
    fig, axes = new_figure(ncols=3, width=5.2)
    impls = list(dict.fromkeys(r["config"]["impl"] for r in records))
    ds = sorted({r["config"]["d"] for r in records})
    colors = {d: f"C{i}" for i, d in enumerate(ds)}
    styles = dict(zip(impls, ["-", "--", ":", "-."]))
    for ax, (key, label, scale) in zip(axes, panels):
        for impl in impls:
            for d in ds:
                line = sorted((r["config"]["seq_len"], r[key] * scale) for r in records
                              if r["config"]["impl"] == impl and r["config"]["d"] == d and ok(r) and key in r)
                if line:
                    ax.plot(*zip(*line), styles.get(impl, "-"), marker="o", color=colors[d],
                            label=f"{impl} d={d}")
        failed: dict[str, list[dict]] = {}
        for r in records:
            if not ok(r):
                failed.setdefault(failure_kind(r["status"]), []).append(r)
        for kind, rs in failed.items():  # no value to draw: a marker along the top, named
            marker, color = FAILURE_MARKERS[kind]
            top = ax.get_xaxis_transform()  # x in data, y in axes fraction
            ax.scatter([r["config"]["seq_len"] for r in rs], [0.96] * len(rs), marker=marker, color=color,
                       transform=top, label=kind, zorder=3, clip_on=False)
            for r in rs:
                ax.annotate(f"{r['config']['impl']} d={r['config']['d']}", (r["config"]["seq_len"], 0.96),
                            xycoords=top, xytext=(0, -10), textcoords="offset points", ha="center", fontsize=6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel(label)
        ax.set_title(label.split(" (")[0], fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=8)
    figure_title(fig, "Attention: time and memory against sequence length", records)
    return fig


# -- mem_profile --


def memory_lines(records: list[dict[str, Any]], x_of: Callable[[dict], Any], label_keys: list[str]) -> list[tuple]:
    """(label, xs, ys MiB, style) lines: the measured peak (CUDA) per mode and dtype, solid; the bytes saved for
    backward (measured on fake tensors, any device; the same for every mode) per dtype, dashed."""
    lines = []
    peaks: dict[str, list] = {}
    saved: dict[str, dict] = {}
    for r in records:
        c = r["config"]
        ident = " ".join(f"ctx {c['model']['context_length']}" if k == "ctx" else str(c[k]) for k in label_keys)
        if r.get("status") == "ok" and "peak_mem_allocated_bytes" in r:
            peaks.setdefault(f"peak, {c['mode']} {ident}", []).append((x_of(r), r["peak_mem_allocated_bytes"] / MIB))
        if r.get("saved_status") == "ok":
            saved.setdefault(f"saved for backward, {ident}", {})[x_of(r)] = r["saved_total_bytes"] / MIB
    for label, points in peaks.items():
        lines.append((label, *zip(*sorted(points)), "-"))
    for label, points in saved.items():
        lines.append((label, *zip(*sorted(points.items())), "--"))
    return lines


def plot_memory_context(records: list[dict[str, Any]]) -> Any | None:
    """Peak memory against context length, forward vs training step and fp32 vs bf16 (CUDA runs), with the
    bytes saved for backward (every run), at the smallest checkpoint setting."""
    ckpt = min(r["config"]["checkpoint_every"] for r in records)
    chosen = [r for r in records if r["config"]["checkpoint_every"] == ckpt]
    if len({r["config"]["model"]["context_length"] for r in chosen}) < 2:
        return None
    keys = ["dtype"] + varying([r["config"] for r in chosen], ["size", "attn"])
    lines = memory_lines(chosen, lambda r: r["config"]["model"]["context_length"], keys)
    if not lines:
        return None
    fig, (ax,) = new_figure()
    for label, xs, ys, style in lines:
        ax.plot(xs, ys, style, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length")
    ax.set_ylabel("memory (MiB)")
    ax.legend(fontsize=8)
    measured = any(style == "-" for *_, style in lines)
    figure_title(fig, "Memory against context length" + ("" if measured else " (no CUDA: saved for backward only)"),
                 chosen)
    return fig


def plot_memory_checkpoint(records: list[dict[str, Any]]) -> Any | None:
    """Peak (CUDA runs) and bytes saved for backward against the checkpoint block size K (0 = no checkpointing)."""
    ks = sorted({r["config"]["checkpoint_every"] for r in records})
    if len(ks) < 2:
        return None
    keys = ["dtype"] + varying([r["config"] for r in records], ["size", "attn"])
    keys += ["ctx"] if len({r["config"]["model"]["context_length"] for r in records}) > 1 else []
    position = {k: i for i, k in enumerate(ks)}  # evenly spaced: K = 0 has no place on a log axis
    lines = memory_lines(records, lambda r: position[r["config"]["checkpoint_every"]], keys)
    if not lines:
        return None
    fig, (ax,) = new_figure()
    for label, xs, ys, style in lines:
        ax.plot(xs, ys, style, marker="o", label=label)
    ax.set_xticks(range(len(ks)), [str(k) if k else "0 (off)" for k in ks])
    ax.set_xlabel("checkpoint every K blocks")
    ax.set_ylabel("memory (MiB)")
    ax.legend(fontsize=8)
    figure_title(fig, "Memory against activation-checkpoint block size", records)
    return fig


# -- precision_demo --


def plot_precision(records: list[dict[str, Any]]) -> Any | None:
    """The running sum against the number of additions for each accumulator (log-log), beside n x value, and
    the relative error."""
    cases = [r for r in records if r.get("partial_sums")]
    if not cases:
        return None
    fig, (ax_sum, ax_err) = new_figure(ncols=2, width=5.6)
    value = cases[0]["value"]
    ns = sorted({n for r in cases for n, _ in r["partial_sums"]})
    ax_sum.plot(ns, [n * value for n in ns], color="black", linewidth=3, alpha=0.25, label=f"exact: n x {value}")
    for i, r in enumerate(cases):
        addend = r["addend_dtype"] + (" -> float32" if r["addend_converted_to_float32"] else "")
        label = f"case {r['case']}: {r['accumulator_dtype']} += {addend}"
        style = ["-", "--", "-.", ":"][i % 4]  # cases 3 and 4 coincide: the dashes keep both visible
        n, sums = zip(*r["partial_sums"])
        ax_sum.plot(n, sums, style, marker=".", label=label)
        # an exact partial sum (zero error) has no place on a log axis: a gap in the line (nan), not a made-up value
        errors = [abs(s - k * value) / (k * value) or math.nan for k, s in zip(n, sums)]
        ax_err.plot(n, errors, style, marker=".", label=label)
    for ax in (ax_sum, ax_err):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("number of additions")
    ax_sum.set_ylabel("accumulated sum")
    ax_err.set_ylabel("relative error of the sum (gap: exact)")
    ax_sum.legend(fontsize=8)
    figure_title(fig, f"Accumulating {value} in low precision", cases)
    return fig


FIGURES: dict[str, dict[str, Callable[[list[dict[str, Any]]], Any | None]]] = {
    "bench_e2e": {"phases": plot_e2e_phases, "speedup": plot_e2e_speedups, "warmup": plot_e2e_warmup},
    "bench_attention": {"attention": plot_attention},
    "mem_profile": {"memory_context": plot_memory_context, "memory_checkpoint": plot_memory_checkpoint},
    "precision_demo": {"sums": plot_precision},
}
FIGURE_NEEDS = {
    "bench_e2e": "finished configurations (several --warmup values for the warm-up figure, several variants for "
                 "the speed-ups: --dtype fp32 bf16, --compile off on, --attn naive sdpa, or such runs merged)",
    "bench_attention": "at least one finished configuration",
    "mem_profile": "two or more context lengths, or two or more --checkpoint values",
    "precision_demo": "records with partial sums (precision_demo.py from this version on)",
}


def figures(experiment: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Every figure the records allow, by name (empty when none): matplotlib Figures, not yet saved."""
    made = {name: plot(records) for name, plot in FIGURES[experiment].items()}
    return {name: fig for name, fig in made.items() if fig is not None}


def save_figures(made: dict[str, Any], files: ResultFiles) -> list[Path]:
    """Each figure as `<stem>_<name>.png` beside the run's other files; the paths written."""
    paths = []
    for name, fig in made.items():
        paths.append(files.path(f"_{name}.png"))
        fig.savefig(paths[-1], dpi=120)
    return paths


def write_figures(experiment: str, records: list[dict[str, Any]], files: ResultFiles) -> list[Path]:
    """For the scripts' --plot: every figure the records allow, saved beside the run's files; the paths written.
    A missing matplotlib raises ImportError with a one-line message."""
    return save_figures(figures(experiment, records), files)


def add_columns_and_plot_args(parser: argparse.ArgumentParser, experiment: str) -> None:
    """--columns and --plot, the same on every experiment script that sweeps."""
    add_columns_arg(parser)
    parser.add_argument("--plot", action="store_true",
                        help="after the run, draw the study's figures as PNG beside the results (needs matplotlib; "
                             f"the same as report.py --plot): {FIGURE_NEEDS[experiment]}")


def figures_after_run(experiment: str, records: list[dict[str, Any]], files: ResultFiles) -> list[Path]:
    """An experiment script's --plot, after its results are saved: write_figures, with a missing matplotlib or
    nothing to plot said in one line on stderr instead of an error (the run's results stand either way)."""
    if message := matplotlib_missing():
        results.progress(f"note: no figures: {message}")
        return []
    paths = write_figures(experiment, records, files)
    if not paths:
        results.progress(f"note: no figures: nothing to plot; the {experiment} figures need {FIGURE_NEEDS[experiment]}")
    return paths


def matplotlib_missing() -> str | None:
    """A one-line message when matplotlib cannot be imported (checked before any work is done)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plot needs matplotlib, which is not installed: pip install matplotlib"
    return None


# ---- command line ----


def build_parser() -> argparse.ArgumentParser:
    p = cli.ArgParser(description=__doc__.split("\n\n")[0])
    p.add_argument("jsonl", nargs="+", metavar="JSONL",
                   help="results file(s) of one experiment script; several are merged into one table")
    add_columns_arg(p)
    p.add_argument("--plot", action="store_true", help="also draw the study's figures as PNG (needs matplotlib)")
    cli.add_output_args(p, default_stem="<first input's stem>")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.plot and (message := matplotlib_missing()):
        parser.error(message)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        runs = load_runs(args.jsonl)
        text = render_runs(runs, args.fmt, args.columns)
    except ReportError as exc:
        print(f"report.py: error: {exc}", file=sys.stderr)
        return 2
    for run in runs:
        if run.skipped_lines:
            print(f"note: {run.path}: skipped {run.skipped_lines} truncated line(s) at the end (an interrupted "
                  f"run); using its {len(run.records)} complete record(s)", file=sys.stderr)
    records = [{**r, "_source": run.stem} for run in runs for r in run.records] if len(runs) > 1 else runs[0].records
    plots = figures(runs[0].experiment, records) if args.plot else {}
    if args.plot and not plots:
        print(f"report.py: error: nothing to plot in {', '.join(args.jsonl)}: the {runs[0].experiment} figures need "
              f"{FIGURE_NEEDS[runs[0].experiment]}", file=sys.stderr)
        return 2
    stem = runs[0].stem if len(runs) == 1 else f"{runs[0].stem}-merged-{len(runs)}"
    files = ResultFiles(args.results_dir, "report", args.out or stem, "report", reserve=".md")
    # the .md in markdown, and the .tex (or .html, ...) beside it when --fmt asks for another format
    files.write_report(lambda fmt: text if fmt == args.fmt else render_runs(runs, fmt, args.columns), args.fmt)
    print(text)
    written = files.report_paths(args.fmt) + save_figures(plots, files)
    print("\nwrote " + " and ".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
