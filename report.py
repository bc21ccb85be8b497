"""Saved runs, again: any study script's JSONL records re-rendered in any tabulate format, several runs merged into
one report (a `run` column in every table), and the study's figures as PNG, without rerunning anything.

    python3 report.py results/e2e/e2e-20250101-120000.jsonl                    # the report again (markdown)
    python3 report.py results/e2e/run.jsonl --fmt latex_booktabs               # a .tex file for the writeup
    python3 report.py results/e2e/run.jsonl --columns size ctx dtype "step ms" "step std"
    python3 report.py results/e2e/fp32.jsonl results/e2e/bf16.jsonl            # one report, a 'run' column
    python3 report.py results/e2e/warmup.jsonl --plot                           # the figures, as PNG

render() is the one path from records to a report: a sweep's live .md, a script's final table and this command's
re-renders, so a re-render is the run's own file, byte for byte. Records are read as JSON only (data never runs
code); a record's "experiment" selects an entry of RENDERERS. Reports go to results/report/, figures beside them,
never over an existing file. Bad input is one line and exit 2; a record a table cannot use is left out with a note.
torch-free; matplotlib is imported where a figure is drawn.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import attention_tables
import e2e_tables
import memory_tables
import precision_tables
from results import (MIB, RUN_COLUMN, RUN_KEY, ArgParser, Record, ResultFiles, add_output_args, by_run,
                     comparison_rows, emit, finished, is_merged, number, progress, run_of, stem_from,
                     to_json_line, unknown_column)

# ---- the experiments ----


@dataclass(frozen=True)
class Renderer:
    render: Callable[[list[Record], str, list[str] | None], str]  # (records, fmt, --columns) -> report
    columns: Callable[[list[Record]], list[str]]  # what --columns may name


RENDERERS = {
    "bench_e2e": Renderer(e2e_tables.render_report, lambda records: e2e_tables.COLUMNS),
    "bench_attention": Renderer(attention_tables.render_report, lambda records: attention_tables.TABLE_COLUMNS),
    "mem_profile": Renderer(memory_tables.render_report, lambda records: memory_tables.PEAK_COLUMNS),
    "precision_demo": Renderer(precision_tables.render_precision_report, lambda records: precision_tables.COLUMNS),
    "toy_autocast": Renderer(precision_tables.render_toy_report, precision_tables.toy_columns),
}


class ReportError(Exception):
    """Bad input, said in one line (exit status 2)."""


def render(experiment: str, records: list[Record], fmt: str, columns: list[str] | None = None) -> str:
    """The report of an experiment's records as their file holds them (strict JSON read back)."""
    return RENDERERS[experiment].render([json.loads(to_json_line(r)) for r in records], fmt, columns)


class LiveReport:
    """A sweep's report, rewritten as rows finish (sweep.Experiment.render)."""

    def __init__(self, experiment: str, columns: list[str] | None = None):
        self.experiment, self.columns = experiment, columns

    def __call__(self, records: list[Record], fmt: str) -> str:
        return render(self.experiment, records, fmt, self.columns)


def publish(experiment: str, records: list[Record], files: ResultFiles, fmt: str, columns: list[str] | None = None,
            plot: bool = False, extra_paths: list[Any] = (), *, live: Any = None, append: list[Record] = ()) -> int:
    """The end of every run: save the report, print it, draw --plot's figures, say where everything is. Returns 0,
    1 when a figure failed (the tables stand), 130 after Ctrl-C. (`live`, `append`: accepted until the scripts
    append their own extra records.)"""
    try:
        for record in append:
            files.append_record(record)
        shown = emit(files.write_report(lambda f: render(experiment, records, f, columns), fmt))
        drawn = draw(experiment, records, files) if plot else Drawn()
        if shown:
            files.say_written(fmt, [*extra_paths, *drawn.paths])
        return 1 if drawn.failed else 0
    except KeyboardInterrupt:
        progress(f"interrupted by Ctrl-C while the report was written: {files.kept()}")
        return 130


# ---- reading saved runs ----

MAX_LINE_BYTES = 256 * MIB  # a record of a million raw samples per phase is ~80 MB; more is not a results file
MAX_FILE_BYTES = 4 * MAX_LINE_BYTES


@dataclass
class Run:
    path: Path
    records: list[Record]
    lines: list[int]  # of each record in the file
    experiment: str
    skipped: int = 0  # a truncated last line (an interrupted run)
    name: str = ""  # the run column's value in a merge


def read_run(path: str) -> Run:
    """One file's records, read as JSON with bounded lines (an endless or binary input is one ReportError)."""
    numbered, skipped, total = [], 0, 0
    try:
        with open(path, "rb") as f:
            for n, line in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
                total += len(line)
                if len(line) > MAX_LINE_BYTES or total > MAX_FILE_BYTES:
                    raise ReportError(f"{path}:{n}: more than {MAX_LINE_BYTES // MIB} MiB without a record's end; "
                                      "is this a results .jsonl file?")
                if line.strip():
                    numbered.append((n, line))
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror or exc}") from None
    records = []
    for i, (n, line) in enumerate(numbered):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep
            if i == len(numbered) - 1 and records:
                skipped += 1  # the run stopped while writing its last record
                continue
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
            raise ReportError(f"{path}:{n}: not a JSON record ({reason}); is this a results .jsonl file?") from None
        if not isinstance(record, dict):
            raise ReportError(f"{path}:{n}: not a JSON object; is this a results .jsonl file?")
        records.append((n, record))
    if not records:
        raise ReportError(f"{path}: no records (an empty file, or a run that finished no configuration)")
    kinds = {}
    for n, record in records:
        kinds.setdefault(experiment_of(record, f"{path}:{n}"), n)
    if len(kinds) > 1:
        raise ReportError(f"{path}: records of {' and '.join(kinds)} in one file")
    return Run(Path(path), [r for _, r in records], [n for n, _ in records], next(iter(kinds)), skipped)


def experiment_of(record: Record, where: str = "record") -> str:
    name = record.get("experiment")
    if name not in RENDERERS:
        raise ReportError(f"{where}: {'no experiment field' if name is None else f'experiment {str(name)[:60]!r}'}; "
                          f"report.py renders the records of {', '.join(RENDERERS)}")
    return name


def name_runs(runs: list[Run]) -> None:
    """Each run's name in the run column: its stem, or its path when two inputs share a stem."""
    stems = [run.path.stem for run in runs]
    for run in runs:
        run.name = run.path.stem if stems.count(run.path.stem) == 1 else str(run.path)


def merged_records(runs: list[Run]) -> list[Record]:
    if len(runs) == 1:
        return runs[0].records
    return [{**record, RUN_KEY: run.name} for run in runs for record in run.records]


def renderable(experiment: str, records: list[Record], where: list[str], fmt: str,
               columns: list[str] | None) -> tuple[str, list[Record]]:
    """The report of the records, leaving out with a note each record the tables cannot use on its own (a field
    missing or of another type); a ReportError when none can be used."""
    try:
        return render(experiment, records, fmt, columns), records
    except Exception:  # noqa: BLE001 - data of any shape: find the records that break it
        kept = []
        for record, place in zip(records, where):
            try:
                render(experiment, [record], fmt, columns)
                kept.append(record)
            except Exception as exc:  # noqa: BLE001
                reason = f"no field {exc.args[0]!r}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
                progress(f"note: {place}: left out, not a {experiment} record as its script writes it: {reason[:200]}")
        if not kept:
            raise ReportError(f"{where[0].rsplit(':', 1)[0]}: no record a {experiment} report can use") from None
        try:
            return render(experiment, kept, fmt, columns), kept
        except Exception as exc:  # noqa: BLE001 - each renders alone, together they do not
            raise ReportError(f"records that do not make one {experiment} report: {type(exc).__name__}") from None


# ---- figures ----

Notes = list[str]  # what a figure left out, one line each


def matplotlib_missing() -> str | None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plot needs matplotlib, which is not installed: pip install matplotlib"
    return None


def new_figure(records: list[Record], title: str, ncols: int = 1, width: float = 6.4) -> tuple[Any, list[Any]]:
    """A Figure made without pyplot (no global state, no display), titled with the run's device and torch."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width * ncols, 4.4), layout="constrained")
    env = next((r["environment"] for r in records if isinstance(r.get("environment"), dict)), {})
    device = f"{env.get('device_name', '?')} ({env.get('device', '?')}) | torch {env.get('torch', '?')}"
    handout = next((c["handout"] for r in records if (c := r.get("config") or {}).get("handout")), None)
    fig.suptitle(f"{title}\n{device}" + (f" | handout {handout}" if handout else ""), fontsize=10)
    return fig, list(fig.subplots(1, ncols, squeeze=False).flat)


def log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks at 1, 2, 5 x 10^k between lo and hi (decades only when they are many), at least two: matplotlib's
    log locator labels only decades, so a range within one decade would show a single label."""
    ticks = [m * 10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
             for m in (1, 2, 5) if lo <= m * 10.0**e <= hi]
    ticks = [t for t in ticks if f"{t:.0e}"[0] == "1"] if len(ticks) > 8 else ticks
    return ticks if len(ticks) >= 2 else sorted({float(f"{lo:.2g}"), float(f"{hi:.2g}")})


def log_axes(ax: Any, x_base: int | None = 2) -> None:
    """Log axes (x too unless x_base is None) with labelled ticks: the x ticks at the plotted x values."""
    from matplotlib.ticker import NullLocator
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
        shown = xs if len(xs) <= 10 else xs[::math.ceil(len(xs) / 10)]
        ax.set_xticks(shown, [f"{x:g}" for x in shown])
        ax.xaxis.set_minor_locator(NullLocator())


def legend_outside(fig: Any, ax: Any) -> None:
    """The legend right of the axes, where it covers no bar or line."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize=8)


def label_of(record: Record, keys: list[str]) -> str:
    c = record.get("config", {})
    c = {**c, "ctx": (c.get("model") or {}).get("context_length"), "run": run_of(record)}
    named = {"ctx": "ctx ", "batch_size": "batch ", "warmup": "warm-up "}
    return " ".join(named.get(k, "") + str(c[k]) for k in keys if c.get(k) is not None)


def varying(records: list[Record], keys: list[str]) -> list[str]:
    """The keys whose value differs between records (what a label must show); `run` in a merge."""
    seen = lambda k: {json.dumps(r.get("config", {}).get(k), default=str) for r in records}  # noqa: E731
    return [k for k in keys if len(seen(k)) > 1] + (["run"] if is_merged(records) else [])


E2E_VARIANTS = ("dtype", "compile", "attn", "model_factory", "optimizer", "parallel")  # the compared axes


def e2e_row(record: Record) -> Record:
    c = record["config"]
    return {"size": c["size"], "ctx": c["model"]["context_length"], "warmup": c["warmup"], "mode": c["mode"]}


def plot_e2e_phases(records: list[Record], notes: Notes) -> Any | None:
    """Step time per configuration, stacked by phase, with the step's std as error bar."""
    done = [r for r in records if finished(r) and number(r.get("step_ms_mean"))]
    if not done:
        return None
    keys = ["size"] + varying(done, ["warmup", "mode", *E2E_VARIANTS])
    fig, (ax,) = new_figure(done, "Step time by phase", width=max(6.4, 0.9 * len(done) + 2))
    bottom = [0.0] * len(done)
    for phase in ("forward", "backward", "optimizer"):
        heights = [r.get(f"{phase}_ms_mean") if number(r.get(f"{phase}_ms_mean")) else 0.0 for r in done]
        if any(heights):
            ax.bar(range(len(done)), heights, bottom=bottom, label=phase)
            bottom = [b + h for b, h in zip(bottom, heights)]
    stds = [r.get("step_ms_std") if number(r.get("step_ms_std")) else 0.0 for r in done]
    ax.errorbar(range(len(done)), [r["step_ms_mean"] for r in done], yerr=stds, fmt="none", ecolor="black",
                capsize=3, label="step mean ± std")
    notes += [f"{stds.count(0.0)} configuration(s) without a step std (one timed step)"] if 0.0 in stds else []
    ax.set_xticks(range(len(done)), [label_of(r, keys) + f"\nctx {r['config']['model']['context_length']}"
                                     for r in done], fontsize=8)
    ax.set_ylabel("time per step (ms)")
    legend_outside(fig, ax)
    return fig


def plot_e2e_speedups(records: list[Record], notes: Notes) -> Any | None:
    """Each variant's speed-up over the first (fwd, fwd+bwd, step) per configuration; a failed one's status is
    written where its bar would be."""
    measured = [r for r in records if r.get("kind") != "longest_context"]
    axes = varying(measured, list(E2E_VARIANTS))
    axes = [a for a in axes if a != "run"]
    if not axes:
        return None
    phases = {"fwd": ("forward",), "fwd+bwd": ("forward", "backward"), "step": ("step",)}
    if not any("backward_ms_mean" in r for r in measured):
        del phases["fwd+bwd"]
    names, rows = comparison_rows(measured, lambda r: label_of(r, axes), e2e_row, phases)
    bars = [(row, name) for row in rows for name in names[1:]]
    fig, (ax,) = new_figure(measured, f"Speed-up over {names[0]}: {' vs '.join(names)}",
                            width=max(6.4, 1.2 * len(bars) + 2))
    width = 0.8 / len(phases)
    for i, label in enumerate(phases):
        xs = [j + (i - (len(phases) - 1) / 2) * width for j in range(len(bars))]
        found = [row.get(f"{label} speed-up: {name}") for row, name in bars]
        ax.bar(xs, [s.ratio if s else math.nan for s in found], width, label=label)
        for x, s, (row, name) in zip(xs, found, bars):
            status = row.get(f"{label} ms: {name}")
            if s is None and status and not status[0].isdigit():  # OOM, error: said where the bar would be
                ax.annotate(status, (x, 1.0), rotation=90, ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    warmups = len({row["warmup"] for row in rows}) > 1
    ax.set_xticks(range(len(bars)), [f"{row['size']} ctx {row['ctx']}" + (f" warm-up {row['warmup']}" if warmups
                                     else "") + f"\n{name}" + (f"\n{row[RUN_COLUMN]}" if RUN_COLUMN in row else "")
                                     for row, name in bars], fontsize=8)
    ax.set_ylabel(f"speed-up over {names[0]} (x)")
    legend_outside(fig, ax)
    return fig


def plot_e2e_warmup(records: list[Record], notes: Notes) -> Any | None:
    """Time of each timed step against its index, one line per warm-up count, one panel per configuration."""
    groups: dict[str, list[Record]] = {}
    for r in records:
        if finished(r) and isinstance(r.get("step_ms"), list) and all(map(number, r["step_ms"])):
            rest = {k: v for k, v in r["config"].items() if k != "warmup"}
            groups.setdefault(json.dumps([run_of(r), rest], sort_keys=True, default=str), []).append(r)
    groups = {k: g for k, g in groups.items() if len({r["config"]["warmup"] for r in g}) > 1}
    if not groups:
        return None
    fig, axes = new_figure(records, "Warm-up: time of each timed step", ncols=len(groups))
    for ax, group in zip(axes, groups.values()):
        for r in sorted(group, key=lambda r: r["config"]["warmup"]):
            ax.plot(range(1, len(r["step_ms"]) + 1), r["step_ms"], marker="o", label=f"warm-up {r['config']['warmup']}")
        ax.set_title(label_of(group[0], ["size", *varying(records, [*E2E_VARIANTS])]), fontsize=9)
        log_axes(ax, x_base=None)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("timed step index")
        ax.set_ylabel("step time (ms)")
        ax.legend(fontsize=8)
    return fig


def plot_attention(records: list[Record], notes: Notes) -> Any | None:
    """Forward, backward time and memory against sequence length, one line per implementation and d (and dtype,
    batch, run where they vary); failed configurations marked along the top."""
    if not any(finished(r) for r in records):
        return None
    mem_key = "mem_before_backward_bytes" if any("mem_before_backward_bytes" in r for r in records) \
        else "saved_tensor_bytes"
    panels = [("forward_ms_mean", "forward (ms)", 1), ("backward_ms_mean", "backward (ms)", 1),
              (mem_key, "memory (MiB)", 1 / MIB)]
    keys = ["impl", "d"] + varying(records, ["dtype", "batch_size"])
    fig, axes = new_figure(records, "Attention: time and memory against sequence length", ncols=3, width=5.2)
    for ax, (key, label, scale) in zip(axes, panels):
        lines: dict[str, list] = {}
        for r in records:
            if finished(r) and number(r.get(key)):
                lines.setdefault(label_of(r, keys), []).append((r["config"]["seq_len"], r[key] * scale))
        for name, points in lines.items():
            ax.plot(*zip(*sorted(points)), marker="o", label=name)
        failed = [r for r in records if not finished(r)]
        if failed:
            ax.scatter([r["config"]["seq_len"] for r in failed], [0.96] * len(failed), marker="X", color="red",
                       transform=ax.get_xaxis_transform(), label="failed (OOM, error, skipped)", clip_on=False)
        log_axes(ax)
        ax.set_xlabel("sequence length")
        ax.set_ylabel(label)
    legend_outside(fig, axes[0])
    return fig


def memory_lines(records: list[Record], x_of: Callable[[Record], Any], keys: list[str]) -> dict[str, list]:
    """label -> (x, MiB) points: the measured peak (CUDA) per mode, the bytes saved for backward (any device) and
    the predicted peak of checkpointing, where the records hold them."""
    lines: dict[str, list] = {}
    for r in records:
        name = label_of(r, keys)
        for what, key, ok in (("peak", "peak_mem_allocated_bytes", r.get("status") == "ok"),
                              ("saved for backward", "saved_total_bytes", r.get("saved_status") == "ok"),
                              ("predicted peak", "predicted_peak_bytes", True)):
            value = (r.get("checkpoint_prediction") or {}) if key == "predicted_peak_bytes" else r
            if ok and number(value.get(key)):
                mode = f"{r['config']['mode']} " if what != "saved for backward" else ""
                lines.setdefault(f"{what}, {mode}{name}", []).append((x_of(r), value[key] / MIB))
    return {name: sorted(set(points)) for name, points in lines.items()}


def plot_memory(records: list[Record], notes: Notes, by: str = "context") -> Any | None:
    """Memory against context length (at the smallest checkpoint K), or against the checkpoint K (by="K")."""
    ks = sorted({r["config"]["checkpoint_every"] for r in records})
    chosen = records if by == "K" else [r for r in records if r["config"]["checkpoint_every"] == ks[0]]
    contexts = {r["config"]["model"]["context_length"] for r in chosen}
    if len(ks if by == "K" else contexts) < 2:
        return None
    keys = ["dtype"] + varying(chosen, ["size", "attn", "model_factory", "optimizer", "batch_size"])
    keys += ["ctx"] if by == "K" and len(contexts) > 1 else []
    x_of = (lambda r: ks.index(r["config"]["checkpoint_every"])) if by == "K" else (
        lambda r: r["config"]["model"]["context_length"])
    lines = memory_lines(chosen, x_of, keys)
    if not lines:
        return None
    fig, (ax,) = new_figure(chosen, f"Memory against {'checkpoint block size' if by == 'K' else 'context length'}")
    for name, points in lines.items():
        ax.plot(*zip(*points), "-" if name.startswith("peak") else "--", marker="o", label=name)
    log_axes(ax, x_base=None if by == "K" else 2)
    if by == "K":  # evenly spaced: K = 0 has no place on a log axis
        ax.set_xticks(range(len(ks)), [str(k) if k else "0 (off)" for k in ks])
    ax.set_xlabel("checkpoint every K blocks" if by == "K" else "context length")
    ax.set_ylabel("memory (MiB)")
    legend_outside(fig, ax)
    return fig


def plot_precision(records: list[Record], notes: Notes) -> Any | None:
    """The running sum against the number of additions for each accumulator, and its relative error."""
    cases = [r for r in records if r.get("partial_sums")]
    if not cases:
        return None
    fig, (ax_sum, ax_err) = new_figure(cases, "Accumulating in low precision", ncols=2, width=5.6)
    for i, r in enumerate(cases):
        n, sums = zip(*r["partial_sums"])
        label = f"case {r['case']}: {r['accumulator_dtype']} += {r['addend_dtype']}" + (
            f" ({run_of(r)})" if is_merged(records) else "")
        style = ["-", "--", "-.", ":"][i % 4]  # cases that coincide stay visible
        ax_sum.plot(n, sums, style, marker=".", label=label)
        # an exact partial sum has no place on a log axis: a gap (nan), not a made-up value
        ax_err.plot(n, [abs(s - k * r["value"]) / abs(k * r["value"]) or math.nan for k, s in zip(n, sums)], style,
                    marker=".", label=label)
    for ax in (ax_sum, ax_err):
        log_axes(ax, x_base=10)
        ax.set_xlabel("number of additions")
    ax_sum.set_ylabel("accumulated sum")
    ax_err.set_ylabel("relative error (gap: exact)")
    legend_outside(fig, ax_sum)
    return fig


FIGURES: dict[str, dict[str, Callable[[list[Record], Notes], Any]]] = {
    "bench_e2e": {"phases": plot_e2e_phases, "speedup": plot_e2e_speedups, "warmup": plot_e2e_warmup},
    "bench_attention": {"attention": plot_attention},
    "mem_profile": {"memory_context": plot_memory,
                    "memory_checkpoint": lambda records, notes: plot_memory(records, notes, by="K")},
    "precision_demo": {"sums": plot_precision},
    "toy_autocast": {},
}
FIGURE_NEEDS = {
    "bench_e2e": "finished configurations (several --warmup values for the warm-up figure, several variants for the "
                 "speed-ups)",
    "bench_attention": "at least one finished configuration",
    "mem_profile": "two or more context lengths, or two or more --checkpoint values",
    "precision_demo": "records with partial sums",
    "toy_autocast": "nothing: its answer is a table of dtypes",
}


def figures(experiment: str, records: list[Record], notes: Notes | None = None) -> dict[str, Any]:
    """Every figure the records allow, by name (matplotlib Figures, not saved)."""
    made = {name: plot(records, notes if notes is not None else []) for name, plot in FIGURES[experiment].items()}
    return {name: fig for name, fig in made.items() if fig is not None}


@dataclass
class Drawn:
    paths: list[Path] = field(default_factory=list)
    failed: bool = False


def draw(experiment: str, records: list[Record], files: ResultFiles) -> Drawn:
    """Each figure saved as `<stem>_<name>.png`, written beside and renamed over (no partial image); a figure
    that fails is one line on stderr and the others are drawn all the same."""
    drawn = Drawn()
    if missing := matplotlib_missing():
        progress(f"note: no figures: {missing}")
        return drawn
    for name, plot in FIGURES[experiment].items():
        notes: Notes = []
        path = files.path(f"_{name}.png")
        partial = path.with_name(path.name + ".partial")
        try:
            if (fig := plot(records, notes)) is not None:
                fig.savefig(partial, dpi=120, format="png")
                os.replace(partial, path)
                drawn.paths.append(path)
        except Exception as exc:  # noqa: BLE001 - records a figure cannot use, a full disk: the tables stand
            with contextlib.suppress(OSError):
                partial.unlink()
            progress(f"error: figure {name} not drawn: {getattr(exc, 'strerror', None) or f'{type(exc).__name__}: {exc}'}")
            drawn.failed = True
        for line in notes:
            progress(f"note: figure {name}: {line}")
    if not drawn.paths and not drawn.failed:
        progress(f"note: no figures: {experiment}'s figures need {FIGURE_NEEDS[experiment]}")
    return drawn


# ---- arguments the scripts share ----


def add_columns_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--columns", nargs="+", default=None, metavar="NAME",
                        help="columns of the main table, in this order, named as in the printed table")


def add_columns_and_plot_args(parser: argparse.ArgumentParser, experiment: str) -> None:
    add_columns_arg(parser)
    parser.add_argument("--plot", action="store_true",
                        help=f"also draw the study's figures as PNG (needs matplotlib): {FIGURE_NEEDS[experiment]}")


def columns_or_exit(parser: argparse.ArgumentParser, requested: list[str] | None, valid: list[str]) -> None:
    if requested and (message := unknown_column(requested, valid)):
        parser.error(f"--columns: {message}")


# ---- command line ----


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgParser(description=__doc__.split("\n\n")[0])
    p.add_argument("jsonl", nargs="+", metavar="JSONL", help="results file(s) of one script; several are merged")
    add_columns_arg(p)
    p.add_argument("--plot", action="store_true", help="also draw the study's figures as PNG (needs matplotlib)")
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
        progress("interrupted by Ctrl-C: nothing written; the records are unchanged in " + ", ".join(args.jsonl))
        return 130


def report_runs(args: argparse.Namespace) -> int:
    """Read, check, merge, render, save, print, plot."""
    given = list({os.path.realpath(p): p for p in reversed(args.jsonl)}.values())[::-1]  # a file once
    runs, refused = [], 0
    for path in given:
        try:
            runs.append(read_run(path))
        except ReportError as exc:
            progress(f"report.py: error: {exc}")
            refused += 1
    if not runs:
        return 2
    if len({run.experiment for run in runs}) > 1:
        raise ReportError("cannot merge records of different experiments: "
                          + ", ".join(f"{run.path.name} is {run.experiment}" for run in runs))
    experiment = runs[0].experiment
    name_runs(runs)
    records = merged_records(runs)
    if args.columns and (message := unknown_column(args.columns, ([RUN_COLUMN] if len(runs) > 1 else [])
                                                   + RENDERERS[experiment].columns(records))):
        raise ReportError(message)
    where = [f"{run.path}:{n}" for run in runs for n in run.lines]
    text, kept = renderable(experiment, records, where, args.fmt, args.columns)
    for run in runs:
        if run.skipped:
            progress(f"note: {run.path}: skipped a truncated last line (an interrupted run)")
    stem = stem_from(runs[0].path.stem + (f"-merged-{len(runs)}" if len(runs) > 1 else ""), "report")
    files = ResultFiles(args.results_dir, "report", args.out or stem, "report", reserve=".md")
    files.records_elsewhere = ", ".join(str(run.path) for run in runs)
    code = publish(experiment, kept, files, args.fmt, args.columns)
    if args.plot and code == 0:
        drawn = draw(experiment, kept, files)
        if drawn.paths:
            emit("wrote " + " and ".join(map(str, drawn.paths)))
        code = 1 if drawn.failed else 0 if drawn.paths else 2
    return code or (2 if refused or len(kept) < len(records) else 0)


if __name__ == "__main__":
    sys.exit(main())
